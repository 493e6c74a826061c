/* http.c - the HTTP client over libcurl's easy interface.
 *
 * The connection pool. libcurl keeps a connection alive inside the easy
 * handle that used it, so the pool is a list of idle easy handles: a request
 * takes one (with whatever connection it holds to the service), resets its
 * options and gives it back afterwards, so a connection opened by one slot
 * is reused by whichever slot asks next. A CURLSH shares the DNS cache and
 * the TLS session cache between all of them (with a lock per kind of data).
 * We do not put the connection cache itself in the share: in the libcurl of
 * Debian 12 (7.88) a shared connection cache is not thread-safe (curl's
 * KNOWN_BUGS "A shared connection cache is not thread-safe"), and handles
 * that each keep their own connection give the same reuse without the race.
 *
 * Cancellation: libcurl calls the progress callback about once a second
 * even when no data moves, and whenever data does; returning non-zero there
 * ends the transfer at once.
 *
 * Sent or not: libcurl calls the pre-request callback once a connection is
 * ready (TCP, TLS), right before it sends the request; a failure before
 * that call never reached the server. libcurl also calls it again when it
 * retries a request on a fresh connection by itself (a reused connection
 * that closed before any answer): for no_resend requests that second call
 * aborts, since the server may have run the first. */
#include "provider/http.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define USER_AGENT "ci-worker/0.1"
/* An idle connection older than this is not reused: below the 30 s after
 * which ci-executor drops an idle client, so that a request rarely meets a
 * connection the server is closing (which no_resend would not send again). */
#define MAX_IDLE_AGE_S 20

struct pooled {
    CURL *easy;
    struct pooled *next;
};

struct ci_http {
    CURLSH *share;
    pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
    pthread_mutex_t pool_lock;
    struct pooled *idle;
    uint32_t n_idle;
    uint32_t max_idle;
    char *ca_file;
    uint32_t connect_timeout_ms;
};

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static CURLcode g_curl_init_result = CURLE_FAILED_INIT;

/* curl_global_init is not thread-safe in every build: once per process, and
 * never undone (other threads of the process may still use libcurl). */
static void curl_once(void) { g_curl_init_result = curl_global_init(CURL_GLOBAL_DEFAULT); }

static void share_lock(CURL *handle, curl_lock_data data, curl_lock_access access, void *userp)
{
    (void)handle;
    (void)access;
    struct ci_http *h = userp;
    if ((int)data >= 0 && data < CURL_LOCK_DATA_LAST)
        pthread_mutex_lock(&h->share_locks[data]);
}

static void share_unlock(CURL *handle, curl_lock_data data, void *userp)
{
    (void)handle;
    struct ci_http *h = userp;
    if ((int)data >= 0 && data < CURL_LOCK_DATA_LAST)
        pthread_mutex_unlock(&h->share_locks[data]);
}

