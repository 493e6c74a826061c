/* monitor.c - GET /metrics, /healthz and /readyz over libmicrohttpd.
 *
 * Why libmicrohttpd rather than a poll() loop of our own: it is already a
 * dependency (the executor serves /execute with it), and HTTP parsing
 * (pipelining, partial reads, keep-alive, header limits, slow clients) is
 * exactly the kind of code not to write twice. One internal polling thread
 * serves every connection; answers are rendered on that thread, which is
 * cheap: a few kilobytes from atomics.
 *
 * We bind the socket ourselves (close-on-exec, SO_REUSEADDR) and hand it to
 * MHD, so that a bind error is reported in our words and port 0 works.
 * MHD's own error log is off: every line on stderr is one of our JSON lines. */
#include "monitor/monitor.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/util.h"

#define MAX_CONNECTIONS 16
#define IDLE_TIMEOUT_S 10
#define CONNECTION_MEMORY 16384 /* per connection: request line and headers */
#define WHY_SIZE 256

struct ci_monitor {
    struct MHD_Daemon *daemon;
    struct ci_monitor_options opts;
    char address[80];
};

static const char *TEXT = "text/plain; charset=utf-8";
static const char *PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8";

/* ---- address ---------------------------------------------------------- */

/* "IPv4:port" or "[IPv6]:port" into a socket address. */
static ci_status parse_addr(const char *addr, struct sockaddr_storage *ret, socklen_t *ret_len,
                            struct ci_error *err)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr)
        return ci_error_set(err, CI_ERR_INVALID,
                            "metrics address '%.64s' is not host:port (e.g. 127.0.0.1:9464)", addr);
    char host[INET6_ADDRSTRLEN + 2];
    size_t hlen = (size_t)(colon - addr);
    const char *h = addr;
    bool v6 = addr[0] == '[';
    if (v6) {
        if (hlen < 3 || addr[hlen - 1] != ']')
            return ci_error_set(err, CI_ERR_INVALID,
                                "metrics address '%.64s': an IPv6 host goes in brackets, "
                                "e.g. [::1]:9464",
                                addr);
        h++;
        hlen -= 2;
    }
    if (hlen >= sizeof(host))
        return ci_error_set(err, CI_ERR_INVALID, "metrics address '%.64s': host too long", addr);
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    const char *p = colon + 1;
    unsigned long port = 0;
    size_t digits = 0;
    for (; p[digits] >= '0' && p[digits] <= '9' && digits < 6; digits++)
        port = port * 10 + (unsigned long)(p[digits] - '0');
    if (digits == 0 || p[digits] != '\0' || port > 65535)
        return ci_error_set(err, CI_ERR_INVALID,
                            "metrics address '%.64s': the port must be 0 to 65535", addr);
    memset(ret, 0, sizeof(*ret));
    if (!v6) {
        struct sockaddr_in *in = (struct sockaddr_in *)ret;
        in->sin_family = AF_INET;
        in->sin_port = htons((uint16_t)port);
        if (inet_pton(AF_INET, host, &in->sin_addr) != 1)
            return ci_error_set(err, CI_ERR_INVALID,
                                "metrics address '%.64s': the host must be a numeric IPv4 "
                                "address or an IPv6 address in brackets",
                                addr);
        *ret_len = sizeof(*in);
    } else {
        struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ret;
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host, &in6->sin6_addr) != 1)
            return ci_error_set(err, CI_ERR_INVALID,
                                "metrics address '%.64s': '%s' is not an IPv6 address", addr,
                                host);
        *ret_len = sizeof(*in6);
    }
    return CI_OK;
}

/* A listening socket on addr; its real address in out. */
static ci_status listen_on(const char *addr, bool any_port_if_taken, int *ret_fd, char *out,
                           size_t out_size, struct ci_error *err)
{
    struct sockaddr_storage sa;
    socklen_t len = 0;
    ci_status s = parse_addr(addr, &sa, &len, err);
    if (s)
        return s;
    CI_AUTOCLOSE int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "metrics address %s: socket", addr);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (sa.ss_family == AF_INET6)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    /* Taken shows at bind() or, when another process bound it a moment
     * before us (SO_REUSEADDR), at listen(). */
    int r = bind(fd, (struct sockaddr *)&sa, len);
    if (r == 0)
        r = listen(fd, 32);
    if (r < 0 && errno == EADDRINUSE && any_port_if_taken) {
        close(fd);
        fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0)
            return ci_error_errno(err, CI_ERR_SYS, errno, "metrics address %s: socket", addr);
        if (sa.ss_family == AF_INET6)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
        if (sa.ss_family == AF_INET)
            ((struct sockaddr_in *)&sa)->sin_port = 0;
        else
            ((struct sockaddr_in6 *)&sa)->sin6_port = 0;
        r = bind(fd, (struct sockaddr *)&sa, len);
        if (r == 0)
            r = listen(fd, 32);
    }
    if (r < 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "cannot listen on metrics address %s", addr);
    struct sockaddr_storage got;
    socklen_t glen = sizeof(got);
    if (getsockname(fd, (struct sockaddr *)&got, &glen) < 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "metrics address %s: getsockname", addr);
    char host[INET6_ADDRSTRLEN] = "?";
    if (got.ss_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)&got;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        snprintf(out, out_size, "%s:%u", host, ntohs(in->sin_port));
    } else {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&got;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        snprintf(out, out_size, "[%s]:%u", host, ntohs(in6->sin6_port));
    }
    *ret_fd = ci_steal_fd(&fd);
    return CI_OK;
}

