/* batchmemo.h - what a worker remembers of the batches its tasks count in
 * (docs/contract.md §20), so that a batch task does not ask NATS again
 * what the worker knows already:
 *
 * - a batch's seal: its total, once read from the events stream. A seal
 *   does not change (ci batch submit refuses another total), so it is
 *   kept until the stream drops it (its stored time + batches.max_age_s:
 *   a batch id used again after that is another batch, with its own
 *   seal), or until the memo needs the room.
 * - that a batch had no cancel: when a task's look at the stream found
 *   none, the next tasks of the batch need not look again for a while
 *   (CI_BATCH_MEMO_NO_CANCEL_MS), since every worker subscribes to the
 *   batches' cancels: a cancel published since is seen by that
 *   subscription (ci_batch_memo_cancel). Valid only while the connection
 *   stayed up (link: a count of disconnects; a message published while it
 *   was down is lost) and only if no cancel of any batch came while the
 *   look was in flight (a generation).
 * - that a batch was cancelled: a cancel that came through the
 *   subscription sticks (until the stream drops it), so a task of the
 *   batch taken after it ends CANCELLED without a look, even when the
 *   stream does not show the cancel yet (the subscription may get it
 *   before it is stored), and no look that found none is kept after it.
 *
 * - how many tasks of a batch the worker's slots hold (taken, their end
 *   not stored yet): a slot that stores an end while another still holds
 *   a task of the batch need not count the batch, since that task's end
 *   comes later and counts in its place (the slot that lets go last
 *   counts). The look is owed then: a task let go without its end (nak'ed,
 *   superseded: another attempt counts when it ends, but it may have
 *   ended already) counts when it is the last and an end skipped its
 *   count meanwhile. Never more than the slots really hold: when the memo
 *   needs the room of a batch that slots hold, later let-gos count.
 *
 * Thread-safe (one mutex); pure otherwise: no NATS and no clock, the
 * caller passes the times and the link count, so that it is tested alone.
 * A fixed number of batches; the one used least recently makes room. */
#ifndef CI_BATCHMEMO_H
#define CI_BATCHMEMO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* How long a look that found no cancel stands in for the next looks. A
 * cancel the subscription missed (published in the moment before it was
 * made) is still seen this long after. */
#define CI_BATCH_MEMO_NO_CANCEL_MS 2000

struct ci_batch_memo;

/* A memo of at most cap batches (at least 1). */
ci_status ci_batch_memo_new(size_t cap, struct ci_batch_memo **ret, struct ci_error *err);
void ci_batch_memo_free(struct ci_batch_memo *m);

/* The total of the batch's seal, if the memo has it and the stream still
 * does at wall_ms (wall clock, ms since the epoch). */
bool ci_batch_memo_sealed(struct ci_batch_memo *m, const char *batch_id, int64_t wall_ms,
                          uint64_t *ret_total);
/* Keeps the total of a seal read from the stream, until until_ms (wall
 * clock): when the stream drops it. */
void ci_batch_memo_seal(struct ci_batch_memo *m, const char *batch_id, uint64_t total,
                        int64_t until_ms);

/* Whether a look for a cancel of the batch may be skipped: one found none
 * less than CI_BATCH_MEMO_NO_CANCEL_MS before now_ms (monotonic), on the
 * same link, and no cancel of the batch came since (or ever: see
 * ci_batch_memo_cancelled). Otherwise *ret_gen (may be
 * NULL) is what the caller passes to ci_batch_memo_no_cancel after its
 * look. */
bool ci_batch_memo_uncancelled(struct ci_batch_memo *m, const char *batch_id, int64_t now_ms,
                               uint64_t link, uint64_t *ret_gen);
/* A look that began at looked_ms, with gen (from ci_batch_memo_uncancelled)
 * and link as they were then, found no cancel of the batch on the stream:
 * kept, unless a cancel of any batch came since gen (it may have been this
 * batch's, too late for the look), or one of this batch came ever. */
void ci_batch_memo_no_cancel(struct ci_batch_memo *m, const char *batch_id, uint64_t gen,
                             int64_t looked_ms, uint64_t link);
/* A cancel of the batch came (the subscription). It sticks until until_ms
 * (wall clock: when the stream drops it). */
void ci_batch_memo_cancel(struct ci_batch_memo *m, const char *batch_id, int64_t until_ms);
/* Whether a cancel of the batch came (the subscription) that the stream
 * still keeps at wall_ms: its tasks end CANCELLED without a look. */
bool ci_batch_memo_cancelled(struct ci_batch_memo *m, const char *batch_id, int64_t wall_ms);

/* A slot holds a task of the batch (it took it). */
void ci_batch_memo_hold(struct ci_batch_memo *m, const char *batch_id);
/* A slot lets go of a task of the batch it held (once per hold): its end
 * is stored (ended), or it gives the task up. Whether the caller counts
 * the batch: it let go of the last task of the batch the slots held, and
 * its end is stored or an end stored while it held its task left the
 * count to it; also when the memo lost the batch's holds (made room).
 * false: another slot holds a task of the batch, and counts when it lets
 * go. */
bool ci_batch_memo_let_go(struct ci_batch_memo *m, const char *batch_id, bool ended);
/* An end is stored of a task whose hold was let go already: whether the
 * caller counts the batch (no slot holds a task of it); else the slot
 * that lets go last counts. */
bool ci_batch_memo_ended(struct ci_batch_memo *m, const char *batch_id);
/* How many tasks of the batch the slots hold now. */
size_t ci_batch_memo_held(struct ci_batch_memo *m, const char *batch_id);

#endif
