#include "util.h"

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

int64_t ci_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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
    uint8_t c = p[0];
    size_t len;
    uint32_t cp;
    if (c == 0)
        return 0; /* a NUL would end the C string that carries the text */
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
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
