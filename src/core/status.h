/* status.h - the one status type of the project, and the error detail that
 * travels with it up to the place that logs it or puts it in a result. */
#ifndef CI_STATUS_H
#define CI_STATUS_H

#include <stdarg.h>

typedef enum {
    CI_OK = 0,
    CI_ERR_NOMEM,       /* allocation failed */
    CI_ERR_INVALID,     /* a client or the config sent something malformed */
    CI_ERR_LIMIT,       /* a limit was exceeded */
    CI_ERR_NOT_FOUND,   /* a key, object or file does not exist */
    CI_ERR_IO,          /* read/write on a file or pipe failed */
    CI_ERR_SYS,         /* a system call failed */
    CI_ERR_NATS,        /* the NATS server or connection failed */
    CI_ERR_HTTP,        /* an HTTP peer failed */
    CI_ERR_TIMEOUT,     /* a deadline passed */
    CI_ERR_CANCELLED,   /* somebody asked to stop */
    CI_ERR_UNSUPPORTED, /* this machine or build cannot do it */
    CI_ERR_INTEGRITY,   /* data does not match its digest or framing */
    CI_ERR_CONFLICT,    /* a newer write got there first (a revision check failed) */
    CI_ERR_FULL,        /* a store has no room left (JetStream's, or a stream's byte limit) */
} ci_status;

/* A fixed-size sentence that explains a failure. Filled where the failure is
 * understood; read by the caller that logs it or sends it to an agent. */
struct ci_error {
    char msg[512];
};

const char *ci_status_str(ci_status s);

/* Records a formatted message in err (which may be NULL) and returns s, so
 * that `return ci_error_set(err, CI_ERR_INVALID, "...")` reads naturally. */
ci_status ci_error_set(struct ci_error *err, ci_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
ci_status ci_error_setv(struct ci_error *err, ci_status s, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/* Same, with ": strerror(errno)" appended. */
ci_status ci_error_errno(struct ci_error *err, ci_status s, int errnum, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
