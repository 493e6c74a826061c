/* util.c - the small helpers of util.h: the growable buffer, clocks, SHA-256
 * in hex, UTF-8 sanitizing, ci_write_all and base64. */
#include "core/util.h"

#include "core/text.h"

#include <errno.h>
#include <openssl/sha.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

ci_status ci_buf_reserve(struct ci_buf *b, size_t extra)
{
    if (extra > SIZE_MAX - b->len - 1)
        return CI_ERR_NOMEM;
    size_t need = b->len + extra + 1;
    if (need <= b->cap)
        return CI_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *p = realloc(b->data, cap);
    if (!p)
        return CI_ERR_NOMEM;
    b->data = p;
    b->cap = cap;
    b->data[b->len] = '\0';
    return CI_OK;
}

ci_status ci_buf_append(struct ci_buf *b, const void *data, size_t len)
{
    ci_status s = ci_buf_reserve(b, len);
    if (s)
        return s;
    if (len)
        memcpy(b->data + b->len, data, len);
    b->len += len;
    b->data[b->len] = '\0';
    return CI_OK;
}

ci_status ci_buf_appendf(struct ci_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return CI_ERR_INVALID;
    ci_status s = ci_buf_reserve(b, (size_t)n);
    if (s)
        return s;
    va_start(ap, fmt);
    vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return CI_OK;
}

void ci_buf_release(struct ci_buf *b)
{
    if (!b)
        return;
    free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

uint8_t *ci_buf_steal(struct ci_buf *b, size_t *ret_len)
{
    if (!b->data && ci_buf_reserve(b, 0))
        return NULL;
    uint8_t *p = b->data;
    if (ret_len)
        *ret_len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    return p;
}

int64_t ci_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t ci_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t ci_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void ci_mono_deadline(struct timespec *ts, int64_t ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

char *ci_strdup0(const char *s)
{
    return s ? strdup(s) : NULL;
}

void ci_sha256_hex(const void *data, size_t len, char out[65])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256(data, len, md);
    for (size_t i = 0; i < sizeof(md); i++) {
        out[2 * i] = hex[md[i] >> 4];
        out[2 * i + 1] = hex[md[i] & 15];
    }
    out[64] = '\0';
}

/* Length of the valid UTF-8 sequence at p (at most n bytes), or 0. */
static size_t utf8_seq_len(const uint8_t *p, size_t n)
{
    uint32_t cp;
    if (p[0] == 0)
        return 0; /* a NUL would end the C string that carries the text */
    return ci_text_utf8_decode(p, n, &cp);
}

char *ci_utf8_sanitize(const uint8_t *data, size_t len, size_t *ret_len)
{
    struct ci_buf b = CI_BUF_INIT;
    if (ci_buf_reserve(&b, len))
        return NULL;
    size_t i = 0;
    while (i < len) {
        size_t n = utf8_seq_len(data + i, len - i);
        ci_status s;
        if (n == 0) {
            s = ci_buf_append(&b, "\xEF\xBF\xBD", 3);
            n = 1;
        } else {
            s = ci_buf_append(&b, data + i, n);
        }
        if (s) {
            ci_buf_release(&b);
            return NULL;
        }
        i += n;
    }
    return (char *)ci_buf_steal(&b, ret_len);
}

ci_status ci_write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return CI_ERR_IO;
        }
        p += n;
        len -= (size_t)n;
    }
    return CI_OK;
}

/* ---- base64 ------------------------------------------------------------ */

static const char b64_std[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static const char b64_url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

char *ci_base64_encode(const void *data, size_t len, enum ci_b64_alphabet a, bool pad,
                       size_t *ret_len)
{
    const uint8_t *in = data;
    const char *tbl = a == CI_B64_URL ? b64_url : b64_std;
    if (len > (SIZE_MAX - 1) / 4 * 3 - 3)
        return NULL;
    size_t rest = len % 3;
    size_t out_len = len / 3 * 4 + (rest == 0 ? 0 : pad ? 4 : rest + 1);
    char *out = malloc(out_len + 1);
    if (!out)
        return NULL;
    size_t o = 0, i = 0;
    for (; i + 3 <= len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];
        out[o++] = tbl[v >> 18 & 63];
        out[o++] = tbl[v >> 12 & 63];
        out[o++] = tbl[v >> 6 & 63];
        out[o++] = tbl[v & 63];
    }
    if (rest) {
        uint32_t v = (uint32_t)in[i] << 16 | (rest == 2 ? (uint32_t)in[i + 1] << 8 : 0);
        out[o++] = tbl[v >> 18 & 63];
        out[o++] = tbl[v >> 12 & 63];
        if (rest == 2)
            out[o++] = tbl[v >> 6 & 63];
        while (pad && o % 4)
            out[o++] = '=';
    }
    out[o] = '\0';
    if (ret_len)
        *ret_len = o;
    return out;
}

/* The 6-bit value of c under the alphabets in flags, or -1. */
static int b64_value(unsigned char c, unsigned flags)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if ((c == '+' && (flags & CI_B64_STD)) || (c == '-' && (flags & CI_B64_URL)))
        return 62;
    if ((c == '/' && (flags & CI_B64_STD)) || (c == '_' && (flags & CI_B64_URL)))
        return 63;
    return -1;
}

/* Checks in against flags; on success *ret_chars is the number of characters
 * before the padding and *ret_out the number of bytes they decode to. */
static ci_status b64_check(const char *in, size_t len, unsigned flags, size_t *ret_chars,
                           size_t *ret_out)
{
    size_t n = len;
    if ((flags & CI_B64_PAD_REQUIRED) && len % 4 != 0)
        return CI_ERR_INVALID;
    if (n > 0 && in[n - 1] == '=') {
        if ((flags & CI_B64_PAD_FORBIDDEN) || n % 4 != 0)
            return CI_ERR_INVALID;
        n--;
        if (n > 0 && in[n - 1] == '=')
            n--;
    }
    if (n % 4 == 1)
        return CI_ERR_INVALID;
    for (size_t i = 0; i < n; i++)
        if (b64_value((unsigned char)in[i], flags) < 0)
            return CI_ERR_INVALID; /* also a '=' before the last two */
    *ret_chars = n;
    *ret_out = n / 4 * 3 + (n % 4 == 3 ? 2 : n % 4 == 2 ? 1 : 0);
    return CI_OK;
}

/* Decodes n characters that b64_check accepted. */
static void b64_write(const char *in, size_t n, unsigned flags, uint8_t *out)
{
    uint32_t acc = 0;
    unsigned bits = 0;
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        acc = acc << 6 | (uint32_t)b64_value((unsigned char)in[i], flags);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
}

ci_status ci_base64_decode_into(const char *in, size_t len, unsigned flags, uint8_t *out,
                                size_t out_cap, size_t *ret_len)
{
    size_t n, out_len;
    ci_status s = b64_check(in, len, flags, &n, &out_len);
    if (s)
        return s;
    if (out_len > out_cap)
        return CI_ERR_LIMIT;
    b64_write(in, n, flags, out);
    *ret_len = out_len;
    return CI_OK;
}

ci_status ci_base64_decode(const char *in, size_t len, unsigned flags, uint8_t **ret,
                           size_t *ret_len)
{
    size_t n, out_len;
    ci_status s = b64_check(in, len, flags, &n, &out_len);
    if (s)
        return s;
    uint8_t *out = NULL;
    if (out_len > 0 && !(out = malloc(out_len)))
        return CI_ERR_NOMEM;
    b64_write(in, n, flags, out);
    *ret = out;
    *ret_len = out_len;
    return CI_OK;
}
