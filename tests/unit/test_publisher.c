/* test_publisher.c - the live output's publisher thread (publisher.h)
 * without NATS: a fake publish records the chunks, and can be held (a gate
 * the test opens) to stand for a NATS socket that blocks. Order; a full
 * queue drops the chunk and its number stays used (with the live output in
 * front: a gap in Ci-Seq), while the writer never waits; after end() a put
 * waits for room instead; drain() waits at most until the deadline (plus
 * the publish under way), then drops the rest, and nothing put before it
 * goes out after it; free() drops what is queued; NULL. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "worker/liveout.h"
#include "worker/publisher.h"
#include "testutil.h"

#define MAX_CHUNKS 1024

struct chunk {
    int stream; /* 0 stdout, 1 stderr */
    uint64_t seq;
    size_t len;
    uint8_t data[16];
};

/* What the publisher's thread did, under lock; the test reads it. */
static struct fake {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct chunk c[MAX_CHUNKS];
    size_t n;            /* published */
    bool closed;         /* the gate: publish waits while closed */
    int64_t give_up_ms;  /* ... at most this long, then fails (0: until it opens) */
    unsigned delay_us;   /* every publish takes this long: a slow NATS that works */
    int entered;         /* publish calls so far */
    /* what ops->dropped was told */
    uint64_t dropped_seq[MAX_CHUNKS];
    ci_status dropped_why[MAX_CHUNKS];
    char last_why[256];
    size_t n_dropped;
} F = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

static void fake_reset(bool closed, int64_t give_up_ms)
{
    pthread_mutex_lock(&F.lock);
    F.n = F.n_dropped = 0;
    F.entered = 0;
    F.closed = closed;
    F.give_up_ms = give_up_ms;
    F.delay_us = 0;
    pthread_mutex_unlock(&F.lock);
}

static void gate_open(void)
{
    pthread_mutex_lock(&F.lock);
    F.closed = false;
    pthread_cond_broadcast(&F.cond);
    pthread_mutex_unlock(&F.lock);
}

static size_t published(void)
{
    pthread_mutex_lock(&F.lock);
    size_t n = F.n;
    pthread_mutex_unlock(&F.lock);
    return n;
}

/* Waits (at most 10 s) until publish was called n times. */
static bool wait_entered(int n)
{
    int64_t until = ci_mono_ms() + 10000;
    pthread_mutex_lock(&F.lock);
    while (F.entered < n && ci_mono_ms() < until) {
        pthread_mutex_unlock(&F.lock);
        usleep(1000);
        pthread_mutex_lock(&F.lock);
    }
    bool ok = F.entered >= n;
    pthread_mutex_unlock(&F.lock);
    return ok;
}

static ci_status fake_publish(void *ctx, const char *stream, uint64_t seq, const uint8_t *data,
                              size_t len, struct ci_error *err)
{
    (void)ctx;
    pthread_mutex_lock(&F.lock);
    F.entered++;
    pthread_cond_broadcast(&F.cond);
    int64_t until = F.give_up_ms ? ci_mono_ms() + F.give_up_ms : 0;
    while (F.closed && (!until || ci_mono_ms() < until)) {
        pthread_mutex_unlock(&F.lock);
        usleep(1000);
        pthread_mutex_lock(&F.lock);
    }
    if (F.delay_us) {
        pthread_mutex_unlock(&F.lock);
        usleep(F.delay_us);
        pthread_mutex_lock(&F.lock);
    }
    ci_status s = CI_OK;
    if (F.closed)
        s = ci_error_set(err, CI_ERR_NATS, "fake: the socket stayed blocked");
    else if (F.n < MAX_CHUNKS) {
        struct chunk *c = &F.c[F.n++];
        c->stream = strcmp(stream, "stdout") == 0 ? 0 : strcmp(stream, "stderr") == 0 ? 1 : -1;
        c->seq = seq;
        c->len = len;
        memcpy(c->data, data, len < sizeof(c->data) ? len : sizeof(c->data));
    }
    pthread_mutex_unlock(&F.lock);
    return s;
}

static void fake_dropped(void *ctx, const char *stream, uint64_t seq, ci_status s,
                         const char *why)
{
    (void)ctx;
    (void)stream;
    pthread_mutex_lock(&F.lock);
    if (F.n_dropped < MAX_CHUNKS && why && why[0]) {
        F.dropped_seq[F.n_dropped] = seq;
        F.dropped_why[F.n_dropped] = s;
        F.n_dropped++;
        snprintf(F.last_why, sizeof(F.last_why), "%s", why);
    }
    pthread_mutex_unlock(&F.lock);
}

