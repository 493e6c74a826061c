/* config.h - the worker's configuration, read from YAML (libyaml).
 *
 * Every key is listed once in the table in config.c with its type, bounds and
 * default; an unknown key, a wrong type or a value out of range is an error
 * "worker.yaml:LINE: key 'x': what is wrong". After loading, CI_NATS_URL in
 * the environment replaces nats.url. The loaded config is read-only. */
#ifndef CI_CONFIG_H
#define CI_CONFIG_H

#include <stdbool.h>
#include <stdio.h>
#include <stdint.h>

#include "core/status.h"

enum ci_isolation {
    CI_ISOLATION_AUTO,     /* sandbox when the probe allows it, else run bare with a warning */
    CI_ISOLATION_REQUIRED, /* refuse to start without the sandbox */
    CI_ISOLATION_NONE,     /* never sandbox: developers only */
};

/* How ci-executor checks its callers (config executor.auth). There is no
 * default: an executor refuses to start until the operator chooses. */
enum ci_executor_auth {
    CI_AUTH_UNSET,           /* not chosen: ci-executor refuses to start */
    CI_AUTH_NONE,            /* no check: something in front does it (Cloud Run IAM) */
    CI_AUTH_GOOGLE_ID_TOKEN, /* a Google-signed ID token, verified here */
};

enum ci_sandbox_mode {
    CI_MODE_COLD, /* every task starts python3 in a fresh sandbox */
    CI_MODE_WARM, /* tasks fork from a zygote with the runtime imported (zygote.h) */
};

struct ci_config {
    struct {
        char *url;          /* "nats://127.0.0.1:4222"; comma-separated list allowed */
        char *name;         /* connection name shown by the server */
        char *creds_file;   /* JWT + nkey seed (.creds) */
        char *nkey_seed_file;
        char *token;
        char *user;
        char *password;
        char *tls_ca;
        char *tls_cert;
        char *tls_key;
        uint32_t connect_timeout_ms; /* 5000 */
        int32_t max_reconnects;      /* -1 = forever */
        uint32_t reconnect_wait_ms;  /* 1000 */
        uint32_t write_deadline_ms;  /* 10000; 0 = none */
    } nats;
    struct {
        char *tasks_stream;    /* CI_TASKS */
        char *submit_subject;  /* ci.submit */
        char *consumer;        /* ci-workers */
        char *status_stream;   /* CI_STATUS */
        char *status_prefix;   /* ci.status */
        char *cancel_stream;   /* CI_CANCEL */
        char *cancel_prefix;   /* ci.cancel */
        char *output_stream;   /* CI_OUTPUT: live output chunks (contract §19) */
        char *output_prefix;   /* ci.out: <prefix>.<task_id>.stdout|stderr */
        char *results_bucket;  /* ci-results */
        char *files_bucket;    /* ci-files */
        char *workers_bucket;  /* ci-workers: heartbeats, read by `ci stats` */
        char *sessions_bucket; /* ci-sessions: one record per session (contract §16) */
        char *runtimes_bucket; /* ci-runtimes: what each runtime offers (contract §18) */
        /* Batches (contract §20, §21): the batch lane and the batches' events. */
        char *batch_stream;        /* CI_BATCH: WorkQueue of batch tasks */
        char *batch_subject;       /* ci.batch: a batch's tasks on <batch_subject>.<batch_id> */
        char *batch_consumer;      /* ci-workers-batch */
        char *batch_events_stream; /* CI_BATCHES */
        char *batch_events_prefix; /* ci.batches: events on <prefix>.<batch_id>.<event> */
        uint32_t max_age_s;          /* 3600: streams, KV TTL, object TTL */
        uint32_t duplicate_window_s; /* 120 */
        uint32_t ack_wait_s;         /* 30 */
        uint32_t max_deliver;        /* 5 */
        uint32_t replicas;           /* 1 */
        bool file_storage;           /* true */
        uint32_t files_max_mb;       /* 0: the files bucket has no size limit of its own */
        bool live_output;            /* true: publish output while the code runs (§19) */
        uint32_t output_max_mb;      /* 1024: the output stream's size limit */
        uint32_t check_s;            /* 15: how often the worker looks for its streams */
    } jetstream;
    struct {
        char *id;             /* "" = hostname-pid */
        uint32_t concurrency; /* 0 = online CPUs */
        char *provider;       /* "local" | "cloudrun" */
        uint32_t drain_timeout_s; /* 90: longest wait for running tasks on SIGTERM */
        char *log_level;      /* debug | info | warn | error */
        char *metrics_addr;   /* "127.0.0.1:9464": /metrics, /healthz, /readyz; "" = off */
        uint32_t heartbeat_s; /* 10: heartbeat period in the workers bucket; 0 = off */
        uint32_t batch_every; /* 4: of every N tasks a slot takes while both lanes have
                                 work, one comes from the batch lane (contract §21) */
    } worker;
    struct {
        uint32_t default_timeout_ms; /* 60000 */
        uint32_t max_timeout_ms;     /* 60000 */
        uint32_t default_memory_mb;  /* 1024 */
        uint32_t max_memory_mb;      /* 4096 */
        uint32_t max_code_bytes;     /* 1 MiB */
        uint32_t max_input_bytes;    /* 20 MiB, all inputs together */
        uint32_t max_artifact_bytes; /* 20 MiB, all artifacts together */
        uint32_t max_output_bytes;   /* 1 MiB, each of stdout and stderr */
    } limits;
    struct {                  /* docs/contract.md §16 */
        uint32_t max_state_mb; /* 64: largest state a step may leave */
        uint32_t idle_s;       /* 1200: a session with no step ended for this long expires */
        uint32_t max_waiting;  /* 64: session tasks a worker holds while their turn comes */
    } sessions;
    struct {                        /* docs/contract.md §20 */
        uint32_t max_age_s;          /* 86400: CI_BATCH and CI_BATCHES keep messages this long */
        uint32_t duplicate_window_s; /* 3600: both streams' Nats-Msg-Id window */
    } batches;
    struct {
        enum ci_isolation isolation; /* auto */
        char *python;          /* /usr/bin/python3 */
        uint32_t sandbox_uid;  /* outside uid the sandbox maps to when the worker is root: 65534 */
        uint32_t sandbox_gid;  /* 65534 */
        /* A worker that is root runs each task's code as a uid of its own
         * from this range (the kernel counts some resources per user), and
         * the sandbox's init as sandbox_uid. 0: every task as sandbox_uid. */
        uint32_t task_uid_first; /* 2000000000 */
        uint32_t task_uid_count; /* 5000 */
        uint32_t workspace_mb; /* 256: tmpfs size of /workspace */
        uint32_t tmp_mb;       /* 64: tmpfs size of /tmp */
        uint32_t max_processes; /* 64 */
        uint32_t max_open_files; /* 256 */
        uint32_t cpus;          /* 1: CPUs of time a task may use at once (cgroup cpu.max) */
        bool require_cgroup;    /* false: refuse to start without per-task cgroups */
        enum ci_sandbox_mode mode; /* warm (cold where the probe cannot start a zygote) */
        uint32_t warm_pool_size;   /* 1: zygotes kept ready in warm mode */
        uint32_t warm_spares;      /* 1: sandboxes each zygote makes ahead (0 = one per slot) */
        uint32_t warm_rotate_after; /* 200: tasks per zygote before it is replaced */
        char *zygote;           /* "" = ci-zygote beside the running program */
    } local;
    struct {
        char *service_url;    /* "" = not set; the executor's base URL (https://...run.app;
                                 http:// only to a loopback host) */
        char *audience;       /* "" = service_url: the ID token's audience */
        char *metadata_url;   /* the metadata server's identity endpoint */
        char *token_file;     /* "" = metadata server; else a file holding the ID token */
        uint32_t token_refresh_margin_s; /* 300: refresh this long before the token expires */
        uint32_t timeout_margin_ms;      /* 30000: HTTP time beyond the task's limit */
        uint32_t max_attempts;           /* 0 = no cap: tries until the deadline */
        uint32_t backoff_initial_ms;     /* 200 */
        uint32_t backoff_max_ms;         /* 5000 */
        char *ca_file;        /* "" = the system's CA bundle; else a PEM file (checked at load) */
        uint32_t connect_timeout_ms;     /* 5000 */
    } cloudrun;
    struct {                  /* read by ci-executor only */
        enum ci_executor_auth auth; /* unset */
        char *audience;       /* "" ; the `aud` an ID token must carry */
        char *jwks_file;      /* "" ; the signing keys (a JWK set, JSON) */
        char *allowed_emails; /* "" ; comma-separated service-account emails */
        uint32_t clock_skew_s; /* 60: leeway for exp, iat and nbf */
        uint32_t max_connections_per_ip; /* 0: tasks at once + 8 */
    } executor;
    /* Bit i: the table's key i was set in the file (ci_config_was_set). */
    uint64_t set_in_file[2];
};

