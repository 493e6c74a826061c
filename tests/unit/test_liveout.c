/* test_liveout.c - the live output of one attempt (contract §19) without
 * NATS: a fake publish records the chunks (and fails the ones the test
 * asks it to). Coalescing by size and by deadline, numbering per stream,
 * chunk sizes, the cap, UTF-8 (split characters, invalid bytes, NUL),
 * what finish() adds (the tail, a provider that did not stream), a result
 * cut shorter, lost chunks, NULL. The random case checks the promise
 * itself: whatever the code writes and however the reads split it, the
 * chunks add up to the text ci_result_set_outcome keeps. */
#include <stdlib.h>
#include <string.h>

#include "core/result.h"
#include "core/text.h"
#include "core/util.h"
#include "worker/liveout.h"
#include "testutil.h"

#define MAX_CHUNKS 4096

struct chunk {
    int stream; /* 0 stdout, 1 stderr */
    uint64_t seq;
    uint8_t *data;
    size_t len;
};

static struct fake {
    struct chunk c[MAX_CHUNKS];
    size_t n;          /* published */
    uint64_t fail_seq; /* the stdout chunk with this number fails (0: none) */
    int attempts;      /* publish calls */
} F;

static void fake_reset(void)
{
    for (size_t i = 0; i < F.n; i++)
        free(F.c[i].data);
    memset(&F, 0, sizeof(F));
}

static ci_status fake_publish(void *ctx, const char *stream, uint64_t seq, const uint8_t *data,
                              size_t len, struct ci_error *err)
{
    (void)ctx;
    F.attempts++;
    int s = strcmp(stream, "stdout") == 0 ? 0 : strcmp(stream, "stderr") == 0 ? 1 : -1;
    if (s < 0 || len == 0 || F.n == MAX_CHUNKS)
        return ci_error_set(err, CI_ERR_INVALID, "bad chunk");
    if (s == 0 && seq == F.fail_seq)
        return ci_error_set(err, CI_ERR_NATS, "fake: connection down");
    struct chunk *c = &F.c[F.n++];
    c->stream = s;
    c->seq = seq;
    c->data = malloc(len);
    memcpy(c->data, data, len);
    c->len = len;
    return CI_OK;
}

static const struct ci_liveout_ops fake_ops = {.publish = fake_publish};

static struct ci_liveout *make(size_t cap, size_t flush, size_t max_chunk, int64_t delay)
{
    fake_reset();
    struct ci_liveout_opts o = {.ops = &fake_ops, .cap = cap, .flush_bytes = flush,
                                .max_chunk = max_chunk, .delay_ms = delay};
    struct ci_liveout *lo = NULL;
    if (ci_liveout_new(&o, &lo, NULL) != CI_OK)
        return NULL;
    return lo;
}

/* The chunks of a stream, concatenated, in seq order, into b; false when
 * they are not numbered 1, 2, ... in the order they were published. */
static bool joined(int stream, struct ci_buf *b)
{
    uint64_t want = 1;
    bool ok = true;
    b->len = 0;
    for (size_t i = 0; i < F.n; i++) {
        if (F.c[i].stream != stream)
            continue;
        if (F.c[i].seq != want++)
            ok = false;
        ci_buf_append(b, F.c[i].data, F.c[i].len);
    }
    ci_buf_append(b, "", 1); /* a NUL for CHECK_STR */
    b->len--;
    return ok;
}

static void w(struct ci_liveout *lo, int stream, const char *s, int64_t now)
{
    ci_liveout_write(lo, stream == 0 ? CI_OUTPUT_STDOUT : CI_OUTPUT_STDERR, (const uint8_t *)s,
                     strlen(s), now);
}

static void test_deadline(void)
{
    struct ci_liveout *lo = make(1 << 20, 0, 0, 0); /* the defaults: 16 KiB, 64 KiB, 50 ms */
    REQUIRE(lo);
    CHECK(ci_liveout_tick(lo, 1000) == -1); /* nothing pending */
    w(lo, 0, "a\n", 1000);
    CHECK(F.n == 0);
    CHECK(ci_liveout_tick(lo, 1020) == 30);
    w(lo, 0, "b\n", 1030); /* joins the pending chunk: the deadline stays */
    CHECK(ci_liveout_tick(lo, 1049) == 1);
    CHECK(F.n == 0);
    CHECK(ci_liveout_tick(lo, 1050) == -1);
    REQUIRE(F.n == 1);
    CHECK(F.c[0].seq == 1 && F.c[0].len == 4 && memcmp(F.c[0].data, "a\nb\n", 4) == 0);
    /* stderr has its own deadline and its own numbers. */
    w(lo, 1, "e", 2000);
    w(lo, 0, "c", 2010);
    CHECK(ci_liveout_tick(lo, 2005) == 45);
    CHECK(ci_liveout_tick(lo, 2050) == 10);
    REQUIRE(F.n == 2);
    CHECK(F.c[1].stream == 1 && F.c[1].seq == 1);
    CHECK(ci_liveout_tick(lo, 2060) == -1);
    REQUIRE(F.n == 3);
    CHECK(F.c[2].stream == 0 && F.c[2].seq == 2);
    ci_liveout_free(lo);
}

