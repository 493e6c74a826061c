/* test_config.c - the YAML config loader: defaults, every error message with
 * its line, the rules between keys, CI_NATS_URL and the redacting dump. */
#include <errno.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/config.h"
#include "testutil.h"

#ifndef CI_SOURCE_DIR
#define CI_SOURCE_DIR "."
#endif
#define REFERENCE CI_SOURCE_DIR "/config/worker.yaml"

static char tmpdir[64];

/* Writes text to <tmpdir>/<name> and returns the path (static storage). */
static const char *write_file(const char *name, const char *text, size_t len)
{
    static char path[128];
    snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        return NULL;
    size_t n = len ? fwrite(text, 1, len, f) : 0;
    if (fclose(f) != 0 || n != len)
        return NULL;
    return path;
}

/* Loads text through a real file named worker.yaml. */
static ci_status load(const char *text, struct ci_config **ret, struct ci_error *err)
{
    const char *path = write_file("worker.yaml", text, strlen(text));
    if (!path)
        return ci_error_set(err, CI_ERR_IO, "test: cannot write the temp file");
    return ci_config_load(path, ret, err);
}

/* Loads text that must fail; returns the message (static storage). */
static const char *load_error(const char *text)
{
    static struct ci_error err;
    struct ci_config *sentinel = (struct ci_config *)&err, *cfg = sentinel;
    memset(&err, 0, sizeof(err));
    ci_status s = load(text, &cfg, &err);
    if (s == CI_OK) {
        ci_config_free(cfg);
        return "(loaded without error)";
    }
    if (s != CI_ERR_INVALID)
        return "(wrong status)";
    if (cfg != sentinel)
        return "(ret written on failure)";
    return err.msg;
}

/* ci_config_dump into a malloc'd string. */
static char *dump(const struct ci_config *cfg)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return NULL;
    ci_config_dump(cfg, f);
    fclose(f);
    return text;
}

static char *dump_defaults(void)
{
    struct ci_config *cfg = NULL;
    struct ci_error err = {{0}};
    if (ci_config_defaults(&cfg, &err) != CI_OK)
        return NULL;
    char *text = dump(cfg);
    ci_config_free(cfg);
    return text;
}

static void check_all_defaults(const struct ci_config *c)
{
    CHECK_STR(c->nats.url, "nats://127.0.0.1:4222");
    CHECK_STR(c->nats.name, "ci-worker");
    CHECK_STR(c->nats.creds_file, "");
    CHECK_STR(c->nats.nkey_seed_file, "");
    CHECK_STR(c->nats.token, "");
    CHECK_STR(c->nats.user, "");
    CHECK_STR(c->nats.password, "");
    CHECK_STR(c->nats.tls_ca, "");
    CHECK_STR(c->nats.tls_cert, "");
    CHECK_STR(c->nats.tls_key, "");
    CHECK(c->nats.connect_timeout_ms == 5000);
    CHECK(c->nats.max_reconnects == -1);
    CHECK(c->nats.reconnect_wait_ms == 1000);
    CHECK(c->nats.write_deadline_ms == 10000);
    CHECK_STR(c->jetstream.tasks_stream, "CI_TASKS");
    CHECK_STR(c->jetstream.submit_subject, "ci.submit");
    CHECK_STR(c->jetstream.consumer, "ci-workers");
    CHECK_STR(c->jetstream.status_stream, "CI_STATUS");
    CHECK_STR(c->jetstream.status_prefix, "ci.status");
    CHECK_STR(c->jetstream.cancel_stream, "CI_CANCEL");
    CHECK_STR(c->jetstream.cancel_prefix, "ci.cancel");
    CHECK_STR(c->jetstream.output_stream, "CI_OUTPUT");
    CHECK_STR(c->jetstream.output_prefix, "ci.out");
    CHECK(c->jetstream.live_output == true);
    CHECK(c->jetstream.output_max_mb == 1024);
    CHECK(c->jetstream.check_s == 15);
    CHECK_STR(c->jetstream.results_bucket, "ci-results");
    CHECK_STR(c->jetstream.files_bucket, "ci-files");
    CHECK_STR(c->jetstream.batch_stream, "CI_BATCH");
    CHECK_STR(c->jetstream.batch_subject, "ci.batch");
    CHECK_STR(c->jetstream.batch_consumer, "ci-workers-batch");
    CHECK_STR(c->jetstream.batch_events_stream, "CI_BATCHES");
    CHECK_STR(c->jetstream.batch_events_prefix, "ci.batches");
    CHECK(c->jetstream.max_age_s == 3600);
    CHECK(c->jetstream.duplicate_window_s == 120);
    CHECK(c->jetstream.ack_wait_s == 30);
    CHECK(c->jetstream.max_deliver == 5);
    CHECK(c->jetstream.replicas == 1);
    CHECK(c->jetstream.file_storage == true);
    CHECK_STR(c->worker.id, "");
    CHECK(c->worker.concurrency == 0);
    CHECK_STR(c->worker.provider, "local");
    CHECK(c->worker.drain_timeout_s == 90);
    CHECK_STR(c->worker.log_level, "info");
    CHECK(c->worker.batch_every == 4);
    CHECK(c->batches.max_age_s == 86400);
    CHECK(c->batches.duplicate_window_s == 3600);
    CHECK(c->limits.default_timeout_ms == 60000);
    CHECK(c->limits.max_timeout_ms == 60000);
    CHECK(c->limits.default_memory_mb == 1024);
    CHECK(c->limits.max_memory_mb == 4096);
    CHECK(c->limits.max_code_bytes == 1048576);
    CHECK(c->limits.max_input_bytes == 20971520);
    CHECK(c->limits.max_artifact_bytes == 20971520);
    CHECK(c->limits.max_output_bytes == 1048576);
    CHECK(c->local.isolation == CI_ISOLATION_AUTO);
    CHECK_STR(c->local.python, "/usr/bin/python3");
    CHECK(c->local.sandbox_uid == 65534);
    CHECK(c->local.sandbox_gid == 65534);
    CHECK(c->local.workspace_mb == 256);
    CHECK(c->local.tmp_mb == 64);
    CHECK(c->local.max_processes == 64);
    CHECK(c->local.max_open_files == 256);
    CHECK_STR(c->cloudrun.service_url, "");
    CHECK_STR(c->cloudrun.audience, "");
    CHECK_STR(c->cloudrun.metadata_url, "http://metadata.google.internal/computeMetadata/v1/"
                                        "instance/service-accounts/default/identity");
    CHECK_STR(c->cloudrun.token_file, "");
    CHECK(c->cloudrun.token_refresh_margin_s == 300);
    CHECK(c->cloudrun.timeout_margin_ms == 30000);
    CHECK(c->cloudrun.max_attempts == 0);
    CHECK(c->cloudrun.backoff_initial_ms == 200);
    CHECK(c->cloudrun.backoff_max_ms == 5000);
    CHECK_STR(c->cloudrun.ca_file, "");
    CHECK(c->cloudrun.connect_timeout_ms == 5000);
    CHECK(c->executor.auth == CI_AUTH_UNSET);
    CHECK_STR(c->executor.audience, "");
    CHECK_STR(c->executor.jwks_file, "");
    CHECK_STR(c->executor.allowed_emails, "");
    CHECK(c->executor.clock_skew_s == 60);
    CHECK(c->executor.max_connections_per_ip == 0);
}