/* ---- requests ---------------------------------------------------------- */

/* Queues a response whose body is copied (MUST_COPY: small bodies). */
static enum MHD_Result answer(struct MHD_Connection *c, unsigned status, const char *type,
                              const void *body, size_t len, bool head)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(head ? 0 : len, (void *)body,
                                                             MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result answer_text(struct MHD_Connection *c, unsigned status, const char *text,
                                   bool head)
{
    return answer(c, status, TEXT, text, strlen(text), head);
}

/* /healthz and /readyz: "ok" or "not ready: why". */
static enum MHD_Result answer_check(struct MHD_Connection *c, const struct ci_monitor *m,
                                    ci_monitor_check_fn fn, const char *ok_text, bool head)
{
    char why[WHY_SIZE] = "";
    if (!fn || fn(m->opts.closure, why, sizeof(why))) {
        char text[64];
        snprintf(text, sizeof(text), "%s\n", ok_text);
        return answer_text(c, MHD_HTTP_OK, text, head);
    }
    char text[WHY_SIZE + 32];
    snprintf(text, sizeof(text), "not %s: %s\n", ok_text, why[0] ? why : "no reason given");
    return answer_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, text, head);
}

static enum MHD_Result serve_metrics(struct MHD_Connection *c, const struct ci_monitor *m,
                                     bool head)
{
    CI_AUTOBUF struct ci_buf b = CI_BUF_INIT;
    if (ci_metrics_render(m->opts.metrics, &b))
        return answer_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n", head);
    return answer(c, MHD_HTTP_OK, PROMETHEUS, b.data ? (void *)b.data : "", b.len, head);
}

static enum MHD_Result serve_live(struct MHD_Connection *c, const struct ci_monitor *m, bool head)
{
    return answer_check(c, m, m->opts.live, "ok", head);
}

static enum MHD_Result serve_ready(struct MHD_Connection *c, const struct ci_monitor *m, bool head)
{
    return answer_check(c, m, m->opts.ready, "ready", head);
}

/* The endpoints; any other path is a 404. */
static const struct route {
    const char *path;
    enum MHD_Result (*serve)(struct MHD_Connection *c, const struct ci_monitor *m, bool head);
} routes[] = {
    {"/metrics", serve_metrics},
    {"/healthz", serve_live},
    {"/readyz", serve_ready},
};

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **state)
{
    (void)version;
    (void)upload_data;
    struct ci_monitor *m = cls;
    /* Every answer is queued on the first call, when the headers are in: a
     * body, if any, is never read (MHD drops it and closes). */
    if (*state != NULL) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    *state = (void *)1;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return answer_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET and HEAD\n", false);
    bool head = strcmp(method, "HEAD") == 0;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (strcmp(url, routes[i].path) == 0)
            return routes[i].serve(c, m, head);
    return answer_text(c, MHD_HTTP_NOT_FOUND, "not found: try /metrics, /healthz or /readyz\n",
                       head);
}

/* ---- public ------------------------------------------------------------ */

ci_status ci_monitor_start(const struct ci_monitor_options *o, struct ci_monitor **ret,
                           struct ci_error *err)
{
    if (!o || !o->addr || !o->metrics)
        return ci_error_set(err, CI_ERR_INVALID, "monitor: missing argument");
    CI_AUTOFREE struct ci_monitor *m = calloc(1, sizeof(*m));
    if (!m)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    m->opts = *o;
    CI_AUTOCLOSE int fd = -1;
    ci_status s = listen_on(o->addr, o->any_port_if_taken, &fd, m->address, sizeof(m->address),
                            err);
    if (s)
        return s;
    m->daemon = MHD_start_daemon(
        MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_request, m,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int)MAX_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)IDLE_TIMEOUT_S,
        MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)CONNECTION_MEMORY, MHD_OPTION_END);
    if (!m->daemon)
        return ci_error_set(err, CI_ERR_SYS, "cannot start the HTTP server on %s", o->addr);
    ci_steal_fd(&fd); /* the daemon's now: MHD_stop_daemon closes it */
    *ret = CI_STEAL(&m);
    return CI_OK;
}

const char *ci_monitor_address(const struct ci_monitor *m) { return m ? m->address : ""; }

void ci_monitor_stop(struct ci_monitor *m)
{
    if (!m)
        return;
    /* Joins the polling thread and closes the listening socket. */
    MHD_stop_daemon(m->daemon);
    free(m);
}