ci_status ci_http_new(const struct ci_http_options *o, struct ci_http **ret,
                      struct ci_error *err)
{
    pthread_once(&g_curl_once, curl_once);
    if (g_curl_init_result != CURLE_OK)
        return ci_error_set(err, CI_ERR_UNSUPPORTED, "libcurl could not be initialised: %s",
                            curl_easy_strerror(g_curl_init_result));
    struct ci_http *h = calloc(1, sizeof(*h));
    if (!h)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&h->share_locks[i], NULL);
    pthread_mutex_init(&h->pool_lock, NULL);
    h->max_idle = o->max_idle;
    h->connect_timeout_ms = o->connect_timeout_ms;
    if (o->ca_file && o->ca_file[0] && !(h->ca_file = strdup(o->ca_file))) {
        ci_http_free(h);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    }
    h->share = curl_share_init();
    if (!h->share) {
        ci_http_free(h);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory creating the HTTP client");
    }
    CURLSHcode sc = CURLSHE_OK;
    if (!sc)
        sc = curl_share_setopt(h->share, CURLSHOPT_LOCKFUNC, share_lock);
    if (!sc)
        sc = curl_share_setopt(h->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    if (!sc)
        sc = curl_share_setopt(h->share, CURLSHOPT_USERDATA, h);
    if (!sc)
        sc = curl_share_setopt(h->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    if (!sc)
        sc = curl_share_setopt(h->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    if (sc) {
        ci_http_free(h);
        return ci_error_set(err, CI_ERR_UNSUPPORTED, "libcurl share setup failed: %s",
                            curl_share_strerror(sc));
    }
    *ret = h;
    return CI_OK;
}

void ci_http_free(struct ci_http *h)
{
    if (!h)
        return;
    /* Easy handles first: they hold references to the share. */
    for (struct pooled *p = h->idle, *next; p; p = next) {
        next = p->next;
        curl_easy_cleanup(p->easy);
        free(p);
    }
    if (h->share)
        curl_share_cleanup(h->share);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&h->share_locks[i]);
    pthread_mutex_destroy(&h->pool_lock);
    free(h->ca_file);
    free(h);
}

void ci_http_response_release(struct ci_http_response *r)
{
    if (!r)
        return;
    ci_buf_release(&r->body);
    memset(r, 0, sizeof(*r));
}

/* An idle handle from the pool (with its live connection), or a new one. */
static CURL *pool_take(struct ci_http *h)
{
    pthread_mutex_lock(&h->pool_lock);
    struct pooled *p = h->idle;
    if (p) {
        h->idle = p->next;
        h->n_idle--;
    }
    pthread_mutex_unlock(&h->pool_lock);
    if (!p)
        return curl_easy_init();
    CURL *easy = p->easy;
    free(p);
    return easy;
}

static void pool_give(struct ci_http *h, CURL *easy)
{
    struct pooled *p = malloc(sizeof(*p));
    pthread_mutex_lock(&h->pool_lock);
    if (p && h->n_idle < h->max_idle) {
        p->easy = easy;
        p->next = h->idle;
        h->idle = p;
        h->n_idle++;
        p = NULL;
        easy = NULL;
    }
    pthread_mutex_unlock(&h->pool_lock);
    free(p);
    if (easy)
        curl_easy_cleanup(easy);
}

struct xfer {
    struct ci_buf body;
    size_t max;
    bool too_large;
    bool nomem;
    bool (*should_abort)(void *arg);
    void *abort_arg;
    bool no_resend;
    unsigned sends;      /* pre-request calls: times the request went out */
    bool resend_refused;
    const char *keep_header;
    size_t keep_len;
    char kept[64];
};

static size_t on_write(char *data, size_t size, size_t n, void *userp)
{
    struct xfer *x = userp;
    size_t len = size * n;
    if (len > x->max || x->body.len > x->max - len) {
        x->too_large = true;
        return 0;
    }
    if (ci_buf_append(&x->body, data, len)) {
        x->nomem = true;
        return 0;
    }
    return len;
}

static int on_progress(void *userp, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    (void)ulnow;
    struct xfer *x = userp;
    return x->should_abort && x->should_abort(x->abort_arg) ? 1 : 0;
}

/* One header line of the answer ("Name: value\r\n", not NUL-terminated).
 * A new status line (an interim 100 Continue before the real answer)
 * forgets what an earlier one said. */
static size_t on_header(char *data, size_t size, size_t n, void *userp)
{
    struct xfer *x = userp;
    size_t len = size * n;
    if (len >= 5 && memcmp(data, "HTTP/", 5) == 0) {
        x->kept[0] = '\0';
    } else if (x->keep_header && len > x->keep_len &&
               strncasecmp(data, x->keep_header, x->keep_len) == 0 && data[x->keep_len] == ':') {
        size_t i = x->keep_len + 1, end = len;
        while (i < end && (data[i] == ' ' || data[i] == '\t'))
            i++;
        while (end > i && (data[end - 1] == '\r' || data[end - 1] == '\n' ||
                           data[end - 1] == ' ' || data[end - 1] == '\t'))
            end--;
        size_t v = end - i < sizeof(x->kept) - 1 ? end - i : sizeof(x->kept) - 1;
        memcpy(x->kept, data + i, v);
        x->kept[v] = '\0';
    }
    return len;
}

static int on_prereq(void *userp, char *conn_primary_ip, char *conn_local_ip,
                     int conn_primary_port, int conn_local_port)
{
    (void)conn_primary_ip;
    (void)conn_local_ip;
    (void)conn_primary_port;
    (void)conn_local_port;
    struct xfer *x = userp;
    if (x->sends > 0 && x->no_resend) {
        x->resend_refused = true;
        return CURL_PREREQFUNC_ABORT;
    }
    x->sends++;
    return CURL_PREREQFUNC_OK;
}

/* The URL without its query (which may be long) for messages, printable
 * ASCII only. */
static void shown_url(char *out, size_t size, const char *url)
{
    size_t n = strcspn(url, "?#");
    if (n > size - 1)
        n = size - 1;
    for (size_t i = 0; i < n; i++)
        out[i] = (url[i] > 0x20 && url[i] < 0x7f) ? url[i] : '?';
    out[n] = '\0';
}

static ci_status map_curl_error(CURLcode rc, const struct xfer *x, const char *what,
                                const char *detail, struct ci_error *err)
{
    switch (rc) {
    case CURLE_ABORTED_BY_CALLBACK:
        if (x->resend_refused)
            return ci_error_set(err, CI_ERR_HTTP,
                                "%s failed: the connection closed without an answer after the "
                                "request was sent",
                                what);
        return ci_error_set(err, CI_ERR_CANCELLED, "%s was cancelled", what);
    case CURLE_OPERATION_TIMEDOUT:
        return ci_error_set(err, CI_ERR_TIMEOUT, "%s timed out: %s", what, detail);
    case CURLE_OUT_OF_MEMORY:
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory during %s", what);
    case CURLE_WRITE_ERROR:
        if (x->too_large)
            return ci_error_set(err, CI_ERR_LIMIT, "%s: the answer is longer than %zu bytes",
                                what, x->max);
        if (x->nomem)
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory reading the answer of %s",
                                what);
        break;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_PEER_FAILED_VERIFICATION: /* a wrong CA or name: no retry will fix it */
    case CURLE_NOT_BUILT_IN:
        return ci_error_set(err, CI_ERR_INVALID, "%s cannot be sent: %s", what, detail);
    default:
        break;
    }
    return ci_error_set(err, CI_ERR_HTTP, "%s failed: %s", what, detail);
}

