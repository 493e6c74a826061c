/* natsutil.c - a nats.c failure as one status and one sentence (natsutil.h). */
#include "nats/natsutil.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The server's store (or a stream's byte limit) is full: trying again
 * will not help until something expires. nats.c gives the JetStream code
 * for plain publishes only, so KV and object writes are known by text. */
static bool store_full(natsStatus ns, jsErrCode jerr, const char *why)
{
    if (jerr == JSStorageResourcesExceededErr || jerr == JSInsufficientResourcesErr)
        return true;
    return ns != NATS_OK && why &&
           (strstr(why, "insufficient storage") || strstr(why, "insufficient resources") ||
            strstr(why, "maximum bytes exceeded"));
}

ci_status ci_nats_fail(struct ci_error *err, natsStatus ns, jsErrCode jerr, const char *fmt, ...)
{
    natsStatus last_ns = NATS_OK;
    const char *last_text = nats_GetLastError(&last_ns);
    bool full = store_full(ns, jerr, last_ns == ns ? last_text : NULL);
    ci_status s = full                   ? CI_ERR_FULL
                  : ns == NATS_TIMEOUT   ? CI_ERR_TIMEOUT
                  : ns == NATS_NO_MEMORY ? CI_ERR_NOMEM
                                         : CI_ERR_NATS;
    if (!err)
        return s;
    va_list ap;
    va_start(ap, fmt);
    ci_error_setv(err, s, fmt, ap);
    va_end(ap);
    /* nats.c keeps a per-thread last error, which often says more (the
     * server's own text); it explains this failure only when its status is
     * this one. */
    const char *text = natsStatus_GetText(ns);
    natsStatus last = NATS_OK;
    const char *why = nats_GetLastError(&last);
    /* nats.c puts where it failed first, "(conn.c:2088): ": not for us. */
    if (why && why[0] == '(') {
        const char *end = strstr(why, "): ");
        if (end)
            why = end + 3;
    }
    bool more = last == ns && why && why[0] && strcmp(why, text) != 0;
    size_t used = strlen(err->msg);
    snprintf(err->msg + used, sizeof(err->msg) - used, ": %s%s%s", text, more ? ": " : "",
             more ? why : "");
    if (jerr) {
        used = strlen(err->msg);
        snprintf(err->msg + used, sizeof(err->msg) - used, " (JetStream error %d)", (int)jerr);
    }
    if (full) {
        used = strlen(err->msg);
        snprintf(err->msg + used, sizeof(err->msg) - used, ": the JetStream store is full");
    }
    return s;
}
