/* test_http.c - the pieces of the cloudrun provider that are pure functions
 * (JWT exp, backoff, retryable statuses, URL encoding, token characters),
 * ID tokens from a file (re-read when it changes), the HTTP client's errors
 * against a loopback port where nothing listens, and whether a request was
 * sent (a small loopback server that closes connections on cue). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "provider/http.h"
#include "provider/idtoken.h"
#include "testutil.h"
#include "core/util.h"

/* base64url without padding. */
static void b64url(const char *in, char *out, size_t outsz)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t n = strlen(in), o = 0;
    for (size_t i = 0; i < n && o + 5 < outsz; i += 3) {
        uint32_t v = (uint32_t)(unsigned char)in[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)(unsigned char)in[i + 1] << 8;
        if (i + 2 < n)
            v |= (unsigned char)in[i + 2];
        out[o++] = tab[(v >> 18) & 63];
        out[o++] = tab[(v >> 12) & 63];
        if (i + 1 < n)
            out[o++] = tab[(v >> 6) & 63];
        if (i + 2 < n)
            out[o++] = tab[v & 63];
    }
    out[o] = '\0';
}

/* "<b64url(header)>.<b64url(payload)>.sig" */
static const char *jwt(const char *payload)
{
    static char buf[2048];
    char h[256], p[1024];
    b64url("{\"alg\":\"RS256\",\"typ\":\"JWT\"}", h, sizeof(h));
    b64url(payload, p, sizeof(p));
    snprintf(buf, sizeof(buf), "%s.%s.c2lnbmF0dXJl", h, p);
    return buf;
}

static ci_status exp_of(const char *token, int64_t *ret)
{
    return ci_jwt_exp(token, strlen(token), ret);
}

static void test_jwt_exp(void)
{
    int64_t exp = -1;
    CHECK(exp_of(jwt("{\"aud\":\"https://x.run.app\",\"exp\":1700000000,\"iat\":1699996400}"),
                 &exp) == CI_OK);
    CHECK(exp == 1700000000);
    /* A fractional NumericDate counts in whole seconds. */
    CHECK(exp_of(jwt("{\"exp\":1700000000.75}"), &exp) == CI_OK);
    CHECK(exp == 1700000000);
    /* Payload lengths that need 0, 1 and 2 padding characters. */
    CHECK(exp_of(jwt("{\"exp\":12}"), &exp) == CI_OK && exp == 12);
    CHECK(exp_of(jwt("{\"exp\":123}"), &exp) == CI_OK && exp == 123);
    CHECK(exp_of(jwt("{\"exp\":1234}"), &exp) == CI_OK && exp == 1234);
    /* Padding present is accepted too. */
    char padded[512];
    char p[256];
    b64url("{\"exp\":12}", p, sizeof(p));
    snprintf(padded, sizeof(padded), "eyJhbGciOiJub25lIn0.%s==.sig", p);
    CHECK(exp_of(padded, &exp) == CI_OK && exp == 12);
    /* An unsigned JWT has an empty third part; still three parts. */
    snprintf(padded, sizeof(padded), "eyJhbGciOiJub25lIn0.%s.", p);
    CHECK(exp_of(padded, &exp) == CI_OK && exp == 12);

    /* ret is left alone on failure. */
    exp = 77;
    static const char *const bad_payloads[] = {
        "{\"aud\":\"x\"}",        /* no exp */
        "{\"exp\":\"1700000000\"}", /* a string */
        "{\"exp\":0}",            /* not a time */
        "{\"exp\":-5}",
        "{\"exp\":true}",
        "[1700000000]",           /* not an object */
        "{\"exp\":1,\"exp\":2}",  /* duplicate claim */
        "not json",
        "",
    };
    for (size_t i = 0; i < sizeof(bad_payloads) / sizeof(bad_payloads[0]); i++) {
        ci_status s = exp_of(jwt(bad_payloads[i]), &exp);
        if (s != CI_ERR_INVALID)
            fprintf(stderr, "  payload %zu: %s\n", i, ci_status_str(s));
        CHECK(s == CI_ERR_INVALID);
    }
    static const char *const bad_tokens[] = {
        "",
        "abc",
        "a.b",                       /* two parts */
        "a.b.c.d",                   /* five-part JWE, or junk */
        ".eyJleHAiOjF9.sig",         /* empty header */
        "eyJhbGciOiJub25lIn0..sig",  /* empty payload */
        "eyJhbGciOiJub25lIn0.eyJleHAiOjF9*.sig", /* not base64url */
        "eyJhbGciOiJub25lIn0.e.sig", /* impossible length */
    };
    for (size_t i = 0; i < sizeof(bad_tokens) / sizeof(bad_tokens[0]); i++) {
        ci_status s = exp_of(bad_tokens[i], &exp);
        if (s != CI_ERR_INVALID)
            fprintf(stderr, "  token %zu: %s\n", i, ci_status_str(s));
        CHECK(s == CI_ERR_INVALID);
    }
    CHECK(exp == 77);
    /* The length bounds the parse: a token cut before its third part fails. */
    const char *t = jwt("{\"exp\":99}");
    CHECK(ci_jwt_exp(t, (size_t)(strrchr(t, '.') - t), &exp) == CI_ERR_INVALID);
    CHECK(ci_jwt_exp(t, strlen(t), &exp) == CI_OK && exp == 99);
}