#define SETOPT(opt, val)                                \
    do {                                                \
        if (rc == CURLE_OK)                             \
            rc = curl_easy_setopt(easy, opt, val);      \
    } while (0)

ci_status ci_http_do(struct ci_http *h, const struct ci_http_request *req,
                     struct ci_http_response *ret, struct ci_error *err)
{
    char url[256], what[300];
    shown_url(url, sizeof(url), req->url);
    snprintf(what, sizeof(what), "%s %s", req->method, url);
    struct xfer x = {.body = CI_BUF_INIT, .max = req->max_response_bytes,
                     .should_abort = req->should_abort, .abort_arg = req->abort_arg,
                     .no_resend = req->no_resend, .keep_header = req->keep_header,
                     .keep_len = req->keep_header ? strlen(req->keep_header) : 0};
    if (req->ret_sent)
        *req->ret_sent = false;
    if (x.should_abort && x.should_abort(x.abort_arg))
        return ci_error_set(err, CI_ERR_CANCELLED, "%s was cancelled", what);

    struct curl_slist *headers = NULL;
    for (size_t i = 0; req->headers && req->headers[i]; i++) {
        struct curl_slist *n = curl_slist_append(headers, req->headers[i]);
        if (!n) {
            curl_slist_free_all(headers);
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        }
        headers = n;
    }
    CURL *easy = pool_take(h);
    if (!easy) {
        curl_slist_free_all(headers);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory creating an HTTP handle");
    }
    /* Keeps the live connection, the DNS and TLS caches; clears options. */
    curl_easy_reset(easy);
    char errbuf[CURL_ERROR_SIZE];
    errbuf[0] = '\0';
    CURLcode rc = CURLE_OK;
    SETOPT(CURLOPT_URL, req->url);
    SETOPT(CURLOPT_SHARE, h->share);
    SETOPT(CURLOPT_NOSIGNAL, 1L);
    SETOPT(CURLOPT_PROTOCOLS_STR, "http,https");
    SETOPT(CURLOPT_FOLLOWLOCATION, 0L);
    SETOPT(CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    SETOPT(CURLOPT_CONNECTTIMEOUT_MS, (long)h->connect_timeout_ms);
    SETOPT(CURLOPT_TIMEOUT_MS, (long)req->timeout_ms);
    SETOPT(CURLOPT_TCP_KEEPALIVE, 1L);
    SETOPT(CURLOPT_USERAGENT, USER_AGENT);
    SETOPT(CURLOPT_ERRORBUFFER, errbuf);
    SETOPT(CURLOPT_WRITEFUNCTION, on_write);
    SETOPT(CURLOPT_WRITEDATA, &x);
    SETOPT(CURLOPT_HEADERFUNCTION, on_header);
    SETOPT(CURLOPT_HEADERDATA, &x);
    SETOPT(CURLOPT_NOPROGRESS, 0L);
    SETOPT(CURLOPT_XFERINFOFUNCTION, on_progress);
    SETOPT(CURLOPT_XFERINFODATA, &x);
    SETOPT(CURLOPT_PREREQFUNCTION, on_prereq);
    SETOPT(CURLOPT_PREREQDATA, &x);
    SETOPT(CURLOPT_MAXAGE_CONN, (long)MAX_IDLE_AGE_S);
    SETOPT(CURLOPT_HTTPHEADER, headers);
    if (h->ca_file)
        SETOPT(CURLOPT_CAINFO, h->ca_file);
    if (strcmp(req->method, "POST") == 0) {
        SETOPT(CURLOPT_POST, 1L);
        SETOPT(CURLOPT_POSTFIELDS, req->body ? (const char *)req->body : "");
        SETOPT(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)req->body_len);
    } else {
        SETOPT(CURLOPT_HTTPGET, 1L);
    }
    if (rc == CURLE_OK)
        rc = curl_easy_perform(easy);
    if (req->ret_sent)
        *req->ret_sent = x.sends > 0;

