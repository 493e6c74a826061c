/* httpd.c - the executor's HTTP server over libmicrohttpd.
 *
 * MHD calls on_request several times for one request: once when the headers
 * are in (*state == NULL), once per piece of the body, and once more with no
 * data when the body is complete. A response can only be queued on the
 * first or the last call, so:
 *   - a Content-Length above the route's limit from a client that sent
 *     "Expect: 100-continue" (curl does for large bodies) is answered 413 on
 *     the first call: the client never sends the body;
 *   - any other body over the limit is read and dropped piece by piece and
 *     answered 413 at the end: a client still sending when the server closes
 *     would get a reset instead of the answer. A body beyond DISCARD_MAX
 *     (announced or sent) is not worth reading: the connection is closed.
 * The authorize callback is asked on the first call, before the size checks
 * (an unknown caller learns no limit): a refused request is answered then
 * when no body follows or the client waits for 100-continue, else once its
 * body has been dropped the same way; no byte of it is kept.
 * The handler runs on the last call, on the connection's own thread. */
#include "executor/httpd.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/log.h"
#include "core/util.h"

/* The executor's word that a request's code did not start (executor.proto). */
#define NOT_RUN_HEADER "Ci-Not-Run"
/* Bytes of an oversize body read and dropped so that its 413 arrives. */
#define DISCARD_MAX ((uint64_t)64 * 1024 * 1024)

struct ci_httpd {
    struct MHD_Daemon *daemon;
    struct ci_httpd_options opts;
    uint32_t idle_timeout_s;
    uint16_t port;
    MHD_socket quiesced_fd; /* closed after MHD_stop_daemon */
};

/* One request in progress. */
struct req_state {
    struct ci_buf body;
    size_t limit;
    size_t received; /* including dropped bytes */
    bool answered;   /* a response was queued on the first call */
    bool too_large;
    bool nomem;
    bool denied;     /* refused by authorize(): answered when the body is over */
    struct ci_httpd_response denial;
};

static const char *JSON_TYPE = "application/json";

void ci_httpd_error(struct ci_httpd_response *resp, unsigned status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* The message may quote user text: jansson escapes it, and replaces
     * what is not UTF-8 rather than fail. */
    char *clean = ci_utf8_sanitize((const uint8_t *)msg, strlen(msg), NULL);
    json_t *o = json_object();
    if (o && clean)
        json_object_set_new(o, "error", json_string(clean));
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    free(clean);
    free(resp->body);
    resp->status = status;
    resp->content_type = JSON_TYPE;
    resp->body = (uint8_t *)text;
    resp->body_len = text ? strlen(text) : 0;
}

/* Queues resp (taking its body) on the connection. */
static enum MHD_Result send_response(struct MHD_Connection *c, struct ci_httpd_response *resp)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(resp->body_len, resp->body ? resp->body : (void *)"",
                                        resp->body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(resp->body);
        resp->body = NULL;
        return MHD_NO;
    }
    resp->body = NULL;
    if (resp->content_type)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, resp->content_type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (resp->www_authenticate)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, resp->www_authenticate);
    if (resp->not_run)
        MHD_add_response_header(r, NOT_RUN_HEADER, "1");
    if (resp->retry_after_s) {
        char v[16];
        snprintf(v, sizeof(v), "%u", resp->retry_after_s);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    enum MHD_Result ok = MHD_queue_response(c, resp->status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *fmt,
                                  ...) __attribute__((format(printf, 3, 4)));
static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    struct ci_httpd_response resp = {0};
    ci_httpd_error(&resp, status, "%s", msg);
    return send_response(c, &resp);
}

static void size_text(char *out, size_t n, uint64_t bytes)
{
    if (bytes >= 1024 * 1024)
        snprintf(out, n, "%.1f MiB", (double)bytes / (1024.0 * 1024.0));
    else
        snprintf(out, n, "%llu bytes", (unsigned long long)bytes);
}

