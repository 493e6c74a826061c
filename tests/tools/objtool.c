/* objtool - a tiny command-line client of the object store module, for the
 * interop tests with nats.js and for poking at a bucket by hand.
 *
 *   objtool [--ttl S] [--memory] [--replicas N] [--max BYTES] URL BUCKET COMMAND ...
 *     create                 create or update the bucket's stream
 *     put NAME FILE          store FILE ("-" = stdin) as NAME
 *     put-undo NAME FILE     store it, then take it back (ci_objstore_undo)
 *     get NAME FILE          write NAME to FILE ("-" = stdout)
 *     info NAME              print NAME's metadata as JSON
 *     delete NAME            delete NAME
 *     stress THREADS ITERS   concurrent puts and gets from many threads
 *
 * Exit status: 0 ok, 1 error, 2 usage, 3 not found, 4 limit, 5 integrity. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nats/objstore_js.h"
#include "core/util.h"

#define FILE_MAX ((size_t)1 << 30)

static int usage(void)
{
    fprintf(stderr, "usage: objtool [--ttl S] [--memory] [--replicas N] [--max BYTES] URL BUCKET "
                    "create | put NAME FILE | put-undo NAME FILE | get NAME FILE | info NAME | "
                    "delete NAME | "
                    "stress THREADS ITERS\n");
    return 2;
}

static int exit_code(ci_status s)
{
    switch (s) {
    case CI_OK: return 0;
    case CI_ERR_NOT_FOUND: return 3;
    case CI_ERR_LIMIT: return 4;
    case CI_ERR_INTEGRITY: return 5;
    default: return 1;
    }
}

static int fail(ci_status s, const struct ci_error *err)
{
    fprintf(stderr, "objtool: %s (%s)\n", err->msg, ci_status_str(s));
    return exit_code(s);
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || !end || *end || end == s || s[0] == '-')
        return false;
    *out = v;
    return true;
}

static ci_status read_file(const char *path, struct ci_buf *b, struct ci_error *err)
{
    CI_AUTOCLOSE int fd = strcmp(path, "-") == 0 ? dup(0) : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ci_error_errno(err, CI_ERR_IO, errno, "cannot open '%s'", path);
    for (;;) {
        if (ci_buf_reserve(b, 65536))
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory reading '%s'", path);
        ssize_t n = read(fd, b->data + b->len, 65536);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ci_error_errno(err, CI_ERR_IO, errno, "cannot read '%s'", path);
        if (n == 0)
            return CI_OK;
        b->len += (size_t)n;
        if (b->len > FILE_MAX)
            return ci_error_set(err, CI_ERR_LIMIT, "'%s' is larger than 1 GiB", path);
    }
}

static ci_status write_file(const char *path, const uint8_t *data, size_t len,
                            struct ci_error *err)
{
    CI_AUTOCLOSE int fd = strcmp(path, "-") == 0
                              ? dup(1)
                              : open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return ci_error_errno(err, CI_ERR_IO, errno, "cannot open '%s'", path);
    if (ci_write_all(fd, data, len))
        return ci_error_errno(err, CI_ERR_IO, errno, "cannot write '%s'", path);
    return CI_OK;
}

/* ---- stress: many threads on one struct ci_objstore ----------------- */

struct stress {
    struct ci_objstore *os;
    int thread;
    int iters;
    int failures;
    pthread_mutex_t *mu;
};

/* Content that carries its own seed, so a reader can check any version. */
static void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
    if (n >= 8) {
        memcpy(p, &seed, 4);
        uint32_t len = (uint32_t)n;
        memcpy(p + 4, &len, 4);
    }
}

static bool verify(const uint8_t *p, size_t n)
{
    if (n < 8)
        return false;
    uint32_t seed, len;
    memcpy(&seed, p, 4);
    memcpy(&len, p + 4, 4);
    if (len != n)
        return false;
    uint8_t *want = malloc(n);
    if (!want)
        return false;
    fill(want, n, seed);
    bool ok = memcmp(want, p, n) == 0;
    free(want);
    return ok;
}

