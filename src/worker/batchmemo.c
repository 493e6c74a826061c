/* batchmemo.c - what a worker remembers of batches (batchmemo.h). */
#include "worker/batchmemo.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct memo_entry {
    char batch_id[65]; /* "" when free */
    uint64_t used;     /* the memo's clock at its last use: the least recent makes room */
    bool sealed;
    uint64_t total;
    int64_t sealed_until; /* wall clock: when the stream drops the seal */
    bool cancelled;       /* a cancel came through the subscription ... */
    int64_t cancelled_until; /* ... that the stream keeps until then (wall clock) */
    bool no_cancel;       /* a look found none ... */
    int64_t no_cancel_ms; /* ... that began then ... */
    uint64_t link;        /* ... on this link */
    size_t held;          /* tasks of the batch the slots hold */
    bool owed;            /* an end stored while held skipped its count: the last let-go counts */
};

struct ci_batch_memo {
    pthread_mutex_t lock;
    uint64_t clock; /* counts uses */
    uint64_t gen;   /* counts cancels that came */
    size_t cap;
    struct memo_entry e[];
};

ci_status ci_batch_memo_new(size_t cap, struct ci_batch_memo **ret, struct ci_error *err)
{
    if (cap == 0)
        cap = 1;
    struct ci_batch_memo *m = calloc(1, sizeof(*m) + cap * sizeof(m->e[0]));
    if (!m)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&m->lock, NULL);
    m->cap = cap;
    *ret = m;
    return CI_OK;
}

void ci_batch_memo_free(struct ci_batch_memo *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* The batch's entry, or NULL. Under the lock. */
static struct memo_entry *find(struct ci_batch_memo *m, const char *batch_id)
{
    for (size_t i = 0; i < m->cap; i++)
        if (m->e[i].batch_id[0] && strcmp(m->e[i].batch_id, batch_id) == 0) {
            m->e[i].used = ++m->clock;
            return &m->e[i];
        }
    return NULL;
}

/* The batch's entry, made (in a free one, or over the least recently
 * used, preferably one no slot holds a task of) when it has none. Under
 * the lock. */
static struct memo_entry *find_or_make(struct ci_batch_memo *m, const char *batch_id)
{
    struct memo_entry *x = find(m, batch_id);
    if (x)
        return x;
    /* A free one, else the least recently used of those no slot holds a
     * task of, else the least recently used. */
    x = &m->e[0]; /* cap >= 1 */
    for (size_t i = 0; i < m->cap && x->batch_id[0]; i++) {
        struct memo_entry *y = &m->e[i];
        if (!y->batch_id[0] || (x->held && !y->held) ||
            ((x->held != 0) == (y->held != 0) && y->used < x->used))
            x = y;
    }
    memset(x, 0, sizeof(*x));
    snprintf(x->batch_id, sizeof(x->batch_id), "%s", batch_id);
    x->used = ++m->clock;
    return x;
}

bool ci_batch_memo_sealed(struct ci_batch_memo *m, const char *batch_id, int64_t wall_ms,
                          uint64_t *ret_total)
{
    pthread_mutex_lock(&m->lock);
    struct memo_entry *x = find(m, batch_id);
    if (x && x->sealed && wall_ms >= x->sealed_until)
        x->sealed = false; /* the stream dropped it: the id may be another batch's now */
    bool sealed = x && x->sealed;
    if (sealed)
        *ret_total = x->total;
    pthread_mutex_unlock(&m->lock);
    return sealed;
}

void ci_batch_memo_seal(struct ci_batch_memo *m, const char *batch_id, uint64_t total,
                        int64_t until_ms)
{
    pthread_mutex_lock(&m->lock);
    struct memo_entry *x = find_or_make(m, batch_id);
    x->sealed = true;
    x->total = total;
    x->sealed_until = until_ms;
    pthread_mutex_unlock(&m->lock);
}

bool ci_batch_memo_uncancelled(struct ci_batch_memo *m, const char *batch_id, int64_t now_ms,
                               uint64_t link, uint64_t *ret_gen)
{
    pthread_mutex_lock(&m->lock);
    struct memo_entry *x = find(m, batch_id);
    bool skip = x && !x->cancelled && x->no_cancel && x->link == link &&
                now_ms >= x->no_cancel_ms && now_ms - x->no_cancel_ms < CI_BATCH_MEMO_NO_CANCEL_MS;
    if (ret_gen)
        *ret_gen = m->gen;
    pthread_mutex_unlock(&m->lock);
    return skip;
}

void ci_batch_memo_no_cancel(struct ci_batch_memo *m, const char *batch_id, uint64_t gen,
                             int64_t looked_ms, uint64_t link)
{
    pthread_mutex_lock(&m->lock);
    struct memo_entry *x = gen == m->gen ? find_or_make(m, batch_id) : NULL;
    if (x && !x->cancelled) {
        x->no_cancel = true;
        x->no_cancel_ms = looked_ms;
        x->link = link;
    }
    pthread_mutex_unlock(&m->lock);
}

void ci_batch_memo_cancel(struct ci_batch_memo *m, const char *batch_id, int64_t until_ms)
{
    pthread_mutex_lock(&m->lock);
    m->gen++;
    struct memo_entry *x = find_or_make(m, batch_id);
    x->no_cancel = false;
    x->cancelled = true;
    x->cancelled_until = until_ms;
    pthread_mutex_unlock(&m->lock);
}

bool ci_batch_memo_cancelled(struct ci_batch_memo *m, const char *batch_id, int64_t wall_ms)
{
    pthread_mutex_lock(&m->lock);
    struct memo_entry *x = find(m, batch_id);
    if (x && x->cancelled && wall_ms >= x->cancelled_until)
        x->cancelled = false; /* the stream dropped it: the id may be another batch's now */
    bool cancelled = x && x->cancelled;
    pthread_mutex_unlock(&m->lock);
    return cancelled;
}

void ci_batch_memo_hold(struct ci_batch_memo *m, const char *batch_id)
{
    pthread_mutex_lock(&m->lock);
    find_or_make(m, batch_id)->held++;
    pthread_mutex_unlock(&m->lock);
}

bool ci_batch_memo_let_go(struct ci_batch_memo *m, const char *batch_id, bool ended)
{
    pthread_mutex_lock(&m->lock);
    struct memo_entry *x = find(m, batch_id);
    bool count = true; /* no entry or none held: its hold went with an entry that made room */
    if (x && x->held) {
        x->held--;
        if (x->held) {
            x->owed = x->owed || ended; /* the last let-go counts for it */
            count = false;
        } else {
            count = ended || x->owed;
            x->owed = false;
        }
    }
    pthread_mutex_unlock(&m->lock);
    return count;
}

bool ci_batch_memo_ended(struct ci_batch_memo *m, const char *batch_id)
{
    pthread_mutex_lock(&m->lock);
    struct memo_entry *x = find(m, batch_id);
    bool count = !x || !x->held;
    if (!count)
        x->owed = true;
    pthread_mutex_unlock(&m->lock);
    return count;
}

size_t ci_batch_memo_held(struct ci_batch_memo *m, const char *batch_id)
{
    pthread_mutex_lock(&m->lock);
    struct memo_entry *x = find(m, batch_id);
    size_t held = x ? x->held : 0;
    pthread_mutex_unlock(&m->lock);
    return held;
}
