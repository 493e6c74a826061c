/* test_chunk_order.c - live output chunks shown in Ci-Seq order
 * (cli/chunk_order.h, contract §19): stored 1,3,2 they show 1,2,3; a chunk
 * shows once however often it comes; a gap holds what follows it; the
 * limits on what is held stop the order instead of growing; a new attempt
 * starts over. */
#include "cli/chunk_order.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* What was shown, in order, each chunk's bytes then '|'. */
struct screen {
    char text[4096];
    size_t len;
    int fail_at; /* the call to show that fails (1-based), 0: none */
    int calls;
};

static ci_status show(void *closure, const uint8_t *data, size_t len)
{
    struct screen *s = closure;
    if (++s->calls == s->fail_at)
        return CI_ERR_NOMEM;
    if (s->len + len + 2 > sizeof(s->text))
        abort();
    memcpy(s->text + s->len, data, len);
    s->len += len;
    s->text[s->len++] = '|';
    s->text[s->len] = '\0';
    return CI_OK;
}

static ci_status put(struct ci_chunk_order *o, struct screen *s, uint64_t seq, const char *text)
{
    return ci_chunk_order_put(o, seq, (const uint8_t *)text, strlen(text), show, s);
}

static void test_in_order(void)
{
    struct ci_chunk_order o;
    struct screen s = {0};
    ci_chunk_order_init(&o, 16, 1024);
    CHECK(put(&o, &s, 1, "a") == CI_OK);
    CHECK(put(&o, &s, 2, "bb") == CI_OK);
    CHECK(put(&o, &s, 3, "c") == CI_OK);
    CHECK_STR(s.text, "a|bb|c|");
    CHECK(o.n_held == 0 && o.shown_bytes == 4 && o.next_seq == 4);
    ci_chunk_order_release(&o);
}

static void test_stored_out_of_order(void)
{
    struct ci_chunk_order o;
    struct screen s = {0};
    ci_chunk_order_init(&o, 16, 1024);
    CHECK(put(&o, &s, 1, "1") == CI_OK);
    CHECK(put(&o, &s, 3, "3") == CI_OK);
    CHECK_STR(s.text, "1|"); /* 3 waits for 2 */
    CHECK(o.n_held == 1 && o.held_bytes == 1);
    CHECK(put(&o, &s, 2, "2") == CI_OK);
    CHECK_STR(s.text, "1|2|3|");
    /* Backwards: nothing shows until the first. */
    CHECK(put(&o, &s, 7, "7") == CI_OK);
    CHECK(put(&o, &s, 6, "6") == CI_OK);
    CHECK(put(&o, &s, 5, "5") == CI_OK);
    CHECK_STR(s.text, "1|2|3|");
    CHECK(o.n_held == 3);
    CHECK(put(&o, &s, 4, "4") == CI_OK);
    CHECK_STR(s.text, "1|2|3|4|5|6|7|");
    CHECK(o.n_held == 0 && o.held_bytes == 0 && o.shown_bytes == 7 && o.next_seq == 8);
    ci_chunk_order_release(&o);
}

static void test_never_twice(void)
{
    struct ci_chunk_order o;
    struct screen s = {0};
    ci_chunk_order_init(&o, 16, 1024);
    CHECK(put(&o, &s, 1, "a") == CI_OK);
    CHECK(put(&o, &s, 1, "a") == CI_OK);
    CHECK(put(&o, &s, 3, "c") == CI_OK);
    CHECK(put(&o, &s, 3, "c") == CI_OK);
    CHECK(o.n_held == 1 && o.held_bytes == 1);
    CHECK(put(&o, &s, 0, "no Ci-Seq") == CI_OK);
    CHECK(put(&o, &s, 2, "b") == CI_OK);
    CHECK(put(&o, &s, 2, "b") == CI_OK);
    CHECK_STR(s.text, "a|b|c|");
    ci_chunk_order_release(&o);
}

static void test_gap_holds_what_follows(void)
{
    struct ci_chunk_order o;
    struct screen s = {0};
    ci_chunk_order_init(&o, 16, 1024);
    /* A first chunk other than 1 (chunk 1 lost, or expired) shows nothing. */
    CHECK(put(&o, &s, 2, "b") == CI_OK);
    CHECK(put(&o, &s, 3, "c") == CI_OK);
    CHECK(s.len == 0 && o.n_held == 2 && o.shown_bytes == 0);
    ci_chunk_order_release(&o); /* frees what is held (ASan: no leak) */
    CHECK(o.n_held == 0);
    ci_chunk_order_release(&o); /* twice is fine */
}