static void test_empty_file_gives_defaults(void)
{
    static const char *const empties[] = {
        "", "\n", "# only a comment\n", "~\n", "---\n", "---\n...\n", "null\n",
        "nats:\njetstream: ~\nworker: null\nlimits: {}\nlocal:\n",
        "limits:\n  max_timeout_ms: ~\n  default_timeout_ms: null\n  max_memory_mb:\n",
    };
    unsetenv("CI_NATS_URL");
    for (size_t i = 0; i < sizeof(empties) / sizeof(empties[0]); i++) {
        struct ci_config *cfg = NULL;
        struct ci_error err = {{0}};
        ci_status s = load(empties[i], &cfg, &err);
        if (s != CI_OK)
            fprintf(stderr, "  input %zu: %s\n", i, err.msg);
        REQUIRE(s == CI_OK);
        check_all_defaults(cfg);
        ci_config_free(cfg);
    }
}

static void test_defaults_function(void)
{
    unsetenv("CI_NATS_URL");
    struct ci_config *cfg = NULL;
    struct ci_error err = {{0}};
    REQUIRE(ci_config_defaults(&cfg, &err) == CI_OK);
    check_all_defaults(cfg);
    ci_config_free(cfg);
    ci_config_free(NULL);
}

static void test_reference_config_loads_with_defaults(void)
{
    unsetenv("CI_NATS_URL");
    struct ci_config *cfg = NULL;
    struct ci_error err = {{0}};
    ci_status s = ci_config_load(REFERENCE, &cfg, &err);
    if (s)
        fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(s == CI_OK);
    check_all_defaults(cfg);
    char *a = dump(cfg), *b = dump_defaults();
    CHECK_STR(a, b);
    free(a);
    free(b);
    ci_config_free(cfg);
}

/* Collects "section.key" for every "  key:" line under a "section:" line. */
static size_t list_keys(const char *text, char keys[][64], size_t max)
{
    char section[32] = "";
    size_t n = 0;
    const char *next;
    for (const char *line = text; *line; line = next) {
        size_t len = strcspn(line, "\n");
        next = line + len + (line[len] == '\n');
        const char *colon = memchr(line, ':', len);
        if (!colon || line[0] == '#')
            continue;
        if (line[0] != ' ') {
            snprintf(section, sizeof(section), "%.*s", (int)(colon - line), line);
        } else if (line[2] != ' ' && line[2] != '#' && n < max) {
            snprintf(keys[n++], 64, "%s.%.*s", section, (int)(colon - line - 2), line + 2);
        }
    }
    return n;
}

static void test_reference_config_lists_every_key(void)
{
    FILE *f = fopen(REFERENCE, "r");
    REQUIRE(f);
    static char ref[65536];
    size_t n = fread(ref, 1, sizeof(ref) - 1, f);
    fclose(f);
    ref[n] = '\0';
    char *def = dump_defaults();
    REQUIRE(def);
    /* A key left at its default may be listed commented out, exactly as the
     * defaults dump it: "  # key: value" (worker.metrics_addr, which only
     * gives way to a free port when it is not set). */
    for (char *line = ref; *line;) {
        size_t len = strcspn(line, "\n");
        if (len > 4 && memcmp(line, "  # ", 4) == 0) {
            char active[256];
            snprintf(active, sizeof(active), "\n  %.*s\n", (int)(len - 4), line + 4);
            if (len < 200 && strstr(def, active)) {
                memmove(line + 2, line + 4, strlen(line + 4) + 1);
                len -= 2;
            }
        }
        line += len + (line[len] == '\n');
    }
    static char want[128][64], got[128][64];
    size_t nwant = list_keys(def, want, 128), ngot = list_keys(ref, got, 128);
    free(def);
    CHECK(nwant > 40);
    CHECK(nwant == ngot);
    for (size_t i = 0; i < nwant && i < ngot; i++)
        CHECK_STR(got[i], want[i]); /* same keys, same order */
}

