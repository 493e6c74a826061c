/* chunk_order.c - chunks shown in Ci-Seq order (chunk_order.h). */
#include "cli/chunk_order.h"

#include <stdlib.h>
#include <string.h>

struct ci_chunk_held {
    uint64_t seq;
    uint8_t *data;
    size_t len;
};

static void drop_held(struct ci_chunk_order *o)
{
    for (size_t i = 0; i < o->n_held; i++)
        free(o->held[i].data);
    o->n_held = 0;
    o->held_bytes = 0;
}

void ci_chunk_order_init(struct ci_chunk_order *o, size_t max_held, size_t max_bytes)
{
    *o = (struct ci_chunk_order){.next_seq = 1, .max_held = max_held, .max_bytes = max_bytes};
}

void ci_chunk_order_release(struct ci_chunk_order *o)
{
    drop_held(o);
    free(o->held);
    o->held = NULL;
    o->cap_held = 0;
}

void ci_chunk_order_reset(struct ci_chunk_order *o)
{
    drop_held(o);
    o->next_seq = 1;
    o->shown_bytes = 0;
    o->stopped = CI_OK;
}

static ci_status stop(struct ci_chunk_order *o, ci_status s)
{
    drop_held(o);
    o->stopped = s;
    return s;
}

/* Where seq is, or would go, among the held chunks. */
static size_t held_index(const struct ci_chunk_order *o, uint64_t seq)
{
    size_t lo = 0, hi = o->n_held;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (o->held[mid].seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static ci_status hold(struct ci_chunk_order *o, uint64_t seq, const uint8_t *data, size_t len)
{
    size_t at = held_index(o, seq);
    if (at < o->n_held && o->held[at].seq == seq)
        return CI_OK; /* held already */
    if (o->n_held >= o->max_held || len > o->max_bytes - o->shown_bytes - o->held_bytes)
        return CI_ERR_LIMIT;
    if (o->n_held == o->cap_held) {
        size_t cap = o->cap_held ? 2 * o->cap_held : 16;
        if (cap > o->max_held)
            cap = o->max_held;
        struct ci_chunk_held *h = realloc(o->held, cap * sizeof(*h));
        if (!h)
            return CI_ERR_NOMEM;
        o->held = h;
        o->cap_held = cap;
    }
    uint8_t *copy = malloc(len ? len : 1);
    if (!copy)
        return CI_ERR_NOMEM;
    memcpy(copy, data, len);
    memmove(&o->held[at + 1], &o->held[at], (o->n_held - at) * sizeof(*o->held));
    o->held[at] = (struct ci_chunk_held){.seq = seq, .data = copy, .len = len};
    o->n_held++;
    o->held_bytes += len;
    return CI_OK;
}

ci_status ci_chunk_order_put(struct ci_chunk_order *o, uint64_t seq, const uint8_t *data,
                             size_t len, ci_chunk_show_fn show, void *closure)
{
    if (o->stopped)
        return o->stopped;
    if (seq < o->next_seq)
        return CI_OK; /* shown already, or no Ci-Seq */
    if (seq > o->next_seq) {
        ci_status s = hold(o, seq, data, len);
        return s ? stop(o, s) : CI_OK;
    }
    if (len > o->max_bytes - o->shown_bytes - o->held_bytes)
        return stop(o, CI_ERR_LIMIT);
    ci_status s = show(closure, data, len);
    if (s)
        return stop(o, s);
    o->shown_bytes += len;
    o->next_seq++;
    /* The held chunks now in turn, in one pass. */
    size_t n = 0;
    for (; n < o->n_held && o->held[n].seq == o->next_seq; n++) {
        struct ci_chunk_held *h = &o->held[n];
        s = show(closure, h->data, h->len);
        if (s)
            return stop(o, s);
        o->shown_bytes += h->len;
        o->held_bytes -= h->len;
        o->next_seq++;
        free(h->data);
        h->data = NULL;
    }
    if (n) { /* held is NULL until a chunk was held */
        memmove(&o->held[0], &o->held[n], (o->n_held - n) * sizeof(*o->held));
        o->n_held -= n;
    }
    return CI_OK;
}
