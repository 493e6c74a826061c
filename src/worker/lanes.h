/* lanes.h - which lane a free slot asks for its next task, and whether it
 * waits there (docs/contract.md §21). Interactive tasks (the tasks stream)
 * come first; of every `every` (worker.batch_every) tasks a slot takes while
 * both lanes have work, one comes from the batch lane, so that batches do
 * not starve under steady interactive load.
 *
 * One struct per slot. Pure: no NATS and no clock, so that the policy is
 * tested without a server. A round of asks:
 *
 *     struct ci_lane_ask asks[2];
 *     size_t n = ci_lanes_plan(&lanes, asks);
 *     for (size_t i = 0; i < n; i++) {
 *         bool got = ask(asks[i]);            (a long poll or a pull that does not wait)
 *         ci_lanes_took(&lanes, asks[i].lane, got);
 *         if (got) break;                     (run it; the next round plans again)
 *     }
 */
#ifndef CI_LANES_H
#define CI_LANES_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ci_lane {
    CI_LANE_INTERACTIVE, /* jetstream.tasks_stream, consumer jetstream.consumer */
    CI_LANE_BATCH,       /* jetstream.batch_stream, consumer jetstream.batch_consumer */
};

struct ci_lane_ask {
    enum ci_lane lane;
    bool wait; /* a long poll (the caller's wait); false: a pull that does not wait */
};

struct ci_lanes {
    uint32_t every;  /* worker.batch_every, at least 1 */
    uint32_t streak; /* interactive tasks taken since the batch lane last had its turn */
    bool batch_busy; /* the batch lane's last answer was a task: it has more, likely */
    bool idle;       /* the last ask found nothing: the next round long-polls */
};

void ci_lanes_init(struct ci_lanes *l, uint32_t every);

/* The asks of the next round, in order, into out; returns how many (1 or 2).
 * - Idle (the last round found nothing): the interactive lane with a long
 *   poll, then the batch lane without waiting. An idle slot so costs one
 *   pull request per wait, and a batch task waits about a wait at most.
 * - The batch lane's turn (every-1 interactive tasks taken since its last):
 *   the batch lane, then the interactive lane, neither waiting.
 * - Otherwise the interactive lane, then the batch lane: without waiting
 *   while the batch lane has work (a batch task never waits a long poll on
 *   an empty interactive lane), else with a long poll on the interactive. */
size_t ci_lanes_plan(const struct ci_lanes *l, struct ci_lane_ask out[2]);

/* What an ask of lane found: a task (got) or none. */
void ci_lanes_took(struct ci_lanes *l, enum ci_lane lane, bool got);

/* The batch lane's last look, shared by the slots of a worker: the
 * monotonic ms at which a slot began a look that found nothing, or 0 when
 * the last look found a task (or none was made yet). */
typedef _Atomic int64_t ci_lanes_look;

/* Whether ask i of a round may be left out, as if it found nothing: a
 * look at the batch lane after a long poll on the interactive lane, while
 * a slot of the same worker began one that found nothing less than
 * look_ms ago. A slot that is to look claims the look first (*last = now),
 * so that of slots whose waits end at the same moment one looks: an idle
 * worker looks at the batch lane every look_ms to look_ms + a wait (a slot
 * that skips waits once more), not once per slot and wait. After a look that found a task (0) every slot looks. */
bool ci_lanes_batch_skip(const struct ci_lane_ask asks[2], size_t i, ci_lanes_look *last,
                         int64_t now_ms, int64_t look_ms);
/* What a look at the batch lane found (any look, waiting round or not). */
void ci_lanes_batch_found(ci_lanes_look *last, bool got, int64_t now_ms);

#endif
