/* test_batchmemo.c - what a worker remembers of batches (worker/batchmemo.h,
 * contract §20): seals kept until room is needed; a look that found no
 * cancel stands in for later looks only briefly, on the same link, and
 * never once a cancel came while it was in flight or after it; a cancel
 * sticks until the stream drops it, and so does a seal; the slot that lets
 * go of a batch's task last counts, also when it gives the task up after
 * another slot's end left the count to it. */
#include "worker/batchmemo.h"

#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

/* Wall clock times: seals and cancels are kept until UNTIL. */
#define NOW 1700000000000LL
#define UNTIL (NOW + 86400000LL)

static struct ci_batch_memo *memo(size_t cap)
{
    struct ci_batch_memo *m = NULL;
    struct ci_error e = {{0}};
    if (ci_batch_memo_new(cap, &m, &e) != CI_OK) {
        fprintf(stderr, "ci_batch_memo_new: %s\n", e.msg);
        abort();
    }
    return m;
}

static void test_seal_kept(void)
{
    struct ci_batch_memo *m = memo(4);
    uint64_t total = 7;
    CHECK(!ci_batch_memo_sealed(m, "b1", NOW, &total));
    CHECK(total == 7); /* untouched when not sealed */
    ci_batch_memo_seal(m, "b1", 200, UNTIL);
    CHECK(ci_batch_memo_sealed(m, "b1", NOW, &total) && total == 200);
    CHECK(!ci_batch_memo_sealed(m, "b2", NOW, &total));
    /* A cancel forgets the lack of a cancel, not the seal. */
    ci_batch_memo_cancel(m, "b1", UNTIL);
    CHECK(ci_batch_memo_sealed(m, "b1", NOW, &total) && total == 200);
    ci_batch_memo_free(m);
}

static void test_least_recently_used_makes_room(void)
{
    struct ci_batch_memo *m = memo(3);
    uint64_t total = 0;
    ci_batch_memo_seal(m, "a", 1, UNTIL);
    ci_batch_memo_seal(m, "b", 2, UNTIL);
    ci_batch_memo_seal(m, "c", 3, UNTIL);
    CHECK(ci_batch_memo_sealed(m, "a", NOW, &total) && total == 1); /* a used: b is the oldest */
    ci_batch_memo_seal(m, "d", 4, UNTIL);
    CHECK(!ci_batch_memo_sealed(m, "b", NOW, &total));
    CHECK(ci_batch_memo_sealed(m, "a", NOW, &total) && total == 1);
    CHECK(ci_batch_memo_sealed(m, "c", NOW, &total) && total == 3);
    CHECK(ci_batch_memo_sealed(m, "d", NOW, &total) && total == 4);
    /* Many more batches than room: never a wrong total for any. */
    for (int i = 0; i < 100; i++) {
        char id[16];
        snprintf(id, sizeof(id), "x%d", i);
        ci_batch_memo_seal(m, id, (uint64_t)i, UNTIL);
    }
    for (int i = 0; i < 100; i++) {
        char id[16];
        snprintf(id, sizeof(id), "x%d", i);
        if (ci_batch_memo_sealed(m, id, NOW, &total))
            CHECK(total == (uint64_t)i && i >= 97);
    }
    ci_batch_memo_free(m);
}

static void test_no_cancel_stands_briefly(void)
{
    struct ci_batch_memo *m = memo(4);
    uint64_t gen = 0;
    CHECK(!ci_batch_memo_uncancelled(m, "b", 1000, 0, &gen));
    ci_batch_memo_no_cancel(m, "b", gen, 1000, 0);
    CHECK(ci_batch_memo_uncancelled(m, "b", 1000, 0, NULL));
    CHECK(ci_batch_memo_uncancelled(m, "b", 1000 + CI_BATCH_MEMO_NO_CANCEL_MS - 1, 0, NULL));
    CHECK(!ci_batch_memo_uncancelled(m, "b", 1000 + CI_BATCH_MEMO_NO_CANCEL_MS, 0, NULL));
    CHECK(!ci_batch_memo_uncancelled(m, "b", 999, 0, NULL)); /* a clock that went back */
    CHECK(!ci_batch_memo_uncancelled(m, "other", 1000, 0, NULL));
    /* Another link (the connection was down since: a cancel may be lost). */
    CHECK(!ci_batch_memo_uncancelled(m, "b", 1001, 1, NULL));
    ci_batch_memo_free(m);
}

