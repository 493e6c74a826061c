/* lanes.c - the lanes policy of lanes.h (docs/contract.md §21). */
#include "worker/lanes.h"

void ci_lanes_init(struct ci_lanes *l, uint32_t every)
{
    l->every = every ? every : 1;
    l->streak = 0;
    l->batch_busy = false;
    l->idle = true; /* a slot that starts knows of no work */
}

size_t ci_lanes_plan(const struct ci_lanes *l, struct ci_lane_ask out[2])
{
    if (l->idle) {
        out[0] = (struct ci_lane_ask){CI_LANE_INTERACTIVE, true};
        out[1] = (struct ci_lane_ask){CI_LANE_BATCH, false};
    } else if (l->streak + 1 >= l->every) {
        out[0] = (struct ci_lane_ask){CI_LANE_BATCH, false};
        out[1] = (struct ci_lane_ask){CI_LANE_INTERACTIVE, false};
    } else {
        out[0] = (struct ci_lane_ask){CI_LANE_INTERACTIVE, !l->batch_busy};
        out[1] = (struct ci_lane_ask){CI_LANE_BATCH, false};
    }
    return 2;
}

void ci_lanes_took(struct ci_lanes *l, enum ci_lane lane, bool got)
{
    if (lane == CI_LANE_BATCH) {
        /* Its turn was had, whether it had a task or not: an empty batch
         * lane is looked at once in every `every` tasks, no more. */
        l->streak = 0;
        l->batch_busy = got;
    } else if (got && l->streak < l->every) {
        l->streak++;
    }
    /* The round's last ask decides: a round ends at a task or after its
     * last ask. */
    l->idle = !got;
}

bool ci_lanes_batch_skip(const struct ci_lane_ask asks[2], size_t i, ci_lanes_look *last,
                         int64_t now_ms, int64_t look_ms)
{
    if (i == 0 || asks[i].lane != CI_LANE_BATCH || !asks[0].wait)
        return false;
    int64_t seen = atomic_load(last);
    if (!seen)
        return false; /* the lane had work: every slot looks */
    if (now_ms >= seen && now_ms - seen < look_ms)
        return true;
    /* This slot looks, unless another claimed the look just now. */
    return !atomic_compare_exchange_strong(last, &seen, now_ms);
}

void ci_lanes_batch_found(ci_lanes_look *last, bool got, int64_t now_ms)
{
    atomic_store(last, got ? 0 : now_ms);
}
