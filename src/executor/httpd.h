/* httpd.h - the executor's HTTP server (libmicrohttpd): the only module that
 * sees MHD. It reads a request's body up to a limit the caller chooses per
 * route, answers what is wrong at the edge itself (413 for a body over the
 * limit, 400 for a malformed request) with a JSON error body, and hands
 * every other complete request to one handler.
 *
 * Threads: one thread per connection, so a handler may block for as long as
 * a task runs; the number of connections is bounded, in all and per client
 * address.
 *
 * Callers that have not shown who they are cannot hold connections: a
 * connection is *trusted* once a request on it passed authorize() with
 * trust (a valid token, or no check configured). Until then it lives at most
 * UNTRUSTED_S seconds from its accept, however slowly it trickles (the
 * idle timer restarts on every byte), each answer on it closes it, and a
 * refused request's body is dropped only up to 1 MiB. */
#ifndef CI_HTTPD_H
#define CI_HTTPD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

struct ci_httpd;

/* A complete request, borrowed for the handler's call. */
struct ci_httpd_request {
    const char *method;
    const char *path;         /* without the query string */
    const char *content_type; /* "" when absent */
    bool has_authorization;   /* an Authorization header came (its value is never logged) */
    const uint8_t *body;
    size_t body_len;
    int client_fd;            /* to notice a client that went away; -1 if unknown */
    void *conn;               /* private to httpd.c */
};

/* What the handler answers. body is malloc'd (or NULL) and taken over. */
struct ci_httpd_response {
    unsigned status;
    const char *content_type; /* static string */
    uint8_t *body;
    size_t body_len;
    uint32_t retry_after_s;   /* 0 = no Retry-After header */
    const char *www_authenticate; /* static string; NULL = no WWW-Authenticate header */
    /* Adds "Ci-Not-Run: 1": the request's code did not start and will not
     * (schemas/ci/v1/executor.proto); a worker may send it again. */
    bool not_run;
};

typedef void (*ci_httpd_handler)(void *ctx, const struct ci_httpd_request *req,
                                 struct ci_httpd_response *resp);
/* The largest body accepted for a request, decided from its first line and
 * Content-Type before any of the body is read. */
typedef size_t (*ci_httpd_body_limit)(void *ctx, const char *method, const char *path,
                                      const char *content_type);
/* Decides from a request's first line and its Authorization header (NULL
 * when absent; borrowed for the call) whether it may go on, before any of
 * the body is read. Returns true, or false with resp filled (a 401): that
 * answer is sent without reading the body into memory, and the handler
 * never sees the request. *ret_trusted (false on entry): the caller proved
 * who it is (or no check is configured), as opposed to a route open to
 * anyone; it makes the connection trusted (above). */
typedef bool (*ci_httpd_authorize)(void *ctx, const char *method, const char *path,
                                   const char *authorization, bool *ret_trusted,
                                   struct ci_httpd_response *resp);

struct ci_httpd_options {
    const char *address;       /* numeric IPv4 or IPv6 address to listen on */
    uint16_t port;             /* 0 = any free port (see ci_httpd_port) */
    uint32_t max_connections;
    uint32_t max_connections_per_ip; /* 0 = max_connections */
    uint32_t idle_timeout_s;   /* a connection silent this long while sending its
                                * request, or while reading the answer, is closed */
    ci_httpd_handler handler;
    ci_httpd_body_limit body_limit;
    ci_httpd_authorize authorize; /* NULL = every request goes on, trusted */
    /* Told of every request answered here, at the edge, without reaching
     * the handler (413, 400); may be NULL. */
    void (*on_edge_reject)(void *ctx, const char *method, const char *path, unsigned status);
    void *ctx;
};

/* Binds and starts serving on threads of its own. */
ci_status ci_httpd_start(const struct ci_httpd_options *o, struct ci_httpd **ret,
                         struct ci_error *err);
/* The port it listens on (useful after port 0). */
uint16_t ci_httpd_port(const struct ci_httpd *h);
/* Connections open now (requests in progress, answers being sent, idle
 * keep-alive). */
unsigned ci_httpd_connections(struct ci_httpd *h);
/* Stops accepting new connections (they are refused from now on); requests
 * in progress, and kept-alive connections, go on. */
void ci_httpd_quiesce(struct ci_httpd *h);
/* Stops serving: waits for every handler to return, closes every
 * connection, frees h. Accepts NULL. */
void ci_httpd_stop(struct ci_httpd *h);

/* A response with the JSON body {"error": text}. */
void ci_httpd_error(struct ci_httpd_response *resp, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Sets the idle timeout of the connection of a running handler. A handler
 * that will block for long (running a task) sets 0 (none) first, so that
 * the connection is not closed under it. */
void ci_httpd_set_idle_timeout(const struct ci_httpd_request *req, uint32_t seconds);

#endif
