/* test_batch.c - a batch's event bodies and the seal (core/batch.h,
 * contract §20). */
#include "core/batch.h"

#include <stdlib.h>

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

TEST_MAIN(T(test_end_body), T(test_seal_total), T(test_complete))