static void stress_fail(struct stress *st, const char *what, ci_status s, const struct ci_error *e)
{
    pthread_mutex_lock(st->mu);
    fprintf(stderr, "objtool: stress thread %d: %s: %s (%s)\n", st->thread, what, e->msg,
            ci_status_str(s));
    pthread_mutex_unlock(st->mu);
    st->failures++;
}

static void *stress_thread(void *arg)
{
    struct stress *st = arg;
    for (int i = 0; i < st->iters; i++) {
        uint32_t seed = (uint32_t)(st->thread * 100003 + i);
        size_t n = 8 + (seed * 7919u) % (300 * 1024);
        uint8_t *data = malloc(n);
        if (!data) {
            st->failures++;
            break;
        }
        fill(data, n, seed);
        char name[64];
        snprintf(name, sizeof(name), "stress/%d/%d", st->thread, i % 2);
        struct ci_error err = {{0}};
        ci_status s;
        /* Its own name: what it reads is what it wrote. */
        if ((s = ci_objstore_put(st->os, name, data, n, &err)))
            stress_fail(st, "put", s, &err);
        uint8_t *got = NULL;
        size_t got_len = 0;
        if ((s = ci_objstore_get(st->os, name, 1 << 20, &got, &got_len, &err)))
            stress_fail(st, "get", s, &err);
        else if (got_len != n || memcmp(got, data, n) != 0)
            stress_fail(st, "get returned other bytes", CI_ERR_INTEGRITY, &err);
        free(got);
        got = NULL;
        /* A shared name: every thread replaces it; any whole version will do. */
        if ((s = ci_objstore_put(st->os, "stress/shared", data, n, &err)))
            stress_fail(st, "put shared", s, &err);
        if ((s = ci_objstore_get(st->os, "stress/shared", 1 << 20, &got, &got_len, &err)))
            stress_fail(st, "get shared", s, &err);
        else if (!verify(got, got_len))
            stress_fail(st, "get shared returned a torn object", CI_ERR_INTEGRITY, &err);
        free(got);
        free(data);
    }
    return NULL;
}

static ci_status stress(struct ci_objstore *os, int threads, int iters)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    pthread_t tids[64];
    struct stress st[64];
    int started = 0;
    for (int t = 0; t < threads; t++) {
        st[t] = (struct stress){.os = os, .thread = t, .iters = iters, .mu = &mu};
        if (pthread_create(&tids[t], NULL, stress_thread, &st[t]) != 0)
            break;
        started++;
    }
    int failures = started == threads ? 0 : 1;
    for (int t = 0; t < started; t++) {
        pthread_join(tids[t], NULL);
        failures += st[t].failures;
    }
    if (failures) {
        fprintf(stderr, "objtool: stress: %d failures\n", failures);
        return CI_ERR_INTEGRITY;
    }
    printf("stress: %d threads x %d iterations ok\n", threads, iters);
    return CI_OK;
}

/* ---- main ------------------------------------------------------------ */

