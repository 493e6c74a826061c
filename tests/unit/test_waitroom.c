/* test_waitroom.c - the session waiting room without NATS: deliveries are
 * fakes, the first sequence of each session a table the test changes (as
 * acks would). Order, one lookup per session, readiness, in-progress acks,
 * cancel, full room, drain and free (ASan checks nothing leaks). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"
#include "worker/task.h"
#include "worker/waitroom.h"
#include "testutil.h"

/* The room never looks inside: the test defines what a delivery is. */
struct ci_delivery {
    int id;
    bool last;
    atomic_int progress;
    atomic_int naks;
    int64_t nak_delay;
    bool *freed; /* set on free, so that the test can tell */
};

struct fake {
    pthread_mutex_t lock;
    char sessions[4][65];
    uint64_t first[4]; /* 0: none (NOT_FOUND) */
    int lookups[4];
    bool fail;
};

static struct fake F;

static int session_index(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(F.sessions[i], s) == 0)
            return i;
    return -1;
}

static ci_status f_first_seq(void *ctx, const char *session_id, uint64_t *ret_seq,
                             struct ci_error *err)
{
    pthread_mutex_lock(&F.lock);
    int i = session_index(session_id);
    ci_status s = CI_ERR_NOT_FOUND;
    if (F.fail)
        s = ci_error_set(err, CI_ERR_NATS, "fake outage");
    else if (i >= 0) {
        F.lookups[i]++;
        if (F.first[i]) {
            *ret_seq = F.first[i];
            s = CI_OK;
        }
    }
    pthread_mutex_unlock(&F.lock);
    return s;
}

static void f_in_progress(void *ctx, struct ci_delivery *d) { atomic_fetch_add(&d->progress, 1); }
static void f_nak(void *ctx, struct ci_delivery *d, int64_t delay_ms)
{
    atomic_fetch_add(&d->naks, 1);
    d->nak_delay = delay_ms;
}
static bool f_last(void *ctx, struct ci_delivery *d) { return d->last; }
static bool freed_flags[64];
static int naks_seen[64];
static void f_free(void *ctx, struct ci_delivery *d)
{
    freed_flags[d->id] = true;
    naks_seen[d->id] = atomic_load(&d->naks);
    free(d);
}

static const struct ci_waitroom_ops OPS = {
    .first_seq = f_first_seq,
    .in_progress = f_in_progress,
    .nak = f_nak,
    .last_attempt = f_last,
    .free = f_free,
};

static void set_first(int i, const char *session, uint64_t seq)
{
    pthread_mutex_lock(&F.lock);
    snprintf(F.sessions[i], sizeof(F.sessions[i]), "%s", session);
    F.first[i] = seq;
    pthread_mutex_unlock(&F.lock);
}

static struct ci_delivery *delivery(int id)
{
    struct ci_delivery *d = calloc(1, sizeof(*d));
    d->id = id;
    freed_flags[id] = false;
    naks_seen[id] = 0;
    return d;
}

static struct ci_task_wait waiting(const char *task, const char *session, uint64_t seq)
{
    struct ci_task_wait w = {.seq = seq};
    snprintf(w.task_id, sizeof(w.task_id), "%s", task);
    snprintf(w.session_id, sizeof(w.session_id), "%s", session);
    return w;
}

