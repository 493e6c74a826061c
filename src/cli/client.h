/* client.h - what every client front end of `ci` does on NATS: submit a
 * request (inputs uploaded when large), wait for a task to end, read its
 * result, and save its artifacts safely. Shared by the command line (ci.c)
 * and the MCP server (mcp.c); nothing here writes to stdout. */
#ifndef CI_CLIENT_H
#define CI_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/codec.h"
#include "core/config.h"
#include "core/status.h"

struct ci_broker;

/* Inputs larger than this go through the object store, not inline. */
#define CI_CLIENT_INLINE_MAX (256 * 1024)
#define CI_CLIENT_MAX_FILES 64
#define CI_CLIENT_MAX_LABELS 64

struct ci_submit_args {
    const char *code; /* Python source, code_len bytes, no NUL */
    size_t code_len;
    const char *id;      /* task id to use; NULL = random. Checked by the caller. */
    const char *session; /* NULL = none; else a valid session id */
    const char *const *files; /* local paths; each appears as ./BASENAME */
    size_t n_files;           /* at most CI_CLIENT_MAX_FILES */
    const char *const *labels; /* "K=V" */
    size_t n_labels;           /* at most CI_CLIENT_MAX_LABELS */
    uint32_t timeout_ms;       /* 0 = the worker's default */
    uint32_t memory_mb;
    bool wire_json; /* send JSON instead of protobuf */
    /* A batch's task (contract §20): batch_id set to batch, published on
     * <batch_subject>.<batch>, and no QUEUED record (a batch's counts say
     * what is queued, for longer than a record lives). */
    const char *batch;
    /* When set, the request is only built (its inputs read, checked and
     * encoded) and its encoded length stored here: nothing is uploaded,
     * written or published. */
    size_t *measure;
};

/* Builds the request, uploads large inputs, writes the QUEUED record and
 * publishes (on the session's subject for a session step; on the batch's
 * subject without QUEUED record for a batch's task). task_id gets the
 * id. CI_ERR_INVALID when the caller's input is at fault (a file missing or
 * too large, a bad input name or label, the task id taken), with err saying
 * which; another status for NATS. *ret_duplicate: the server had it already. */
ci_status ci_client_submit(struct ci_broker *b, const struct ci_config *cfg,
                           const struct ci_submit_args *a, char task_id[65], bool *ret_duplicate,
                           struct ci_error *err);

/* A stored result decoded, protobuf or JSON. CI_ERR_INVALID when it is
 * neither. Free with ci_message_free(&r->base). */
ci_status ci_client_result_decode(const uint8_t *buf, size_t len,
                                  Ci__V1__ExecutionResult **ret, struct ci_error *err);

/* The stored result of id, decoded whatever its encoding. CI_ERR_NOT_FOUND
 * when there is none. Free with ci_message_free(&r->base). */
ci_status ci_client_result_get(struct ci_broker *b, const char *id,
                               Ci__V1__ExecutionResult **ret, struct ci_error *err);

/* Called for each status event while waiting (the terminal one too; for a
 * terminal event that never came, one made from the stored result), and
 * with ev NULL about once a second while none comes. */
typedef void (*ci_client_event_fn)(const Ci__V1__StatusEvent *ev, void *closure);

/* Waits for the task's terminal event; CI_ERR_TIMEOUT past wait_ms, and
 * only then (a NATS request that timed out is CI_ERR_NATS). The
 * ordered consumer replays the task's events from the first, so it may
 * start after the submit. With warn, says on stderr when no worker took the
 * task within 10 s. */
ci_status ci_client_wait(struct ci_broker *b, const char *id, int64_t wait_ms,
                         ci_client_event_fn fn, void *closure, bool warn, struct ci_error *err);

/* Whether an artifact may be saved locally under its name (chosen by
 * untrusted code): no hidden component, no "..", clean UTF-8, and the
 * extension of its type. */
bool ci_client_artifact_name_safe(const Ci__V1__Artifact *a);

/* Opens name for writing under folder dirfd, creating its folders, without
 * following a symlink at any step; only a regular file is replaced. -1 with
 * errno on failure. */
int ci_client_open_artifact(int dirfd, const char *name);

/* Reads a whole file ("-": stdin) of at most max bytes. */
ci_status ci_client_read_file(const char *path, size_t max, uint8_t **ret, size_t *ret_len,
                              struct ci_error *err);

void ci_client_random_id(char out[27]);

/* Writes len bytes of s to f. To a terminal, control and format characters
 * (but newline and tab) are shown escaped, as "\x1b" or "\u202e": what ci
 * prints quotes text that untrusted code chose (its output, error, hint,
 * artifact names), and escape sequences could repaint the screen, hide or
 * reorder text, set the title or write the clipboard (OSC 52). To a pipe or
 * a file the bytes go as they are. */
void ci_client_put_text(FILE *f, const char *s, size_t len);

#endif
