/* config.c - the worker's configuration.
 *
 * Configuration is data: ci_config_keys[] below lists every key once, with its
 * type, bounds, default and place in struct ci_config. The loader walks
 * libyaml's events (never building a document tree) and fills the struct from
 * that table; ci_config_rules[] then checks the keys that depend on each other.
 * The first problem stops the load with "FILE:LINE: key 'x': what is wrong".
 *
 * Which YAML we accept, deliberately narrower than YAML 1.1:
 * - integers: decimal digits with an optional sign. Octal (0755), hex (0x1f),
 *   binary, '_' separators, floats and size suffixes are refused, so that a
 *   value never means something other than what it looks like.
 * - booleans: true/false (also True/TRUE/False/FALSE), as in YAML 1.2. YAML
 *   1.1's yes/no/on/off are refused: "no" for a country code is a classic trap.
 * - a quoted number or boolean is a string and is refused for such a key.
 * - strings: plain, single- or double-quoted, or block scalars.
 * - a plain empty value, ~, null, Null or NULL keeps the default.
 * - tags (!!int) and aliases (*x) are refused; anchors are ignored. */
#include "core/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

#include "core/log.h"
#include "core/util.h"

#define CI_CONFIG_MAX_FILE_BYTES (1024 * 1024)
#define CI_CONFIG_MAX_STRING 4096 /* bytes of any one string value */
#define CI_CONFIG_MAX_NAME 64     /* stream, consumer and bucket names */
#define CI_CONFIG_MAX_SUBJECT 128 /* a task id (64) is appended to prefixes */
#define CI_CONFIG_MAX_ID 128
#define CI_CONFIG_MAX_CA_BYTES (16 * 1024 * 1024) /* Debian's whole bundle is ~220 KiB */

enum ci_ctype { CT_STRING, CT_UINT32, CT_INT32, CT_BOOL, CT_ENUM };

/* What a string value must look like. */
enum ci_cstr {
    CS_ANY,      /* any text without control characters; "" = not set */
    CS_NONEMPTY, /* the same, not empty */
    CS_URL,      /* comma-separated URLs: printable ASCII, no spaces */
    CS_NAME,     /* stream, consumer or bucket name: [A-Za-z0-9_-]{1,64} */
    CS_SUBJECT,  /* literal NATS subject: '.'-separated tokens, no wildcards */
    CS_ID,       /* "" or [A-Za-z0-9._-]{1,128} */
    CS_ABSPATH,  /* an absolute path */
    CS_HOSTPORT, /* "" or a listen address: IPv4:port or [IPv6]:port, numeric */
    CS_SERVICE,  /* "" or the executor's base URL: https://, or http:// to loopback */
    CS_ONEOF,    /* one of names[] */
};

struct ci_config_key {
    const char *key; /* "section.field"; field = the struct member's name */
    enum ci_ctype type;
    size_t offset;   /* into struct ci_config */
    bool secret;     /* ci_config_dump shows "<redacted>" when set */
    enum ci_cstr check;       /* CT_STRING */
    const char *str_def;      /* CT_STRING */
    int64_t num_def;          /* CT_UINT32, CT_INT32, CT_BOOL (0/1), CT_ENUM (index) */
    int64_t min, max;         /* CT_UINT32, CT_INT32 */
    const char *const *names; /* CT_ENUM (index = value), CS_ONEOF; NULL-terminated */
};

static const char *const isolation_names[] = {"auto", "required", "none", NULL};
static const char *const mode_names[] = {"cold", "warm", NULL};
static const char *const provider_names[] = {"local", "cloudrun", NULL};
static const char *const auth_names[] = {"unset", "none", "google-id-token", NULL};

_Static_assert(CI_ISOLATION_AUTO == 0 && CI_ISOLATION_REQUIRED == 1 && CI_ISOLATION_NONE == 2,
               "isolation_names[] is indexed by enum ci_isolation");
_Static_assert(sizeof(enum ci_isolation) == sizeof(int), "CT_ENUM stores an int");
_Static_assert(CI_MODE_COLD == 0 && CI_MODE_WARM == 1 && sizeof(enum ci_sandbox_mode) == sizeof(int),
               "mode_names[] is indexed by enum ci_sandbox_mode");
_Static_assert(CI_AUTH_UNSET == 0 && CI_AUTH_NONE == 1 && CI_AUTH_GOOGLE_ID_TOKEN == 2 &&
                   sizeof(enum ci_executor_auth) == sizeof(int),
               "auth_names[] is indexed by enum ci_executor_auth");

/* The offset of a member that must have type T: a key whose type does not
 * match its field fails to compile. */
#define FIELD(f, T) _Generic(((struct ci_config *)0)->f, T: offsetof(struct ci_config, f))

#define KEY_STR(k, f, def, chk) \
    {.key = k, .type = CT_STRING, .offset = FIELD(f, char *), .check = chk, .str_def = def}
#define KEY_SECRET(k, f) \
    {.key = k, .type = CT_STRING, .offset = FIELD(f, char *), .secret = true, .check = CS_ANY, \
     .str_def = ""}
#define KEY_ONEOF(k, f, def, list) \
    {.key = k, .type = CT_STRING, .offset = FIELD(f, char *), .check = CS_ONEOF, \
     .str_def = def, .names = list}
#define KEY_U32(k, f, def, lo, hi) \
    {.key = k, .type = CT_UINT32, .offset = FIELD(f, uint32_t), .num_def = def, .min = lo, \
     .max = hi}
#define KEY_I32(k, f, def, lo, hi) \
    {.key = k, .type = CT_INT32, .offset = FIELD(f, int32_t), .num_def = def, .min = lo, \
     .max = hi}
#define KEY_BOOL(k, f, def) {.key = k, .type = CT_BOOL, .offset = FIELD(f, bool), .num_def = def}
#define KEY_ENUM(k, f, T, def, list) \
    {.key = k, .type = CT_ENUM, .offset = FIELD(f, T), .num_def = def, .names = list}

#define MiB (1024 * 1024)

/* Every key, in the order of config/worker.yaml and of ci_config_dump. The
 * reasons for each bound are in config/worker.yaml. */
