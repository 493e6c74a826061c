/* Unit tests of util.c and status.c. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "testutil.h"
#include "core/util.h"

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

/* RFC 4648 section 10, plus the two characters where the alphabets differ. */
static const struct {
    const char *data;
    size_t len;
    const char *std, *url; /* padded */
} b64_vectors[] = {
    {"", 0, "", ""},
    {"f", 1, "Zg==", "Zg=="},
    {"fo", 2, "Zm8=", "Zm8="},
    {"foo", 3, "Zm9v", "Zm9v"},
    {"foob", 4, "Zm9vYg==", "Zm9vYg=="},
    {"fooba", 5, "Zm9vYmE=", "Zm9vYmE="},
    {"foobar", 6, "Zm9vYmFy", "Zm9vYmFy"},
    {"\xfb\xff", 2, "+/8=", "-_8="},
    {"\xfb\xff\xbf", 3, "+/+/", "-_-_"},
    {"\x00\x10\x83", 3, "ABCD", "ABCD"},
};

static void test_base64_encode_vectors(void)
{
    for (size_t i = 0; i < sizeof(b64_vectors) / sizeof(b64_vectors[0]); i++) {
        const char *d = b64_vectors[i].data;
        size_t len = b64_vectors[i].len, n = 99;
        for (int a = 0; a < 2; a++) {
            const char *want = a ? b64_vectors[i].url : b64_vectors[i].std;
            char *got = ci_base64_encode(d, len, a ? CI_B64_URL : CI_B64_STD, true, &n);
            CHECK_STR(got, want);
            CHECK(n == strlen(want));
            free(got);
            /* unpadded: the same without its '=' */
            size_t unpadded = strcspn(want, "=");
            got = ci_base64_encode(d, len, a ? CI_B64_URL : CI_B64_STD, false, &n);
            REQUIRE(got);
            CHECK(n == unpadded && strlen(got) == unpadded && strncmp(got, want, n) == 0);
            free(got);
        }
    }
    /* empty data may be NULL; ret_len may be NULL */
    char *e = ci_base64_encode(NULL, 0, CI_B64_STD, true, NULL);
    CHECK_STR(e, "");
    free(e);
}

static void test_base64_decode_vectors(void)
{
    for (size_t i = 0; i < sizeof(b64_vectors) / sizeof(b64_vectors[0]); i++) {
        const char *d = b64_vectors[i].data;
        size_t len = b64_vectors[i].len;
        for (int a = 0; a < 2; a++) {
            const char *in = a ? b64_vectors[i].url : b64_vectors[i].std;
            unsigned alpha = a ? CI_B64_URL : CI_B64_STD;
            size_t padded = strlen(in), unpadded = strcspn(in, "=");
            /* padded under optional and required padding; unpadded under
             * optional and forbidden; either alphabet when both are allowed */
            const struct {
                size_t n;
                unsigned flags;
            } ok[] = {
                {padded, alpha},
                {padded, alpha | CI_B64_PAD_REQUIRED},
                {padded, CI_B64_STD | CI_B64_URL},
                {unpadded, alpha},
                {unpadded, alpha | CI_B64_PAD_FORBIDDEN},
                {unpadded, CI_B64_STD | CI_B64_URL},
            };
            for (size_t k = 0; k < sizeof(ok) / sizeof(ok[0]); k++) {
                uint8_t *got = (uint8_t *)"untouched";
                size_t n = 99;
                ci_status s = ci_base64_decode(in, ok[k].n, ok[k].flags, &got, &n);
                if (s != CI_OK || n != len || (len && memcmp(got, d, len) != 0))
                    fprintf(stderr, "  vector %zu alphabet %d case %zu: %s\n", i, a, k,
                            ci_status_str(s));
                CHECK(s == CI_OK && n == len && (len ? memcmp(got, d, len) == 0 : !got));
                if (s == CI_OK)
                    free(got);
            }
        }
    }
}

/* in (NUL-terminated) is refused with CI_ERR_INVALID under flags, and the
 * outputs are left alone. */
static bool b64_refused(const char *in, size_t len, unsigned flags)
{
    uint8_t *got = (uint8_t *)"untouched";
    size_t n = 99;
    ci_status s = ci_base64_decode(in, len, flags, &got, &n);
    uint8_t buf[16] = {0};
    size_t m = 99;
    ci_status s2 = ci_base64_decode_into(in, len, flags, buf, sizeof(buf), &m);
    if (s == CI_OK)
        free(got);
    bool ok = s == CI_ERR_INVALID && s2 == CI_ERR_INVALID && n == 99 && m == 99 &&
              strcmp((const char *)got, "untouched") == 0 && buf[0] == 0;
    if (!ok)
        fprintf(stderr, "  '%.*s' (flags %u): %s / %s\n", (int)len, in, flags, ci_status_str(s),
                ci_status_str(s2));
    return ok;
}
#define REFUSED(lit, flags) b64_refused(lit, sizeof(lit) - 1, flags)

