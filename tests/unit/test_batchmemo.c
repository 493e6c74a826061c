/* test_batchmemo.c - what a worker remembers of batches (worker/batchmemo.h,
 * contract §20): seals kept until room is needed; a look that found no
 * cancel stands in for later looks only briefly, on the same link, and
 * never once a cancel came while it was in flight or after it; the slot
 * that lets go of a batch's task last learns it is the last. */
#include "worker/batchmemo.h"

#include <stdio.h>
#include <stdlib.h>

#include "testutil.h"

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
    CHECK(!ci_batch_memo_sealed(m, "b1", &total));
    CHECK(total == 7); /* untouched when not sealed */
    ci_batch_memo_seal(m, "b1", 200);
    CHECK(ci_batch_memo_sealed(m, "b1", &total) && total == 200);
    CHECK(!ci_batch_memo_sealed(m, "b2", &total));
    /* A cancel forgets the lack of a cancel, not the seal. */
    ci_batch_memo_cancel(m, "b1");
    CHECK(ci_batch_memo_sealed(m, "b1", &total) && total == 200);
    ci_batch_memo_free(m);
}

static void test_least_recently_used_makes_room(void)
{
    struct ci_batch_memo *m = memo(3);
    uint64_t total = 0;
    ci_batch_memo_seal(m, "a", 1);
    ci_batch_memo_seal(m, "b", 2);
    ci_batch_memo_seal(m, "c", 3);
    CHECK(ci_batch_memo_sealed(m, "a", &total) && total == 1); /* a used: b is the oldest */
    ci_batch_memo_seal(m, "d", 4);
    CHECK(!ci_batch_memo_sealed(m, "b", &total));
    CHECK(ci_batch_memo_sealed(m, "a", &total) && total == 1);
    CHECK(ci_batch_memo_sealed(m, "c", &total) && total == 3);
    CHECK(ci_batch_memo_sealed(m, "d", &total) && total == 4);
    /* Many more batches than room: never a wrong total for any. */
    for (int i = 0; i < 100; i++) {
        char id[16];
        snprintf(id, sizeof(id), "x%d", i);
        ci_batch_memo_seal(m, id, (uint64_t)i);
    }
    for (int i = 0; i < 100; i++) {
        char id[16];
        snprintf(id, sizeof(id), "x%d", i);
        if (ci_batch_memo_sealed(m, id, &total))
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
    ci_batch_memo_cancel(m, "b");
    CHECK(!ci_batch_memo_uncancelled(m, "b", 1, 0, NULL));
    CHECK(ci_batch_memo_uncancelled(m, "c", 1, 0, NULL)); /* another batch's cancel */
    /* A cancel of a batch the memo does not know is fine. */
    ci_batch_memo_cancel(m, "zzz");
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
    ci_batch_memo_cancel(m, "someother");
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
    CHECK(ci_batch_memo_let_go(m, "b") == 0); /* never held: counts */
    ci_batch_memo_hold(m, "b");
    ci_batch_memo_hold(m, "b");
    ci_batch_memo_hold(m, "c");
    CHECK(ci_batch_memo_held(m, "b") == 2);
    CHECK(ci_batch_memo_let_go(m, "b") == 1); /* another holds one: it counts later */
    CHECK(ci_batch_memo_let_go(m, "b") == 0); /* the last: counts */
    CHECK(ci_batch_memo_let_go(m, "b") == 0); /* never below 0 */
    CHECK(ci_batch_memo_held(m, "c") == 1);
    ci_batch_memo_free(m);
}

static void test_room_never_makes_more_held(void)
{
    /* Entries that slots hold tasks of make room last; when they must,
     * later let-gos see fewer held (they count more, never less). */
    struct ci_batch_memo *m = memo(2);
    uint64_t total = 0;
    ci_batch_memo_hold(m, "a");
    ci_batch_memo_seal(m, "x", 1);
    ci_batch_memo_seal(m, "y", 2); /* x goes, not a (held) */
    CHECK(ci_batch_memo_held(m, "a") == 1);
    CHECK(!ci_batch_memo_sealed(m, "x", &total));
    ci_batch_memo_hold(m, "b"); /* y goes */
    ci_batch_memo_hold(m, "c"); /* both held: the least recently used, a, goes */
    CHECK(ci_batch_memo_held(m, "a") == 0);
    CHECK(ci_batch_memo_let_go(m, "a") == 0);
    ci_batch_memo_hold(m, "a"); /* a again, over b */
    ci_batch_memo_hold(m, "a");
    CHECK(ci_batch_memo_let_go(m, "b") == 0);
    CHECK(ci_batch_memo_let_go(m, "a") == 1);
    CHECK(ci_batch_memo_let_go(m, "a") == 0);
    ci_batch_memo_free(m);
}

static void test_zero_cap_is_one(void)
{
    struct ci_batch_memo *m = memo(0);
    uint64_t total = 0;
    ci_batch_memo_seal(m, "a", 1);
    ci_batch_memo_seal(m, "b", 2);
    CHECK(!ci_batch_memo_sealed(m, "a", &total));
    CHECK(ci_batch_memo_sealed(m, "b", &total) && total == 2);
    ci_batch_memo_free(m);
    ci_batch_memo_free(NULL);
}

TEST_MAIN(T(test_seal_kept), T(test_least_recently_used_makes_room),
          T(test_no_cancel_stands_briefly), T(test_cancel_forgets),
          T(test_cancel_during_a_look_wins), T(test_the_slot_that_lets_go_last_counts),
          T(test_room_never_makes_more_held), T(test_zero_cap_is_one))
