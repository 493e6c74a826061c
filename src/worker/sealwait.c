/* sealwait.c - seals counted on a thread of their own (sealwait.h). */
#include "worker/sealwait.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"

struct waiting {
    char batch_id[65]; /* "" when free */
    int64_t came_ms;   /* when the seal came (monotonic) */
    int64_t next_ms;   /* the next try */
    int64_t pause_ms;  /* after the next try that is not done */
    bool trying;       /* its try is under way (the thread's, off the lock) */
};

struct ci_sealwait {
    struct ci_sealwait_opts o;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    pthread_t thread;
    bool started, stop;
    struct waiting w[];
};

static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The waiting batch due first, or NULL. Under the lock. */
static struct waiting *first_due(struct ci_sealwait *s)
{
    struct waiting *x = NULL;
    for (size_t i = 0; i < s->o.cap; i++)
        if (s->w[i].batch_id[0] && !s->w[i].trying && (!x || s->w[i].next_ms < x->next_ms))
            x = &s->w[i];
    return x;
}

static void *sealwait_main(void *p)
{
    struct ci_sealwait *s = p;
    pthread_mutex_lock(&s->lock);
    while (!s->stop) {
        struct waiting *x = first_due(s);
        int64_t now = mono_ms();
        if (!x || x->next_ms > now) {
            if (!x) {
                pthread_cond_wait(&s->cond, &s->lock);
            } else {
                struct timespec until = {x->next_ms / 1000, (x->next_ms % 1000) * 1000000L};
                pthread_cond_timedwait(&s->cond, &s->lock, &until);
            }
            continue;
        }
        /* Off the lock: add() finds the batch (it is not added twice), and
         * nothing else takes its room meanwhile. */
        x->trying = true;
        char batch_id[sizeof(x->batch_id)];
        snprintf(batch_id, sizeof(batch_id), "%s", x->batch_id);
        pthread_mutex_unlock(&s->lock);
        struct ci_error e = {{0}};
        ci_status r = s->o.fn(s->o.closure, batch_id, &e);
        pthread_mutex_lock(&s->lock);
        x->trying = false;
        now = mono_ms();
        if (r != CI_OK && r != CI_ERR_INVALID && now - x->came_ms >= s->o.give_up_ms)
            ci_log_num(CI_LOG_WARN, "batch.complete_failed", "waited_ms", now - x->came_ms,
                       "batch_id", batch_id, "error", e.msg, NULL);
        if (r == CI_OK || r == CI_ERR_INVALID || now - x->came_ms >= s->o.give_up_ms) {
            x->batch_id[0] = '\0';
            continue;
        }
        x->next_ms = now + x->pause_ms;
        x->pause_ms = x->pause_ms * 2 < s->o.max_pause_ms ? x->pause_ms * 2 : s->o.max_pause_ms;
    }
    for (size_t i = 0; i < s->o.cap; i++)
        if (s->w[i].batch_id[0])
            ci_log(CI_LOG_WARN, "batch.complete_failed", "batch_id", s->w[i].batch_id, "error",
                   "the worker stopped before the seal could be read", NULL);
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

ci_status ci_sealwait_start(const struct ci_sealwait_opts *o, struct ci_sealwait **ret,
                            struct ci_error *err)
{
    size_t cap = o->cap ? o->cap : 1;
    struct ci_sealwait *s = calloc(1, sizeof(*s) + cap * sizeof(s->w[0]));
    if (!s)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    s->o = *o;
    s->o.cap = cap;
    pthread_mutex_init(&s->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&s->thread, NULL, sealwait_main, s) != 0) {
        ci_sealwait_free(s);
        return ci_error_set(err, CI_ERR_NOMEM, "cannot start the seal thread");
    }
    s->started = true;
    *ret = s;
    return CI_OK;
}

void ci_sealwait_add(struct ci_sealwait *s, const char *batch_id)
{
    if (!s || !batch_id || !batch_id[0] || strlen(batch_id) >= sizeof(s->w[0].batch_id))
        return;
    pthread_mutex_lock(&s->lock);
    struct waiting *free_one = NULL;
    bool there = s->stop; /* stopped: as if it were there */
    for (size_t i = 0; i < s->o.cap && !there; i++) {
        if (!s->w[i].batch_id[0]) {
            if (!free_one)
                free_one = &s->w[i];
        } else if (strcmp(s->w[i].batch_id, batch_id) == 0) {
            there = true;
        }
    }
    if (!there && free_one) {
        int64_t now = mono_ms();
        snprintf(free_one->batch_id, sizeof(free_one->batch_id), "%s", batch_id);
        free_one->came_ms = now;
        free_one->next_ms = now;
        free_one->pause_ms = s->o.first_ms;
        pthread_cond_signal(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    if (!there && !free_one)
        ci_log(CI_LOG_WARN, "batch.complete_failed", "batch_id", batch_id, "error",
               "too many seals wait to be read: this one is not counted here", NULL);
}

size_t ci_sealwait_waiting(struct ci_sealwait *s)
{
    size_t n = 0;
    pthread_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->o.cap; i++)
        n += s->w[i].batch_id[0] != '\0';
    pthread_mutex_unlock(&s->lock);
    return n;
}

void ci_sealwait_stop(struct ci_sealwait *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    bool join = s->started && !s->stop;
    s->stop = true;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->lock);
    if (join)
        pthread_join(s->thread, NULL);
}

void ci_sealwait_free(struct ci_sealwait *s)
{
    if (!s)
        return;
    ci_sealwait_stop(s);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
