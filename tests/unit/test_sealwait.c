/* test_sealwait.c - seals counted off the subscription's thread
 * (worker/sealwait.h, contract §20): add never waits; a seal that the
 * stream shows only after a while (here 1.5 s, past the second the worker
 * used to wait on the subscription's thread) is still counted; a batch is
 * not added twice; one that never shows is given up; a full list drops. A
 * count owed is tried again while NATS fails, and done when the batch has
 * no seal, unless a seal comes meanwhile. */
#include "worker/sealwait.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void nap(int ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A stream that shows the seal from shown_ms on (monotonic; 0: never),
 * NATS failing before nats_ok_ms. */
struct fake {
    atomic_llong shown_ms, nats_ok_ms;
    atomic_int tries, done;
    atomic_llong done_ms, first_try_ms, last_try_ms;
};

static ci_status try_seal(void *closure, const char *batch_id, struct ci_error *err)
{
    struct fake *f = closure;
    long long first = 0;
    atomic_compare_exchange_strong(&f->first_try_ms, &first, now_ms());
    atomic_store(&f->last_try_ms, now_ms());
    atomic_fetch_add(&f->tries, 1);
    if (now_ms() < atomic_load(&f->nats_ok_ms))
        return ci_error_set(err, CI_ERR_NATS, "timeout");
    long long shown = atomic_load(&f->shown_ms);
    if (!shown || now_ms() < shown)
        return ci_error_set(err, CI_ERR_NOT_FOUND, "no sealed event for batch '%s'", batch_id);
    atomic_fetch_add(&f->done, 1);
    atomic_store(&f->done_ms, now_ms());
    return CI_OK;
}

static struct ci_sealwait *start(struct fake *f, size_t cap, int64_t give_up_ms)
{
    struct ci_sealwait_opts o = {
        .fn = try_seal, .closure = f, .cap = cap, .first_ms = 50, .max_pause_ms = 200,
        .give_up_ms = give_up_ms,
    };
    struct ci_sealwait *s = NULL;
    struct ci_error e = {{0}};
    if (ci_sealwait_start(&o, &s, &e) != CI_OK) {
        fprintf(stderr, "ci_sealwait_start: %s\n", e.msg);
        abort();
    }
    return s;
}

/* Waits (up to 20 s) for n batches counted. */
static bool wait_done(struct fake *f, int n)
{
    for (int64_t end = now_ms() + 20000; now_ms() < end; nap(10))
        if (atomic_load(&f->done) >= n)
            return true;
    return false;
}

static void test_a_late_seal_is_counted(void)
{
    struct fake f = {0};
    struct ci_sealwait *s = start(&f, 8, 30000);
    int64_t t0 = now_ms();
    atomic_store(&f.shown_ms, t0 + 1500);
    ci_sealwait_add(s, "b1");
    CHECK(now_ms() - t0 < 500); /* never waits on the caller's thread */
    ci_sealwait_add(s, "b1");   /* the same seal again (a copy): once */
    REQUIRE(wait_done(&f, 1));
    CHECK(atomic_load(&f.done_ms) >= t0 + 1500);
    CHECK(atomic_load(&f.tries) >= 2); /* tried, then again */
    /* Gone once counted; waits no more. */
    for (int64_t end = now_ms() + 5000; now_ms() < end && ci_sealwait_waiting(s); nap(10)) {
    }
    CHECK(ci_sealwait_waiting(s) == 0);
    nap(300);
    CHECK(atomic_load(&f.done) == 1);
    ci_sealwait_stop(s);
    ci_sealwait_free(s);
}

static void test_a_seal_shown_at_once_is_counted_at_once(void)
{
    struct fake f = {0};
    atomic_store(&f.shown_ms, 1);
    struct ci_sealwait *s = start(&f, 8, 30000);
    ci_sealwait_add(s, "b1");
    ci_sealwait_add(s, "b2");
    REQUIRE(wait_done(&f, 2));
    CHECK(atomic_load(&f.tries) == 2);
    ci_sealwait_free(s); /* stops it */
}

/* Given up after give_up_ms, not before, and tried again meanwhile: a
 * try is given up only after one at give_up_ms or later, so a first try
 * before then is followed by another (a thread scheduled late, on a busy
 * machine, may make its first try the last). */
static void test_given_up(void)
{
    struct fake f = {0}; /* never shown */
    const int64_t give_up_ms = 1000;
    struct ci_sealwait *s = start(&f, 8, give_up_ms);
    int64_t t0 = now_ms();
    ci_sealwait_add(s, "b1");
    for (int64_t end = now_ms() + 20000; now_ms() < end && ci_sealwait_waiting(s); nap(10)) {
    }
    CHECK(ci_sealwait_waiting(s) == 0);
    int tries = atomic_load(&f.tries);
    CHECK(tries >= 1);
    CHECK(tries >= 2 || atomic_load(&f.first_try_ms) >= t0 + give_up_ms);
    CHECK(atomic_load(&f.last_try_ms) >= t0 + give_up_ms); /* not given up early */
    nap(300);
    CHECK(atomic_load(&f.tries) == tries); /* no more tries */
    ci_sealwait_stop(s);
    ci_sealwait_free(s);
}

