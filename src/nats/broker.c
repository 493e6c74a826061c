/* broker.c - everything the worker and `ci` do on NATS (broker.h): connect;
 * the streams, consumer, results bucket and object store; pulls and acks on
 * the work queue; status events, cancel requests, queue stats, heartbeats;
 * submit and watch for the client. */
#include "nats/broker.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "nats/natsutil.h"
#include "nats/nkey.h"
#include "nats/objstore_js.h"
#include "core/batch.h"
#include "core/util.h"

#define NS_PER_S 1000000000LL
#define NS_PER_MS 1000000LL
#define SUBJECT_MAX 512

struct ci_broker {
    const struct ci_config *cfg;
    natsConnection *nc;
    jsCtx *js;
    kvStore *kv;
    kvStore *workers_kv; /* heartbeats; NULL until ci_broker_workers_open */
    /* Session records (contract §16). NULL while the bucket does not exist:
     * a client of an older deployment; bound on first use once it does. */
    kvStore *sessions_kv;
    pthread_mutex_t sessions_lock; /* for sessions_kv and runtimes_kv */
    /* Runtime manifests (contract §18); NULL while the bucket does not
     * exist, as sessions_kv. */
    kvStore *runtimes_kv;
    struct ci_objstore *os;
    natsSubscription *cancel_sub;
    ci_cancel_fn cancel_fn;
    void *cancel_closure;
    atomic_bool cancel_done; /* the cancel handler has returned for good */
    natsSubscription *batch_cancel_sub; /* <batch_events_prefix>.*.cancel (contract §20) */
    ci_cancel_fn batch_cancel_fn;
    void *batch_cancel_closure;
    atomic_bool batch_cancel_done;
    natsSubscription *batch_sealed_sub; /* <batch_events_prefix>.*.sealed, a queue group */
    ci_batch_sealed_fn batch_sealed_fn;
    void *batch_sealed_closure;
    atomic_bool batch_sealed_done;
    atomic_uint_fast64_t reconnects;
    atomic_uint_fast64_t disconnects;
    atomic_bool closed_cb_done; /* nats.c has run its last callback on this broker */
    /* Subscriptions let go of while the connection is open (the pullers of
     * slots that left): destroyed only once the read loop has ended (see
     * release_later). */
    pthread_mutex_t graves_lock;
    natsSubscription **graves;
    size_t n_graves, cap_graves;
    /* Unsubscribed ones whose round trip failed (release_sub): destroyed
     * after the next one that succeeds, or at ci_broker_free. */
    natsSubscription **limbo;
    size_t n_limbo, cap_limbo;
    /* Recreating what an operator deleted (recover): one at a time. */
    bool may_create;            /* ci_broker_setup(create): a worker's broker */
    pthread_mutex_t recover_lock;
    atomic_uint_fast64_t recreated;
    pthread_mutex_t problem_lock; /* only for problem: /readyz must never wait on a recovery */
    char problem[512];          /* why what is gone could not be made again; "" */
    /* Live output (contract §19): its stream is there, chunks may go out;
     * when not, why (under problem_lock). */
    atomic_bool output_ok;
    char output_why[400];
};

struct ci_puller {
    struct ci_broker *b;
    char stream[SUBJECT_MAX], consumer[SUBJECT_MAX], subject[SUBJECT_MAX];
    natsSubscription *sub; /* the long polls'; NULL until the first (the batch lane's) */
    int64_t empty_ms; /* when its queue was last seen empty (monotonic) */
    /* Pulls that do not wait (ci_puller_fetch_nowait): sent by hand on the
     * consumer's next-message subject, answered on an inbox of their own,
     * "_INBOX.<nuid>.nowait" (the long polls' inbox is "_INBOX.<nuid>"). */
    char next_subject[SUBJECT_MAX];
    natsSubscription *nowait_sub; /* NULL until first used, or after an answer was lost */
    char nowait_inbox[SUBJECT_MAX];
};

struct ci_delivery {
    natsMsg *msg;
    /* Came on a core subscription (a pull that does not wait): nats.c's
     * natsMsg_Ack() needs a JetStream subscription, so acks are published
     * by hand on the message's reply subject. */
    natsConnection *core_nc;
    uint64_t seq; /* in the tasks stream; 0 when unknown */
    uint32_t attempt;
    uint32_t max_deliver;
    int64_t published_ms;
    int64_t queued_ms; /* -1, or a bound: see ci_delivery_queued_ms */
};

struct ci_watch {
    struct ci_broker *b;
    natsSubscription *sub;
    natsMsg *cur;
};

CI_DEFINE_CLEANUP(struct ci_broker, ci_broker_free)

void ci_broker_redact_urls(const char *urls, char *out, size_t n)
{
    size_t used = 0;
    out[0] = '\0';
    for (const char *item = urls; *item && used + 1 < n;) {
        size_t len = strcspn(item, ",");
        const char *scheme = memmem(item, len, "://", 3);
        const char *host = scheme ? scheme + 3 : item;
        const char *at = memrchr(host, '@', len - (size_t)(host - item));
        int k = at ? snprintf(out + used, n - used, "%.*s<redacted>%.*s", (int)(host - item), item,
                              (int)(item + len - at), at)
                   : snprintf(out + used, n - used, "%.*s", (int)len, item);
        if (k < 0 || (size_t)k >= n - used)
            break;
        used += (size_t)k;
        item += len;
        if (*item == ',') {
            item++;
            if (used + 1 < n) {
                out[used++] = ',';
                out[used] = '\0';
            }
        }
    }
}

#define MAX_URLS 64

/* The configured URL, or a comma-separated list of a cluster's URLs:
 * natsOptions_SetURL takes exactly one URL (a list there makes every
 * connect fail with "No server available"), natsOptions_SetServers a list. */
static natsStatus set_servers(natsOptions *o, const char *urls)
{
    if (!strchr(urls, ','))
        return natsOptions_SetURL(o, urls);
    CI_AUTOFREE char *copy = strdup(urls); /* nats.c keeps copies of the items */
    if (!copy)
        return NATS_NO_MEMORY;
    const char *list[MAX_URLS];
    int n = 0;
    for (char *item = copy, *next; item && n < MAX_URLS; item = next) {
        next = strchr(item, ',');
        if (next)
            *next++ = '\0';
        if (*item)
            list[n++] = item;
    }
    return n ? natsOptions_SetServers(o, list, n) : NATS_INVALID_ARG;
}

static void on_reconnected(natsConnection *nc, void *closure)
{
    struct ci_broker *b = closure;
    atomic_fetch_add(&b->reconnects, 1);
}

static void on_disconnected(natsConnection *nc, void *closure)
{
    struct ci_broker *b = closure;
    atomic_fetch_add(&b->disconnects, 1);
}

/* nats.c runs the connection's callbacks on a thread of its own, in order:
 * the closed callback comes after the disconnected one that closing fires,
 * so once it has run no callback will touch the broker again. */
static void on_closed(natsConnection *nc, void *closure)
{
    struct ci_broker *b = closure;
    atomic_store(&b->closed_cb_done, true);
}

/* Connects b->nc with the options of the configuration: servers, name,
 * timeouts, reconnects, credentials and TLS. The options die here: the
 * connection keeps its own copy. */
static ci_status open_connection(struct ci_broker *b, struct ci_error *err)
{
    const struct ci_config *cfg = b->cfg;
    CI_CLEANUP(natsOptions_Destroy) natsOptions *o = NULL;
    natsStatus s = natsOptions_Create(&o);
    const char *step = "options";
    if (s == NATS_OK)
        s = set_servers(o, cfg->nats.url);
    if (s == NATS_OK && cfg->nats.name && cfg->nats.name[0])
        s = natsOptions_SetName(o, cfg->nats.name);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(o, cfg->nats.connect_timeout_ms);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(o, cfg->nats.max_reconnects);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectWait(o, cfg->nats.reconnect_wait_ms);
    /* Every write to the server within the deadline, or the publish fails
     * (NATS_TIMEOUT) and nats.c shuts the socket down and reconnects:
     * without it a server that stopped reading, or a connection gone
     * silently, blocks a publish - and every other call on the connection,
     * which waits for its lock - until TCP gives up. nats.c arms it once
     * per call, for all of that call's bytes: a whole result must go
     * within it. */
    if (s == NATS_OK)
        s = natsOptions_SetWriteDeadline(o, cfg->nats.write_deadline_ms);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(o, on_reconnected, b);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(o, on_disconnected, b);
    if (s == NATS_OK)
        s = natsOptions_SetClosedCB(o, on_closed, b);
    if (s == NATS_OK && cfg->nats.creds_file && cfg->nats.creds_file[0]) {
        step = "credentials file";
        s = natsOptions_SetUserCredentialsFromFiles(o, cfg->nats.creds_file, NULL);
    }
    if (s == NATS_OK && cfg->nats.nkey_seed_file && cfg->nats.nkey_seed_file[0]) {
        char pub[57];
        ci_status r = ci_nkey_public_from_seed_file(cfg->nats.nkey_seed_file, pub, err);
        if (r)
            return r;
        step = "NKey seed file";
        s = natsOptions_SetNKeyFromSeed(o, pub, cfg->nats.nkey_seed_file);
    }
    if (s == NATS_OK && cfg->nats.token && cfg->nats.token[0])
        s = natsOptions_SetToken(o, cfg->nats.token);
    if (s == NATS_OK && cfg->nats.user && cfg->nats.user[0])
        s = natsOptions_SetUserInfo(o, cfg->nats.user, cfg->nats.password);
    /* nats.c takes tls:// for nats://: a tls:// URL must not connect in clear. */
    if (s == NATS_OK && strstr(cfg->nats.url, "tls://")) {
        step = "TLS";
        s = natsOptions_SetSecure(o, true);
    }
    if (s == NATS_OK && cfg->nats.tls_ca && cfg->nats.tls_ca[0]) {
        step = "TLS CA file";
        s = natsOptions_SetSecure(o, true);
        if (s == NATS_OK)
            s = natsOptions_LoadCATrustedCertificates(o, cfg->nats.tls_ca);
    }
    if (s == NATS_OK && cfg->nats.tls_cert && cfg->nats.tls_cert[0]) {
        step = "TLS certificate or key";
        s = natsOptions_LoadCertificatesChain(o, cfg->nats.tls_cert, cfg->nats.tls_key);
    }
    if (s != NATS_OK) { /* the configuration itself: trying again cannot help */
        ci_status r = ci_nats_fail(err, s, 0, "%s", step);
        return r == CI_ERR_NATS ? CI_ERR_INVALID : r;
    }
    s = natsConnection_Connect(&b->nc, o);
    if (s != NATS_OK) {
        ci_status r = ci_nats_fail(err, s, 0, "cannot connect to NATS");
        size_t used = strlen(err ? err->msg : "");
        char urls[1024];
        ci_broker_redact_urls(cfg->nats.url, urls, sizeof(urls));
        if (err)
            snprintf(err->msg + used, sizeof(err->msg) - used, " (url %s)", urls);
        return r;
    }
    return CI_OK;
}

ci_status ci_broker_connect(const struct ci_config *cfg, struct ci_broker **ret,
                            struct ci_error *err)
{
    CI_CLEANUP(ci_broker_free) struct ci_broker *b = calloc(1, sizeof(*b));
    if (!b)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    b->cfg = cfg;
    pthread_mutex_init(&b->recover_lock, NULL);
    pthread_mutex_init(&b->problem_lock, NULL);
    pthread_mutex_init(&b->sessions_lock, NULL);
    pthread_mutex_init(&b->graves_lock, NULL);
    ci_status r = open_connection(b, err);
    if (r)
        return r;
    natsStatus s = natsConnection_JetStream(&b->js, b->nc, NULL);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, 0, "JetStream context");
    *ret = CI_STEAL(&b);
    return CI_OK;
}

/* Creates the stream, or updates it when it exists with other settings.
 * Two workers racing to create it both succeed. */
static ci_status ensure_stream(struct ci_broker *b, jsStreamConfig *sc, struct ci_error *err)
{
    jsErrCode jerr = 0;
    CI_CLEANUP(jsStreamInfo_Destroy) jsStreamInfo *si = NULL;
    natsStatus s = js_AddStream(&si, b->js, sc, NULL, &jerr);
    if (s == NATS_OK)
        return CI_OK;
    if (jerr != JSStreamNameExistErr)
        return ci_nats_fail(err, s, jerr, "cannot create stream %s", sc->Name);
    jerr = 0;
    s = js_UpdateStream(&si, b->js, sc, NULL, &jerr);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "stream %s exists with settings that cannot be updated",
                            sc->Name);
    return CI_OK;
}

/* A work queue's durable pull consumer, made by setup and shared by every
 * worker (contract §4): ci-workers on the tasks stream, and with the same
 * settings ci-workers-batch on the batch stream (§21). */
static ci_status ensure_consumer_on(struct ci_broker *b, const char *stream, const char *durable,
                                    const char *description, struct ci_error *err)
{
    const struct ci_config *c = b->cfg;
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = durable;
    cc.Description = description;
    cc.AckPolicy = js_AckExplicit;
    cc.DeliverPolicy = js_DeliverAll;
    cc.AckWait = (int64_t)c->jetstream.ack_wait_s * NS_PER_S;
    cc.MaxDeliver = c->jetstream.max_deliver;
    cc.MaxAckPending = -1;
    cc.MaxWaiting = 4096;
    jsErrCode jerr = 0;
    CI_CLEANUP(jsConsumerInfo_Destroy) jsConsumerInfo *ci = NULL;
    natsStatus s = js_AddConsumer(&ci, b->js, stream, &cc, NULL, &jerr);
    if (s == NATS_OK)
        return CI_OK;
    /* Exists with other settings (an older worker's): bring it in line. */
    jerr = 0;
    s = js_UpdateConsumer(&ci, b->js, stream, &cc, NULL, &jerr);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot create consumer %s on %s", cc.Durable, stream);
    return CI_OK;
}

static ci_status ensure_consumer(struct ci_broker *b, struct ci_error *err)
{
    const struct ci_config *c = b->cfg;
    ci_status r = ensure_consumer_on(b, c->jetstream.tasks_stream, c->jetstream.consumer,
                                     "ci-worker task queue", err);
    if (!r)
        r = ensure_consumer_on(b, c->jetstream.batch_stream, c->jetstream.batch_consumer,
                               "ci-worker batch lane", err);
    return r;
}

/* A bucket of ours (results, sessions): one revision per key, kept for
 * max_age_s, on the configured storage and replicas. nats.c 3.4.1 turns on
 * direct gets for a bucket it creates (the kvConfig has no switch). */
static void bucket_config(const struct ci_config *c, const char *bucket, const char *description,
                          kvConfig *kc)
{
    kvConfig_Init(kc);
    kc->Bucket = bucket;
    kc->Description = description;
    kc->History = 1;
    kc->TTL = (int64_t)c->jetstream.max_age_s * NS_PER_S;
    kc->StorageType = c->jetstream.file_storage ? js_FileStorage : js_MemoryStorage;
    kc->Replicas = (int)c->jetstream.replicas;
}

/* Creates the bucket, or binds to it when it exists (another worker made
 * it a moment ago, perhaps with other settings: bind rather than fight). */
