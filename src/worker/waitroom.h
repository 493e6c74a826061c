/* waitroom.h - where a worker keeps session tasks whose turn has not come
 * (contract §16; ci_task_process said CI_TASK_END_WAIT), apart from its
 * slots: a waiting task must not hold a slot, or with one slot a
 * predecessor nak'ed for a retry could never run here.
 *
 * The room's thread looks up each held task's session now and then (one
 * lookup per session and round) and moves a task whose turn came to the
 * ready queue, from which slots take it before they fetch. It keeps every
 * held delivery alive with in-progress acks. A cancel moves a held task to
 * the ready queue at once (ci_task_process ends it CANCELLED). On drain,
 * what is held goes back to the server (nak) unless on its last attempt.
 *
 * The room never looks into a delivery: it reaches NATS only through the
 * ops, so that it can be tested without a server. */
#ifndef CI_WAITROOM_H
#define CI_WAITROOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

struct ci_delivery;  /* broker.h */
struct ci_task_wait; /* task.h */
struct ci_waitroom;

struct ci_waitroom_ops {
    /* ci_broker_session_first_seq: the oldest sequence still on the
     * session's subject; CI_ERR_NOT_FOUND when none. */
    ci_status (*first_seq)(void *ctx, const char *session_id, uint64_t *ret_seq,
                           struct ci_error *err);
    void (*in_progress)(void *ctx, struct ci_delivery *d);
    void (*nak)(void *ctx, struct ci_delivery *d, int64_t delay_ms);
    bool (*last_attempt)(void *ctx, struct ci_delivery *d);
    void (*free)(void *ctx, struct ci_delivery *d);
};

struct ci_waitroom_opts {
    const struct ci_waitroom_ops *ops;
    void *ctx;
    size_t max_waiting;        /* tasks held or ready at once (sessions.max_waiting); tasks
                                  on their last delivery may take 64 places more */
    int poll_ms;               /* the first lookup's pause (e.g. 25); it grows to 400 ms
                                  while a task's turn does not come */
    int64_t progress_every_ms; /* in-progress ack of each held delivery this often */
};

/* What ci_waitroom_hold did with the delivery (always the room's now). */
enum ci_waitroom_held {
    CI_WAITROOM_HELD,     /* waits for its turn */
    CI_WAITROOM_FULL,     /* max_waiting reached (and for a last delivery, the 64 places
                             more): nak'ed with FULL_DELAY_MS */
    CI_WAITROOM_RETURNED, /* draining: nak'ed at once for another worker */
};
#define CI_WAITROOM_FULL_DELAY_MS 1000

/* Starts the room's thread. */
ci_status ci_waitroom_new(const struct ci_waitroom_opts *o, struct ci_waitroom **ret,
                          struct ci_error *err);
/* Stops the thread, naks and frees whatever is still there (none after a
 * drain but tasks on their last attempt): the last use of the ops. The
 * room stays valid, empty, for late callers (a cancel handler still
 * running): hold naks, take and cancel find nothing. Idempotent. */
void ci_waitroom_close(struct ci_waitroom *r);
/* Closes it if that was not done, and frees it. NULL is fine. */
void ci_waitroom_free(struct ci_waitroom *r);

/* Takes d (whatever the answer) with what it waits for. */
enum ci_waitroom_held ci_waitroom_hold(struct ci_waitroom *r, struct ci_delivery *d,
                                       const struct ci_task_wait *w);

/* The oldest ready task: true with *ret_d (now the caller's) and *ret_wait;
 * false when none became ready within timeout_ms (0: do not wait). */
bool ci_waitroom_take(struct ci_waitroom *r, int timeout_ms, struct ci_delivery **ret_d,
                      struct ci_task_wait *ret_wait);

/* Moves the task task_id to the ready queue if it is held; true if it was
 * there (held or ready). Thread-safe; does not block on NATS. */
bool ci_waitroom_cancel(struct ci_waitroom *r, const char *task_id);

/* From now on the worker takes no new task: naks every task here (held or
 * ready) not on its last attempt, and every one held later. How many it
 * nak'ed now. Idempotent. */
size_t ci_waitroom_drain(struct ci_waitroom *r);

/* Tasks here, held or ready (a gauge; slots fetch briefly while not 0). */
size_t ci_waitroom_count(struct ci_waitroom *r);

#endif