static const struct ci_publisher_ops fake_ops = {.publish = fake_publish,
                                                 .dropped = fake_dropped};

static struct ci_publisher *make(size_t max_chunks, size_t max_bytes)
{
    struct ci_publisher_opts o = {.ops = &fake_ops, .max_chunks = max_chunks,
                                  .max_bytes = max_bytes};
    struct ci_publisher *p = NULL;
    return ci_publisher_new(&o, &p, NULL) == CI_OK ? p : NULL;
}

static ci_status put(struct ci_publisher *p, int stream, uint64_t seq, const char *s)
{
    return ci_publisher_put(p, stream == 0 ? "stdout" : "stderr", seq, (const uint8_t *)s,
                            strlen(s), NULL);
}

/* Chunks go out in the order they were put, both streams interleaved, and
 * drain() returns once they all did. */
static void test_order(void)
{
    fake_reset(false, 0);
    struct ci_publisher *p = make(0, 0);
    REQUIRE(p);
    for (uint64_t i = 1; i <= 200; i++)
        CHECK(put(p, (int)(i % 2), (i + 1) / 2, i % 2 ? "err" : "out") == CI_OK);
    ci_publisher_end(p, ci_mono_ms() + 10000);
    CHECK(ci_publisher_drain(p) == CI_OK);
    REQUIRE(published() == 200);
    for (size_t i = 0; i < 200; i++) {
        CHECK(F.c[i].stream == (int)((i + 1) % 2));
        CHECK(F.c[i].seq == (i + 2) / 2);
        CHECK(F.c[i].len == 3);
    }
    struct ci_publisher_stats st;
    ci_publisher_stats(p, &st);
    CHECK(st.published == 200 && st.bytes == 600 && st.refused == 0 && st.failed == 0 &&
          st.left == 0);
    CHECK(F.n_dropped == 0);
    ci_publisher_free(p);
}

/* The live output in front of a publisher whose NATS blocks: the writer
 * (the run's wait loop) goes on, a chunk that finds the queue full is
 * dropped with its number used, the queued ones keep their order, and once
 * NATS moves the rest comes after the gap. */
static struct ci_publisher *gap_pub;

static ci_status to_publisher(void *ctx, const char *stream, uint64_t seq, const uint8_t *data,
                              size_t len, struct ci_error *err)
{
    (void)ctx;
    return ci_publisher_put(gap_pub, stream, seq, data, len, err);
}

static const struct ci_liveout_ops to_publisher_ops = {.publish = to_publisher};

static void test_full_leaves_gap(void)
{
    fake_reset(true, 0); /* NATS blocks until the test opens the gate */
    gap_pub = make(2, 1 << 20);
    REQUIRE(gap_pub);
    struct ci_liveout_opts lo_o = {.ops = &to_publisher_ops, .cap = 1 << 20, .flush_bytes = 4,
                                   .max_chunk = 4, .delay_ms = 50};
    struct ci_liveout *lo = NULL;
    REQUIRE(ci_liveout_new(&lo_o, &lo, NULL) == CI_OK);

    int64_t t0 = ci_mono_ms();
    ci_liveout_write(lo, CI_OUTPUT_STDOUT, (const uint8_t *)"aaaa", 4, 0); /* 1: being published */
    CHECK(wait_entered(1));
    ci_liveout_write(lo, CI_OUTPUT_STDOUT, (const uint8_t *)"bbbb", 4, 0); /* 2: queued */
    ci_liveout_write(lo, CI_OUTPUT_STDOUT, (const uint8_t *)"cccc", 4, 0); /* 3: queued */
    ci_liveout_write(lo, CI_OUTPUT_STDOUT, (const uint8_t *)"dddd", 4, 0); /* 4: full, dropped */
    ci_liveout_write(lo, CI_OUTPUT_STDERR, (const uint8_t *)"eeee", 4, 0); /* stderr 1: dropped */
    CHECK(ci_mono_ms() - t0 < 5000); /* it never waited for the blocked publish */
    CHECK(published() == 0);
    pthread_mutex_lock(&F.lock);
    CHECK(F.n_dropped == 2);
    CHECK(F.dropped_seq[0] == 4 && F.dropped_why[0] == CI_ERR_LIMIT);
    CHECK(F.dropped_seq[1] == 1 && F.dropped_why[1] == CI_ERR_LIMIT);
    pthread_mutex_unlock(&F.lock);

    gate_open();
    ci_publisher_end(gap_pub, ci_mono_ms() + 10000);
    ci_liveout_finish(lo, "aaaabbbbccccddddffff", "eeee");
    CHECK(ci_publisher_drain(gap_pub) == CI_OK);
    REQUIRE(published() == 4);
    uint64_t want_seq[] = {1, 2, 3, 5};
    const char *want[] = {"aaaa", "bbbb", "cccc", "ffff"};
    for (size_t i = 0; i < 4; i++) {
        CHECK(F.c[i].stream == 0 && F.c[i].seq == want_seq[i]);
        CHECK(F.c[i].len == 4 && memcmp(F.c[i].data, want[i], 4) == 0);
    }
    struct ci_publisher_stats st;
    ci_publisher_stats(gap_pub, &st);
    CHECK(st.published == 4 && st.refused == 2 && st.failed == 0 && st.left == 0);
    ci_liveout_free(lo);
    ci_publisher_free(gap_pub);
    gap_pub = NULL;
}