static void test_base64_decode_invalid(void)
{
    const unsigned any = CI_B64_STD | CI_B64_URL;
    /* characters outside the alphabets, anywhere in the string */
    CHECK(REFUSED("Zm9v!", any));
    CHECK(REFUSED("Zm 9v", any));
    CHECK(REFUSED("Zm9v\n", any));
    CHECK(REFUSED("Zm\0v", any));
    CHECK(REFUSED("Zm\xc3\xa9", any));
    CHECK(REFUSED("*m9v", any));
    CHECK(REFUSED("Zm9v.", any));
    /* one alphabet only: the other's two characters are refused */
    CHECK(REFUSED("-_8=", CI_B64_STD));
    CHECK(REFUSED("Zm-v", CI_B64_STD));
    CHECK(REFUSED("+/8=", CI_B64_URL));
    CHECK(REFUSED("Zm/v", CI_B64_URL));
    CHECK(REFUSED("Zm+v", 0));
    /* padding: too much, too little, misplaced */
    CHECK(REFUSED("Zg=", any));
    CHECK(REFUSED("Zg===", any));
    CHECK(REFUSED("Z===", any));
    CHECK(REFUSED("====", any));
    CHECK(REFUSED("=", any));
    CHECK(REFUSED("Zm9vYg=", any));
    CHECK(REFUSED("Zg=a", any));
    CHECK(REFUSED("Z=g=", any));
    CHECK(REFUSED("=Zg=", any));
    CHECK(REFUSED("Zg==Zg==", any));
    CHECK(REFUSED("Zm9vYmFy====", any));
    CHECK(REFUSED("Zg==", any | CI_B64_PAD_FORBIDDEN));
    CHECK(REFUSED("Zm8=", any | CI_B64_PAD_FORBIDDEN));
    CHECK(REFUSED("Zg", any | CI_B64_PAD_REQUIRED));
    CHECK(REFUSED("Zm8", any | CI_B64_PAD_REQUIRED));
    /* lengths of 4n+1 characters hold no whole byte at the end */
    CHECK(REFUSED("Z", any));
    CHECK(REFUSED("Zm9vY", any));
    CHECK(REFUSED("Zm9vYmFyZ", any));
}

static void test_base64_decode_edges(void)
{
    const unsigned any = CI_B64_STD | CI_B64_URL;
    /* empty input is empty output, NULL like protobuf-c's empty bytes */
    uint8_t *got = (uint8_t *)"x";
    size_t n = 99;
    CHECK(ci_base64_decode("", 0, any | CI_B64_PAD_REQUIRED, &got, &n) == CI_OK);
    CHECK(got == NULL && n == 0);
    CHECK(ci_base64_decode(NULL, 0, any, &got, &n) == CI_OK && got == NULL && n == 0);
    /* the length bounds the read: the bytes after it are never looked at */
    CHECK(ci_base64_decode("Zm9v!!!!", 4, any, &got, &n) == CI_OK);
    CHECK(n == 3 && memcmp(got, "foo", 3) == 0);
    free(got);
    /* leftover bits in the last character are ignored, not refused */
    CHECK(ci_base64_decode("Zh==", 4, any, &got, &n) == CI_OK);
    CHECK(n == 1 && got[0] == 'f');
    free(got);
    /* mixed alphabets in one string when both are allowed */
    CHECK(ci_base64_decode("+_-/", 4, any, &got, &n) == CI_OK);
    CHECK(n == 3 && memcmp(got, "\xfb\xff\xbf", 3) == 0);
    free(got);

    /* decode_into: exactly the room needed, one byte less, none */
    uint8_t buf[8];
    memset(buf, 0xAA, sizeof(buf));
    size_t m = 99;
    CHECK(ci_base64_decode_into("Zm9vYmFy", 8, any, buf, 5, &m) == CI_ERR_LIMIT);
    CHECK(m == 99 && buf[0] == 0xAA);
    CHECK(ci_base64_decode_into("Zm9vYmE", 7, any, buf, 0, &m) == CI_ERR_LIMIT);
    CHECK(ci_base64_decode_into("Zm9vYmFy", 8, any, buf, 6, &m) == CI_OK);
    CHECK(m == 6 && memcmp(buf, "foobar", 6) == 0 && buf[6] == 0xAA);
    CHECK(ci_base64_decode_into("", 0, any, NULL, 0, &m) == CI_OK && m == 0);
    /* a malformed string is CI_ERR_INVALID even when it would not fit */
    CHECK(ci_base64_decode_into("Zm9vYmFy!", 9, any, buf, 1, &m) == CI_ERR_INVALID);

    /* every byte value survives a round trip, in both alphabets, padded or not,
     * at every length up to 256 (all three remainders mod 3) */
    uint8_t all[256];
    for (size_t i = 0; i < sizeof(all); i++)
        all[i] = (uint8_t)(255 - i);
    for (size_t len = 0; len <= sizeof(all); len++) {
        for (int mode = 0; mode < 4; mode++) {
            enum ci_b64_alphabet a = mode & 1 ? CI_B64_URL : CI_B64_STD;
            bool pad = mode & 2;
            size_t elen = 0;
            char *enc = ci_base64_encode(all, len, a, pad, &elen);
            REQUIRE(enc);
            CHECK(elen == (pad ? (len + 2) / 3 * 4 : (len * 4 + 2) / 3));
            CHECK(strchr(enc, a == CI_B64_URL ? '+' : '-') == NULL);
            CHECK(strchr(enc, a == CI_B64_URL ? '/' : '_') == NULL);
            unsigned flags = a | (pad ? CI_B64_PAD_REQUIRED : CI_B64_PAD_FORBIDDEN);
            uint8_t *dec = NULL;
            size_t dlen = 0;
            CHECK(ci_base64_decode(enc, elen, flags, &dec, &dlen) == CI_OK);
            CHECK(dlen == len && (len == 0 || memcmp(dec, all, len) == 0));
            free(dec);
            free(enc);
        }
    }
}

TEST_MAIN(T(test_buf_grows_and_terminates), T(test_sha256_vectors), T(test_utf8_sanitize),
          T(test_error_messages), T(test_base64_encode_vectors), T(test_base64_decode_vectors),
          T(test_base64_decode_invalid), T(test_base64_decode_edges))