static int run(jsCtx *js, const struct ci_objstore_opts *o, uint64_t max, int argc, char **argv)
{
    const char *cmd = argv[0];
    bool put_undo = strcmp(cmd, "put-undo") == 0;
    bool create = strcmp(cmd, "create") == 0 || strcmp(cmd, "put") == 0 || put_undo ||
                  strcmp(cmd, "stress") == 0;
    int want_args = strcmp(cmd, "create") == 0                                ? 1
                    : strcmp(cmd, "info") == 0 || strcmp(cmd, "delete") == 0 ? 2
                                                                               : 3;
    if (argc != want_args)
        return usage();
    struct ci_error err = {{0}};
    struct ci_objstore *os = NULL;
    ci_status s = ci_objstore_open(js, o, create, &os, &err);
    if (s)
        return fail(s, &err);
    if (strcmp(cmd, "create") == 0) {
        s = CI_OK;
    } else if (strcmp(cmd, "put") == 0 || put_undo) {
        struct ci_buf b = CI_BUF_INIT;
        struct ci_objstore_undo undo = {0};
        s = read_file(argv[2], &b, &err);
        if (!s)
            s = ci_objstore_put_undoable(os, argv[1], b.data, b.len, put_undo ? &undo : NULL,
                                         &err);
        if (!s && put_undo)
            s = ci_objstore_undo(os, &undo, &err);
        ci_objstore_undo_release(&undo);
        ci_buf_release(&b);
    } else if (strcmp(cmd, "get") == 0) {
        uint8_t *data = NULL;
        size_t len = 0;
        s = ci_objstore_get(os, argv[1], (size_t)max, &data, &len, &err);
        if (!s)
            s = write_file(argv[2], data, len, &err);
        free(data);
    } else if (strcmp(cmd, "info") == 0) {
        struct ci_objmeta m;
        s = ci_objstore_info(os, argv[1], &m, &err);
        char *json = NULL;
        if (!s && !(s = ci_objmeta_to_json(&m, &json, &err)))
            printf("%s\n", json);
        free(json);
        if (!s)
            ci_objmeta_release(&m);
    } else if (strcmp(cmd, "delete") == 0) {
        s = ci_objstore_delete(os, argv[1], &err);
    } else if (strcmp(cmd, "stress") == 0) {
        uint64_t threads = 0, iters = 0;
        if (!parse_u64(argv[1], &threads) || !parse_u64(argv[2], &iters) || threads < 1 ||
            threads > 64 || iters > 100000) {
            ci_objstore_free(os);
            return usage();
        }
        s = stress(os, (int)threads, (int)iters);
        err.msg[0] = '\0';
        if (s)
            snprintf(err.msg, sizeof(err.msg), "stress test failed");
    } else {
        ci_objstore_free(os);
        return usage();
    }
    ci_objstore_free(os);
    return s ? fail(s, &err) : 0;
}

int main(int argc, char **argv)
{
    struct ci_objstore_opts o = {.replicas = 1, .file_storage = true};
    uint64_t max = 64 << 20, v = 0;
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        if (strcmp(argv[i], "--memory") == 0)
            o.file_storage = false;
        else if (strcmp(argv[i], "--ttl") == 0 && i + 1 < argc && parse_u64(argv[i + 1], &v) &&
                 v <= INT32_MAX)
            o.max_age_s = (int64_t)v, i++;
        else if (strcmp(argv[i], "--replicas") == 0 && i + 1 < argc &&
                 parse_u64(argv[i + 1], &v) && v <= 5)
            o.replicas = (int)v, i++;
        else if (strcmp(argv[i], "--max") == 0 && i + 1 < argc && parse_u64(argv[i + 1], &v) &&
                 v <= FILE_MAX)
            max = v, i++;
        else
            return usage();
    }
    if (argc - i < 3)
        return usage();
    const char *url = argv[i];
    o.bucket = argv[i + 1];

    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    natsOptions *no = NULL;
    natsStatus ns = natsOptions_Create(&no);
    if (ns == NATS_OK)
        ns = natsOptions_SetURL(no, url);
    if (ns == NATS_OK)
        ns = natsOptions_SetTimeout(no, 5000);
    if (ns == NATS_OK)
        ns = natsConnection_Connect(&nc, no);
    if (ns == NATS_OK)
        ns = natsConnection_JetStream(&js, nc, NULL);
    int rc;
    if (ns != NATS_OK) {
        fprintf(stderr, "objtool: cannot connect to %s: %s\n", url, natsStatus_GetText(ns));
        rc = 1;
    } else {
        rc = run(js, &o, max, argc - i - 2, argv + i + 2);
    }
    jsCtx_Destroy(js);
    natsConnection_Destroy(nc);
    natsOptions_Destroy(no);
    nats_CloseAndWait(5000);
    return rc;
}
