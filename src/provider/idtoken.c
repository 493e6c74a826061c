/* idtoken.c - ID tokens from the metadata server or a file, cached.
 *
 * Locking: one mutex guards the cached token. A thread that finds no fresh
 * token marks itself the fetcher and fetches without the lock held; the
 * others wait on a condition variable (waking every 100 ms to honour their
 * cancel and their deadline) and then take its token. So N tasks that start
 * together cost one request to the metadata server. */
#include "provider/idtoken.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"

#define MAX_TOKEN_BYTES 16384
#define WAIT_STEP_MS 100
#define BEARER "Authorization: Bearer "

struct ci_idtoken {
    struct ci_http *http;
    char *request_url; /* metadata_url?audience=...&format=full */
    char *shown_url;   /* metadata_url without its query, for messages */
    char *token_file;
    uint32_t margin_s;

    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool fetching;
    char *token; /* NUL-terminated, wiped when dropped */
    size_t token_len;
    int64_t refresh_at_ms; /* wall clock: fetch a new one from then on */
    int64_t expires_at_ms;
    /* The token file as last read: re-read when any of these change. */
    bool file_loaded;
    dev_t file_dev;
    ino_t file_ino;
    off_t file_size;
    struct timespec file_mtime;
};

static void wipe_free(char *s, size_t len)
{
    if (!s)
        return;
    explicit_bzero(s, len);
    free(s);
}

static void drop_token(struct ci_idtoken *t)
{
    wipe_free(t->token, t->token_len);
    t->token = NULL;
    t->token_len = 0;
    t->refresh_at_ms = 0;
    t->expires_at_ms = 0;
}

bool ci_token_chars_valid(const char *s, size_t len)
{
    if (len == 0 || len > MAX_TOKEN_BYTES)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/' || c == '='))
            return false;
    }
    return true;
}

ci_status ci_jwt_exp(const char *token, size_t len, int64_t *ret_exp)
{
    const char *dot1 = memchr(token, '.', len);
    if (!dot1)
        return CI_ERR_INVALID;
    const char *payload = dot1 + 1;
    size_t rest = len - (size_t)(payload - token);
    const char *dot2 = memchr(payload, '.', rest);
    if (!dot2 || dot1 == token || dot2 == payload)
        return CI_ERR_INVALID;
    if (memchr(dot2 + 1, '.', len - (size_t)(dot2 + 1 - token)))
        return CI_ERR_INVALID; /* more than three parts: a JWE or garbage */
    uint8_t *json = NULL;
    size_t json_len = 0;
    /* base64url; padding, which a JWT omits, is tolerated in any amount. */
    size_t payload_len = (size_t)(dot2 - payload);
    while (payload_len > 0 && payload[payload_len - 1] == '=')
        payload_len--;
    ci_status s = ci_base64_decode(payload, payload_len, CI_B64_URL, &json, &json_len);
    if (s)
        return s;
    if (json_len == 0)
        return CI_ERR_INVALID;
    json_t *root = json_loadb((const char *)json, json_len, JSON_REJECT_DUPLICATES, NULL);
    free(json);
    if (!root)
        return CI_ERR_INVALID;
    json_t *exp = json_is_object(root) ? json_object_get(root, "exp") : NULL;
    int64_t v = 0;
    bool ok = false;
    if (json_is_integer(exp)) {
        v = (int64_t)json_integer_value(exp);
        ok = true;
    } else if (json_is_real(exp)) {
        /* NumericDate may have a fraction; whole seconds are enough. */
        double d = json_real_value(exp);
        ok = isfinite(d) && d > 0 && d < 9.2e18;
        v = ok ? (int64_t)floor(d) : 0;
    }
    json_decref(root);
    if (!ok || v <= 0)
        return CI_ERR_INVALID;
    *ret_exp = v;
    return CI_OK;
}

ci_status ci_idtoken_new(struct ci_http *http, const struct ci_idtoken_options *o,
                         struct ci_idtoken **ret, struct ci_error *err)
{
    struct ci_idtoken *t = calloc(1, sizeof(*t));
    if (!t)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    t->http = http;
    t->margin_s = o->refresh_margin_s;
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cond, NULL);
    ci_status s = CI_OK;
    if (o->token_file && o->token_file[0]) {
        if (!(t->token_file = strdup(o->token_file)))
            s = CI_ERR_NOMEM;
    } else {
        if (!(t->shown_url = strndup(o->metadata_url, strcspn(o->metadata_url, "?#"))))
            s = CI_ERR_NOMEM;
        struct ci_buf b = CI_BUF_INIT;
        const char *sep = strchr(o->metadata_url, '?') ? "&" : "?";
        if (!s)
            s = ci_buf_appendf(&b, "%s%saudience=", o->metadata_url, sep);
        if (!s)
            s = ci_http_urlencode(&b, o->audience);
        if (!s)
            s = ci_buf_appendf(&b, "&format=full");
        if (s)
            ci_buf_release(&b);
        else
            t->request_url = (char *)ci_buf_steal(&b, NULL);
    }
    if (s) {
        ci_idtoken_free(t);
        return ci_error_set(err, s, "out of memory");
    }
    *ret = t;
    return CI_OK;
}