static const struct ci_config_key ci_config_keys[] = {
    KEY_STR("nats.url", nats.url, "nats://127.0.0.1:4222", CS_URL),
    KEY_STR("nats.name", nats.name, "ci-worker", CS_NONEMPTY),
    KEY_STR("nats.creds_file", nats.creds_file, "", CS_ANY),
    KEY_STR("nats.nkey_seed_file", nats.nkey_seed_file, "", CS_ANY),
    KEY_SECRET("nats.token", nats.token),
    KEY_STR("nats.user", nats.user, "", CS_ANY),
    KEY_SECRET("nats.password", nats.password),
    KEY_STR("nats.tls_ca", nats.tls_ca, "", CS_ANY),
    KEY_STR("nats.tls_cert", nats.tls_cert, "", CS_ANY),
    KEY_STR("nats.tls_key", nats.tls_key, "", CS_ANY),
    KEY_U32("nats.connect_timeout_ms", nats.connect_timeout_ms, 5000, 100, 600000),
    KEY_I32("nats.max_reconnects", nats.max_reconnects, -1, -1, 1000000),
    KEY_U32("nats.reconnect_wait_ms", nats.reconnect_wait_ms, 1000, 10, 600000),
    KEY_U32("nats.write_deadline_ms", nats.write_deadline_ms, 10000, 0, 600000),

    KEY_STR("jetstream.tasks_stream", jetstream.tasks_stream, "CI_TASKS", CS_NAME),
    KEY_STR("jetstream.submit_subject", jetstream.submit_subject, "ci.submit", CS_SUBJECT),
    KEY_STR("jetstream.consumer", jetstream.consumer, "ci-workers", CS_NAME),
    KEY_STR("jetstream.status_stream", jetstream.status_stream, "CI_STATUS", CS_NAME),
    KEY_STR("jetstream.status_prefix", jetstream.status_prefix, "ci.status", CS_SUBJECT),
    KEY_STR("jetstream.cancel_stream", jetstream.cancel_stream, "CI_CANCEL", CS_NAME),
    KEY_STR("jetstream.cancel_prefix", jetstream.cancel_prefix, "ci.cancel", CS_SUBJECT),
    KEY_STR("jetstream.output_stream", jetstream.output_stream, "CI_OUTPUT", CS_NAME),
    KEY_STR("jetstream.output_prefix", jetstream.output_prefix, "ci.out", CS_SUBJECT),
    KEY_STR("jetstream.results_bucket", jetstream.results_bucket, "ci-results", CS_NAME),
    KEY_STR("jetstream.files_bucket", jetstream.files_bucket, "ci-files", CS_NAME),
    KEY_STR("jetstream.workers_bucket", jetstream.workers_bucket, "ci-workers", CS_NAME),
    KEY_STR("jetstream.sessions_bucket", jetstream.sessions_bucket, "ci-sessions", CS_NAME),
    KEY_STR("jetstream.runtimes_bucket", jetstream.runtimes_bucket, "ci-runtimes", CS_NAME),
    KEY_STR("jetstream.batch_stream", jetstream.batch_stream, "CI_BATCH", CS_NAME),
    KEY_STR("jetstream.batch_subject", jetstream.batch_subject, "ci.batch", CS_SUBJECT),
    KEY_STR("jetstream.batch_consumer", jetstream.batch_consumer, "ci-workers-batch", CS_NAME),
    KEY_STR("jetstream.batch_events_stream", jetstream.batch_events_stream, "CI_BATCHES",
            CS_NAME),
    KEY_STR("jetstream.batch_events_prefix", jetstream.batch_events_prefix, "ci.batches",
            CS_SUBJECT),
    KEY_U32("jetstream.max_age_s", jetstream.max_age_s, 3600, 60, 31536000),
    KEY_U32("jetstream.duplicate_window_s", jetstream.duplicate_window_s, 120, 1, 86400),
    KEY_U32("jetstream.ack_wait_s", jetstream.ack_wait_s, 30, 5, 3600),
    KEY_U32("jetstream.max_deliver", jetstream.max_deliver, 5, 1, 100),
    KEY_U32("jetstream.replicas", jetstream.replicas, 1, 1, 5),
    KEY_BOOL("jetstream.file_storage", jetstream.file_storage, true),
    KEY_U32("jetstream.files_max_mb", jetstream.files_max_mb, 0, 0, 16777216),
    KEY_BOOL("jetstream.live_output", jetstream.live_output, true),
    KEY_U32("jetstream.output_max_mb", jetstream.output_max_mb, 1024, 1, 16777216),
    KEY_U32("jetstream.check_s", jetstream.check_s, 15, 1, 3600),

    KEY_STR("worker.id", worker.id, "", CS_ID),
    KEY_U32("worker.concurrency", worker.concurrency, 0, 0, 1024),
    KEY_ONEOF("worker.provider", worker.provider, "local", provider_names),
    KEY_U32("worker.drain_timeout_s", worker.drain_timeout_s, 90, 0, 86400),
    KEY_ONEOF("worker.log_level", worker.log_level, "info", ci_log_level_names),
    KEY_STR("worker.metrics_addr", worker.metrics_addr, "127.0.0.1:9464", CS_HOSTPORT),
    KEY_U32("worker.heartbeat_s", worker.heartbeat_s, 10, 0, 3600),
    KEY_U32("worker.batch_every", worker.batch_every, 4, 1, 1000),

    KEY_U32("limits.default_timeout_ms", limits.default_timeout_ms, 60000, 100, 3600000),
    KEY_U32("limits.max_timeout_ms", limits.max_timeout_ms, 60000, 1000, 3600000),
    KEY_U32("limits.default_memory_mb", limits.default_memory_mb, 1024, 32, 262144),
    KEY_U32("limits.max_memory_mb", limits.max_memory_mb, 4096, 32, 262144),
    KEY_U32("limits.max_code_bytes", limits.max_code_bytes, 1 * MiB, 1, 64 * MiB),
    KEY_U32("limits.max_input_bytes", limits.max_input_bytes, 20 * MiB, 0, 1024 * MiB),
    KEY_U32("limits.max_artifact_bytes", limits.max_artifact_bytes, 20 * MiB, 0, 1024 * MiB),
    KEY_U32("limits.max_output_bytes", limits.max_output_bytes, 1 * MiB, 1024, 16 * MiB),

    KEY_U32("sessions.max_state_mb", sessions.max_state_mb, 64, 1, 1024),
    KEY_U32("sessions.idle_s", sessions.idle_s, 1200, 1, 31536000),
    KEY_U32("sessions.max_waiting", sessions.max_waiting, 64, 1, 4096),

    KEY_U32("batches.max_age_s", batches.max_age_s, 86400, 60, 31536000),
    KEY_U32("batches.duplicate_window_s", batches.duplicate_window_s, 3600, 1, 604800),

    KEY_ENUM("local.isolation", local.isolation, enum ci_isolation, CI_ISOLATION_AUTO,
             isolation_names),
    KEY_STR("local.python", local.python, "/usr/bin/python3", CS_ABSPATH),
    KEY_U32("local.sandbox_uid", local.sandbox_uid, 65534, 1, 4294967294u),
    KEY_U32("local.sandbox_gid", local.sandbox_gid, 65534, 1, 4294967294u),
    KEY_U32("local.task_uid_first", local.task_uid_first, 2000000000u, 1, 4294967294u),
    KEY_U32("local.task_uid_count", local.task_uid_count, 5000, 0, 1u << 24),
    KEY_U32("local.workspace_mb", local.workspace_mb, 256, 1, 65536),
    KEY_U32("local.tmp_mb", local.tmp_mb, 64, 1, 65536),
    KEY_U32("local.max_processes", local.max_processes, 64, 1, 65536),
    KEY_U32("local.max_open_files", local.max_open_files, 256, 32, 65536),
    KEY_U32("local.cpus", local.cpus, 1, 1, 1024),
    KEY_BOOL("local.require_cgroup", local.require_cgroup, false),
    KEY_ENUM("local.mode", local.mode, enum ci_sandbox_mode, CI_MODE_WARM, mode_names),
    KEY_U32("local.warm_pool_size", local.warm_pool_size, 1, 1, 16),
    KEY_U32("local.warm_spares", local.warm_spares, 1, 0, 16),
    KEY_U32("local.warm_rotate_after", local.warm_rotate_after, 200, 1, 1000000),
    KEY_STR("local.zygote", local.zygote, "", CS_ANY),

    KEY_STR("cloudrun.service_url", cloudrun.service_url, "", CS_SERVICE),
    KEY_STR("cloudrun.audience", cloudrun.audience, "", CS_ANY),
    KEY_STR("cloudrun.metadata_url", cloudrun.metadata_url,
            "http://metadata.google.internal/computeMetadata/v1/instance/service-accounts/"
            "default/identity",
            CS_NONEMPTY),
    KEY_STR("cloudrun.token_file", cloudrun.token_file, "", CS_ANY),
    KEY_U32("cloudrun.token_refresh_margin_s", cloudrun.token_refresh_margin_s, 300, 0, 3600),
    KEY_U32("cloudrun.timeout_margin_ms", cloudrun.timeout_margin_ms, 30000, 0, 600000),
    KEY_U32("cloudrun.max_attempts", cloudrun.max_attempts, 0, 0, 1000),
    KEY_U32("cloudrun.backoff_initial_ms", cloudrun.backoff_initial_ms, 200, 1, 60000),
    KEY_U32("cloudrun.backoff_max_ms", cloudrun.backoff_max_ms, 5000, 1, 600000),
    KEY_STR("cloudrun.ca_file", cloudrun.ca_file, "", CS_ANY),
    KEY_U32("cloudrun.connect_timeout_ms", cloudrun.connect_timeout_ms, 5000, 100, 600000),

    KEY_ENUM("executor.auth", executor.auth, enum ci_executor_auth, CI_AUTH_UNSET, auth_names),
    KEY_STR("executor.audience", executor.audience, "", CS_ANY),
    KEY_STR("executor.jwks_file", executor.jwks_file, "", CS_ANY),
    KEY_STR("executor.allowed_emails", executor.allowed_emails, "", CS_ANY),
    KEY_U32("executor.clock_skew_s", executor.clock_skew_s, 60, 0, 300),
    KEY_U32("executor.max_connections_per_ip", executor.max_connections_per_ip, 0, 0, 65535),
};

#define CI_N_KEYS (sizeof(ci_config_keys) / sizeof(ci_config_keys[0]))
_Static_assert(CI_N_KEYS <= 64 * sizeof(((struct ci_config *)0)->set_in_file) / sizeof(uint64_t),
               "set_in_file has a bit for every key");

/* Rules between two keys, checked after the whole file is read. A failure is
 * reported at whichever of the two keys comes later in the file. */
enum ci_rule_kind {
    RULE_LE,          /* a <= b (uint32) */
    RULE_DIFFERENT,   /* a != b (names of streams that would otherwise be one) */
    RULE_NOT_UNDER,   /* subject a is not taken in by the stream on b.> */
    RULE_DISJOINT,    /* streams on a.> and b.> share no subject */
};