/* The run's end (ci_liveout_flush) tells run_ended before it publishes
 * what is pending: the worker's sets the publisher's end deadline there, so
 * that the run's last chunks wait for room as the result's tail does,
 * rather than find the queue full for a moment and be dropped. */
static void *open_gate_later(void *arg)
{
    (void)arg;
    usleep(200 * 1000);
    gate_open();
    return NULL;
}

static void publisher_end_soon(void *ctx)
{
    (void)ctx;
    ci_publisher_end(gap_pub, ci_mono_ms() + 10000);
}

static void test_run_end_waits_for_room(void)
{
    fake_reset(true, 0);
    gap_pub = make(1, 1 << 20);
    REQUIRE(gap_pub);
    const struct ci_liveout_ops ops = {.publish = to_publisher, .run_ended = publisher_end_soon};
    struct ci_liveout_opts lo_o = {.ops = &ops, .cap = 1 << 20, .flush_bytes = 4,
                                   .max_chunk = 4, .delay_ms = 50};
    struct ci_liveout *lo = NULL;
    REQUIRE(ci_liveout_new(&lo_o, &lo, NULL) == CI_OK);
    ci_liveout_write(lo, CI_OUTPUT_STDOUT, (const uint8_t *)"aaaa", 4, 0); /* 1: being published */
    CHECK(wait_entered(1));
    ci_liveout_write(lo, CI_OUTPUT_STDOUT, (const uint8_t *)"bbbb", 4, 0); /* 2: the queue is full */
    ci_liveout_write(lo, CI_OUTPUT_STDOUT, (const uint8_t *)"cc", 2, 0);   /* pending */
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, open_gate_later, NULL) == 0);
    ci_liveout_flush(lo); /* 3 waits for room, NATS moves */
    pthread_join(t, NULL);
    CHECK(ci_publisher_drain(gap_pub) == CI_OK);
    REQUIRE(published() == 3);
    CHECK(F.c[2].seq == 3 && F.c[2].len == 2 && memcmp(F.c[2].data, "cc", 2) == 0);
    CHECK(F.n_dropped == 0);
    ci_liveout_free(lo);
    ci_publisher_free(gap_pub);
    gap_pub = NULL;
}

/* After end(), a put waits for room (the tail finish() publishes is not
 * dropped because the live chunks before it are still going out). */
struct producer {
    struct ci_publisher *p;
    int n;
    int refused;
};

static void *produce(void *arg)
{
    struct producer *pr = arg;
    for (int i = 1; i <= pr->n; i++)
        if (put(pr->p, 0, (uint64_t)i, "tail") != CI_OK)
            pr->refused++;
    return NULL;
}

static void test_end_waits_for_room(void)
{
    fake_reset(true, 0);
    struct ci_publisher *p = make(1, 1 << 20);
    REQUIRE(p);
    ci_publisher_end(p, ci_mono_ms() + 30000);
    struct producer pr = {.p = p, .n = 50};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, produce, &pr) == 0);
    CHECK(wait_entered(1));
    gate_open();
    pthread_join(t, NULL);
    CHECK(pr.refused == 0);
    CHECK(ci_publisher_drain(p) == CI_OK);
    REQUIRE(published() == 50);
    for (size_t i = 0; i < 50; i++)
        CHECK(F.c[i].seq == i + 1);
    ci_publisher_free(p);
}