static void edge_reject(const struct ci_httpd *h, const char *method, const char *url,
                        unsigned status)
{
    if (h->opts.on_edge_reject)
        h->opts.on_edge_reject(h->opts.ctx, method, url, status);
}

static enum MHD_Result too_large(struct MHD_Connection *c, uint64_t got, size_t limit)
{
    char a[32], b[32];
    size_text(a, sizeof(a), got);
    size_text(b, sizeof(b), limit);
    return send_error(c, MHD_HTTP_CONTENT_TOO_LARGE,
                      "the request body is %s%s; the limit is %s (code, inputs and encoding "
                      "together)",
                      got > limit ? "" : "more than ", a, b);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **state_p)
{
    (void)version;
    struct ci_httpd *h = cls;
    struct req_state *st = *state_p;
    const char *ctype = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                    MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!st) {
        st = calloc(1, sizeof(*st));
        if (!st)
            return MHD_NO;
        *state_p = st;
        st->limit = h->opts.body_limit(h->opts.ctx, method, url, ctype ? ctype : "");
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                         MHD_HTTP_HEADER_EXPECT);
        bool waits = expect && strcasecmp(expect, "100-continue") == 0;
        unsigned long long n = 0;
        if (cl) {
            char *end = NULL;
            n = strtoull(cl, &end, 10);
            if (end == cl || *end != '\0') {
                st->answered = true;
                edge_reject(h, method, url, MHD_HTTP_BAD_REQUEST);
                return send_error(c, MHD_HTTP_BAD_REQUEST, "the Content-Length header is not a number");
            }
        }
        if (h->opts.authorize &&
            !h->opts.authorize(h->opts.ctx, method, url,
                               MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                           MHD_HTTP_HEADER_AUTHORIZATION),
                               &st->denial)) {
            /* Refused before a byte of the body is kept. A client that
             * waits for 100-continue, or sends no body, hears it now; one
             * that is already sending hears it once its body is dropped. */
            bool body = n > 0 || MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                             MHD_HTTP_HEADER_TRANSFER_ENCODING);
            if (!body || waits || n > DISCARD_MAX) {
                st->answered = true;
                return send_response(c, &st->denial);
            }
            st->denied = true;
            return MHD_YES;
        }
        if (cl) {
            if (n > st->limit && (waits || n > st->limit + DISCARD_MAX)) {
                st->answered = true;
                edge_reject(h, method, url, MHD_HTTP_CONTENT_TOO_LARGE);
                return too_large(c, n, st->limit);
            }
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        st->received += n;
        /* Answered already (or refused): dropped, up to a point. */
        if (st->answered || st->denied)
            return st->received > DISCARD_MAX ? MHD_NO : MHD_YES;
        if (st->too_large || st->received > st->limit) {
            st->too_large = true;
            ci_buf_release(&st->body);
            /* Someone streaming without end: stop reading. */
            return st->received > st->limit + DISCARD_MAX ? MHD_NO : MHD_YES;
        }
        if (ci_buf_append(&st->body, upload_data, n)) {
            ci_buf_release(&st->body);
            st->nomem = true; /* answered on the last call */
            st->answered = true;
        }
        return MHD_YES;
    }
    if (st->nomem) {
        struct ci_httpd_response nm = {.not_run = true};
        ci_httpd_error(&nm, MHD_HTTP_SERVICE_UNAVAILABLE,
                       "the executor ran out of memory reading the request");
        return send_response(c, &nm);
    }
    if (st->answered)
        return MHD_YES;
    if (st->denied) {
        st->answered = true;
        return send_response(c, &st->denial);
    }
    if (st->too_large) {
        edge_reject(h, method, url, MHD_HTTP_CONTENT_TOO_LARGE);
        return too_large(c, st->received, st->limit);
    }

    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    struct ci_httpd_request req = {
        .method = method,
        .path = url,
        .content_type = ctype ? ctype : "",
        .has_authorization = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                         MHD_HTTP_HEADER_AUTHORIZATION) != NULL,
        .body = st->body.data ? st->body.data : (const uint8_t *)"",
        .body_len = st->body.len,
        .client_fd = ci ? ci->connect_fd : -1,
        .conn = c,
    };
    struct ci_httpd_response resp = {0};
    h->opts.handler(h->opts.ctx, &req, &resp);
    ci_buf_release(&st->body);
    if (resp.status == 0)
        ci_httpd_error(&resp, MHD_HTTP_INTERNAL_SERVER_ERROR, "the executor gave no answer");
    /* Re-arms the idle timer, which a long handler may have turned off. */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)h->idle_timeout_s);
    return send_response(c, &resp);
}