static const struct ci_config_rule {
    enum ci_rule_kind kind;
    const char *a, *b;
} ci_config_rules[] = {
    {RULE_LE, "limits.default_timeout_ms", "limits.max_timeout_ms"},
    {RULE_LE, "limits.default_memory_mb", "limits.max_memory_mb"},
    {RULE_LE, "jetstream.duplicate_window_s", "jetstream.max_age_s"},
    {RULE_LE, "sessions.idle_s", "jetstream.max_age_s"},
    {RULE_LE, "sessions.max_state_mb", "local.workspace_mb"},
    {RULE_LE, "cloudrun.backoff_initial_ms", "cloudrun.backoff_max_ms"},
    {RULE_DIFFERENT, "jetstream.tasks_stream", "jetstream.status_stream"},
    {RULE_DIFFERENT, "jetstream.tasks_stream", "jetstream.cancel_stream"},
    {RULE_DIFFERENT, "jetstream.status_stream", "jetstream.cancel_stream"},
    {RULE_DIFFERENT, "jetstream.tasks_stream", "jetstream.output_stream"},
    {RULE_DIFFERENT, "jetstream.status_stream", "jetstream.output_stream"},
    {RULE_DIFFERENT, "jetstream.cancel_stream", "jetstream.output_stream"},
    {RULE_NOT_UNDER, "jetstream.submit_subject", "jetstream.status_prefix"},
    {RULE_NOT_UNDER, "jetstream.submit_subject", "jetstream.cancel_prefix"},
    {RULE_NOT_UNDER, "jetstream.submit_subject", "jetstream.output_prefix"},
    {RULE_DISJOINT, "jetstream.status_prefix", "jetstream.cancel_prefix"},
    {RULE_DISJOINT, "jetstream.status_prefix", "jetstream.output_prefix"},
    {RULE_DISJOINT, "jetstream.cancel_prefix", "jetstream.output_prefix"},
    /* Batches (contract §20, §21): two more streams, ci.batch.* and ci.batches.>.
     * DISJOINT is stricter than needed for a.* against b.>; odd layouts only. */
    {RULE_LE, "batches.duplicate_window_s", "batches.max_age_s"},
    {RULE_DIFFERENT, "jetstream.batch_stream", "jetstream.tasks_stream"},
    {RULE_DIFFERENT, "jetstream.batch_stream", "jetstream.status_stream"},
    {RULE_DIFFERENT, "jetstream.batch_stream", "jetstream.cancel_stream"},
    {RULE_DIFFERENT, "jetstream.batch_events_stream", "jetstream.tasks_stream"},
    {RULE_DIFFERENT, "jetstream.batch_events_stream", "jetstream.status_stream"},
    {RULE_DIFFERENT, "jetstream.batch_events_stream", "jetstream.cancel_stream"},
    {RULE_DIFFERENT, "jetstream.batch_events_stream", "jetstream.batch_stream"},
    {RULE_DIFFERENT, "jetstream.batch_consumer", "jetstream.consumer"},
    {RULE_DISJOINT, "jetstream.batch_subject", "jetstream.submit_subject"},
    {RULE_DISJOINT, "jetstream.batch_subject", "jetstream.status_prefix"},
    {RULE_DISJOINT, "jetstream.batch_subject", "jetstream.cancel_prefix"},
    {RULE_DISJOINT, "jetstream.batch_subject", "jetstream.batch_events_prefix"},
    {RULE_DISJOINT, "jetstream.batch_events_prefix", "jetstream.submit_subject"},
    {RULE_DISJOINT, "jetstream.batch_events_prefix", "jetstream.status_prefix"},
    {RULE_DISJOINT, "jetstream.batch_events_prefix", "jetstream.cancel_prefix"},
    {RULE_DIFFERENT, "jetstream.output_stream", "jetstream.batch_stream"},
    {RULE_DIFFERENT, "jetstream.output_stream", "jetstream.batch_events_stream"},
    {RULE_DISJOINT, "jetstream.output_prefix", "jetstream.batch_subject"},
    {RULE_DISJOINT, "jetstream.output_prefix", "jetstream.batch_events_prefix"},
};

#define ENV_NATS_URL "CI_NATS_URL"

/* ---- access to a key's member ---------------------------------------- */

static void *field_ptr(struct ci_config *cfg, const struct ci_config_key *k)
{
    return (char *)cfg + k->offset;
}

static const void *field_cptr(const struct ci_config *cfg, const struct ci_config_key *k)
{
    return (const char *)cfg + k->offset;
}

static const char *get_str(const struct ci_config *cfg, const struct ci_config_key *k)
{
    const char *s;
    memcpy(&s, field_cptr(cfg, k), sizeof(s));
    return s ? s : "";
}

static void set_str(struct ci_config *cfg, const struct ci_config_key *k, char *s)
{
    char **p = field_ptr(cfg, k);
    free(*p);
    *p = s;
}

/* The value of a number, bool or enum key, widened. */
static int64_t get_num(const struct ci_config *cfg, const struct ci_config_key *k)
{
    const void *p = field_cptr(cfg, k);
    switch (k->type) {
    case CT_UINT32: return *(const uint32_t *)p;
    case CT_INT32: return *(const int32_t *)p;
    case CT_BOOL: return *(const bool *)p;
    case CT_ENUM: {
        int v;
        memcpy(&v, p, sizeof(v));
        return v;
    }
    case CT_STRING: break;
    }
    return 0;
}

static void set_num(struct ci_config *cfg, const struct ci_config_key *k, int64_t v)
{
    void *p = field_ptr(cfg, k);
    switch (k->type) {
    case CT_UINT32: *(uint32_t *)p = (uint32_t)v; break;
    case CT_INT32: *(int32_t *)p = (int32_t)v; break;
    case CT_BOOL: *(bool *)p = v != 0; break;
    case CT_ENUM: {
        int iv = (int)v;
        memcpy(p, &iv, sizeof(iv));
        break;
    }
    case CT_STRING: break;
    }
}

static const struct ci_config_key *find_key(const char *name, size_t *ret_index)
{
    for (size_t i = 0; i < CI_N_KEYS; i++)
        if (strcmp(ci_config_keys[i].key, name) == 0) {
            if (ret_index)
                *ret_index = i;
            return &ci_config_keys[i];
        }
    return NULL;
}

/* Length of the section part of a key ("nats" in "nats.url"). */
static size_t section_len(const char *key)
{
    const char *dot = strchr(key, '.');
    return dot ? (size_t)(dot - key) : strlen(key);
}

/* ---- defaults, free --------------------------------------------------- */

static ci_status config_new_defaults(struct ci_config **ret, struct ci_error *err)
{
    struct ci_config *cfg = calloc(1, sizeof(*cfg));
    if (!cfg)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory while loading the config");
    for (size_t i = 0; i < CI_N_KEYS; i++) {
        const struct ci_config_key *k = &ci_config_keys[i];
        if (k->type != CT_STRING) {
            set_num(cfg, k, k->num_def);
            continue;
        }
        char *s = strdup(k->str_def);
        if (!s) {
            ci_config_free(cfg);
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory while loading the config");
        }
        set_str(cfg, k, s);
    }
    *ret = cfg;
    return CI_OK;
}

bool ci_config_was_set(const struct ci_config *cfg, const char *key)
{
    for (size_t i = 0; i < CI_N_KEYS; i++)
        if (strcmp(ci_config_keys[i].key, key) == 0)
            return (cfg->set_in_file[i / 64] >> (i % 64)) & 1;
    return false;
}

void ci_config_free(struct ci_config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < CI_N_KEYS; i++)
        if (ci_config_keys[i].type == CT_STRING)
            set_str(cfg, &ci_config_keys[i], NULL);
    free(cfg);
}

/* ---- value checks ----------------------------------------------------- */

/* Copies user text into out for an error message: printable ASCII only
 * (anything else becomes '?'), cut with "..." when long. */
static const char *shown(char *out, size_t outsz, const void *text, size_t len)
{
    const unsigned char *t = text;
    size_t max = outsz - 4; /* room for "..." and the NUL */
    size_t n = len < max ? len : max;
    for (size_t i = 0; i < n; i++)
        out[i] = (t[i] >= 0x20 && t[i] < 0x7f && t[i] != '\'') ? (char)t[i] : '?';
    if (n < len) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
    return out;
}

#define SHOWN_SIZE 64

static void join_names(char *out, size_t outsz, const char *const *names)
{
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; names[i] && used < outsz; i++) {
        int n = snprintf(out + used, outsz - used, "%s%s", i ? ", " : "", names[i]);
        if (n < 0)
            break;
        used += (size_t)n;
    }
}

static bool is_name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_' || c == '-';
}

/* A literal NATS subject: tokens of printable ASCII separated by single dots,
 * without the wildcards '*' and '>' (a stream we create must not listen to
 * more than it says). */
