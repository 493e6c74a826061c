/* test_batch_events.c - a batch's events without NATS (core/batch.h,
 * contract §20): their subjects' tokens, the end, seal and complete bodies
 * written and read back, and when a batch is complete. Shared by workers
 * and `ci batch`. */
#include "core/batch.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/util.h"

#include "testutil.h"

static void test_end_body(void)
{
    char *b = NULL;
    size_t n = 0;
    struct ci_error e = {{0}};
    REQUIRE(ci_batch_end_body("t-1", "TASK_STATUS_SUCCEEDED", "", &b, &n,
                              &e) == CI_OK);
    CHECK_STR(b, "{\"taskId\":\"t-1\",\"status\":\"TASK_STATUS_SUCCEEDED\"}");
    CHECK(n == strlen(b));
    free(b);
    REQUIRE(ci_batch_end_body("t-2", "TASK_STATUS_FAILED",
                              "the \"code\" raised\n", &b, &n, &e) == CI_OK);
    CHECK_STR(b, "{\"taskId\":\"t-2\",\"status\":\"TASK_STATUS_FAILED\",\"error\":\"the "
                 "\\\"code\\\" raised\\n\"}");
    free(b);
    /* Cut to 256 bytes, never inside a character: 255 'x' and a 2-byte é
     * leave 255 bytes. Invalid bytes become U+FFFD first. */
    char long_err[400];
    memset(long_err, 'x', 255);
    memcpy(long_err + 255, "\xc3\xa9" "yyy", 6);
    REQUIRE(ci_batch_end_body("t-3", "TASK_STATUS_TIMED_OUT", long_err, &b,
                              &n, &e) == CI_OK);
    const char *err = strstr(b, "\"error\":\"");
    REQUIRE(err);
    err += 9;
    CHECK(strlen(err) == 255 + 2); /* the 255 x, the closing quote and brace */
    free(b);
    memset(long_err, 'x', 300);
    long_err[300] = '\0';
    REQUIRE(ci_batch_end_body("t-4", "TASK_STATUS_CANCELLED", long_err, &b,
                              &n, &e) == CI_OK);
    err = strstr(b, "\"error\":\"") + 9;
    CHECK(strlen(err) == CI_BATCH_ERROR_MAX + 2);
    free(b);
    REQUIRE(ci_batch_end_body("t-5", "TASK_STATUS_FAILED", "bad \xff byte", &b,
                              &n, &e) == CI_OK);
    CHECK_STR(b, "{\"taskId\":\"t-5\",\"status\":\"TASK_STATUS_FAILED\",\"error\":\"bad "
                 "\xef\xbf\xbd byte\"}");
    free(b);
}

static void test_seal_total(void)
{
    uint64_t t = 0;
    struct ci_error e = {{0}};
    const char *ok[] = {"{\"total\":\"200\"}", "{\"total\":200}", "{\"total\":\"0\",\"by\":\"x\"}",
                        "{\"total\":\"18446744073709551615\"}"};
    const uint64_t want[] = {200, 200, 0, UINT64_MAX};
    for (size_t i = 0; i < 4; i++) {
        CHECK(ci_batch_seal_total((const uint8_t *)ok[i], strlen(ok[i]), &t, &e) == CI_OK);
        CHECK(t == want[i]);
    }
    const char *bad[] = {"", "{}", "[1]", "{\"total\":-1}", "{\"total\":\"-1\"}",
                         "{\"total\":\"1x\"}", "{\"total\":\" 1\"}", "{\"total\":1.5}",
                         "{\"total\":\"18446744073709551616\"}", "{\"total\":\"\"}", "null"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        t = 7;
        CHECK(ci_batch_seal_total((const uint8_t *)bad[i], strlen(bad[i]), &t, &e) ==
              CI_ERR_INVALID);
        CHECK(t == 7);
    }
}

static void test_seal_body(void)
{
    char *b = NULL;
    size_t n = 0;
    uint64_t total = 0;
    struct ci_error e = {{0}};
    REQUIRE(ci_batch_seal_body(100000, &b, &n, &e) == CI_OK);
    CHECK_STR(b, "{\"total\":\"100000\"}");
    CHECK(ci_batch_seal_total((const uint8_t *)b, n, &total, &e) == CI_OK && total == 100000);
    free(b);
}

