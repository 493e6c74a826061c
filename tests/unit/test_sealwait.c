/* test_sealwait.c - seals counted off the subscription's thread
 * (worker/sealwait.h, contract §20): add never waits; a seal that the
 * stream shows only after a while (here 1.5 s, past the second the worker
 * used to wait on the subscription's thread) is still counted; a batch is
 * not added twice; one that never shows is given up; a full list drops. */
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

/* A stream that shows the seal from shown_ms on (monotonic; 0: never). */
struct fake {
    atomic_llong shown_ms;
    atomic_int tries, done;
    atomic_llong done_ms;
};

static ci_status try_seal(void *closure, const char *batch_id, struct ci_error *err)
{
    struct fake *f = closure;
    atomic_fetch_add(&f->tries, 1);
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

static void test_given_up(void)
{
    struct fake f = {0}; /* never shown */
    struct ci_sealwait *s = start(&f, 8, 300);
    ci_sealwait_add(s, "b1");
    for (int64_t end = now_ms() + 20000; now_ms() < end && ci_sealwait_waiting(s); nap(10)) {
    }
    CHECK(ci_sealwait_waiting(s) == 0);
    int tries = atomic_load(&f.tries);
    CHECK(tries >= 2);
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

TEST_MAIN(T(test_a_late_seal_is_counted), T(test_a_seal_shown_at_once_is_counted_at_once),
          T(test_given_up), T(test_full_drops_and_stop))