static natsStatus create_bucket(struct ci_broker *b, const char *bucket, const char *description,
                                kvStore **ret)
{
    kvConfig kc;
    bucket_config(b->cfg, bucket, description, &kc);
    natsStatus s = js_CreateKeyValue(ret, b->js, &kc);
    if (s != NATS_OK)
        s = js_KeyValue(ret, b->js, bucket);
    return s;
}

static ci_status ensure_kv(struct ci_broker *b, bool create, struct ci_error *err)
{
    const struct ci_config *c = b->cfg;
    if (b->kv)
        return CI_OK; /* an earlier ci_broker_setup() got this far */
    natsStatus s = js_KeyValue(&b->kv, b->js, c->jetstream.results_bucket);
    if (s == NATS_OK || !create) {
        if (s != NATS_OK) {
            char what[160];
            snprintf(what, sizeof(what), "results bucket %s not found (is a worker running?)",
                     c->jetstream.results_bucket);
            return ci_nats_fail(err, s, 0, "%s", what);
        }
        return CI_OK;
    }
    s = create_bucket(b, c->jetstream.results_bucket, "ci task results", &b->kv);
    if (s != NATS_OK) {
        char what[160];
        snprintf(what, sizeof(what), "cannot create results bucket %s",
                 c->jetstream.results_bucket);
        return ci_nats_fail(err, s, 0, "%s", what);
    }
    return CI_OK;
}

/* The sessions bucket: a worker creates it; a client binds to it if it is
 * there, and goes on without it if not (a deployment whose workers predate
 * sessions): the session functions then say CI_ERR_NOT_FOUND. */
static ci_status ensure_sessions_kv(struct ci_broker *b, bool create, struct ci_error *err)
{
    const struct ci_config *c = b->cfg;
    pthread_mutex_lock(&b->sessions_lock);
    natsStatus s = NATS_OK;
    if (!b->sessions_kv) {
        s = create ? create_bucket(b, c->jetstream.sessions_bucket, "ci session records",
                                   &b->sessions_kv)
                   : js_KeyValue(&b->sessions_kv, b->js, c->jetstream.sessions_bucket);
    }
    pthread_mutex_unlock(&b->sessions_lock);
    if (s == NATS_OK || !create)
        return CI_OK;
    char what[160];
    snprintf(what, sizeof(what), "cannot create sessions bucket %s", c->jetstream.sessions_bucket);
    return ci_nats_fail(err, s, 0, "%s", what);
}

/* The runtimes bucket, made and bound as the sessions bucket. */
static ci_status ensure_runtimes_kv(struct ci_broker *b, bool create, struct ci_error *err)
{
    const struct ci_config *c = b->cfg;
    pthread_mutex_lock(&b->sessions_lock);
    natsStatus s = NATS_OK;
    if (!b->runtimes_kv) {
        s = create ? create_bucket(b, c->jetstream.runtimes_bucket, "ci runtime manifests",
                                   &b->runtimes_kv)
                   : js_KeyValue(&b->runtimes_kv, b->js, c->jetstream.runtimes_bucket);
    }
    pthread_mutex_unlock(&b->sessions_lock);
    if (s == NATS_OK || !create)
        return CI_OK;
    char what[160];
    snprintf(what, sizeof(what), "cannot create runtimes bucket %s", c->jetstream.runtimes_bucket);
    return ci_nats_fail(err, s, 0, "%s", what);
}

/* The streams of docs/contract.md, as data: what differs between them. All
 * keep messages for jetstream.max_age_s (the batch streams for
 * batches.max_age_s) on the configured storage and replicas. */
struct stream_def {
    const char *name;
    const char *description;
    const char *subjects[2]; /* the second may be NULL */
    jsRetentionPolicy retention;
    uint32_t max_age_s;         /* 0: jetstream.max_age_s */
    int64_t duplicate_window_s; /* 0: the server's default */
    bool max_payload;           /* no message larger than the server's max_payload */
    bool allow_direct; /* direct gets (ci_broker_cancel_requested, _session_first_seq) */
    int64_t max_bytes; /* 0: no limit; else the oldest messages go first (discard old) */
};

/* Creates or updates the stream d describes. */
static ci_status ensure_def(struct ci_broker *b, const struct stream_def *d, struct ci_error *err)
{
    const struct ci_config *c = b->cfg;
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = d->name;
    sc.Description = d->description;
    sc.Subjects = (const char **)d->subjects;
    sc.SubjectsLen = d->subjects[1] ? 2 : 1;
    sc.Retention = d->retention;
    sc.Storage = c->jetstream.file_storage ? js_FileStorage : js_MemoryStorage;
    sc.MaxAge = (int64_t)(d->max_age_s ? d->max_age_s : c->jetstream.max_age_s) * NS_PER_S;
    sc.Duplicates = d->duplicate_window_s * NS_PER_S;
    if (d->max_payload)
        sc.MaxMsgSize = (int32_t)natsConnection_GetMaxPayload(b->nc);
    sc.Replicas = c->jetstream.replicas;
    sc.AllowDirect = d->allow_direct;
    if (d->max_bytes) {
        sc.MaxBytes = d->max_bytes;
        sc.Discard = js_DiscardOld;
    }
    return ensure_stream(b, &sc, err);
}

static void ensure_output_stream(struct ci_broker *b);

/* Creates or updates each stream of the table. */
static ci_status ensure_streams(struct ci_broker *b, struct ci_error *err)
{
    const struct ci_config *c = b->cfg;
    char status_subj[SUBJECT_MAX], cancel_subj[SUBJECT_MAX], session_subj[SUBJECT_MAX];
    char batch_subj[SUBJECT_MAX], batch_events_subj[SUBJECT_MAX];
    /* A session's tasks (contract §16): an older worker's CI_TASKS with
     * the plain subject only is updated in place (ensure_stream). */
    snprintf(session_subj, sizeof(session_subj), "%s.*", c->jetstream.submit_subject);
    snprintf(status_subj, sizeof(status_subj), "%s.>", c->jetstream.status_prefix);
    snprintf(cancel_subj, sizeof(cancel_subj), "%s.>", c->jetstream.cancel_prefix);
    snprintf(batch_subj, sizeof(batch_subj), "%s.*", c->jetstream.batch_subject);
    snprintf(batch_events_subj, sizeof(batch_events_subj), "%s.>",
             c->jetstream.batch_events_prefix);
    const struct stream_def streams[] = {
        {
            .name = c->jetstream.tasks_stream,
            .description = "ci: submitted tasks",
            .subjects = {c->jetstream.submit_subject, session_subj},
            .retention = js_WorkQueuePolicy,
            .duplicate_window_s = c->jetstream.duplicate_window_s,
            .max_payload = true,
            .allow_direct = true,
        },
        {
            .name = c->jetstream.status_stream,
            .description = "ci: task status events",
            .subjects = {status_subj},
            .retention = js_LimitsPolicy,
        },
        {
            .name = c->jetstream.cancel_stream,
            .description = "ci: cancel requests",
            .subjects = {cancel_subj},
            .retention = js_LimitsPolicy,
            .allow_direct = true,
        },
        /* The batch lane (contract §21): a WorkQueue as CI_TASKS, kept
         * longer, with a window as long as a batch is resubmitted. */
        {
            .name = c->jetstream.batch_stream,
            .description = "ci: batch tasks",
            .subjects = {batch_subj},
            .retention = js_WorkQueuePolicy,
            .max_age_s = c->batches.max_age_s,
            .duplicate_window_s = c->batches.duplicate_window_s,
            .max_payload = true,
            .allow_direct = true,
        },
        /* A batch's events (§20): one message per task and event within
         * the window, so that a subject's message count is a task count;
         * the seal and a cancel are read from its leader. */
        {
            .name = c->jetstream.batch_events_stream,
            .description = "ci: batch events",
            .subjects = {batch_events_subj},
            .retention = js_LimitsPolicy,
            .max_age_s = c->batches.max_age_s,
            .duplicate_window_s = c->batches.duplicate_window_s,
            .allow_direct = true,
        },
    };
    for (size_t i = 0; i < sizeof(streams) / sizeof(streams[0]); i++) {
        ci_status r = ensure_def(b, &streams[i], err);
        if (r)
            return r;
    }
    return CI_OK;
}

ci_status ci_broker_setup(struct ci_broker *b, bool create, struct ci_error *err)
{
    const struct ci_config *c = b->cfg;
    ci_status r;
    b->may_create = create;
    if (create) {
        if ((r = ensure_streams(b, err)))
            return r;
        if ((r = ensure_consumer(b, err)))
            return r;
        ensure_output_stream(b);
    }
    if ((r = ensure_kv(b, create, err)))
        return r;
    if ((r = ensure_sessions_kv(b, create, err)))
        return r;
    if ((r = ensure_runtimes_kv(b, create, err)))
        return r;
    if (b->os)
        return CI_OK;
    struct ci_objstore_opts oo = {
        .bucket = c->jetstream.files_bucket,
        .max_age_s = c->jetstream.max_age_s,
        .max_bytes = (int64_t)c->jetstream.files_max_mb * 1024 * 1024,
        .replicas = (int)c->jetstream.replicas,
        .file_storage = c->jetstream.file_storage,
    };
    return ci_objstore_open(b->js, &oo, create, &b->os, err);
}

/* A bucket's stream, made again (its handle stays valid: it only knows the
 * names). One made meanwhile by another worker is fine. */
static ci_status recreate_bucket(struct ci_broker *b, const char *bucket, const char *description,
                                 struct ci_error *err)
{
    CI_CLEANUP(kvStore_Destroy) kvStore *kv = NULL;
    natsStatus s = create_bucket(b, bucket, description, &kv);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, 0, "cannot create bucket %s again", bucket);
    return CI_OK;
}

/* Whether the stream named is gone: only the server's "not found" says so
 * (no responders also happen while a replicated stream elects a leader). */
static bool stream_missing(struct ci_broker *b, const char *name)
{
    CI_CLEANUP(jsStreamInfo_Destroy) jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetStreamInfo(&si, b->js, name, NULL, &jerr);
    return s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr;
}

/* The live output's stream (contract §19), when the config wants live
 * output. Best effort: live output is a convenience, and JetStream counts
 * a stream's max_bytes against its store as soon as the stream exists, so
 * a server without room for output_max_mb leaves this worker without live
 * output, not without a start (nor unready). The periodic check tries
 * again. A stream that exists (with other settings, maybe) is used as it
 * is. Sets output_ok and, when off, output_why. */
static void ensure_output_stream(struct ci_broker *b)
{
    const struct ci_config *c = b->cfg;
    if (!c->jetstream.live_output)
        return;
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.>", c->jetstream.output_prefix);
    const struct stream_def d = {
        .name = c->jetstream.output_stream,
        .description = "ci: live output of running tasks",
        .subjects = {subj},
        .retention = js_LimitsPolicy,
        .max_bytes = (int64_t)c->jetstream.output_max_mb * 1024 * 1024,
    };
    struct ci_error e = {{0}};
    bool ok = ensure_def(b, &d, &e) == CI_OK || !stream_missing(b, d.name);
    pthread_mutex_lock(&b->problem_lock);
    if (!ok)
        snprintf(b->output_why, sizeof(b->output_why), "%.399s", e.msg);
    else
        b->output_why[0] = '\0';
    pthread_mutex_unlock(&b->problem_lock);
    atomic_store(&b->output_ok, ok);
}

static void set_problem(struct ci_broker *b, const char *why)
{
    pthread_mutex_lock(&b->problem_lock);
    snprintf(b->problem, sizeof(b->problem), "%s", why);
    pthread_mutex_unlock(&b->problem_lock);
}

/* After a failure that may mean one of our streams is gone (an operator
 * deleted CI_STATUS, CI_CANCEL, CI_TASKS, CI_BATCH, CI_BATCHES, the results
 * or the sessions bucket): a worker's broker makes whatever is missing again with the configured settings (the
 * streams, the consumer, the bucket), so that the caller can try once more
 * and the task in hand still ends. True when something was made again.
 * When that is not allowed (a client, or credentials that may not create
 * streams), ci_broker_problem() says why. One thread at a time; one that
 * waited finds everything there and tries again as well. */
static bool recover(struct ci_broker *b, bool maybe_gone)
{
    if (!maybe_gone || !b->may_create)
        return false;
    const struct ci_config *c = b->cfg;
    char kv_stream[SUBJECT_MAX], sessions_stream[SUBJECT_MAX];
    snprintf(kv_stream, sizeof(kv_stream), "KV_%s", c->jetstream.results_bucket);
    snprintf(sessions_stream, sizeof(sessions_stream), "KV_%s", c->jetstream.sessions_bucket);
    uint64_t before = atomic_load(&b->recreated);
    pthread_mutex_lock(&b->recover_lock);
    if (atomic_load(&b->recreated) != before) { /* another thread just did it */
        pthread_mutex_unlock(&b->recover_lock);
        return true;
    }
    bool streams = stream_missing(b, c->jetstream.tasks_stream) ||
                   stream_missing(b, c->jetstream.status_stream) ||
                   stream_missing(b, c->jetstream.cancel_stream) ||
                   stream_missing(b, c->jetstream.batch_stream) ||
                   stream_missing(b, c->jetstream.batch_events_stream);
    /* Live output's stream on its own: it never makes the worker unready. */
    bool output = c->jetstream.live_output &&
                  (!atomic_load(&b->output_ok) || stream_missing(b, c->jetstream.output_stream));
    if (output) {
        ensure_output_stream(b);
        output = atomic_load(&b->output_ok);
    }
    bool kv = stream_missing(b, kv_stream);
    bool sessions = stream_missing(b, sessions_stream);
    struct ci_error e = {{0}};
    ci_status r = CI_OK;
    if (streams) {
        r = ensure_streams(b, &e);
        if (!r)
            r = ensure_consumer(b, &e);
    }
    if (!r && kv)
        r = recreate_bucket(b, c->jetstream.results_bucket, "ci task results", &e);
    if (!r && sessions)
        r = recreate_bucket(b, c->jetstream.sessions_bucket, "ci session records", &e);
    if (r) {
        char why[sizeof(b->problem)];
        snprintf(why, sizeof(why),
                 "a stream or bucket of the service was deleted and cannot be created again: "
                 "%.400s",
                 e.msg);
        set_problem(b, why);
    } else {
        set_problem(b, ""); /* all there again, whoever made it */
        if (streams || kv || sessions || output)
            atomic_fetch_add(&b->recreated, 1);
    }
    pthread_mutex_unlock(&b->recover_lock);
    return !r && (streams || kv || sessions || output);
}

bool ci_broker_check(struct ci_broker *b)
{
    return recover(b, true);
}

bool ci_broker_live_output(struct ci_broker *b, char *why, size_t n)
{
    bool ok = atomic_load(&b->output_ok);
    if (why && n) {
        pthread_mutex_lock(&b->problem_lock);
        snprintf(why, n, "%s", ok ? "" : b->output_why);
        pthread_mutex_unlock(&b->problem_lock);
    }
    return ok;
}