static void test_size(void)
{
    struct ci_liveout *lo = make(1 << 20, 0, 0, 0);
    REQUIRE(lo);
    char *big = malloc(100 * 1024 + 1);
    memset(big, 'x', 100 * 1024);
    big[100 * 1024] = '\0';
    /* Small writes coalesce until 16 KiB are pending: then out at once. */
    char line[65];
    memset(line, 'y', 63);
    line[63] = '\n';
    line[64] = '\0';
    for (int i = 0; i < 255; i++)
        w(lo, 0, line, 10);
    CHECK(F.n == 0); /* 255 * 64 < 16 KiB */
    w(lo, 0, line, 10);
    REQUIRE(F.n == 1);
    CHECK(F.c[0].len == 16 * 1024 && F.c[0].seq == 1);
    /* A large write goes out in chunks of at most 64 KiB. */
    w(lo, 0, big, 20);
    REQUIRE(F.n == 3);
    CHECK(F.c[1].len == 64 * 1024 && F.c[2].len == 36 * 1024);
    CHECK(F.c[1].seq == 2 && F.c[2].seq == 3);
    CHECK(ci_liveout_tick(lo, 1000) == -1); /* nothing left */
    struct ci_liveout_stats st;
    ci_liveout_stats(lo, &st);
    CHECK(st.chunks == 3 && st.dropped == 0 && st.bytes == 116 * 1024 && st.error[0] == '\0');
    ci_liveout_free(lo);
    free(big);
}

/* Nothing past the cap, cut where the result cuts: after the last whole
 * character that fits. */
static void test_cap(void)
{
    struct ci_liveout *lo = make(100, 16, 32, 50);
    REQUIRE(lo);
    struct ci_buf b = CI_BUF_INIT;
    for (int i = 0; i < 30; i++)
        w(lo, 0, "0123456789", i);
    ci_liveout_flush(lo);
    CHECK(joined(0, &b));
    CHECK(b.len == 100);
    for (size_t i = 0; i < F.n; i++)
        CHECK(F.c[i].len <= 32);
    size_t before = F.n;
    ci_liveout_finish(lo, (const char *)b.data, "");
    CHECK(F.n == before); /* nothing added */
    ci_liveout_free(lo);

    /* 10 bytes of room, characters of 3 bytes: 9. */
    lo = make(10, 0, 0, 0);
    REQUIRE(lo);
    w(lo, 0, "\xE2\x82\xAC\xE2\x82\xAC\xE2\x82\xAC\xE2\x82\xAC", 0);
    ci_liveout_flush(lo);
    CHECK(joined(0, &b));
    CHECK_STR((const char *)b.data, "\xE2\x82\xAC\xE2\x82\xAC\xE2\x82\xAC");
    ci_liveout_free(lo);
    ci_buf_release(&b);
}

/* A character split between reads is never split between chunks; invalid
 * bytes and NUL become U+FFFD as in the result. */
static void test_utf8(void)
{
    struct ci_liveout *lo = make(1 << 20, 0, 0, 0);
    REQUIRE(lo);
    struct ci_buf b = CI_BUF_INIT;
    w(lo, 0, "a\xE2\x82", 0);
    CHECK(ci_liveout_tick(lo, 100) == -1);
    REQUIRE(F.n == 1);
    CHECK(F.c[0].len == 1 && F.c[0].data[0] == 'a'); /* the euro sign waits */
    w(lo, 0, "\xAC", 100);
    ci_liveout_tick(lo, 200);
    REQUIRE(F.n == 2);
    CHECK(F.c[1].len == 3 && memcmp(F.c[1].data, "\xE2\x82\xAC", 3) == 0);
    const uint8_t odd[] = {'x', 0xFF, 0x00, 'y', 0xC0, 0x80};
    ci_liveout_write(lo, CI_OUTPUT_STDOUT, odd, sizeof(odd), 300);
    ci_liveout_flush(lo);
    CHECK(joined(0, &b));
    CHECK_STR((const char *)b.data, "a\xE2\x82\xAC" "x\xEF\xBF\xBD\xEF\xBF\xBDy\xEF\xBF\xBD\xEF\xBF\xBD");
    /* A character still incomplete at the end is finish()'s: the result
     * says what it became (U+FFFD, or nothing when the cap cut it off). */
    w(lo, 1, "z\xF0\x9F", 400);
    ci_liveout_flush(lo);
    CHECK(joined(1, &b));
    CHECK_STR((const char *)b.data, "z");
    ci_liveout_finish(lo, NULL, "z\xEF\xBF\xBD\xEF\xBF\xBD");
    CHECK(joined(1, &b));
    CHECK_STR((const char *)b.data, "z\xEF\xBF\xBD\xEF\xBF\xBD");
    ci_liveout_free(lo);
    ci_buf_release(&b);
}