static void test_full_drops_and_stop(void)
{
    struct fake f = {0}; /* never shown: they stay */
    struct ci_sealwait *s = start(&f, 2, 60000);
    ci_sealwait_add(s, "a");
    ci_sealwait_add(s, "b");
    ci_sealwait_add(s, "c"); /* no room: dropped, logged */
    CHECK(ci_sealwait_waiting(s) == 2);
    ci_sealwait_add(s, "");  /* not a batch */
    CHECK(ci_sealwait_waiting(s) == 2);
    ci_sealwait_stop(s);
    ci_sealwait_add(s, "d"); /* after stop: nothing */
    int tries = atomic_load(&f.tries);
    nap(200);
    CHECK(atomic_load(&f.tries) == tries);
    ci_sealwait_free(s);
    ci_sealwait_free(NULL);
}

/* A count owed (a task's end whose count failed) is tried again while
 * NATS fails, and counted once it answers. */
static void test_a_count_is_tried_again(void)
{
    struct fake f = {0};
    int64_t t0 = now_ms();
    atomic_store(&f.shown_ms, 1);
    atomic_store(&f.nats_ok_ms, t0 + 500);
    struct ci_sealwait *s = start(&f, 8, 30000);
    ci_sealwait_count(s, "b1");
    ci_sealwait_count(s, "b1"); /* once */
    REQUIRE(wait_done(&f, 1));
    CHECK(atomic_load(&f.done_ms) >= t0 + 500);
    CHECK(atomic_load(&f.tries) >= 2);
    for (int64_t end = now_ms() + 5000; now_ms() < end && ci_sealwait_waiting(s); nap(10)) {
    }
    CHECK(ci_sealwait_waiting(s) == 0);
    nap(200);
    CHECK(atomic_load(&f.done) == 1);
    ci_sealwait_free(s);
}

/* A count owed of a batch without a seal is done at the first answer that
 * says so: the seal's own count comes when it is sealed. */
static void test_a_count_without_a_seal_is_done(void)
{
    struct fake f = {0}; /* never shown */
    struct ci_sealwait *s = start(&f, 8, 30000);
    ci_sealwait_count(s, "b1");
    for (int64_t end = now_ms() + 20000; now_ms() < end && ci_sealwait_waiting(s); nap(10)) {
    }
    CHECK(ci_sealwait_waiting(s) == 0);
    CHECK(atomic_load(&f.tries) == 1);
    CHECK(atomic_load(&f.done) == 0);
    ci_sealwait_free(s);
}

/* A seal that comes while a count of its batch is owed: the batch now waits
 * for the seal to show, as any seal does, rather than being done at the
 * first "no seal". */
static void test_a_seal_during_a_count_waits_for_the_seal(void)
{
    struct fake f = {0};
    int64_t t0 = now_ms();
    atomic_store(&f.nats_ok_ms, t0 + 60000); /* NATS fails until the seal came */
    atomic_store(&f.shown_ms, t0 + 60000);
    struct ci_sealwait *s = start(&f, 8, 30000);
    ci_sealwait_count(s, "b1");
    for (int64_t end = now_ms() + 20000; now_ms() < end && atomic_load(&f.tries) < 1; nap(5)) {
    }
    ci_sealwait_add(s, "b1"); /* the seal came: not stored yet */
    CHECK(ci_sealwait_waiting(s) == 1);
    int64_t t1 = now_ms();
    atomic_store(&f.shown_ms, t1 + 800);
    atomic_store(&f.nats_ok_ms, t1); /* NATS answers: "no seal" until t1 + 800 */
    REQUIRE(wait_done(&f, 1));
    CHECK(atomic_load(&f.done_ms) >= t1 + 800);
    ci_sealwait_free(s);
}

static void test_null(void)
{
    CHECK(ci_sealwait_waiting(NULL) == 0);
    ci_sealwait_add(NULL, "b1");
    ci_sealwait_count(NULL, "b1");
    ci_sealwait_stop(NULL);
    ci_sealwait_free(NULL);
}

TEST_MAIN(T(test_a_late_seal_is_counted), T(test_a_seal_shown_at_once_is_counted_at_once),
          T(test_given_up), T(test_full_drops_and_stop), T(test_a_count_is_tried_again),
          T(test_a_count_without_a_seal_is_done),
          T(test_a_seal_during_a_count_waits_for_the_seal), T(test_null))