static bool is_subject(const char *s, size_t len)
{
    if (len == 0 || len > CI_CONFIG_MAX_SUBJECT || s[0] == '.' || s[len - 1] == '.')
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f || c == '*' || c == '>')
            return false;
        if (c == '.' && s[i + 1] == '.')
            return false;
    }
    return true;
}

/* One NATS server URL as nats.c takes it: an optional nats:// or tls://
 * scheme, optional user information, a host (a name, IPv4 or [IPv6]) and
 * an optional port of 1 to 65535; nothing after the port. */
static bool nats_url_ok(const char *s, size_t len)
{
    const char *end = s + len;
    const char *p = s;
    const char *scheme = memmem(s, len, "://", 3);
    if (scheme) {
        size_t sl = (size_t)(scheme - s);
        if (!((sl == 4 && strncasecmp(s, "nats", 4) == 0) ||
              (sl == 3 && strncasecmp(s, "tls", 3) == 0)))
            return false;
        p = scheme + 3;
    }
    const char *at = memrchr(p, '@', (size_t)(end - p));
    if (at)
        p = at + 1;
    const char *host_end;
    if (p < end && *p == '[') {
        host_end = memchr(p, ']', (size_t)(end - p));
        if (!host_end || host_end == p + 1)
            return false;
        host_end++;
    } else {
        host_end = p;
        while (host_end < end && (isalnum((unsigned char)*host_end) || *host_end == '.' ||
                                  *host_end == '-' || *host_end == '_'))
            host_end++;
        if (host_end == p)
            return false;
    }
    if (host_end == end)
        return true;
    if (*host_end != ':' || host_end + 1 == end || end - (host_end + 1) > 5)
        return false;
    unsigned long port = 0;
    for (const char *d = host_end + 1; d < end; d++) {
        if (!isdigit((unsigned char)*d))
            return false;
        port = port * 10 + (unsigned long)(*d - '0');
    }
    return port >= 1 && port <= 65535;
}

/* A listen address: IPv4:port or [IPv6]:port, numeric, port 0..65535. */
static bool is_hostport(const char *s, size_t len)
{
    char buf[80];
    if (len >= sizeof(buf))
        return false;
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *colon = strrchr(buf, ':');
    if (!colon || colon == buf)
        return false;
    *colon = '\0';
    const char *port = colon + 1;
    size_t digits = strspn(port, "0123456789");
    if (digits == 0 || digits > 5 || port[digits] != '\0' || strtoul(port, NULL, 10) > 65535)
        return false;
    unsigned char addr[sizeof(struct in6_addr)];
    size_t hlen = strlen(buf);
    if (buf[0] == '[' && hlen > 2 && buf[hlen - 1] == ']') {
        buf[hlen - 1] = '\0';
        return inet_pton(AF_INET6, buf + 1, addr) == 1;
    }
    return inet_pton(AF_INET, buf, addr) == 1;
}

/* Whether host (the text between "://" and the port or path) is a loopback
 * address: localhost, 127.0.0.0/8 in dotted-quad form, or [::1]. */