    ci_status s = CI_OK;
    if (rc != CURLE_OK) {
        s = map_curl_error(rc, &x, what, errbuf[0] ? errbuf : curl_easy_strerror(rc), err);
    } else {
        memset(ret, 0, sizeof(*ret));
        curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &ret->status);
        char *ct = NULL;
        if (curl_easy_getinfo(easy, CURLINFO_CONTENT_TYPE, &ct) == CURLE_OK && ct)
            snprintf(ret->content_type, sizeof(ret->content_type), "%s", ct);
        memcpy(ret->kept_header, x.kept, sizeof(ret->kept_header));
        ret->body = x.body;
        x.body = (struct ci_buf)CI_BUF_INIT;
    }
    /* The header list must not outlive its use by the handle. */
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(easy, CURLOPT_ERRORBUFFER, NULL);
    curl_slist_free_all(headers);
    pool_give(h, easy);
    ci_buf_release(&x.body);
    return s;
}

ci_status ci_http_urlencode(struct ci_buf *b, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        unsigned char c = *p;
        bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                     c == '-' || c == '.' || c == '_' || c == '~';
        char enc[3] = {'%', hex[c >> 4], hex[c & 15]};
        ci_status st = plain ? ci_buf_append(b, p, 1) : ci_buf_append(b, enc, 3);
        if (st)
            return st;
    }
    return CI_OK;
}

uint32_t ci_http_backoff_ms(uint32_t retry, uint32_t initial_ms, uint32_t max_ms, uint32_t rnd)
{
    if (max_ms == 0)
        return 0;
    uint64_t d = initial_ms ? initial_ms : 1;
    for (uint32_t i = 1; i < retry && d < max_ms; i++)
        d *= 2;
    if (d > max_ms)
        d = max_ms;
    uint64_t half = d / 2;
    return (uint32_t)(d - half + (uint64_t)rnd % (half + 1));
}

bool ci_http_status_retryable(long status, bool not_run)
{
    if (status == 409)
        return false;
    if (status == 408 || status == 429 || status == 502 || status == 503)
        return true;
    return not_run && status >= 500 && status <= 599;
}
