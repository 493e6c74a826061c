/* test_lanes.c - the lanes policy (worker/lanes.h, contract §21) against
 * simulated lanes: interactive first, one batch task in every batch_every
 * while both have work, no long poll on an empty interactive lane while
 * the batch lane has work, and no busy loop when both are empty. */
#include "worker/lanes.h"

#include "testutil.h"

/* Two lanes of queued tasks (-1 = endless), and what the slot did. */
struct sim {
    long queued[2];
    size_t asks, taken[2];
    size_t waits; /* long polls on an empty lane: time a slot spends idle */
    char order[256]; /* 'I' or 'B' per task taken, '.' per round with none */
    size_t n_order;
};

static bool ask(struct sim *s, struct ci_lane_ask a)
{
    s->asks++;
    long *q = &s->queued[a.lane];
    if (*q == 0) {
        s->waits += a.wait;
        return false;
    }
    if (*q > 0)
        (*q)--;
    return true;
}

/* One round as slot_main makes it; true when it took a task. */
static bool round_once(struct ci_lanes *l, struct sim *s)
{
    struct ci_lane_ask asks[2];
    size_t n = ci_lanes_plan(l, asks);
    for (size_t i = 0; i < n; i++) {
        bool got = ask(s, asks[i]);
        ci_lanes_took(l, asks[i].lane, got);
        if (got) {
            s->taken[asks[i].lane]++;
            if (s->n_order + 1 < sizeof(s->order))
                s->order[s->n_order++] = asks[i].lane == CI_LANE_BATCH ? 'B' : 'I';
            return true;
        }
    }
    if (s->n_order + 1 < sizeof(s->order))
        s->order[s->n_order++] = '.';
    return false;
}

static void run(struct ci_lanes *l, struct sim *s, int rounds)
{
    for (int i = 0; i < rounds; i++)
        round_once(l, s);
    s->order[s->n_order] = '\0';
}

static void test_idle_slot_long_polls_interactive_then_looks_at_batch(void)
{
    struct ci_lanes l;
    ci_lanes_init(&l, 4);
    struct ci_lane_ask a[2];
    REQUIRE(ci_lanes_plan(&l, a) == 2);
    CHECK(a[0].lane == CI_LANE_INTERACTIVE && a[0].wait);
    CHECK(a[1].lane == CI_LANE_BATCH && !a[1].wait);

    /* Both empty: every round waits once, on the interactive lane; the
     * batch lane is looked at without waiting. No busy loop. */
    struct sim s = {.queued = {0, 0}};
    run(&l, &s, 10);
    CHECK(s.asks == 20);
    CHECK(s.waits == 10);
    CHECK_STR(s.order, "..........");
}

static void test_both_lanes_busy_one_in_every(void)
{
    for (uint32_t every = 1; every <= 7; every++) {
        struct ci_lanes l;
        ci_lanes_init(&l, every);
        struct sim s = {.queued = {-1, -1}};
        run(&l, &s, 70 * (int)every);
        /* The first round of a slot is idle's (interactive first); from
         * then on one in every `every` comes from the batch lane. */
        size_t total = s.taken[0] + s.taken[1];
        CHECK(total == 70 * every);
        CHECK(s.taken[CI_LANE_BATCH] == 70 || s.taken[CI_LANE_BATCH] == 69);
        if (every == 4)
            CHECK(strncmp(s.order, "IIIBIIIBIIIB", 12) == 0);
        if (every == 1)
            CHECK(strncmp(s.order, "IBBBB", 5) == 0);
        /* Nothing is waited for while both lanes have work. */
        CHECK(s.waits == 0);
    }
}

static void test_batch_alone_never_waits_on_interactive(void)
{
    struct ci_lanes l;
    ci_lanes_init(&l, 4);
    struct sim s = {.queued = {0, 50}};
    run(&l, &s, 60);
    CHECK(s.taken[CI_LANE_BATCH] == 50);
    /* One long poll to start with (idle), then none while batch tasks come,
     * then one per round once both are empty again. */
    CHECK(s.waits == 1 + 9);
    CHECK(strncmp(s.order, "BBBBBBBBBB", 10) == 0);
}

static void test_interactive_goes_before_queued_batch_tasks(void)
{
    struct ci_lanes l;
    ci_lanes_init(&l, 4);
    struct sim s = {.queued = {0, -1}};
    run(&l, &s, 20); /* a slot busy on batch tasks */
    CHECK(s.taken[CI_LANE_BATCH] == 20);
    /* An interactive task arrives: the next round takes it, whatever the
     * batch lane holds. */
    s.queued[CI_LANE_INTERACTIVE] = 1;
    struct ci_lane_ask a[2];
    ci_lanes_plan(&l, a);
    CHECK(a[0].lane == CI_LANE_INTERACTIVE && !a[0].wait);
    size_t before = s.taken[CI_LANE_INTERACTIVE];
    CHECK(round_once(&l, &s));
    CHECK(s.taken[CI_LANE_INTERACTIVE] == before + 1);
    /* Three interactive tasks queued at once behind the batch: all three
     * first (the batch's turn comes after every-1 of them). */
    s.queued[CI_LANE_INTERACTIVE] = 3;
    s.n_order = 0;
    run(&l, &s, 5);
    CHECK_STR(s.order, "IIBIB");
}