static void test_values_are_read(void)
{
    unsetenv("CI_NATS_URL");
    struct ci_config *cfg = NULL;
    struct ci_error err = {{0}};
    ci_status s = load("nats:\n"
                       "  url: nats://a:4222,nats://b:4222\n"
                       "  name: 'worker one'\n"
                       "  token: \"s3cret\"\n"
                       "  max_reconnects: 10\n"
                       "  connect_timeout_ms: +600000\n"
                       "jetstream: {replicas: 3, file_storage: false, max_age_s: 60, "
                       "duplicate_window_s: 60}\n"
                       "worker:\n"
                       "  id: host-1.example_2\n"
                       "  provider: cloudrun\n"
                       "  log_level: \"debug\"\n"
                       "  concurrency: 0\n"
                       "limits:\n"
                       "  max_input_bytes: 0\n"
                       "local:\n"
                       "  isolation: required\n"
                       "  sandbox_uid: 4294967294\n"
                       "  python: |-\n"
                       "    /opt/py/bin/python3\n"
                       "cloudrun:\n"
                       "  service_url: https://ci-executor-abc123-ew.a.run.app\n",
                       &cfg, &err);
    if (s)
        fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(s == CI_OK);
    CHECK_STR(cfg->nats.url, "nats://a:4222,nats://b:4222");
    CHECK_STR(cfg->nats.name, "worker one");
    CHECK_STR(cfg->nats.token, "s3cret");
    CHECK(cfg->nats.max_reconnects == 10);
    CHECK(cfg->nats.connect_timeout_ms == 600000);
    CHECK(cfg->jetstream.replicas == 3);
    CHECK(cfg->jetstream.file_storage == false);
    CHECK(cfg->jetstream.max_age_s == 60);
    CHECK(cfg->sessions.idle_s == 60); /* the default gives way to a shorter max_age_s */
    CHECK(cfg->batches.max_age_s == 86400); /* the batch streams have their own */
    CHECK_STR(cfg->worker.id, "host-1.example_2");
    CHECK_STR(cfg->worker.provider, "cloudrun");
    CHECK_STR(cfg->worker.log_level, "debug");
    CHECK(cfg->limits.max_input_bytes == 0);
    CHECK(cfg->local.isolation == CI_ISOLATION_REQUIRED);
    CHECK(cfg->local.sandbox_uid == 4294967294u);
    CHECK_STR(cfg->local.python, "/opt/py/bin/python3");
    CHECK_STR(cfg->cloudrun.service_url, "https://ci-executor-abc123-ew.a.run.app");
    CHECK(cfg->limits.max_timeout_ms == 60000); /* untouched keys keep defaults */
    ci_config_free(cfg);

    REQUIRE(load("jetstream:\n  file_storage: FALSE\nlocal:\n  isolation: none\n", &cfg, &err) ==
            CI_OK);
    CHECK(cfg->jetstream.file_storage == false);
    CHECK(cfg->local.isolation == CI_ISOLATION_NONE);
    ci_config_free(cfg);

    REQUIRE(load("executor:\n  auth: google-id-token\n  audience: https://x.run.app\n"
                 "  allowed_emails: a@b.iam.gserviceaccount.com\n  clock_skew_s: 0\n"
                 "  max_connections_per_ip: 3\n",
                 &cfg, &err) == CI_OK);
    CHECK(cfg->executor.auth == CI_AUTH_GOOGLE_ID_TOKEN);
    CHECK_STR(cfg->executor.audience, "https://x.run.app");
    CHECK_STR(cfg->executor.allowed_emails, "a@b.iam.gserviceaccount.com");
    CHECK(cfg->executor.clock_skew_s == 0);
    CHECK(cfg->executor.max_connections_per_ip == 3);
    ci_config_free(cfg);
    REQUIRE(load("executor:\n  auth: none\n", &cfg, &err) == CI_OK);
    CHECK(cfg->executor.auth == CI_AUTH_NONE);
    ci_config_free(cfg);
}

struct error_case {
    const char *yaml;
    const char *msg;
};

static void check_errors(const struct error_case *cases, size_t n)
{
    unsetenv("CI_NATS_URL");
    for (size_t i = 0; i < n; i++) {
        const char *got = load_error(cases[i].yaml);
        if (strcmp(got, cases[i].msg) != 0)
            fprintf(stderr, "  case %zu:\n%s", i, cases[i].yaml);
        CHECK_STR(got, cases[i].msg);
    }
}

static void test_key_errors(void)
{
    static const struct error_case cases[] = {
        {"nats:\n  url: nats://x\n  bogus: 1\n", "worker.yaml:3: key 'nats.bogus': unknown key"},
        {"cloud:\n  region: x\n", "worker.yaml:1: key 'cloud': unknown key"},
        {"cloudrun:\n  region: x\n", "worker.yaml:2: key 'cloudrun.region': unknown key"},
        {"cloudrun:\n  backoff_max_ms: 100\n  backoff_initial_ms: 500\n",
         "worker.yaml:3: key 'cloudrun.backoff_initial_ms': 500 is above cloudrun.backoff_max_ms (100)"},
        {"# c\n\nnats: {}\nNATS: {}\n", "worker.yaml:4: key 'NATS': unknown key"},
        {"limits:\n  max_timeout_ms: 1000\n  max_timeout_ms: 2000\n",
         "worker.yaml:3: key 'limits.max_timeout_ms': duplicate key"},
        {"limits:\n  max_timeout_ms: ~\n  max_timeout_ms: 2000\n",
         "worker.yaml:3: key 'limits.max_timeout_ms': duplicate key"},
        {"nats: {}\nlimits: {}\nnats:\n  url: x\n", "worker.yaml:3: key 'nats': duplicate key"},
        {"nats: 5\n", "worker.yaml:1: key 'nats': expected a mapping"},
        {"nats:\n  - url\n", "worker.yaml:2: key 'nats': expected a mapping"},
        {"nats:\n  url: {a: 1}\n", "worker.yaml:2: key 'nats.url': expected a string, got a mapping"},
        {"limits:\n  max_timeout_ms:\n    - 1\n",
         "worker.yaml:3: key 'limits.max_timeout_ms': expected an integer, got a sequence"},
        {"nats:\n  name: &n abc\n  user: *n\n",
         "worker.yaml:3: key 'nats.user': YAML aliases are not supported"},
        {"limits:\n  max_timeout_ms: !!int 5000\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': YAML tags are not supported"},
        {"nats:\n  [a]: 1\n", "worker.yaml:2: key 'nats': expected a key name, got a sequence"},
    };
    check_errors(cases, sizeof(cases) / sizeof(cases[0]));
}

static void test_number_errors(void)
{
    static const struct error_case cases[] = {
        {"limits:\n  max_timeout_ms: abc\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': expected an integer, got 'abc'"},
        {"limits:\n  max_timeout_ms: 3600001\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': 3600001 is above the maximum 3600000"},
        {"limits:\n  max_timeout_ms: 999\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': 999 is below the minimum 1000"},
        {"limits:\n  max_timeout_ms: 99999999999999999999999\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': 99999999999999999999999 is above the "
         "maximum 3600000"},
        {"jetstream:\n  replicas: -1\n",
         "worker.yaml:2: key 'jetstream.replicas': -1 is below the minimum 1"},
        {"worker:\n  concurrency: -0\n  drain_timeout_s: -5\n",
         "worker.yaml:3: key 'worker.drain_timeout_s': -5 is below the minimum 0"},
        {"nats:\n  max_reconnects: -2\n",
         "worker.yaml:2: key 'nats.max_reconnects': -2 is below the minimum -1"},
        {"limits:\n  max_timeout_ms: 1.5\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': expected an integer, got '1.5'"},
        {"limits:\n  max_timeout_ms: 1e4\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': expected an integer, got '1e4'"},
        {"limits:\n  max_timeout_ms: 10_000\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': expected an integer, got '10_000'"},
        {"limits:\n  max_timeout_ms: 0x2000\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': expected a decimal integer, got '0x2000'"},
        {"local:\n  workspace_mb: 0755\n",
         "worker.yaml:2: key 'local.workspace_mb': expected a decimal integer, got '0755' (a "
         "leading 0 means octal)"},
        {"limits:\n  max_timeout_ms: \"5000\"\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': expected an integer, got the string '5000' "
         "(write it without quotes)"},
        {"limits:\n  max_timeout_ms: +\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': expected an integer, got '+'"},
        {"limits:\n  max_timeout_ms: 5000 ms\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': expected an integer, got '5000 ms'"},
        {"jetstream:\n  file_storage: yes\n",
         "worker.yaml:2: key 'jetstream.file_storage': expected true or false"},
        {"jetstream:\n  file_storage: 'true'\n",
         "worker.yaml:2: key 'jetstream.file_storage': expected true or false"},
        {"jetstream:\n  file_storage: 1\n",
         "worker.yaml:2: key 'jetstream.file_storage': expected true or false"},
        {"local:\n  isolation: sandbox\n",
         "worker.yaml:2: key 'local.isolation': expected one of auto, required, none"},
        {"local:\n  isolation: AUTO\n",
         "worker.yaml:2: key 'local.isolation': expected one of auto, required, none"},
    };
    check_errors(cases, sizeof(cases) / sizeof(cases[0]));
}