bool ci_broker_problem(struct ci_broker *b, char *why, size_t n)
{
    pthread_mutex_lock(&b->problem_lock);
    bool bad = b->problem[0] != '\0';
    if (bad)
        snprintf(why, n, "%s", b->problem);
    pthread_mutex_unlock(&b->problem_lock);
    return bad;
}

uint64_t ci_broker_recreated(const struct ci_broker *b)
{
    return atomic_load(&((struct ci_broker *)b)->recreated);
}

/* Appends sub to the list *v of *n (room for *cap); false when out of
 * memory. */
static bool subs_push(natsSubscription ***v, size_t *n, size_t *cap, natsSubscription *sub)
{
    if (*n == *cap) {
        size_t c = *cap ? *cap * 2 : 8;
        natsSubscription **g = realloc(*v, c * sizeof(*g));
        if (!g)
            return false;
        *v = g;
        *cap = c;
    }
    (*v)[(*n)++] = sub;
    return true;
}

/* Why later: nats.c 3.4.1's read loop looks a message's subscription up
 * without a reference (natsConn_processMsg, src/conn.c: natsHash_Get, then
 * natsMsg_create, then natsMutex_Lock(sub->mu); nats.c issue #637, fixed in
 * 3.6.1). A subscription whose last reference goes meanwhile is freed under
 * it: a late 408 for a slot's last fetch, or a cancel, as the worker stops
 * (test_broker_drain). Ours goes only after natsConnection_Close has joined
 * the read loop (ci_broker_free). Bounded: the pullers, one per slot (not
 * unsubscribed: that could delete the shared durable). One unsubscribed
 * goes sooner: release_sub. */
static void release_later(struct ci_broker *b, natsSubscription *sub)
{
    if (!sub)
        return;
    pthread_mutex_lock(&b->graves_lock);
    bool kept = subs_push(&b->graves, &b->n_graves, &b->cap_graves, sub);
    pthread_mutex_unlock(&b->graves_lock);
    if (!kept)
        natsSubscription_Destroy(sub); /* out of memory: at once, as before */
}

/* How long release_sub waits for its round trip's answer. */
#define RELEASE_WAIT_MS 2000

/* A round trip through the read loop: a request to a subject nobody
 * serves, which the server answers with "no responders". The read loop
 * hands that answer over only after every message it read before it. Not
 * a flush: nats.c 3.4.1's flush returns NATS_OK without a round trip when
 * its PING cannot be written (_flushTimeout ignores _sendPing's error). */
static bool round_trip(struct ci_broker *b)
{
    if (natsConnection_Status(b->nc) != NATS_CONN_STATUS_CONNECTED)
        return false; /* it would only wait out RELEASE_WAIT_MS */
    CI_CLEANUP(natsInbox_Destroy) natsInbox *nobody = NULL;
    if (natsInbox_Create(&nobody) != NATS_OK)
        return false;
    natsMsg *m = NULL;
    natsStatus s = natsConnection_RequestString(&m, b->nc, (const char *)nobody, "",
                                                RELEASE_WAIT_MS);
    natsMsg_Destroy(m);
    return s == NATS_NO_RESPONDERS || s == NATS_OK; /* an answer came through */
}

/* Destroys the subscriptions in limbo once a round trip says the read loop
 * holds none of them; back in limbo (with any that came meanwhile) when it
 * fails. Out of memory: one is leaked, never freed under the read loop. */
static void limbo_release(struct ci_broker *b, natsSubscription *sub)
{
    pthread_mutex_lock(&b->graves_lock);
    natsSubscription **old = b->limbo;
    size_t n_old = b->n_limbo, cap_old = b->cap_limbo;
    b->limbo = NULL;
    b->n_limbo = b->cap_limbo = 0;
    pthread_mutex_unlock(&b->graves_lock);
    if (!sub && n_old == 0)
        return;
    if (round_trip(b)) {
        natsSubscription_Destroy(sub);
        for (size_t i = 0; i < n_old; i++)
            natsSubscription_Destroy(old[i]);
        free(old);
        return;
    }
    pthread_mutex_lock(&b->graves_lock);
    for (size_t i = 0; i < b->n_limbo; i++)
        subs_push(&old, &n_old, &cap_old, b->limbo[i]);
    free(b->limbo);
    b->limbo = old;
    b->n_limbo = n_old;
    b->cap_limbo = cap_old;
    if (sub)
        subs_push(&b->limbo, &b->n_limbo, &b->cap_limbo, sub);
    pthread_mutex_unlock(&b->graves_lock);
}

/* Lets go of sub while the connection stays open, when a message for it
 * may still come (release_later says why it cannot simply be destroyed):
 * unsubscribes it (the read loop finds it no more), then a round trip
 * (round_trip), after which the read loop holds no pointer to sub, nor to
 * one unsubscribed before. When that fails (the connection is down or
 * closed, or no answer within RELEASE_WAIT_MS), sub waits in limbo for the
 * next round trip that succeeds (after a reconnect the old read loop has
 * been joined; the worker's ticker asks: ci_broker_release_pending) or for
 * ci_broker_free. One round trip, and the library deletes a consumer it
 * made for a JetStream sub (an ordered consumer's): not for a path every
 * task takes. */
static void release_sub(struct ci_broker *b, natsSubscription *sub)
{
    if (!sub)
        return;
    natsSubscription_Unsubscribe(sub); /* fails when already: fine */
    /* An ordered consumer's reset may have given it a new sid meanwhile
     * (nats.c reads the sid without the sub's lock): once more. */
    if (natsSubscription_IsValid(sub))
        natsSubscription_Unsubscribe(sub);
    limbo_release(b, sub);
}

size_t ci_broker_pending_releases(struct ci_broker *b)
{
    pthread_mutex_lock(&b->graves_lock);
    size_t n = b->n_limbo;
    pthread_mutex_unlock(&b->graves_lock);
    return n;
}

void ci_broker_release_pending(struct ci_broker *b)
{
    pthread_mutex_lock(&b->graves_lock);
    bool any = b->n_limbo > 0;
    pthread_mutex_unlock(&b->graves_lock);
    if (any)
        limbo_release(b, NULL);
}

/* Unsubscribes sub and waits (at most 2 s) until its handler has returned
 * for good (done, set by its on-complete callback); the caller destroys
 * it after the connection is closed (release_later says why). */
static void stop_handler(natsSubscription *sub, atomic_bool *done)
{
    if (!sub)
        return;
    natsSubscription_Unsubscribe(sub);
    for (int i = 0; i < 200 && !atomic_load(done); i++) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void on_handler_done(void *closure) { atomic_store((atomic_bool *)closure, true); }

/* A core subscription on subj (in queue group queue, unless NULL) whose
 * handler cb runs on a NATS thread with b; *done is set once the library
 * says the handler returned for good (stop_handler waits for that). */
static ci_status subscribe_handler(struct ci_broker *b, const char *subj, const char *queue,
                                   natsMsgHandler cb, atomic_bool *done, natsSubscription **ret,
                                   const char *what, struct ci_error *err)
{
    natsSubscription *sub = NULL;
    natsStatus s = queue ? natsConnection_QueueSubscribe(&sub, b->nc, subj, queue, cb, b)
                         : natsConnection_Subscribe(&sub, b->nc, subj, cb, b);
    if (s == NATS_OK)
        s = natsSubscription_SetOnCompleteCB(sub, on_handler_done, done);
    if (s != NATS_OK) {
        ci_status r = ci_nats_fail(err, s, 0, "cannot subscribe to %s", what);
        release_sub(b, sub); /* a message may be on its way to it */
        return r;
    }
    *ret = sub;
    return CI_OK;
}

void ci_broker_free(struct ci_broker *b)
{
    if (!b)
        return;
    /* The cancel handlers run on a NATS thread and use what the caller
     * frees next (slots, provider): wait until the library says each has
     * returned for good (at most 2 s). */
    stop_handler(b->cancel_sub, &b->cancel_done);
    stop_handler(b->batch_cancel_sub, &b->batch_cancel_done);
    stop_handler(b->batch_sealed_sub, &b->batch_sealed_done);
    ci_objstore_free(b->os);
    kvStore_Destroy(b->workers_kv);
    kvStore_Destroy(b->sessions_kv);
    kvStore_Destroy(b->runtimes_kv);
    kvStore_Destroy(b->kv);
    jsCtx_Destroy(b->js);
    if (b->nc) {
        /* Flush what is buffered (acks, events) before closing. */
        natsConnection_FlushTimeout(b->nc, 2000);
        natsConnection_Close(b->nc);
        /* The callbacks hold b: free it only once the last has run (2 s
         * at most; a connection that never connected has none to run). */
        for (int i = 0; i < 200 && !atomic_load(&b->closed_cb_done); i++) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    /* The read loop has ended (Close joins it): nothing looks these up. */
    natsSubscription_Destroy(b->cancel_sub);
    natsSubscription_Destroy(b->batch_cancel_sub);
    natsSubscription_Destroy(b->batch_sealed_sub);
    for (size_t i = 0; i < b->n_graves; i++)
        natsSubscription_Destroy(b->graves[i]);
    free(b->graves);
    for (size_t i = 0; i < b->n_limbo; i++)
        natsSubscription_Destroy(b->limbo[i]);
    free(b->limbo);
    natsConnection_Destroy(b->nc);
    pthread_mutex_destroy(&b->graves_lock);
    pthread_mutex_destroy(&b->recover_lock);
    pthread_mutex_destroy(&b->problem_lock);
    pthread_mutex_destroy(&b->sessions_lock);
    free(b);
}

void ci_broker_library_close(void) { nats_CloseAndWait(2000); }

struct ci_objstore *ci_broker_objstore(struct ci_broker *b) { return b->os; }

int64_t ci_broker_max_payload(const struct ci_broker *b)
{
    return natsConnection_GetMaxPayload(b->nc);
}

uint64_t ci_broker_reconnects(const struct ci_broker *b)
{
    return atomic_load(&((struct ci_broker *)b)->reconnects);
}

uint64_t ci_broker_disconnects(const struct ci_broker *b)
{
    return atomic_load(&((struct ci_broker *)b)->disconnects);
}

bool ci_broker_connected(const struct ci_broker *b)
{
    return natsConnection_Status(b->nc) == NATS_CONN_STATUS_CONNECTED;
}

bool ci_broker_closed(const struct ci_broker *b)
{
    return natsConnection_IsClosed(b->nc);
}

/* --- work queue --- */

/* Where a pull request for a consumer goes: <prefix><stream>.<consumer>
 * (the JetStream API of the connection's account, without a domain). */
#define NEXT_PREFIX "$JS.API.CONSUMER.MSG.NEXT."

/* The subscription of the long polls, bound to a durable that setup
 * created (a consumer made implicitly here would be deleted when this
 * subscription goes away). */
static ci_status puller_bind(struct ci_puller *p, struct ci_error *err)
{
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = p->stream;
    so.Consumer = p->consumer;
    jsErrCode jerr = 0;
    natsStatus s = js_PullSubscribe(&p->sub, p->b->js, p->subject, p->consumer, NULL, &so, &jerr);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot bind to consumer %s on %s", p->consumer,
                            p->stream);
    p->empty_ms = ci_mono_ms();
    return CI_OK;
}

/* A puller on consumer of stream; bound now (a subscription for long
 * polls) or only checked to exist (a lane asked only with pulls that do
 * not wait: no subscription a stray pull request could fill). */
static ci_status puller_open(struct ci_broker *b, const char *stream, const char *consumer,
                             const char *subject, bool bind, struct ci_puller **ret,
                             struct ci_error *err)
{
    CI_AUTOFREE struct ci_puller *p = calloc(1, sizeof(*p));
    if (!p)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    p->b = b;
    snprintf(p->stream, sizeof(p->stream), "%s", stream);
    snprintf(p->consumer, sizeof(p->consumer), "%s", consumer);
    snprintf(p->subject, sizeof(p->subject), "%s", subject);
    int k = snprintf(p->next_subject, sizeof(p->next_subject), NEXT_PREFIX "%s.%s", stream,
                     consumer);
    if (k < 0 || (size_t)k >= sizeof(p->next_subject))
        return ci_error_set(err, CI_ERR_INVALID, "consumer name too long");
    if (bind) {
        ci_status r = puller_bind(p, err);
        if (r)
            return r;
    } else {
        CI_CLEANUP(jsConsumerInfo_Destroy) jsConsumerInfo *ci = NULL;
        jsErrCode jerr = 0;
        natsStatus s = js_GetConsumerInfo(&ci, b->js, stream, consumer, NULL, &jerr);
        if (s != NATS_OK)
            return ci_nats_fail(err, s, jerr, "cannot find consumer %s on %s", consumer, stream);
    }
    *ret = CI_STEAL(&p);
    return CI_OK;
}

ci_status ci_puller_new(struct ci_broker *b, struct ci_puller **ret, struct ci_error *err)
{
    const struct ci_config *c = b->cfg;
    return puller_open(b, c->jetstream.tasks_stream, c->jetstream.consumer,
                       c->jetstream.submit_subject, true, ret, err);
}

ci_status ci_puller_new_batch(struct ci_broker *b, struct ci_puller **ret, struct ci_error *err)
{
    const struct ci_config *c = b->cfg;
    char subject[SUBJECT_MAX];
    snprintf(subject, sizeof(subject), "%s.*", c->jetstream.batch_subject);
    return puller_open(b, c->jetstream.batch_stream, c->jetstream.batch_consumer, subject, false,
                       ret, err);
}

const char *ci_puller_inbox(const struct ci_puller *p)
{
    return p->sub ? natsSubscription_GetSubject(p->sub) : NULL;
}

/* Drops the inbox of pulls that do not wait: an answer that comes after
 * its pull gave up on it finds no subscription, and a message in it goes
 * back to the stream after the ack wait, never to a slot that is busy. */
static void nowait_drop(struct ci_puller *p)
{
    release_sub(p->b, p->nowait_sub); /* its late answer may be in the read loop's hands */
    p->nowait_sub = NULL;
}

void ci_puller_free(struct ci_puller *p)
{
    if (!p)
        return;
    /* Destroy only: Unsubscribe or Drain could delete the shared durable
     * (the inbox of nowait pulls is ours alone). Later, with the broker:
     * the 408 or the task a pull request of ours still brings may be in
     * the read loop's hands right now (release_later). Until then what
     * comes waits in a queue nobody reads, and a task goes back to the
     * stream after the ack wait, as one sent to no subscription did. */
    release_later(p->b, p->sub);
    release_later(p->b, p->nowait_sub);
    free(p);
}

/* The messages and bytes waiting in the subscription's own queue; 0 when
 * unknown (the subscription is closed: Fetch fails too). */
static int queue_len(natsSubscription *sub, int *ret_bytes)
{
    int msgs = 0, bytes = 0;
    if (natsSubscription_GetPending(sub, &msgs, &bytes) != NATS_OK)
        msgs = bytes = 0;
    *ret_bytes = bytes;
    return msgs;
}

/* A delivery of msg, taken by the puller; core_nc for one that came on a
 * core subscription. NULL when out of memory (msg is destroyed). */
static struct ci_delivery *delivery_new(struct ci_puller *p, natsMsg *msg, natsConnection *core_nc)
{
    struct ci_delivery *d = calloc(1, sizeof(*d));
    if (!d) {
        natsMsg_Destroy(msg);
        return NULL;
    }
    d->msg = msg;
    d->core_nc = core_nc;
    d->queued_ms = -1;
    d->max_deliver = p->b->cfg->jetstream.max_deliver;
    CI_CLEANUP(jsMsgMetaData_Destroy) jsMsgMetaData *md = NULL;
    if (natsMsg_GetMetaData(&md, d->msg) == NATS_OK) {
        d->attempt = (uint32_t)md->NumDelivered;
        d->published_ms = md->Timestamp / NS_PER_MS;
        d->seq = md->Sequence.Stream;
    } else {
        d->attempt = 1;
    }
    return d;
}

/* Why the queue: nats.c 3.4.1 sends every Fetch's pull request with the
 * subscription's one inbox as reply subject, and a request can outlive its
 * Fetch on the server: the server got it a little late and the Fetch timed
 * out first, or a late 408 ended the next Fetch early (waited out below).
 * A message given to such a request while the slot runs a task waits in the
 * queue, its ack timer running; the next Fetch takes it first. Whatever sits
 * in the queue came after it was last seen empty, which bounds how long it
 * waited. */
ci_status ci_puller_fetch(struct ci_puller *p, int timeout_ms, struct ci_delivery **ret,
                          struct ci_error *err)
{
    if (!p->sub) {
        ci_status r = puller_bind(p, err);
        if (r)
            return r;
    }
    CI_CLEANUP(natsMsgList_Destroy) natsMsgList list = {0};
    jsErrCode jerr = 0;
    int queued_bytes = 0;
    int queued = queue_len(p->sub, &queued_bytes);
    int64_t start = ci_mono_ms();
    int64_t since = queued ? p->empty_ms : start;
    /* Batch 1: larger batches hit a heap overflow in nats.c 3.4.1. */
    natsStatus s = natsSubscription_Fetch(&list, p->sub, 1, timeout_ms, &jerr);
    int64_t now = ci_mono_ms();
    if (s == NATS_TIMEOUT && now - start + 20 < timeout_ms) {
        /* Ended early (nats.c asks the server to expire the request 10 ms
         * before the timeout, so its own 408 cannot come this soon): by the
         * late 408 of an earlier request, which nats.c 3.4.1 cannot tell
         * from its own. This Fetch's request is still open. Another Fetch
         * now would open a second one, either could take a task while the
         * slot runs one the other gave it, and each 408 of the two would end
         * the next Fetch early again: two for good. Wait until something is
         * queued (a task: the next Fetch takes it; its 408) or the request
         * has expired. */
        int ignored = 0;
        while (now < start + timeout_ms + 100 && queue_len(p->sub, &ignored) == 0) {
            struct timespec ts = {0, 5 * NS_PER_MS};
            nanosleep(&ts, NULL);
            now = ci_mono_ms();
        }
    }
    int left_bytes = 0;
    p->empty_ms = queue_len(p->sub, &left_bytes) ? since : now;
    if (s == NATS_TIMEOUT || (s == NATS_OK && list.Count == 0))
        return CI_ERR_TIMEOUT;
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "fetch from the task queue");
    /* The list keeps Count; it skips a NULL. */
    struct ci_delivery *d = delivery_new(p, CI_STEAL(&list.Msgs[0]), NULL);
    if (!d)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    /* Fetch takes what is queued before it asks the server, so a message
     * came from the queue if one was there, unless the queue held only
     * status messages (a late 408 of a request that expired while the slot
     * was busy): Fetch drops those and asks for a fresh message. The queue
     * counts header and data bytes, a status message has no data: with
     * fewer bytes queued than this message's data, it cannot have been
     * queued. A smaller message after a 408 still passes for queued. */
    if (queued > 0 && queued_bytes >= natsMsg_GetDataLength(d->msg))
        d->queued_ms = now - since;
    *ret = d;
    return CI_OK;
}