/* A provider that does not stream (cloudrun): all of it at the end, in
 * chunks of at most 64 KiB that end on characters; a second finish adds
 * nothing, and nothing comes after finish. */
static void test_finish_only(void)
{
    struct ci_liveout *lo = make(1 << 20, 0, 0, 0);
    REQUIRE(lo);
    size_t n = 150 * 1024;
    char *text = malloc(n + 1);
    for (size_t i = 0; i < n; i += 3)
        memcpy(text + i, "\xE2\x82\xAC", 3); /* 64 KiB is not a multiple of 3 */
    text[n] = '\0';
    ci_liveout_finish(lo, text, "oops\n");
    struct ci_buf b = CI_BUF_INIT;
    CHECK(joined(0, &b));
    CHECK(b.len == n && memcmp(b.data, text, n) == 0);
    size_t out_chunks = 0;
    for (size_t i = 0; i < F.n; i++) {
        if (F.c[i].stream != 0)
            continue;
        out_chunks++;
        CHECK(F.c[i].len <= 64 * 1024 && F.c[i].len % 3 == 0);
    }
    CHECK(out_chunks == 3);
    CHECK(joined(1, &b));
    CHECK_STR((const char *)b.data, "oops\n");
    size_t before = F.n;
    ci_liveout_finish(lo, text, "oops\n");
    w(lo, 0, "late", 0);
    ci_liveout_flush(lo);
    CHECK(F.n == before);
    ci_liveout_free(lo);
    free(text);
    ci_buf_release(&b);
}

/* The result was cut to fit a message: it is a prefix of what went out
 * live, and nothing more is published. */
static void test_result_shorter(void)
{
    struct ci_liveout *lo = make(1 << 20, 0, 0, 0);
    REQUIRE(lo);
    w(lo, 0, "0123456789", 0);
    ci_liveout_flush(lo);
    ci_liveout_finish(lo, "01234", "");
    CHECK(F.n == 1 && F.c[0].len == 10);
    ci_liveout_free(lo);
}

/* A chunk that cannot be published is lost, its number skipped; the
 * others go on, and finish() does not publish it again. */
static void test_publish_fails(void)
{
    struct ci_liveout *lo = make(1 << 20, 4, 4, 50);
    REQUIRE(lo);
    F.fail_seq = 2;
    w(lo, 0, "aaaa", 0);
    w(lo, 0, "bbbb", 0); /* lost */
    w(lo, 0, "cc", 0);
    w(lo, 1, "err!", 0);
    ci_liveout_flush(lo);
    ci_liveout_finish(lo, "aaaabbbbccdd", "err!");
    REQUIRE(F.n == 4);
    CHECK(F.c[0].seq == 1 && memcmp(F.c[0].data, "aaaa", 4) == 0);
    CHECK(F.c[1].stream == 1 && F.c[1].seq == 1);
    CHECK(F.c[2].seq == 3 && F.c[2].len == 2 && memcmp(F.c[2].data, "cc", 2) == 0);
    CHECK(F.c[3].seq == 4 && F.c[3].len == 2 && memcmp(F.c[3].data, "dd", 2) == 0);
    struct ci_liveout_stats st;
    ci_liveout_stats(lo, &st);
    CHECK(st.dropped == 1 && st.chunks == 4 && st.bytes == 12);
    CHECK_CONTAINS(st.error, "connection down");
    ci_liveout_free(lo);
}

/* owes() says whether finish() with the same text publishes anything
 * (the worker skips a record read when it does not): all of it went out,
 * a lost chunk counts as out, a held incomplete character, a result cut
 * shorter, a provider that does not stream. */