static void test_string_errors(void)
{
    static const struct error_case cases[] = {
        {"worker:\n  provider: docker\n",
         "worker.yaml:2: key 'worker.provider': expected one of local, cloudrun"},
        {"executor:\n  auth: iam\n",
         "worker.yaml:2: key 'executor.auth': expected one of unset, none, google-id-token"},
        {"executor:\n  clock_skew_s: 301\n",
         "worker.yaml:2: key 'executor.clock_skew_s': 301 is above the maximum 300"},
        {"worker:\n  log_level: trace\n",
         "worker.yaml:2: key 'worker.log_level': expected one of debug, info, warn, error"},
        {"nats:\n  name: \"\"\n", "worker.yaml:2: key 'nats.name': must not be empty"},
        {"nats:\n  token: \"a\\0b\"\n",
         "worker.yaml:2: key 'nats.token': the value contains a NUL character"},
        {"nats:\n  user: \"a\\nb\"\n",
         "worker.yaml:2: key 'nats.user': the value contains a control character"},
        {"nats:\n  url: nats://a:4222, nats://b:4222\n",
         "worker.yaml:2: key 'nats.url': expected one NATS URL or several separated by commas (no "
         "spaces), each [nats://|tls://][user:password@]host[:port] with a port of 1 to 65535, "
         "such as nats://127.0.0.1:4222, got 'nats://a:4222, nats://b:4222'"},
        {"nats:\n  url: ''\n",
         "worker.yaml:2: key 'nats.url': expected one NATS URL or several separated by commas (no "
         "spaces), each [nats://|tls://][user:password@]host[:port] with a port of 1 to 65535, "
         "such as nats://127.0.0.1:4222, got ''"},
        {"nats:\n  url: nats://127.0.0.1:99999\n",
         "worker.yaml:2: key 'nats.url': expected one NATS URL or several separated by commas (no "
         "spaces), each [nats://|tls://][user:password@]host[:port] with a port of 1 to 65535, "
         "such as nats://127.0.0.1:4222, got 'nats://127.0.0.1:99999'"},
        {"nats:\n  url: http://127.0.0.1:4222\n",
         "worker.yaml:2: key 'nats.url': expected one NATS URL or several separated by commas (no "
         "spaces), each [nats://|tls://][user:password@]host[:port] with a port of 1 to 65535, "
         "such as nats://127.0.0.1:4222, got 'http://127.0.0.1:4222'"},
        {"nats:\n  url: not a url\n",
         "worker.yaml:2: key 'nats.url': expected one NATS URL or several separated by commas (no "
         "spaces), each [nats://|tls://][user:password@]host[:port] with a port of 1 to 65535, "
         "such as nats://127.0.0.1:4222, got 'not a url'"},
        {"jetstream:\n  tasks_stream: CI TASKS\n",
         "worker.yaml:2: key 'jetstream.tasks_stream': expected a name of 1 to 64 letters, "
         "digits, '_' or '-', got 'CI TASKS'"},
        {"jetstream:\n  files_bucket: ci.files\n",
         "worker.yaml:2: key 'jetstream.files_bucket': expected a name of 1 to 64 letters, "
         "digits, '_' or '-', got 'ci.files'"},
        {"jetstream:\n  status_prefix: ci.status.>\n",
         "worker.yaml:2: key 'jetstream.status_prefix': expected a NATS subject of at most 128 "
         "characters without spaces or wildcards, such as ci.submit, got 'ci.status.>'"},
        {"jetstream:\n  submit_subject: ci..submit\n",
         "worker.yaml:2: key 'jetstream.submit_subject': expected a NATS subject of at most 128 "
         "characters without spaces or wildcards, such as ci.submit, got 'ci..submit'"},
        {"jetstream:\n  cancel_prefix: ci.*\n",
         "worker.yaml:2: key 'jetstream.cancel_prefix': expected a NATS subject of at most 128 "
         "characters without spaces or wildcards, such as ci.submit, got 'ci.*'"},
        {"worker:\n  id: my worker\n",
         "worker.yaml:2: key 'worker.id': expected an id of at most 128 letters, digits, '.', '_' "
         "or '-' (or \"\"), got 'my worker'"},
        {"local:\n  python: python3\n",
         "worker.yaml:2: key 'local.python': expected an absolute path, got 'python3'"},
        /* Long user text is cut in messages. */
        {"nats:\n  zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz: 1\n",
         "worker.yaml:2: key 'nats.zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz...': "
         "unknown key"},
    };
    check_errors(cases, sizeof(cases) / sizeof(cases[0]));
}

static void test_document_errors(void)
{
    static const struct error_case cases[] = {
        /* A syntax error is reported before a bad value above it. */
        {"nats:\n  url: [\n",
         "worker.yaml:3: YAML syntax error: did not find expected node content"},
        {"nats:\n  url: a\n url2: b\n",
         "worker.yaml:3: YAML syntax error: did not find expected key"},
        {"nats:\n\turl: a\n",
         "worker.yaml:2: YAML syntax error: found character that cannot start any token"},
        {"nats: {}\n\xff\n", "worker.yaml:2: YAML syntax error: invalid leading UTF-8 octet"},
        {"hello\n",
         "worker.yaml:1: expected a mapping with the sections nats, jetstream, worker, limits, "
         "sessions, batches, local, cloudrun, executor"},
        {"- nats\n",
         "worker.yaml:1: expected a mapping with the sections nats, jetstream, worker, limits, "
         "sessions, batches, local, cloudrun, executor"},
        {"nats: {}\n---\nlimits: {}\n", "worker.yaml:2: only one YAML document is allowed"},
    };
    check_errors(cases, sizeof(cases) / sizeof(cases[0]));
}

