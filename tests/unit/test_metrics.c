/* test_metrics.c - the metrics' Prometheus text (every sample, histogram
 * buckets cumulative and consistent, label escaping, NULL-safety, updates
 * from many threads), the monitor's HTTP answers over a real socket, and
 * the config's check of worker.metrics_addr. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/config.h"
#include "monitor/metrics.h"
#include "monitor/monitor.h"
#include "testutil.h"

static char *render(struct ci_metrics *m)
{
    struct ci_buf b = CI_BUF_INIT;
    if (ci_metrics_render(m, &b)) {
        ci_buf_release(&b);
        return NULL;
    }
    size_t n;
    return (char *)ci_buf_steal(&b, &n);
}

/* The value of the sample line that starts with "name " (labels included
 * in name), or -1. */
static double sample(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p;) {
        if (strncmp(p, name, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
        p = strchr(p, '\n');
        if (p)
            p++;
    }
    return -1;
}

static void collect(void *closure, struct ci_metrics_live *ret)
{
    int *calls = closure;
    (*calls)++;
    ret->nats_reconnects = 3;
    ret->nats_connected = true;
    ret->warm_pool_size = 2;
    ret->warm_deaths = 4;
    ret->warm_fallbacks = 5;
}

static void test_render(void)
{
    struct ci_metrics *m = NULL;
    struct ci_error e = {{0}};
    REQUIRE(ci_metrics_new("local", 4, &m, &e) == CI_OK);
    int calls = 0;
    ci_metrics_set_collector(m, collect, &calls);
    ci_metrics_task_end(m, "succeeded", 0.03);
    ci_metrics_task_end(m, "succeeded", 0.7);
    ci_metrics_task_end(m, "failed", 12);
    ci_metrics_task_end(m, "timed_out", 7200); /* above every bound */
    ci_metrics_task_end(m, "weird", 1);
    ci_metrics_queue_wait(m, 0.002);
    ci_metrics_queue_wait(m, -5); /* clock skew: counted as 0 */
    ci_metrics_queue_wait(m, 3);
    ci_metrics_delivery(m, CI_METRICS_DONE);
    ci_metrics_delivery(m, CI_METRICS_RETRY);
    ci_metrics_delivery(m, CI_METRICS_RETRY);
    ci_metrics_delivery(m, (enum ci_metrics_outcome)99); /* ignored */
    ci_metrics_lane_take(m, CI_METRICS_INTERACTIVE);
    ci_metrics_lane_take(m, CI_METRICS_BATCH);
    ci_metrics_lane_take(m, CI_METRICS_BATCH);
    ci_metrics_lane_take(m, (enum ci_metrics_lane)7); /* ignored */
    ci_metrics_slot_busy(m, true);
    ci_metrics_slot_busy(m, true);
    ci_metrics_slot_busy(m, false);
    ci_metrics_objstore_bytes(m, CI_METRICS_DOWNLOAD, 100);
    ci_metrics_objstore_bytes(m, CI_METRICS_UPLOAD, 7);
    ci_metrics_objstore_bytes(m, CI_METRICS_UPLOAD, 8);
    ci_metrics_output_chunks(m, 64, 0);
    ci_metrics_output_chunks(m, 3, 2);

    char *t = render(m);
    REQUIRE(t);
    CHECK(calls == 1);
    CHECK(sample(t, "ci_tasks_total{status=\"succeeded\",provider=\"local\"}") == 2);
    CHECK(sample(t, "ci_tasks_total{status=\"failed\",provider=\"local\"}") == 1);
    CHECK(sample(t, "ci_tasks_total{status=\"timed_out\",provider=\"local\"}") == 1);
    CHECK(sample(t, "ci_tasks_total{status=\"cancelled\",provider=\"local\"}") == 0);
    CHECK(sample(t, "ci_tasks_total{status=\"other\",provider=\"local\"}") == 1);
    CHECK(sample(t, "ci_task_deliveries_total{outcome=\"done\"}") == 1);
    CHECK(sample(t, "ci_task_deliveries_total{outcome=\"retry\"}") == 2);
    CHECK(sample(t, "ci_task_deliveries_total{outcome=\"dropped\"}") == 0);
    CHECK(sample(t, "ci_lane_tasks_total{lane=\"interactive\"}") == 1);
    CHECK(sample(t, "ci_lane_tasks_total{lane=\"batch\"}") == 2);
    CHECK(sample(t, "ci_task_run_seconds_bucket{le=\"0.05\"}") == 1);
    CHECK(sample(t, "ci_task_run_seconds_bucket{le=\"1\"}") == 3);
    CHECK(sample(t, "ci_task_run_seconds_bucket{le=\"10\"}") == 3);
    CHECK(sample(t, "ci_task_run_seconds_bucket{le=\"30\"}") == 4);
    CHECK(sample(t, "ci_task_run_seconds_bucket{le=\"3600\"}") == 4);
    CHECK(sample(t, "ci_task_run_seconds_bucket{le=\"+Inf\"}") == 5);
    CHECK(sample(t, "ci_task_run_seconds_count") == 5);
    double sum = sample(t, "ci_task_run_seconds_sum");
    CHECK(sum > 7213.72 && sum < 7213.74);
    CHECK(sample(t, "ci_task_queue_wait_seconds_bucket{le=\"0.005\"}") == 2);
    CHECK(sample(t, "ci_task_queue_wait_seconds_bucket{le=\"5\"}") == 3);
    CHECK(sample(t, "ci_task_queue_wait_seconds_count") == 3);
    CHECK(sample(t, "ci_slots_active") == 1);
    CHECK(sample(t, "ci_slots_free") == 3);
    CHECK(sample(t, "ci_warm_pool_size") == 2);
    CHECK(sample(t, "ci_warm_deaths_total") == 4);
    CHECK(sample(t, "ci_warm_fallbacks_total") == 5);
    CHECK(sample(t, "ci_nats_connected") == 1);
    CHECK(sample(t, "ci_nats_reconnects_total") == 3);
    CHECK(sample(t, "ci_objstore_bytes_total{direction=\"download\"}") == 100);
    CHECK(sample(t, "ci_objstore_bytes_total{direction=\"upload\"}") == 15);
    CHECK(sample(t, "ci_output_chunks_total{outcome=\"published\"}") == 67);
    CHECK(sample(t, "ci_output_chunks_total{outcome=\"dropped\"}") == 2);
    CHECK_CONTAINS(t, "# TYPE ci_task_run_seconds histogram\n");
    CHECK_CONTAINS(t, "# TYPE ci_tasks_total counter\n");
    CHECK_CONTAINS(t, "# TYPE ci_slots_free gauge\n");
    CHECK(!strstr(t, "e+")); /* bounds as Prometheus writes them: 10, not 1e+01 */

    /* Every line is a comment or "name[{labels}] value", and every sample
     * belongs to a family announced by # TYPE before it. */
    char family[128] = "";
    for (char *line = t, *next; *line; line = next) {
        next = strchr(line, '\n');
        REQUIRE(next);
        *next++ = '\0';
        if (strncmp(line, "# TYPE ", 7) == 0) {
            snprintf(family, sizeof(family), "%.*s", (int)strcspn(line + 7, " "), line + 7);
            continue;
        }
        if (line[0] == '#') {
            CHECK(strncmp(line, "# HELP ", 7) == 0);
            continue;
        }
        CHECK(family[0] && strncmp(line, family, strlen(family)) == 0);
        char *sp = strrchr(line, ' ');
        REQUIRE(sp);
        char *end = NULL;
        strtod(sp + 1, &end);
        CHECK(end && *end == '\0' && end != sp + 1);
    }
    free(t);
    ci_metrics_free(m);
}

static void test_escaping_and_null(void)
{
    struct ci_metrics *m = NULL;
    REQUIRE(ci_metrics_new("a\"b\\c\nd", 0, &m, NULL) == CI_OK);
    ci_metrics_slot_busy(m, false); /* below zero: shown as 0 */
    char *t = render(m);
    REQUIRE(t);
    CHECK_CONTAINS(t, "provider=\"a\\\"b\\\\c\\nd\"}");
    CHECK(sample(t, "ci_slots_active") == 0);
    CHECK(sample(t, "ci_slots_free") == 0);
    CHECK(sample(t, "ci_warm_pool_size") == 0); /* no collector */
    free(t);
    ci_metrics_free(m);

    /* Every update accepts NULL. */
    ci_metrics_task_end(NULL, "succeeded", 1);
    ci_metrics_queue_wait(NULL, 1);
    ci_metrics_delivery(NULL, CI_METRICS_DONE);
    ci_metrics_slot_busy(NULL, true);
    ci_metrics_objstore_bytes(NULL, CI_METRICS_UPLOAD, 1);
    ci_metrics_output_chunks(NULL, 1, 1);
    ci_metrics_set_collector(NULL, NULL, NULL);
    ci_metrics_free(NULL);
    struct ci_buf b = CI_BUF_INIT;
    CHECK(ci_metrics_render(NULL, &b) == CI_ERR_INVALID);
}

#define THREADS 4
#define PER_THREAD 20000

static void *hammer(void *p)
{
    struct ci_metrics *m = p;
    for (int i = 0; i < PER_THREAD; i++) {
        ci_metrics_task_end(m, "succeeded", 0.5);
        ci_metrics_queue_wait(m, 0.001);
        ci_metrics_objstore_bytes(m, CI_METRICS_UPLOAD, 2);
        ci_metrics_slot_busy(m, true);
        ci_metrics_slot_busy(m, false);
    }
    return NULL;
}

static void test_threads(void)
{
    struct ci_metrics *m = NULL;
    REQUIRE(ci_metrics_new("local", 8, &m, NULL) == CI_OK);
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        REQUIRE(pthread_create(&th[i], NULL, hammer, m) == 0);
    /* Renders while they run must stay consistent: +Inf == count. */
    for (int r = 0; r < 20; r++) {
        char *t = render(m);
        REQUIRE(t);
        CHECK(sample(t, "ci_task_run_seconds_bucket{le=\"+Inf\"}") ==
              sample(t, "ci_task_run_seconds_count"));
        free(t);
    }
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    char *t = render(m);
    REQUIRE(t);
    CHECK(sample(t, "ci_tasks_total{status=\"succeeded\",provider=\"local\"}") ==
          THREADS * PER_THREAD);
    CHECK(sample(t, "ci_task_queue_wait_seconds_count") == THREADS * PER_THREAD);
    CHECK(sample(t, "ci_objstore_bytes_total{direction=\"upload\"}") == 2.0 * THREADS * PER_THREAD);
    CHECK(sample(t, "ci_slots_active") == 0);
    double sum = sample(t, "ci_task_run_seconds_sum");
    CHECK(sum == 0.5 * THREADS * PER_THREAD);
    free(t);
    ci_metrics_free(m);
}

/* ---- the monitor over a real socket ----------------------------------- */

static bool g_ready;

static bool ready_fn(void *closure, char *why, size_t n)
{
    (void)closure;
    if (!g_ready)
        snprintf(why, n, "draining: test");
    return g_ready;
}

/* Sends request to addr ("127.0.0.1:PORT") and returns the whole answer. */
static char *http(const char *addr, const char *request)
{
    const char *colon = strrchr(addr, ':');
    uint16_t port = (uint16_t)strtoul(colon + 1, NULL, 10);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    ci_write_all(fd, request, strlen(request));
    struct ci_buf b = CI_BUF_INIT;
    char chunk[4096];
    ssize_t n;
    while ((n = read(fd, chunk, sizeof(chunk))) > 0)
        ci_buf_append(&b, chunk, (size_t)n);
    close(fd);
    size_t len;
    return (char *)ci_buf_steal(&b, &len);
}

static void test_monitor(void)
{
    struct ci_metrics *m = NULL;
    REQUIRE(ci_metrics_new("local", 2, &m, NULL) == CI_OK);
    ci_metrics_task_end(m, "succeeded", 1);
    struct ci_monitor *mon = NULL;
    struct ci_error e = {{0}};
    struct ci_monitor_options o = {.addr = "127.0.0.1:0", .metrics = m, .ready = ready_fn};
    REQUIRE(ci_monitor_start(&o, &mon, &e) == CI_OK);
    char addr[80];
    snprintf(addr, sizeof(addr), "%s", ci_monitor_address(mon));
    CHECK(strncmp(addr, "127.0.0.1:", 10) == 0 && strcmp(addr, "127.0.0.1:0") != 0);

    char *r = http(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    CHECK_CONTAINS(r, "HTTP/1.1 200");
    CHECK_CONTAINS(r, "text/plain; version=0.0.4");
    CHECK_CONTAINS(r, "ci_tasks_total{status=\"succeeded\",provider=\"local\"} 1\n");
    free(r);
    r = http(addr, "GET /healthz HTTP/1.0\r\n\r\n");
    CHECK_CONTAINS(r, " 200 ");
    CHECK_CONTAINS(r, "\r\n\r\nok\n");
    free(r);
    g_ready = true;
    r = http(addr, "GET /readyz HTTP/1.0\r\n\r\n");
    CHECK_CONTAINS(r, " 200 ");
    CHECK_CONTAINS(r, "ready\n");
    free(r);
    g_ready = false;
    r = http(addr, "GET /readyz HTTP/1.0\r\n\r\n");
    CHECK_CONTAINS(r, " 503 ");
    CHECK_CONTAINS(r, "not ready: draining: test\n");
    free(r);
    r = http(addr, "HEAD /metrics HTTP/1.0\r\n\r\n");
    CHECK_CONTAINS(r, " 200 ");
    CHECK(r && !strstr(r, "ci_tasks_total"));
    free(r);
    r = http(addr, "GET /nothing HTTP/1.0\r\n\r\n");
    CHECK_CONTAINS(r, " 404 ");
    free(r);
    r = http(addr, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello");
    CHECK_CONTAINS(r, " 405 ");
    CHECK_CONTAINS(r, "Allow: GET, HEAD");
    free(r);
    /* A malformed request is closed (MHD may answer 400 first), and the
     * server goes on serving. */
    r = http(addr, "garbage\r\n\r\n");
    CHECK(r && (r[0] == '\0' || strstr(r, " 400 ")));
    free(r);
    r = http(addr, "GET /healthz HTTP/1.0\r\n\r\n");
    CHECK_CONTAINS(r, " 200 ");
    free(r);
    ci_monitor_stop(mon);
    /* The port is closed once stopped. */
    CHECK(http(addr, "GET /healthz HTTP/1.0\r\n\r\n") == NULL);
    ci_monitor_stop(NULL);
    ci_metrics_free(m);
}

static void test_monitor_bad_addresses(void)
{
    struct ci_metrics *m = NULL;
    REQUIRE(ci_metrics_new("local", 1, &m, NULL) == CI_OK);
    const char *bad[] = {"9464", ":9464", "localhost:9464", "127.0.0.1:", "127.0.0.1:65536",
                         "127.0.0.1:x", "::1:9464", "[::1]9464", "[nope]:1", "1.2.3.4.5:1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct ci_monitor *mon = (struct ci_monitor *)&m;
        struct ci_error e = {{0}};
        struct ci_monitor_options o = {.addr = bad[i], .metrics = m};
        CHECK(ci_monitor_start(&o, &mon, &e) == CI_ERR_INVALID);
        CHECK(mon == (struct ci_monitor *)&m); /* ret untouched on failure */
        CHECK_CONTAINS(e.msg, "metrics address");
    }
    /* An address of another machine cannot be bound. */
    struct ci_monitor *mon = NULL;
    struct ci_error e = {{0}};
    struct ci_monitor_options o = {.addr = "192.0.2.1:9464", .metrics = m};
    CHECK(ci_monitor_start(&o, &mon, &e) == CI_ERR_SYS);
    CHECK_CONTAINS(e.msg, "cannot listen on metrics address 192.0.2.1:9464");
    ci_metrics_free(m);
}

/* IPv6 loopback: skipped where the machine cannot bind ::1 at all. */
static void test_monitor_ipv6(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in6 sa = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
    bool have = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
    if (fd >= 0)
        close(fd);
    if (!have)
        SKIP("this machine cannot bind [::1]");
    struct ci_metrics *m = NULL;
    REQUIRE(ci_metrics_new("local", 1, &m, NULL) == CI_OK);
    struct ci_monitor *mon = NULL;
    struct ci_error e = {{0}};
    struct ci_monitor_options o = {.addr = "[::1]:0", .metrics = m};
    CHECK(ci_monitor_start(&o, &mon, &e) == CI_OK);
    if (mon) {
        CHECK(strncmp(ci_monitor_address(mon), "[::1]:", 6) == 0);
        ci_monitor_stop(mon);
    }
    ci_metrics_free(m);
}

static void test_config_metrics_addr(void)
{
    unsetenv("CI_NATS_URL");
    const char *good[] = {"\"\"", "127.0.0.1:9464", "0.0.0.0:0", "\"[::]:9464\"", "'[::1]:1'"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char text[128];
        snprintf(text, sizeof(text), "worker:\n  metrics_addr: %s\n", good[i]);
        struct ci_config *cfg = NULL;
        struct ci_error e = {{0}};
        CHECK(ci_config_parse("w.yaml", (const uint8_t *)text, strlen(text), &cfg, &e) == CI_OK);
        ci_config_free(cfg);
    }
    const char *bad[] = {"localhost:9464", "9464", "1.2.3.4:70000", "'::1:80'", "'1.2.3.4:'"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char text[128];
        snprintf(text, sizeof(text), "worker:\n  metrics_addr: %s\n", bad[i]);
        struct ci_config *cfg = NULL;
        struct ci_error e = {{0}};
        CHECK(ci_config_parse("w.yaml", (const uint8_t *)text, strlen(text), &cfg, &e) ==
              CI_ERR_INVALID);
        CHECK_CONTAINS(e.msg, "w.yaml:2: key 'worker.metrics_addr': expected \"\" (off) or a numeric");
    }
    struct ci_config *cfg = NULL;
    REQUIRE(ci_config_defaults(&cfg, NULL) == CI_OK);
    CHECK_STR(cfg->worker.metrics_addr, "127.0.0.1:9464");
    CHECK(cfg->worker.heartbeat_s == 10);
    CHECK_STR(cfg->jetstream.workers_bucket, "ci-workers");
    ci_config_free(cfg);
}

TEST_MAIN(T(test_render), T(test_escaping_and_null), T(test_threads), T(test_monitor),
          T(test_monitor_bad_addresses), T(test_config_metrics_addr),
          T_OWN(test_monitor_ipv6)) /* ctest: unit.test_metrics.test_monitor_ipv6 */