/* The answer to a pull that does not wait comes at once (the message, or
 * a 404 or 408 status); this is for a server that does not answer. */
#define NOWAIT_ANSWER_MS 2000
/* A fetch for what already waits in the long polls' queue. */
#define QUEUED_FETCH_MS 50

/* Why by hand: nats.c 3.4.1 sends no_wait only with an expiry, and then
 * nats-server 2.9.10 waits for that expiry on an empty consumer (it answers
 * 404 at once only to a no_wait request without one), while the client's
 * own wait is 0 ms without one: a pull that does not wait cannot be made
 * with natsSubscription_FetchRequest. A request {"batch":1,"no_wait":true}
 * on the consumer's next-message subject gets one answer: a message, or
 * 404 (none) or 408 (other pulls wait for what there is). */
ci_status ci_puller_fetch_nowait(struct ci_puller *p, struct ci_delivery **ret,
                                 struct ci_error *err)
{
    /* A message that a long poll's request brought after its fetch gave up
     * waits in that subscription's queue, its ack timer running (see
     * ci_puller_fetch): it goes first, as it would at the next long poll,
     * which may not come for long while the other lane keeps the slot
     * busy. Fetch takes what is queued without asking the server; a queue
     * of late 408s alone costs a short wait. */
    int queued_bytes = 0;
    if (p->sub && queue_len(p->sub, &queued_bytes) > 0)
        return ci_puller_fetch(p, QUEUED_FETCH_MS, ret, err);
    natsConnection *nc = p->b->nc;
    natsStatus s = NATS_OK;
    int pending = 0, ignored = 0;
    if (p->nowait_sub &&
        natsSubscription_GetPending(p->nowait_sub, &pending, &ignored) == NATS_OK && pending > 0)
        nowait_drop(p); /* not ours to take: an answer nobody waited for */
    if (!p->nowait_sub) {
        natsInbox *inbox = NULL;
        s = natsInbox_Create(&inbox);
        if (s == NATS_OK)
            snprintf(p->nowait_inbox, sizeof(p->nowait_inbox), "%s.nowait", inbox);
        natsInbox_Destroy(inbox);
        if (s == NATS_OK)
            s = natsConnection_SubscribeSync(&p->nowait_sub, nc, p->nowait_inbox);
        if (s != NATS_OK) {
            nowait_drop(p);
            return ci_nats_fail(err, s, 0, "cannot subscribe to an inbox for pulls");
        }
    }
    s = natsConnection_PublishRequestString(nc, p->next_subject, p->nowait_inbox,
                                            "{\"batch\":1,\"no_wait\":true}");
    CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
    if (s == NATS_OK)
        s = natsSubscription_NextMsg(&m, p->nowait_sub, NOWAIT_ANSWER_MS);
    if (s != NATS_OK) {
        nowait_drop(p);
        return ci_nats_fail(err, s, 0, "pull from %s", p->next_subject + strlen(NEXT_PREFIX));
    }
    const char *status = NULL;
    if (natsMsg_GetDataLength(m) == 0 && natsMsgHeader_Get(m, "Status", &status) == NATS_OK &&
        status) {
        if (strcmp(status, "404") == 0 || strcmp(status, "408") == 0)
            return CI_ERR_TIMEOUT; /* none for this pull */
        const char *why = NULL;
        if (natsMsgHeader_Get(m, "Description", &why) != NATS_OK || !why)
            why = "";
        /* 503: nobody answers on the subject (the consumer is gone, or
         * its leader is being elected); 409 and others: the server's. */
        return ci_error_set(err, CI_ERR_NATS, "pull from %s: status %s %s",
                            p->next_subject + strlen(NEXT_PREFIX), status, why);
    }
    struct ci_delivery *d = delivery_new(p, CI_STEAL(&m), nc);
    if (!d)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    *ret = d;
    return CI_OK;
}

const uint8_t *ci_delivery_data(const struct ci_delivery *d, size_t *ret_len)
{
    *ret_len = (size_t)natsMsg_GetDataLength(d->msg);
    return (const uint8_t *)natsMsg_GetData(d->msg);
}

const char *ci_delivery_header(const struct ci_delivery *d, const char *key)
{
    const char *v = NULL;
    if (natsMsgHeader_Get(d->msg, key, &v) == NATS_OK)
        return v;
    /* nats.c matches names exactly; clients that write HTTP-style headers
     * may send "content-type", and HTTP header names are case-insensitive. */
    CI_AUTOFREE const char **keys = NULL;
    int n = 0;
    if (natsMsgHeader_Keys(d->msg, &keys, &n) != NATS_OK)
        return NULL;
    for (int i = 0; i < n && !v; i++)
        if (strcasecmp(keys[i], key) == 0 && natsMsgHeader_Get(d->msg, keys[i], &v) != NATS_OK)
            v = NULL;
    return v;
}

uint32_t ci_delivery_attempt(const struct ci_delivery *d) { return d->attempt; }

int64_t ci_delivery_published_ms(const struct ci_delivery *d) { return d->published_ms; }

int64_t ci_delivery_queued_ms(const struct ci_delivery *d) { return d->queued_ms; }

/* A JetStream delivery keeps the subject it was published on (the reply
 * subject is the ack's). */
const char *ci_delivery_subject(const struct ci_delivery *d) { return natsMsg_GetSubject(d->msg); }

uint64_t ci_delivery_seq(const struct ci_delivery *d) { return d->seq; }

bool ci_delivery_last_attempt(const struct ci_delivery *d)
{
    return d->attempt >= d->max_deliver;
}

static ci_status ack_result(natsStatus s)
{
    if (s == NATS_OK)
        return CI_OK;
    return CI_ERR_NATS;
}

/* An ack of a core delivery: what natsMsg_Ack and its kin publish. */
static ci_status core_ack(struct ci_delivery *d, const char *body)
{
    const char *reply = natsMsg_GetReply(d->msg);
    if (!reply || !reply[0])
        return CI_ERR_NATS;
    return ack_result(natsConnection_PublishString(d->core_nc, reply, body));
}

ci_status ci_delivery_ack(struct ci_delivery *d)
{
    return d->core_nc ? core_ack(d, "+ACK") : ack_result(natsMsg_Ack(d->msg, NULL));
}
ci_status ci_delivery_term(struct ci_delivery *d)
{
    return d->core_nc ? core_ack(d, "+TERM") : ack_result(natsMsg_Term(d->msg, NULL));
}
ci_status ci_delivery_in_progress(struct ci_delivery *d)
{
    return d->core_nc ? core_ack(d, "+WPI") : ack_result(natsMsg_InProgress(d->msg, NULL));
}
ci_status ci_delivery_nak(struct ci_delivery *d, int64_t delay_ms)
{
    if (!d->core_nc)
        return ack_result(natsMsg_NakWithDelay(d->msg, delay_ms, NULL));
    if (delay_ms <= 0)
        return core_ack(d, "-NAK");
    char body[64];
    snprintf(body, sizeof(body), "-NAK {\"delay\":%" PRId64 "}", (int64_t)(delay_ms * NS_PER_MS));
    return core_ack(d, body);
}

void ci_delivery_free(struct ci_delivery *d)
{
    if (!d)
        return;
    natsMsg_Destroy(d->msg);
    free(d);
}

/* --- results, events, cancel --- */

ci_status ci_broker_result_swap(struct ci_broker *b, const char *task_id, const void *data,
                                size_t len, uint64_t rev, uint64_t *ret_rev, struct ci_error *err)
{
    /* A publish on the key's subject with the server checking the subject's
     * last sequence: what kvStore_Update/Create do, with the JetStream error
     * code kept (a full store, a wrong revision) and "none" said exactly. */
    char subj[SUBJECT_MAX];
    int k = snprintf(subj, sizeof(subj), "$KV.%s.%s", b->cfg->jetstream.results_bucket, task_id);
    if (k < 0 || (size_t)k >= sizeof(subj))
        return ci_error_set(err, CI_ERR_INVALID, "task id too long for a results key");
    jsPubOptions po;
    jsPubOptions_Init(&po);
    if (rev)
        po.ExpectLastSubjectSeq = rev;
    else
        po.ExpectNoMessage = true;
    CI_CLEANUP(jsPubAck_Destroy) jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_Publish(&pa, b->js, subj, data, (int)len, &po, &jerr);
    if (s != NATS_OK && recover(b, ci_nats_gone(s, jerr))) {
        /* The bucket was deleted, and this record with it: write it anew. */
        jsPubOptions_Init(&po);
        po.ExpectNoMessage = true;
        jerr = 0;
        s = js_Publish(&pa, b->js, subj, data, (int)len, &po, &jerr);
    }
    if (s != NATS_OK && jerr == JSStreamWrongLastSequenceErr)
        return ci_error_set(err, CI_ERR_CONFLICT,
                            "the result record of task '%s' changed since revision %" PRIu64,
                            task_id, rev);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot write the result to the results bucket");
    if (ret_rev)
        *ret_rev = pa ? pa->Sequence : 0;
    return CI_OK;
}

ci_status ci_broker_result_create(struct ci_broker *b, const char *task_id, const void *data,
                                  size_t len, struct ci_error *err)
{
    ci_status s = ci_broker_result_swap(b, task_id, data, len, 0, NULL, err);
    if (s == CI_ERR_CONFLICT)
        return ci_error_set(err, CI_ERR_INVALID, "task '%s' already has a result record",
                            task_id);
    return s;
}

/* Read from the bucket's stream leader, not with the direct get that
 * kvStore_Get() uses: a direct get may be answered by a replica still
 * catching up after a leader change, and a redelivered task whose result it
 * does not show yet would run a second time (chaos_cluster saw it). */
ci_status ci_broker_result_get(struct ci_broker *b, const char *task_id, uint8_t **ret_data,
                               size_t *ret_len, uint64_t *ret_rev, struct ci_error *err)
{
    if (ret_rev)
        *ret_rev = 0;
    const char *bucket = b->cfg->jetstream.results_bucket;
    char stream[SUBJECT_MAX], subj[SUBJECT_MAX];
    int k1 = snprintf(stream, sizeof(stream), "KV_%s", bucket);
    int k2 = snprintf(subj, sizeof(subj), "$KV.%s.%s", bucket, task_id);
    if (k1 < 0 || (size_t)k1 >= sizeof(stream) || k2 < 0 || (size_t)k2 >= sizeof(subj))
        return ci_error_set(err, CI_ERR_INVALID, "task id too long for a results key");
    CI_CLEANUP(natsMsg_Destroy) natsMsg *msg = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetLastMsg(&msg, b->js, stream, subj, NULL, &jerr);
    if (s != NATS_OK && jerr == JSStreamNotFoundErr && recover(b, true))
        return ci_error_set(err, CI_ERR_NOT_FOUND,
                            "no result for task '%s' (the results bucket had been deleted)",
                            task_id);
    if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
        return ci_error_set(err, CI_ERR_NOT_FOUND, "no result for task '%s'", task_id);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot read the results bucket");
    const char *op = NULL;
    if (ret_rev) /* a deleted record has a revision too: the next write checks it */
        *ret_rev = natsMsg_GetSequence(msg);
    if (natsMsgHeader_Get(msg, "KV-Operation", &op) == NATS_OK && op &&
        (strcmp(op, "DEL") == 0 || strcmp(op, "PURGE") == 0))
        return ci_error_set(err, CI_ERR_NOT_FOUND, "no result for task '%s'", task_id);
    int n = natsMsg_GetDataLength(msg);
    uint8_t *copy = malloc((size_t)n + 1);
    if (!copy)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    if (n > 0)
        memcpy(copy, natsMsg_GetData(msg), (size_t)n);
    copy[n] = '\0';
    *ret_data = copy;
    *ret_len = (size_t)n;
    return CI_OK;
}