static void test_cross_field_rules(void)
{
    static const struct error_case cases[] = {
        {"limits:\n  default_timeout_ms: 70000\n",
         "worker.yaml:2: key 'limits.default_timeout_ms': 70000 is above limits.max_timeout_ms "
         "(60000)"},
        {"limits:\n  max_timeout_ms: 30000\n",
         "worker.yaml:2: key 'limits.max_timeout_ms': 30000 is below limits.default_timeout_ms "
         "(60000)"},
        {"limits:\n  max_timeout_ms: 30000\n  default_timeout_ms: 40000\n",
         "worker.yaml:3: key 'limits.default_timeout_ms': 40000 is above limits.max_timeout_ms "
         "(30000)"},
        {"limits:\n  default_timeout_ms: 40000\n\n  max_timeout_ms: 30000\n",
         "worker.yaml:4: key 'limits.max_timeout_ms': 30000 is below limits.default_timeout_ms "
         "(40000)"},
        {"limits:\n  default_memory_mb: 8192\n",
         "worker.yaml:2: key 'limits.default_memory_mb': 8192 is above limits.max_memory_mb "
         "(4096)"},
        {"limits:\n  max_memory_mb: 512\n",
         "worker.yaml:2: key 'limits.max_memory_mb': 512 is below limits.default_memory_mb (1024)"},
        {"jetstream:\n  max_age_s: 60\n",
         "worker.yaml:2: key 'jetstream.max_age_s': 60 is below jetstream.duplicate_window_s (120)"},
        {"sessions:\n  idle_s: 7200\n",
         "worker.yaml:2: key 'sessions.idle_s': 7200 is above jetstream.max_age_s (3600)"},
        {"sessions:\n  max_state_mb: 100\nlocal:\n  workspace_mb: 64\n",
         "worker.yaml:4: key 'local.workspace_mb': 64 is below sessions.max_state_mb (100)"},
        {"jetstream:\n  duplicate_window_s: 7200\n",
         "worker.yaml:2: key 'jetstream.duplicate_window_s': 7200 is above jetstream.max_age_s "
         "(3600)"},
        {"jetstream:\n  cancel_stream: CI_TASKS\n",
         "worker.yaml:2: key 'jetstream.cancel_stream': 'CI_TASKS' is also the value of "
         "jetstream.tasks_stream; each needs its own name"},
        {"jetstream:\n  submit_subject: ci.status.new\n",
         "worker.yaml:2: key 'jetstream.submit_subject': 'ci.status.new' overlaps "
         "jetstream.status_prefix ('ci.status'): the streams' subjects must not overlap"},
        {"jetstream:\n  cancel_prefix: ci.status.cancel\n",
         "worker.yaml:2: key 'jetstream.cancel_prefix': 'ci.status.cancel' overlaps "
         "jetstream.status_prefix ('ci.status'): the streams' subjects must not overlap"},
        {"jetstream:\n  output_stream: CI_STATUS\n",
         "worker.yaml:2: key 'jetstream.output_stream': 'CI_STATUS' is also the value of "
         "jetstream.status_stream; each needs its own name"},
        {"jetstream:\n  output_prefix: ci.status.out\n",
         "worker.yaml:2: key 'jetstream.output_prefix': 'ci.status.out' overlaps "
         "jetstream.status_prefix ('ci.status'): the streams' subjects must not overlap"},
        {"jetstream:\n  output_max_mb: 0\n",
         "worker.yaml:2: key 'jetstream.output_max_mb': 0 is below the minimum 1"},
        {"jetstream:\n  check_s: 0\n",
         "worker.yaml:2: key 'jetstream.check_s': 0 is below the minimum 1"},
        {"jetstream:\n  status_prefix: ci\n",
         "worker.yaml:2: key 'jetstream.status_prefix': 'ci' overlaps jetstream.submit_subject "
         "('ci.submit'): the streams' subjects must not overlap"},
        /* Batches (contract §20, §21). */
        {"batches:\n  duplicate_window_s: 90000\n",
         "worker.yaml:2: key 'batches.duplicate_window_s': 90000 is above batches.max_age_s "
         "(86400)"},
        {"batches:\n  duplicate_window_s: 600\n  max_age_s: 300\n",
         "worker.yaml:3: key 'batches.max_age_s': 300 is below batches.duplicate_window_s (600)"},
        {"jetstream:\n  batch_stream: CI_TASKS\n",
         "worker.yaml:2: key 'jetstream.batch_stream': 'CI_TASKS' is also the value of "
         "jetstream.tasks_stream; each needs its own name"},
        {"jetstream:\n  batch_events_stream: CI_BATCH\n",
         "worker.yaml:2: key 'jetstream.batch_events_stream': 'CI_BATCH' is also the value of "
         "jetstream.batch_stream; each needs its own name"},
        {"jetstream:\n  batch_consumer: ci-workers\n",
         "worker.yaml:2: key 'jetstream.batch_consumer': 'ci-workers' is also the value of "
         "jetstream.consumer; each needs its own name"},
        {"jetstream:\n  batch_subject: ci.submit\n",
         "worker.yaml:2: key 'jetstream.batch_subject': 'ci.submit' overlaps "
         "jetstream.submit_subject ('ci.submit'): the streams' subjects must not overlap"},
        {"jetstream:\n  batch_subject: ci.batches.x\n",
         "worker.yaml:2: key 'jetstream.batch_subject': 'ci.batches.x' overlaps "
         "jetstream.batch_events_prefix ('ci.batches'): the streams' subjects must not overlap"},
        {"jetstream:\n  batch_events_prefix: ci.status\n",
         "worker.yaml:2: key 'jetstream.batch_events_prefix': 'ci.status' overlaps "
         "jetstream.status_prefix ('ci.status'): the streams' subjects must not overlap"},
        {"worker:\n  batch_every: 0\n",
         "worker.yaml:2: key 'worker.batch_every': 0 is below the minimum 1"},
        {"worker:\n  batch_every: 1001\n",
         "worker.yaml:2: key 'worker.batch_every': 1001 is above the maximum 1000"},
    };
    check_errors(cases, sizeof(cases) / sizeof(cases[0]));

    /* Subjects that only look alike are fine: ci.statuses is not under ci.status. */
    struct ci_config *cfg = NULL;
    struct ci_error err = {{0}};
    ci_status s = load("jetstream:\n  submit_subject: ci.statuses\n  cancel_prefix: ci.stat\n",
                       &cfg, &err);
    if (s)
        fprintf(stderr, "  %s\n", err.msg);
    CHECK(s == CI_OK);
    ci_config_free(cfg);
    /* The bounds themselves are accepted. */
    s = load("limits:\n  default_timeout_ms: 3600000\n  max_timeout_ms: 3600000\n", &cfg, &err);
    CHECK(s == CI_OK);
    ci_config_free(cfg);
    /* A batch's default duplicate window gives way to a shorter max age;
     * names and subjects of the batch lane can be changed together. */
    s = load("batches:\n  max_age_s: 600\nworker:\n  batch_every: 1\njetstream:\n"
             "  batch_stream: B\n  batch_events_stream: BE\n  batch_subject: jobs.batch\n"
             "  batch_events_prefix: jobs.events\n  batch_consumer: bw\n",
             &cfg, &err);
    if (s)
        fprintf(stderr, "  %s\n", err.msg);
    REQUIRE(s == CI_OK);
    CHECK(cfg->batches.max_age_s == 600);
    CHECK(cfg->batches.duplicate_window_s == 600);
    CHECK(cfg->worker.batch_every == 1);
    CHECK_STR(cfg->jetstream.batch_subject, "jobs.batch");
    CHECK_STR(cfg->jetstream.batch_events_prefix, "jobs.events");
    CHECK_STR(cfg->jetstream.batch_consumer, "bw");
    ci_config_free(cfg);
}