void ci_httpd_set_idle_timeout(const struct ci_httpd_request *req, uint32_t seconds)
{
    if (req->conn)
        MHD_set_connection_option(req->conn, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned int)seconds);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **state_p,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    struct req_state *st = *state_p;
    if (!st)
        return;
    ci_buf_release(&st->body);
    free(st->denial.body); /* an answer never sent */
    free(st);
    *state_p = NULL;
}

/* MHD's own complaints (bind failures, malformed requests) as log lines. */
static void on_mhd_log(void *cls, const char *fm, va_list ap) __attribute__((format(printf, 2, 0)));
static void on_mhd_log(void *cls, const char *fm, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof(msg), fm, ap);
    size_t n = strlen(msg);
    while (n > 0 && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
        msg[--n] = '\0';
    ci_log(CI_LOG_DEBUG, "httpd.mhd", "message", msg, NULL);
}

ci_status ci_httpd_start(const struct ci_httpd_options *o, struct ci_httpd **ret,
                         struct ci_error *err)
{
    struct sockaddr_in v4;
    struct sockaddr_in6 v6;
    memset(&v4, 0, sizeof(v4));
    memset(&v6, 0, sizeof(v6));
    const struct sockaddr *sa = NULL;
    unsigned int flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                         MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (inet_pton(AF_INET, o->address, &v4.sin_addr) == 1) {
        v4.sin_family = AF_INET;
        v4.sin_port = htons(o->port);
        sa = (const struct sockaddr *)&v4;
    } else if (inet_pton(AF_INET6, o->address, &v6.sin6_addr) == 1) {
        v6.sin6_family = AF_INET6;
        v6.sin6_port = htons(o->port);
        sa = (const struct sockaddr *)&v6;
        flags |= MHD_USE_IPv6;
    } else {
        return ci_error_set(err, CI_ERR_INVALID,
                            "listen address '%.64s' is not a numeric IPv4 or IPv6 address",
                            o->address);
    }
    struct ci_httpd *h = calloc(1, sizeof(*h));
    if (!h)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    h->opts = *o;
    h->quiesced_fd = MHD_INVALID_SOCKET;
    h->idle_timeout_s = o->idle_timeout_s;
    h->daemon = MHD_start_daemon(
        flags, o->port, NULL, NULL, on_request, h,
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, sa,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)o->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)o->idle_timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
        MHD_OPTION_END);
    if (!h->daemon) {
        free(h);
        return ci_error_set(err, CI_ERR_SYS, "cannot listen on %.64s port %u (in use, or not "
                                             "an address of this machine?)",
                            o->address, o->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : o->port;
    *ret = h;
    return CI_OK;
}

uint16_t ci_httpd_port(const struct ci_httpd *h) { return h->port; }

unsigned ci_httpd_connections(struct ci_httpd *h)
{
    const union MHD_DaemonInfo *di =
        MHD_get_daemon_info(h->daemon, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return di ? di->num_connections : 0;
}

void ci_httpd_quiesce(struct ci_httpd *h)
{
    if (!h)
        return;
    if (h->quiesced_fd == MHD_INVALID_SOCKET)
        h->quiesced_fd = MHD_quiesce_daemon(h->daemon);
}

void ci_httpd_stop(struct ci_httpd *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->daemon);
    /* The listening socket is ours after a quiesce, once MHD has stopped. */
    if (h->quiesced_fd != MHD_INVALID_SOCKET)
        close(h->quiesced_fd);
    free(h);
}
