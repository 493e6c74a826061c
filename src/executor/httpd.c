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
 * when no body follows, the client waits for 100-continue or the body is
 * over UNTRUSTED_DISCARD_MAX, else once its body has been dropped the same
 * way; no byte of it is kept, and no more than UNTRUSTED_DISCARD_MAX of it
 * is read.
 * The handler runs on the last call, on the connection's own thread.
 *
 * Untrusted connections (httpd.h): MHD tells us of each connection
 * (MHD_OPTION_NOTIFY_CONNECTION); a watchdog thread shuts down the socket of
 * one that is still untrusted UNTRUSTED_S after its accept, and MHD's own
 * thread then finds it closed. MHD has no bound of its own on the time a
 * request may take to arrive: its timeout is an idle one. MHD notifies the
 * close before it closes the socket, and the list is locked across both
 * the notification and the shutdown, so the watchdog never touches an fd
 * that has been reused. */
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
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/util.h"

/* The executor's word that a request's code did not start (executor.proto). */
#define NOT_RUN_HEADER "Ci-Not-Run"
/* Bytes of an oversize body read and dropped so that its 413 arrives. */
#define DISCARD_MAX ((uint64_t)64 * 1024 * 1024)
/* ...and of the body of a request on an untrusted connection (a 401). */
#define UNTRUSTED_DISCARD_MAX ((uint64_t)1024 * 1024)
/* Seconds an untrusted connection may live (see httpd.h). */
#define UNTRUSTED_S 10
#define WATCH_MS 500

/* One open connection (its MHD socket context). */
struct conn {
    MHD_socket fd;
    int64_t accepted_ms;
    bool trusted;
    bool cut; /* shut down by the watchdog */
    struct conn *prev, *next;
};

struct ci_httpd {
    struct MHD_Daemon *daemon;
    struct ci_httpd_options opts;
    uint32_t idle_timeout_s;
    uint16_t port;
    MHD_socket quiesced_fd; /* closed after MHD_stop_daemon */

    pthread_mutex_t conns_lock; /* the list, and each conn's flags */
    pthread_cond_t wake;
    struct conn *conns;
    bool stopping;
    bool watchdog_started;
    pthread_t watchdog;
};

/* One request in progress. */
struct req_state {
    struct ci_buf body;
    size_t limit;
    size_t received; /* including dropped bytes */
    uint64_t drop_max; /* bytes dropped at most once answered or refused */
    bool answered;   /* a response was queued on the first call */
    bool too_large;
    bool nomem;
    bool denied;     /* refused by authorize(): answered when the body is over */
    bool untrusted;  /* the connection is: every answer closes it */
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

/* The connection's record, or NULL. */
static struct conn *conn_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* Whether the connection is untrusted; trust = true makes it trusted. */
static bool untrusted(struct ci_httpd *h, struct MHD_Connection *c, bool trust)
{
    struct conn *k = conn_of(c);
    if (!k)
        return false;
    pthread_mutex_lock(&h->conns_lock);
    if (trust)
        k->trusted = true;
    bool u = !k->trusted;
    pthread_mutex_unlock(&h->conns_lock);
    return u;
}

/* Queues resp (taking its body) on the connection; close: then close it
 * (an answer on an untrusted connection). */
static enum MHD_Result send_response(struct MHD_Connection *c, struct ci_httpd_response *resp,
                                     bool close)
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
    if (close)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    if (resp->retry_after_s) {
        char v[16];
        snprintf(v, sizeof(v), "%u", resp->retry_after_s);
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, v);
    }
    enum MHD_Result ok = MHD_queue_response(c, resp->status, r);
    MHD_destroy_response(r);
    return ok;
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