/* Loads text that must load; says why when it does not. */
static void load_ok(const char *text)
{
    struct ci_config *cfg = NULL;
    struct ci_error err = {{0}};
    ci_status s = load(text, &cfg, &err);
    if (s)
        fprintf(stderr, "  refused: %s\n%s", err.msg, text);
    CHECK(s == CI_OK);
    ci_config_free(cfg);
}

/* local.task_uid_*: a range of its own, not holding init's uid, not past
 * the last uid, large enough for the slots (and the warm pool). */
static void test_task_uids(void)
{
    static const struct error_case cases[] = {
        {"local:\n  task_uid_first: 65000\n",
         "worker.yaml:2: key 'local.task_uid_first': the range 65000-69999 holds "
         "local.sandbox_uid (65534), the sandbox's init: the tasks' uids must be others"},
        {"local:\n  task_uid_first: 4294967000\n",
         "worker.yaml:2: key 'local.task_uid_count': 5000 uids from 4294967000 go past the last "
         "uid (4294967294)"},
        {"worker:\n  concurrency: 4\nlocal:\n  task_uid_count: 25\n",
         "worker.yaml:4: key 'local.task_uid_count': 25 is too small: 4 task slots and the warm "
         "pool need 26 uids (0 runs every task as local.sandbox_uid)"},
        {"worker:\n  concurrency: 4\nlocal:\n  mode: cold\n  task_uid_count: 3\n",
         "worker.yaml:5: key 'local.task_uid_count': 3 is too small: 4 task slots need 4 uids "
         "(0 runs every task as local.sandbox_uid)"},
    };
    check_errors(cases, sizeof(cases) / sizeof(cases[0]));
    load_ok("worker:\n  concurrency: 4\nlocal:\n  task_uid_count: 26\n");
    load_ok("worker:\n  concurrency: 4\nlocal:\n  mode: cold\n  task_uid_count: 4\n");
    load_ok("local:\n  task_uid_first: 65000\n  task_uid_count: 0\n");
}

/* cloudrun.service_url: https anywhere, plain http only to loopback (the
 * ID token is a bearer credential), a base URL without user, query or
 * fragment; checked whenever it is set. */
static void test_cloudrun_service_url(void)
{
    unsetenv("CI_NATS_URL");
    static const char *const good[] = {
        "https://ci-executor-abc123-ew.a.run.app",
        "https://ci-executor-abc123-ew.a.run.app/",
        "https://executor.internal:8443/ci/v1",
        "'https://[2001:db8::1]:8443/x'",
        "https://10.0.0.5",
        "http://127.0.0.1:8080",
        "http://127.200.3.4",
        "http://localhost:9000/",
        "http://LOCALHOST",
        "'http://[::1]:8080'",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        char text[256];
        snprintf(text, sizeof(text), "cloudrun:\n  service_url: %s\n", good[i]);
        load_ok(text);
    }
    static const char *const clear[] = {
        "http://10.0.0.5:8080",         "http://ci-executor.example.com",
        "http://128.0.0.1",             "http://127.0.0.1.nip.io",
        "http://localhost.example.com", "'http://[::2]:80'",
        "'http://[::ffff:10.0.0.1]'",   "http://0x7f000001",
        "http://2130706433",
    };
    for (size_t i = 0; i < sizeof(clear) / sizeof(clear[0]); i++) {
        char text[256], want[512];
        snprintf(text, sizeof(text), "worker:\n  provider: cloudrun\ncloudrun:\n  service_url: %s\n",
                 clear[i]);
        const char *url = clear[i][0] == '\'' ? clear[i] + 1 : clear[i];
        size_t ulen = strlen(url) - (clear[i][0] == '\'' ? 1 : 0);
        snprintf(want, sizeof(want),
                 "worker.yaml:4: key 'cloudrun.service_url': http:// would send the worker's ID "
                 "token unencrypted; it is allowed only to a loopback host (127.0.0.0/8, [::1], "
                 "localhost): use https://, got '%.*s'",
                 (int)ulen, url);
        const char *got = load_error(text);
        if (strcmp(got, want) != 0)
            fprintf(stderr, "  case %zu:\n%s", i, text);
        CHECK_STR(got, want);
    }
    static const char *const malformed[] = {
        "ftp://x.example.com", "https://",          "executor.example.com",
        "https://user:pw@x.example.com", "https://x.example.com/execute?a=1",
        "https://x.example.com/#frag",   "'https://x.example.com/a b'",
        "https://x.example.com:0",       "https://x.example.com:65536",
        "'https://x.example.com:'",      "'https://[zz]:80'",
        "HTTPS://x.example.com",         "https://x.example.com\\\\a",
    };
    for (size_t i = 0; i < sizeof(malformed) / sizeof(malformed[0]); i++) {
        char text[256];
        snprintf(text, sizeof(text), "cloudrun:\n  service_url: %s\n", malformed[i]);
        const char *got = load_error(text);
        if (!strstr(got, "worker.yaml:2: key 'cloudrun.service_url': expected the executor "
                         "service's base URL, https://host[:port][/path] without user, query or "
                         "fragment, got '"))
            fprintf(stderr, "  case %zu: %s\n", i, got);
        CHECK_CONTAINS(got, "worker.yaml:2: key 'cloudrun.service_url': expected the executor "
                            "service's base URL");
    }
    /* Required with the cloudrun provider: said at load, not by every task. */
    static const struct error_case cases[] = {
        {"worker:\n  provider: cloudrun\n",
         "worker.yaml:2: key 'worker.provider': cloudrun.service_url must be the executor "
         "service's URL (https://...) when worker.provider is cloudrun"},
        {"worker:\n  provider: cloudrun\ncloudrun:\n  audience: x\n  service_url: \"\"\n",
         "worker.yaml:5: key 'cloudrun.service_url': must be the executor service's URL "
         "(https://...) when worker.provider is cloudrun"},
    };
    check_errors(cases, sizeof(cases) / sizeof(cases[0]));
}