/* After end(), a put that finds the queue full waits for room only until
 * the deadline: with NATS stuck, the third chunk (the first is being
 * published, the second fills the queue) is refused with CI_ERR_TIMEOUT
 * about when the deadline passes, counted and told. Run on a thread of its
 * own, so that a put that waits for good fails the test, not hangs it. */
struct one_put {
    struct ci_publisher *p;
    ci_status s;
    int64_t done_at_ms;
    atomic_bool done;
};

static void *put_third(void *arg)
{
    struct one_put *op = arg;
    op->s = put(op->p, 0, 3, "three");
    op->done_at_ms = ci_mono_ms();
    atomic_store(&op->done, true);
    return NULL;
}

static void test_put_waits_until_deadline(void)
{
    fake_reset(true, 0); /* NATS blocks until the test opens the gate */
    struct ci_publisher *p = make(1, 1 << 20);
    REQUIRE(p);
    CHECK(put(p, 0, 1, "one") == CI_OK); /* taken by the thread, which blocks */
    CHECK(wait_entered(1));
    CHECK(put(p, 0, 2, "two") == CI_OK); /* the queue is full */
    int64_t t0 = ci_mono_ms();
    ci_publisher_end(p, t0 + 200);
    struct one_put op = {.p = p};
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, put_third, &op) == 0);
    int64_t until = ci_mono_ms() + 3000;
    while (!atomic_load(&op.done) && ci_mono_ms() < until)
        usleep(5000);
    CHECK(atomic_load(&op.done)); /* not: it waited past the deadline */
    gate_open(); /* a put still waiting finds room now */
    pthread_join(t, NULL);
    CHECK(op.s == CI_ERR_TIMEOUT);
    CHECK(op.done_at_ms - t0 >= 200 && op.done_at_ms - t0 < 1000);
    struct ci_publisher_stats st;
    ci_publisher_stats(p, &st);
    CHECK(st.refused == 1);
    pthread_mutex_lock(&F.lock);
    CHECK(F.n_dropped == 1 && F.dropped_seq[0] == 3 && F.dropped_why[0] == CI_ERR_TIMEOUT);
    pthread_mutex_unlock(&F.lock);
    ci_publisher_free(p);
}

/* A NATS that stays stuck: drain() waits until the deadline, drops what is
 * queued, and returns when the publish under way gives up (nats.c's call
 * returns); nothing put before drain() goes out after it. */
static void test_drain_bounded(void)
{
    fake_reset(true, 800); /* a blocked publish fails after 800 ms */
    struct ci_publisher *p = make(0, 0);
    REQUIRE(p);
    CHECK(put(p, 0, 1, "one") == CI_OK);
    CHECK(wait_entered(1));
    CHECK(put(p, 0, 2, "two") == CI_OK);
    CHECK(put(p, 1, 1, "err") == CI_OK);
    int64_t t0 = ci_mono_ms();
    ci_publisher_end(p, t0 + 100);
    CHECK(ci_publisher_drain(p) == CI_ERR_TIMEOUT);
    int64_t took = ci_mono_ms() - t0;
    CHECK(took >= 100 && took < 5000);
    struct ci_publisher_stats st;
    ci_publisher_stats(p, &st);
    CHECK(st.published == 0 && st.failed == 1 && st.left == 2);
    pthread_mutex_lock(&F.lock);
    CHECK(F.entered == 1); /* the queued two were never tried */
    CHECK(F.n_dropped == 3);
    size_t timeouts = 0, nats = 0;
    for (size_t i = 0; i < F.n_dropped; i++) {
        timeouts += F.dropped_why[i] == CI_ERR_TIMEOUT;
        nats += F.dropped_why[i] == CI_ERR_NATS;
    }
    CHECK(timeouts == 2 && nats == 1);
    pthread_mutex_unlock(&F.lock);
    gate_open();
    usleep(50 * 1000);
    CHECK(published() == 0);
    /* It stays usable: a later chunk goes out. */
    CHECK(put(p, 0, 3, "three") == CI_OK);
    ci_publisher_end(p, ci_mono_ms() + 10000);
    CHECK(ci_publisher_drain(p) == CI_OK);
    CHECK(published() == 1 && F.c[0].seq == 3);
    ci_publisher_free(p);
}

/* free() with chunks queued behind a blocked publish: they are dropped
 * (told), the publish under way ends, the thread is joined. */
