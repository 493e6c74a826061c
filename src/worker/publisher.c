/* publisher.c - an attempt's live output chunks, published from a thread of
 * their own (publisher.h). */
#include "worker/publisher.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"

/* A queued chunk: one allocation, its stream's name after its bytes. */
struct chunk {
    struct chunk *next;
    uint64_t seq;
    const char *stream;
    size_t len;
    uint8_t data[];
};

struct ci_publisher {
    struct ci_publisher_opts o;
    pthread_mutex_t lock;
    pthread_cond_t more; /* for the thread: a chunk came, or stop */
    pthread_cond_t less; /* for put() and drain(): a chunk went, or the thread is idle */
    pthread_t thread;
    bool started;
    bool stop;
    bool busy;           /* the thread is publishing a chunk it took off the queue */
    struct chunk *head, *tail;
    size_t n, bytes;     /* queued (the chunk being published is no longer) */
    int64_t deadline_ms; /* set by end(); 0: the run goes on */
    struct ci_publisher_stats stats;
};

static void tell_dropped(struct ci_publisher *p, const char *stream, uint64_t seq, ci_status s,
                         const struct ci_error *why)
{
    if (p->o.ops->dropped)
        p->o.ops->dropped(p->o.ctx, stream, seq, s, why->msg);
}

/* Under the lock: waits on c until deadline_ms (monotonic). */
static void wait_until(struct ci_publisher *p, pthread_cond_t *c, int64_t deadline_ms)
{
    struct timespec ts = {.tv_sec = deadline_ms / 1000,
                          .tv_nsec = (long)(deadline_ms % 1000) * 1000000L};
    pthread_cond_timedwait(c, &p->lock, &ts);
}

static void *publisher_main(void *arg)
{
    struct ci_publisher *p = arg;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->head && !p->stop)
            pthread_cond_wait(&p->more, &p->lock);
        struct chunk *c = p->head;
        if (!c)
            break; /* stopped, and free() dropped what was queued */
        p->head = c->next;
        if (!p->head)
            p->tail = NULL;
        p->n--;
        p->bytes -= c->len;
        p->busy = true;
        pthread_mutex_unlock(&p->lock);

        struct ci_error e = {{0}};
        ci_status s = p->o.ops->publish(p->o.ctx, c->stream, c->seq, c->data, c->len, &e);
        if (s != CI_OK) {
            if (!e.msg[0])
                ci_error_set(&e, s, "the chunk could not be published");
            tell_dropped(p, c->stream, c->seq, s, &e);
        }

        pthread_mutex_lock(&p->lock);
        if (s == CI_OK) {
            p->stats.published++;
            p->stats.bytes += c->len;
        } else {
            p->stats.failed++;
        }
        p->busy = false;
        pthread_cond_broadcast(&p->less);
        free(c);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

ci_status ci_publisher_new(const struct ci_publisher_opts *o, struct ci_publisher **ret,
                           struct ci_error *err)
{
    if (!o->ops || !o->ops->publish)
        return ci_error_set(err, CI_ERR_INVALID, "the publisher needs a publish function");
    struct ci_publisher *p = calloc(1, sizeof(*p));
    if (!p)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    p->o = *o;
    if (!p->o.max_chunks)
        p->o.max_chunks = CI_PUBLISHER_MAX_CHUNKS;
    if (!p->o.max_bytes)
        p->o.max_bytes = CI_PUBLISHER_MAX_BYTES;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->more, &ca);
    pthread_cond_init(&p->less, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&p->thread, NULL, publisher_main, p);
    if (rc != 0) {
        ci_publisher_free(p);
        return ci_error_errno(err, CI_ERR_SYS, rc,
                              "cannot start the live output's publisher thread");
    }
    p->started = true;
    *ret = p;
    return CI_OK;
}

void ci_publisher_size(struct ci_publisher_opts *o, uint64_t bytes, size_t min_chunk)
{
    if (bytes < CI_PUBLISHER_MAX_BYTES)
        bytes = CI_PUBLISHER_MAX_BYTES;
    if (bytes > CI_PUBLISHER_HARD_MAX_BYTES)
        bytes = CI_PUBLISHER_HARD_MAX_BYTES;
    uint64_t chunks = bytes / (min_chunk ? min_chunk : 1) + CI_PUBLISHER_MAX_CHUNKS;
    if (chunks > CI_PUBLISHER_HARD_MAX_CHUNKS)
        chunks = CI_PUBLISHER_HARD_MAX_CHUNKS;
    o->max_bytes = (size_t)bytes;
    o->max_chunks = (size_t)chunks;
}

/* Takes everything queued off the queue, under the lock; the caller tells
 * and frees it outside. */
static struct chunk *take_all(struct ci_publisher *p)
{
    struct chunk *all = p->head;
    for (struct chunk *c = all; c; c = c->next)
        p->stats.left++;
    p->head = p->tail = NULL;
    p->n = p->bytes = 0;
    pthread_cond_broadcast(&p->less);
    return all;
}

static void drop_all(struct ci_publisher *p, struct chunk *all, ci_status s, const char *why)
{
    struct ci_error e = {{0}};
    ci_error_set(&e, s, "%s", why);
    while (all) {
        struct chunk *next = all->next;
        tell_dropped(p, all->stream, all->seq, s, &e);
        free(all);
        all = next;
    }
}