static void t_event_of(void)
{
    CHECK(ci_batch_event_of("ci.batches", "b1", "ci.batches.b1.taken") == CI_BATCH_EV_TAKEN);
    CHECK(ci_batch_event_of("ci.batches", "b1", "ci.batches.b1.timed_out") ==
          CI_BATCH_EV_TIMED_OUT);
    CHECK(ci_batch_event_of("ci.batches", "b1", "ci.batches.b1.cancel") == CI_BATCH_EV_CANCEL);
    CHECK(ci_batch_event_of("ci.batches", "b1", "ci.batches.b1.complete") ==
          CI_BATCH_EV_COMPLETE);
    CHECK(ci_batch_event_of("ci.batches", "b1", "ci.batches.b10.taken") == CI_BATCH_EV_UNKNOWN);
    CHECK(ci_batch_event_of("ci.batches", "b1", "ci.batches.b1.other") == CI_BATCH_EV_UNKNOWN);
    CHECK(ci_batch_event_of("ci.batches", "b1", "ci.batch.b1.taken") == CI_BATCH_EV_UNKNOWN);
    CHECK(ci_batch_event_of("ci.batches", "b1", "ci.batches.b1") == CI_BATCH_EV_UNKNOWN);
    for (int ev = 0; ev < CI_BATCH_EV_COUNT; ev++) {
        char subj[128];
        snprintf(subj, sizeof(subj), "x.y.%s", ci_batch_event_name((enum ci_batch_event)ev));
        CHECK(ci_batch_event_of("x", "y", subj) == ev);
    }
    CHECK(ci_batch_event_ended(CI_BATCH_EV_SUCCEEDED) && ci_batch_event_ended(CI_BATCH_EV_CANCELLED));
    CHECK(!ci_batch_event_ended(CI_BATCH_EV_TAKEN) && !ci_batch_event_ended(CI_BATCH_EV_CANCEL));
    CHECK(ci_batch_event_parse("sealed") == CI_BATCH_EV_SEALED);
    CHECK(ci_batch_event_parse("SEALED") == CI_BATCH_EV_UNKNOWN);
    struct ci_batch_counts c = {0};
    *ci_batch_counts_of(&c, CI_BATCH_EV_TIMED_OUT) = 3;
    *ci_batch_counts_of(&c, CI_BATCH_EV_SUCCEEDED) = 4;
    CHECK(c.timed_out == 3 && ci_batch_counts_ended(&c) == 7);
    CHECK(ci_batch_counts_of(&c, CI_BATCH_EV_UNKNOWN) == NULL);
}

static void t_end_parse(void)
{
    struct ci_batch_end end;
    struct ci_error e = {{0}};
    const char *j = "{\"taskId\":\"b-3\",\"status\":\"TASK_STATUS_FAILED\",\"error\":\"boom\"}";
    CHECK(ci_batch_end_parse((const uint8_t *)j, strlen(j), &end, &e) == CI_OK);
    CHECK_STR(end.task_id, "b-3");
    CHECK(end.event == CI_BATCH_EV_FAILED);
    CHECK_STR(end.error, "boom");
    const char *noerr = "{\"taskId\":\"b-1\",\"status\":\"TASK_STATUS_SUCCEEDED\"}";
    CHECK(ci_batch_end_parse((const uint8_t *)noerr, strlen(noerr), &end, &e) == CI_OK);
    CHECK_STR(end.error, "");
    const char *bad[] = {
        "{\"taskId\":\"b.1\",\"status\":\"TASK_STATUS_FAILED\"}",
        "{\"status\":\"TASK_STATUS_FAILED\"}",
        "{\"taskId\":\"b-1\",\"status\":\"TASK_STATUS_RUNNING\"}",
        "{\"taskId\":\"b-1\",\"status\":3}",
        "{\"taskId\":\"b-1\",\"status\":\"TASK_STATUS_FAILED\",\"error\":5}",
        "not json",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK(ci_batch_end_parse((const uint8_t *)bad[i], strlen(bad[i]), &end, &e) ==
              CI_ERR_INVALID);
    /* A long error is cut where a UTF-8 character begins. */
    struct ci_buf b = CI_BUF_INIT;
    ci_buf_appendf(&b, "{\"taskId\":\"t\",\"status\":\"TASK_STATUS_FAILED\",\"error\":\"x");
    for (int i = 0; i < 600; i++)
        ci_buf_appendf(&b, "\xc3\xa9"); /* é */
    ci_buf_appendf(&b, "\"}");
    CHECK(ci_batch_end_parse(b.data, b.len, &end, &e) == CI_OK);
    size_t n = strlen(end.error);
    CHECK(n == CI_BATCH_ERROR_MAX - 1 || n == CI_BATCH_ERROR_MAX); /* x + whole characters */
    CHECK(((unsigned char)end.error[n - 1] & 0xC0) == 0x80); /* ends with a whole é */
    CHECK(n % 2 == 1);
    ci_buf_release(&b);
    /* What the worker writes reads back. */
    char *w = NULL;
    size_t wn = 0;
    REQUIRE(ci_batch_end_body("t-9", "TASK_STATUS_TIMED_OUT", "slow", &w, &wn, &e) == CI_OK);
    CHECK(ci_batch_end_parse((const uint8_t *)w, wn, &end, &e) == CI_OK);
    CHECK_STR(end.task_id, "t-9");
    CHECK(end.event == CI_BATCH_EV_TIMED_OUT);
    CHECK_STR(end.error, "slow");
    free(w);
}

static void test_complete(void)
{
    struct ci_batch_counts c = {.taken = 200, .succeeded = 190, .failed = 8, .timed_out = 2};
    CHECK(!ci_batch_is_complete(&c, 200)); /* not sealed */
    c.sealed = 1;
    CHECK(ci_batch_is_complete(&c, 200));
    CHECK(!ci_batch_is_complete(&c, 201));
    CHECK(ci_batch_is_complete(&c, 0));
    char *b = NULL;
    size_t n = 0;
    struct ci_error e = {{0}};
    REQUIRE(ci_batch_complete_body("b1", 200, &c, &b, &n, &e) == CI_OK);
    CHECK_STR(b, "{\"batchId\":\"b1\",\"total\":\"200\",\"succeeded\":\"190\",\"failed\":\"8\","
                 "\"timedOut\":\"2\",\"cancelled\":\"0\"}");
    free(b);
}

TEST_MAIN(T(test_end_body), T(test_seal_total), T(test_seal_body), T(t_event_of),
          T(t_end_parse), T(test_complete))