#define PEM "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n"

/* cloudrun.ca_file, with the cloudrun provider: a PEM bundle that can be
 * read, or the load fails naming the file (not every task at run time). */
static void test_cloudrun_ca_file(void)
{
    unsetenv("CI_NATS_URL");
    char dir[128], ca[160], text[512];
    snprintf(dir, sizeof(dir), "%s/ca", tmpdir);
    REQUIRE(mkdir(dir, 0700) == 0 || errno == EEXIST);
    const char *head = "worker:\n  provider: cloudrun\ncloudrun:\n"
                       "  service_url: https://x.a.run.app\n  ca_file: ";

    snprintf(ca, sizeof(ca), "%s/missing.pem", dir);
    snprintf(text, sizeof(text), "%s%s\n", head, ca);
    const char *got = load_error(text);
    CHECK_CONTAINS(got, "worker.yaml:5: key 'cloudrun.ca_file': cannot read the CA bundle '");
    CHECK_CONTAINS(got, "missing.pem': No such file or directory");

    snprintf(text, sizeof(text), "%s%s\n", head, dir);
    CHECK_CONTAINS(load_error(text), "worker.yaml:5: key 'cloudrun.ca_file': the CA bundle '");
    CHECK_CONTAINS(load_error(text), "/ca' is not a regular file");

    snprintf(ca, sizeof(ca), "%s/der.crt", dir);
    FILE *f = fopen(ca, "w");
    REQUIRE(f);
    fputs("0\x82\x01\xb3 not PEM at all", f);
    fclose(f);
    snprintf(text, sizeof(text), "%s%s\n", head, ca);
    CHECK_CONTAINS(load_error(text), "der.crt' holds no PEM certificate (-----BEGIN CERTIFICATE");
    f = fopen(ca, "w");
    REQUIRE(f);
    fputs("-----BEGIN CERTIFICATE-----\nMIIB\n", f); /* cut short */
    fclose(f);
    CHECK_CONTAINS(load_error(text), "der.crt' holds no PEM certificate");

    if (geteuid() != 0) { /* root reads a mode-0 file anyway */
        snprintf(ca, sizeof(ca), "%s/closed.pem", dir);
        f = fopen(ca, "w");
        REQUIRE(f);
        fputs(PEM, f);
        fclose(f);
        chmod(ca, 0);
        snprintf(text, sizeof(text), "%s%s\n", head, ca);
        CHECK_CONTAINS(load_error(text), "closed.pem': Permission denied");
        unlink(ca);
    }

    snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
    f = fopen(ca, "w");
    REQUIRE(f);
    fputs("# a comment\n" PEM PEM, f);
    fclose(f);
    snprintf(text, sizeof(text), "%s%s\n", head, ca);
    load_ok(text);
    /* The local provider does not use it: not checked. */
    snprintf(text, sizeof(text), "cloudrun:\n  ca_file: %s/missing.pem\n", dir);
    load_ok(text);

    unlink(ca);
    snprintf(ca, sizeof(ca), "%s/der.crt", dir);
    unlink(ca);
    rmdir(dir);
}

static void test_file_errors(void)
{
    struct ci_config *cfg = NULL;
    struct ci_error err = {{0}};
    char path[128];
    snprintf(path, sizeof(path), "%s/missing.yaml", tmpdir);
    CHECK(ci_config_load(path, &cfg, &err) == CI_ERR_IO);
    CHECK_CONTAINS(err.msg, path);
    CHECK_CONTAINS(err.msg, "No such file");
    CHECK(cfg == NULL);

    CHECK(ci_config_load(tmpdir, &cfg, &err) == CI_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "is not a regular file");

    /* The basename of the file is what messages show. */
    const char *p = write_file("prod.yml", "nats:\n  nope: 1\n", 16);
    REQUIRE(p);
    CHECK(ci_config_load(p, &cfg, &err) == CI_ERR_INVALID);
    CHECK_STR(err.msg, "prod.yml:2: key 'nats.nope': unknown key");

    /* 1 MiB of comments is fine; one byte more is refused. */
    size_t big = 1024 * 1024;
    char *text = malloc(big + 1);
    REQUIRE(text);
    memset(text, '#', big + 1);
    text[0] = '#';
    p = write_file("big.yaml", text, big);
    REQUIRE(p);
    CHECK(ci_config_load(p, &cfg, &err) == CI_OK);
    ci_config_free(cfg);
    cfg = NULL;
    p = write_file("big.yaml", text, big + 1);
    REQUIRE(p);
    CHECK(ci_config_load(p, &cfg, &err) == CI_ERR_INVALID);
    CHECK_STR(err.msg, "big.yaml: the file is larger than 1048576 bytes");
    CHECK(ci_config_parse("mem", (const uint8_t *)text, big + 1, &cfg, &err) == CI_ERR_INVALID);
    CHECK_STR(err.msg, "mem: the file is 1048577 bytes; the limit is 1048576");
    CHECK(cfg == NULL);
    free(text);
}

