/* Unit tests of util.c and status.c. */
#include <stdlib.h>

#include "status.h"
#include "testutil.h"
#include "util.h"

static void test_buf_grows_and_terminates(void)
{
    struct ci_buf b = CI_BUF_INIT;
    for (int i = 0; i < 1000; i++)
        REQUIRE(ci_buf_append(&b, "abc", 3) == CI_OK);
    CHECK(b.len == 3000);
    CHECK(b.data[b.len] == '\0');
    REQUIRE(ci_buf_appendf(&b, "-%d-", 42) == CI_OK);
    CHECK(b.len == 3004);
    CHECK_STR((char *)b.data + 3000, "-42-");
    size_t n = 0;
    uint8_t *p = ci_buf_steal(&b, &n);
    CHECK(n == 3004 && b.data == NULL && b.len == 0);
    free(p);
    ci_buf_release(&b);
    ci_buf_release(NULL);
}

static void test_sha256_vectors(void)
{
    char hex[65];
    ci_sha256_hex("", 0, hex);
    CHECK_STR(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    ci_sha256_hex("abc", 3, hex);
    CHECK_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

static void test_utf8_sanitize(void)
{
    size_t n = 0;
    char *s = ci_utf8_sanitize((const uint8_t *)"h\xc3\xa9llo", 6, &n);
    CHECK_STR(s, "h\xc3\xa9llo");
    CHECK(n == 6);
    free(s);
    /* a lone continuation byte, a truncated sequence, an overlong NUL, a surrogate */
    s = ci_utf8_sanitize((const uint8_t *)"a\x80" "b\xe2\x82" "c\xc0\x80" "d\xed\xa0\x80", 12, &n);
    CHECK_STR(s, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd" "c\xef\xbf\xbd\xef\xbf\xbd"
                 "d\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    free(s);
    s = ci_utf8_sanitize((const uint8_t *)"a\0b", 3, &n);
    CHECK(n == 5);
    CHECK_STR(s, "a\xef\xbf\xbd" "b");
    free(s);
    s = ci_utf8_sanitize((const uint8_t *)"", 0, &n);
    CHECK(s && n == 0 && s[0] == '\0');
    free(s);
}

static void test_error_messages(void)
{
    struct ci_error e = {{0}};
    CHECK(ci_error_set(&e, CI_ERR_LIMIT, "input '%s' is %d MiB", "a.csv", 23) == CI_ERR_LIMIT);
    CHECK_STR(e.msg, "input 'a.csv' is 23 MiB");
    CHECK(ci_error_errno(&e, CI_ERR_IO, 2, "open %s", "x") == CI_ERR_IO);
    CHECK_STR(e.msg, "open x: No such file or directory");
    CHECK(ci_error_set(NULL, CI_ERR_NOMEM, "ignored") == CI_ERR_NOMEM);
    CHECK_STR(ci_status_str(CI_ERR_TIMEOUT), "timeout");
}

TEST_MAIN(T(test_buf_grows_and_terminates), T(test_sha256_vectors), T(test_utf8_sanitize),
          T(test_error_messages))