static void test_cancel_forgets(void)
{
    struct ci_batch_memo *m = memo(4);
    uint64_t gen = 0;
    ci_batch_memo_uncancelled(m, "b", 0, 0, &gen);
    ci_batch_memo_no_cancel(m, "b", gen, 0, 0);
    ci_batch_memo_uncancelled(m, "c", 0, 0, &gen);
    ci_batch_memo_no_cancel(m, "c", gen, 0, 0);
    ci_batch_memo_cancel(m, "b", UNTIL);
    CHECK(!ci_batch_memo_uncancelled(m, "b", 1, 0, NULL));
    CHECK(ci_batch_memo_uncancelled(m, "c", 1, 0, NULL)); /* another batch's cancel */
    /* A cancel of a batch the memo does not know is fine. */
    ci_batch_memo_cancel(m, "zzz", UNTIL);
    CHECK(ci_batch_memo_uncancelled(m, "c", 1, 0, NULL));
    ci_batch_memo_free(m);
}

static void test_cancel_during_a_look_wins(void)
{
    struct ci_batch_memo *m = memo(4);
    uint64_t gen = 0;
    CHECK(!ci_batch_memo_uncancelled(m, "b", 0, 0, &gen));
    /* The look is in flight; a cancel comes through the subscription (of
     * this batch, or any: the look may have been too early for it). */
    ci_batch_memo_cancel(m, "someother", UNTIL);
    ci_batch_memo_no_cancel(m, "b", gen, 0, 0);
    CHECK(!ci_batch_memo_uncancelled(m, "b", 1, 0, &gen));
    /* The next look, with nothing in between, is kept. */
    ci_batch_memo_no_cancel(m, "b", gen, 1, 0);
    CHECK(ci_batch_memo_uncancelled(m, "b", 2, 0, NULL));
    ci_batch_memo_free(m);
}

static void test_the_slot_that_lets_go_last_counts(void)
{
    struct ci_batch_memo *m = memo(4);
    CHECK(ci_batch_memo_held(m, "b") == 0);
    CHECK(ci_batch_memo_let_go(m, "b", true)); /* never held: counts */
    CHECK(ci_batch_memo_ended(m, "b"));        /* none held: counts */
    ci_batch_memo_hold(m, "b");
    ci_batch_memo_hold(m, "b");
    ci_batch_memo_hold(m, "c");
    CHECK(ci_batch_memo_held(m, "b") == 2);
    CHECK(!ci_batch_memo_let_go(m, "b", true)); /* another holds one: it counts later */
    CHECK(ci_batch_memo_let_go(m, "b", true));  /* the last: counts */
    CHECK(ci_batch_memo_let_go(m, "b", true));  /* never below 0: counts */
    CHECK(ci_batch_memo_held(m, "c") == 1);
    /* An end whose hold went already, while another slot holds one. */
    CHECK(!ci_batch_memo_ended(m, "c"));
    CHECK(ci_batch_memo_let_go(m, "c", false)); /* the count was left to it */
    ci_batch_memo_free(m);
}

/* The reviewer's case: attempt X1 is superseded (another worker's X2 ends
 * and counts, before Y's end is stored); Y ends on a slot of this worker
 * while X1 is still held, and leaves the count to it; X1 gives the task
 * up: it must count, or the batch never completes. */
static void test_a_given_up_task_counts_what_was_left_to_it(void)
{
    struct ci_batch_memo *m = memo(4);
    ci_batch_memo_hold(m, "b");                  /* X1 */
    ci_batch_memo_hold(m, "b");                  /* Y */
    CHECK(!ci_batch_memo_let_go(m, "b", true));  /* Y ended: X1 still held */
    CHECK(ci_batch_memo_let_go(m, "b", false));  /* X1 superseded: counts */
    /* Given up with nothing left to it: no count (its later attempt's). */
    ci_batch_memo_hold(m, "b");
    CHECK(!ci_batch_memo_let_go(m, "b", false));
    /* Left to it through several given up: the last one counts, once. */
    ci_batch_memo_hold(m, "b");
    ci_batch_memo_hold(m, "b");
    ci_batch_memo_hold(m, "b");
    CHECK(!ci_batch_memo_let_go(m, "b", true));
    CHECK(!ci_batch_memo_let_go(m, "b", false));
    CHECK(ci_batch_memo_let_go(m, "b", false));
    ci_batch_memo_hold(m, "b");
    CHECK(!ci_batch_memo_let_go(m, "b", false)); /* owed no more */
    ci_batch_memo_free(m);
}