static void test_free_drops(void)
{
    fake_reset(true, 300);
    struct ci_publisher *p = make(0, 0);
    REQUIRE(p);
    CHECK(put(p, 0, 1, "x") == CI_OK);
    CHECK(wait_entered(1));
    CHECK(put(p, 0, 2, "y") == CI_OK);
    CHECK(put(p, 0, 3, "z") == CI_OK);
    ci_publisher_free(p);
    CHECK(published() == 0);
    pthread_mutex_lock(&F.lock);
    CHECK(F.entered == 1);
    CHECK(F.n_dropped == 3);
    size_t cancelled = 0;
    for (size_t i = 0; i < F.n_dropped; i++)
        cancelled += F.dropped_why[i] == CI_ERR_CANCELLED;
    CHECK(cancelled == 2);
    pthread_mutex_unlock(&F.lock);
}

/* The bytes bound: a chunk that would take the queue past max_bytes is
 * dropped, one that fits is not. */
static void test_bytes_bound(void)
{
    fake_reset(true, 0);
    struct ci_publisher *p = make(100, 8);
    REQUIRE(p);
    CHECK(put(p, 0, 1, "0123456789abcdef") == CI_OK); /* taken by the thread */
    CHECK(wait_entered(1));
    CHECK(put(p, 0, 2, "0123456789") == CI_OK);       /* an empty queue takes any chunk */
    CHECK(put(p, 0, 3, "x") == CI_ERR_LIMIT);         /* 11 > 8 */
    gate_open();
    ci_publisher_free(p);
    fake_reset(true, 0);
    p = make(100, 8);
    REQUIRE(p);
    CHECK(put(p, 0, 1, "first") == CI_OK);
    CHECK(wait_entered(1));
    CHECK(put(p, 0, 2, "1234") == CI_OK);
    CHECK(put(p, 0, 3, "5678") == CI_OK); /* 8: fits */
    CHECK(put(p, 0, 4, "9") == CI_ERR_LIMIT);
    gate_open();
    ci_publisher_end(p, ci_mono_ms() + 10000);
    CHECK(ci_publisher_drain(p) == CI_OK);
    CHECK(published() == 3);
    ci_publisher_free(p);
}

/* The queue sized for an output cap (ci_publisher_size, as the worker
 * sizes it: both streams up to the cap) holds all an attempt may put: a
 * publish far slower than the writer, but working, loses none of 16 MiB
 * written at once with the cap at 16 MiB. The 1 MiB queue every attempt
 * once had dropped most of them. */
static void test_sized_for_the_cap(void)
{
    struct ci_publisher_opts o = {.ops = &fake_ops};
    ci_publisher_size(&o, 2 * (uint64_t)(16 << 20), CI_LIVEOUT_FLUSH_BYTES);
    CHECK(o.max_bytes == 32 << 20 && o.max_chunks == 2048 + CI_PUBLISHER_MAX_CHUNKS);
    struct ci_publisher_opts small = {0}, huge = {0};
    ci_publisher_size(&small, 2 * 1024, CI_LIVEOUT_FLUSH_BYTES);
    CHECK(small.max_bytes == CI_PUBLISHER_MAX_BYTES);
    CHECK(small.max_chunks == 64 + CI_PUBLISHER_MAX_CHUNKS);
    ci_publisher_size(&huge, (uint64_t)1 << 40, 1);
    CHECK(huge.max_bytes == CI_PUBLISHER_HARD_MAX_BYTES);
    CHECK(huge.max_chunks == CI_PUBLISHER_HARD_MAX_CHUNKS);

    fake_reset(false, 0);
    F.delay_us = 300;
    gap_pub = NULL;
    REQUIRE(ci_publisher_new(&o, &gap_pub, NULL) == CI_OK);
    struct ci_liveout_opts lo_o = {.ops = &to_publisher_ops, .cap = 16 << 20};
    struct ci_liveout *lo = NULL;
    REQUIRE(ci_liveout_new(&lo_o, &lo, NULL) == CI_OK);
    static uint8_t block[64 * 1024];
    memset(block, 'x', sizeof(block));
    int64_t t0 = ci_mono_ms();
    for (int i = 0; i < 256; i++) /* 16 MiB, in 256 chunks of 64 KiB */
        ci_liveout_write(lo, CI_OUTPUT_STDOUT, block, sizeof(block), 0);
    ci_liveout_flush(lo);
    CHECK(ci_mono_ms() - t0 < 2000); /* the writer never waited for the publishes */
    ci_publisher_end(gap_pub, ci_mono_ms() + 30000);
    CHECK(ci_publisher_drain(gap_pub) == CI_OK);
    REQUIRE(published() == 256);
    for (size_t i = 0; i < 256; i++)
        CHECK(F.c[i].seq == i + 1 && F.c[i].len == sizeof(block));
    CHECK(F.n_dropped == 0);
    struct ci_publisher_stats st;
    ci_publisher_stats(gap_pub, &st);
    CHECK(st.published == 256 && st.bytes == 16 << 20 && st.refused == 0 && st.left == 0);
    ci_liveout_free(lo);
    ci_publisher_free(gap_pub);
    gap_pub = NULL;
}

