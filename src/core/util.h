/* util.h - small helpers every module uses: cleanup attributes, a growable
 * byte buffer, and time. */
#ifndef CI_UTIL_H
#define CI_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/status.h"

static inline void ci_freep(void *p) { free(*(void **)p); }
static inline void ci_closep(int *fd)
{
    if (*fd >= 0)
        close(*fd);
}

/* A local that owns heap memory or an fd is released when it leaves scope. */
#define CI_AUTOFREE __attribute__((cleanup(ci_freep)))
#define CI_AUTOCLOSE __attribute__((cleanup(ci_closep)))

/* Cleanup for a library's own types, the way systemd does it:
 * CI_DEFINE_CLEANUP(natsMsg, natsMsg_Destroy) defines natsMsg_Destroyp(),
 * and `CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;` destroys m when it
 * leaves scope (the destructor is not called on NULL). */
#define CI_DEFINE_CLEANUP(type, fn)                                                            \
    static inline void fn##p(type **p)                                                         \
    {                                                                                          \
        if (*p)                                                                                \
            fn(*p);                                                                            \
    }
#define CI_CLEANUP(fn) __attribute__((cleanup(fn##p)))

/* Hands ownership to the caller: returns *pp and clears it. */
static inline void *ci_steal_ptr(void *pp)
{
    void **p = (void **)pp;
    void *v = *p;
    *p = NULL;
    return v;
}
#define CI_STEAL(pp) ci_steal_ptr(pp)

static inline int ci_steal_fd(int *fd)
{
    int v = *fd;
    *fd = -1;
    return v;
}

/* A growable byte buffer for user data. Always NUL-terminated past len so
 * that text can be used as a C string. */
struct ci_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
};

#define CI_BUF_INIT {NULL, 0, 0}
/* A local struct ci_buf released when it leaves scope (ci_buf_steal leaves
 * nothing to release). */
#define CI_AUTOBUF __attribute__((cleanup(ci_buf_release)))

ci_status ci_buf_reserve(struct ci_buf *b, size_t extra);
ci_status ci_buf_append(struct ci_buf *b, const void *data, size_t len);
ci_status ci_buf_appendf(struct ci_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ci_buf_release(struct ci_buf *b);
/* Gives the buffer's memory to the caller (NUL-terminated) and resets b. */
uint8_t *ci_buf_steal(struct ci_buf *b, size_t *ret_len);

/* Milliseconds: wall clock since the epoch, and a monotonic clock. */
int64_t ci_now_ms(void);
int64_t ci_mono_ms(void);
/* *ts = the monotonic clock ms from now: a deadline for a condition
 * variable on CLOCK_MONOTONIC (pthread_condattr_setclock). */
void ci_mono_deadline(struct timespec *ts, int64_t ms);
/* Microseconds of the wall clock since the epoch: the stage marks of a task
 * (job.h), which a client on the same machine can line up with its own. */
int64_t ci_now_us(void);

/* strdup that accepts NULL. */
char *ci_strdup0(const char *s);

/* Lower-case hex SHA-256 of data into out (65 bytes with the NUL). */
void ci_sha256_hex(const void *data, size_t len, char out[65]);

/* Replaces invalid UTF-8 sequences and NUL bytes (which would end the C
 * string that carries the text) with U+FFFD; returns a new string. */
char *ci_utf8_sanitize(const uint8_t *data, size_t len, size_t *ret_len);

/* Writes all of buf to fd, retrying on EINTR and short writes. */
ci_status ci_write_all(int fd, const void *buf, size_t len);

/* Base64 (RFC 4648). An alphabet is also a decode flag: a decoder given
 * CI_B64_STD | CI_B64_URL accepts either, even mixed in one string. */
enum ci_b64_alphabet {
    CI_B64_STD = 1u << 0, /* '+' and '/' (section 4) */
    CI_B64_URL = 1u << 1, /* '-' and '_' (section 5) */
};
/* Padding rules for the decoders; without either, padding is optional. */
#define CI_B64_PAD_REQUIRED (1u << 2) /* the input length is a multiple of 4 */
#define CI_B64_PAD_FORBIDDEN (1u << 3) /* no '=' at all */

/* Encodes len bytes of data in alphabet a, with '=' padding to a multiple of
 * 4 characters when pad is set. Returns a malloc'd NUL-terminated string and
 * its length in *ret_len (which may be NULL); NULL when out of memory. */
char *ci_base64_encode(const void *data, size_t len, enum ci_b64_alphabet a, bool pad,
                       size_t *ret_len);

/* Decodes len characters of in (no NUL needed) under flags into out, which
 * holds out_cap bytes. Padding, when present, is one or two '=' that complete
 * the last group of 4; leftover bits in the last character are ignored, as
 * most decoders do. CI_ERR_INVALID for a character outside the alphabets,
 * misplaced or missing padding, or an impossible length (4n+1 characters);
 * CI_ERR_LIMIT when the result would exceed out_cap. Writes nothing to out
 * or *ret_len on failure. */
ci_status ci_base64_decode_into(const char *in, size_t len, unsigned flags, uint8_t *out,
                                size_t out_cap, size_t *ret_len);

/* Same, into a new malloc'd buffer of exactly *ret_len bytes; *ret is NULL
 * when the result is empty (as protobuf-c leaves empty bytes). CI_ERR_NOMEM
 * when allocation fails. */
ci_status ci_base64_decode(const char *in, size_t len, unsigned flags, uint8_t **ret,
                           size_t *ret_len);

#endif