/* How long a request of ours to the JetStream API waits for its answer:
 * the JetStream context's own timeout (5 s, nats.c's default). */
#define JS_API_WAIT_MS 5000

/* One answer of the stream API's message get, as js_GetLastMsg reads it:
 * CI_OK with the record's bytes (malloc'd, *ret_data NULL when empty),
 * CI_ERR_NOT_FOUND for none or a deleted record, else a failure. */
static ci_status lookup_answer(natsMsg *m, const char *id, uint8_t **ret_data, size_t *ret_len,
                               struct ci_error *err)
{
    *ret_data = NULL;
    *ret_len = 0;
    if (natsMsg_IsNoResponders(m))
        return ci_error_set(err, CI_ERR_NATS, "cannot read the results bucket: JetStream did "
                            "not answer (no responders)");
    json_auto_t *j = json_loadb(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), 0, NULL);
    json_t *e = json_object_get(j, "error"), *msg = json_object_get(j, "message");
    if (json_is_object(e)) {
        json_int_t code = json_integer_value(json_object_get(e, "err_code"));
        if (code == JSNoMessageFoundErr)
            return ci_error_set(err, CI_ERR_NOT_FOUND, "no result for task '%s'", id);
        const char *d = json_string_value(json_object_get(e, "description"));
        return ci_error_set(err, CI_ERR_NATS, "cannot read the results bucket: %s (JetStream "
                            "error %" JSON_INTEGER_FORMAT ")", d ? d : "?", code);
    }
    if (!json_is_object(msg))
        return ci_error_set(err, CI_ERR_NATS, "cannot read the results bucket: an answer that "
                            "is not the stream API's");
    /* A deleted or purged record is a marker with the KV-Operation header. */
    const char *hdrs = json_string_value(json_object_get(msg, "hdrs"));
    if (hdrs) {
        CI_AUTOFREE uint8_t *h = NULL;
        size_t hlen = 0;
        if (ci_base64_decode(hdrs, strlen(hdrs), CI_B64_STD, &h, &hlen))
            return ci_error_set(err, CI_ERR_NATS, "cannot read the results bucket: headers "
                                "that are not base64");
        for (size_t at = 0; at < hlen;) {
            const uint8_t *nl = memchr(h + at, '\n', hlen - at);
            size_t n = nl ? (size_t)(nl - (h + at)) : hlen - at;
            const char *line = (const char *)h + at, *key = "KV-Operation:";
            size_t klen = strlen(key);
            if (n > klen && strncasecmp(line, key, klen) == 0) {
                size_t v = klen;
                while (v < n && line[v] == ' ')
                    v++;
                if ((n - v >= 3 && strncmp(line + v, "DEL", 3) == 0) ||
                    (n - v >= 5 && strncmp(line + v, "PURGE", 5) == 0))
                    return ci_error_set(err, CI_ERR_NOT_FOUND, "no result for task '%s'", id);
            }
            at += n + 1;
        }
    }
    const char *data = json_string_value(json_object_get(msg, "data"));
    if (!data)
        return CI_OK; /* an empty record */
    ci_status s = ci_base64_decode(data, strlen(data), CI_B64_STD, ret_data, ret_len);
    if (s == CI_ERR_NOMEM)
        return ci_error_set(err, s, "out of memory");
    if (s)
        return ci_error_set(err, CI_ERR_NATS, "cannot read the results bucket: a record that "
                            "is not base64");
    return CI_OK;
}

/* ci_broker_results_get_many's lookups: requests on api, answered on
 * sub as <inbox>.<i>. */
static ci_status results_lookups(struct ci_broker *b, natsSubscription *sub, const char *inbox,
                                 const char *api, const char (*ids)[65], size_t n,
                                 size_t window, ci_result_each_fn fn, void *closure,
                                 struct ci_error *err)
{
    const char *bucket = b->cfg->jetstream.results_bucket;
    natsStatus ns = NATS_OK;
    int k = 0;
    ci_status r = CI_OK;
    size_t sent = 0, in_flight = 0;
    bool more = true;
    while (!r && (in_flight || (more && sent < n))) {
        for (; more && sent < n && in_flight < window; sent++, in_flight++) {
            char subj[SUBJECT_MAX], reply[SUBJECT_MAX], body[SUBJECT_MAX + 32];
            snprintf(reply, sizeof(reply), "%s.%zu", inbox, sent);
            k = snprintf(subj, sizeof(subj), "$KV.%s.%s", bucket, ids[sent]);
            if (k < 0 || (size_t)k >= sizeof(subj))
                return ci_error_set(err, CI_ERR_INVALID, "task id too long for a results key");
            k = snprintf(body, sizeof(body), "{\"last_by_subj\":\"%s\"}", subj);
            ns = natsConnection_PublishRequest(b->nc, api, reply, body, k);
            if (ns != NATS_OK)
                return ci_nats_fail(err, ns, 0, "cannot read the results bucket");
        }
        if (!in_flight)
            break;
        CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
        ns = natsSubscription_NextMsg(&m, sub, JS_API_WAIT_MS);
        if (ns == NATS_TIMEOUT)
            return ci_error_set(err, CI_ERR_TIMEOUT, "cannot read the results bucket: %zu "
                                "lookups were not answered within %d ms", in_flight,
                                JS_API_WAIT_MS);
        if (ns != NATS_OK)
            return ci_nats_fail(err, ns, 0, "cannot read the results bucket");
        const char *dot = strrchr(natsMsg_GetSubject(m), '.');
        char *end = NULL;
        unsigned long long i = dot ? strtoull(dot + 1, &end, 10) : 0;
        if (!dot || !end || *end || i >= sent)
            continue; /* not an answer of ours */
        in_flight--;
        CI_AUTOFREE uint8_t *data = NULL;
        size_t len = 0;
        struct ci_error e = {{0}};
        ci_status got = lookup_answer(m, ids[i], &data, &len, &e);
        if (got && got != CI_ERR_NOT_FOUND)
            r = ci_error_set(err, got, "%s", e.msg); else if (!fn(closure, (size_t)i, got, data, len)) {
            more = false; /* the requests in flight are still answered */
        }
    }
    return r;
}

ci_status ci_broker_results_get_many(struct ci_broker *b, const char (*ids)[65], size_t n,
                                     size_t window, ci_result_each_fn fn, void *closure,
                                     struct ci_error *err)
{
    if (n == 0)
        return CI_OK;
    if (window == 0)
        window = 1;
    const char *bucket = b->cfg->jetstream.results_bucket;
    char api[SUBJECT_MAX], wildcard[SUBJECT_MAX];
    int k = snprintf(api, sizeof(api), "$JS.API.STREAM.MSG.GET.KV_%s", bucket);
    if (k < 0 || (size_t)k >= sizeof(api))
        return ci_error_set(err, CI_ERR_INVALID, "results bucket name too long");
    CI_CLEANUP(natsInbox_Destroy) natsInbox *inbox = NULL;
    natsSubscription *sub = NULL;
    natsStatus ns = natsInbox_Create(&inbox);
    if (ns == NATS_OK) {
        snprintf(wildcard, sizeof(wildcard), "%s.*", (const char *)inbox);
        ns = natsConnection_SubscribeSync(&sub, b->nc, wildcard);
    }
    /* The window bounds what waits here; a record may be a few MiB. */
    if (ns == NATS_OK)
        ns = natsSubscription_SetPendingLimits(sub, (int)window + 16, -1);
    if (ns != NATS_OK) {
        natsSubscription_Destroy(sub); /* nothing was asked on it */
        return ci_nats_fail(err, ns, 0, "cannot read the results bucket");
    }
    ci_status r = results_lookups(b, sub, (const char *)inbox, api, ids, n, window, fn,
                                  closure, err);
    /* It may return with lookups in flight: their answers may be in the
     * read loop's hands. */
    release_sub(b, sub);
    return r;
}

ci_status ci_broker_event_publish(struct ci_broker *b, const char *task_id,
                                  const char *status_short, const char *content_type,
                                  const char *msg_id, const void *data, size_t len,
                                  struct ci_error *err)
{
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.%s", b->cfg->jetstream.status_prefix, task_id);
    CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
    natsStatus s = natsMsg_Create(&m, subj, NULL, data, (int)len);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Ci-Task-Id", task_id);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Ci-Status", status_short);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Content-Type", content_type);
    if (s == NATS_OK && msg_id)
        s = natsMsgHeader_Set(m, "Nats-Msg-Id", msg_id);
    jsErrCode jerr = 0;
    CI_CLEANUP(jsPubAck_Destroy) jsPubAck *pa = NULL;
    if (s == NATS_OK)
        s = js_PublishMsg(&pa, b->js, m, NULL, &jerr);
    if (s != NATS_OK && recover(b, ci_nats_gone(s, jerr))) {
        jerr = 0;
        jsPubAck_Destroy(pa);
        pa = NULL;
        s = js_PublishMsg(&pa, b->js, m, NULL, &jerr);
    }
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot publish the status event");
    return CI_OK;
}

ci_status ci_broker_output_publish(struct ci_broker *b, const char *task_id, const char *stream,
                                   uint32_t attempt, uint64_t seq, const void *data, size_t len,
                                   struct ci_error *err)
{
    /* Not into the reconnect buffer: while the connection is down it is
     * kept for what matters (acks, results), and a chunk too late to be
     * live is worth little. A client sees the gap and takes the result. */
    if (natsConnection_Status(b->nc) != NATS_CONN_STATUS_CONNECTED)
        return ci_error_set(err, CI_ERR_NATS, "not connected to NATS: the output chunk is dropped");
    char subj[SUBJECT_MAX], a[16], q[24];
    snprintf(subj, sizeof(subj), "%s.%s.%s", b->cfg->jetstream.output_prefix, task_id, stream);
    snprintf(a, sizeof(a), "%" PRIu32, attempt);
    snprintf(q, sizeof(q), "%" PRIu64, seq);
    CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
    natsStatus s = natsMsg_Create(&m, subj, NULL, data, (int)len);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Ci-Task-Id", task_id);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Ci-Attempt", a);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Ci-Seq", q);
    if (s == NATS_OK)
        s = natsConnection_PublishMsg(b->nc, m);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, 0, "cannot publish the output chunk");
    return CI_OK;
}

ci_status ci_broker_event_last_status(struct ci_broker *b, const char *task_id, char *ret,
                                      size_t ret_size, struct ci_error *err)
{
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.%s", b->cfg->jetstream.status_prefix, task_id);
    CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetLastMsg(&m, b->js, b->cfg->jetstream.status_stream, subj, NULL, &jerr);
    /* Not JSStreamNotFoundErr: a missing stream says nothing of the task. */
    if (jerr == JSNoMessageFoundErr || (s == NATS_NOT_FOUND && jerr == 0))
        return ci_error_set(err, CI_ERR_NOT_FOUND, "task '%s' has no status event", task_id);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot read the status stream");
    const char *v = NULL;
    if (natsMsgHeader_Get(m, "Ci-Status", &v) != NATS_OK || !v)
        v = "";
    snprintf(ret, ret_size, "%s", v);
    return CI_OK;
}

ci_status ci_broker_cancel_requested(struct ci_broker *b, const char *task_id, bool *ret,
                                     struct ci_error *err)
{
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.%s", b->cfg->jetstream.cancel_prefix, task_id);
    CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetLastMsg(&m, b->js, b->cfg->jetstream.cancel_stream, subj, NULL, &jerr);
    if (s != NATS_OK && jerr == JSStreamNotFoundErr)
        recover(b, true); /* no cancel can be read from a deleted stream: none */
    if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr || jerr == JSStreamNotFoundErr) {
        *ret = false;
        return CI_OK;
    }
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot read the cancel stream");
    *ret = true;
    return CI_OK;
}

ci_status ci_broker_cancel_publish(struct ci_broker *b, const char *task_id,
                                   struct ci_error *err)
{
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.%s", b->cfg->jetstream.cancel_prefix, task_id);
    jsErrCode jerr = 0;
    CI_CLEANUP(jsPubAck_Destroy) jsPubAck *pa = NULL;
    natsStatus s = js_Publish(&pa, b->js, subj, NULL, 0, NULL, &jerr);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot publish the cancel request");
    return CI_OK;
}

static void on_cancel_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    struct ci_broker *b = closure;
    const char *subj = natsMsg_GetSubject(msg);
    size_t plen = strlen(b->cfg->jetstream.cancel_prefix);
    if (strncmp(subj, b->cfg->jetstream.cancel_prefix, plen) == 0 && subj[plen] == '.')
        b->cancel_fn(subj + plen + 1, b->cancel_closure);
    natsMsg_Destroy(msg);
}

ci_status ci_broker_on_cancel(struct ci_broker *b, ci_cancel_fn fn, void *closure,
                              struct ci_error *err)
{
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.*", b->cfg->jetstream.cancel_prefix);
    b->cancel_fn = fn;
    b->cancel_closure = closure;
    return subscribe_handler(b, subj, NULL, on_cancel_msg, &b->cancel_done, &b->cancel_sub,
                             "cancel requests", err);
}

/* --- the fleet --- */

/* A lane as the server sees it: its stream's messages and its consumer's
 * counts. */
static ci_status lane_stats(struct ci_broker *b, const char *stream, const char *consumer,
                            struct ci_queue_stats *ret, struct ci_error *err)
{
    jsErrCode jerr = 0;
    CI_CLEANUP(jsStreamInfo_Destroy) jsStreamInfo *si = NULL;
    natsStatus s = js_GetStreamInfo(&si, b->js, stream, NULL, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr)
        return ci_error_set(err, CI_ERR_NOT_FOUND, "stream %s not found", stream);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot read the state of stream %s", stream);
    CI_CLEANUP(jsConsumerInfo_Destroy) jsConsumerInfo *ci = NULL;
    jerr = 0;
    s = js_GetConsumerInfo(&ci, b->js, stream, consumer, NULL, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr)
        return ci_error_set(err, CI_ERR_NOT_FOUND, "consumer %s of stream %s not found",
                            consumer, stream);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot read the state of consumer %s", consumer);
    struct ci_queue_stats q = {
        .stream_msgs = si->State.Msgs,
        .pending = ci->NumPending,
        .ack_pending = ci->NumAckPending > 0 ? (uint64_t)ci->NumAckPending : 0,
        .redelivered = ci->NumRedelivered > 0 ? (uint64_t)ci->NumRedelivered : 0,
        .waiting = ci->NumWaiting > 0 ? (uint64_t)ci->NumWaiting : 0,
    };
    *ret = q;
    return CI_OK;
}

ci_status ci_broker_queue_stats(struct ci_broker *b, struct ci_queue_stats *ret,
                                struct ci_error *err)
{
    return lane_stats(b, b->cfg->jetstream.tasks_stream, b->cfg->jetstream.consumer, ret, err);
}