static void test_backoff(void)
{
    /* rnd = 0 gives the low end (half), UINT32_MAX-ish the high end. */
    CHECK(ci_http_backoff_ms(1, 200, 5000, 0) == 100);
    CHECK(ci_http_backoff_ms(2, 200, 5000, 0) == 200);
    CHECK(ci_http_backoff_ms(3, 200, 5000, 0) == 400);
    CHECK(ci_http_backoff_ms(6, 200, 5000, 0) == 2500);  /* 6400 capped at 5000 */
    CHECK(ci_http_backoff_ms(60, 200, 5000, 0) == 2500); /* no overflow on many retries */
    CHECK(ci_http_backoff_ms(1, 200, 5000, 100) == 200); /* 100 + 100 % 101 */
    CHECK(ci_http_backoff_ms(0, 200, 5000, 0) == 100);   /* retry 0 counts as the first */
    CHECK(ci_http_backoff_ms(5, 1, 1, 12345) == 1);
    CHECK(ci_http_backoff_ms(3, 200, 0, 7) == 0);
    /* Every value lies in [d/2, d] for the capped exponential d, and jitter
     * spreads them. */
    for (uint32_t retry = 1; retry <= 12; retry++) {
        uint64_t d = 300;
        for (uint32_t i = 1; i < retry; i++)
            d = d * 2 > 10000 ? 10000 : d * 2;
        uint32_t lo = UINT32_MAX, hi = 0;
        for (uint32_t r = 0; r < 5000; r++) {
            uint32_t v = ci_http_backoff_ms(retry, 300, 10000, r * 2654435761u);
            if (v < lo)
                lo = v;
            if (v > hi)
                hi = v;
        }
        CHECK(lo >= d - d / 2 && hi <= d);
        CHECK(hi - lo >= d / 4); /* jittered, not constant */
    }
}

static void test_retryable(void)
{
    /* Only answers that say the request was not run: a 500 or 504 may come
     * after the code ran, and the executor would run it again - unless the
     * executor says it did not start the code (Ci-Not-Run). */
    static const long yes[] = {408, 429, 502, 503};
    static const long no[] = {200, 204, 301, 400, 401, 403, 404, 405, 409, 413, 415, 422,
                              500, 501, 504, 599, 600};
    static const long marked[] = {500, 501, 504, 599};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        CHECK(ci_http_status_retryable(yes[i], false));
        CHECK(ci_http_status_retryable(yes[i], true));
    }
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        CHECK(!ci_http_status_retryable(no[i], false));
    for (size_t i = 0; i < sizeof(marked) / sizeof(marked[0]); i++)
        CHECK(ci_http_status_retryable(marked[i], true));
    /* 409: the other copy ends, and the same request would run the code
     * again; 4xx with the marker: sending the same request cannot help. */
    CHECK(!ci_http_status_retryable(409, true));
    CHECK(!ci_http_status_retryable(400, true));
    CHECK(!ci_http_status_retryable(413, true));
}