static void test_interactive_alone_looks_at_batch_now_and_then(void)
{
    struct ci_lanes l;
    ci_lanes_init(&l, 4);
    struct sim s = {.queued = {-1, 0}};
    run(&l, &s, 100);
    CHECK(s.taken[CI_LANE_INTERACTIVE] == 100);
    /* An empty batch lane costs a pull that does not wait now and then:
     * when its turn comes, and every-1 interactive tasks after that turn
     * (the round that found it empty took one). */
    CHECK(s.asks > 100 + 25 && s.asks <= 100 + 34);
    CHECK(s.waits == 0);
}

/* Idle slots of one worker, their long polls ending at the same moments
 * (stagger 0: slots that went idle together stay in step) or spread out:
 * one look at the batch lane per look_ms between them, not one per slot
 * and wait; a batch task that comes is still found within about a wait. */
static void idle_slots(int64_t stagger, size_t *ret_looks, int64_t *ret_found_after)
{
    enum { SLOTS = 4, WAIT = 1000, LOOK = 750, SECONDS = 20 };
    struct ci_lanes l[SLOTS];
    int64_t next[SLOTS];
    for (int i = 0; i < SLOTS; i++) {
        ci_lanes_init(&l[i], 4);
        next[i] = 1 + i * stagger; /* when its long poll ends */
    }
    ci_lanes_look last = 0; /* the worker's */
    size_t looks = 0;
    int64_t batch_at = 0, found_at = 0; /* a batch task comes at batch_at */
    for (int64_t now = 1; now < SECONDS * 1000; now++) {
        if (now == 12345)
            batch_at = now;
        for (int i = 0; i < SLOTS; i++) {
            if (next[i] != now)
                continue;
            struct ci_lane_ask a[2];
            size_t n = ci_lanes_plan(&l[i], a);
            CHECK(n == 2 && a[0].lane == CI_LANE_INTERACTIVE && a[0].wait);
            ci_lanes_took(&l[i], a[0].lane, false); /* the long poll that just ended */
            if (ci_lanes_batch_skip(a, 1, &last, now, LOOK)) {
                ci_lanes_took(&l[i], a[1].lane, false);
            } else {
                looks++;
                bool got = batch_at && !found_at;
                if (got)
                    found_at = now;
                ci_lanes_batch_found(&last, got, now);
                /* A task taken: the slot runs it and comes back idle. */
                ci_lanes_took(&l[i], a[1].lane, got);
                if (got)
                    ci_lanes_took(&l[i], CI_LANE_BATCH, false);
            }
            next[i] = now + WAIT;
        }
    }
    *ret_looks = looks;
    *ret_found_after = found_at ? found_at - batch_at : -1;
}

static void test_idle_slots_share_the_batch_look(void)
{
    /* Not 80 looks in 20 s (one per slot and wait): about one per wait. */
    for (int64_t stagger = 0; stagger <= 300; stagger += 50) {
        size_t looks = 0;
        int64_t found_after = 0;
        idle_slots(stagger, &looks, &found_after);
        CHECK(looks >= 19 && looks <= 20 * 1000 / 750 + 2);
        CHECK(found_after >= 0 && found_after <= 1000);
    }
    /* Only after a long poll on the interactive lane: never the first ask,
     * never a batch look that the round made without waiting. */
    ci_lanes_look last = 100;
    struct ci_lane_ask busy[2] = {{CI_LANE_INTERACTIVE, false}, {CI_LANE_BATCH, false}};
    CHECK(!ci_lanes_batch_skip(busy, 1, &last, 101, 750));
    struct ci_lane_ask turn[2] = {{CI_LANE_BATCH, false}, {CI_LANE_INTERACTIVE, false}};
    CHECK(!ci_lanes_batch_skip(turn, 0, &last, 101, 750));
    struct ci_lane_ask idle[2] = {{CI_LANE_INTERACTIVE, true}, {CI_LANE_BATCH, false}};
    CHECK(!ci_lanes_batch_skip(idle, 0, &last, 101, 750));
    CHECK(ci_lanes_batch_skip(idle, 1, &last, 101, 750));
    CHECK(last == 100);
    /* Due: the first slot claims the look, the next one at that moment
     * leaves it out. */
    CHECK(!ci_lanes_batch_skip(idle, 1, &last, 850, 750));
    CHECK(last == 850);
    CHECK(ci_lanes_batch_skip(idle, 1, &last, 850, 750));
    CHECK(!ci_lanes_batch_skip(idle, 1, &last, 99, 750)); /* a clock that went back: look */
    CHECK(last == 99);
    /* The last look found a task: every slot looks, none claims. */
    ci_lanes_batch_found(&last, true, 900);
    CHECK(last == 0);
    CHECK(!ci_lanes_batch_skip(idle, 1, &last, 901, 750));
    CHECK(!ci_lanes_batch_skip(idle, 1, &last, 901, 750));
    CHECK(last == 0);
    ci_lanes_batch_found(&last, false, 950);
    CHECK(last == 950);
}

static void test_zero_every_is_one(void)
{
    struct ci_lanes l;
    ci_lanes_init(&l, 0);
    CHECK(l.every == 1);
}

TEST_MAIN(T(test_idle_slot_long_polls_interactive_then_looks_at_batch),
          T(test_both_lanes_busy_one_in_every), T(test_batch_alone_never_waits_on_interactive),
          T(test_interactive_goes_before_queued_batch_tasks),
          T(test_interactive_alone_looks_at_batch_now_and_then),
          T(test_idle_slots_share_the_batch_look), T(test_zero_every_is_one))