ci_status ci_broker_batch_queue_stats(struct ci_broker *b, struct ci_queue_stats *ret,
                                      struct ci_error *err)
{
    return lane_stats(b, b->cfg->jetstream.batch_stream, b->cfg->jetstream.batch_consumer, ret,
                      err);
}

ci_status ci_broker_workers_open(struct ci_broker *b, bool create, uint32_t ttl_s,
                                 struct ci_error *err)
{
    const struct ci_config *c = b->cfg;
    if (b->workers_kv)
        return CI_OK;
    natsStatus s = js_KeyValue(&b->workers_kv, b->js, c->jetstream.workers_bucket);
    if (s == NATS_OK)
        return CI_OK;
    if (!create)
        return ci_error_set(err, CI_ERR_NOT_FOUND,
                            "heartbeat bucket %s not found (no worker with heartbeats has run)",
                            c->jetstream.workers_bucket);
    kvConfig kc;
    kvConfig_Init(&kc);
    kc.Bucket = c->jetstream.workers_bucket;
    kc.Description = "ci worker heartbeats";
    kc.History = 1;
    kc.TTL = (int64_t)ttl_s * NS_PER_S;
    kc.StorageType = js_MemoryStorage; /* a heartbeat is worth nothing after a restart */
    kc.Replicas = (int)c->jetstream.replicas;
    s = js_CreateKeyValue(&b->workers_kv, b->js, &kc);
    if (s != NATS_OK) /* another worker made it a moment ago */
        s = js_KeyValue(&b->workers_kv, b->js, c->jetstream.workers_bucket);
    if (s != NATS_OK) {
        char what[160];
        snprintf(what, sizeof(what), "cannot create heartbeat bucket %s",
                 c->jetstream.workers_bucket);
        return ci_nats_fail(err, s, 0, "%s", what);
    }
    return CI_OK;
}

ci_status ci_broker_worker_put(struct ci_broker *b, const char *worker_id, const void *data,
                               size_t len, struct ci_error *err)
{
    if (!b->workers_kv)
        return ci_error_set(err, CI_ERR_INVALID, "the heartbeat bucket is not open");
    uint64_t rev = 0;
    natsStatus s = kvStore_Put(&rev, b->workers_kv, worker_id, data, (int)len);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, 0, "cannot write the heartbeat");
    return CI_OK;
}

ci_status ci_broker_worker_delete(struct ci_broker *b, const char *worker_id,
                                  struct ci_error *err)
{
    if (!b->workers_kv)
        return ci_error_set(err, CI_ERR_INVALID, "the heartbeat bucket is not open");
    natsStatus s = kvStore_Delete(b->workers_kv, worker_id);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, 0, "cannot delete the heartbeat");
    return CI_OK;
}

/* Calls fn for each live entry of kv, at most max of them; written_ms is
 * when the server stored it. what names the listing in errors. */
static ci_status kv_list(kvStore *kv, size_t max, ci_worker_entry_fn fn, void *closure,
                         const char *what, struct ci_error *err)
{
    CI_CLEANUP(kvKeysList_Destroy) kvKeysList keys = {0};
    natsStatus s = kvStore_Keys(&keys, kv, NULL);
    if (s == NATS_NOT_FOUND)
        return CI_OK; /* no entry */
    if (s != NATS_OK)
        return ci_nats_fail(err, s, 0, "cannot list %s", what);
    for (int i = 0; i < keys.Count && (size_t)i < max; i++) {
        CI_CLEANUP(kvEntry_Destroy) kvEntry *e = NULL;
        if (kvStore_Get(&e, kv, keys.Keys[i]) != NATS_OK)
            continue; /* expired or deleted between the listing and now */
        int n = kvEntry_ValueLen(e);
        fn(closure, keys.Keys[i], (const uint8_t *)kvEntry_Value(e), n > 0 ? (size_t)n : 0,
           kvEntry_Created(e) / NS_PER_MS);
    }
    return CI_OK;
}

ci_status ci_broker_workers_list(struct ci_broker *b, size_t max, ci_worker_entry_fn fn,
                                 void *closure, struct ci_error *err)
{
    if (!b->workers_kv)
        return ci_error_set(err, CI_ERR_INVALID, "the heartbeat bucket is not open");
    return kv_list(b->workers_kv, max, fn, closure, "the heartbeats", err);
}

/* --- sessions --- */

/* A session id is a subject token and a key: [A-Za-z0-9_-]{1,64} (contract
 * §16). Checked here too, so that no id can reach another subject ('.',
 * '*', '>') whatever the caller checked. */
static bool session_id_ok(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n > 64)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = id[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                  ch == '_' || ch == '-';
        if (!ok)
            return false;
    }
    return true;
}

/* <submit_subject>.<session_id> into out. */
static ci_status session_subject(struct ci_broker *b, const char *session_id, char *out,
                                 size_t n, struct ci_error *err)
{
    if (!session_id_ok(session_id))
        return ci_error_set(err, CI_ERR_INVALID,
                            "session id '%.80s' is not 1 to 64 of A-Z a-z 0-9 _ -",
                            session_id ? session_id : "");
    int k = snprintf(out, n, "%s.%s", b->cfg->jetstream.submit_subject, session_id);
    if (k < 0 || (size_t)k >= n)
        return ci_error_set(err, CI_ERR_INVALID, "session subject too long");
    return CI_OK;
}

/* The direct get answers with the stored message and its place in headers
 * (Nats-Stream, Nats-Sequence, Nats-Time-Stamp, Nats-Subject), any server
 * of the stream's peers answering; "next by subject from sequence 1" is the
 * oldest message on the subject, and a WorkQueue stream has removed every
 * acked one. A 404 ("no message") comes back as NATS_NOT_FOUND. */
ci_status ci_broker_session_first_seq(struct ci_broker *b, const char *session_id,
                                      uint64_t *ret_seq, struct ci_error *err)
{
    char subj[SUBJECT_MAX];
    ci_status r = session_subject(b, session_id, subj, sizeof(subj), err);
    if (r)
        return r;
    jsDirectGetMsgOptions o;
    jsDirectGetMsgOptions_Init(&o);
    o.Sequence = 1;
    o.NextBySubject = subj;
    CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
    natsStatus s = js_DirectGetMsg(&m, b->js, b->cfg->jetstream.tasks_stream, NULL, &o);
    if (s == NATS_NOT_FOUND)
        return ci_error_set(err, CI_ERR_NOT_FOUND, "no task of session '%s' in %s", session_id,
                            b->cfg->jetstream.tasks_stream);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, 0, "cannot look up the first task of session '%s'",
                            session_id);
    const char *v = NULL;
    uint64_t seq = 0;
    if (natsMsgHeader_Get(m, "Nats-Sequence", &v) == NATS_OK && v) {
        char *end = NULL;
        errno = 0;
        unsigned long long x = strtoull(v, &end, 10);
        if (errno == 0 && end != v && *end == '\0')
            seq = (uint64_t)x;
    }
    if (!seq)
        seq = natsMsg_GetSequence(m); /* nats.c reads the same header */
    if (!seq)
        return ci_error_set(err, CI_ERR_NATS,
                            "the direct get of session '%s' came without a sequence", session_id);
    *ret_seq = seq;
    return CI_OK;
}

/* The sessions bucket's handle; binds now if a worker made the bucket since
 * setup. NULL when it does not exist. */
static kvStore *sessions_kv(struct ci_broker *b)
{
    pthread_mutex_lock(&b->sessions_lock);
    if (!b->sessions_kv &&
        js_KeyValue(&b->sessions_kv, b->js, b->cfg->jetstream.sessions_bucket) != NATS_OK)
        b->sessions_kv = NULL;
    kvStore *kv = b->sessions_kv;
    pthread_mutex_unlock(&b->sessions_lock);
    return kv;
}

static ci_status no_sessions_bucket(struct ci_broker *b, struct ci_error *err)
{
    return ci_error_set(err, CI_ERR_NOT_FOUND,
                        "sessions bucket %s not found (no worker with sessions has run)",
                        b->cfg->jetstream.sessions_bucket);
}

/* $KV.<bucket>.<session_id>, and the bucket's stream name. */
static ci_status session_key(struct ci_broker *b, const char *session_id, char *subj, size_t n,
                             char *stream, size_t sn, struct ci_error *err)
{
    if (!session_id_ok(session_id))
        return ci_error_set(err, CI_ERR_INVALID,
                            "session id '%.80s' is not 1 to 64 of A-Z a-z 0-9 _ -",
                            session_id ? session_id : "");
    const char *bucket = b->cfg->jetstream.sessions_bucket;
    int k1 = snprintf(subj, n, "$KV.%s.%s", bucket, session_id);
    int k2 = snprintf(stream, sn, "KV_%s", bucket);
    if (k1 < 0 || (size_t)k1 >= n || k2 < 0 || (size_t)k2 >= sn)
        return ci_error_set(err, CI_ERR_INVALID, "session key too long");
    return CI_OK;
}

/* From the stream's leader, as ci_broker_result_get and for the same
 * reason: the revision feeds a compare-and-set, and a replica catching up
 * could show an old one. */
ci_status ci_broker_session_get(struct ci_broker *b, const char *session_id, uint8_t **ret_data,
                                size_t *ret_len, uint64_t *ret_rev, struct ci_error *err)
{
    char subj[SUBJECT_MAX], stream[SUBJECT_MAX];
    ci_status r = session_key(b, session_id, subj, sizeof(subj), stream, sizeof(stream), err);
    if (r)
        return r;
    if (!sessions_kv(b))
        return no_sessions_bucket(b, err);
    CI_CLEANUP(natsMsg_Destroy) natsMsg *msg = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetLastMsg(&msg, b->js, stream, subj, NULL, &jerr);
    if (s != NATS_OK && jerr == JSStreamNotFoundErr) {
        recover(b, true); /* a worker makes it again; the record is gone either way */
        return ci_error_set(err, CI_ERR_NOT_FOUND, "no record of session '%s' (the bucket %s "
                            "is gone)", session_id, b->cfg->jetstream.sessions_bucket);
    }
    if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
        return ci_error_set(err, CI_ERR_NOT_FOUND, "no record of session '%s'", session_id);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot read the sessions bucket");
    uint64_t rev = natsMsg_GetSequence(msg);
    const char *op = NULL;
    if (natsMsgHeader_Get(msg, "KV-Operation", &op) == NATS_OK && op &&
        (strcmp(op, "DEL") == 0 || strcmp(op, "PURGE") == 0)) {
        if (ret_rev) /* a deleted record has a revision too: the next swap checks it */
            *ret_rev = rev;
        return ci_error_set(err, CI_ERR_NOT_FOUND, "no record of session '%s'", session_id);
    }
    int n = natsMsg_GetDataLength(msg);
    uint8_t *copy = malloc((size_t)n + 1);
    if (!copy)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    if (n > 0)
        memcpy(copy, natsMsg_GetData(msg), (size_t)n);
    copy[n] = '\0';
    *ret_data = copy;
    *ret_len = (size_t)n;
    if (ret_rev)
        *ret_rev = rev;
    return CI_OK;
}

ci_status ci_broker_session_swap(struct ci_broker *b, const char *session_id, const void *data,
                                 size_t len, uint64_t rev, uint64_t *ret_rev,
                                 struct ci_error *err)
{
    char subj[SUBJECT_MAX], stream[SUBJECT_MAX];
    ci_status r = session_key(b, session_id, subj, sizeof(subj), stream, sizeof(stream), err);
    if (r)
        return r;
    if (!sessions_kv(b))
        return no_sessions_bucket(b, err);
    jsPubOptions po;
    jsPubOptions_Init(&po);
    if (rev)
        po.ExpectLastSubjectSeq = rev;
    else
        po.ExpectNoMessage = true;
    CI_CLEANUP(jsPubAck_Destroy) jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_Publish(&pa, b->js, subj, data, (int)len, &po, &jerr);
    if (s != NATS_OK && recover(b, ci_nats_gone(s, jerr))) {
        /* The bucket was deleted, the record with it: rev cannot be right
         * any more. The caller reads again and decides. */
        return ci_error_set(err, CI_ERR_CONFLICT,
                            "the sessions bucket was deleted and made again: session '%s' "
                            "has no record now", session_id);
    }
    if (s != NATS_OK && jerr == JSStreamWrongLastSequenceErr)
        return ci_error_set(err, CI_ERR_CONFLICT,
                            "the record of session '%s' changed since revision %" PRIu64,
                            session_id, rev);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot write the session record");
    if (ret_rev)
        *ret_rev = pa ? pa->Sequence : 0;
    return CI_OK;
}

ci_status ci_broker_session_put(struct ci_broker *b, const char *session_id, const void *data,
                                size_t len, struct ci_error *err)
{
    char subj[SUBJECT_MAX], stream[SUBJECT_MAX];
    ci_status r = session_key(b, session_id, subj, sizeof(subj), stream, sizeof(stream), err);
    if (r)
        return r;
    if (!sessions_kv(b))
        return no_sessions_bucket(b, err);
    jsPubOptions po;
    jsPubOptions_Init(&po);
    CI_CLEANUP(jsPubAck_Destroy) jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_Publish(&pa, b->js, subj, data, (int)len, &po, &jerr);
    if (s != NATS_OK && recover(b, ci_nats_gone(s, jerr))) {
        jerr = 0;
        jsPubAck_Destroy(pa);
        pa = NULL;
        s = js_Publish(&pa, b->js, subj, data, (int)len, &po, &jerr);
    }
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot write the session record");
    return CI_OK;
}

ci_status ci_broker_sessions_list(struct ci_broker *b, size_t max, ci_worker_entry_fn fn,
                                  void *closure, struct ci_error *err)
{
    kvStore *kv = sessions_kv(b);
    if (!kv)
        return no_sessions_bucket(b, err);
    return kv_list(kv, max, fn, closure, "the sessions", err);
}

/* --- runtime manifests --- */

/* A runtime name is a KV key of ours: 1 to 64 of A-Z a-z 0-9 _ - . with no
 * dot at either end or twice in a row (the server's rule for keys, which
 * are subject tokens joined by dots). */