void ci_publisher_free(struct ci_publisher *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->lock);
    struct chunk *left = take_all(p);
    p->stop = true;
    pthread_cond_broadcast(&p->more);
    pthread_mutex_unlock(&p->lock);
    drop_all(p, left, CI_ERR_CANCELLED, "the task ended before the chunk could be published");
    if (p->started)
        pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->more);
    pthread_cond_destroy(&p->less);
    pthread_mutex_destroy(&p->lock);
    free(p);
}

/* Under the lock: whether a chunk of len bytes fits now. */
static bool has_room(const struct ci_publisher *p, size_t len)
{
    if (p->n == 0)
        return true;
    return p->n < p->o.max_chunks && p->bytes + len <= p->o.max_bytes;
}

ci_status ci_publisher_put(struct ci_publisher *p, const char *stream, uint64_t seq,
                           const uint8_t *data, size_t len, struct ci_error *err)
{
    size_t name_len = strlen(stream) + 1;
    struct chunk *c = malloc(sizeof(*c) + len + name_len);
    if (!c) {
        struct ci_error e = {{0}};
        ci_error_set(&e, CI_ERR_NOMEM, "out of memory for the chunk");
        pthread_mutex_lock(&p->lock);
        p->stats.refused++;
        pthread_mutex_unlock(&p->lock);
        tell_dropped(p, stream, seq, CI_ERR_NOMEM, &e);
        return ci_error_set(err, CI_ERR_NOMEM, "%s", e.msg);
    }
    c->next = NULL;
    c->seq = seq;
    c->len = len;
    memcpy(c->data, data, len);
    memcpy(c->data + len, stream, name_len);
    c->stream = (const char *)(c->data + len);

    pthread_mutex_lock(&p->lock);
    while (!p->stop && !has_room(p, len) && p->deadline_ms && ci_mono_ms() < p->deadline_ms)
        wait_until(p, &p->less, p->deadline_ms);
    if (p->stop || !has_room(p, len)) {
        struct ci_error e = {{0}};
        ci_status s = p->deadline_ms ? CI_ERR_TIMEOUT : CI_ERR_LIMIT;
        ci_error_set(&e, s,
                     "%zu chunks (%zu bytes) were still waiting for NATS%s: the chunk is dropped",
                     p->n, p->bytes, p->deadline_ms ? " when the run's end could wait no more" : "");
        p->stats.refused++;
        pthread_mutex_unlock(&p->lock);
        tell_dropped(p, stream, seq, s, &e);
        free(c);
        return ci_error_set(err, s, "%s", e.msg);
    }
    if (p->tail)
        p->tail->next = c;
    else
        p->head = c;
    p->tail = c;
    p->n++;
    p->bytes += len;
    pthread_cond_signal(&p->more);
    pthread_mutex_unlock(&p->lock);
    return CI_OK;
}

void ci_publisher_end(struct ci_publisher *p, int64_t deadline_ms)
{
    pthread_mutex_lock(&p->lock);
    p->deadline_ms = deadline_ms > 0 ? deadline_ms : 1; /* 0 means "not ended" */
    pthread_cond_broadcast(&p->less);
    pthread_mutex_unlock(&p->lock);
}

/* Under the lock: waits until the thread is not publishing. */
static void wait_idle(struct ci_publisher *p)
{
    /* The chunk under way: a NATS call, which the connection's write
     * deadline bounds (nats.write_deadline_ms). */
    while (p->busy)
        pthread_cond_wait(&p->less, &p->lock);
}

#define STOPPED "the live output was stopped before the chunk could be published"

ci_status ci_publisher_drain(struct ci_publisher *p)
{
    pthread_mutex_lock(&p->lock);
    bool ended = p->deadline_ms != 0;
    while (ended && p->head && ci_mono_ms() < p->deadline_ms)
        wait_until(p, &p->less, p->deadline_ms);
    struct chunk *left = p->head ? take_all(p) : NULL;
    wait_idle(p);
    pthread_mutex_unlock(&p->lock);
    if (!left)
        return CI_OK;
    if (!ended) {
        drop_all(p, left, CI_ERR_CANCELLED, STOPPED);
        return CI_ERR_CANCELLED;
    }
    drop_all(p, left, CI_ERR_TIMEOUT,
             "the chunk was still waiting for NATS when the run's end could wait no more");
    return CI_ERR_TIMEOUT;
}

void ci_publisher_stop(struct ci_publisher *p, const char *why)
{
    pthread_mutex_lock(&p->lock);
    struct chunk *left = p->head ? take_all(p) : NULL;
    wait_idle(p);
    pthread_mutex_unlock(&p->lock);
    drop_all(p, left, CI_ERR_CANCELLED, why ? why : STOPPED);
}

void ci_publisher_stats(const struct ci_publisher *p, struct ci_publisher_stats *ret)
{
    if (!p) {
        memset(ret, 0, sizeof(*ret));
        return;
    }
    struct ci_publisher *q = (struct ci_publisher *)p; /* the lock is not the data */
    pthread_mutex_lock(&q->lock);
    *ret = q->stats;
    pthread_mutex_unlock(&q->lock);
}