static bool host_is_loopback(const char *host, size_t len)
{
    char buf[64];
    if (len == 0 || len >= sizeof(buf))
        return false;
    memcpy(buf, host, len);
    buf[len] = '\0';
    if (strcasecmp(buf, "localhost") == 0)
        return true; /* libcurl resolves it to loopback itself, never through DNS */
    struct in_addr a4;
    if (inet_pton(AF_INET, buf, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    struct in6_addr a6;
    if (len > 2 && buf[0] == '[' && buf[len - 1] == ']') {
        buf[len - 1] = '\0';
        return inet_pton(AF_INET6, buf + 1, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
    }
    return false;
}

/* The executor's base URL: https:// or http://, a host (a name, a dotted
 * quad or [IPv6]), an optional port of 1 to 65535 and an optional path; no
 * user information, query, fragment, space or backslash. *ret_plain says
 * whether it is http://, *ret_loopback whether its host is loopback. */
static bool service_url_ok(const char *s, size_t len, bool *ret_plain, bool *ret_loopback)
{
    size_t skip;
    if (len > 8 && strncmp(s, "https://", 8) == 0)
        skip = 8, *ret_plain = false;
    else if (len > 7 && strncmp(s, "http://", 7) == 0)
        skip = 7, *ret_plain = true;
    else
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= 0x20 || (unsigned char)s[i] >= 0x7f || s[i] == '?' ||
            s[i] == '#' || s[i] == '\\')
            return false;
    const char *host = s + skip, *end = s + len;
    const char *auth_end = memchr(host, '/', (size_t)(end - host));
    if (!auth_end)
        auth_end = end;
    if (memchr(host, '@', (size_t)(auth_end - host)))
        return false; /* user:password@ would be sent along */
    const char *host_end;
    if (*host == '[') {
        host_end = memchr(host, ']', (size_t)(auth_end - host));
        if (!host_end)
            return false;
        host_end++;
        char buf[64];
        struct in6_addr a6;
        size_t hl = (size_t)(host_end - host) - 2;
        if (hl == 0 || hl >= sizeof(buf))
            return false;
        memcpy(buf, host + 1, hl);
        buf[hl] = '\0';
        if (inet_pton(AF_INET6, buf, &a6) != 1)
            return false;
    } else {
        host_end = host;
        while (host_end < auth_end && (isalnum((unsigned char)*host_end) || *host_end == '.' ||
                                       *host_end == '-' || *host_end == '_'))
            host_end++;
        if (host_end == host)
            return false;
    }
    if (host_end < auth_end) {
        if (*host_end != ':' || auth_end - host_end < 2 || auth_end - host_end > 6)
            return false;
        unsigned long port = 0;
        for (const char *d = host_end + 1; d < auth_end; d++) {
            if (!isdigit((unsigned char)*d))
                return false;
            port = port * 10 + (unsigned long)(*d - '0');
        }
        if (port < 1 || port > 65535)
            return false;
    }
    *ret_loopback = host_is_loopback(host, (size_t)(host_end - host));
    return true;
}

/* Whether s (length len) is acceptable for key k; if not, why in out. */
static bool check_string(const struct ci_config_key *k, const char *s, size_t len, char *why,
                         size_t whysz)
{
    char v[SHOWN_SIZE];
    if (len > CI_CONFIG_MAX_STRING) {
        snprintf(why, whysz, "the value is %zu bytes; the limit is %d", len, CI_CONFIG_MAX_STRING);
        return false;
    }
    if (memchr(s, '\0', len)) {
        snprintf(why, whysz, "the value contains a NUL character");
        return false;
    }
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) {
            snprintf(why, whysz, "the value contains a control character");
            return false;
        }
    switch (k->check) {
    case CS_ANY:
        return true;
    case CS_NONEMPTY:
        if (len)
            return true;
        snprintf(why, whysz, "must not be empty");
        return false;
    case CS_URL: {
        bool ok = len > 0 && s[0] != ',' && s[len - 1] != ',' && !strstr(s, ",,");
        for (size_t i = 0; ok && i < len; i++)
            ok = (unsigned char)s[i] > 0x20 && (unsigned char)s[i] < 0x7f;
        /* Each one must be one that a connection could ever use: retrying
         * a URL that can never work would only hide the mistake. */
        for (size_t i = 0; ok && i < len;) {
            size_t n = strcspn(s + i, ",");
            ok = nats_url_ok(s + i, n < len - i ? n : len - i);
            i += n + 1;
        }
        if (ok)
            return true;
        snprintf(why, whysz,
                 "expected one NATS URL or several separated by commas (no spaces), each "
                 "[nats://|tls://][user:password@]host[:port] with a port of 1 to 65535, such as "
                 "nats://127.0.0.1:4222, got '%s'",
                 shown(v, sizeof(v), s, len));
        return false;
    }
    case CS_NAME: {
        bool ok = len > 0 && len <= CI_CONFIG_MAX_NAME;
        for (size_t i = 0; ok && i < len; i++)
            ok = is_name_char((unsigned char)s[i]);
        if (ok)
            return true;
        snprintf(why, whysz,
                 "expected a name of 1 to %d letters, digits, '_' or '-', got '%s'",
                 CI_CONFIG_MAX_NAME, shown(v, sizeof(v), s, len));
        return false;
    }
    case CS_SUBJECT:
        if (is_subject(s, len))
            return true;
        snprintf(why, whysz,
                 "expected a NATS subject of at most %d characters without spaces or wildcards, "
                 "such as ci.submit, got '%s'",
                 CI_CONFIG_MAX_SUBJECT, shown(v, sizeof(v), s, len));
        return false;
    case CS_ID: {
        bool ok = len <= CI_CONFIG_MAX_ID;
        for (size_t i = 0; ok && i < len; i++)
            ok = is_name_char((unsigned char)s[i]) || s[i] == '.';
        if (ok)
            return true;
        snprintf(why, whysz,
                 "expected an id of at most %d letters, digits, '.', '_' or '-' (or \"\"), got '%s'",
                 CI_CONFIG_MAX_ID, shown(v, sizeof(v), s, len));
        return false;
    }
    case CS_HOSTPORT:
        if (len == 0 || is_hostport(s, len))
            return true;
        snprintf(why, whysz,
                 "expected \"\" (off) or a numeric address and port such as 127.0.0.1:9464, "
                 "0.0.0.0:9464 or [::]:9464, got '%s'",
                 shown(v, sizeof(v), s, len));
        return false;
    case CS_SERVICE: {
        bool plain = false, loopback = false;
        if (len == 0)
            return true;
        if (!service_url_ok(s, len, &plain, &loopback)) {
            snprintf(why, whysz,
                     "expected the executor service's base URL, https://host[:port][/path] "
                     "without user, query or fragment, got '%s'",
                     shown(v, sizeof(v), s, len));
            return false;
        }
        if (!plain || loopback)
            return true;
        /* The worker sends its ID token, a bearer credential, with every
         * request: in clear text anyone on the path could replay it. */
        snprintf(why, whysz,
                 "http:// would send the worker's ID token unencrypted; it is allowed only to a "
                 "loopback host (127.0.0.0/8, [::1], localhost): use https://, got '%s'",
                 shown(v, sizeof(v), s, len));
        return false;
    }
    case CS_ABSPATH:
        if (len > 0 && s[0] == '/')
            return true;
        snprintf(why, whysz, "expected an absolute path, got '%s'", shown(v, sizeof(v), s, len));
        return false;
    case CS_ONEOF: {
        for (size_t i = 0; k->names[i]; i++)
            if (strlen(k->names[i]) == len && memcmp(k->names[i], s, len) == 0)
                return true;
        char list[128];
        join_names(list, sizeof(list), k->names);
        snprintf(why, whysz, "expected one of %s", list);
        return false;
    }
    }
    return false;
}

/* Parses a decimal integer within [k->min, k->max]; if not, why in out. */
static bool parse_integer(const struct ci_config_key *k, const char *s, size_t len,
                          int64_t *ret, char *why, size_t whysz)
{
    char v[SHOWN_SIZE];
    size_t i = 0;
    bool neg = false;
    if (len > 0 && (s[0] == '+' || s[0] == '-'))
        neg = s[0] == '-', i = 1;
    size_t digits = 0;
    while (i + digits < len && s[i + digits] >= '0' && s[i + digits] <= '9')
        digits++;
    if (digits == 0 || i + digits != len) {
        bool radix = digits == 1 && s[i] == '0' && i + 1 < len &&
                     strchr("xXoObB", s[i + 1]) != NULL;
        snprintf(why, whysz, "expected %s, got '%s'", radix ? "a decimal integer" : "an integer",
                 shown(v, sizeof(v), s, len));
        return false;
    }
    if (digits > 1 && s[i] == '0') {
        /* YAML 1.1 reads 0755 as octal; we refuse to guess. */
        snprintf(why, whysz, "expected a decimal integer, got '%s' (a leading 0 means octal)",
                 shown(v, sizeof(v), s, len));
        return false;
    }
    int64_t n = 0;
    bool huge = false;
    for (size_t d = 0; d < digits; d++) {
        n = n * 10 + (s[i + d] - '0');
        if (n > INT64_C(1) << 40) { /* far past every bound; stop before overflow */
            huge = true;
            break;
        }
    }
    if (neg)
        n = -n;
    if (n < k->min) {
        snprintf(why, whysz, "%s is below the minimum %" PRId64, shown(v, sizeof(v), s, len),
                 k->min);
        return false;
    }
    if (n > k->max || huge) {
        snprintf(why, whysz, "%s is above the maximum %" PRId64, shown(v, sizeof(v), s, len),
                 k->max);
        return false;
    }
    *ret = n;
    return true;
}

/* ---- the YAML walk ---------------------------------------------------- */

struct parser {
    yaml_parser_t yp;
    const char *name; /* the file's basename, first in every message */
    const uint8_t *data;
    size_t len;
    struct ci_config *cfg;
    struct ci_error *err;
    size_t key_line[CI_N_KEYS];     /* 1-based line where a key was set, 0 = not in the file */
    size_t section_line[CI_N_KEYS]; /* by the index of the section's first key */
};

static void event_cleanup(yaml_event_t *ev)
{
    yaml_event_delete(ev);
}
#define CI_AUTO_EVENT __attribute__((cleanup(event_cleanup)))

static size_t mark_line(const yaml_mark_t *m)
{
    return m->line + 1;
}

static ci_status fail(struct parser *p, size_t line, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Records "NAME:LINE: key 'KEY': WHAT" (without the key part when key is NULL). */
static ci_status fail(struct parser *p, size_t line, const char *key, const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    if (key)
        return ci_error_set(p->err, CI_ERR_INVALID, "%s:%zu: key '%s': %s", p->name, line, key,
                            what);
    return ci_error_set(p->err, CI_ERR_INVALID, "%s:%zu: %s", p->name, line, what);
}

static ci_status next_event(struct parser *p, yaml_event_t *ev)
{
    if (yaml_parser_parse(&p->yp, ev))
        return CI_OK;
    if (p->yp.error == YAML_MEMORY_ERROR)
        return ci_error_set(p->err, CI_ERR_NOMEM, "%s: out of memory while reading YAML", p->name);
    size_t line;
    if (p->yp.error == YAML_READER_ERROR) {
        /* The reader reports a byte offset, not a mark. */
        size_t end = p->yp.problem_offset < p->len ? p->yp.problem_offset : p->len;
        line = 1;
        for (size_t i = 0; i < end; i++)
            line += p->data[i] == '\n';
    } else {
        line = mark_line(&p->yp.problem_mark);
    }
    return fail(p, line, NULL, "YAML syntax error: %s",
                p->yp.problem ? p->yp.problem : "unknown problem");
}

static bool is_null(const yaml_event_t *ev)
{
    if (ev->type != YAML_SCALAR_EVENT || ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE ||
        ev->data.scalar.tag)
        return false;
    const char *v = (const char *)ev->data.scalar.value;
    return strcmp(v, "") == 0 || strcmp(v, "~") == 0 || strcmp(v, "null") == 0 ||
           strcmp(v, "Null") == 0 || strcmp(v, "NULL") == 0;
}

static const char *node_kind(const yaml_event_t *ev)
{
    switch (ev->type) {
    case YAML_MAPPING_START_EVENT: return "a mapping";
    case YAML_SEQUENCE_START_EVENT: return "a sequence";
    default: return "a scalar";
    }
}

/* What a key of this type expects, for messages. */
static const char *expected(const struct ci_config_key *k)
{
    switch (k->type) {
    case CT_STRING: return "a string";
    case CT_UINT32:
    case CT_INT32: return "an integer";
    case CT_BOOL: return "true or false";
    case CT_ENUM: return "a name";
    }
    return "a value";
}

/* Sets key i from the value event ev (the first event of the value). */
static ci_status parse_value(struct parser *p, size_t i, const yaml_event_t *ev)
{
    const struct ci_config_key *k = &ci_config_keys[i];
    size_t line = mark_line(&ev->start_mark);
    char why[300], v[SHOWN_SIZE];

    if (ev->type == YAML_ALIAS_EVENT)
        return fail(p, line, k->key, "YAML aliases are not supported");
    if (ev->type != YAML_SCALAR_EVENT)
        return fail(p, line, k->key, "expected %s, got %s", expected(k), node_kind(ev));
    if (ev->data.scalar.tag)
        return fail(p, line, k->key, "YAML tags are not supported");
    if (is_null(ev))
        return CI_OK; /* keep the default */

    const char *s = (const char *)ev->data.scalar.value;
    size_t len = ev->data.scalar.length;
    bool plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    switch (k->type) {
    case CT_STRING: {
        if (!check_string(k, s, len, why, sizeof(why)))
            return fail(p, line, k->key, "%s", why);
        char *copy = strndup(s, len);
        if (!copy)
            return ci_error_set(p->err, CI_ERR_NOMEM, "out of memory while loading the config");
        set_str(p->cfg, k, copy);
        return CI_OK;
    }
    case CT_UINT32:
    case CT_INT32: {
        if (!plain)
            return fail(p, line, k->key,
                        "expected an integer, got the string '%s' (write it without quotes)",
                        shown(v, sizeof(v), s, len));
        int64_t n;
        if (!parse_integer(k, s, len, &n, why, sizeof(why)))
            return fail(p, line, k->key, "%s", why);
        set_num(p->cfg, k, n);
        return CI_OK;
    }
    case CT_BOOL:
        if (plain && (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE")))
            set_num(p->cfg, k, 1);
        else if (plain && (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE")))
            set_num(p->cfg, k, 0);
        else
            return fail(p, line, k->key, "expected true or false");
        return CI_OK;
    case CT_ENUM:
        for (size_t e = 0; k->names[e]; e++)
            if (strlen(k->names[e]) == len && memcmp(k->names[e], s, len) == 0) {
                set_num(p->cfg, k, (int64_t)e);
                return CI_OK;
            }
        join_names(why, sizeof(why), k->names);
        return fail(p, line, k->key, "expected one of %s", why);
    }
    return fail(p, line, k->key, "unsupported key type");
}

/* Reads a mapping key. Keys must be scalars without tags. */
static ci_status read_key(struct parser *p, const yaml_event_t *ev, const char *section)
{
    if (ev->type == YAML_SCALAR_EVENT && !ev->data.scalar.tag)
        return CI_OK;
    size_t line = mark_line(&ev->start_mark);
    if (ev->type == YAML_ALIAS_EVENT)
        return fail(p, line, section, "YAML aliases are not supported");
    if (ev->type == YAML_SCALAR_EVENT)
        return fail(p, line, section, "YAML tags are not supported");
    return fail(p, line, section, "expected a key name, got %s", node_kind(ev));
}

/* The keys of one section, after its MAPPING_START; first = index of the
 * section's first key in the table. */
static ci_status parse_section(struct parser *p, size_t first)
{
    const char *section = ci_config_keys[first].key;
    size_t slen = section_len(section);
    char section_name[32];
    snprintf(section_name, sizeof(section_name), "%.*s", (int)slen, section);

    for (;;) {
        CI_AUTO_EVENT yaml_event_t kev = {0};
        ci_status s = next_event(p, &kev);
        if (s)
            return s;
        if (kev.type == YAML_MAPPING_END_EVENT)
            return CI_OK;
        s = read_key(p, &kev, section_name);
        if (s)
            return s;

        const char *name = (const char *)kev.data.scalar.value;
        size_t nlen = kev.data.scalar.length;
        size_t line = mark_line(&kev.start_mark);
        size_t i = CI_N_KEYS;
        for (size_t j = first; j < CI_N_KEYS; j++) {
            const char *key = ci_config_keys[j].key;
            if (strncmp(key, section, slen + 1) != 0)
                break; /* the table keeps a section's keys together */
            if (strlen(key + slen + 1) == nlen && memcmp(key + slen + 1, name, nlen) == 0) {
                i = j;
                break;
            }
        }
        if (i == CI_N_KEYS) {
            char v[SHOWN_SIZE], full[SHOWN_SIZE + 40];
            snprintf(full, sizeof(full), "%s.%s", section_name, shown(v, sizeof(v), name, nlen));
            return fail(p, line, full, "unknown key");
        }
        if (p->key_line[i])
            return fail(p, line, ci_config_keys[i].key, "duplicate key");
        p->key_line[i] = line;
        p->cfg->set_in_file[i / 64] |= UINT64_C(1) << (i % 64);

        CI_AUTO_EVENT yaml_event_t vev = {0};
        s = next_event(p, &vev);
        if (s)
            return s;
        s = parse_value(p, i, &vev);
        if (s)
            return s;
    }
}

/* The top-level mapping of sections, after its MAPPING_START. */
static ci_status parse_sections(struct parser *p)
{
    for (;;) {
        CI_AUTO_EVENT yaml_event_t kev = {0};
        ci_status s = next_event(p, &kev);
        if (s)
            return s;
        if (kev.type == YAML_MAPPING_END_EVENT)
            return CI_OK;
        s = read_key(p, &kev, NULL);
        if (s)
            return s;

        const char *name = (const char *)kev.data.scalar.value;
        size_t nlen = kev.data.scalar.length;
        size_t line = mark_line(&kev.start_mark);
        size_t first = CI_N_KEYS;
        for (size_t j = 0; j < CI_N_KEYS; j++) {
            const char *key = ci_config_keys[j].key;
            if (section_len(key) == nlen && memcmp(key, name, nlen) == 0) {
                first = j;
                break;
            }
        }
        char v[SHOWN_SIZE];
        if (first == CI_N_KEYS)
            return fail(p, line, shown(v, sizeof(v), name, nlen), "unknown key");
        const char *section = shown(v, sizeof(v), name, nlen);
        if (p->section_line[first])
            return fail(p, line, section, "duplicate key");
        p->section_line[first] = line;

        CI_AUTO_EVENT yaml_event_t vev = {0};
        s = next_event(p, &vev);
        if (s)
            return s;
        if (is_null(&vev))
            continue; /* "nats:" alone: every default */
        if (vev.type == YAML_ALIAS_EVENT)
            return fail(p, mark_line(&vev.start_mark), section, "YAML aliases are not supported");
        if (vev.type != YAML_MAPPING_START_EVENT)
            return fail(p, mark_line(&vev.start_mark), section, "expected a mapping");
        if (vev.data.mapping_start.tag)
            return fail(p, mark_line(&vev.start_mark), section, "YAML tags are not supported");
        s = parse_section(p, first);
        if (s)
            return s;
    }
}

/* The whole stream: nothing, or one document holding null or a mapping. */
static ci_status parse_stream(struct parser *p)
{
    CI_AUTO_EVENT yaml_event_t start = {0};
    ci_status s = next_event(p, &start); /* STREAM-START */
    if (s)
        return s;
    for (int docs = 0;; docs++) {
        CI_AUTO_EVENT yaml_event_t ev = {0};
        s = next_event(p, &ev);
        if (s)
            return s;
        if (ev.type == YAML_STREAM_END_EVENT)
            return CI_OK;
        if (docs > 0)
            return fail(p, mark_line(&ev.start_mark), NULL,
                        "only one YAML document is allowed");

        /* DOCUMENT-START, then the root node. */
        CI_AUTO_EVENT yaml_event_t root = {0};
        s = next_event(p, &root);
        if (s)
            return s;
        if (root.type == YAML_MAPPING_START_EVENT && !root.data.mapping_start.tag) {
            s = parse_sections(p);
        } else if (!is_null(&root)) {
            char sections[128];
            size_t used = 0;
            sections[0] = '\0';
            for (size_t i = 0; i < CI_N_KEYS && used < sizeof(sections); i++) {
                size_t l = section_len(ci_config_keys[i].key);
                if (i > 0 && strncmp(ci_config_keys[i - 1].key, ci_config_keys[i].key, l + 1) == 0)
                    continue;
                int n = snprintf(sections + used, sizeof(sections) - used, "%s%.*s",
                                 used ? ", " : "", (int)l, ci_config_keys[i].key);
                used += n > 0 ? (size_t)n : 0;
            }
            return fail(p, mark_line(&root.start_mark), NULL,
                        "expected a mapping with the sections %s", sections);
        }
        if (s)
            return s;

        CI_AUTO_EVENT yaml_event_t end = {0};
        s = next_event(p, &end); /* DOCUMENT-END */
        if (s)
            return s;
    }
}

/* Reads every event once, so that a syntax error anywhere in the file is
 * reported before a problem with a value above it (which it may explain). */
static ci_status check_syntax(struct parser *p)
{
    for (;;) {
        CI_AUTO_EVENT yaml_event_t ev = {0};
        ci_status s = next_event(p, &ev);
        if (s || ev.type == YAML_STREAM_END_EVENT)
            return s;
    }
}

/* ---- rules between keys and the environment --------------------------- */

/* Whether subject s equals prefix p or lies below it (p.x, p.x.y, ...). */
static bool subject_within(const char *s, const char *p)
{
    size_t n = strlen(p);
    return strncmp(s, p, n) == 0 && (s[n] == '\0' || s[n] == '.');
}

static ci_status check_rules(struct parser *p)
{
    for (size_t r = 0; r < sizeof(ci_config_rules) / sizeof(ci_config_rules[0]); r++) {
        const struct ci_config_rule *rule = &ci_config_rules[r];
        size_t ia = 0, ib = 0;
        const struct ci_config_key *a = find_key(rule->a, &ia), *b = find_key(rule->b, &ib);
        if (!a || !b)
            return ci_error_set(p->err, CI_ERR_INVALID, "config rule names an unknown key");
        /* Report at the later key: the one that broke a rule the earlier set up. */
        bool a_later = p->key_line[ia] > p->key_line[ib];
        const struct ci_config_key *late = a_later ? a : b, *other = a_later ? b : a;
        size_t line = a_later ? p->key_line[ia] : p->key_line[ib];
        char vl[SHOWN_SIZE], vo[SHOWN_SIZE];

        switch (rule->kind) {
        case RULE_LE: {
            int64_t va = get_num(p->cfg, a), vb = get_num(p->cfg, b);
            if (va <= vb)
                break;
            if (a_later)
                return fail(p, line, a->key, "%" PRId64 " is above %s (%" PRId64 ")", va, b->key,
                            vb);
            return fail(p, line, b->key, "%" PRId64 " is below %s (%" PRId64 ")", vb, a->key, va);
        }
        case RULE_DIFFERENT:
            if (strcmp(get_str(p->cfg, a), get_str(p->cfg, b)) != 0)
                break;
            return fail(p, line, late->key, "'%s' is also the value of %s; each needs its own name",
                        shown(vl, sizeof(vl), get_str(p->cfg, late), strlen(get_str(p->cfg, late))),
                        other->key);
        case RULE_NOT_UNDER:
        case RULE_DISJOINT: {
            const char *sa = get_str(p->cfg, a), *sb = get_str(p->cfg, b);
            bool overlap = rule->kind == RULE_NOT_UNDER
                               ? subject_within(sa, sb) && strcmp(sa, sb) != 0
                               : subject_within(sa, sb) || subject_within(sb, sa);
            if (!overlap)
                break;
            const char *sl = get_str(p->cfg, late), *so = get_str(p->cfg, other);
            return fail(p, line, late->key,
                        "'%s' overlaps %s ('%s'): the streams' subjects must not overlap",
                        shown(vl, sizeof(vl), sl, strlen(sl)), other->key,
                        shown(vo, sizeof(vo), so, strlen(so)));
        }
        }
    }
    return CI_OK;
}

/* The task uids are a range of their own: not past the last uid, and
 * without the uid init runs as (local.sandbox_uid). */
static ci_status check_task_uids(struct parser *p)
{
    const struct ci_config *c = p->cfg;
    uint64_t first = c->local.task_uid_first, count = c->local.task_uid_count;
    if (!count)
        return CI_OK;
    size_t i = 0;
    find_key("local.task_uid_count", &i);
    size_t line = p->key_line[i];
    find_key("local.task_uid_first", &i);
    if (p->key_line[i] > line)
        line = p->key_line[i];
    if (first + count - 1 > 4294967294u)
        return fail(p, line, "local.task_uid_count",
                    "%" PRIu64 " uids from %" PRIu64 " go past the last uid (4294967294)", count,
                    first);
    if (c->local.sandbox_uid >= first && c->local.sandbox_uid < first + count)
        return fail(p, line, "local.task_uid_first",
                    "the range %" PRIu64 "-%" PRIu64 " holds local.sandbox_uid (%u), the "
                    "sandbox's init: the tasks' uids must be others",
                    first, first + count - 1, c->local.sandbox_uid);
    struct ci_task_uid_layout l;
    ci_config_task_uid_layout(c, &l);
    uint32_t need = c->local.mode == CI_MODE_WARM ? l.need_warm : l.cold;
    if (count < need)
        return fail(p, line, "local.task_uid_count",
                    "%" PRIu64 " is too small: %u task slots%s need %u uids (0 runs every task "
                    "as local.sandbox_uid)",
                    count, l.cold,
                    c->local.mode == CI_MODE_WARM ? " and the warm pool" : "", need);
    return CI_OK;
}

/* Whether the file at path is a PEM bundle with at least one certificate;
 * if not, why in out. */
static bool ca_file_ok(const char *path, char *why, size_t whysz)
{
    char v[160];
    const char *sp = shown(v, sizeof(v), path, strlen(path));
    /* O_NONBLOCK: a FIFO must not hang the load. */
    CI_AUTOCLOSE int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) {
        snprintf(why, whysz, "cannot read the CA bundle '%s': %s", sp, strerror(errno));
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(why, whysz, "the CA bundle '%s' is not a regular file", sp);
        return false;
    }
    if (st.st_size > CI_CONFIG_MAX_CA_BYTES) {
        snprintf(why, whysz, "the CA bundle '%s' is larger than %d MiB", sp,
                 CI_CONFIG_MAX_CA_BYTES / MiB);
        return false;
    }
    CI_AUTOBUF struct ci_buf buf = CI_BUF_INIT;
    for (;;) {
        if (ci_buf_reserve(&buf, 64 * 1024)) {
            snprintf(why, whysz, "out of memory reading the CA bundle '%s'", sp);
            return false;
        }
        ssize_t n = read(fd, buf.data + buf.len, 64 * 1024);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            snprintf(why, whysz, "cannot read the CA bundle '%s': %s", sp, strerror(errno));
            return false;
        }
        if (n == 0)
            break;
        buf.len += (size_t)n;
        if (buf.len > CI_CONFIG_MAX_CA_BYTES) {
            snprintf(why, whysz, "the CA bundle '%s' is larger than %d MiB", sp,
                     CI_CONFIG_MAX_CA_BYTES / MiB);
            return false;
        }
    }
    static const char begin[] = "-----BEGIN CERTIFICATE-----";
    static const char end[] = "-----END CERTIFICATE-----";
    const char *b = buf.len ? memmem(buf.data, buf.len, begin, strlen(begin)) : NULL;
    const char *e = b ? memmem(b, buf.len - (size_t)(b - (const char *)buf.data), end,
                               strlen(end))
                      : NULL;
    if (!e) {
        snprintf(why, whysz,
                 "the CA bundle '%s' holds no PEM certificate (-----BEGIN CERTIFICATE----- ... "
                 "-----END CERTIFICATE-----)",
                 sp);
        return false;
    }
    return true;
}

/* What the cloudrun provider needs, checked at load so that `ci-worker
 * --check-config` and the worker's start report it rather than every task:
 * a service URL, and a CA bundle that can be read. */
static ci_status check_cloudrun(struct parser *p)
{
    size_t ip = 0, iu = 0, ica = 0;
    const struct ci_config_key *provider = find_key("worker.provider", &ip);
    const struct ci_config_key *url = find_key("cloudrun.service_url", &iu);
    const struct ci_config_key *ca = find_key("cloudrun.ca_file", &ica);
    if (!provider || !url || !ca)
        return ci_error_set(p->err, CI_ERR_INVALID, "config check names an unknown key");
    if (strcmp(get_str(p->cfg, provider), "cloudrun") != 0)
        return CI_OK; /* the keys are not used */
    if (!get_str(p->cfg, url)[0] && p->key_line[iu])
        return fail(p, p->key_line[iu], url->key,
                    "must be the executor service's URL (https://...) when worker.provider is "
                    "cloudrun");
    if (!get_str(p->cfg, url)[0])
        return fail(p, p->key_line[ip], provider->key,
                    "cloudrun.service_url must be the executor service's URL (https://...) when "
                    "worker.provider is cloudrun");
    const char *path = get_str(p->cfg, ca);
    char why[400];
    if (path[0] && !ca_file_ok(path, why, sizeof(why)))
        return fail(p, p->key_line[ica], ca->key, "%s", why);
    return CI_OK;
}

/* CI_NATS_URL, when set and not empty, replaces nats.url. */
static ci_status apply_env(struct ci_config *cfg, struct ci_error *err)
{
    const char *url = getenv(ENV_NATS_URL);
    if (!url || !*url)
        return CI_OK;
    const struct ci_config_key *k = find_key("nats.url", NULL);
    char why[300];
    if (!k || !check_string(k, url, strlen(url), why, sizeof(why)))
        return ci_error_set(err, CI_ERR_INVALID, ENV_NATS_URL ": %s", k ? why : "no nats.url key");
    char *copy = strdup(url);
    if (!copy)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory while loading the config");
    set_str(cfg, k, copy);
    return CI_OK;
}

/* ---- public ----------------------------------------------------------- */

ci_status ci_config_defaults(struct ci_config **ret, struct ci_error *err)
{
    struct ci_config *cfg = NULL;
    ci_status s = config_new_defaults(&cfg, err);
    if (s)
        return s;
    s = apply_env(cfg, err);
    if (s) {
        ci_config_free(cfg);
        return s;
    }
    *ret = cfg;
    return CI_OK;
}

ci_status ci_config_parse(const char *name, const uint8_t *data, size_t len,
                          struct ci_config **ret, struct ci_error *err)
{
    if (len > CI_CONFIG_MAX_FILE_BYTES)
        return ci_error_set(err, CI_ERR_INVALID, "%s: the file is %zu bytes; the limit is %d",
                            name, len, CI_CONFIG_MAX_FILE_BYTES);
    struct parser p = {.name = name, .data = data ? data : (const uint8_t *)"", .len = len,
                       .err = err};
    ci_status s = config_new_defaults(&p.cfg, err);
    if (s)
        return s;
    if (!yaml_parser_initialize(&p.yp)) {
        ci_config_free(p.cfg);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory while loading the config");
    }
    yaml_parser_set_input_string(&p.yp, p.data, len);
    s = check_syntax(&p);
    yaml_parser_delete(&p.yp);
    if (!s && !yaml_parser_initialize(&p.yp))
        s = ci_error_set(err, CI_ERR_NOMEM, "out of memory while loading the config");
    else if (!s) {
        yaml_parser_set_input_string(&p.yp, p.data, len);
        s = parse_stream(&p);
        yaml_parser_delete(&p.yp);
    }
    /* A session may idle at most as long as its data lives: the default
     * gives way to a shorter max_age_s; a chosen idle_s must fit (a rule). */
    size_t idle = 0, state = 0;
    if (!s && find_key("sessions.idle_s", &idle) && !p.key_line[idle] &&
        p.cfg->sessions.idle_s > p.cfg->jetstream.max_age_s)
        p.cfg->sessions.idle_s = p.cfg->jetstream.max_age_s;
    /* Likewise a batch's duplicate window gives way to a shorter max age
     * (the server refuses a window longer than the stream keeps messages). */
    size_t window = 0;
    if (!s && find_key("batches.duplicate_window_s", &window) && !p.key_line[window] &&
        p.cfg->batches.duplicate_window_s > p.cfg->batches.max_age_s)
        p.cfg->batches.duplicate_window_s = p.cfg->batches.max_age_s;
    /* Likewise a state travels through the workspace: half of it at most. */
    if (!s && find_key("sessions.max_state_mb", &state) && !p.key_line[state] &&
        p.cfg->sessions.max_state_mb > p.cfg->local.workspace_mb / 2)
        p.cfg->sessions.max_state_mb =
            p.cfg->local.workspace_mb / 2 ? p.cfg->local.workspace_mb / 2 : 1;
    if (!s)
        s = check_rules(&p);
    if (!s)
        s = check_task_uids(&p);
    if (!s)
        s = check_cloudrun(&p);
    if (!s)
        s = apply_env(p.cfg, err);
    if (s) {
        ci_config_free(p.cfg);
        return s;
    }
    *ret = p.cfg;
    return CI_OK;
}

ci_status ci_config_load(const char *path, struct ci_config **ret, struct ci_error *err)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash && slash[1] ? slash + 1 : path;

    /* O_NONBLOCK: opening a FIFO must not hang the worker's start. */
    CI_AUTOCLOSE int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        return ci_error_errno(err, CI_ERR_IO, errno, "cannot open the config file %s", path);
    struct stat st;
    if (fstat(fd, &st) < 0)
        return ci_error_errno(err, CI_ERR_IO, errno, "cannot stat the config file %s", path);
    if (!S_ISREG(st.st_mode))
        return ci_error_set(err, CI_ERR_INVALID, "the config file %s is not a regular file", path);

    CI_AUTOBUF struct ci_buf buf = CI_BUF_INIT;
    for (;;) {
        if (ci_buf_reserve(&buf, 64 * 1024))
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory while reading %s", path);
        ssize_t n = read(fd, buf.data + buf.len, 64 * 1024);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ci_error_errno(err, CI_ERR_IO, errno, "cannot read the config file %s", path);
        if (n == 0)
            break;
        buf.len += (size_t)n;
        if (buf.len > CI_CONFIG_MAX_FILE_BYTES)
            return ci_error_set(err, CI_ERR_INVALID, "%s: the file is larger than %d bytes",
                                name, CI_CONFIG_MAX_FILE_BYTES);
    }
    return ci_config_parse(name, buf.data, buf.len, ret, err);
}

/* ---- dump ------------------------------------------------------------- */

/* Decodes one UTF-8 sequence at s (n bytes left); *used gets its length.
 * Invalid bytes decode as U+FFFD one at a time. */
static uint32_t utf8_next(const unsigned char *s, size_t n, size_t *used)
{
    static const uint32_t min_cp[] = {0, 0, 0x80, 0x800, 0x10000};
    size_t len = s[0] < 0x80 ? 1 : (s[0] & 0xe0) == 0xc0 ? 2 : (s[0] & 0xf0) == 0xe0 ? 3
               : (s[0] & 0xf8) == 0xf0 ? 4 : 0;
    *used = 1;
    if (len == 0 || len > n)
        return 0xfffd;
    uint32_t cp = len == 1 ? s[0] : s[0] & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0xfffd;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0xfffd;
    *used = len;
    return cp;
}

/* A double-quoted YAML string that reads back as s: everything outside
 * printable ASCII is escaped, so no byte can change the YAML's meaning. */
static void dump_quoted(FILE *out, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s);
    fputc('"', out);
    for (size_t i = 0; i < n;) {
        if (u[i] >= 0x20 && u[i] < 0x7f) {
            if (u[i] == '"' || u[i] == '\\')
                fputc('\\', out);
            fputc(u[i], out);
            i++;
            continue;
        }
        size_t used;
        uint32_t cp = utf8_next(u + i, n - i, &used);
        if (cp <= 0xffff)
            fprintf(out, "\\u%04" PRIX32, cp);
        else
            fprintf(out, "\\U%08" PRIX32, cp);
        i += used;
    }
    fputc('"', out);
}

/* nats.url with the user information of each URL ("user:pass@") replaced. */
static void dump_url(FILE *out, const char *url)
{
    CI_AUTOFREE char *copy = strdup(url);
    if (!copy) {
        dump_quoted(out, "<redacted>");
        return;
    }
    struct ci_buf b = CI_BUF_INIT;
    bool ok = true;
    for (char *item = copy, *next; item && ok; item = next) {
        next = strchr(item, ',');
        if (next)
            *next++ = '\0';
        char *scheme = strstr(item, "://");
        char *host = scheme ? scheme + 3 : item;
        char *at = strrchr(host, '@');
        if (at)
            ok = !ci_buf_appendf(&b, "%.*s<redacted>%s", (int)(host - item), item, at);
        else
            ok = !ci_buf_appendf(&b, "%s", item);
        if (ok && next)
            ok = !ci_buf_append(&b, ",", 1);
    }
    dump_quoted(out, ok && b.data ? (const char *)b.data : "<redacted>");
    ci_buf_release(&b);
}

void ci_config_dump(const struct ci_config *cfg, FILE *out)
{
    if (!cfg || !out)
        return;
    const char *section = NULL;
    size_t slen = 0;
    for (size_t i = 0; i < CI_N_KEYS; i++) {
        const struct ci_config_key *k = &ci_config_keys[i];
        size_t l = section_len(k->key);
        if (!section || l != slen || strncmp(section, k->key, l) != 0) {
            section = k->key;
            slen = l;
            fprintf(out, "%.*s:\n", (int)slen, section);
        }
        fprintf(out, "  %s: ", k->key + slen + 1);
        switch (k->type) {
        case CT_STRING: {
            const char *s = get_str(cfg, k);
            if (k->secret && *s)
                dump_quoted(out, "<redacted>");
            else if (k->check == CS_URL)
                dump_url(out, s);
            else
                dump_quoted(out, s);
            break;
        }
        case CT_UINT32:
        case CT_INT32: fprintf(out, "%" PRId64, get_num(cfg, k)); break;
        case CT_BOOL: fputs(get_num(cfg, k) ? "true" : "false", out); break;
        case CT_ENUM: {
            int64_t v = get_num(cfg, k), n = 0;
            while (k->names[n])
                n++;
            fputs(v >= 0 && v < n ? k->names[v] : "?", out);
            break;
        }
        }
        fputc('\n', out);
    }
}

void ci_config_task_uid_layout(const struct ci_config *cfg, struct ci_task_uid_layout *ret)
{
    uint32_t slots = ci_config_slots(cfg);
    uint32_t spares = cfg->local.warm_spares ? cfg->local.warm_spares : slots;
    uint32_t pool = cfg->local.warm_pool_size ? cfg->local.warm_pool_size : 1;
    ret->cold = slots;
    /* A zygote frees a task's uid when that task's init is gone, and the
     * sandbox's reaper lets up to `slots` ended runs finish exiting while
     * every slot runs a new task: room for both, the spares and two more. */
    ret->block = 2 * slots + spares + 2;
    ret->need_warm = slots + (pool + 1) * ret->block;
}

uint32_t ci_config_slots(const struct ci_config *cfg)
{
    if (cfg->worker.concurrency)
        return cfg->worker.concurrency;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    return cpus > 0 ? (uint32_t)cpus : 1;
}