static void test_null(void)
{
    ci_publisher_free(NULL);
    struct ci_publisher_stats st;
    memset(&st, 0xff, sizeof(st));
    ci_publisher_stats(NULL, &st);
    CHECK(st.published == 0 && st.left == 0);
    struct ci_publisher_ops none = {0};
    struct ci_publisher_opts o = {.ops = &none};
    struct ci_publisher *p = (struct ci_publisher *)&o;
    struct ci_error e = {{0}};
    CHECK(ci_publisher_new(&o, &p, &e) == CI_ERR_INVALID);
    CHECK(p == (struct ci_publisher *)&o); /* untouched on failure */
    /* Without end(), drain() does not wait: it stops the publisher, what
     * is queued is dropped as stopped, not as past the end's deadline. */
    fake_reset(true, 200);
    p = make(0, 0);
    REQUIRE(p);
    CHECK(put(p, 0, 1, "a") == CI_OK);
    CHECK(wait_entered(1));
    CHECK(put(p, 0, 2, "b") == CI_OK);
    CHECK(ci_publisher_drain(p) == CI_ERR_CANCELLED);
    pthread_mutex_lock(&F.lock);
    CHECK(F.n_dropped == 2 && F.dropped_seq[1] == 2 && F.dropped_why[1] == CI_ERR_CANCELLED);
    CHECK(strstr(F.last_why, "stopped") != NULL);
    pthread_mutex_unlock(&F.lock);
    ci_publisher_free(p);
}

/* stop(): what is queued is dropped at once, told CI_ERR_CANCELLED with the
 * caller's reason, and it returns only once the publish under way ended:
 * nothing put before it goes out after it. It stays usable. */
static void test_stop(void)
{
    fake_reset(true, 300); /* a blocked publish fails after 300 ms */
    struct ci_publisher *p = make(0, 0);
    REQUIRE(p);
    CHECK(put(p, 0, 1, "one") == CI_OK);
    CHECK(wait_entered(1));
    CHECK(put(p, 0, 2, "two") == CI_OK);
    CHECK(put(p, 1, 1, "err") == CI_OK);
    int64_t t0 = ci_mono_ms();
    ci_publisher_stop(p, "another attempt ended the task");
    CHECK(ci_mono_ms() - t0 >= 250); /* it waited for the publish under way */
    gate_open();
    usleep(50 * 1000);
    CHECK(published() == 0);
    struct ci_publisher_stats st;
    ci_publisher_stats(p, &st);
    CHECK(st.published == 0 && st.failed == 1 && st.left == 2);
    pthread_mutex_lock(&F.lock);
    CHECK(F.entered == 1);
    CHECK(F.n_dropped == 3);
    CHECK(F.dropped_why[0] == CI_ERR_NATS); /* the one under way */
    CHECK(F.dropped_why[1] == CI_ERR_CANCELLED && F.dropped_why[2] == CI_ERR_CANCELLED);
    CHECK(strcmp(F.last_why, "another attempt ended the task") == 0);
    pthread_mutex_unlock(&F.lock);
    ci_publisher_stop(p, NULL); /* nothing queued: nothing told */
    CHECK(F.n_dropped == 3);
    CHECK(put(p, 0, 3, "three") == CI_OK);
    ci_publisher_end(p, ci_mono_ms() + 10000);
    CHECK(ci_publisher_drain(p) == CI_OK);
    CHECK(published() == 1 && F.c[0].seq == 3);
    ci_publisher_free(p);
}

TEST_MAIN(T(test_order), T(test_full_leaves_gap), T(test_end_waits_for_room),
          T(test_run_end_waits_for_room), T(test_put_waits_until_deadline), T(test_drain_bounded),
          T(test_free_drops), T(test_bytes_bound), T(test_stop), T(test_sized_for_the_cap),
          T(test_null))