static struct ci_waitroom *room(size_t max)
{
    memset(F.lookups, 0, sizeof(F.lookups));
    F.fail = false;
    for (int i = 0; i < 4; i++)
        set_first(i, "", 0);
    struct ci_waitroom_opts o = {
        .ops = &OPS, .max_waiting = max, .poll_ms = 10, .progress_every_ms = 50,
    };
    struct ci_waitroom *r = NULL;
    struct ci_error e = {{0}};
    if (ci_waitroom_new(&o, &r, &e) != CI_OK)
        fprintf(stderr, "%s\n", e.msg);
    return r;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A task is ready when the first sequence of its session is its own; the
 * next one of the session waits until then; another session is apart. */
static void test_ready_in_order(void)
{
    pthread_mutex_init(&F.lock, NULL);
    struct ci_waitroom *r = room(8);
    REQUIRE(r);
    set_first(0, "s1", 10);
    set_first(1, "s2", 20);
    struct ci_task_wait w;
    struct ci_delivery *got = NULL;
    CHECK(ci_waitroom_hold(r, delivery(1), &(struct ci_task_wait){0}) == CI_WAITROOM_HELD);
    /* ^ an empty session id: NOT_FOUND. Not at once (a follower may lag),
     * but when it lasts: the message is gone, task.c decides. */
    CHECK(!ci_waitroom_take(r, 500, &got, &w));
    CHECK(ci_waitroom_take(r, 5000, &got, &w));
    if (got) {
        CHECK(got->id == 1);
        free(got);
    }
    w = waiting("t-12", "s1", 12);
    CHECK(ci_waitroom_hold(r, delivery(2), &w) == CI_WAITROOM_HELD);
    w = waiting("t-11", "s1", 11);
    CHECK(ci_waitroom_hold(r, delivery(3), &w) == CI_WAITROOM_HELD);
    w = waiting("t-20", "s2", 20);
    CHECK(ci_waitroom_hold(r, delivery(4), &w) == CI_WAITROOM_HELD);
    CHECK(ci_waitroom_count(r) == 3);
    got = NULL;
    REQUIRE(ci_waitroom_take(r, 5000, &got, &w)); /* s2's: its turn */
    CHECK(got->id == 4);
    CHECK_STR(w.task_id, "t-20");
    CHECK(w.seq == 20);
    free(got);
    CHECK(!ci_waitroom_take(r, 100, &got, &w)); /* s1 still has 10 */
    int64_t slept = ci_mono_ms();
    pthread_mutex_lock(&F.lock);
    int before = F.lookups[0];
    pthread_mutex_unlock(&F.lock);
    sleep_ms(100);
    pthread_mutex_lock(&F.lock);
    int rounds = F.lookups[0] - before;
    pthread_mutex_unlock(&F.lock);
    slept = ci_mono_ms() - slept;
    /* One lookup per round for both of s1's tasks, less and less often
     * (10, 20, 40 ms...) while their turn does not come: without the
     * backoff there would be 10 in 100 ms. A busy machine makes fewer.
     * Only a sleep of about 100 ms says what 100 ms allow. */
    if (slept < 200)
        CHECK(rounds <= 6);
    else
        fprintf(stderr, "    note: the 100 ms sleep took %lld ms: backoff bound not checked\n",
                (long long)slept);
    for (int64_t until = ci_mono_ms() + 5000; rounds < 1 && ci_mono_ms() < until;) {
        sleep_ms(10);
        pthread_mutex_lock(&F.lock);
        rounds = F.lookups[0] - before;
        pthread_mutex_unlock(&F.lock);
    }
    CHECK(rounds >= 1); /* and they go on */
    set_first(0, "s1", 11); /* 10 was acked */
    REQUIRE(ci_waitroom_take(r, 5000, &got, &w));
    CHECK(got->id == 3 && w.seq == 11);
    free(got);
    CHECK(!ci_waitroom_take(r, 50, &got, &w));
    set_first(0, "s1", 12);
    REQUIRE(ci_waitroom_take(r, 5000, &got, &w));
    CHECK(got->id == 2);
    free(got);
    CHECK(ci_waitroom_count(r) == 0);
    ci_waitroom_free(r);
}

/* Held deliveries get in-progress acks; a failing lookup keeps them. */
static void test_keep_alive_and_outage(void)
{
    struct ci_waitroom *r = room(4);
    REQUIRE(r);
    pthread_mutex_lock(&F.lock);
    F.fail = true;
    pthread_mutex_unlock(&F.lock);
    struct ci_task_wait w = waiting("t-5", "s1", 5);
    struct ci_delivery *d = delivery(5);
    int64_t t0 = ci_mono_ms();
    CHECK(ci_waitroom_hold(r, d, &w) == CI_WAITROOM_HELD);
    int p = 0; /* the room's: d is alive */
    for (int64_t until = t0 + 5000; (p = atomic_load(&d->progress)) < 3 && ci_mono_ms() < until;)
        sleep_ms(5);
    /* At once, then every 50 ms: the third no sooner than 100 ms after. */
    CHECK(p >= 3);
    CHECK(ci_mono_ms() - t0 >= 100);
    struct ci_delivery *got = NULL;
    CHECK(!ci_waitroom_take(r, 0, &got, &w));
    pthread_mutex_lock(&F.lock);
    F.fail = false;
    pthread_mutex_unlock(&F.lock);
    set_first(0, "s1", 5);
    CHECK(ci_waitroom_take(r, 5000, &got, &w));
    CHECK(got == d);
    free(got);
    ci_waitroom_free(r);
}

/* A cancel makes a held task ready at once; an unknown id is not there. */
static void test_cancel(void)
{
    struct ci_waitroom *r = room(4);
    REQUIRE(r);
    set_first(0, "s1", 1);
    struct ci_task_wait w = waiting("t-9", "s1", 9);
    CHECK(ci_waitroom_hold(r, delivery(9), &w) == CI_WAITROOM_HELD);
    struct ci_delivery *got = NULL;
    CHECK(!ci_waitroom_take(r, 50, &got, &w));
    CHECK(!ci_waitroom_cancel(r, "t-other"));
    CHECK(ci_waitroom_cancel(r, "t-9"));
    CHECK(ci_waitroom_take(r, 0, &got, &w));
    CHECK(got && got->id == 9);
    CHECK_STR(w.task_id, "t-9");
    CHECK(w.cancelled); /* it ends CANCELLED without running, turn or not */
    free(got);
    /* Cancelled on its way to the room: ready at once, its turn or not. */
    struct ci_task_wait wc = waiting("t-10", "s1", 10);
    wc.cancelled = true;
    CHECK(ci_waitroom_hold(r, delivery(10), &wc) == CI_WAITROOM_HELD);
    got = NULL;
    CHECK(ci_waitroom_take(r, 0, &got, &w));
    CHECK(got && got->id == 10 && w.cancelled);
    free(got);
    ci_waitroom_free(r);
}

/* One more than max_waiting is nak'ed with a 1 s delay; max 0 holds none. */
static void test_full(void)
{
    struct ci_waitroom *r = room(2);
    REQUIRE(r);
    set_first(0, "s1", 1);
    struct ci_task_wait w = waiting("t", "s1", 5);
    CHECK(ci_waitroom_hold(r, delivery(10), &w) == CI_WAITROOM_HELD);
    CHECK(ci_waitroom_hold(r, delivery(11), &w) == CI_WAITROOM_HELD);
    struct ci_delivery *d = delivery(12);
    CHECK(ci_waitroom_hold(r, d, &w) == CI_WAITROOM_FULL);
    CHECK(freed_flags[12] && naks_seen[12] == 1);
    CHECK(ci_waitroom_count(r) == 2);
    /* A last delivery is held all the same: a nak would strand it. */
    struct ci_delivery *last = delivery(14);
    last->last = true;
    CHECK(ci_waitroom_hold(r, last, &w) == CI_WAITROOM_HELD);
    CHECK(!freed_flags[14] && naks_seen[14] == 0);
    CHECK(ci_waitroom_count(r) == 3);
    ci_waitroom_free(r); /* naks and frees what is held */
    CHECK(freed_flags[10] && naks_seen[10] == 1);
    CHECK(freed_flags[11] && naks_seen[11] == 1);

    r = room(0);
    REQUIRE(r);
    CHECK(ci_waitroom_hold(r, delivery(13), &w) == CI_WAITROOM_FULL);
    CHECK(freed_flags[13]);
    ci_waitroom_free(r);
}

/* Drain: every task not on its last attempt goes back at once, held or
 * ready, and any held later; one on its last attempt stays and runs. */
static void test_drain(void)
{
    struct ci_waitroom *r = room(8);
    REQUIRE(r);
    set_first(0, "s1", 1);
    set_first(1, "s2", 7);
    struct ci_task_wait w1 = waiting("t-5", "s1", 5);
    struct ci_task_wait w2 = waiting("t-7", "s2", 7);
    struct ci_task_wait w3 = waiting("t-6", "s1", 6);
    CHECK(ci_waitroom_hold(r, delivery(20), &w1) == CI_WAITROOM_HELD);
    CHECK(ci_waitroom_hold(r, delivery(21), &w2) == CI_WAITROOM_HELD); /* becomes ready */
    struct ci_delivery *last = delivery(22);
    last->last = true;
    CHECK(ci_waitroom_hold(r, last, &w3) == CI_WAITROOM_HELD);
    sleep_ms(50);
    CHECK(ci_waitroom_drain(r) == 2);
    CHECK(freed_flags[20] && naks_seen[20] == 1);
    CHECK(freed_flags[21] && naks_seen[21] == 1);
    CHECK(!freed_flags[22]);
    CHECK(ci_waitroom_count(r) == 1);
    CHECK(ci_waitroom_drain(r) == 0);
    CHECK(ci_waitroom_hold(r, delivery(23), &w1) == CI_WAITROOM_RETURNED);
    CHECK(freed_flags[23] && naks_seen[23] == 1);
    set_first(0, "s1", 6);
    struct ci_delivery *got = NULL;
    struct ci_task_wait w;
    CHECK(ci_waitroom_take(r, 5000, &got, &w));
    CHECK(got == last);
    free(got);
    CHECK(ci_waitroom_count(r) == 0);
    /* Closed (the worker's connection is about to go): even a last attempt
     * is given back, and a late cancel finds nothing. */
    ci_waitroom_close(r);
    struct ci_delivery *late = delivery(24);
    late->last = true;
    CHECK(ci_waitroom_hold(r, late, &w1) == CI_WAITROOM_RETURNED);
    CHECK(freed_flags[24]);
    CHECK(!ci_waitroom_cancel(r, "t-5"));
    ci_waitroom_close(r);
    ci_waitroom_free(r);
    ci_waitroom_free(NULL);
}

/* Slots taking while tasks become ready on the room's thread (their
 * session's first message is their own) or through a cancel. The takers
 * stop when the holder is done and the room is empty, not after an idle
 * time: on a loaded machine the room's thread may fall behind them. */
struct taker {
    struct ci_waitroom *r;
    atomic_int *taken;
    atomic_bool *done;
};

static void *take_loop(void *p)
{
    struct taker *t = p;
    int64_t until = ci_mono_ms() + 60000; /* a room that loses a task fails, not hangs */
    while (ci_mono_ms() < until) {
        struct ci_delivery *d = NULL;
        struct ci_task_wait w;
        if (ci_waitroom_take(t->r, 10, &d, &w)) {
            free(d);
            atomic_fetch_add(t->taken, 1);
        } else if (atomic_load(t->done) && ci_waitroom_count(t->r) == 0) {
            break;
        }
    }
    return NULL;
}

static void test_concurrent(void)
{
    struct ci_waitroom *r = room(64);
    REQUIRE(r);
    set_first(0, "s1", 1);
    atomic_int taken = 0;
    atomic_bool done = false;
    struct taker t = {r, &taken, &done};
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        pthread_create(&th[i], NULL, take_loop, &t);
    int held = 0;
    for (int i = 0; i < 200; i++) {
        struct ci_task_wait w = waiting("t", "s1", 1); /* its turn: ready on lookup */
        if (i % 7 == 0)
            ci_waitroom_cancel(r, "t");
        if (ci_waitroom_hold(r, delivery(30 + i % 30), &w) == CI_WAITROOM_HELD)
            held++;
    }
    atomic_store(&done, true);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    CHECK(held > 0);
    CHECK(atomic_load(&taken) == held);
    CHECK(ci_waitroom_count(r) == 0);
    ci_waitroom_free(r);
}

TEST_MAIN(T(test_ready_in_order), T(test_keep_alive_and_outage), T(test_cancel), T(test_full),
          T(test_drain), T(test_concurrent))
