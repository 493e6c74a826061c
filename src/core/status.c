/* status.c - the names of ci_status and the error sentence that travels
 * with one (ci_error_set, ci_error_errno; status.h). */
#include "core/status.h"

#include <stdio.h>
#include <string.h>

const char *ci_status_str(ci_status s)
{
    switch (s) {
    case CI_OK: return "ok";
    case CI_ERR_NOMEM: return "out of memory";
    case CI_ERR_INVALID: return "invalid";
    case CI_ERR_LIMIT: return "limit exceeded";
    case CI_ERR_NOT_FOUND: return "not found";
    case CI_ERR_IO: return "i/o error";
    case CI_ERR_SYS: return "system error";
    case CI_ERR_NATS: return "nats error";
    case CI_ERR_HTTP: return "http error";
    case CI_ERR_TIMEOUT: return "timeout";
    case CI_ERR_CANCELLED: return "cancelled";
    case CI_ERR_UNSUPPORTED: return "unsupported";
    case CI_ERR_INTEGRITY: return "integrity error";
    case CI_ERR_CONFLICT: return "conflict";
    case CI_ERR_FULL: return "store full";
    }
    return "unknown status";
}

ci_status ci_error_setv(struct ci_error *err, ci_status s, const char *fmt, va_list ap)
{
    if (err) {
        int n = vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
        if (n < 0)
            err->msg[0] = '\0';
    }
    return s;
}

ci_status ci_error_set(struct ci_error *err, ci_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ci_error_setv(err, s, fmt, ap);
    va_end(ap);
    return s;
}

ci_status ci_error_errno(struct ci_error *err, ci_status s, int errnum, const char *fmt, ...)
{
    if (!err)
        return s;
    va_list ap;
    va_start(ap, fmt);
    ci_error_setv(err, s, fmt, ap);
    va_end(ap);
    size_t used = strlen(err->msg);
    char ebuf[128];
    const char *e = strerror_r(errnum, ebuf, sizeof(ebuf));
    snprintf(err->msg + used, sizeof(err->msg) - used, ": %s", e);
    return s;
}