static void test_parse_from_memory(void)
{
    unsetenv("CI_NATS_URL");
    struct ci_config *cfg = NULL;
    struct ci_error err = {{0}};
    const char *y = "worker:\n  concurrency: 7\n";
    REQUIRE(ci_config_parse("x.yaml", (const uint8_t *)y, strlen(y), &cfg, &err) == CI_OK);
    CHECK(cfg->worker.concurrency == 7);
    ci_config_free(cfg);
    cfg = NULL;
    /* Not NUL-terminated: the parser must stop at len. */
    const char *z = "worker:\n  concurrency: 7\n  bogus: 1\n";
    REQUIRE(ci_config_parse("x.yaml", (const uint8_t *)z, strlen(y), &cfg, &err) == CI_OK);
    ci_config_free(cfg);
    CHECK(ci_config_parse("x.yaml", NULL, 0, &cfg, &err) == CI_OK);
    ci_config_free(cfg);
}

static void test_env_overrides_url(void)
{
    struct ci_config *cfg = NULL;
    struct ci_error err = {{0}};
    setenv("CI_NATS_URL", "nats://127.0.0.2:5222", 1);
    REQUIRE(load("nats:\n  url: nats://127.0.0.1:7777\n", &cfg, &err) == CI_OK);
    CHECK_STR(cfg->nats.url, "nats://127.0.0.2:5222");
    ci_config_free(cfg);
    REQUIRE(ci_config_defaults(&cfg, &err) == CI_OK);
    CHECK_STR(cfg->nats.url, "nats://127.0.0.2:5222");
    ci_config_free(cfg);

    setenv("CI_NATS_URL", "", 1); /* empty = not set */
    REQUIRE(load("nats:\n  url: nats://127.0.0.1:7777\n", &cfg, &err) == CI_OK);
    CHECK_STR(cfg->nats.url, "nats://127.0.0.1:7777");
    ci_config_free(cfg);

    setenv("CI_NATS_URL", "nats://a b", 1);
    cfg = NULL;
    CHECK(load("", &cfg, &err) == CI_ERR_INVALID);
    CHECK(cfg == NULL);
    CHECK_STR(err.msg, "CI_NATS_URL: expected one NATS URL or several separated by commas (no "
                       "spaces), each [nats://|tls://][user:password@]host[:port] with a port of "
                       "1 to 65535, such as nats://127.0.0.1:4222, got 'nats://a b'");
    unsetenv("CI_NATS_URL");
}

static void test_dump_redacts_secrets(void)
{
    unsetenv("CI_NATS_URL");
    struct ci_config *cfg = NULL;
    struct ci_error err = {{0}};
    REQUIRE(load("nats:\n"
                 "  url: nats://alice:pw1@h1:4222,tls://tok2@h2:4222,h3:4222\n"
                 "  token: tok-secret\n"
                 "  user: alice\n"
                 "  password: \"pa\\\"ss\"\n"
                 "  nkey_seed_file: /etc/ci/seed.nk\n"
                 "worker:\n  id: w1\n",
                 &cfg, &err) == CI_OK);
    char *text = dump(cfg);
    REQUIRE(text);
    CHECK_CONTAINS(text, "nats:\n  url: \"nats://<redacted>@h1:4222,tls://<redacted>@h2:4222,"
                         "h3:4222\"\n");
    CHECK_CONTAINS(text, "\n  token: \"<redacted>\"\n");
    CHECK_CONTAINS(text, "\n  password: \"<redacted>\"\n");
    CHECK_CONTAINS(text, "\n  user: \"alice\"\n");
    CHECK_CONTAINS(text, "\n  nkey_seed_file: \"/etc/ci/seed.nk\"\n");
    CHECK_CONTAINS(text, "\nworker:\n  id: \"w1\"\n");
    CHECK_CONTAINS(text, "\n  max_reconnects: -1\n");
    CHECK_CONTAINS(text, "\n  file_storage: true\n");
    CHECK_CONTAINS(text, "\n  isolation: auto\n");
    CHECK(!strstr(text, "tok-secret"));
    CHECK(!strstr(text, "pw1"));
    CHECK(!strstr(text, "tok2"));
    CHECK(!strstr(text, "pa\\\"ss"));
    free(text);
    ci_config_free(cfg);

    /* Unset secrets show as empty, not as redacted. */
    text = dump_defaults();
    REQUIRE(text);
    CHECK_CONTAINS(text, "\n  token: \"\"\n");
    CHECK(!strstr(text, "<redacted>"));
    free(text);
}

static void test_dump_reads_back(void)
{
    unsetenv("CI_NATS_URL");
    struct ci_config *a = NULL, *b = NULL;
    struct ci_error err = {{0}};
    REQUIRE(load("nats:\n  name: \"caf\\u00e9 \\\"q\\\" \\\\ \\U0001F600 #x\"\n"
                 "  tls_ca: '/etc/ssl/ca: x.pem'\n"
                 "worker:\n  concurrency: 12\nlocal:\n  isolation: none\n",
                 &a, &err) == CI_OK);
    char *ta = dump(a);
    REQUIRE(ta);
    CHECK_CONTAINS(ta, "  name: \"caf\\u00E9 \\\"q\\\" \\\\ \\U0001F600 #x\"\n");
    REQUIRE(ci_config_parse("dump", (const uint8_t *)ta, strlen(ta), &b, &err) == CI_OK);
    CHECK_STR(b->nats.name, a->nats.name);
    CHECK_STR(b->nats.tls_ca, "/etc/ssl/ca: x.pem");
    CHECK(b->worker.concurrency == 12);
    CHECK(b->local.isolation == CI_ISOLATION_NONE);
    char *tb = dump(b);
    CHECK_STR(ta, tb);
    free(ta);
    free(tb);
    ci_config_free(a);
    ci_config_free(b);
}

static void cleanup_tmpdir(void)
{
    static const char *const names[] = {"worker.yaml", "prod.yml", "big.yaml"};
    char path[128];
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", tmpdir, names[i]);
        unlink(path);
    }
    rmdir(tmpdir);
}

static const struct t_case cases[] = {
    T(test_empty_file_gives_defaults),
    T(test_defaults_function),
    T(test_reference_config_loads_with_defaults),
    T(test_reference_config_lists_every_key),
    T(test_values_are_read),
    T(test_key_errors),
    T(test_number_errors),
    T(test_string_errors),
    T(test_document_errors),
    T(test_cross_field_rules),
    T(test_cloudrun_service_url),
    T(test_cloudrun_ca_file),
    T(test_task_uids),
    T(test_file_errors),
    T(test_parse_from_memory),
    T(test_env_overrides_url),
    T(test_dump_redacts_secrets),
    T(test_dump_reads_back),
};

int main(int argc, char **argv)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/ci-test-config-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    int rc = t_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
    cleanup_tmpdir();
    return rc;
}
