/* waitroom.c - session tasks held until their turn (waitroom.h). A fixed
 * array of max_waiting places under one lock; the room's thread makes the
 * lookups without it, and touches deliveries (in-progress, nak) only under
 * it, so that a slot that took one can free it at any time after. */
#include "worker/waitroom.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/util.h"
#include "worker/task.h"

#define LOOKUP_LOG_MS 10000 /* a failing lookup is logged at most this often */
/* A task whose turn has not come is looked up less and less often, up to
 * this: a direct get returns the whole predecessor message, inputs and all. */
#define LOOKUP_BACKOFF_MAX_MS 400
/* Places beyond max_waiting, for tasks on their last delivery only: a nak
 * of those would leave them in the stream for good, and their session
 * blocked behind them. */
#define LAST_ATTEMPT_EXTRA 64
/* The task's own message is in the stream while it waits: a lookup that
 * finds nothing of its session is a follower that lags (replicas > 1), or
 * its message gone for good. Only the second, lasting, lets it go. */
#define NOT_FOUND_GRACE_MS 2000

enum place_state { PLACE_FREE, PLACE_HELD, PLACE_READY };

struct place {
    enum place_state state;
    struct ci_delivery *d;
    struct ci_task_wait w;
    int64_t last_progress_ms; /* 0: in-progress ack on the next round */
    uint64_t order;           /* when it became ready: the oldest is taken first */
    size_t session;           /* the round's index of its session (the thread's) */
    int64_t due_ms;           /* its next lookup (monotonic); 0: at once */
    int interval_ms;          /* the pause before the one after */
    int64_t gone_since_ms;    /* lookups have found nothing since; 0: they found */
};

/* One lookup of a round. */
struct lookup {
    char session_id[65];
    ci_status status;
    uint64_t seq;
};

struct ci_waitroom {
    struct ci_waitroom_opts o;
    pthread_mutex_t lock;
    pthread_cond_t ready; /* a task became ready */
    pthread_cond_t wake;  /* the thread: something to look up, or stop */
    pthread_t thread;
    bool started, stop, draining;
    bool closed; /* ci_waitroom_close: holds nothing more, even a last attempt */
    size_t cap, count;
    size_t places_n; /* cap + LAST_ATTEMPT_EXTRA */
    uint64_t next_order;
    struct place *places;
    struct lookup *lookups; /* the thread's, cap of them */
    int64_t last_log_ms;
};

static void make_ready(struct ci_waitroom *r, struct place *p)
{
    p->state = PLACE_READY;
    p->order = r->next_order++;
    pthread_cond_broadcast(&r->ready);
}

static void release(struct ci_waitroom *r, struct place *p)
{
    p->state = PLACE_FREE;
    p->d = NULL;
    r->count--;
}

/* Under the lock: an in-progress ack for each delivery due one. */
static void keep_alive(struct ci_waitroom *r, int64_t now)
{
    for (size_t i = 0; i < r->places_n; i++) {
        struct place *p = &r->places[i];
        if (p->state == PLACE_FREE || now - p->last_progress_ms < r->o.progress_every_ms)
            continue;
        r->o.ops->in_progress(r->o.ctx, p->d);
        p->last_progress_ms = now;
    }
}

/* Under the lock: the sessions of the held tasks due a lookup, each once;
 * looked[i] says which places take part. */
static size_t collect_sessions(struct ci_waitroom *r, int64_t now, bool *looked)
{
    size_t n = 0;
    for (size_t i = 0; i < r->places_n; i++) {
        struct place *p = &r->places[i];
        looked[i] = p->state == PLACE_HELD && p->due_ms <= now;
        if (!looked[i])
            continue;
        size_t k = 0;
        while (k < n && strcmp(r->lookups[k].session_id, p->w.session_id) != 0)
            k++;
        if (k == n) {
            snprintf(r->lookups[n].session_id, sizeof(r->lookups[n].session_id), "%s",
                     p->w.session_id);
            n++;
        }
        p->session = k;
    }
    return n;
}

/* Without the lock: one lookup per session. The in-progress acks go on
 * between them, however slow the server is. */
