/* liveout.c - the live output of one attempt (liveout.h). */
#include "worker/liveout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text.h"
#include "core/util.h"

/* One of stdout and stderr. */
struct lo_stream {
    const char *name;    /* "stdout", "stderr" */
    uint8_t hold[4];     /* the start of a character whose last bytes have not come */
    size_t hold_len;
    struct ci_buf pending; /* text not published yet (valid UTF-8) */
    int64_t pending_since; /* when its first byte came; 0: nothing pending */
    size_t text_len;     /* text accepted so far: published + pending */
    bool full;           /* the cap is reached: the rest is not the result's */
    bool stalled;        /* out of memory: finish() publishes from the result */
    uint64_t sent;       /* bytes of text gone out (lost chunks included) */
    uint64_t seq;        /* the last chunk number used */
};

struct ci_liveout {
    struct ci_liveout_opts o;
    struct lo_stream s[2];
    struct ci_buf scratch; /* a held character's start followed by new bytes */
    struct ci_liveout_stats stats;
};

ci_status ci_liveout_new(const struct ci_liveout_opts *o, struct ci_liveout **ret,
                         struct ci_error *err)
{
    if (!o->ops || !o->ops->publish)
        return ci_error_set(err, CI_ERR_INVALID, "live output needs a publish function");
    struct ci_liveout *lo = calloc(1, sizeof(*lo));
    if (!lo)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    lo->o = *o;
    if (!lo->o.flush_bytes)
        lo->o.flush_bytes = CI_LIVEOUT_FLUSH_BYTES;
    if (lo->o.max_chunk < 4) /* 0, or too small for a character */
        lo->o.max_chunk = CI_LIVEOUT_MAX_CHUNK;
    if (!lo->o.delay_ms)
        lo->o.delay_ms = CI_LIVEOUT_DELAY_MS;
    lo->s[0].name = "stdout";
    lo->s[1].name = "stderr";
    *ret = lo;
    return CI_OK;
}

void ci_liveout_free(struct ci_liveout *lo)
{
    if (!lo)
        return;
    for (int i = 0; i < 2; i++)
        ci_buf_release(&lo->s[i].pending);
    ci_buf_release(&lo->scratch);
    free(lo);
}

/* Publishes data as the stream's next chunk; a lost one keeps its number. */
static void send_chunk(struct ci_liveout *lo, struct lo_stream *st, const uint8_t *data,
                       size_t len)
{
    struct ci_error e = {{0}};
    st->seq++;
    st->sent += len;
    if (lo->o.ops->publish(lo->o.ctx, st->name, st->seq, data, len, &e) == CI_OK) {
        lo->stats.chunks++;
        lo->stats.bytes += len;
        return;
    }
    if (!lo->stats.dropped++)
        snprintf(lo->stats.error, sizeof(lo->stats.error), "%.255s", e.msg[0] ? e.msg : "unknown");
}

/* Publishes text (valid UTF-8) in chunks of at most max_chunk, each ending
 * on a character boundary. */
static void send_text(struct ci_liveout *lo, struct lo_stream *st, const uint8_t *p, size_t n)
{
    while (n > 0) {
        size_t k = n;
        if (k > lo->o.max_chunk) {
            k = lo->o.max_chunk;
            while (k > 0 && (p[k] & 0xC0) == 0x80)
                k--;
        }
        send_chunk(lo, st, p, k);
        p += k;
        n -= k;
    }
}

static void send_pending(struct ci_liveout *lo, struct lo_stream *st)
{
    send_text(lo, st, st->pending.data, st->pending.len);
    st->pending.len = 0;
    st->pending_since = 0;
}

/* Bytes the character that starts with c takes; 1 for a byte that cannot
 * start one (it becomes U+FFFD on its own). */
static size_t char_len(uint8_t c)
{
    return c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 1;
}

/* Appends what fits of text (valid UTF-8) to pending: at the cap it stops
 * after the last whole character that fits, as the result's cut does, and
 * the stream is full. False when the stream takes nothing more. */
static bool take(struct lo_stream *st, const uint8_t *text, size_t n, size_t cap)
{
    size_t fit = n;
    if (st->text_len + n > cap) {
        fit = cap - st->text_len;
        while (fit > 0 && (text[fit] & 0xC0) == 0x80)
            fit--;
        st->full = true;
    }
    if (fit && ci_buf_append(&st->pending, text, fit) != CI_OK) {
        st->stalled = true;
        return false;
    }
    st->text_len += fit;
    return !st->full;
}

/* Makes p[0..n) text as ci_utf8_sanitize would and appends it to pending.
 * A position is decided only once every byte its character needs is there,
 * so that the pieces of a stream add up to the text of the whole. Returns
 * how many bytes were decided; the rest (at most 3) wait for more. */
