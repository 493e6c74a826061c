/* http.h - the worker's HTTP client (libcurl), for the cloudrun provider and
 * its ID tokens. The only module that sees CURL or CURLcode.
 *
 * One client is shared by every slot of a worker. It keeps a pool of idle
 * connections (HTTP keep-alive; HTTP/2 over TLS where the server offers it)
 * that any thread may pick up, and shares its DNS cache and TLS sessions
 * between them. Requests are synchronous and may run on many threads at once.
 *
 * Nothing here logs, and no error message ever holds a request header: the
 * Authorization header carries a token. */
#ifndef CI_HTTP_H
#define CI_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/util.h"

struct ci_http;

struct ci_http_options {
    const char *ca_file;          /* NULL or "" = the system's CA bundle */
    uint32_t connect_timeout_ms;  /* TCP + TLS handshake */
    uint32_t max_idle;            /* idle connections kept for reuse */
};

/* Creates a client (and initialises libcurl once per process). */
ci_status ci_http_new(const struct ci_http_options *o, struct ci_http **ret,
                      struct ci_error *err);
/* Frees the client and closes its idle connections. No request may be
 * running. Accepts NULL. */
void ci_http_free(struct ci_http *h);

struct ci_http_request {
    const char *method;           /* "GET" or "POST" */
    const char *url;
    const char *const *headers;   /* NULL-terminated "Name: value" lines, or NULL */
    const uint8_t *body;          /* POST body (borrowed), may be NULL with body_len 0 */
    size_t body_len;
    uint32_t timeout_ms;          /* the whole exchange; 0 = no limit */
    size_t max_response_bytes;    /* a longer body is CI_ERR_LIMIT */
    /* Asked about once a second and whenever data moves; returning true
     * stops the exchange with CI_ERR_CANCELLED. NULL = never. */
    bool (*should_abort)(void *arg);
    void *abort_arg;
    /* Send the request at most once. libcurl sends a request again on a
     * fresh connection when a reused one closes before any answer; for a
     * request that must not run twice that is refused (CI_ERR_HTTP). */
    bool no_resend;
    /* NULL, or set by every call, whatever it returns: whether the request
     * went out on a connection (so the server may have received it). False
     * means it never left: no address, no connection, no TLS handshake. */
    bool *ret_sent;
    /* NULL, or the name of one response header to keep (its value is put
     * in ci_http_response.kept_header). */
    const char *keep_header;
};

struct ci_http_response {
    long status;                  /* the HTTP status code */
    char content_type[128];       /* "" when absent */
    char kept_header[64];         /* the value of request.keep_header; "" when absent */
    struct ci_buf body;
};

void ci_http_response_release(struct ci_http_response *r);

/* Performs one request. CI_OK when an HTTP answer arrived, whatever its
 * status; otherwise nothing is written to ret and:
 *   CI_ERR_HTTP       the server could not be reached, or the connection
 *                     broke (req->ret_sent tells which);
 *   CI_ERR_TIMEOUT    req->timeout_ms passed;
 *   CI_ERR_CANCELLED  should_abort returned true;
 *   CI_ERR_LIMIT      the answer was longer than max_response_bytes;
 *   CI_ERR_INVALID    the request cannot work: a bad URL, a CA file that
 *                     cannot be read, a certificate the CA does not vouch for;
 *   CI_ERR_NOMEM.
 * err says what happened, naming the URL but never a header. */
ci_status ci_http_do(struct ci_http *h, const struct ci_http_request *req,
                     struct ci_http_response *ret, struct ci_error *err);

/* Appends s to b with every byte outside [A-Za-z0-9-._~] %-encoded (for a
 * query string value). */
ci_status ci_http_urlencode(struct ci_buf *b, const char *s);

/* Milliseconds to wait before try number `retry` (1 = the first retry):
 * exponential from initial_ms, doubling each time, capped at max_ms, with
 * "equal jitter": half of it fixed, the other half scaled by rnd (any 32-bit
 * random value), so that workers that failed together do not come back
 * together. Deterministic in its arguments. */
uint32_t ci_http_backoff_ms(uint32_t retry, uint32_t initial_ms, uint32_t max_ms, uint32_t rnd);

/* Whether an answer says that the request was not run, so that it may be
 * sent again. not_run: the answer carries ci-executor's "Ci-Not-Run: 1"
 * (schemas/ci/v1/executor.proto), its word that the code did not start.
 *   408 (the request did not arrive in time) and 429 (busy): never run.
 *   502 and 503: the executor's own 503 carries the marker; without it the
 *     answer is a front's (no instance to give it to, or one that failed),
 *     which is taken as "not run" too - a front that answers so after its
 *     instance died mid-run makes the code run twice (docs/cloudrun.md).
 *   Any other 5xx only with the marker: without it the code may have run.
 *   409 (the executor runs another copy of this task) never: once that
 *     copy ends, the same request would run the code again. */
bool ci_http_status_retryable(long status, bool not_run);

#endif
