/* ci-executor: the service behind the `cloudrun` provider. Serves
 * POST /execute, POST /cancel/{taskId} and GET /healthz (see service.h) and
 * runs each task in the same sandbox as the `local` provider of ci-worker.
 * Until SIGTERM or SIGINT; then it stops accepting, lets running tasks
 * finish (at most worker.drain_timeout_s), cancels the rest and exits 0.
 * Without namespaces, a task that left a process the sweep could not remove
 * makes it stop the same way and exit 1 (the platform starts a new one).
 * SIGHUP re-reads the key set of executor.jwks_file.
 *
 * Two choices it will not make for the operator (exit 2 until they are in
 * the config, docs/cloudrun.md):
 *   - executor.auth: google-id-token (auth.h checks every caller's ID
 *     token) or none (something in front does: Cloud Run IAM).
 *   - running tasks without the namespace sandbox. With local.isolation
 *     auto on a machine without user namespaces it refuses to start; only
 *     local.isolation: none runs them bare, and then one at a time (a
 *     second gets 429), as local.sandbox_uid when the executor is root,
 *     with the executor non-dumpable and every process a task leaves
 *     killed before the next (sweep.h). */
#include <getopt.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/config.h"
#include "executor/auth.h"
#include "executor/httpd.h"
#include "executor/sweep.h"
#include "core/log.h"
#include "provider/provider_local.h"
#include "sandbox/sandbox.h"
#include "executor/service.h"
#include "core/util.h"

#define DEFAULT_PORT 8080
#define IDLE_TIMEOUT_S 30 /* a client silent this long while sending or reading is dropped */

static volatile sig_atomic_t g_stop;
static volatile sig_atomic_t g_reload;

static void on_signal(int sig)
{
    if (sig == SIGHUP)
        g_reload = 1;
    else
        g_stop = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: ci-executor [--config FILE] [--listen ADDR] [--port N] [--probe] [--version]\n"
            "  --config FILE   worker.yaml format; executor.*, limits.*, local.*,\n"
            "                  worker.concurrency (tasks at once; 0 = CPUs), worker.id,\n"
            "                  worker.log_level and worker.drain_timeout_s apply.\n"
            "                  executor.auth must be chosen (google-id-token or none).\n"
            "  --listen ADDR   numeric address to listen on (default $CI_EXECUTOR_LISTEN,\n"
            "                  else 0.0.0.0)\n"
            "  --port N        port (default $PORT, else 8080; 0 = any free port, logged)\n"
            "  --probe         print which sandbox layers this machine grants, then exit\n"
            "                  (non-zero when local.isolation is 'required' and unmet)\n");
}