static bool runtime_name_ok(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (n == 0 || n > 64 || name[0] == '.' || name[n - 1] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = name[i];
        bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') ||
                  (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.';
        if (!ok || (ch == '.' && name[i + 1] == '.'))
            return false;
    }
    return true;
}

static kvStore *runtimes_kv(struct ci_broker *b)
{
    pthread_mutex_lock(&b->sessions_lock);
    if (!b->runtimes_kv &&
        js_KeyValue(&b->runtimes_kv, b->js, b->cfg->jetstream.runtimes_bucket) != NATS_OK)
        b->runtimes_kv = NULL;
    kvStore *kv = b->runtimes_kv;
    pthread_mutex_unlock(&b->sessions_lock);
    return kv;
}

static ci_status no_runtimes_bucket(struct ci_broker *b, struct ci_error *err)
{
    return ci_error_set(err, CI_ERR_NOT_FOUND,
                        "runtimes bucket %s not found (no worker that publishes its runtime "
                        "has run)", b->cfg->jetstream.runtimes_bucket);
}

ci_status ci_broker_runtime_put(struct ci_broker *b, const char *runtime, const void *data,
                                size_t len, struct ci_error *err)
{
    if (!runtime_name_ok(runtime))
        return ci_error_set(err, CI_ERR_INVALID, "runtime name '%.80s' is not a valid key",
                            runtime ? runtime : "");
    const char *bucket = b->cfg->jetstream.runtimes_bucket;
    kvStore *kv = runtimes_kv(b);
    if (!kv)
        return no_runtimes_bucket(b, err);
    uint64_t rev = 0;
    natsStatus s = kvStore_Put(&rev, kv, runtime, data, (int)len);
    if (s != NATS_OK && b->may_create && ci_nats_gone(s, 0)) {
        /* An operator deleted the bucket: a worker makes it again (not part
         * of recover(): a missing manifest does not make a worker unready). */
        struct ci_error e = {{0}};
        if (!recreate_bucket(b, bucket, "ci runtime manifests", &e))
            s = kvStore_Put(&rev, kv, runtime, data, (int)len);
    }
    if (s != NATS_OK)
        return ci_nats_fail(err, s, 0, "cannot write the manifest of runtime '%s' to %s",
                            runtime, bucket);
    return CI_OK;
}

ci_status ci_broker_runtime_get(struct ci_broker *b, const char *runtime, uint8_t **ret_data,
                                size_t *ret_len, struct ci_error *err)
{
    if (!runtime_name_ok(runtime))
        return ci_error_set(err, CI_ERR_INVALID, "runtime name '%.80s' is not a valid key",
                            runtime ? runtime : "");
    kvStore *kv = runtimes_kv(b);
    if (!kv)
        return no_runtimes_bucket(b, err);
    CI_CLEANUP(kvEntry_Destroy) kvEntry *e = NULL;
    natsStatus s = kvStore_Get(&e, kv, runtime);
    if (s == NATS_NOT_FOUND)
        return ci_error_set(err, CI_ERR_NOT_FOUND,
                            "no manifest of runtime '%s' (no worker published one within %" PRIu32
                            " s)", runtime, b->cfg->jetstream.max_age_s);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, 0, "cannot read the runtimes bucket");
    int n = kvEntry_ValueLen(e);
    uint8_t *copy = malloc(n > 0 ? (size_t)n + 1 : 1);
    if (!copy)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    if (n > 0)
        memcpy(copy, kvEntry_Value(e), (size_t)n);
    copy[n > 0 ? n : 0] = '\0';
    *ret_data = copy;
    *ret_len = n > 0 ? (size_t)n : 0;
    return CI_OK;
}

ci_status ci_broker_runtimes_list(struct ci_broker *b, size_t max, ci_worker_entry_fn fn,
                                  void *closure, struct ci_error *err)
{
    kvStore *kv = runtimes_kv(b);
    if (!kv)
        return no_runtimes_bucket(b, err);
    return kv_list(kv, max, fn, closure, "the runtimes", err);
}

/* --- batches (docs/contract.md §20) --- */

/* A batch id is a subject token, as a session id (contract §20). */
static bool batch_id_ok(const char *id) { return session_id_ok(id); }

/* <batch_events_prefix>.<batch_id>.<event> (event "*" for all of them). */
static ci_status batch_event_subject(struct ci_broker *b, const char *batch_id, const char *event,
                                     char *out, size_t n, struct ci_error *err)
{
    if (!batch_id_ok(batch_id))
        return ci_error_set(err, CI_ERR_INVALID,
                            "batch id '%.80s' is not 1 to 64 of A-Z a-z 0-9 _ -",
                            batch_id ? batch_id : "");
    int k = snprintf(out, n, "%s.%s.%s", b->cfg->jetstream.batch_events_prefix, batch_id, event);
    if (k < 0 || (size_t)k >= n)
        return ci_error_set(err, CI_ERR_INVALID, "batch event subject too long");
    return CI_OK;
}

ci_status ci_broker_batch_publish(struct ci_broker *b, const char *batch_id, const char *event,
                                  const char *msg_id, const char *content_type, const void *data,
                                  size_t len, bool *ret_duplicate, struct ci_error *err)
{
    char subj[SUBJECT_MAX];
    ci_status r = batch_event_subject(b, batch_id, event, subj, sizeof(subj), err);
    if (r)
        return r;
    CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
    natsStatus s = natsMsg_Create(&m, subj, NULL, data, (int)len);
    if (s == NATS_OK && msg_id)
        s = natsMsgHeader_Set(m, "Nats-Msg-Id", msg_id);
    if (s == NATS_OK && content_type)
        s = natsMsgHeader_Set(m, "Content-Type", content_type);
    jsErrCode jerr = 0;
    CI_CLEANUP(jsPubAck_Destroy) jsPubAck *pa = NULL;
    if (s == NATS_OK)
        s = js_PublishMsg(&pa, b->js, m, NULL, &jerr);
    if (s != NATS_OK && recover(b, ci_nats_gone(s, jerr))) {
        jerr = 0;
        jsPubAck_Destroy(pa);
        pa = NULL;
        s = js_PublishMsg(&pa, b->js, m, NULL, &jerr);
    }
    /* A client (which makes no streams) is told the stream is missing, so
     * that it can say which worker to start. */
    if (s != NATS_OK && ci_nats_gone(s, jerr) &&
        stream_missing(b, b->cfg->jetstream.batch_events_stream))
        return ci_error_set(err, CI_ERR_NOT_FOUND, "stream %s not found",
                            b->cfg->jetstream.batch_events_stream);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot publish the %s event of batch '%s'", event,
                            batch_id);
    if (ret_duplicate)
        *ret_duplicate = pa && pa->Duplicate;
    return CI_OK;
}

/* The message count of every subject of the stream under filter, through
 * fn. A stream info with subjects_filter (nats-server 2.9 answers it with
 * state.subjects: subject -> count). */
static ci_status subject_counts(struct ci_broker *b, const char *stream, const char *filter,
                                void (*fn)(void *closure, const char *subject, uint64_t n),
                                void *closure, struct ci_error *err)
{
    jsOptions o;
    jsOptions_Init(&o);
    o.Stream.Info.SubjectsFilter = filter;
    CI_CLEANUP(jsStreamInfo_Destroy) jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetStreamInfo(&si, b->js, stream, &o, &jerr);
    if (s != NATS_OK && recover(b, ci_nats_gone(s, jerr) || s == NATS_NOT_FOUND)) {
        jerr = 0;
        s = js_GetStreamInfo(&si, b->js, stream, &o, &jerr);
    }
    if (s == NATS_NOT_FOUND || jerr == JSStreamNotFoundErr)
        return ci_error_set(err, CI_ERR_NOT_FOUND, "stream %s not found", stream);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot read the subjects of stream %s", stream);
    const jsStreamStateSubjects *list = si->State.Subjects;
    for (int i = 0; list && i < list->Count; i++)
        fn(closure, list->List[i].Subject, list->List[i].Msgs);
    return CI_OK;
}

struct counts_ctx {
    size_t prefix_len; /* of "<prefix>.<batch_id>." */
    struct ci_batch_counts *c;
};

static void count_event(void *closure, const char *subject, uint64_t n)
{
    struct counts_ctx *x = closure;
    if (strlen(subject) <= x->prefix_len)
        return;
    /* By name, not ci_batch_event_parse: ci_nats does not link ci_codec. */
    const char *ev = subject + x->prefix_len;
    struct ci_batch_counts *c = x->c;
    uint64_t *slot = strcmp(ev, "taken") == 0       ? &c->taken
                     : strcmp(ev, "succeeded") == 0 ? &c->succeeded
                     : strcmp(ev, "failed") == 0    ? &c->failed
                     : strcmp(ev, "timed_out") == 0 ? &c->timed_out
                     : strcmp(ev, "cancelled") == 0 ? &c->cancelled
                     : strcmp(ev, "sealed") == 0    ? &c->sealed
                     : strcmp(ev, "complete") == 0  ? &c->complete
                     : strcmp(ev, "cancel") == 0    ? &c->cancel
                                                    : NULL;
    if (slot)
        *slot = n;
}

ci_status ci_broker_batch_counts(struct ci_broker *b, const char *batch_id,
                                 struct ci_batch_counts *ret, struct ci_error *err)
{
    char filter[SUBJECT_MAX];
    ci_status r = batch_event_subject(b, batch_id, "*", filter, sizeof(filter), err);
    if (r)
        return r;
    struct ci_batch_counts c;
    memset(&c, 0, sizeof(c));
    struct counts_ctx x = {.prefix_len = strlen(filter) - 1, .c = &c};
    r = subject_counts(b, b->cfg->jetstream.batch_events_stream, filter, count_event, &x, err);
    if (r)
        return r;
    *ret = c;
    return CI_OK;
}

static void count_one(void *closure, const char *subject, uint64_t n)
{
    *(uint64_t *)closure += n;
}

ci_status ci_broker_batch_queued(struct ci_broker *b, const char *batch_id, uint64_t *ret,
                                 struct ci_error *err)
{
    if (!batch_id_ok(batch_id))
        return ci_error_set(err, CI_ERR_INVALID,
                            "batch id '%.80s' is not 1 to 64 of A-Z a-z 0-9 _ -",
                            batch_id ? batch_id : "");
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.%s", b->cfg->jetstream.batch_subject, batch_id);
    uint64_t n = 0;
    ci_status r = subject_counts(b, b->cfg->jetstream.batch_stream, subj, count_one, &n, err);
    if (!r)
        *ret = n;
    return r;
}

/* From the stream's leader (a stream "get last message" request), not with
 * a direct get: a direct get may be answered by a replica that lags, which
 * can say "none" for a cancel stored a moment ago, and a task of a
 * cancelled batch taken right after it would run (contract §20). The same
 * read as ci_broker_cancel_requested's for a task's own cancel. */
ci_status ci_broker_batch_last(struct ci_broker *b, const char *batch_id, const char *event,
                               uint8_t **ret_data, size_t *ret_len, struct ci_error *err)
{
    int64_t stored_ms = 0;
    return ci_broker_batch_last_at(b, batch_id, event, ret_data, ret_len, &stored_ms, err);
}

ci_status ci_broker_batch_last_at(struct ci_broker *b, const char *batch_id, const char *event,
                                  uint8_t **ret_data, size_t *ret_len, int64_t *ret_stored_ms,
                                  struct ci_error *err)
{
    char subj[SUBJECT_MAX];
    ci_status r = batch_event_subject(b, batch_id, event, subj, sizeof(subj), err);
    if (r)
        return r;
    CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
    const char *stream = b->cfg->jetstream.batch_events_stream;
    jsErrCode jerr = 0;
    natsStatus s = js_GetLastMsg(&m, b->js, stream, subj, NULL, &jerr);
    if (s != NATS_OK && jerr == JSStreamNotFoundErr && recover(b, true))
        return ci_error_set(err, CI_ERR_NOT_FOUND,
                            "no %s event for batch '%s' (stream %s had been deleted)", event,
                            batch_id, stream);
    if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
        return ci_error_set(err, CI_ERR_NOT_FOUND, "no %s event for batch '%s'", event, batch_id);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot read the %s event of batch '%s'", event,
                            batch_id);
    int n = natsMsg_GetDataLength(m);
    uint8_t *copy = malloc(n > 0 ? (size_t)n + 1 : 1);
    if (!copy)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    if (n > 0)
        memcpy(copy, natsMsg_GetData(m), (size_t)n);
    copy[n > 0 ? n : 0] = '\0';
    *ret_data = copy;
    *ret_len = n > 0 ? (size_t)n : 0;
    *ret_stored_ms = natsMsg_GetTime(m) / 1000000;
    return CI_OK;
}

/* The ordered consumer replays the stream from its first message on the
 * filter; each delivery says how many are left behind it (NumPending), so
 * the read ends at the message that had none left, without waiting for a
 * timeout. An empty filter would never deliver: it is counted first. */
/* Whether stream holds a message on filter at sequence seq or later (a
 * message get with next_by_subj, answered by the stream's leader). */
static ci_status stored_from(struct ci_broker *b, const char *stream, const char *filter,
                             uint64_t seq, bool *ret_any, struct ci_error *err)
{
    char api[SUBJECT_MAX], body[SUBJECT_MAX + 64];
    snprintf(api, sizeof(api), "$JS.API.STREAM.MSG.GET.%s", stream);
    int n = snprintf(body, sizeof(body), "{\"seq\":%" PRIu64 ",\"next_by_subj\":\"%s\"}", seq,
                     filter);
    CI_CLEANUP(natsMsg_Destroy) natsMsg *reply = NULL;
    natsStatus s = natsConnection_Request(&reply, b->nc, api, body, n, JS_API_WAIT_MS);
    if (s == NATS_OK && natsMsg_IsNoResponders(reply))
        s = NATS_NO_RESPONDERS;
    if (s != NATS_OK)
        return ci_nats_fail(err, s, 0, "cannot read stream %s", stream);
    json_auto_t *j =
        json_loadb(natsMsg_GetData(reply), (size_t)natsMsg_GetDataLength(reply), 0, NULL);
    json_t *e = json_object_get(j, "error");
    json_int_t code = json_integer_value(json_object_get(e, "err_code"));
    if (json_is_object(json_object_get(j, "message")) || code == JSNoMessageFoundErr) {
        *ret_any = !json_is_object(e);
        return CI_OK;
    }
    const char *d = json_string_value(json_object_get(e, "description"));
    return ci_error_set(err, CI_ERR_NATS, "cannot read stream %s: %s (JetStream error %"
                        JSON_INTEGER_FORMAT ")", stream, d ? d : "an answer that is not the "
                        "stream API's", code);
}

/* ci_broker_batch_read's reading, from sub (an ordered consumer on filter
 * of stream). */
static ci_status batch_read_from(struct ci_broker *b, natsSubscription *sub, const char *stream,
                                 const char *filter, size_t max, ci_batch_msg_fn fn,
                                 void *closure, size_t *ret_read, bool *ret_cut,
                                 struct ci_error *err)
{
    ci_status r = CI_OK;
    natsStatus s = NATS_OK;
    size_t seen = 0;
    uint64_t last_seq = 0; /* of the last message read */
    int64_t quiet_since = ci_mono_ms();
    for (;;) {
        CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
        s = natsSubscription_NextMsg(&m, sub, 1000);
        if (s == NATS_TIMEOUT) {
            /* The server counts a message that expires (max_age), or is
             * deleted, after the consumer was made into its pending count
             * still (nats-server 2.9): the count never reaches 0 then. The
             * read is done when nothing is stored past what it read. */
            bool more = true;
            r = stored_from(b, stream, filter, last_seq + 1, &more, err);
            if (r || !more)
                return r;
            if (ci_mono_ms() - quiet_since < 10000)
                continue;
            return ci_error_set(err, CI_ERR_TIMEOUT,
                                "reading %s from stream %s: nothing came for 10 s after %zu "
                                "messages", filter, stream, seen);
        }
        if (s != NATS_OK)
            return ci_nats_fail(err, s, 0, "cannot read %s from stream %s", filter, stream);
        quiet_since = ci_mono_ms();
        CI_CLEANUP(jsMsgMetaData_Destroy) jsMsgMetaData *md = NULL;
        uint64_t left = 0;
        if (natsMsg_GetMetaData(&md, m) == NATS_OK) {
            left = md->NumPending;
            last_seq = md->Sequence.Stream;
        }
        seen++;
        if (ret_read)
            *ret_read = seen;
        bool go_on = fn(closure, natsMsg_GetSubject(m), (const uint8_t *)natsMsg_GetData(m),
                        (size_t)natsMsg_GetDataLength(m));
        if (left == 0)
            return CI_OK;
        if (!go_on || seen >= max) {
            if (ret_cut)
                *ret_cut = true;
            return CI_OK;
        }
    }
}