/* Loads path into a new config. On failure returns CI_ERR_INVALID (or
 * CI_ERR_IO when the file cannot be read) with the message in err. */
ci_status ci_config_load(const char *path, struct ci_config **ret, struct ci_error *err);
/* The same from bytes in memory (at most 1 MiB); name is what messages show
 * in place of the file name. ci_config_load reads the file and calls this. */
ci_status ci_config_parse(const char *name, const uint8_t *data, size_t len,
                          struct ci_config **ret, struct ci_error *err);
/* A config with every default, as if loaded from an empty file. */
ci_status ci_config_defaults(struct ci_config **ret, struct ci_error *err);
void ci_config_free(struct ci_config *cfg);
/* Prints every key and its value as YAML (secrets replaced by "<redacted>"). */
void ci_config_dump(const struct ci_config *cfg, FILE *out);

/* Whether key ("worker.metrics_addr") was set in the file rather than
 * left to its default: a default may give way where a choice must not. */
bool ci_config_was_set(const struct ci_config *cfg, const char *key);

/* How the task uid range (local.task_uid_first, _count) is cut: one uid
 * per task slot for cold runs, then a block per zygote - one uid per task
 * or spare it holds at once. A zygote and its replacement live together
 * while it rotates, so warm mode needs (warm_pool_size + 1) blocks. */
struct ci_task_uid_layout {
    uint32_t cold, block, need_warm;
};
void ci_config_task_uid_layout(const struct ci_config *cfg, struct ci_task_uid_layout *ret);

/* Task slots of a worker: worker.concurrency, or the online CPUs when 0. */
uint32_t ci_config_slots(const struct ci_config *cfg);

#endif