void ci_idtoken_free(struct ci_idtoken *t)
{
    if (!t)
        return;
    drop_token(t);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->cond);
    free(t->request_url);
    free(t->shown_url);
    free(t->token_file);
    free(t);
}

void ci_idtoken_invalidate(struct ci_idtoken *t)
{
    pthread_mutex_lock(&t->lock);
    drop_token(t);
    t->file_loaded = false;
    pthread_mutex_unlock(&t->lock);
}

void ci_idtoken_header_free(char *header)
{
    if (header)
        wipe_free(header, strlen(header));
}

static ci_status make_header(const char *token, size_t len, char **ret, struct ci_error *err)
{
    size_t n = strlen(BEARER) + len + 1;
    char *h = malloc(n);
    if (!h)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    memcpy(h, BEARER, strlen(BEARER));
    memcpy(h + strlen(BEARER), token, len);
    h[n - 1] = '\0';
    *ret = h;
    return CI_OK;
}

/* Trailing whitespace (a newline at the end of a file) is not part of it. */
static size_t trimmed_len(const uint8_t *d, size_t len)
{
    while (len > 0 && (d[len - 1] == '\n' || d[len - 1] == '\r' || d[len - 1] == ' ' ||
                       d[len - 1] == '\t'))
        len--;
    return len;
}

/* Re-reads the token file when it changed. Called with the lock held. */
static ci_status load_file(struct ci_idtoken *t, struct ci_error *err)
{
    CI_AUTOCLOSE int fd = open(t->token_file, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0 && errno == ENOENT) /* not written yet (a sidecar's): it may be soon */
        return ci_error_set(err, CI_ERR_NOT_FOUND, "the token file %s does not exist (yet)",
                            t->token_file);
    if (fd < 0)
        return ci_error_errno(err, CI_ERR_IO, errno, "cannot open the token file %s",
                              t->token_file);
    struct stat st;
    if (fstat(fd, &st) < 0)
        return ci_error_errno(err, CI_ERR_IO, errno, "cannot stat the token file %s",
                              t->token_file);
    if (!S_ISREG(st.st_mode))
        return ci_error_set(err, CI_ERR_IO, "the token file %s is not a regular file",
                            t->token_file);
    if (t->file_loaded && t->token && st.st_dev == t->file_dev && st.st_ino == t->file_ino &&
        st.st_size == t->file_size && st.st_mtim.tv_sec == t->file_mtime.tv_sec &&
        st.st_mtim.tv_nsec == t->file_mtime.tv_nsec)
        return CI_OK;
    if (st.st_size > MAX_TOKEN_BYTES + 16)
        return ci_error_set(err, CI_ERR_IO, "the token file %s is larger than %d bytes",
                            t->token_file, MAX_TOKEN_BYTES);
    uint8_t buf[MAX_TOKEN_BYTES + 17];
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, buf + len, sizeof(buf) - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            explicit_bzero(buf, sizeof(buf));
            return ci_error_errno(err, CI_ERR_IO, e, "cannot read the token file %s",
                                  t->token_file);
        }
        if (n == 0 || (len += (size_t)n) == sizeof(buf))
            break;
    }
    size_t tl = trimmed_len(buf, len);
    ci_status s = CI_OK;
    if (!ci_token_chars_valid((const char *)buf, tl)) {
        s = ci_error_set(err, CI_ERR_IO,
                         "the token file %s does not hold one token (1 to %d characters of "
                         "A-Z, a-z, 0-9, '-._~+/=')",
                         t->token_file, MAX_TOKEN_BYTES);
    } else {
        char *tok = malloc(tl + 1);
        if (!tok) {
            s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        } else {
            memcpy(tok, buf, tl);
            tok[tl] = '\0';
            drop_token(t);
            t->token = tok;
            t->token_len = tl;
            t->file_loaded = true;
            t->file_dev = st.st_dev;
            t->file_ino = st.st_ino;
            t->file_size = st.st_size;
            t->file_mtime = st.st_mtim;
        }
    }
    explicit_bzero(buf, sizeof(buf));
    return s;
}