ci_status ci_broker_batch_read(struct ci_broker *b, const char *batch_id, const char *event,
                               size_t max, ci_batch_msg_fn fn, void *closure, size_t *ret_read,
                               bool *ret_cut, struct ci_error *err)
{
    if (ret_read)
        *ret_read = 0;
    if (ret_cut)
        *ret_cut = false;
    char filter[SUBJECT_MAX];
    ci_status r = batch_event_subject(b, batch_id, event, filter, sizeof(filter), err);
    if (r)
        return r;
    const char *stream = b->cfg->jetstream.batch_events_stream;
    uint64_t stored = 0;
    r = subject_counts(b, stream, filter, count_one, &stored, err);
    if (!r && ret_cut)
        *ret_cut = stored > 0 && max == 0;
    if (r || stored == 0 || max == 0)
        return r;
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Ordered = true;
    jsErrCode jerr = 0;
    natsSubscription *sub = NULL;
    natsStatus s = js_SubscribeSync(&sub, b->js, filter, NULL, &so, &jerr);
    /* The server's flow control bounds what it sends ahead in bytes (32
     * MiB); a batch's events are small, more of them than the library's
     * default of 65,536 messages: a reader that fell behind lost them
     * ("slow consumer"). Bounded in bytes only. */
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(sub, -1, 64 * 1024 * 1024);
    if (s != NATS_OK) {
        r = ci_nats_fail(err, s, jerr, "cannot read %s from stream %s", filter, stream);
        release_sub(b, sub);
        return r;
    }
    r = batch_read_from(b, sub, stream, filter, max, fn, closure, ret_read, ret_cut, err);
    /* It may stop before the last message: those after it keep coming,
     * one may be in the read loop's hands. */
    release_sub(b, sub);
    return r;
}

/* The batch id of <prefix>.<batch_id>.<event>, or false. */
static bool batch_event_id(const struct ci_broker *b, const char *subj, const char *event,
                           char batch_id[65])
{
    const char *prefix = b->cfg->jetstream.batch_events_prefix;
    size_t plen = strlen(prefix);
    if (!subj || strncmp(subj, prefix, plen) != 0 || subj[plen] != '.')
        return false;
    const char *id = subj + plen + 1;
    const char *dot = strchr(id, '.');
    if (!dot || dot - id <= 0 || dot - id >= 65 || strcmp(dot + 1, event) != 0)
        return false;
    snprintf(batch_id, 65, "%.*s", (int)(dot - id), id);
    return batch_id_ok(batch_id);
}

static void on_batch_cancel_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg,
                                void *closure)
{
    struct ci_broker *b = closure;
    char batch_id[65];
    if (batch_event_id(b, natsMsg_GetSubject(msg), "cancel", batch_id))
        b->batch_cancel_fn(batch_id, b->batch_cancel_closure);
    natsMsg_Destroy(msg);
}

static void on_batch_sealed_msg(natsConnection *nc, natsSubscription *sub, natsMsg *msg,
                                void *closure)
{
    struct ci_broker *b = closure;
    char batch_id[65];
    if (batch_event_id(b, natsMsg_GetSubject(msg), "sealed", batch_id))
        b->batch_sealed_fn(batch_id, natsMsg_GetData(msg), (size_t)natsMsg_GetDataLength(msg),
                           b->batch_sealed_closure);
    natsMsg_Destroy(msg);
}

ci_status ci_broker_on_batch_sealed(struct ci_broker *b, ci_batch_sealed_fn fn, void *closure,
                                    struct ci_error *err)
{
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.*.sealed", b->cfg->jetstream.batch_events_prefix);
    b->batch_sealed_fn = fn;
    b->batch_sealed_closure = closure;
    /* One worker of the deployment looks at each seal. */
    return subscribe_handler(b, subj, b->cfg->jetstream.batch_consumer, on_batch_sealed_msg,
                             &b->batch_sealed_done, &b->batch_sealed_sub, "batch seals", err);
}

ci_status ci_broker_on_batch_cancel(struct ci_broker *b, ci_cancel_fn fn, void *closure,
                                    struct ci_error *err)
{
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.*.cancel", b->cfg->jetstream.batch_events_prefix);
    b->batch_cancel_fn = fn;
    b->batch_cancel_closure = closure;
    return subscribe_handler(b, subj, NULL, on_batch_cancel_msg, &b->batch_cancel_done,
                             &b->batch_cancel_sub, "batch cancels", err);
}

/* --- clients --- */

static ci_status submit_on(struct ci_broker *b, const char *subject, const char *task_id,
                           const char *content_type, const void *data, size_t len,
                           bool *ret_duplicate, uint64_t *ret_seq, struct ci_error *err)
{
    CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
    natsStatus s = natsMsg_Create(&m, subject, NULL, data, (int)len);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Nats-Msg-Id", task_id);
    if (s == NATS_OK)
        s = natsMsgHeader_Set(m, "Content-Type", content_type);
    jsErrCode jerr = 0;
    CI_CLEANUP(jsPubAck_Destroy) jsPubAck *pa = NULL;
    if (s == NATS_OK)
        s = js_PublishMsg(&pa, b->js, m, NULL, &jerr);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot submit the task");
    if (ret_duplicate)
        *ret_duplicate = pa->Duplicate;
    if (ret_seq)
        *ret_seq = pa->Sequence;
    return CI_OK;
}

ci_status ci_broker_submit(struct ci_broker *b, const char *task_id, const char *content_type,
                           const void *data, size_t len, bool *ret_duplicate,
                           struct ci_error *err)
{
    return submit_on(b, b->cfg->jetstream.submit_subject, task_id, content_type, data, len,
                     ret_duplicate, NULL, err);
}

/* A batch task that the batch stream dropped as a copy: the message it
 * kept under that Nats-Msg-Id (at the PubAck's sequence, read from the
 * stream's leader) on another batch's subject is another batch's task,
 * queued or running, whose id this one would take over (contract §20):
 * CI_ERR_CONFLICT. One on subject, or none any more (taken and acked),
 * is for the caller to judge. */
static ci_status batch_copy_check(struct ci_broker *b, const char *subject, const char *task_id,
                                  uint64_t seq, struct ci_error *err)
{
    const char *stream = b->cfg->jetstream.batch_stream;
    CI_CLEANUP(natsMsg_Destroy) natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetMsg(&m, b->js, stream, seq, NULL, &jerr);
    if (s == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
        return CI_OK;
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "task '%s' was dropped as a copy of message %" PRIu64
                            " of stream %s, which cannot be read", task_id, seq, stream);
    const char *kept = natsMsg_GetSubject(m);
    if (!kept || strcmp(kept, subject) == 0)
        return CI_OK;
    /* <batch_subject>.<other batch> */
    size_t plen = strlen(b->cfg->jetstream.batch_subject);
    const char *other = strncmp(kept, b->cfg->jetstream.batch_subject, plen) == 0 &&
                                kept[plen] == '.'
                            ? kept + plen + 1
                            : NULL;
    char whose[128];
    if (other && batch_id_ok(other))
        snprintf(whose, sizeof(whose), "a task of batch '%s'", other);
    else
        snprintf(whose, sizeof(whose), "a message on '%.80s'", kept);
    return ci_error_set(err, CI_ERR_CONFLICT,
                        "task id '%s' is in use: %s, queued or running, has it (%s dropped this "
                        "task as a copy of its message %" PRIu64 " on '%.80s')",
                        task_id, whose, stream, seq, kept);
}

ci_status ci_broker_submit_batch(struct ci_broker *b, const char *batch_id, const char *task_id,
                                 const char *content_type, const void *data, size_t len,
                                 bool *ret_duplicate, struct ci_error *err)
{
    if (!batch_id_ok(batch_id))
        return ci_error_set(err, CI_ERR_INVALID,
                            "batch id '%.80s' is not 1 to 64 of A-Z a-z 0-9 _ -",
                            batch_id ? batch_id : "");
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.%s", b->cfg->jetstream.batch_subject, batch_id);
    bool dup = false;
    uint64_t seq = 0;
    ci_status r = submit_on(b, subj, task_id, content_type, data, len, &dup, &seq, err);
    if (!r && dup)
        r = batch_copy_check(b, subj, task_id, seq, err);
    if (!r && ret_duplicate)
        *ret_duplicate = dup;
    return r;
}

ci_status ci_broker_submit_session(struct ci_broker *b, const char *session_id,
                                   const char *task_id, const char *content_type,
                                   const void *data, size_t len, bool *ret_duplicate,
                                   struct ci_error *err)
{
    char subj[SUBJECT_MAX];
    ci_status r = session_subject(b, session_id, subj, sizeof(subj), err);
    if (r)
        return r;
    return submit_on(b, subj, task_id, content_type, data, len, ret_duplicate, NULL, err);
}

ci_status ci_watch_new(struct ci_broker *b, const char *task_id, struct ci_watch **ret,
                       struct ci_error *err)
{
    CI_AUTOFREE struct ci_watch *w = calloc(1, sizeof(*w));
    if (!w)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    w->b = b;
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.%s", b->cfg->jetstream.status_prefix, task_id);
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = b->cfg->jetstream.status_stream;
    so.Ordered = true; /* replays every event of the task, then follows */
    jsErrCode jerr = 0;
    natsStatus s = js_SubscribeSync(&w->sub, b->js, subj, NULL, &so, &jerr);
    if (s != NATS_OK)
        return ci_nats_fail(err, s, jerr, "cannot watch the task's status events");
    *ret = CI_STEAL(&w);
    return CI_OK;
}

ci_status ci_watch_next(struct ci_watch *w, int timeout_ms, const uint8_t **ret_data,
                        size_t *ret_len, const char **ret_content_type, struct ci_error *err)
{
    natsMsg_Destroy(w->cur);
    w->cur = NULL;
    natsStatus s = natsSubscription_NextMsg(&w->cur, w->sub, timeout_ms);
    if (s == NATS_TIMEOUT) {
        return CI_ERR_TIMEOUT;
    }
    if (s != NATS_OK)
        return ci_nats_fail(err, s, 0, "status events");
    const char *ct = NULL;
    if (natsMsgHeader_Get(w->cur, "Content-Type", &ct) != NATS_OK) {
        ct = NULL;
    }
    *ret_data = (const uint8_t *)natsMsg_GetData(w->cur);
    *ret_len = (size_t)natsMsg_GetDataLength(w->cur);
    *ret_content_type = ct;
    return CI_OK;
}

void ci_watch_free(struct ci_watch *w)
{
    if (!w)
        return;
    natsMsg_Destroy(w->cur);
    release_sub(w->b, w->sub); /* it follows live: the next event may be on its way */
    free(w);
}

struct ci_output_follow {
    struct ci_broker *b;
    natsSubscription *sub;
    ci_output_fn fn;
    void *closure;
    pthread_mutex_t lock;
    pthread_cond_t done_cond;
    bool done; /* the library said the handler has returned for good */
};

static uint64_t header_u64(natsMsg *m, const char *name)
{
    const char *v = NULL;
    if (natsMsgHeader_Get(m, name, &v) != NATS_OK || !v || !*v)
        return 0;
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    return errno || *end || v[0] == '-' ? 0 : (uint64_t)n;
}

static void on_output_msg(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *closure)
{
    struct ci_output_follow *f = closure;
    const char *subj = natsMsg_GetSubject(m);
    const char *last = subj ? strrchr(subj, '.') : NULL;
    if (last && (strcmp(last + 1, "stdout") == 0 || strcmp(last + 1, "stderr") == 0)) {
        uint64_t attempt = header_u64(m, "Ci-Attempt");
        f->fn(f->closure, last + 1, attempt > UINT32_MAX ? 0 : (uint32_t)attempt,
              header_u64(m, "Ci-Seq"), (const uint8_t *)natsMsg_GetData(m),
              (size_t)natsMsg_GetDataLength(m));
    }
    natsMsg_Destroy(m);
}

static void on_output_done(void *closure)
{
    struct ci_output_follow *f = closure;
    pthread_mutex_lock(&f->lock);
    f->done = true;
    pthread_cond_signal(&f->done_cond);
    pthread_mutex_unlock(&f->lock);
}

ci_status ci_output_follow_new(struct ci_broker *b, const char *task_id, ci_output_fn fn,
                               void *closure, struct ci_output_follow **ret,
                               struct ci_error *err)
{
    struct ci_output_follow *f = calloc(1, sizeof(*f));
    if (!f)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    f->b = b;
    f->fn = fn;
    f->closure = closure;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->done_cond, NULL);
    char subj[SUBJECT_MAX];
    snprintf(subj, sizeof(subj), "%s.%s.>", b->cfg->jetstream.output_prefix, task_id);
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = b->cfg->jetstream.output_stream;
    so.Ordered = true; /* from the first chunk, in order, then live */
    jsErrCode jerr = 0;
    natsStatus s = js_Subscribe(&f->sub, b->js, subj, on_output_msg, f, NULL, &so, &jerr);
    if (s == NATS_OK)
        s = natsSubscription_SetOnCompleteCB(f->sub, on_output_done, f);
    if (s != NATS_OK) {
        bool missing = jerr == JSStreamNotFoundErr || s == NATS_NOT_FOUND;
        ci_status r = missing ? ci_error_set(err, CI_ERR_NOT_FOUND,
                                             "there is no live output stream '%s'",
                                             b->cfg->jetstream.output_stream)
                              : ci_nats_fail(err, s, jerr, "cannot follow the task's output");
        release_sub(b, f->sub);
        pthread_cond_destroy(&f->done_cond);
        pthread_mutex_destroy(&f->lock);
        free(f);
        return r;
    }
    *ret = f;
    return CI_OK;
}

bool ci_output_follow_free(struct ci_output_follow *f)
{
    if (!f)
        return true;
    /* The handler may be running: wait until the library says it has
     * returned for good, also when Unsubscribe failed (it closes the
     * subscription first, then deletes the consumer, which may fail while
     * the delivery thread still runs). 5 s at most, and then f is left
     * behind rather than freed under the handler. */
    natsSubscription_Unsubscribe(f->sub);
    bool done = false;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    pthread_mutex_lock(&f->lock);
    while (!done && !f->done)
        if (pthread_cond_timedwait(&f->done_cond, &f->lock, &until) == ETIMEDOUT)
            break;
    done = done || f->done;
    pthread_mutex_unlock(&f->lock);
    /* The handler is done, but the read loop may hold the next chunk
     * (Unsubscribe's deletion of the consumer waits for an answer handed
     * over after it, unless that fails). */
    release_sub(f->b, f->sub);
    if (!done)
        return false; /* leaked on purpose: the handler could still use it */
    pthread_cond_destroy(&f->done_cond);
    pthread_mutex_destroy(&f->lock);
    free(f);
    return true;
}