static bool parse_port(const char *s, uint16_t *ret)
{
    char *end = NULL;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || v > 65535)
        return false;
    *ret = (uint16_t)v;
    return true;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'}, {"listen", required_argument, NULL, 'l'},
        {"port", required_argument, NULL, 'p'},   {"version", no_argument, NULL, 'v'},
        {"probe", no_argument, NULL, 'P'},        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *config_path = NULL;
    const char *listen_addr = getenv("CI_EXECUTOR_LISTEN");
    const char *port_text = getenv("PORT");
    bool probe = false;
    int c;
    while ((c = getopt_long(argc, argv, "c:l:p:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config_path = optarg; break;
        case 'l': listen_addr = optarg; break;
        case 'p': port_text = optarg; break;
        case 'v': printf("ci-executor 0.1.0\n"); return 0;
        case 'P': probe = true; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    if (!listen_addr || !*listen_addr)
        listen_addr = "0.0.0.0";
    uint16_t port = DEFAULT_PORT;
    if (port_text && *port_text && !parse_port(port_text, &port)) {
        fprintf(stderr, "ci-executor: port '%.16s' is not a number from 0 to 65535\n", port_text);
        return 2;
    }

    struct ci_config *cfg = NULL;
    struct ci_error e = {{0}};
    if (config_path ? ci_config_load(config_path, &cfg, &e) : ci_config_defaults(&cfg, &e)) {
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }
    if (probe) {
        struct ci_sandbox_probe p;
        ci_status ps = ci_sandbox_probe(cfg, &p);
        ci_sandbox_probe_print(&p, stdout);
        ci_config_free(cfg);
        return ps ? 1 : 0;
    }
    char id[128];
    if (cfg->worker.id[0]) {
        snprintf(id, sizeof(id), "%s", cfg->worker.id);
    } else {
        char host[64] = "executor";
        gethostname(host, sizeof(host) - 1);
        host[sizeof(host) - 1] = '\0';
        snprintf(id, sizeof(id), "%s-%d", host, (int)getpid());
    }
    ci_log_init(ci_log_level_from_name(cfg->worker.log_level), id);
    /* No core dumps, no ptrace, no /proc/<pid>/mem or environ for anyone
     * but root. An unprivileged executor must stay dumpable while it may
     * write its sandboxes' uid maps (their /proc files would be root's);
     * without namespaces it turns non-dumpable below. */
    if (geteuid() == 0)
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int rc = 2; /* a refused configuration; 1 once it is accepted */
    struct ci_auth *auth = NULL;
    struct ci_provider *provider = NULL;
    struct ci_service *service = NULL;
    struct ci_httpd *httpd = NULL;
    bool bare = cfg->local.isolation == CI_ISOLATION_NONE;
    if (cfg->executor.auth == CI_AUTH_UNSET) {
        ci_log(CI_LOG_ERROR, "executor.refused", "error",
               "executor.auth is not set: choose google-id-token (this executor checks each "
               "caller's Google-signed ID token: set executor.audience, executor.jwks_file and "
               "executor.allowed_emails) or none (only where something in front checks callers, "
               "as Cloud Run does with --no-allow-unauthenticated and roles/run.invoker); see "
               "docs/cloudrun.md",
               NULL);
        goto out;
    }
    if (cfg->executor.auth == CI_AUTH_GOOGLE_ID_TOKEN && ci_auth_new(cfg, &auth, &e)) {
        ci_log(CI_LOG_ERROR, "executor.refused", "error", e.msg, NULL);
        goto out;
    }
    if (bare && cfg->worker.concurrency > 1) {
        ci_log_num(CI_LOG_ERROR, "executor.refused", "concurrency", cfg->worker.concurrency,
                   "error",
                   "local.isolation is none: without a namespace sandbox the executor runs one "
                   "task at a time; set worker.concurrency to 1 (and --concurrency 1 on Cloud Run)",
                   NULL);
        goto out;
    }
    if (bare && ci_sweep_init(&e)) {
        ci_log(CI_LOG_ERROR, "executor.refused", "error", e.msg, NULL);
        goto out;
    }
    rc = 1;
    /* Always the local sandbox, whatever worker.provider says. */
    if (ci_provider_local_new(cfg, &provider, &e)) {
        ci_log(CI_LOG_ERROR, "executor.sandbox_failed", "error", e.msg, NULL);
        goto out;
    }
    struct ci_provider_notes notes;
    ci_provider_notes(provider, &notes);
    if (!bare && strcmp(ci_provider_isolation(provider), "none") == 0) {
        /* isolation auto (required refuses in ci_provider_local_new), and
         * no namespaces here: no task runs unless the operator says the
         * platform is the boundary. Decided on what every result would
         * carry, not on whether the provider has something to say: a
         * missing zygote or unusable task uids leave the sandbox whole. */
        const char *cause = strstr(notes.no_sandbox, "(isolation: auto): ");
        cause = cause                 ? cause + strlen("(isolation: auto): ")
                : notes.no_sandbox[0] ? notes.no_sandbox
                                      : "the probe found none";
        char why[1024];
        snprintf(why, sizeof(why),
                 "no namespace sandbox on this machine (%s). Refusing to run tasks without one "
                 "under local.isolation: auto. If the platform is the boundary (one task per "
                 "instance, no credentials in it, no egress: e.g. Cloud Run with --concurrency "
                 "1), set local.isolation: none in the executor's config: tasks then run one at a "
                 "time, as local.sandbox_uid when the executor is root, and every result says "
                 "isolation \"none\". Else run the executor where user namespaces work "
                 "(local.isolation: required). See docs/cloudrun.md",
                 cause);
        ci_log(CI_LOG_ERROR, "executor.refused", "error", why, NULL);
        rc = 2;
        goto out;
    }
    /* The sandbox stands; tasks run, as the worker's would. */
    if (notes.warm_unavailable[0])
        ci_log(CI_LOG_WARN, "executor.warm_unavailable", "warning", notes.warm_unavailable,
               NULL);
    if (notes.task_uids_off[0])
        ci_log(CI_LOG_WARN, "executor.task_uids_off", "warning", notes.task_uids_off, NULL);
    if (bare) {
        /* A task runs as our uid when we are not root: it must not read
         * our memory or environment through /proc. */
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
        ci_log(CI_LOG_WARN, "executor.no_isolation", "warning",
               geteuid() == 0
                   ? "local.isolation is none: tasks run without namespaces, one at a time, as "
                     "local.sandbox_uid; the platform must be the boundary"
                   : "local.isolation is none: tasks run without namespaces, one at a time, as "
                     "the executor's own uid (they can signal it); run the executor as root so "
                     "that they run as local.sandbox_uid; the platform must be the boundary",
               NULL);
    }

    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t max_running = bare                     ? 1
                           : cfg->worker.concurrency ? cfg->worker.concurrency
                                                     : (uint32_t)(cpus > 0 ? cpus : 1);
    struct ci_service_options so = {.cfg = cfg,
                                    .provider = provider,
                                    .max_running = max_running,
                                    .instance_id = id,
                                    .auth = auth,
                                    .bare = bare};
    if (ci_service_new(&so, &service, &e)) {
        ci_log(CI_LOG_ERROR, "executor.start_failed", "error", e.msg, NULL);
        goto out;
    }
    struct ci_httpd_options ho = {
        .address = listen_addr,
        .port = port,
        /* Room for health checks and quick 429s beside the running tasks. */
        .max_connections = max_running * 2 + 16,
        /* One address may hold them all unless the config says less: a
         * connection over a per-address limit is closed once accepted,
         * which a worker must count as "may have run" (FAILED), and behind
         * a front (Cloud Run's) every caller is one of a few addresses.
         * The 10 s watchdog bounds callers without a token meanwhile. */
        .max_connections_per_ip = cfg->executor.max_connections_per_ip
                                      ? cfg->executor.max_connections_per_ip
                                      : max_running * 2 + 16,
        .idle_timeout_s = IDLE_TIMEOUT_S,
        .handler = ci_service_handle,
        .body_limit = ci_service_body_limit,
        .authorize = ci_service_authorize,
        .on_edge_reject = ci_service_edge_reject,
        .ctx = service,
    };
    if (ci_httpd_start(&ho, &httpd, &e)) {
        ci_log(CI_LOG_ERROR, "executor.listen_failed", "error", e.msg, NULL);
        goto out;
    }
    ci_log_num(CI_LOG_INFO, "executor.ready", "port", ci_httpd_port(httpd), "address", listen_addr,
               NULL);
    ci_log_num(CI_LOG_INFO, "executor.limits", "max_running", max_running, "auth",
               auth ? "google-id-token" : "none", "isolation", bare ? "none" : "sandbox", NULL);

    while (!g_stop && !ci_service_unhealthy(service)) {
        sleep_ms(100);
        if (g_reload) {
            g_reload = 0;
            unsigned keys = 0;
            if (!auth)
                ci_log(CI_LOG_INFO, "executor.reload", "note", "executor.auth is none: no keys",
                       NULL);
            else if (ci_auth_reload(auth, &keys, &e))
                ci_log_num(CI_LOG_ERROR, "auth.reload_failed", "keys", keys, "error", e.msg, NULL);
            else
                ci_log_num(CI_LOG_INFO, "auth.reloaded", "keys", keys, NULL);
        }
    }

    /* A bare task left a process the sweep could not remove: stop, as on
     * SIGTERM, and exit 1, so that the platform starts a fresh instance. */
    bool unhealthy = ci_service_unhealthy(service);
    /* No new task from here on, then no new connection; logged once both
     * hold. */
    ci_service_drain(service);
    ci_httpd_quiesce(httpd);
    ci_log(unhealthy ? CI_LOG_ERROR : CI_LOG_INFO, "executor.draining", "reason",
           unhealthy ? "unhealthy" : "signal", NULL);
    int64_t deadline = ci_mono_ms() + (int64_t)cfg->worker.drain_timeout_s * 1000;
    while (ci_service_running(service) > 0 && ci_mono_ms() < deadline)
        sleep_ms(50);
    if (ci_service_running(service) > 0) {
        ci_log(CI_LOG_WARN, "executor.drain_timeout", NULL);
        ci_service_cancel_all(service);
        /* A cancelled run ends within a second; its 500 is still to be sent. */
        deadline = ci_mono_ms() + 3000;
        while (ci_service_running(service) > 0 && ci_mono_ms() < deadline)
            sleep_ms(20);
    }
    /* Let the last answers go out (idle keep-alive connections are cut). */
    deadline = ci_mono_ms() + 2000;
    while (ci_httpd_connections(httpd) > 0 && ci_mono_ms() < deadline)
        sleep_ms(20);
    rc = unhealthy ? 1 : 0;
out:
    ci_httpd_stop(httpd); /* waits for every handler */
    ci_service_free(service);
    ci_provider_free(provider);
    ci_auth_free(auth);
    ci_config_free(cfg);
    ci_log(CI_LOG_INFO, "executor.stopped", NULL);
    return rc;
}