static void look_up(struct ci_waitroom *r, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        if (k) {
            pthread_mutex_lock(&r->lock);
            keep_alive(r, ci_mono_ms());
            pthread_mutex_unlock(&r->lock);
        }
        struct lookup *l = &r->lookups[k];
        struct ci_error e = {{0}};
        l->seq = 0;
        l->status = r->o.ops->first_seq(r->o.ctx, l->session_id, &l->seq, &e);
        if (l->status && l->status != CI_ERR_NOT_FOUND) {
            int64_t now = ci_mono_ms();
            if (now - r->last_log_ms >= LOOKUP_LOG_MS) {
                ci_log(CI_LOG_WARN, "session.lookup_failed", "session_id", l->session_id,
                       "error", e.msg, NULL);
                r->last_log_ms = now;
            }
        }
    }
}

/* Under the lock: a held task whose session has nothing older left in the
 * stream is ready. A task held since the round began (not looked up) and
 * one cancelled meanwhile (ready already) are left alone. NOT_FOUND: its
 * own message is gone too (expired, or acked by another worker after a
 * redelivery); ci_task_process sorts that out. */
static void settle(struct ci_waitroom *r, size_t n, const bool *looked)
{
    int64_t now = ci_mono_ms();
    for (size_t i = 0; i < r->places_n; i++) {
        struct place *p = &r->places[i];
        if (p->state != PLACE_HELD || !looked[i] || p->session >= n)
            continue;
        const struct lookup *l = &r->lookups[p->session];
        if (l->status == CI_ERR_NOT_FOUND && !p->gone_since_ms)
            p->gone_since_ms = now;
        else if (l->status != CI_ERR_NOT_FOUND)
            p->gone_since_ms = 0;
        if ((l->status == CI_ERR_NOT_FOUND && now - p->gone_since_ms >= NOT_FOUND_GRACE_MS) ||
            (l->status == CI_OK && l->seq >= p->w.seq)) {
            make_ready(r, p);
            continue;
        }
        p->due_ms = now + p->interval_ms;
        p->interval_ms = p->interval_ms * 2 > LOOKUP_BACKOFF_MAX_MS ? LOOKUP_BACKOFF_MAX_MS
                                                                    : p->interval_ms * 2;
    }
}

static void *room_main(void *arg)
{
    struct ci_waitroom *r = arg;
    bool *looked = calloc(r->places_n, sizeof(*looked));
    pthread_mutex_lock(&r->lock);
    while (!r->stop) {
        int64_t now = ci_mono_ms();
        keep_alive(r, now);
        size_t n = looked ? collect_sessions(r, now, looked) : 0;
        if (n) {
            pthread_mutex_unlock(&r->lock);
            look_up(r, n);
            pthread_mutex_lock(&r->lock);
            /* A place freed and taken again meanwhile holds a newer task:
             * looked[] says held before, but its session index may be
             * another's. Only a place still held by the same delivery is
             * settled: a new hold resets its session to cap (see hold). */
            settle(r, n, looked);
        }
        if (r->stop)
            break;
        struct timespec until;
        ci_mono_deadline(&until, r->o.poll_ms);
        pthread_cond_timedwait(&r->wake, &r->lock, &until);
    }
    pthread_mutex_unlock(&r->lock);
    free(looked);
    return NULL;
}

ci_status ci_waitroom_new(const struct ci_waitroom_opts *o, struct ci_waitroom **ret,
                          struct ci_error *err)
{
    struct ci_waitroom *r = calloc(1, sizeof(*r));
    if (!r)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    r->o = *o;
    r->cap = o->max_waiting;
    r->places_n = r->cap + LAST_ATTEMPT_EXTRA;
    r->places = calloc(r->places_n, sizeof(*r->places));
    r->lookups = calloc(r->places_n, sizeof(*r->lookups));
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->ready, &ca);
    pthread_cond_init(&r->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (!r->places || !r->lookups) {
        ci_waitroom_free(r);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    }
    if (pthread_create(&r->thread, NULL, room_main, r) != 0) {
        ci_waitroom_free(r);
        return ci_error_set(err, CI_ERR_NOMEM, "cannot start the session waiting room's thread");
    }
    r->started = true;
    *ret = r;
    return CI_OK;
}

void ci_waitroom_close(struct ci_waitroom *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->lock);
    bool join = r->started;
    r->started = false;
    r->stop = true;
    r->draining = true;
    pthread_cond_broadcast(&r->wake);
    pthread_mutex_unlock(&r->lock);
    if (join)
        pthread_join(r->thread, NULL);
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; r->places && i < r->places_n; i++) {
        struct place *p = &r->places[i];
        if (p->state == PLACE_FREE)
            continue;
        r->o.ops->nak(r->o.ctx, p->d, 0);
        r->o.ops->free(r->o.ctx, p->d);
        release(r, p);
    }
    r->closed = true;
    pthread_mutex_unlock(&r->lock);
}