/* Asks the metadata server for a token; without the lock. */
static ci_status fetch(struct ci_idtoken *t, uint32_t timeout_ms, bool (*should_abort)(void *),
                       void *abort_arg, char **ret_token, size_t *ret_len, int64_t *ret_exp,
                       struct ci_error *err)
{
    static const char *const headers[] = {"Metadata-Flavor: Google", "Accept: text/plain", NULL};
    struct ci_http_request req = {
        .method = "GET",
        .url = t->request_url,
        .headers = headers,
        .timeout_ms = timeout_ms ? timeout_ms : 1,
        .max_response_bytes = MAX_TOKEN_BYTES + 16,
        .should_abort = should_abort,
        .abort_arg = abort_arg,
    };
    struct ci_http_response resp;
    struct ci_error e = {{0}};
    ci_status s = ci_http_do(t->http, &req, &resp, &e);
    if (s == CI_ERR_LIMIT)
        return ci_error_set(err, CI_ERR_INVALID,
                            "could not get an ID token from the metadata server at %s: its "
                            "answer is longer than any ID token",
                            t->shown_url);
    if (s) /* e names the URL */
        return ci_error_set(err, s, "could not get an ID token from the metadata server: %s",
                            e.msg);
    size_t len = trimmed_len(resp.body.data, resp.body.len);
    const char *body = (const char *)resp.body.data;
    if (resp.status != 200) {
        long status = resp.status;
        explicit_bzero(resp.body.data, resp.body.len);
        ci_http_response_release(&resp);
        return ci_error_set(err, status >= 500 || status == 429 ? CI_ERR_HTTP : CI_ERR_INVALID,
                            "could not get an ID token from the metadata server at %s: it "
                            "answered HTTP %ld%s",
                            t->shown_url, status,
                            status >= 500 || status == 429
                                ? ""
                                : " (is a service account attached to this machine?)");
    }
    int64_t exp = 0;
    if (!body || !ci_token_chars_valid(body, len) || ci_jwt_exp(body, len, &exp)) {
        explicit_bzero(resp.body.data, resp.body.len);
        ci_http_response_release(&resp);
        return ci_error_set(err, CI_ERR_INVALID,
                            "could not get an ID token from the metadata server at %s: its "
                            "answer is not a JWT with an exp claim",
                            t->shown_url);
    }
    char *tok = malloc(len + 1);
    if (tok) {
        memcpy(tok, body, len);
        tok[len] = '\0';
    }
    explicit_bzero(resp.body.data, resp.body.len);
    ci_http_response_release(&resp);
    if (!tok)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    *ret_token = tok;
    *ret_len = len;
    *ret_exp = exp;
    return CI_OK;
}

static void add_ms(struct timespec *ts, int64_t ms)
{
    ts->tv_sec += ms / 1000;
    ts->tv_nsec += (ms % 1000) * 1000000L;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

ci_status ci_idtoken_header(struct ci_idtoken *t, uint32_t timeout_ms,
                            bool (*should_abort)(void *arg), void *abort_arg, char **ret,
                            struct ci_error *err)
{
    int64_t deadline = ci_mono_ms() + timeout_ms;
    ci_status s;
    pthread_mutex_lock(&t->lock);
    if (t->token_file) {
        s = load_file(t, err);
        if (!s)
            s = make_header(t->token, t->token_len, ret, err);
        pthread_mutex_unlock(&t->lock);
        return s;
    }
    for (;;) {
        if (t->token && ci_now_ms() < t->refresh_at_ms) {
            s = make_header(t->token, t->token_len, ret, err);
            pthread_mutex_unlock(&t->lock);
            return s;
        }
        if (!t->fetching)
            break;
        /* Another thread is fetching: wait for its token. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        add_ms(&ts, WAIT_STEP_MS);
        pthread_cond_timedwait(&t->cond, &t->lock, &ts);
        if (should_abort && should_abort(abort_arg)) {
            pthread_mutex_unlock(&t->lock);
            return ci_error_set(err, CI_ERR_CANCELLED, "cancelled while waiting for an ID token");
        }
        if (ci_mono_ms() >= deadline) {
            pthread_mutex_unlock(&t->lock);
            return ci_error_set(err, CI_ERR_TIMEOUT,
                                "could not get an ID token from the metadata server at %s "
                                "within %u ms",
                                t->shown_url, timeout_ms);
        }
    }
    t->fetching = true;
    pthread_mutex_unlock(&t->lock);

    char *tok = NULL;
    size_t len = 0;
    int64_t exp = 0;
    int64_t left = deadline - ci_mono_ms();
    s = fetch(t, left > 0 ? (uint32_t)left : 1, should_abort, abort_arg, &tok, &len, &exp, err);

    pthread_mutex_lock(&t->lock);
    t->fetching = false;
    pthread_cond_broadcast(&t->cond);
    int64_t now = ci_now_ms();
    if (!s && exp * 1000 <= now) {
        wipe_free(tok, len);
        s = ci_error_set(err, CI_ERR_INVALID,
                         "the metadata server at %s gave an ID token that has already expired "
                         "(is this machine's clock right?)",
                         t->shown_url);
    }
    if (!s) {
        drop_token(t);
        t->token = tok;
        t->token_len = len;
        t->expires_at_ms = exp * 1000;
        int64_t life = t->expires_at_ms - now;
        int64_t margin = (int64_t)t->margin_s * 1000;
        if (margin > life / 2)
            margin = life / 2;
        t->refresh_at_ms = t->expires_at_ms - margin;
    } else if (t->token && now < t->expires_at_ms && s != CI_ERR_CANCELLED) {
        /* The refresh failed but the old token is still good: use it, and
         * try again on the next call. */
        s = CI_OK;
    }
    if (!s)
        s = make_header(t->token, t->token_len, ret, err);
    pthread_mutex_unlock(&t->lock);
    return s;
}