static void test_urlencode_and_token_chars(void)
{
    struct ci_buf b = CI_BUF_INIT;
    REQUIRE(ci_http_urlencode(&b, "https://x-1.a.run.app/p?q=a b&c~_") == CI_OK);
    CHECK_STR((const char *)b.data, "https%3A%2F%2Fx-1.a.run.app%2Fp%3Fq%3Da%20b%26c~_");
    ci_buf_release(&b);
    REQUIRE(ci_http_urlencode(&b, "\xc3\xa9") == CI_OK);
    CHECK_STR((const char *)b.data, "%C3%A9");
    ci_buf_release(&b);

    CHECK(ci_token_chars_valid("eyJ.abc-_.x+/=~", 15));
    CHECK(!ci_token_chars_valid("", 0));
    CHECK(!ci_token_chars_valid("a b", 3));
    CHECK(!ci_token_chars_valid("abc\r\nX-Evil: 1", 14));
    CHECK(!ci_token_chars_valid("a\0b", 3));
    char *big = malloc(16385);
    REQUIRE(big);
    memset(big, 'a', 16385);
    CHECK(ci_token_chars_valid(big, 16384));
    CHECK(!ci_token_chars_valid(big, 16385));
    free(big);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fputs(text, f);
    fclose(f);
}

static void test_token_file(void)
{
    char dir[] = "/tmp/ci-test-http-XXXXXX";
    REQUIRE(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/token", dir);
    struct ci_http *http = NULL;
    struct ci_http_options ho = {.connect_timeout_ms = 1000, .max_idle = 2};
    REQUIRE(ci_http_new(&ho, &http, NULL) == CI_OK);
    struct ci_idtoken *t = NULL;
    struct ci_idtoken_options to = {.metadata_url = "http://127.0.0.1:9/unused",
                                    .audience = "https://svc",
                                    .token_file = path,
                                    .refresh_margin_s = 300};
    REQUIRE(ci_idtoken_new(http, &to, &t, NULL) == CI_OK);

    struct ci_error err = {{0}};
    char *h = NULL;
    /* Not written yet (a sidecar may write it later): NOT_FOUND, which the
     * cloudrun provider tries again. */
    CHECK(ci_idtoken_header(t, 1000, NULL, NULL, &h, &err) == CI_ERR_NOT_FOUND);
    CHECK(h == NULL);
    CHECK_CONTAINS(err.msg, "does not exist (yet)");

    write_text(path, "first-token\n");
    REQUIRE(ci_idtoken_header(t, 1000, NULL, NULL, &h, &err) == CI_OK);
    CHECK_STR(h, "Authorization: Bearer first-token");
    ci_idtoken_header_free(h);

    /* Changed (other size): read again. */
    write_text(path, "second-token-longer");
    REQUIRE(ci_idtoken_header(t, 1000, NULL, NULL, &h, &err) == CI_OK);
    CHECK_STR(h, "Authorization: Bearer second-token-longer");
    ci_idtoken_header_free(h);

    /* A token that could smuggle a header is refused, and never quoted. */
    write_text(path, "abc\r\nX-Injected: yes\n");
    h = NULL;
    CHECK(ci_idtoken_header(t, 1000, NULL, NULL, &h, &err) == CI_ERR_IO);
    CHECK(h == NULL);
    CHECK(!strstr(err.msg, "Injected"));

    ci_idtoken_free(t);
    ci_idtoken_free(NULL);
    ci_http_free(http);
    unlink(path);
    rmdir(dir);
}

/* A loopback port that refuses connections. */
static uint16_t closed_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) < 0) {
        if (fd >= 0)
            close(fd);
        return 9;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static bool always(void *arg)
{
    (void)arg;
    return true;
}

static void test_http_errors(void)
{
    struct ci_http *http = NULL;
    struct ci_http_options ho = {.connect_timeout_ms = 1000, .max_idle = 1};
    REQUIRE(ci_http_new(&ho, &http, NULL) == CI_OK);
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/execute?secret=1", closed_port());
    const char *headers[] = {"Authorization: Bearer do-not-show-me", NULL};
    struct ci_http_request req = {.method = "POST", .url = url, .headers = headers,
                                  .body = (const uint8_t *)"x", .body_len = 1,
                                  .timeout_ms = 2000, .max_response_bytes = 1024};
    struct ci_http_response resp;
    memset(&resp, 0x5a, sizeof(resp));
    struct ci_error err = {{0}};
    bool sent = true;
    req.ret_sent = &sent;
    CHECK(ci_http_do(http, &req, &resp, &err) == CI_ERR_HTTP);
    CHECK(!sent); /* refused: the request never left */
    req.ret_sent = NULL;
    CHECK(resp.status == 0x5a5a5a5a5a5a5a5aL); /* not written on failure */
    CHECK_CONTAINS(err.msg, "POST http://127.0.0.1:");
    CHECK(!strstr(err.msg, "do-not-show-me"));
    CHECK(!strstr(err.msg, "secret"));

    req.should_abort = always;
    CHECK(ci_http_do(http, &req, &resp, &err) == CI_ERR_CANCELLED);

    req.should_abort = NULL;
    req.url = "ftp://127.0.0.1/x";
    CHECK(ci_http_do(http, &req, &resp, &err) == CI_ERR_INVALID);
    ci_http_free(http);
    ci_http_free(NULL);
}

/* A loopback HTTP/1.1 server for one test: it reads each request (headers
 * and a Content-Length body) and, by the script's letter for that request,
 * answers 200 and keeps the connection ('A'), answers 503 with
 * "ci-not-run:  1 " after a 100 Continue ('N'), answers 503 without it
 * ('M'), or closes it without a word ('C'). It counts the requests it
 * read. */
struct script_server {
    int lfd;
    uint16_t port;
    const char *script;
    atomic_int requests;
    atomic_bool stop;
    pthread_t thread;
};

/* Reads one request from fd; false at EOF or on error. */
static bool read_request(int fd)
{
    char buf[8192];
    size_t len = 0;
    for (;;) {
        char *end = len ? memmem(buf, len, "\r\n\r\n", 4) : NULL;
        if (end) {
            size_t head = (size_t)(end - buf) + 4, body = 0;
            const char *cl = memmem(buf, head, "Content-Length: ", 16);
            if (cl)
                body = strtoul(cl + 16, NULL, 10);
            while (len < head + body && len < sizeof(buf)) {
                ssize_t n = read(fd, buf + len, sizeof(buf) - len);
                if (n <= 0)
                    return false;
                len += (size_t)n;
            }
            return true;
        }
        if (len == sizeof(buf))
            return false;
        ssize_t n = read(fd, buf + len, sizeof(buf) - len);
        if (n <= 0)
            return false;
        len += (size_t)n;
    }
}

static void *script_main(void *arg)
{
    struct script_server *sv = arg;
    while (!atomic_load(&sv->stop)) {
        int fd = accept4(sv->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            break;
        while (read_request(fd)) {
            int i = atomic_fetch_add(&sv->requests, 1);
            char step = sv->script[i] ? sv->script[i] : 'C';
            static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            static const char marked[] = "HTTP/1.1 100 Continue\r\nCi-Not-Run: 0\r\n\r\n"
                                         "HTTP/1.1 503 Service Unavailable\r\n"
                                         "ci-not-run:  1 \r\nContent-Length: 2\r\n\r\nno";
            static const char plain[] = "HTTP/1.1 503 Service Unavailable\r\n"
                                        "Content-Length: 2\r\n\r\nno";
            const char *answer = step == 'A' ? ok : step == 'N' ? marked : step == 'M' ? plain : NULL;
            if (!answer || write(fd, answer, strlen(answer)) != (ssize_t)strlen(answer))
                break;
        }
        close(fd);
    }
    return NULL;
}

static bool script_start(struct script_server *sv, const char *script)
{
    memset(sv, 0, sizeof(*sv));
    sv->script = script;
    sv->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);
    if (sv->lfd < 0 || bind(sv->lfd, (struct sockaddr *)&a, sizeof(a)) < 0 ||
        listen(sv->lfd, 8) < 0 || getsockname(sv->lfd, (struct sockaddr *)&a, &alen) < 0)
        return false;
    sv->port = ntohs(a.sin_port);
    return pthread_create(&sv->thread, NULL, script_main, sv) == 0;
}

static void script_stop(struct script_server *sv)
{
    atomic_store(&sv->stop, true);
    shutdown(sv->lfd, SHUT_RDWR); /* wakes accept() */
    pthread_join(sv->thread, NULL);
    close(sv->lfd);
}

/* ret_sent tells a request that left from one that never did, and a
 * no_resend request is not sent a second time by libcurl itself when the
 * connection it reused closes without an answer (the server may have run
 * it). Without no_resend libcurl does send it again: the server sees it. */
static void test_http_sent_once(void)
{
    for (int no_resend = 1; no_resend >= 0; no_resend--) {
        struct script_server sv;
        REQUIRE(script_start(&sv, "ACC"));
        struct ci_http *http = NULL;
        struct ci_http_options ho = {.connect_timeout_ms = 2000, .max_idle = 1};
        REQUIRE(ci_http_new(&ho, &http, NULL) == CI_OK);
        char url[128];
        snprintf(url, sizeof(url), "http://127.0.0.1:%u/execute", sv.port);
        bool sent = false;
        struct ci_http_request req = {.method = "POST", .url = url,
                                      .body = (const uint8_t *)"task", .body_len = 4,
                                      .timeout_ms = 10000, .max_response_bytes = 1024,
                                      .no_resend = no_resend, .ret_sent = &sent};
        struct ci_http_response resp;
        struct ci_error err = {{0}};
        /* The first opens the connection the second reuses. */
        REQUIRE(ci_http_do(http, &req, &resp, &err) == CI_OK);
        CHECK(resp.status == 200);
        CHECK(sent);
        ci_http_response_release(&resp);
        sent = false;
        CHECK(ci_http_do(http, &req, &resp, &err) == CI_ERR_HTTP);
        CHECK(sent);
        if (no_resend) {
            CHECK(atomic_load(&sv.requests) == 2);
            CHECK_CONTAINS(err.msg, "closed without an answer after the request was sent");
        } else {
            CHECK(atomic_load(&sv.requests) == 3); /* libcurl's own retry */
        }
        ci_http_free(http);
        script_stop(&sv);
    }
}

/* The value of one named response header is kept (request.keep_header),
 * by name whatever its case, without surrounding blanks, and from the final
 * answer only (not an interim 100 Continue); "" when absent. */
static void test_http_kept_header(void)
{
    struct script_server sv;
    REQUIRE(script_start(&sv, "NMA"));
    struct ci_http *http = NULL;
    struct ci_http_options ho = {.connect_timeout_ms = 2000, .max_idle = 1};
    REQUIRE(ci_http_new(&ho, &http, NULL) == CI_OK);
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/execute", sv.port);
    struct ci_http_request req = {.method = "POST", .url = url,
                                  .body = (const uint8_t *)"task", .body_len = 4,
                                  .timeout_ms = 10000, .max_response_bytes = 1024,
                                  .keep_header = "Ci-Not-Run"};
    struct ci_http_response resp;
    struct ci_error err = {{0}};
    REQUIRE(ci_http_do(http, &req, &resp, &err) == CI_OK);
    CHECK(resp.status == 503);
    CHECK_STR(resp.kept_header, "1");
    ci_http_response_release(&resp);
    REQUIRE(ci_http_do(http, &req, &resp, &err) == CI_OK);
    CHECK(resp.status == 503);
    CHECK_STR(resp.kept_header, "");
    ci_http_response_release(&resp);
    req.keep_header = NULL;
    REQUIRE(ci_http_do(http, &req, &resp, &err) == CI_OK);
    CHECK(resp.status == 200);
    CHECK_STR(resp.kept_header, "");
    ci_http_response_release(&resp);
    ci_http_free(http);
    script_stop(&sv);
}

static const struct t_case cases[] = {
    T(test_jwt_exp),
    T(test_backoff),
    T(test_retryable),
    T(test_urlencode_and_token_chars),
    T(test_token_file),
    T(test_http_errors),
    T(test_http_sent_once),
    T(test_http_kept_header),
};

int main(int argc, char **argv) { return t_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0])); }