void ci_waitroom_free(struct ci_waitroom *r)
{
    if (!r)
        return;
    ci_waitroom_close(r);
    pthread_cond_destroy(&r->ready);
    pthread_cond_destroy(&r->wake);
    pthread_mutex_destroy(&r->lock);
    free(r->places);
    free(r->lookups);
    free(r);
}

enum ci_waitroom_held ci_waitroom_hold(struct ci_waitroom *r, struct ci_delivery *d,
                                       const struct ci_task_wait *w)
{
    const struct ci_waitroom_ops *ops = r->o.ops;
    pthread_mutex_lock(&r->lock);
    enum ci_waitroom_held res = CI_WAITROOM_HELD;
    bool last = ops->last_attempt(r->o.ctx, d);
    if (r->closed || (r->draining && !last))
        res = CI_WAITROOM_RETURNED;
    else if (r->count >= (last ? r->places_n : r->cap))
        res = CI_WAITROOM_FULL;
    if (res != CI_WAITROOM_HELD) {
        ops->nak(r->o.ctx, d, res == CI_WAITROOM_FULL ? CI_WAITROOM_FULL_DELAY_MS : 0);
        ops->free(r->o.ctx, d);
        pthread_mutex_unlock(&r->lock);
        return res;
    }
    struct place *p = r->places;
    while (p->state != PLACE_FREE)
        p++;
    p->state = PLACE_HELD;
    p->d = d;
    p->w = *w;
    p->last_progress_ms = 0;
    p->session = r->places_n; /* not looked up yet */
    p->due_ms = 0;
    p->interval_ms = r->o.poll_ms > 0 ? r->o.poll_ms : 1;
    p->gone_since_ms = 0;
    r->count++;
    if (w->cancelled) /* cancelled on its way here: it ends at once */
        make_ready(r, p);
    pthread_cond_broadcast(&r->wake); /* look it up now: its predecessor may be gone */
    pthread_mutex_unlock(&r->lock);
    return res;
}

bool ci_waitroom_take(struct ci_waitroom *r, int timeout_ms, struct ci_delivery **ret_d,
                      struct ci_task_wait *ret_wait)
{
    struct timespec until;
    ci_mono_deadline(&until, timeout_ms > 0 ? timeout_ms : 0);
    pthread_mutex_lock(&r->lock);
    struct place *best = NULL;
    for (;;) {
        for (size_t i = 0; i < r->places_n; i++) {
            struct place *p = &r->places[i];
            if (p->state == PLACE_READY && (!best || p->order < best->order))
                best = p;
        }
        if (best || timeout_ms <= 0 ||
            pthread_cond_timedwait(&r->ready, &r->lock, &until) == ETIMEDOUT)
            break;
    }
    if (!best) { /* a last look after the timeout is not worth it */
        pthread_mutex_unlock(&r->lock);
        return false;
    }
    *ret_d = best->d;
    *ret_wait = best->w;
    release(r, best);
    pthread_mutex_unlock(&r->lock);
    return true;
}

bool ci_waitroom_cancel(struct ci_waitroom *r, const char *task_id)
{
    bool found = false;
    pthread_mutex_lock(&r->lock);
    for (size_t i = 0; i < r->places_n; i++) {
        struct place *p = &r->places[i];
        if (p->state == PLACE_FREE || strcmp(p->w.task_id, task_id) != 0)
            continue;
        found = true;
        p->w.cancelled = true; /* it ends CANCELLED, whatever the cancel stream says yet */
        if (p->state == PLACE_HELD)
            make_ready(r, p);
    }
    pthread_mutex_unlock(&r->lock);
    return found;
}

size_t ci_waitroom_drain(struct ci_waitroom *r)
{
    size_t n = 0;
    pthread_mutex_lock(&r->lock);
    r->draining = true;
    for (size_t i = 0; i < r->places_n; i++) {
        struct place *p = &r->places[i];
        if (p->state == PLACE_FREE || r->o.ops->last_attempt(r->o.ctx, p->d))
            continue;
        r->o.ops->nak(r->o.ctx, p->d, 0);
        r->o.ops->free(r->o.ctx, p->d);
        release(r, p);
        n++;
    }
    pthread_mutex_unlock(&r->lock);
    return n;
}

size_t ci_waitroom_count(struct ci_waitroom *r)
{
    pthread_mutex_lock(&r->lock);
    size_t n = r->count;
    pthread_mutex_unlock(&r->lock);
    return n;
}