static bool owes_then_finish(struct ci_liveout *lo, const char *out, const char *err)
{
    size_t before = F.n;
    bool owes = ci_liveout_owes(lo, out, err);
    ci_liveout_finish(lo, out, err);
    bool published = F.n > before;
    CHECK(owes == published);
    return owes;
}

static void test_owes(void)
{
    struct ci_liveout *lo = make(1 << 20, 4, 4, 50);
    REQUIRE(lo);
    w(lo, 0, "done\n", 0);
    ci_liveout_flush(lo);
    CHECK(!owes_then_finish(lo, "done\n", ""));
    ci_liveout_free(lo);

    lo = make(1 << 20, 4, 4, 50);
    REQUIRE(lo);
    F.fail_seq = 1;
    w(lo, 0, "lost", 0);
    ci_liveout_flush(lo);
    CHECK(!owes_then_finish(lo, "lost", "")); /* lost: told, not published again */
    ci_liveout_free(lo);

    lo = make(1 << 20, 0, 0, 0);
    REQUIRE(lo);
    w(lo, 1, "z\xF0\x9F", 0); /* an incomplete character waits for finish() */
    ci_liveout_flush(lo);
    CHECK(ci_liveout_owes(lo, NULL, "z\xEF\xBF\xBD\xEF\xBF\xBD"));
    CHECK(owes_then_finish(lo, NULL, "z\xEF\xBF\xBD\xEF\xBF\xBD"));
    CHECK(!owes_then_finish(lo, NULL, "z\xEF\xBF\xBD\xEF\xBF\xBD")); /* once */
    ci_liveout_free(lo);

    lo = make(1 << 20, 0, 0, 0);
    REQUIRE(lo);
    w(lo, 0, "0123456789", 0);
    ci_liveout_flush(lo);
    CHECK(!owes_then_finish(lo, "01234", "")); /* the result was cut shorter */
    ci_liveout_free(lo);

    lo = make(1 << 20, 0, 0, 0); /* nothing streamed (cloudrun) */
    REQUIRE(lo);
    CHECK(!ci_liveout_owes(lo, "", NULL));
    CHECK(owes_then_finish(lo, "all of it\n", "and this"));
    ci_liveout_free(lo);
    CHECK(!ci_liveout_owes(NULL, "x", "y"));
}

static void test_null(void)
{
    ci_liveout_free(NULL);
    ci_liveout_write(NULL, CI_OUTPUT_STDOUT, (const uint8_t *)"x", 1, 0);
    CHECK(ci_liveout_tick(NULL, 0) == -1);
    ci_liveout_flush(NULL);
    ci_liveout_finish(NULL, "x", "y");
    struct ci_liveout_stats st;
    memset(&st, 0xff, sizeof(st));
    ci_liveout_stats(NULL, &st);
    CHECK(st.chunks == 0 && st.dropped == 0);
    struct ci_liveout_opts o = {.ops = NULL};
    struct ci_liveout *lo = (struct ci_liveout *)&o;
    struct ci_error e = {{0}};
    CHECK(ci_liveout_new(&o, &lo, &e) == CI_ERR_INVALID);
    CHECK(lo == (struct ci_liveout *)&o); /* untouched on failure */
    /* An empty write and an unknown stream are nothing. */
    lo = make(100, 0, 0, 0);
    REQUIRE(lo);
    ci_liveout_write(lo, CI_OUTPUT_STDOUT, (const uint8_t *)"", 0, 0);
    ci_liveout_write(lo, (enum ci_output_stream)7, (const uint8_t *)"x", 1, 0);
    ci_liveout_flush(lo);
    CHECK(F.attempts == 0);
    ci_liveout_free(lo);
}

/* The sink a job carries: the same through the clock. */
static void test_sink(void)
{
    struct ci_liveout *lo = make(1 << 20, 0, 0, 0);
    REQUIRE(lo);
    struct ci_output_sink s = ci_liveout_sink(lo);
    s.write(s.ctx, CI_OUTPUT_STDERR, (const uint8_t *)"hi", 2);
    int64_t due = s.tick(s.ctx);
    CHECK(due > 0 && due <= 50);
    CHECK(F.n == 0);
    s.end(s.ctx); /* the output is complete: out at once */
    REQUIRE(F.n == 1);
    CHECK(F.c[0].stream == 1 && F.c[0].len == 2);
    ci_liveout_free(lo);
}

/* What the sandbox does with a stream (io.c): keep the first cap bytes,
 * and when it cut, drop an incomplete last character. */