static void test_room_never_makes_more_held(void)
{
    /* Entries that slots hold tasks of make room last; when they must,
     * later let-gos count (more, never less). */
    struct ci_batch_memo *m = memo(2);
    uint64_t total = 0;
    ci_batch_memo_hold(m, "a");
    ci_batch_memo_seal(m, "x", 1, UNTIL);
    ci_batch_memo_seal(m, "y", 2, UNTIL); /* x goes, not a (held) */
    CHECK(ci_batch_memo_held(m, "a") == 1);
    CHECK(!ci_batch_memo_sealed(m, "x", NOW, &total));
    ci_batch_memo_hold(m, "b"); /* y goes */
    ci_batch_memo_hold(m, "c"); /* both held: the least recently used, a, goes */
    CHECK(ci_batch_memo_held(m, "a") == 0);
    CHECK(ci_batch_memo_let_go(m, "a", true));
    CHECK(ci_batch_memo_let_go(m, "a", false)); /* lost: given up counts too */
    ci_batch_memo_hold(m, "a"); /* a again, over b */
    ci_batch_memo_hold(m, "a");
    CHECK(ci_batch_memo_let_go(m, "b", true));
    CHECK(!ci_batch_memo_let_go(m, "a", true));
    CHECK(ci_batch_memo_let_go(m, "a", true));
    ci_batch_memo_free(m);
}

/* A cancel that came through the subscription before the stream stored
 * it: a task taken after it looks, finds none on the stream, and must not
 * make the memo say "no cancel" (every task of the batch would run for
 * CI_BATCH_MEMO_NO_CANCEL_MS). It sticks. */
static void test_a_cancel_sticks(void)
{
    struct ci_batch_memo *m = memo(4);
    uint64_t gen = 0;
    CHECK(!ci_batch_memo_cancelled(m, "b", NOW));
    ci_batch_memo_cancel(m, "b", UNTIL);
    CHECK(ci_batch_memo_cancelled(m, "b", NOW));
    CHECK(!ci_batch_memo_cancelled(m, "other", NOW));
    CHECK(!ci_batch_memo_uncancelled(m, "b", 1000, 0, &gen));
    ci_batch_memo_no_cancel(m, "b", gen, 1000, 0); /* the stream did not show it yet */
    CHECK(!ci_batch_memo_uncancelled(m, "b", 1001, 0, &gen));
    CHECK(ci_batch_memo_cancelled(m, "b", NOW + 1000));
    /* Until the stream drops it: the id may be another batch's then. */
    CHECK(!ci_batch_memo_cancelled(m, "b", UNTIL));
    ci_batch_memo_no_cancel(m, "b", gen, 2000, 0);
    CHECK(ci_batch_memo_uncancelled(m, "b", 2001, 0, NULL));
    ci_batch_memo_free(m);
}

/* A seal is kept while the stream keeps it, not longer: a batch id used
 * again after that is another batch, with another total. */
static void test_a_seal_goes_with_the_stream(void)
{
    struct ci_batch_memo *m = memo(4);
    uint64_t total = 0;
    ci_batch_memo_seal(m, "b", 5, NOW + 1000);
    CHECK(ci_batch_memo_sealed(m, "b", NOW + 999, &total) && total == 5);
    CHECK(!ci_batch_memo_sealed(m, "b", NOW + 1000, &total));
    CHECK(!ci_batch_memo_sealed(m, "b", NOW, &total)); /* forgotten for good */
    ci_batch_memo_seal(m, "b", 9, UNTIL);
    CHECK(ci_batch_memo_sealed(m, "b", NOW, &total) && total == 9);
    ci_batch_memo_free(m);
}

static void test_zero_cap_is_one(void)
{
    struct ci_batch_memo *m = memo(0);
    uint64_t total = 0;
    ci_batch_memo_seal(m, "a", 1, UNTIL);
    ci_batch_memo_seal(m, "b", 2, UNTIL);
    CHECK(!ci_batch_memo_sealed(m, "a", NOW, &total));
    CHECK(ci_batch_memo_sealed(m, "b", NOW, &total) && total == 2);
    ci_batch_memo_free(m);
    ci_batch_memo_free(NULL);
}

TEST_MAIN(T(test_seal_kept), T(test_least_recently_used_makes_room),
          T(test_no_cancel_stands_briefly), T(test_cancel_forgets),
          T(test_cancel_during_a_look_wins), T(test_the_slot_that_lets_go_last_counts),
          T(test_a_given_up_task_counts_what_was_left_to_it), T(test_room_never_makes_more_held),
          T(test_a_cancel_sticks), T(test_a_seal_goes_with_the_stream), T(test_zero_cap_is_one))