static size_t accept(struct lo_stream *st, const uint8_t *p, size_t n, size_t cap)
{
    static const uint8_t replacement[] = {0xEF, 0xBF, 0xBD}; /* U+FFFD */
    size_t i = 0, run = 0; /* p[run..i) is valid text not appended yet */
    while (i < n) {
        /* The common case, plain ASCII without NUL, eight bytes at a time. */
        while (n - i >= 8) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if ((w & 0x8080808080808080ULL) ||
                ((w - 0x0101010101010101ULL) & ~w & 0x8080808080808080ULL))
                break; /* a byte >= 0x80, or a NUL */
            i += 8;
        }
        if (i == n)
            break;
        uint8_t c = p[i];
        if (c != 0 && c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0x80 && n - i < char_len(c))
            break; /* its character may complete with the next bytes */
        uint32_t cp;
        size_t k = c == 0 ? 0 : ci_text_utf8_decode(p + i, n - i, &cp);
        if (k) {
            i += k;
            continue;
        }
        if (!take(st, p + run, i - run, cap) || !take(st, replacement, 3, cap))
            return i;
        run = ++i;
    }
    take(st, p + run, i - run, cap);
    return i;
}

void ci_liveout_write(struct ci_liveout *lo, enum ci_output_stream stream, const uint8_t *data,
                      size_t len, int64_t now_ms)
{
    if (!lo || len == 0 || (stream != CI_OUTPUT_STDOUT && stream != CI_OUTPUT_STDERR))
        return;
    struct lo_stream *st = &lo->s[stream == CI_OUTPUT_STDOUT ? 0 : 1];
    if (st->full || st->stalled)
        return;
    size_t before = st->pending.len;
    const uint8_t *p = data;
    size_t n = len;
    if (st->hold_len) {
        lo->scratch.len = 0;
        if (ci_buf_append(&lo->scratch, st->hold, st->hold_len) != CI_OK ||
            ci_buf_append(&lo->scratch, data, len) != CI_OK) {
            st->stalled = true;
            return;
        }
        p = lo->scratch.data;
        n = lo->scratch.len;
    }
    size_t used = accept(st, p, n, lo->o.cap);
    st->hold_len = 0;
    if (!st->full && !st->stalled && n - used <= sizeof(st->hold)) {
        memcpy(st->hold, p + used, n - used);
        st->hold_len = n - used;
    }
    if (st->stalled) {
        /* finish() publishes the rest from the result, from what was sent. */
        ci_buf_release(&st->pending);
        st->pending_since = 0;
        return;
    }
    if (st->pending.len > before && !st->pending_since)
        st->pending_since = now_ms ? now_ms : 1;
    if (st->pending.len >= lo->o.flush_bytes)
        send_pending(lo, st);
}

int64_t ci_liveout_tick(struct ci_liveout *lo, int64_t now_ms)
{
    if (!lo)
        return -1;
    int64_t next = -1;
    for (int i = 0; i < 2; i++) {
        struct lo_stream *st = &lo->s[i];
        if (!st->pending.len)
            continue;
        int64_t due = st->pending_since + lo->o.delay_ms;
        if (now_ms >= due) {
            send_pending(lo, st);
            continue;
        }
        if (next < 0 || due - now_ms < next)
            next = due - now_ms;
    }
    return next;
}

void ci_liveout_flush(struct ci_liveout *lo)
{
    if (!lo)
        return;
    if (lo->o.ops->run_ended)
        lo->o.ops->run_ended(lo->o.ctx);
    for (int i = 0; i < 2; i++)
        if (lo->s[i].pending.len)
            send_pending(lo, &lo->s[i]);
}

void ci_liveout_finish(struct ci_liveout *lo, const char *out, const char *err)
{
    if (!lo)
        return;
    const char *text[2] = {out ? out : "", err ? err : ""};
    for (int i = 0; i < 2; i++) {
        struct lo_stream *st = &lo->s[i];
        /* What is pending is the start of what the result has past sent. */
        st->pending.len = 0;
        st->pending_since = 0;
        st->hold_len = 0;
        st->full = true; /* nothing more comes from the run */
        size_t n = strlen(text[i]);
        if (n > st->sent)
            send_text(lo, st, (const uint8_t *)text[i] + st->sent, n - (size_t)st->sent);
    }
}

bool ci_liveout_owes(const struct ci_liveout *lo, const char *out, const char *err)
{
    if (!lo)
        return false;
    const char *text[2] = {out ? out : "", err ? err : ""};
    for (int i = 0; i < 2; i++)
        if (strlen(text[i]) > lo->s[i].sent)
            return true;
    return false;
}

void ci_liveout_stats(const struct ci_liveout *lo, struct ci_liveout_stats *ret)
{
    if (lo)
        *ret = lo->stats;
    else
        memset(ret, 0, sizeof(*ret));
}

static void sink_write(void *ctx, enum ci_output_stream stream, const uint8_t *data, size_t len)
{
    ci_liveout_write(ctx, stream, data, len, ci_mono_ms());
}

static int64_t sink_tick(void *ctx)
{
    return ci_liveout_tick(ctx, ci_mono_ms());
}

static void sink_end(void *ctx)
{
    ci_liveout_flush(ctx);
}

struct ci_output_sink ci_liveout_sink(struct ci_liveout *lo)
{
    return (struct ci_output_sink){.write = sink_write, .tick = sink_tick, .end = sink_end,
                                   .ctx = lo};
}