static size_t capture_len(const uint8_t *p, size_t total, size_t cap)
{
    size_t len = total < cap ? total : cap;
    if (total <= len)
        return len;
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        uint8_t c = p[len - back];
        if ((c & 0xc0) == 0x80)
            continue;
        size_t need = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                      : c >= 0xf0 && c <= 0xf4 ? 4 : 1;
        return need > back ? len - back : len;
    }
    return len;
}

static uint32_t rnd_state = 12345;
static uint32_t rnd(void)
{
    rnd_state = rnd_state * 1103515245u + 12345u;
    return rnd_state >> 8;
}

/* Bytes that are often UTF-8, sometimes not. */
static uint8_t rnd_byte(void)
{
    static const uint8_t pick[] = {'a', 'b', '\n', 0x00, 0x80, 0xBF, 0xC2, 0xDF, 0xE0, 0xE2,
                                   0xED, 0xA0, 0xF0, 0xF4, 0x90, 0x8F, 0xFF, 0xC0, 0x82, 0xAC};
    return pick[rnd() % sizeof(pick)];
}

static void test_random_equals_result(void)
{
    for (int round = 0; round < 3000; round++) {
        size_t cap = 8 + rnd() % 120;
        size_t total = rnd() % (3 * cap);
        uint8_t *raw = malloc(total + 1);
        /* Odd rounds mostly ASCII in long reads: the eight-byte path. */
        bool plain = round % 2;
        for (size_t i = 0; i < total; i++)
            raw[i] = plain && rnd() % 16 ? (uint8_t)('a' + rnd() % 26) : rnd_byte();
        struct ci_liveout *lo = make(cap, 1 + rnd() % 20, 4 + rnd() % 12, 50);
        REQUIRE(lo);
        /* The sandbox hands over the first cap bytes, in reads of any size. */
        size_t kept = total < cap ? total : cap;
        for (size_t i = 0; i < kept;) {
            size_t n = 1 + rnd() % (plain ? 60 : 9);
            if (n > kept - i)
                n = kept - i;
            ci_liveout_write(lo, CI_OUTPUT_STDOUT, raw + i, n, (int64_t)i);
            if (rnd() % 4 == 0)
                ci_liveout_tick(lo, (int64_t)i + 100);
            i += n;
        }
        ci_liveout_flush(lo);
        /* The result, as the worker makes it. */
        struct ci_outcome o;
        memset(&o, 0, sizeof(o));
        o.out = (char *)raw;
        o.out_len = capture_len(raw, total, cap);
        o.out_total = total;
        o.err = (char *)"";
        Ci__V1__ExecutionResult res = CI__V1__EXECUTION_RESULT__INIT;
        Ci__V1__Usage usage = CI__V1__USAGE__INIT;
        struct ci_result_text text;
        ci_result_text_init(&text, &res);
        REQUIRE(ci_result_set_outcome(&res, &usage, &text, &o, cap) == CI_OK);
        struct ci_buf live = CI_BUF_INIT, all = CI_BUF_INIT;
        CHECK(joined(0, &live));
        size_t rlen = strlen(res.stdout);
        /* What went out live is the start of the result's text... */
        bool prefix = live.len <= rlen && memcmp(live.data, res.stdout, live.len) == 0;
        CHECK(prefix);
        ci_liveout_finish(lo, res.stdout, res.stderr);
        /* ... and with finish() all of it, in chunks of whole characters. */
        bool numbered = joined(0, &all);
        CHECK(numbered);
        bool equal = all.len == rlen && memcmp(all.data, res.stdout, rlen) == 0;
        CHECK(equal);
        for (size_t i = 0; i < F.n; i++) {
            size_t j = 0;
            while (j < F.c[i].len) {
                uint32_t cp;
                size_t k = ci_text_utf8_decode(F.c[i].data + j, F.c[i].len - j, &cp);
                if (!k)
                    break;
                j += k;
            }
            CHECK(j == F.c[i].len && F.c[i].len > 0);
        }
        if (!prefix || !equal || !numbered) {
            fprintf(stderr, "round %d: cap %zu, %zu bytes\n", round, cap, total);
            round = 1 << 30; /* one report is enough */
        }
        ci_result_text_release(&text);
        ci_buf_release(&live);
        ci_buf_release(&all);
        ci_liveout_free(lo);
        free(raw);
    }
    fake_reset();
}

TEST_MAIN(T(test_deadline), T(test_size), T(test_cap), T(test_utf8), T(test_finish_only),
          T(test_result_shorter), T(test_publish_fails), T(test_owes), T(test_null), T(test_sink),
          T(test_random_equals_result))
