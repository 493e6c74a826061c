/* sealwait.h - the seals that reached a worker's subscription (contract
 * §20), each counted on a thread of its own rather than on the
 * subscription's: the message may come before the stream stores the seal
 * (on a cluster, until its replicas agree), so a batch is tried again,
 * with a growing pause, until its try is done or give_up_ms passed. The
 * subscription's thread never waits, and a slow store does not make the
 * worker give up after a second.
 *
 * The try is the caller's (fn: worker/task.c's ci_task_batch_sealed), so
 * that the waiting is tested without NATS. At most cap batches wait; a
 * seal past that is logged and dropped (nothing else is lost: a later end
 * of the batch, or the client that sealed, counts it too). */
#ifndef CI_SEALWAIT_H
#define CI_SEALWAIT_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* One try at the batch's seal: CI_OK or CI_ERR_INVALID when done (counted,
 * or a seal that says no total), anything else (CI_ERR_NOT_FOUND: not
 * stored yet) to be tried again; err says why, for the log. */
typedef ci_status (*ci_sealwait_fn)(void *closure, const char *batch_id, struct ci_error *err);

struct ci_sealwait_opts {
    ci_sealwait_fn fn;
    void *closure;
    size_t cap;          /* batches waiting at most (at least 1) */
    int64_t first_ms;    /* the first pause after a try that was not done */
    int64_t max_pause_ms; /* the pause doubles up to this */
    int64_t give_up_ms;  /* after this long since the seal came: logged, dropped */
};

struct ci_sealwait;

/* Starts the thread. */
ci_status ci_sealwait_start(const struct ci_sealwait_opts *o, struct ci_sealwait **ret,
                            struct ci_error *err);
/* A seal of the batch came: tried at once on the thread, then again as
 * above. A batch already waiting is not added twice. Never waits; after
 * ci_sealwait_stop, does nothing. */
void ci_sealwait_add(struct ci_sealwait *w, const char *batch_id);
/* How many batches wait (tests). */
size_t ci_sealwait_waiting(struct ci_sealwait *w);
/* Stops the thread after the try under way; what still waits is logged and
 * dropped. Before fn's means go (the broker); add may still be called. */
void ci_sealwait_stop(struct ci_sealwait *w);
/* After stop, once nothing calls add any more. NULL is fine. */
void ci_sealwait_free(struct ci_sealwait *w);

#endif