static void test_held_chunks_limit(void)
{
    struct ci_chunk_order o;
    struct screen s = {0};
    ci_chunk_order_init(&o, 3, 1024);
    CHECK(put(&o, &s, 1, "a") == CI_OK);
    CHECK(put(&o, &s, 3, "c") == CI_OK);
    CHECK(put(&o, &s, 4, "d") == CI_OK);
    CHECK(put(&o, &s, 5, "e") == CI_OK);
    CHECK(put(&o, &s, 6, "f") == CI_ERR_LIMIT); /* a fourth held */
    CHECK(o.n_held == 0 && o.held_bytes == 0);  /* dropped */
    /* Stopped: even the chunk expected next is not shown. */
    CHECK(put(&o, &s, 2, "b") == CI_ERR_LIMIT);
    CHECK_STR(s.text, "a|");
    ci_chunk_order_release(&o);
}

static void test_bytes_limit(void)
{
    struct ci_chunk_order o;
    struct screen s = {0};
    ci_chunk_order_init(&o, 100, 10);
    CHECK(put(&o, &s, 1, "aaaa") == CI_OK);   /* 4 shown */
    CHECK(put(&o, &s, 3, "cccc") == CI_OK);   /* 4 held: 8 */
    CHECK(put(&o, &s, 2, "bbb") == CI_ERR_LIMIT); /* 11 > 10 */
    CHECK_STR(s.text, "aaaa|");
    ci_chunk_order_release(&o);

    ci_chunk_order_init(&o, 100, 10);
    memset(&s, 0, sizeof(s));
    CHECK(put(&o, &s, 1, "aaaaa") == CI_OK);
    CHECK(put(&o, &s, 2, "bbbbb") == CI_OK); /* exactly 10 */
    CHECK(put(&o, &s, 3, "c") == CI_ERR_LIMIT);
    CHECK_STR(s.text, "aaaaa|bbbbb|");
    ci_chunk_order_release(&o);
}

/* A flood of chunks after a gap: at most max_held are kept, then none. */
static void test_flood_after_gap(void)
{
    struct ci_chunk_order o;
    struct screen s = {0};
    ci_chunk_order_init(&o, 4096, 16u << 20);
    ci_status st = CI_OK;
    uint64_t seq = 2;
    for (; seq < 100000 && st == CI_OK; seq++)
        st = put(&o, &s, seq, "x");
    CHECK(st == CI_ERR_LIMIT);
    CHECK(seq - 2 == 4097); /* the 4097th held is refused */
    CHECK(o.n_held == 0 && s.len == 0);
    ci_chunk_order_release(&o);
}

static void test_show_fails(void)
{
    struct ci_chunk_order o;
    struct screen s = {.fail_at = 3};
    ci_chunk_order_init(&o, 16, 1024);
    CHECK(put(&o, &s, 1, "a") == CI_OK);
    CHECK(put(&o, &s, 3, "c") == CI_OK);
    CHECK(put(&o, &s, 4, "d") == CI_OK);
    CHECK(put(&o, &s, 2, "b") == CI_ERR_NOMEM); /* c fails to show */
    CHECK_STR(s.text, "a|b|");
    CHECK(o.n_held == 0 && o.held_bytes == 0);
    CHECK(put(&o, &s, 3, "c") == CI_ERR_NOMEM);
    ci_chunk_order_release(&o);
}

static void test_reset_starts_over(void)
{
    struct ci_chunk_order o;
    struct screen s = {0};
    ci_chunk_order_init(&o, 1, 1024);
    CHECK(put(&o, &s, 1, "a") == CI_OK);
    CHECK(put(&o, &s, 3, "c") == CI_OK);
    CHECK(put(&o, &s, 4, "d") == CI_ERR_LIMIT);
    ci_chunk_order_reset(&o); /* attempt 2 */
    CHECK(o.next_seq == 1 && o.shown_bytes == 0 && o.stopped == CI_OK);
    CHECK(put(&o, &s, 2, "B") == CI_OK);
    CHECK(put(&o, &s, 1, "A") == CI_OK);
    CHECK_STR(s.text, "a|A|B|");
    ci_chunk_order_release(&o);
}

TEST_MAIN(T(test_in_order), T(test_stored_out_of_order), T(test_never_twice),
          T(test_gap_holds_what_follows), T(test_held_chunks_limit), T(test_bytes_limit),
          T(test_flood_after_gap), T(test_show_fails), T(test_reset_starts_over))
