/* session.h - a session's record in the sessions bucket (docs/contract.md
 * §16) and the choices a step makes from it: which step it is, which state
 * it restores, whether the session is new, expired or closed, and whether
 * it ran already. Pure data: the worker (task.c) and `ci session` do the
 * NATS calls. */
#ifndef CI_SESSION_H
#define CI_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* ".sessions/" + a 64-byte id + "/<step>-<attempt>" */
#define CI_SESSION_OBJECT_MAX 112

/* The record, always JSON on the wire (64-bit numbers as strings). */
struct ci_session_record {
    bool closed;
    uint32_t step;       /* the last step that ran; 0: none yet */
    uint32_t state_step; /* the step whose state the next one restores; 0: none */
    char last_task_id[65]; /* the task of the last step that ran */
    uint64_t last_seq;   /* its tasks-stream sequence (for people) */
    char state[CI_SESSION_OBJECT_MAX]; /* the state's object in the files bucket; "" none */
    uint64_t state_bytes;
    int64_t created_ms;
    int64_t updated_ms;
};

/* CI_ERR_INVALID when data is not a record (a client wrote something else:
 * the session then starts afresh, as after a close). */
ci_status ci_session_record_parse(const uint8_t *data, size_t len,
                                  struct ci_session_record *ret, struct ci_error *err);
/* The record's JSON (malloc'd, NUL-terminated). A closed record carries
 * only sessionId, closed and updatedAtMs. */
ci_status ci_session_record_encode(const char *session_id, const struct ci_session_record *r,
                                   char **ret, size_t *ret_len, struct ci_error *err);

/* ".sessions/<id>/<step>-<attempt>": one per attempt, so that two attempts
 * of a step never write one object; under a prefix that no task id (the
 * artifacts' "<task_id>/...") can form, and that no input may name. */
void ci_session_object_name(const char *session_id, uint32_t step, uint32_t attempt,
                            char out[CI_SESSION_OBJECT_MAX]);
/* Whether name is a state object of session_id (what a record may point at:
 * a record is writable by clients). */
bool ci_session_object_valid(const char *session_id, const char *name);
#define CI_SESSION_OBJECT_PREFIX ".sessions/"

/* Where a step stands, from the record as it was read (NULL: none). */
struct ci_session_plan {
    bool applied;        /* the record's last step is this task: it ran already */
    bool new_session;
    bool previous_gone;  /* the session had expired or was closed */
    uint32_t step;       /* this step */
    uint32_t restore_step; /* 0: nothing to restore */
    char restore_object[CI_SESSION_OBJECT_MAX]; /* "" with restore_step 0 */
    char stale_object[CI_SESSION_OBJECT_MAX];   /* an expired session's state, to delete; "" */
    int64_t created_ms;
};
void ci_session_plan(const char *session_id, const char *task_id,
                     const struct ci_session_record *rec, int64_t now_ms, uint32_t idle_s,
                     struct ci_session_plan *ret);

#endif