static enum MHD_Result too_large(struct MHD_Connection *c, uint64_t got, size_t limit,
                                  bool close)
{
    char a[32], b[32];
    size_text(a, sizeof(a), got);
    size_text(b, sizeof(b), limit);
    struct ci_httpd_response resp = {0};
    ci_httpd_error(&resp, MHD_HTTP_CONTENT_TOO_LARGE,
                   "the request body is %s%s; the limit is %s (code, inputs and encoding "
                   "together)",
                   got > limit ? "" : "more than ", a, b);
    return send_response(c, &resp, close);
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
        st->untrusted = untrusted(h, c, false);
        st->drop_max = st->untrusted ? UNTRUSTED_DISCARD_MAX : DISCARD_MAX;
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
                struct ci_httpd_response bad = {0};
                ci_httpd_error(&bad, MHD_HTTP_BAD_REQUEST,
                               "the Content-Length header is not a number");
                return send_response(c, &bad, st->untrusted);
            }
        }
        bool trusted = !h->opts.authorize;
        if (h->opts.authorize &&
            !h->opts.authorize(h->opts.ctx, method, url,
                               MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                           MHD_HTTP_HEADER_AUTHORIZATION),
                               &trusted, &st->denial)) {
            /* Refused before a byte of the body is kept. A client that
             * waits for 100-continue, or sends no body, hears it now; one
             * that is already sending hears it once its body is dropped,
             * unless it is too long to be worth reading. */
            bool body = n > 0 || MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                             MHD_HTTP_HEADER_TRANSFER_ENCODING);
            st->untrusted = untrusted(h, c, false);
            st->drop_max = st->untrusted ? UNTRUSTED_DISCARD_MAX : DISCARD_MAX;
            if (!body || waits || n > st->drop_max) {
                st->answered = true;
                return send_response(c, &st->denial, st->untrusted);
            }
            st->denied = true;
            return MHD_YES;
        }
        st->untrusted = untrusted(h, c, trusted);
        st->drop_max = st->untrusted ? UNTRUSTED_DISCARD_MAX : DISCARD_MAX;
        if (cl) {
            /* n - limit, not limit + drop_max: a limit of SIZE_MAX
             * (body_limit's cap) must not wrap around. An untrusted
             * connection (/healthz is open to anyone) drops 1 MiB at most. */
            if (n > st->limit && (waits || n - st->limit > st->drop_max)) {
                st->answered = true;
                edge_reject(h, method, url, MHD_HTTP_CONTENT_TOO_LARGE);
                return too_large(c, n, st->limit, st->untrusted);
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
            return st->received > st->drop_max ? MHD_NO : MHD_YES;
        if (st->too_large || st->received > st->limit) {
            st->too_large = true;
            ci_buf_release(&st->body);
            /* Someone streaming without end: stop reading. */
            return st->received - st->limit > st->drop_max ? MHD_NO : MHD_YES;
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
        return send_response(c, &nm, st->untrusted);
    }
    if (st->answered)
        return MHD_YES;
    if (st->denied) {
        st->answered = true;
        return send_response(c, &st->denial, st->untrusted);
    }
    if (st->too_large) {
        edge_reject(h, method, url, MHD_HTTP_CONTENT_TOO_LARGE);
        return too_large(c, st->received, st->limit, st->untrusted);
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
    return send_response(c, &resp, st->untrusted);
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

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode toe)
{
    struct ci_httpd *h = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        struct conn *k = calloc(1, sizeof(*k));
        if (!k || !ci) {
            free(k); /* unwatched: MHD's idle timeout is all it gets */
            return;
        }
        k->fd = ci->connect_fd;
        k->accepted_ms = ci_mono_ms();
        pthread_mutex_lock(&h->conns_lock);
        k->next = h->conns;
        if (h->conns)
            h->conns->prev = k;
        h->conns = k;
        pthread_mutex_unlock(&h->conns_lock);
        *socket_context = k;
        return;
    }
    struct conn *k = *socket_context;
    if (!k)
        return;
    pthread_mutex_lock(&h->conns_lock);
    if (k->prev)
        k->prev->next = k->next;
    else
        h->conns = k->next;
    if (k->next)
        k->next->prev = k->prev;
    pthread_mutex_unlock(&h->conns_lock);
    free(k);
    *socket_context = NULL;
}

/* Shuts down the connections still untrusted UNTRUSTED_S after their accept. */
static void *watchdog_main(void *arg)
{
    struct ci_httpd *h = arg;
    pthread_mutex_lock(&h->conns_lock);
    while (!h->stopping) {
        int64_t now = ci_mono_ms();
        for (struct conn *k = h->conns; k; k = k->next)
            if (!k->trusted && !k->cut && now - k->accepted_ms >= UNTRUSTED_S * 1000) {
                shutdown(k->fd, SHUT_RDWR);
                k->cut = true;
            }
        struct timespec ts;
        ci_mono_deadline(&ts, WATCH_MS);
        pthread_cond_timedwait(&h->wake, &h->conns_lock, &ts);
    }
    pthread_mutex_unlock(&h->conns_lock);
    return NULL;
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
    pthread_mutex_init(&h->conns_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&h->wake, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&h->watchdog, NULL, watchdog_main, h) != 0) {
        ci_httpd_stop(h);
        return ci_error_set(err, CI_ERR_SYS, "cannot start the HTTP server's watchdog thread");
    }
    h->watchdog_started = true;
    unsigned int per_ip = o->max_connections_per_ip ? o->max_connections_per_ip
                                                    : o->max_connections;
    h->daemon = MHD_start_daemon(
        flags, o->port, NULL, NULL, on_request, h,
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, NULL,
        MHD_OPTION_SOCK_ADDR, sa,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)o->max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)o->idle_timeout_s,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(64 * 1024),
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
        MHD_OPTION_NOTIFY_CONNECTION, on_connection, h,
        MHD_OPTION_END);
    if (!h->daemon) {
        ci_httpd_stop(h);
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
    if (h->quiesced_fd == MHD_INVALID_SOCKET) {
        h->quiesced_fd = MHD_quiesce_daemon(h->daemon);
        /* Still listening, nobody would accept: a client's connection would
         * wait in the backlog, send its request, and be reset at exit - to
         * a worker, a request that broke after it was sent. Shut down, the
         * socket refuses new connections at once (a worker tries again:
         * nothing was sent). It stays open until MHD has stopped. */
        if (h->quiesced_fd != MHD_INVALID_SOCKET)
            shutdown(h->quiesced_fd, SHUT_RDWR);
    }
}

void ci_httpd_stop(struct ci_httpd *h)
{
    if (!h)
        return;
    if (h->daemon)
        MHD_stop_daemon(h->daemon); /* every connection is closed, and notified */
    /* The listening socket is ours after a quiesce, once MHD has stopped. */
    if (h->quiesced_fd != MHD_INVALID_SOCKET)
        close(h->quiesced_fd);
    if (h->watchdog_started) {
        pthread_mutex_lock(&h->conns_lock);
        h->stopping = true;
        pthread_cond_signal(&h->wake);
        pthread_mutex_unlock(&h->conns_lock);
        pthread_join(h->watchdog, NULL);
    }
    pthread_cond_destroy(&h->wake);
    pthread_mutex_destroy(&h->conns_lock);
    free(h);
}
