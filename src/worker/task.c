/* task.c - one task from the work queue to its terminal result (task.h):
 * the result and events it writes, inputs, artifacts, cancel, and the
 * choice between ack, retry and giving up. */
#include "worker/task.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/batch.h"
#include "core/codec.h"
#include "core/log.h"
#include "core/request.h"
#include "core/result.h"
#include "core/util.h"
#include "nats/objstore.h"
#include "core/session.h"
#include "worker/batchmemo.h"
#include "worker/liveout.h"
#include "worker/publisher.h"
#include "worker/sealwait.h"

/* Room kept in a KV value or event for headers and framing. */
#define PAYLOAD_SLACK 8192
#define MIB (1024.0 * 1024.0)

/* Everything one task accumulates; released in one place. */
struct task {
    const struct ci_worker_env *env;
    struct ci_slot *slot;
    struct ci_delivery *d;
    enum ci_encoding enc;
    char id[65];
    bool bad_body_id; /* the body's task_id is not an id: id is the Nats-Msg-Id */
    Ci__V1__ExecutionRequest *req; /* NULL when the body did not decode */
    struct ci_file *files;
    size_t n_files;
    int64_t started_at_ms;
    /* For the audit line and the metrics (task_ended). */
    int64_t taken_mono_ms;
    int64_t queue_wait_ms;   /* -1 when the message carried no timestamp */
    uint64_t input_bytes;    /* inline and object inputs read */
    uint64_t artifact_bytes; /* artifacts stored */
    bool running_stored;     /* this attempt wrote the RUNNING record */
    /* The result record's revision as this attempt last read or wrote it.
     * Every write checks it: an attempt that a later one overtook (its
     * worker was stopped past the ack wait) cannot overwrite the newer
     * record - it is superseded, and says so. */
    uint64_t rev;
    bool final_started;      /* this attempt began to store its terminal result */
    bool final_stored;       /* ... and stored it (its event may still have failed) */
    /* A session step (docs/contract.md §16). */
    bool turn_checked;            /* the caller held it until its turn came */
    struct ci_task_wait *wait;    /* filled when it must wait for its turn */
    uint64_t seq;                 /* its sequence in the tasks stream */
    bool sess_read;               /* the record was read: the result says what became of it */
    bool sess_have_rec;
    struct ci_session_record rec; /* as read (sess_have_rec) */
    uint64_t sess_rev;            /* its revision; 0: none */
    struct ci_session_plan plan;
    uint8_t *state;               /* the state to restore; NULL: none */
    size_t state_len;
    char state_note[400];         /* why the previous state could not be had, or "" */
    /* The attempt's live output (§19): made into chunks on the thread that
     * waits for the run (live), published from a thread of its own (pub),
     * so that a NATS that blocks never holds up the run's time limit or
     * cancel. Both NULL: none. */
    struct ci_liveout *live;
    struct ci_publisher *pub;
    int64_t live_until; /* the deadline the run's last chunks got (ci_mono_ms), 0: none yet */
    uint32_t attempt;             /* for pub's thread, which does not touch d */
    atomic_bool live_dropped;     /* a chunk was lost, and said so (on either thread) */
    /* A batch's task (docs/contract.md §20): the batch whose events count
     * it, or "" (batch_choose). */
    char batch[65];
    bool batch_held; /* the memo counts it among the tasks of its batch slots hold */
    /* When it passed its stages (ci_now_us(), 0: not reached): the
     * task.stages line (log_stages). */
    struct {
        int64_t taken, checked, running, inputs, started, waited, artifacts, stored, event,
            acked, released;
        struct ci_run_marks run; /* the sandbox's, from the outcome */
    } at;
};

/* The live output's counts go to the metrics when the attempt is done
 * with it. Its publisher stops here: what it still holds is dropped, and
 * told why (the first one lost is logged), and the publish under way ends
 * first. An attempt that stored its result has drained it already. */
static void live_release(struct task *t, const char *why)
{
    if (!t->pub)
        return;
    ci_liveout_free(t->live);
    t->live = NULL;
    ci_publisher_stop(t->pub, why);
    struct ci_publisher_stats st;
    ci_publisher_stats(t->pub, &st);
    ci_metrics_output_chunks(t->env->metrics, st.published, st.refused + st.failed + st.left);
    ci_publisher_free(t->pub);
    t->pub = NULL;
}

static void batch_given_up(struct task *t);

static void task_release(struct task *t)
{
    batch_given_up(t);
    live_release(t, "the attempt ended without storing its result: its last chunks are dropped");
    free(t->state);
    ci_message_free(t->req ? &t->req->base : NULL);
    for (size_t i = 0; i < t->n_files; i++) {
        free(t->files[i].name);
        free(t->files[i].data);
    }
    free(t->files);
}

/* The result being built, with the memory it points to. */
struct result {
    Ci__V1__ExecutionResult msg;
    Ci__V1__Usage usage;
    Ci__V1__Artifact *arts;
    Ci__V1__Artifact **art_ptrs;
    char **art_objects; /* n_art_objects of them, even when the list is dropped */
    size_t n_art_objects;
    Ci__V1__ExecutionResult__LabelsEntry *labels;
    Ci__V1__ExecutionResult__LabelsEntry **label_ptrs;
    struct ci_result_text text; /* output, error and hint the message points to */
    struct ci_objstore_undo undo; /* what this attempt stored of its artifacts */
    size_t n_stored;              /* artifacts it stored */
    Ci__V1__SessionInfo session;
    char **dropped;               /* session.dropped, owned here */
};

static void result_init(struct result *r, const struct task *t, Ci__V1__TaskStatus status)
{
    memset(r, 0, sizeof(*r));
    ci__v1__execution_result__init(&r->msg);
    ci__v1__usage__init(&r->usage);
    r->msg.task_id = (char *)t->id;
    r->msg.status = status;
    r->msg.worker = (char *)t->env->worker_id;
    r->msg.attempt = ci_delivery_attempt(t->d);
    r->msg.started_at_ms = t->started_at_ms;
    r->msg.runtime = (char *)CI_DEFAULT_RUNTIME;
    ci_result_text_init(&r->text, &r->msg);
    r->msg.stdout = (char *)"";
    r->msg.stderr = (char *)"";
    r->msg.isolation = (char *)"";
    /* A batch id that is not one is not echoed either (it may be MiBs). */
    if (t->req && t->req->batch_id && ci_task_id_valid(t->req->batch_id))
        r->msg.batch_id = t->req->batch_id;
    /* Labels that broke the rules are not echoed: a refused request may
     * carry megabytes of them, which its error only quotes the start of. */
    if (t->req && t->req->n_labels && ci_request_labels_ok(t->req)) {
        r->labels = calloc(t->req->n_labels, sizeof(*r->labels));
        r->label_ptrs = calloc(t->req->n_labels, sizeof(*r->label_ptrs));
        if (r->labels && r->label_ptrs) {
            for (size_t i = 0; i < t->req->n_labels; i++) {
                ci__v1__execution_result__labels_entry__init(&r->labels[i]);
                r->labels[i].key = t->req->labels[i]->key;
                r->labels[i].value = t->req->labels[i]->value;
                r->label_ptrs[i] = &r->labels[i];
            }
            r->msg.labels = r->label_ptrs;
            r->msg.n_labels = t->req->n_labels;
        }
    }
}

static void result_release(struct result *r)
{
    for (size_t i = 0; i < r->n_art_objects; i++)
        free(r->art_objects[i]);
    free(r->art_objects);
    free(r->arts);
    free(r->art_ptrs);
    free(r->labels);
    free(r->label_ptrs);
    for (size_t i = 0; i < r->session.n_dropped; i++)
        free(r->dropped[i]);
    free(r->dropped);
    ci_result_text_release(&r->text);
    ci_objstore_undo_release(&r->undo);
}

static void result_fail(struct result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void result_fail(struct result *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->text.error, sizeof(r->text.error), fmt, ap);
    va_end(ap);
}

/* Makes what is not stdout, stderr or the outputs fit in max bytes on its
 * own: echoed labels (a request refused for its labels may carry megabytes
 * of them) go first, then the list of artifacts (they stay in the bucket).
 * A result that cannot be stored would leave the task without an end. */
static ci_status fit_fixed_part(const struct task *t, struct result *r, int64_t max,
                                struct ci_error *err)
{
    for (;;) {
        char *out = r->msg.stdout, *errs = r->msg.stderr;
        size_t n_outputs = r->msg.n_outputs;
        r->msg.stdout = (char *)"";
        r->msg.stderr = (char *)"";
        r->msg.n_outputs = 0;
        uint8_t *buf = NULL;
        size_t len = 0;
        ci_status s = ci_message_encode(t->enc, &r->msg.base, &buf, &len, err);
        r->msg.stdout = out;
        r->msg.stderr = errs;
        r->msg.n_outputs = n_outputs;
        free(buf);
        if (s)
            return s;
        if ((int64_t)len <= max)
            return CI_OK;
        if (r->msg.n_labels) {
            r->msg.n_labels = 0;
        } else if (r->msg.n_artifacts) {
            size_t used = strlen(r->text.error);
            snprintf(r->text.error + used, sizeof(r->text.error) - used,
                     "%sthe %zu artifacts are too many to list in the result; they are in bucket '%s' under '%s/'",
                     used ? "; " : "", r->msg.n_artifacts, t->env->cfg->jetstream.files_bucket,
                     t->id);
            r->msg.n_artifacts = 0;
        } else {
            return ci_error_set(err, CI_ERR_LIMIT, "the result does not fit in %" PRId64 " bytes",
                                max);
        }
    }
}

/* Encodes the result so that it fits in one message: when the outputs,
 * stdout and stderr make it too large (JSON escaping can multiply their
 * size), the outputs go first, the last one first (outputs_truncated),
 * then stdout and stderr are cut further and marked truncated. */
static ci_status encode_result(const struct task *t, struct result *r, uint8_t **ret,
                               size_t *ret_len, struct ci_error *err)
{
    int64_t max = ci_broker_max_payload(t->env->broker) - PAYLOAD_SLACK;
    ci_status fs = fit_fixed_part(t, r, max, err);
    if (fs)
        return fs;
    for (;;) {
        uint8_t *buf = NULL;
        size_t len = 0;
        ci_status s = ci_message_encode(t->enc, &r->msg.base, &buf, &len, err);
        if (s)
            return s;
        if ((int64_t)len <= max) {
            *ret = buf;
            *ret_len = len;
            return CI_OK;
        }
        free(buf);
        if (r->msg.n_outputs) {
            r->msg.n_outputs--;
            r->msg.outputs_truncated = true;
            continue;
        }
        size_t olen = strlen(r->msg.stdout), elen = strlen(r->msg.stderr);
        if (olen == 0 && elen == 0)
            return ci_error_set(err, CI_ERR_LIMIT, "the result does not fit in %" PRId64 " bytes",
                                max);
        /* Halve the larger one, on a UTF-8 boundary. */
        char *big = olen >= elen ? r->msg.stdout : r->msg.stderr;
        size_t cut = (olen >= elen ? olen : elen) / 2;
        while (cut > 0 && ((unsigned char)big[cut] & 0xC0) == 0x80)
            cut--;
        big[cut] = '\0';
        if (olen >= elen)
            r->msg.stdout_truncated = true;
        else
            r->msg.stderr_truncated = true;
    }
}

/* Publishes the event of a transition. Its Nats-Msg-Id lets the stream
 * drop a second copy: one per attempt for RUNNING, one per task for the
 * terminal event, so a retried or repaired publish never makes two. */
static ci_status publish_event(const struct task *t, Ci__V1__TaskStatus status,
                               const char *message, const Ci__V1__ExecutionResult *res,
                               struct ci_error *err)
{
    Ci__V1__StatusEvent ev = CI__V1__STATUS_EVENT__INIT;
    ev.task_id = (char *)t->id;
    ev.status = status;
    ev.at_ms = ci_now_ms();
    ev.worker = (char *)(res && res->worker && res->worker[0] ? res->worker : t->env->worker_id);
    ev.message = (char *)(message ? message : "");
    if (res && res->_exit_code_case == CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE) {
        ev._exit_code_case = CI__V1__STATUS_EVENT___EXIT_CODE_EXIT_CODE;
        ev.exit_code = res->exit_code;
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    ci_status s = ci_message_encode(t->enc, &ev.base, &buf, &len, err);
    if (s)
        return s;
    char msg_id[96];
    if (ci_task_status_terminal(status))
        snprintf(msg_id, sizeof(msg_id), "%s.end", t->id);
    else
        snprintf(msg_id, sizeof(msg_id), "%s.%s.%u", t->id, ci_task_status_short(status),
                 ci_delivery_attempt(t->d));
    s = ci_broker_event_publish(t->env->broker, t->id, ci_task_status_short(status),
                                ci_encoding_content_type(t->enc), msg_id, buf, len, err);
    free(buf);
    return s;
}

/* Writes the result to KV, if the record is still as this attempt last
 * saw it, and publishes its event. CI_ERR_CONFLICT: a later attempt wrote
 * since; nothing was written or published. */
static ci_status store_result(struct task *t, struct result *r, struct ci_error *err)
{
    if (ci_task_status_terminal(r->msg.status))
        r->msg.finished_at_ms = ci_now_ms();
    uint8_t *buf = NULL;
    size_t len = 0;
    ci_status s = encode_result(t, r, &buf, &len, err);
    if (s)
        return s;
    /* The live output's last chunks: what this result keeps (as encoded,
     * cuts included) beyond what went out while the code ran. Out before
     * the record, so that a worker that dies after storing it has left
     * none behind; a redelivery then only repairs the event. A NATS that
     * does not take them holds the result CI_PUBLISHER_DRAIN_MS at most
     * (and the publish under way): what is still queued then is lost. The
     * run's own last chunks waited as long for room (live_run_ended). */
    if (t->live && ci_task_status_terminal(r->msg.status)) {
        if (!t->live_until) /* one wait in all, must_look_again's included */
            t->live_until = ci_mono_ms() + CI_PUBLISHER_DRAIN_MS;
        ci_publisher_end(t->pub, t->live_until);
        ci_liveout_finish(t->live, r->msg.stdout, r->msg.stderr);
        (void)ci_publisher_drain(t->pub); /* the lost ones were told */
    }
    s = ci_broker_result_swap(t->env->broker, t->id, buf, len, t->rev, &t->rev, err);
    free(buf);
    if (s)
        return s;
    bool terminal = ci_task_status_terminal(r->msg.status);
    if (terminal) {
        t->final_stored = true;
        t->at.stored = ci_now_us();
    }
    const char *msg = r->text.error[0] ? r->text.error : NULL;
    s = publish_event(t, r->msg.status, msg, &r->msg, err);
    if (!s && terminal)
        t->at.event = ci_now_us();
    return s;
}

/* The task's stored result, if it has one that decodes; t->rev becomes
 * its revision (0 when there is none). */
static Ci__V1__ExecutionResult *existing_result(struct task *t)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t rev = 0;
    ci_status s = ci_broker_result_get(t->env->broker, t->id, &buf, &len, &rev, NULL);
    if (s == CI_OK || s == CI_ERR_NOT_FOUND) /* not when unreadable: keep what we knew */
        t->rev = rev;
    if (s)
        return NULL;
    ProtobufCMessage *m = NULL;
    /* A client may have written the QUEUED record in the other encoding. */
    if (ci_message_decode(t->enc, &ci__v1__execution_result__descriptor, buf, len, &m, NULL) &&
        ci_message_decode(t->enc == CI_ENC_JSON ? CI_ENC_PROTOBUF : CI_ENC_JSON,
                          &ci__v1__execution_result__descriptor, buf, len, &m, NULL)) {
        free(buf);
        return NULL;
    }
    free(buf);
    return (Ci__V1__ExecutionResult *)m;
}

/* Stores a terminal result, trying again for a few seconds when NATS
 * fails: a reconnect in progress should not throw away a run (a nak would
 * run the code again). The event's Nats-Msg-Id keeps a retry from doubling
 * an event whose ack was lost. */
static ci_status store_final(struct task *t, struct result *r, struct ci_error *err)
{
    ci_status s = CI_OK;
    for (int i = 0; i < 4; i++) {
        if (i) {
            struct timespec ts = {(time_t)1 << (i - 1), 0}; /* 1, 2, 4 s */
            nanosleep(&ts, NULL);
        }
        s = store_result(t, r, err);
        if (s != CI_ERR_NATS && s != CI_ERR_TIMEOUT)
            return s;
    }
    return s;
}

/* What a write that found the record changed since this attempt looked
 * must do, by what the record is now. */
enum fence {
    FENCE_WRITE_AGAIN, /* gone, expired, QUEUED, or an earlier attempt's: write over it */
    FENCE_ENDED,       /* a terminal result is stored (maybe ours, its ack lost) */
    FENCE_SUPERSEDED,  /* a later attempt has it */
};

static enum fence after_conflict(struct task *t)
{
    Ci__V1__ExecutionResult *now = existing_result(t); /* t->rev: the record's now */
    if (!now)
        return FENCE_WRITE_AGAIN;
    uint32_t mine = ci_delivery_attempt(t->d);
    bool ours = now->worker && strcmp(now->worker, t->env->worker_id) == 0;
    enum fence f = ci_task_status_terminal(now->status)      ? FENCE_ENDED
                   : now->attempt > mine                      ? FENCE_SUPERSEDED
                   : now->attempt == mine && !ours && mine > 0 ? FENCE_SUPERSEDED
                                                              : FENCE_WRITE_AGAIN;
    ci_message_free(&now->base);
    return f;
}

/* store_result (or store_final, when final) fenced: a write that finds the
 * record changed looks at what it is now and writes again over a record
 * that is not a later attempt's - a deleted or expired one, the client's
 * QUEUED one, an earlier attempt's, or its own whose ack was lost.
 * CI_ERR_CONFLICT with *ret_fence ENDED or SUPERSEDED otherwise. */
static ci_status write_fenced(struct task *t, struct result *r, bool final,
                              enum fence *ret_fence, struct ci_error *err)
{
    *ret_fence = FENCE_WRITE_AGAIN;
    for (int i = 0; i < 4; i++) {
        ci_status s = final ? store_final(t, r, err) : store_result(t, r, err);
        if (s != CI_ERR_CONFLICT)
            return s;
        *ret_fence = after_conflict(t);
        if (*ret_fence != FENCE_WRITE_AGAIN)
            return s;
    }
    *ret_fence = FENCE_SUPERSEDED; /* the record keeps changing under us: others are at it */
    return CI_ERR_CONFLICT;
}

/* Whether an earlier attempt left the task RUNNING without a word: the
 * worker running it died (or lost NATS before it could say why). An
 * attempt that gave up on an infrastructure failure leaves its reason in
 * the record's error (note_retry), and did not die. */
static bool died_before(struct task *t)
{
    Ci__V1__ExecutionResult *m = existing_result(t);
    if (!m)
        return false;
    bool died = m->status == CI__V1__TASK_STATUS__TASK_STATUS_RUNNING && !(m->error && m->error[0]);
    ci_message_free(&m->base);
    return died;
}

/* A redelivered task that already ended: a worker may have stored the
 * result, then failed to publish its terminal event (and nak'ed). Publish
 * it now unless the last event is terminal, so that watchers see the end. */
static void ensure_terminal_event(const struct task *t, const Ci__V1__ExecutionResult *res)
{
    struct ci_error e = {{0}};
    char last[32];
    ci_status s = ci_broker_event_last_status(t->env->broker, t->id, last, sizeof(last), &e);
    if (s == CI_OK) {
        for (int st = CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED;
             st <= CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED; st++)
            if (strcmp(last, ci_task_status_short((Ci__V1__TaskStatus)st)) == 0)
                return;
    } else if (s != CI_ERR_NOT_FOUND) {
        ci_log(CI_LOG_WARN, "task.event_check_failed", "task_id", t->id, "error", e.msg, NULL);
        return;
    }
    if (publish_event(t, res->status, res->error, res, &e))
        ci_log(CI_LOG_WARN, "task.event_failed", "task_id", t->id, "error", e.msg, NULL);
    else
        ci_log(CI_LOG_INFO, "task.event_repaired", "task_id", t->id, "status",
               ci_task_status_short(res->status), NULL);
}

static void slot_set(struct ci_slot *slot, const char *id, struct ci_delivery *d)
{
    pthread_mutex_lock(&slot->lock);
    snprintf(slot->task_id, sizeof(slot->task_id), "%s", id ? id : "");
    slot->batch_id[0] = '\0';
    slot->delivery = d;
    slot->run = NULL;
    slot->cancel_requested = false;
    slot->batch_cancelled = false;
    slot->last_progress_ms = ci_mono_ms();
    pthread_mutex_unlock(&slot->lock);
}

/* Takes the message away from the in-progress ticker just before it is
 * acked, termed or nak'ed, so that no in-progress ack races with that on
 * the same natsMsg from another thread, or follows it. */
static void slot_detach(struct ci_slot *slot)
{
    pthread_mutex_lock(&slot->lock);
    slot->delivery = NULL;
    pthread_mutex_unlock(&slot->lock);
}

static bool slot_cancelled(struct ci_slot *slot)
{
    pthread_mutex_lock(&slot->lock);
    bool c = slot->cancel_requested;
    pthread_mutex_unlock(&slot->lock);
    return c;
}

void ci_slot_cancel(const struct ci_worker_env *env, struct ci_slot *slot, const char *task_id)
{
    pthread_mutex_lock(&slot->lock);
    if (slot->task_id[0] && strcmp(slot->task_id, task_id) == 0) {
        slot->cancel_requested = true;
        if (slot->run)
            ci_provider_cancel(env->provider, slot->run);
    }
    pthread_mutex_unlock(&slot->lock);
}

void ci_slot_cancel_batch(const struct ci_worker_env *env, struct ci_slot *slot,
                          const char *batch_id)
{
    pthread_mutex_lock(&slot->lock);
    if (slot->task_id[0] && slot->batch_id[0] && strcmp(slot->batch_id, batch_id) == 0) {
        slot->cancel_requested = true;
        slot->batch_cancelled = true;
        if (slot->run)
            ci_provider_cancel(env->provider, slot->run);
    }
    pthread_mutex_unlock(&slot->lock);
}

/* Why a task that was cancelled before it ran did not run. */
static const char *cancelled_before(struct ci_slot *slot)
{
    pthread_mutex_lock(&slot->lock);
    bool batch = slot->batch_cancelled;
    pthread_mutex_unlock(&slot->lock);
    return batch ? "the batch was cancelled before this task ran"
                 : "the task was cancelled before it ran";
}

/* Whether this attempt still holds the task: checked before each artifact
 * is stored, since object names are the task's and a later attempt's must
 * not be replaced. A record changed by an earlier attempt (or gone) is
 * still ours to write over; t->rev follows it. */
static enum fence still_ours(struct task *t)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t now = 0;
    ci_status s = ci_broker_result_get(t->env->broker, t->id, &buf, &len, &now, NULL);
    free(buf);
    if ((s != CI_OK && s != CI_ERR_NOT_FOUND) || now == t->rev)
        return FENCE_WRITE_AGAIN; /* unreadable: the result write will tell */
    return after_conflict(t);
}

/* Whether the record must be read again before the result is written:
 * when this attempt has artifacts to store (the last upload's window), ends
 * a session step (its state and record follow), or would still publish
 * live chunks that a later attempt's end must not precede: what finish()
 * adds at the write. Otherwise the fenced write itself finds a record that
 * changed: a read less per task (~0.5 ms, issue 16). What the run left in
 * the queue goes out here, first (it was going out meanwhile anyway: the
 * re-read before only cut its tail short when the task had been taken
 * over), within the wait the result grants it (live_until; finish() gets
 * a wait of its own when the record is read first). */
static bool must_look_again(struct task *t, const struct result *r, const struct ci_outcome *o)
{
    if (o->n_artifacts > 0 || t->sess_read)
        return true;
    if (!t->live)
        return false;
    t->live_until = ci_mono_ms() + CI_PUBLISHER_DRAIN_MS;
    ci_publisher_end(t->pub, t->live_until);
    (void)ci_publisher_drain(t->pub); /* what it dropped was told, and counts as sent */
    if (!ci_liveout_owes(t->live, r->msg.stdout, r->msg.stderr))
        return false;
    t->live_until = 0; /* the read may take a while: finish() gets a wait of its own */
    return true;
}

/* Fetches the inputs. A failure of the request's making fills r->text.error;
 * a NATS failure (CI_ERR_NATS, CI_ERR_TIMEOUT) fills err only: a later
 * try may succeed. */
static ci_status fetch_inputs(struct task *t, struct result *r, struct ci_error *err)
{
    const Ci__V1__ExecutionRequest *req = t->req;
    uint64_t cap = t->env->cfg->limits.max_input_bytes, total = 0;
    if (req->n_files == 0)
        return CI_OK;
    t->files = calloc(req->n_files, sizeof(*t->files));
    if (!t->files) {
        result_fail(r, "the worker ran out of memory while reading the inputs");
        return CI_ERR_NOMEM;
    }
    for (size_t i = 0; i < req->n_files; i++) {
        const Ci__V1__InputFile *f = req->files[i];
        struct ci_file *dst = &t->files[t->n_files];
        dst->name = strdup(f->name);
        if (!dst->name) {
            result_fail(r, "the worker ran out of memory while reading the inputs");
            return CI_ERR_NOMEM;
        }
        t->n_files++;
        if (f->source_case == CI__V1__INPUT_FILE__SOURCE_CONTENT) {
            total += f->content.len;
            dst->data = malloc(f->content.len ? f->content.len : 1);
            if (!dst->data) {
                result_fail(r, "the worker ran out of memory while reading the inputs");
                return CI_ERR_NOMEM;
            }
            if (f->content.len)
                memcpy(dst->data, f->content.data, f->content.len);
            dst->len = f->content.len;
            t->input_bytes += f->content.len;
            continue;
        }
        struct ci_error e = {{0}};
        size_t left = total < cap ? (size_t)(cap - total) : 0;
        ci_status s = ci_objstore_get(ci_broker_objstore(t->env->broker), f->object, left,
                                      &dst->data, &dst->len, &e);
        if (s == CI_ERR_NATS || s == CI_ERR_TIMEOUT) {
            *err = e;
            return s;
        }
        if (s == CI_ERR_NOT_FOUND) {
            result_fail(r, "input '%s' names object '%s', which is not in bucket '%s' (objects expire after %u s)",
                        f->name, f->object, t->env->cfg->jetstream.files_bucket,
                        t->env->cfg->jetstream.max_age_s);
            return s;
        }
        if (s == CI_ERR_LIMIT) {
            result_fail(r, "input files total more than %.1f MiB (the limit) with object '%s'",
                        cap / MIB, f->object);
            return s;
        }
        if (s) {
            result_fail(r, "cannot read input '%s' from object '%s': %s", f->name, f->object,
                        e.msg);
            return s;
        }
        total += dst->len;
        t->input_bytes += dst->len;
        ci_metrics_objstore_bytes(t->env->metrics, CI_METRICS_DOWNLOAD, dst->len);
    }
    return CI_OK;
}

static ci_status upload_artifacts(struct task *t, struct result *r, struct ci_outcome *o,
                                  struct ci_error *err)
{
    if (o->n_artifacts == 0)
        return CI_OK;
    r->arts = calloc(o->n_artifacts, sizeof(*r->arts));
    r->art_ptrs = calloc(o->n_artifacts, sizeof(*r->art_ptrs));
    r->art_objects = calloc(o->n_artifacts, sizeof(*r->art_objects));
    if (!r->arts || !r->art_ptrs || !r->art_objects)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    r->msg.artifacts = r->art_ptrs;
    size_t full = 0; /* artifacts the full store could not take */
    uint64_t full_bytes = 0;
    char full_why[256] = "";
    for (size_t i = 0; i < o->n_artifacts; i++) {
        struct ci_artifact *a = &o->artifacts[i];
        /* Object names are the task's: a later attempt's must not be
         * replaced by this one's (checked before each, the window is one
         * upload). */
        if (still_ours(t) != FENCE_WRITE_AGAIN)
            return ci_error_set(err, CI_ERR_CONFLICT, "the task was taken over or ended meanwhile");
        size_t n = strlen(t->id) + 1 + strlen(a->name) + 1;
        char *obj = malloc(n);
        if (!obj)
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        snprintf(obj, n, "%s/%s", t->id, a->name);
        r->art_objects[i] = obj;
        r->n_art_objects = i + 1;
        ci_status s = ci_objstore_put_undoable(ci_broker_objstore(t->env->broker), obj, a->data,
                                               a->len, &r->undo, err);
        if (s == CI_ERR_FULL) {
            full++;
            full_bytes += a->len;
            snprintf(full_why, sizeof(full_why), "%.250s", err->msg);
            continue;
        }
        if (s == CI_ERR_INVALID || s == CI_ERR_LIMIT) {
            /* This artifact can never be stored (e.g. a path longer than an
             * object name may be): say so and keep the others, rather than
             * retry, which would run the code again for the same end. */
            size_t used = strlen(r->text.error);
            snprintf(r->text.error + used, sizeof(r->text.error) - used, "%sartifact not kept: %s",
                     used ? "; " : "", err->msg);
            continue;
        }
        if (s)
            return s;
        t->artifact_bytes += a->len;
        r->n_stored++;
        ci_metrics_objstore_bytes(t->env->metrics, CI_METRICS_UPLOAD, a->len);
        size_t k = r->msg.n_artifacts; /* only entries that are filled in */
        Ci__V1__Artifact *pa = &r->arts[k];
        ci__v1__artifact__init(pa);
        pa->name = a->name;
        pa->mime_type = a->mime_type;
        pa->size = a->len;
        pa->sha256 = a->sha256;
        pa->object = obj;
        r->art_ptrs[k] = pa;
        r->msg.n_artifacts = k + 1;
    }
    /* An output whose image was an artifact not stored names nothing now. */
    for (size_t i = 0; i < r->msg.n_outputs; i++) {
        Ci__V1__Output *out = r->msg.outputs[i];
        if (!out->artifact || !out->artifact[0])
            continue;
        bool stored = false;
        for (size_t k = 0; k < r->msg.n_artifacts && !stored; k++)
            stored = strcmp(r->msg.artifacts[k]->name, out->artifact) == 0;
        if (!stored) {
            out->artifact = (char *)"";
            out->truncated = true;
        }
    }
    if (full) {
        /* What the code made is lost: the agent must not take it for a
         * success. Nothing else is retried: the store stays full until
         * objects expire. */
        r->msg.status = CI__V1__TASK_STATUS__TASK_STATUS_FAILED;
        char prev[CI_RESULT_TEXT_MAX];
        snprintf(prev, sizeof(prev), "%s", r->text.error);
        snprintf(r->text.error, sizeof(r->text.error),
                 "the object store is full: %zu artifact%s of %.1f MiB not kept (%.300s)%s%.400s",
                 full, full == 1 ? "" : "s", (double)full_bytes / MIB, full_why,
                 prev[0] ? "; " : "", prev);
    }
    return CI_OK;
}

/* Fills the result from what the provider reported. */
/* Log fields for at most this many label keys, each cut to this size. */
#define AUDIT_MAX_LABELS 64
#define AUDIT_KEY_BYTES 64

/* The audit line of a task's end, and its metrics. Metadata only: sizes,
 * digests, durations, label keys. Never the code, the output, the inputs,
 * label values or the error text, whose content the code or the caller
 * chose (an exception message can hold anything the code read). */
static void task_ended(const struct task *t, const struct result *r)
{
    const Ci__V1__ExecutionResult *m = &r->msg;
    double run_s = (double)(ci_mono_ms() - t->taken_mono_ms) / 1000.0;
    ci_metrics_task_end(t->env->metrics, ci_task_status_short(m->status), run_s);

    char sha[65] = "";
    size_t code_len = 0;
    if (t->req && t->req->code) {
        code_len = strlen(t->req->code);
        ci_sha256_hex(t->req->code, code_len, sha);
    }
    char *keys[AUDIT_MAX_LABELS];
    size_t n_keys = 0;
    for (size_t i = 0; t->req && i < t->req->n_labels && n_keys < AUDIT_MAX_LABELS; i++) {
        const char *k = t->req->labels[i] && t->req->labels[i]->key ? t->req->labels[i]->key : "";
        size_t n = strnlen(k, AUDIT_KEY_BYTES);
        while (n > 0 && k[n] && ((unsigned char)k[n] & 0xC0) == 0x80)
            n--; /* not inside a UTF-8 character */
        keys[n_keys] = ci_utf8_sanitize((const uint8_t *)k, n, NULL);
        if (keys[n_keys])
            n_keys++;
    }
    uint64_t art_bytes = 0;
    for (size_t i = 0; i < m->n_artifacts; i++)
        art_bytes += m->artifacts[i]->size;
    bool ran = m->_exit_code_case == CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE;
    const struct ci_log_field f[] = {
        CI_LOG_S("task_id", t->id),
        CI_LOG_S("status", ci_task_status_short(m->status)),
        CI_LOG_N("attempt", m->attempt),
        ran ? (struct ci_log_field)CI_LOG_N("exit_code", m->exit_code) : (struct ci_log_field){0},
        CI_LOG_S("encoding", t->enc == CI_ENC_JSON ? "json" : "protobuf"),
        CI_LOG_N("code_bytes", code_len),
        CI_LOG_S("code_sha256", sha),
        CI_LOG_N("input_files", t->req ? t->req->n_files : 0),
        CI_LOG_N("input_bytes", t->input_bytes),
        CI_LOG_N("stdout_bytes", m->stdout_total_bytes),
        CI_LOG_N("stderr_bytes", m->stderr_total_bytes),
        CI_LOG_B("output_truncated", m->stdout_truncated || m->stderr_truncated),
        CI_LOG_N("artifacts", m->n_artifacts),
        CI_LOG_N("artifact_bytes", art_bytes),
        CI_LOG_N("error_bytes", strlen(r->text.error)),
        CI_LOG_N("queue_wait_ms", t->queue_wait_ms),
        CI_LOG_N("run_ms", (int64_t)(run_s * 1000)),
        CI_LOG_N("code_ms", m->usage ? m->usage->duration_ms : 0),
        CI_LOG_N("cpu_ms", m->usage ? m->usage->cpu_ms : 0),
        CI_LOG_N("memory_mb", m->usage ? m->usage->memory_mb : 0),
        CI_LOG_S("isolation", m->isolation),
        CI_LOG_SV("label_keys", (const char *const *)keys, n_keys),
    };
    ci_log_fields(CI_LOG_INFO, "task.done", f, sizeof(f) / sizeof(f[0]));
    for (size_t i = 0; i < n_keys; i++)
        free(keys[i]);
}

/* Leaves why this attempt gives up in the RUNNING record's error (KV
 * only, best effort): a client sees it, and the next attempt knows that
 * this one did not die. */
static void note_retry(struct task *t, const struct result *r, const char *what,
                       const struct ci_error *e)
{
    struct result note;
    result_init(&note, t, CI__V1__TASK_STATUS__TASK_STATUS_RUNNING);
    note.msg.runtime = r->msg.runtime;
    snprintf(note.text.error, sizeof(note.text.error), "attempt %u: the worker could not %s (%s); it will be tried again",
             ci_delivery_attempt(t->d), what, e->msg);
    uint8_t *buf = NULL;
    size_t len = 0;
    struct ci_error ignored = {{0}};
    if (encode_result(t, &note, &buf, &len, &ignored) == CI_OK)
        ci_broker_result_swap(t->env->broker, t->id, buf, len, t->rev, &t->rev, &ignored);
    free(buf);
    result_release(&note);
}

/* A later attempt of the task wrote its record since this one last looked:
 * this attempt's result is dropped, never stored over the newer one, and
 * its message is left alone (the later attempt holds it; an ack or nak of
 * this stale copy could lose it or bring yet another delivery). */
static enum ci_task_end superseded(struct task *t, const struct result *r)
{
    const struct ci_log_field f[] = {
        CI_LOG_S("task_id", t->id),
        CI_LOG_N("attempt", ci_delivery_attempt(t->d)),
        CI_LOG_S("dropped_status", ci_task_status_short(r->msg.status)),
    };
    ci_log_fields(CI_LOG_WARN, "task.superseded", f, sizeof(f) / sizeof(f[0]));
    slot_detach(t->slot);
    /* No delivery comes after the last: left alone it would stay in the
     * work queue for good. */
    if (ci_delivery_last_attempt(t->d))
        ci_delivery_term(t->d);
    return CI_TASK_END_SUPERSEDED;
}

/* A batch's task tells its batch that it ended before its message is
 * acked (below, with the other batch steps). */
static bool batch_ended(struct task *t, Ci__V1__TaskStatus status, const char *error);
static enum ci_task_end batch_retry(struct task *t);

/* The task's terminal result was stored meanwhile (by an attempt that
 * ended first, or by this one with its ack lost): make sure its event is
 * out, and ack. With dropped, the result this attempt had is not stored:
 * it is superseded; without, this attempt had not run the code yet. */
static enum ci_task_end ended_meanwhile(struct task *t, const struct result *dropped)
{
    Ci__V1__ExecutionResult *now = existing_result(t);
    bool ours = now && now->attempt == ci_delivery_attempt(t->d) && now->worker &&
                strcmp(now->worker, t->env->worker_id) == 0;
    /* A batch's task whose ended result cannot be read now is not acked:
     * its end event may not be out, and its batch would never complete. */
    bool told = now || !t->batch[0];
    if (now && ci_task_status_terminal(now->status)) {
        ensure_terminal_event(t, now);
        told = batch_ended(t, now->status, now->error);
    }
    ci_message_free(now ? &now->base : NULL);
    if (!told && !ci_delivery_last_attempt(t->d))
        return batch_retry(t);
    slot_detach(t->slot);
    ci_delivery_ack(t->d);
    if (dropped && !ours) {
        const struct ci_log_field f[] = {
            CI_LOG_S("task_id", t->id),
            CI_LOG_N("attempt", ci_delivery_attempt(t->d)),
            CI_LOG_S("dropped_status", ci_task_status_short(dropped->msg.status)),
        };
        ci_log_fields(CI_LOG_WARN, "task.superseded", f, sizeof(f) / sizeof(f[0]));
        return CI_TASK_END_SUPERSEDED;
    }
    ci_log(CI_LOG_INFO, "task.duplicate", "task_id", t->id, NULL);
    return CI_TASK_END_DUPLICATE;
}


/* Disposes of a message whose processing met an infrastructure failure:
 * a later try may succeed, unless this was the last one. */
static enum ci_task_end give_up_or_retry(struct task *t, struct result *r, const char *what,
                                         const struct ci_error *e)
{
    ci_log(CI_LOG_ERROR, "task.infra_error", "task_id", t->id, "step", what, "error", e->msg, NULL);
    if (!ci_delivery_last_attempt(t->d)) {
        /* Never over a terminal result that may be stored already (its
         * event failed): the redelivery must find it and not run again. */
        if (t->running_stored && !t->final_started)
            note_retry(t, r, what, e);
        /* No chunk of this attempt after the message is given back. */
        live_release(t, "the attempt gave up and the task will be tried again: its last chunks "
                        "are dropped");
        slot_detach(t->slot);
        ci_delivery_nak(t->d, 2000);
        return CI_TASK_END_RETRY;
    }
    /* Last try, and the result is stored: only its event failed. The
     * record stands as it is (a FAILED over it could disagree with an
     * event whose ack alone was lost); the event is tried once more. */
    if (t->final_stored) {
        Ci__V1__ExecutionResult *now = existing_result(t);
        if (now) {
            ensure_terminal_event(t, now);
            batch_ended(t, now->status, now->error); /* no later try: as far as it goes */
        }
        ci_message_free(now ? &now->base : NULL);
        slot_detach(t->slot);
        ci_delivery_term(t->d);
        task_ended(t, r);
        return CI_TASK_END_DONE;
    }
    /* Last try: end it FAILED rather than leave it RUNNING forever. */
    r->msg.status = CI__V1__TASK_STATUS__TASK_STATUS_FAILED;
    result_fail(r, "the worker could not %s after %u attempts: %s", what,
                ci_delivery_attempt(t->d), e->msg);
    struct ci_error e2 = {{0}};
    enum fence fence;
    ci_status s = write_fenced(t, r, true, &fence, &e2);
    if (s == CI_ERR_CONFLICT)
        return fence == FENCE_ENDED ? ended_meanwhile(t, r) : superseded(t, r);
    if (s)
        ci_log(CI_LOG_ERROR, "task.store_failed", "task_id", t->id, "error", e2.msg, NULL);
    else
        batch_ended(t, r->msg.status, r->text.error);
    slot_detach(t->slot);
    ci_delivery_term(t->d);
    task_ended(t, r);
    return CI_TASK_END_DONE;
}

/* Writes a terminal result for a task that never ran, then acks. */
static enum ci_task_end finish(struct task *t, struct result *r)
{
    struct ci_error e = {{0}};
    t->final_started = true;
    enum fence fence;
    ci_status s = write_fenced(t, r, true, &fence, &e);
    if (s == CI_ERR_FULL && !t->final_stored) { /* the record itself, not its event */
        /* A full store may still take a few hundred bytes: a small FAILED
         * result that says what was lost beats a task left RUNNING. */
        char prev[CI_RESULT_TEXT_MAX];
        snprintf(prev, sizeof(prev), "%s", r->text.error);
        snprintf(r->text.error, sizeof(r->text.error),
                 "the result could not be stored whole (%.300s): its output, outputs, artifact "
                 "list and labels are not kept%s%.500s",
                 e.msg, prev[0] ? "; " : "", prev);
        r->msg.status = CI__V1__TASK_STATUS__TASK_STATUS_FAILED;
        r->msg.stdout = r->msg.stderr = (char *)"";
        r->msg.stdout_truncated = r->msg.stdout_total_bytes > 0;
        r->msg.stderr_truncated = r->msg.stderr_total_bytes > 0;
        r->msg.n_artifacts = 0;
        r->msg.n_labels = 0;
        r->msg.outputs_truncated = r->msg.outputs_truncated || r->msg.n_outputs > 0;
        r->msg.n_outputs = 0;
        s = write_fenced(t, r, true, &fence, &e);
    }
    if (s == CI_ERR_FULL && !t->final_stored && r->undo.n) {
        /* Not even that fits: the artifacts this attempt stored go (their
         * room is the store's again at once), and the result says so. */
        size_t kept = r->n_stored;
        struct ci_error ue = {{0}};
        if (ci_objstore_undo(ci_broker_objstore(t->env->broker), &r->undo, &ue) == CI_OK) {
            size_t used = strlen(r->text.error);
            snprintf(r->text.error + used, sizeof(r->text.error) - used,
                     "; the JetStream store was full: the %zu artifact%s stored for this task "
                     "%s taken back to make room for this result",
                     kept, kept == 1 ? "" : "s", kept == 1 ? "was" : "were");
            r->msg.n_artifacts = 0;
            s = write_fenced(t, r, true, &fence, &e);
        } else {
            ci_log(CI_LOG_WARN, "task.undo_failed", "task_id", t->id, "error", ue.msg, NULL);
        }
    }
    if (s == CI_ERR_CONFLICT)
        return fence == FENCE_ENDED ? ended_meanwhile(t, r) : superseded(t, r);
    if (s)
        return give_up_or_retry(t, r, "store the result", &e);
    if (!batch_ended(t, r->msg.status, r->text.error) && !ci_delivery_last_attempt(t->d)) {
        task_ended(t, r); /* its result is stored: the redelivery only tells the batch */
        return batch_retry(t);
    }
    slot_detach(t->slot);
    ci_delivery_ack(t->d);
    t->at.acked = ci_now_us();
    task_ended(t, r);
    return CI_TASK_END_DONE;
}

/* Picks the task id: the request's, else Nats-Msg-Id. */
/* At most 64 bytes of an id that is not one, printable ASCII only. */
static void show_bad_id(const char *id, char out[65])
{
    size_t n = 0;
    for (; id && id[n] && n < 64; n++)
        out[n] = id[n] >= 0x20 && id[n] < 0x7f ? id[n] : '?';
    out[n] = '\0';
}

/* The task's id: the body's task_id, else Nats-Msg-Id. A body whose
 * task_id is not an id, under a valid Nats-Msg-Id, gets its FAILED result
 * under the Nats-Msg-Id (t->bad_body_id says so): its sender can find it
 * there. false when there is no id at all to store a result under. */
static bool choose_id(struct task *t, const char *msg_id)
{
    const char *body_id = t->req && t->req->task_id && t->req->task_id[0] ? t->req->task_id : NULL;
    const char *id = body_id ? body_id : msg_id;
    if (body_id && !ci_task_id_valid(body_id) && msg_id && ci_task_id_valid(msg_id)) {
        t->bad_body_id = true;
        id = msg_id;
    }
    if (!id || !ci_task_id_valid(id))
        return false;
    snprintf(t->id, sizeof(t->id), "%s", id);
    return true;
}

/* --- batches (docs/contract.md §20) --------------------------------- */

/* The batch the task counts in: the one whose subject it came on
 * (<batch_subject>.<b>), whatever its batch_id says, else its batch_id (a
 * batch task on the wrong subject: it ends FAILED, and still counts in its
 * batch, which would otherwise never complete). Also the slot's, for a
 * cancel of the batch. false when it counts in none. */
static bool batch_choose(struct task *t)
{
    const char *subj = ci_delivery_subject(t->d);
    const char *base = t->env->cfg->jetstream.batch_subject;
    size_t n = strlen(base);
    const char *tail = subj && strncmp(subj, base, n) == 0 && subj[n] == '.' ? subj + n + 1 : NULL;
    const char *bid = t->req && t->req->batch_id && t->req->batch_id[0] ? t->req->batch_id : NULL;
    const char *batch = tail && ci_task_id_valid(tail) ? tail
                        : !tail && bid && ci_task_id_valid(bid) ? bid
                                                                : NULL;
    if (!batch)
        return false;
    snprintf(t->batch, sizeof(t->batch), "%s", batch);
    pthread_mutex_lock(&t->slot->lock);
    snprintf(t->slot->batch_id, sizeof(t->slot->batch_id), "%s", batch);
    pthread_mutex_unlock(&t->slot->lock);
    if (t->env->batches) {
        ci_batch_memo_hold(t->env->batches, t->batch);
        t->batch_held = true;
    }
    return true;
}

/* Whether the subject it came on fits its batch_id: a task of batch b on
 * <batch_subject>.<b>, a task on <batch_subject>.<x> of batch x. An error
 * sentence in r when not. */
static bool batch_subject_fits(const struct task *t, struct result *r)
{
    const struct ci_config *c = t->env->cfg;
    const char *subj = ci_delivery_subject(t->d);
    const char *base = c->jetstream.batch_subject;
    const char *bid = t->req && t->req->batch_id && t->req->batch_id[0] ? t->req->batch_id : NULL;
    size_t n = strlen(base);
    if (!subj)
        return true; /* not known: nothing to hold against it */
    const char *tail = strncmp(subj, base, n) == 0 && subj[n] == '.' ? subj + n + 1 : NULL;
    if (bid && (!tail || strcmp(tail, bid) != 0)) {
        result_fail(r, "a task of batch '%s' must be published on '%s.%s' (it came on '%.200s'), "
                       "the batch lane, where its batch counts it",
                    bid, base, bid, subj);
        return false;
    }
    if (!bid && tail) {
        result_fail(r, "the task came on '%.200s', a batch's subject, without batch_id: set "
                       "batch_id '%.64s' or publish on '%s'",
                    subj, tail, c->jetstream.submit_subject);
        return false;
    }
    return true;
}

/* Publishes an event of the task's batch until it is stored, trying again
 * for a few seconds when NATS fails, as store_final does: the task is
 * acked only once its events are stored. */
static ci_status batch_publish(const struct task *t, const char *event, const char *msg_id,
                               const char *content_type, const void *data, size_t len,
                               struct ci_error *err)
{
    ci_status s = CI_OK;
    for (int i = 0; i < 4; i++) {
        if (i) {
            struct timespec ts = {(time_t)1 << (i - 1), 0}; /* 1, 2, 4 s */
            nanosleep(&ts, NULL);
        }
        s = ci_broker_batch_publish(t->env->broker, t->batch, event, msg_id, content_type, data,
                                    len, NULL, err);
        if (s != CI_ERR_NATS && s != CI_ERR_TIMEOUT)
            return s;
    }
    return s;
}

/* The taken event, on every attempt: the stream keeps the first
 * (Nats-Msg-Id <task_id>.taken), so a task is counted taken once. false
 * when it could not be stored. */
static bool batch_taken(struct task *t)
{
    char msg_id[96];
    snprintf(msg_id, sizeof(msg_id), "%s.taken", t->id);
    struct ci_error e = {{0}};
    if (batch_publish(t, "taken", msg_id, NULL, t->id, strlen(t->id), &e) == CI_OK)
        return true;
    ci_log(CI_LOG_ERROR, "task.infra_error", "task_id", t->id, "batch_id", t->batch, "step",
           "publish the batch's taken event", "error", e.msg, NULL);
    return false;
}

/* The complete event of batch when its ended tasks (in c) reach total
 * (Nats-Msg-Id <batch>.complete: one per batch, whoever sees it first). by
 * names who noticed, for the log. */
static ci_status batch_complete_if(struct ci_broker *b, const char *batch, uint64_t total,
                                   const struct ci_batch_counts *c, const char *by,
                                   struct ci_error *err)
{
    if (c->complete || !ci_batch_is_complete(c, total))
        return CI_OK;
    CI_AUTOFREE char *body = NULL;
    size_t len = 0;
    ci_status s = ci_batch_complete_body(batch, total, c, &body, &len, err);
    char msg_id[96];
    snprintf(msg_id, sizeof(msg_id), "%s.complete", batch);
    /* Retried by the caller's own means: a task's end by its redelivery. */
    bool dup = false;
    if (!s)
        s = ci_broker_batch_publish(b, batch, "complete", msg_id, "application/json", body, len,
                                    &dup, err);
    /* Said where it was stored: another worker (or this one, for another
     * task) may have seen the batch complete at the same moment. */
    if (!s)
        ci_log_num(dup ? CI_LOG_DEBUG : CI_LOG_INFO, dup ? "batch.complete_duplicate"
                                                         : "batch.complete",
                   "total", (int64_t)total, "batch_id", batch, "by", by, NULL);
    return s;
}

/* The total of the batch's seal, from the memo or else read from the
 * stream's leader: a seal whose publish was acked is always seen, also on
 * a cluster whose replicas lag (a direct get may not show it yet).
 * CI_ERR_NOT_FOUND when the batch is not sealed (yet); CI_ERR_INVALID
 * when its seal says no total (logged: nobody can tell when such a batch
 * is complete). */
static ci_status batch_seal(const struct ci_worker_env *env, const char *batch_id,
                            uint64_t *ret_total, struct ci_error *err)
{
    if (env->batches && ci_batch_memo_sealed(env->batches, batch_id, ci_now_ms(), ret_total))
        return CI_OK;
    CI_AUTOFREE uint8_t *seal = NULL;
    size_t len = 0;
    int64_t stored_ms = 0;
    ci_status s = ci_broker_batch_last_at(env->broker, batch_id, "sealed", &seal, &len,
                                          &stored_ms, err);
    if (s)
        return s;
    struct ci_error pe = {{0}};
    if (ci_batch_seal_total(seal, len, ret_total, &pe)) {
        ci_log(CI_LOG_WARN, "batch.bad_seal", "batch_id", batch_id, "error", pe.msg, NULL);
        return ci_error_set(err, CI_ERR_INVALID, "the seal of batch '%s': %s", batch_id,
                            pe.msg);
    }
    /* Kept while the stream keeps it: the id of a batch gone from the
     * stream may be used again, for another batch (a server that does not
     * say when it stored the seal: not kept). */
    if (env->batches && stored_ms > 0)
        ci_batch_memo_seal(env->batches, batch_id, *ret_total,
                           stored_ms + (int64_t)env->cfg->batches.max_age_s * 1000);
    return CI_OK;
}

/* The batch is complete when its seal is there and its ended tasks reach
 * the seal's total. Counted only once it is sealed: before, no task's end
 * can complete it, and the worker that gets the seal counts then
 * (ci_task_batch_sealed). Either that count comes after this task's end
 * was stored, or this look comes after the seal was stored and sees it. */
static ci_status batch_complete(const struct task *t, struct ci_error *err)
{
    uint64_t total = 0;
    ci_status s = batch_seal(t->env, t->batch, &total, err);
    if (s == CI_ERR_NOT_FOUND || s == CI_ERR_INVALID)
        return CI_OK;
    if (s)
        return s;
    struct ci_batch_counts c;
    s = ci_broker_batch_counts(t->env->broker, t->batch, &c, err);
    if (s)
        return s;
    return batch_complete_if(t->env->broker, t->batch, total, &c, t->id, err);
}

ci_status ci_task_batch_sealed(const struct ci_worker_env *env, const char *batch_id,
                               struct ci_error *err)
{
    /* Counted only once the seal is read from the stream: an end stored
     * after this count then sees the seal (batch_complete), and the total
     * is the stored seal's, as every worker reads it. */
    uint64_t total = 0;
    ci_status s = batch_seal(env, batch_id, &total, err);
    struct ci_batch_counts c;
    if (!s)
        s = ci_broker_batch_counts(env->broker, batch_id, &c, err);
    if (!s)
        s = batch_complete_if(env->broker, batch_id, total, &c, "seal", err);
    return s;
}

/* Its end is stored: the slot lets go of the task. false when another
 * slot of the worker still holds a task of the batch: that one looks at
 * the batch in its place when it lets go (contract §20). */
static bool batch_let_go(struct task *t)
{
    struct ci_batch_memo *memo = t->env->batches;
    if (!memo)
        return true;
    bool count = t->batch_held ? ci_batch_memo_let_go(memo, t->batch, true)
                               : ci_batch_memo_ended(memo, t->batch);
    t->batch_held = false;
    return count;
}

/* A count that a task's end owed its batch failed, and no redelivery of
 * the task will make it (superseded, or its last attempt): the seal
 * thread tries it again for a while (worker/sealwait.h), else the batch
 * would wait for a count that nobody makes. */
static void batch_count_later(const struct task *t, const struct ci_error *e)
{
    ci_log(t->env->seals ? CI_LOG_INFO : CI_LOG_WARN,
           t->env->seals ? "batch.count_later" : "batch.complete_failed", "task_id", t->id,
           "batch_id", t->batch, "error", e->msg, NULL);
    ci_sealwait_count(t->env->seals, t->batch);
}

/* A task given up without its end stored by this attempt (nak'ed,
 * superseded, its ended result unreadable): it comes back, or another
 * attempt has it and counts when it ends. That end may be stored already,
 * counted before an end of this worker that left its count to this slot:
 * then this let-go counts (NATS failing, the seal thread tries again). */
static void batch_given_up(struct task *t)
{
    if (!t->batch_held)
        return;
    t->batch_held = false;
    if (!ci_batch_memo_let_go(t->env->batches, t->batch, false))
        return;
    struct ci_error e = {{0}};
    if (batch_complete(t, &e))
        batch_count_later(t, &e);
}

/* A task whose terminal result is stored tells its batch, before its
 * message is acked: the end event under its status (Nats-Msg-Id
 * <task_id>.end, so a redelivery's copy is dropped), then complete if the
 * batch is. false when that could not be stored: the caller does not ack
 * (batch_retry), and the redelivery, which finds the result, tells again. */
static bool batch_ended(struct task *t, Ci__V1__TaskStatus status, const char *error)
{
    if (!t->batch[0])
        return true;
    struct ci_error e = {{0}};
    CI_AUTOFREE char *body = NULL;
    size_t len = 0;
    char msg_id[96];
    snprintf(msg_id, sizeof(msg_id), "%s.end", t->id);
    ci_status s = ci_batch_end_body(t->id, ci_task_status_name(status), error, &body, &len, &e);
    if (!s)
        s = batch_publish(t, ci_task_status_short(status), msg_id, "application/json", body, len,
                          &e);
    if (!s && batch_let_go(t)) {
        s = batch_complete(t, &e);
        if (s && ci_delivery_last_attempt(t->d))
            batch_count_later(t, &e); /* its end is stored: no redelivery will count */
    }
    if (!s)
        return true;
    ci_log(CI_LOG_ERROR, "task.infra_error", "task_id", t->id, "batch_id", t->batch, "step",
           "tell the batch that the task ended", "error", e.msg, NULL);
    return false;
}

/* The batch could not be told: not acked but nak'ed with a delay, as after
 * an infrastructure failure, so that a redelivery tells it. */
static enum ci_task_end batch_retry(struct task *t)
{
    slot_detach(t->slot);
    ci_delivery_nak(t->d, 2000);
    return CI_TASK_END_RETRY;
}

/* Before the task runs: a cancel of its batch ends it CANCELLED, one that
 * came through the worker's subscription moments ago (the memo keeps it
 * CI_BATCH_MEMO_CANCEL_GRACE_MS: the stream may not show it yet) or one on
 * the stream (kept then while the stream keeps it; the last message on
 * <prefix>.<b>.cancel, read from the stream's leader: a replica that lags
 * could say "none" for a cancel just stored). Not looked for again while
 * the memo says a look found none moments ago: a cancel published since
 * has come through the subscription (which the memo keeps, or else finds
 * this slot: its batch_id is set). true when it goes on; false with
 * *ret_end when it ended or is retried. */
static bool batch_begin(struct task *t, struct result *r, enum ci_task_end *ret_end)
{
    struct ci_batch_memo *memo = t->env->batches;
    uint64_t link = ci_broker_disconnects(t->env->broker), gen = 0;
    int64_t looked_ms = ci_mono_ms();
    /* A cancel the subscription brought: the stream may not show it yet. */
    bool cancelled = memo && ci_batch_memo_cancelled(memo, t->batch, ci_now_ms());
    if (!cancelled) {
        if (memo && ci_batch_memo_uncancelled(memo, t->batch, looked_ms, link, &gen))
            return true;
        struct ci_error e = {{0}};
        CI_AUTOFREE uint8_t *data = NULL;
        size_t len = 0;
        int64_t stored_ms = 0;
        ci_status s = ci_broker_batch_last_at(t->env->broker, t->batch, "cancel", &data, &len,
                                              &stored_ms, &e);
        int64_t max_age_ms = (int64_t)t->env->cfg->batches.max_age_s * 1000;
        if (!s && memo && stored_ms > 0) /* stored: sticks while the stream keeps it */
            ci_batch_memo_cancel_stored(memo, t->batch, stored_ms + max_age_ms);
        if (s == CI_ERR_NOT_FOUND) {
            if (memo)
                ci_batch_memo_no_cancel(memo, t->batch, gen, looked_ms, link);
            return true;
        }
        if (s) {
            *ret_end = give_up_or_retry(t, r, "read the batch's cancel", &e);
            return false;
        }
    }
    pthread_mutex_lock(&t->slot->lock);
    t->slot->batch_cancelled = true;
    pthread_mutex_unlock(&t->slot->lock);
    r->msg.status = CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED;
    result_fail(r, "%s", cancelled_before(t->slot));
    *ret_end = finish(t, r);
    return false;
}

/* A run that a cancel of its batch ended says so. */
static void batch_cancelled_while_running(const struct task *t, struct result *r)
{
    pthread_mutex_lock(&t->slot->lock);
    bool batch = t->slot->batch_cancelled;
    pthread_mutex_unlock(&t->slot->lock);
    if (batch && r->msg.status == CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED)
        snprintf(r->text.error, sizeof(r->text.error), "the batch was cancelled while this "
                 "task ran");
}

/* --- sessions (docs/contract.md §16) --------------------------------- */

/* Adds a sentence to the result's error ("; " between). */
static void result_note(struct result *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void result_note(struct result *r, const char *fmt, ...)
{
    size_t used = strlen(r->text.error);
    if (used && used + 2 < sizeof(r->text.error)) {
        memcpy(r->text.error + used, "; ", 3);
        used += 2;
    }
    if (used + 1 >= sizeof(r->text.error))
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->text.error + used, sizeof(r->text.error) - used, fmt, ap);
    va_end(ap);
}

static const char *session_id(const struct task *t)
{
    return t->req && t->req->session_id && t->req->session_id[0] ? t->req->session_id : NULL;
}

/* The SessionInfo of the result, from the plan (and later the outcome). */
static void session_info(struct task *t, struct result *r)
{
    ci__v1__session_info__init(&r->session);
    r->session.session_id = (char *)session_id(t);
    r->session.step = t->plan.step;
    r->session.new_session = t->plan.new_session;
    r->session.previous_state_gone = t->plan.previous_gone;
    r->msg.session = &r->session;
}

/* Whether the subject it came on fits its session_id: ci.submit without
 * one, ci.submit.<id> with id. An error sentence in r when not. */
static bool subject_fits(const struct task *t, struct result *r)
{
    const char *subj = ci_delivery_subject(t->d);
    const char *base = t->env->cfg->jetstream.submit_subject;
    const char *sid = session_id(t);
    size_t n = strlen(base);
    const char *tail = subj && strncmp(subj, base, n) == 0 && subj[n] == '.' ? subj + n + 1 : NULL;
    if (!subj)
        return true; /* not known: nothing to hold against it */
    if (sid && (!tail || strcmp(tail, sid) != 0)) {
        result_fail(r, "a task of session '%s' must be published on '%s.%s' (it came on '%.200s'), "
                       "where the session's tasks keep their order",
                    sid, base, sid, subj);
        return false;
    }
    if (!sid && tail) {
        result_fail(r, "the task came on '%.200s', a session's subject, without session_id: set "
                       "session_id '%.64s' or publish on '%s'",
                    subj, tail, base);
        return false;
    }
    return true;
}

/* Reads the session's record and fetches the state to restore. Returns
 * true when the task goes on; false with *ret_end when it ended, waits for
 * its turn (CI_TASK_END_WAIT) or is retried. */
static bool session_begin(struct task *t, struct result *r, enum ci_task_end *ret_end)
{
    const struct ci_worker_env *env = t->env;
    const char *sid = session_id(t);
    struct ci_error e = {{0}};
    if (!env->provider->ops->sessions) {
        result_fail(r, "sessions need the local provider: this worker runs tasks on '%s', which "
                       "cannot carry a session's state; send the task without session_id",
                    ci_provider_name(env->provider));
        *ret_end = finish(t, r);
        return false;
    }
    t->seq = ci_delivery_seq(t->d);
    if (!t->turn_checked && t->seq) {
        uint64_t first = 0;
        ci_status s = ci_broker_session_first_seq(env->broker, sid, &first, &e);
        if (s && s != CI_ERR_NOT_FOUND) {
            *ret_end = give_up_or_retry(t, r, "look up the session's order", &e);
            return false;
        }
        /* Nothing found: its own message is not visible there yet (a
         * lagging follower answered): the room looks again. */
        if ((s == CI_OK && first < t->seq) || s == CI_ERR_NOT_FOUND) {
            snprintf(t->wait->task_id, sizeof(t->wait->task_id), "%s", t->id);
            snprintf(t->wait->session_id, sizeof(t->wait->session_id), "%s", sid);
            t->wait->seq = t->seq;
            t->wait->cancelled = slot_cancelled(t->slot);
            *ret_end = CI_TASK_END_WAIT;
            return false;
        }
    }
    uint8_t *buf = NULL;
    size_t len = 0;
    ci_status s = ci_broker_session_get(env->broker, sid, &buf, &len, &t->sess_rev, &e);
    if (s && s != CI_ERR_NOT_FOUND) {
        *ret_end = give_up_or_retry(t, r, "read the session's record", &e);
        return false;
    }
    bool garbled = false;
    if (s == CI_OK) {
        t->sess_have_rec = ci_session_record_parse(buf, len, &t->rec, NULL) == CI_OK;
        garbled = !t->sess_have_rec;
    }
    free(buf);
    ci_session_plan(sid, t->id, t->sess_have_rec ? &t->rec : NULL, ci_now_ms(),
                    env->cfg->sessions.idle_s, &t->plan);
    if (garbled) /* not a record a worker wrote: whatever it was is gone */
        t->plan.previous_gone = true;
    t->sess_read = true;
    session_info(t, r);
    if (t->plan.applied) {
        r->session.restored_from_step = 0;
        r->session.state_kept = t->rec.state_step == t->rec.step;
        r->session.state_bytes = t->rec.state_bytes;
        result_fail(r, "this task ran already as step %u of session '%s', on a worker that stopped "
                       "before storing its result: the session's state is as it left it, its "
                       "output is lost",
                    t->plan.step, sid);
        *ret_end = finish(t, r);
        return false;
    }
    if (t->plan.stale_object[0] &&
        ci_objstore_delete(ci_broker_objstore(env->broker), t->plan.stale_object, &e) &&
        e.msg[0])
        ci_log(CI_LOG_DEBUG, "session.stale_delete_failed", "object", t->plan.stale_object,
               "error", e.msg, NULL);
    if (!t->plan.restore_step)
        return true;
    /* The archive plus room for what the object store adds nothing to. */
    uint64_t cap = (uint64_t)env->cfg->sessions.max_state_mb * 1024 * 1024;
    s = ci_objstore_get(ci_broker_objstore(env->broker), t->plan.restore_object, (size_t)cap,
                        &t->state, &t->state_len, &e);
    /* The record names this object, so it was stored: not found or not
     * whole may be a replica that lags, and running without it would
     * replace it with less. Only the last delivery runs without it. */
    if (s == CI_ERR_NATS || s == CI_ERR_TIMEOUT ||
        ((s == CI_ERR_NOT_FOUND || s == CI_ERR_INTEGRITY) && !ci_delivery_last_attempt(t->d))) {
        *ret_end = give_up_or_retry(t, r, "read the session's state", &e);
        return false;
    }
    if (s) {
        snprintf(t->state_note, sizeof(t->state_note),
                 "the session's state of step %u could not be read (%.300s): this step starts "
                 "without it",
                 t->plan.restore_step, s == CI_ERR_NOT_FOUND ? "it is gone" : e.msg);
        t->plan.restore_step = 0;
        t->plan.previous_gone = true;
        r->session.previous_state_gone = true;
        free(t->state);
        t->state = NULL;
        t->state_len = 0;
    }
    return true;
}

static const char *not_run_reason(enum ci_outcome_kind kind)
{
    switch (kind) {
    case CI_OUTCOME_TIMED_OUT: return "the step timed out";
    case CI_OUTCOME_CANCELLED: return "the step was cancelled";
    case CI_OUTCOME_MEMORY: return "the step ran out of memory";
    default: return "the sandbox failed";
    }
}

/* Splits the sandbox's "name (reason)" lines into the result. */
static void session_dropped(struct result *r, const char *lines)
{
    size_t n = 0;
    for (const char *p = lines; p && *p; p++)
        n += *p == '\n';
    n++;
    if (!lines || !*lines || !(r->dropped = calloc(n, sizeof(*r->dropped))))
        return;
    const char *p = lines;
    while (*p && r->session.n_dropped < n) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len && !(r->dropped[r->session.n_dropped++] = strndup(p, len)))
            r->session.n_dropped--;
        p += len + (end ? 1 : 0);
    }
    r->session.dropped = r->dropped;
}

/* Writes the record until it takes or another writer is seen: a few tries
 * when NATS fails, as for the result. */
static ci_status session_swap(struct task *t, const struct ci_session_record *rec,
                              struct ci_error *err)
{
    CI_AUTOFREE char *json = NULL;
    size_t len = 0;
    ci_status s = ci_session_record_encode(session_id(t), rec, &json, &len, err);
    for (int i = 0; !s && i < 4; i++) {
        if (i) {
            struct timespec ts = {(time_t)1 << (i - 1), 0};
            nanosleep(&ts, NULL);
        }
        uint64_t rev = 0;
        s = ci_broker_session_swap(t->env->broker, session_id(t), json, len, t->sess_rev, &rev,
                                   err);
        if (s == CI_OK)
            t->sess_rev = rev;
        if (s != CI_ERR_NATS && s != CI_ERR_TIMEOUT)
            return s;
    }
    return s;
}

/* After the run: stores the step's state (when it left one it may keep)
 * and the session's new record, and says in the result what became of it. */
static void session_end(struct task *t, struct result *r, struct ci_outcome *o)
{
    const struct ci_worker_env *env = t->env;
    const char *sid = session_id(t);
    struct ci_objstore *os = ci_broker_objstore(env->broker);
    struct ci_error e = {{0}};
    uint32_t step = t->plan.step;
    /* What the session has now, should this step's state not be kept. */
    uint32_t prev_step = t->plan.restore_step;
    uint64_t prev_bytes = prev_step ? t->rec.state_bytes : 0;

    r->session.restored_from_step = o->session.restored ? t->plan.restore_step : 0;
    session_dropped(r, o->session.dropped);
    if (t->state_note[0])
        result_note(r, "%s", t->state_note);
    if (o->session.restore_error)
        result_note(r, "the session's state of step %u could not be restored (%.400s): this "
                       "step ran without it",
                    t->plan.restore_step, o->session.restore_error);

    bool keep = o->kind == CI_OUTCOME_EXITED && o->session.state;
    char why[600] = "";
    if (o->kind != CI_OUTCOME_EXITED)
        snprintf(why, sizeof(why), "%s", not_run_reason(o->kind));
    else if (o->session.keep_previous && prev_step)
        /* The state was there but this step could not load it (memory, a
         * full workspace): what it leaves would replace it with less. */
        keep = false, snprintf(why, sizeof(why), "it could not load the session's state");
    else if (!o->session.state)
        snprintf(why, sizeof(why), "%.590s",
                 o->session.state_error ? o->session.state_error : "the step left no state");
    char object[CI_SESSION_OBJECT_MAX];
    ci_session_object_name(sid, step, ci_delivery_attempt(t->d), object);
    if (keep) {
        ci_status s = ci_objstore_put(os, object, o->session.state, o->session.state_len, &e);
        if (s) {
            keep = false;
            snprintf(why, sizeof(why), "it could not be stored: %.500s", e.msg);
        } else {
            ci_metrics_objstore_bytes(env->metrics, CI_METRICS_UPLOAD, o->session.state_len);
        }
    }
    struct ci_session_record rec = {
        .step = step,
        .state_step = keep ? step : prev_step,
        .last_seq = t->seq,
        .state_bytes = keep ? o->session.state_len : prev_bytes,
        .created_ms = t->plan.created_ms,
        .updated_ms = ci_now_ms(),
    };
    snprintf(rec.last_task_id, sizeof(rec.last_task_id), "%s", t->id);
    snprintf(rec.state, sizeof(rec.state), "%s", keep ? object : prev_step ? t->plan.restore_object : "");
    ci_status s = session_swap(t, &rec, &e);
    if (s == CI_ERR_CONFLICT) {
        /* Written meanwhile: by this attempt (a write whose ack was lost),
         * by a close, or by another attempt of this step. */
        uint8_t *buf = NULL;
        size_t len = 0;
        struct ci_session_record now;
        bool have = ci_broker_session_get(env->broker, sid, &buf, &len, NULL, NULL) == CI_OK &&
                    ci_session_record_parse(buf, len, &now, NULL) == CI_OK;
        free(buf);
        if (have && !now.closed && strcmp(now.last_task_id, t->id) == 0 &&
            strcmp(now.state, rec.state) == 0) {
            s = CI_OK; /* ours */
        } else {
            /* This attempt's own object, which the record as read does not
             * name; unread, it is left to expire: it may be named. */
            if (keep && have && strcmp(now.state, object) != 0)
                ci_objstore_delete(os, object, NULL);
            keep = false;
            rec.state_step = have && !now.closed ? now.state_step : 0;
            rec.state_bytes = have && !now.closed ? now.state_bytes : 0;
            snprintf(why, sizeof(why), "%s",
                     have && now.closed ? "the session was closed while the step ran"
                                        : "another attempt of this step or a client wrote the "
                                          "session's record meanwhile");
        }
    } else if (s) {
        /* A try may have landed before the error: the object stays (it
         * expires with the bucket's TTL if nothing names it). */
        keep = false;
        rec.state_step = prev_step;
        rec.state_bytes = prev_bytes;
        snprintf(why, sizeof(why), "the session's record could not be written: %.500s", e.msg);
        ci_log(CI_LOG_ERROR, "session.record_failed", "task_id", t->id, "session_id", sid,
               "error", e.msg, NULL);
    }
    if (s == CI_OK && keep && prev_step && strcmp(t->plan.restore_object, object) != 0 &&
        ci_objstore_delete(os, t->plan.restore_object, &e))
        ci_log(CI_LOG_DEBUG, "session.old_state_delete_failed", "object",
               t->plan.restore_object, "error", e.msg, NULL);
    r->session.state_kept = keep;
    r->session.state_bytes = rec.state_bytes;
    if (!keep) {
        if (rec.state_step)
            result_note(r, "this step's state was not kept (%s): the session keeps the state of "
                           "step %u",
                        why, rec.state_step);
        else
            result_note(r, "this step's state was not kept (%s): the session has no state yet",
                        why);
    }
}

/* A chunk of the live output was lost: the first one is logged when it
 * happens (once per task), so that an operator sees it while the task
 * still runs. On the run's thread (the queue was full) or the publisher's
 * (NATS refused it). */
static void live_dropped(void *ctx, const char *stream, uint64_t seq, ci_status s,
                         const char *why)
{
    (void)s;
    struct task *t = ctx;
    if (atomic_exchange(&t->live_dropped, true))
        return;
    const struct ci_log_field f[] = {
        CI_LOG_S("task_id", t->id),
        CI_LOG_N("attempt", t->attempt),
        CI_LOG_S("stream", stream),
        CI_LOG_N("seq", seq),
        CI_LOG_S("error", why),
    };
    ci_log_fields(CI_LOG_WARN, "task.output_dropped", f, sizeof(f) / sizeof(f[0]));
}

/* The publisher's publish: a chunk of this attempt, on its own thread. */
static ci_status live_publish(void *ctx, const char *stream, uint64_t seq, const uint8_t *data,
                              size_t len, struct ci_error *err)
{
    struct task *t = ctx;
    return ci_broker_output_publish(t->env->broker, t->id, stream, t->attempt, seq, data, len,
                                    err);
}

static const struct ci_publisher_ops live_pub_ops = {.publish = live_publish,
                                                     .dropped = live_dropped};

/* The live output's publish: hands the chunk to the publisher, at once
 * while the code runs (a full queue drops it, and live_dropped tells). */
static ci_status live_put(void *ctx, const char *stream, uint64_t seq, const uint8_t *data,
                          size_t len, struct ci_error *err)
{
    struct task *t = ctx;
    return ci_publisher_put(t->pub, stream, seq, data, len, err);
}

/* The run ended: its last chunks (what was pending) may wait for room in
 * the queue now, as the result's tail will (store_result), rather than be
 * dropped by a queue full for a moment. */
static void live_run_ended(void *ctx)
{
    struct task *t = ctx;
    ci_publisher_end(t->pub, ci_mono_ms() + CI_PUBLISHER_DRAIN_MS);
}

static const struct ci_liveout_ops live_ops = {.publish = live_put, .run_ended = live_run_ended};

/* The attempt runs without live output: said once, as a lost chunk is. */
static void live_off(struct task *t, const struct ci_error *e)
{
    const struct ci_log_field f[] = {
        CI_LOG_S("task_id", t->id),
        CI_LOG_N("attempt", t->attempt),
        CI_LOG_S("error", e->msg),
    };
    ci_log_fields(CI_LOG_WARN, "task.output_off", f, sizeof(f) / sizeof(f[0]));
}

/* Makes the attempt's live output and starts its publisher, when the
 * config wants one and its stream is there. Without memory or a thread
 * for it the task runs without (task.output_off): the result has the
 * output. */
static bool live_start(struct task *t)
{
    const struct ci_config *cfg = t->env->cfg;
    struct ci_error e = {{0}};
    if (!ci_broker_live_output(t->env->broker, NULL, 0))
        return false;
    t->attempt = ci_delivery_attempt(t->d);
    struct ci_publisher_opts po = {.ops = &live_pub_ops, .ctx = t};
    /* Room for all the output the attempt may publish, both streams up to
     * the cap: a NATS that takes the chunks loses none, however much
     * faster than it the code writes (the queue drops only what a NATS
     * that stopped taking them leaves behind). */
    ci_publisher_size(&po, 2 * (uint64_t)cfg->limits.max_output_bytes, CI_LIVEOUT_FLUSH_BYTES);
    if (ci_publisher_new(&po, &t->pub, &e) != CI_OK) {
        live_off(t, &e);
        return false;
    }
    struct ci_liveout_opts o = {.ops = &live_ops, .ctx = t, .cap = cfg->limits.max_output_bytes};
    if (ci_liveout_new(&o, &t->live, &e) != CI_OK) {
        ci_publisher_free(t->pub);
        t->pub = NULL;
        live_off(t, &e);
        return false;
    }
    return true;
}

static enum ci_task_end run_task(struct task *t, struct result *r)
{
    const struct ci_worker_env *env = t->env;
    struct ci_error e = {{0}};
    uint32_t timeout_ms = 0, memory_mb = 0;

    if (ci_request_validate(env->cfg, t->req, &timeout_ms, &memory_mb, &e)) {
        result_fail(r, "%s", e.msg);
        return finish(t, r);
    }
    if (t->req->runtime && t->req->runtime[0])
        r->msg.runtime = t->req->runtime;

    bool cancelled = slot_cancelled(t->slot); /* a cancel seen already needs no stream */
    if (!cancelled && ci_broker_cancel_requested(env->broker, t->id, &cancelled, &e))
        return give_up_or_retry(t, r, "read the cancel stream", &e);
    if (cancelled || slot_cancelled(t->slot)) {
        r->msg.status = CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED;
        result_fail(r, "%s", cancelled_before(t->slot));
        return finish(t, r);
    }
    t->at.checked = ci_now_us();
    if (!subject_fits(t, r) || !batch_subject_fits(t, r))
        return finish(t, r);
    enum ci_task_end batch_end;
    if (t->batch[0] && !batch_begin(t, r, &batch_end))
        return batch_end;
    enum ci_task_end sess_end;
    if (session_id(t) && !session_begin(t, r, &sess_end))
        return sess_end;

    /* A worker that died mid-task leaves RUNNING behind; on the last try
     * we end it rather than risk dying again with nobody left to end it.
     * (One that gave up on NATS and said so did not die: try again.) */
    if (ci_delivery_last_attempt(t->d) && ci_delivery_attempt(t->d) > 1 && died_before(t)) {
        uint32_t n = ci_delivery_attempt(t->d) - 1;
        result_fail(r, "the task was started %u time%s and never finished: each time the worker running it stopped or could not reach NATS",
                    n, n == 1 ? "" : "s");
        return finish(t, r);
    }

    struct result running;
    result_init(&running, t, CI__V1__TASK_STATUS__TASK_STATUS_RUNNING);
    running.msg.runtime = r->msg.runtime;
    /* Written since we looked: over an earlier attempt's record this one
     * takes over, as a redelivery does; a later attempt's or a terminal
     * result wins. */
    enum fence fence;
    ci_status s = write_fenced(t, &running, false, &fence, &e);
    result_release(&running);
    if (s == CI_ERR_CONFLICT)
        return fence == FENCE_ENDED ? ended_meanwhile(t, NULL) : superseded(t, r);
    if (s)
        return give_up_or_retry(t, r, "record the task as running", &e);
    t->running_stored = true;
    t->at.running = ci_now_us();

    s = fetch_inputs(t, r, &e);
    if (s == CI_ERR_NATS || s == CI_ERR_TIMEOUT)
        return give_up_or_retry(t, r, "read the inputs", &e);
    if (s)
        return finish(t, r);
    if (slot_cancelled(t->slot)) { /* while RUNNING was stored or inputs read */
        r->msg.status = CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED;
        result_fail(r, "%s", cancelled_before(t->slot));
        return finish(t, r);
    }
    t->at.inputs = ci_now_us();

    struct ci_job job = {
        .task_id = t->id,
        .runtime = r->msg.runtime,
        .code = t->req->code,
        .code_len = strlen(t->req->code),
        .files = t->files,
        .n_files = t->n_files,
        .timeout_ms = timeout_ms,
        .memory_mb = memory_mb,
        .session = {
            .on = t->sess_read,
            .state = t->state,
            .state_len = t->state_len,
            .max_state_bytes = (uint64_t)env->cfg->sessions.max_state_mb * 1024 * 1024,
        },
    };
    struct ci_output_sink sink;
    if (live_start(t)) {
        sink = ci_liveout_sink(t->live);
        job.output = &sink;
    }
    struct ci_run *run = NULL;
    s = ci_provider_start(env->provider, &job, &run, &e);
    if (s == CI_ERR_FULL) /* no room now: later, here or on another worker */
        return give_up_or_retry(t, r, "start the sandbox", &e);
    if (s) {
        result_fail(r, "%s", e.msg);
        return finish(t, r);
    }
    t->at.started = ci_now_us();
    pthread_mutex_lock(&t->slot->lock);
    t->slot->run = run;
    if (t->slot->cancel_requested)
        ci_provider_cancel(env->provider, run);
    pthread_mutex_unlock(&t->slot->lock);

    struct ci_outcome o;
    memset(&o, 0, sizeof(o));
    s = ci_provider_wait(env->provider, run, &o);
    t->at.waited = ci_now_us();
    t->at.run = o.marks;

    pthread_mutex_lock(&t->slot->lock);
    t->slot->run = NULL;
    pthread_mutex_unlock(&t->slot->lock);
    /* What the run left pending goes out now (the local provider's sandbox
     * did it before reading the artifacts). */
    ci_liveout_flush(t->live);

    if (s) {
        o.kind = CI_OUTCOME_ERROR;
        if (!o.error)
            o.error = strdup("the sandbox failed while running the code");
    }
    if (!s && o.unreaped)
        ci_log(CI_LOG_WARN, "task.unreaped", "task_id", t->id, "what",
               "the task was killed, yet its processes did not exit within 10 s of SIGKILL "
               "(frozen by the cgroup v1 freezer, or stuck in the kernel: a hung disk or NFS "
               "mount?); its slot goes on, and they are reaped and their cgroup removed "
               "once they exit",
               NULL);
    /* Without memory for the output the result still ends the task. */
    (void)ci_result_set_outcome(&r->msg, &r->usage, &r->text, &o,
                                env->cfg->limits.max_output_bytes);
    batch_cancelled_while_running(t, r);
    enum ci_task_end end;
    fence = FENCE_WRITE_AGAIN;
    s = upload_artifacts(t, r, &o, &e);
    if (s == CI_ERR_CONFLICT || (s == CI_OK && must_look_again(t, r, &o)))
        fence = still_ours(t);
    if (s == CI_ERR_CONFLICT && fence == FENCE_WRITE_AGAIN)
        fence = FENCE_SUPERSEDED; /* it was not ours a moment ago */
    t->at.artifacts = ci_now_us();
    /* This attempt's result will not be stored: its chunks still queued
     * are worth nothing, and must not follow the terminal event that
     * ended_meanwhile may publish (or repair). The publish under way ends
     * first. */
    if (fence == FENCE_ENDED)
        live_release(t, "the task ended meanwhile (another attempt stored its result): this "
                        "attempt's last chunks are dropped");
    else if (fence == FENCE_SUPERSEDED)
        live_release(t, "a later attempt took the task over: this attempt's last chunks are "
                        "dropped");
    if (fence == FENCE_ENDED) {
        end = ended_meanwhile(t, r);
    } else if (fence == FENCE_SUPERSEDED) {
        end = superseded(t, r);
    } else if (s) {
        r->msg.n_artifacts = 0;
        end = give_up_or_retry(t, r, "store the artifacts", &e);
    } else {
        if (t->sess_read)
            session_end(t, r, &o);
        end = finish(t, r);
    }
    /* Only now: freeing a run may wait for its init to be gone, while the
     * task's memory is torn down (zygote/main.c); a small warm run is
     * usually handed to the sandbox's reaper thread (sandbox/reaper.c). */
    ci_provider_release(env->provider, run);
    t->at.released = ci_now_us();
    ci_outcome_release(&o);
    return end;
}

/* The task.stages line (debug level): when a task that ran passed each
 * stage, in us since it was taken (-1: not reached), and when it was taken
 * (us of the wall clock, which a client on the same machine can line up
 * with its own). Timings only, no content. */
static void log_stages(const struct task *t)
{
    if (!t->at.started)
        return;
    const int64_t t0 = t->at.taken;
#define SINCE(x) ((x) ? (x) - t0 : -1)
    const struct ci_log_field f[] = {
        CI_LOG_S("task_id", t->id),
        CI_LOG_N("taken_at_us", t0),
        CI_LOG_N("checked_us", SINCE(t->at.checked)),
        CI_LOG_N("running_us", SINCE(t->at.running)),
        CI_LOG_N("inputs_us", SINCE(t->at.inputs)),
        CI_LOG_N("cgroup_us", SINCE(t->at.run.cgroup_us)),
        CI_LOG_N("acquired_us", SINCE(t->at.run.acquired_us)),
        CI_LOG_N("ready_us", SINCE(t->at.run.ready_us)),
        CI_LOG_N("go_us", SINCE(t->at.run.go_us)),
        CI_LOG_N("started_us", SINCE(t->at.started)),
        CI_LOG_N("end_us", SINCE(t->at.run.end_us)),
        CI_LOG_N("collected_us", SINCE(t->at.run.collected_us)),
        CI_LOG_N("waited_us", SINCE(t->at.waited)),
        CI_LOG_N("artifacts_us", SINCE(t->at.artifacts)),
        CI_LOG_N("stored_us", SINCE(t->at.stored)),
        CI_LOG_N("event_us", SINCE(t->at.event)),
        CI_LOG_N("acked_us", SINCE(t->at.acked)),
        CI_LOG_N("released_us", SINCE(t->at.released)),
    };
#undef SINCE
    ci_log_fields(CI_LOG_DEBUG, "task.stages", f, sizeof(f) / sizeof(f[0]));
}

enum ci_task_end ci_task_process(const struct ci_worker_env *env, struct ci_slot *slot,
                                 struct ci_delivery *d, const struct ci_task_wait *resumed,
                                 struct ci_task_wait *ret_wait)
{
    bool turn_checked = resumed && !resumed->cancelled;
    struct task t = {.env = env, .slot = slot, .d = d, .started_at_ms = ci_now_ms(),
                     .taken_mono_ms = ci_mono_ms(), .queue_wait_ms = -1,
                     .turn_checked = turn_checked, .wait = ret_wait};
    t.at.taken = ci_now_us();
    enum ci_task_end end;
    struct ci_error e = {{0}};
    const char *msg_id = ci_delivery_header(d, "Nats-Msg-Id");
    const char *ctype = ci_delivery_header(d, "Content-Type");
    size_t len = 0;
    const uint8_t *body = ci_delivery_data(d, &len);

    ci_status ct_status = ci_encoding_from_content_type(ctype, &t.enc, &e);
    ci_status dec_status = ct_status;
    if (!ct_status) {
        ProtobufCMessage *m = NULL;
        dec_status = ci_message_decode(t.enc, &ci__v1__execution_request__descriptor, body, len,
                                       &m, &e);
        if (!dec_status)
            t.req = (Ci__V1__ExecutionRequest *)m;
    } else {
        t.enc = CI_ENC_PROTOBUF;
    }

    if (!choose_id(&t, msg_id)) {
        /* Nobody could ever look up a result for it: drop it, loudly, with
         * at most 64 bytes of whatever id it had (a header can be MiBs). */
        char shown[65];
        size_t n = msg_id ? strnlen(msg_id, 64) : 0;
        while (n > 0 && msg_id[n] && ((unsigned char)msg_id[n] & 0xC0) == 0x80)
            n--; /* not inside a UTF-8 character */
        snprintf(shown, sizeof(shown), "%.*s", (int)n, msg_id ? msg_id : "");
        ci_log(CI_LOG_WARN, "task.dropped", "reason",
               t.req ? "the task id is missing or not [A-Za-z0-9_-]{1,64}"
                     : "undecodable body and no valid Nats-Msg-Id",
               "nats_msg_id", shown, NULL);
        ci_delivery_term(d);
        task_release(&t);
        ci_delivery_free(d);
        return CI_TASK_END_DROPPED;
    }
    slot_set(slot, t.id, d);
    if (batch_choose(&t) && !batch_taken(&t) && !ci_delivery_last_attempt(d)) {
        end = batch_retry(&t);
        goto out;
    }
    if (resumed && resumed->cancelled) { /* seen while it waited: the stream may lag */
        pthread_mutex_lock(&slot->lock);
        slot->cancel_requested = true;
        pthread_mutex_unlock(&slot->lock);
    }

    Ci__V1__ExecutionResult *prev = existing_result(&t);
    if (prev && ci_task_status_terminal(prev->status)) {
        /* Redelivered after it ended (a worker died before its ack, or
         * could not publish the terminal event and nak'ed). */
        ensure_terminal_event(&t, prev);
        bool told = batch_ended(&t, prev->status, prev->error);
        Ci__V1__TaskStatus was = prev->status;
        ci_message_free(&prev->base);
        if (!told && !ci_delivery_last_attempt(d)) {
            end = batch_retry(&t);
            goto out;
        }
        slot_detach(slot);
        ci_delivery_ack(d);
        ci_log(CI_LOG_INFO, "task.duplicate", "task_id", t.id, "status",
               ci_task_status_short(was), NULL);
        end = CI_TASK_END_DUPLICATE;
        goto out;
    }
    ci_message_free(prev ? &prev->base : NULL);

    int64_t published = ci_delivery_published_ms(d);
    if (published > 0) {
        t.queue_wait_ms = t.started_at_ms - published;
        ci_metrics_queue_wait(env->metrics, (double)t.queue_wait_ms / 1000.0);
    }
    const struct ci_log_field start[] = {
        CI_LOG_S("task_id", t.id),
        CI_LOG_N("attempt", ci_delivery_attempt(d)),
        CI_LOG_N("queue_wait_ms", t.queue_wait_ms),
    };
    ci_log_fields(CI_LOG_INFO, "task.start", start, sizeof(start) / sizeof(start[0]));
    struct result r;
    result_init(&r, &t, CI__V1__TASK_STATUS__TASK_STATUS_FAILED);
    if (dec_status) {
        result_fail(&r, "%s", e.msg);
        end = finish(&t, &r);
    } else if (t.bad_body_id) {
        char shown[65];
        show_bad_id(t.req->task_id, shown);
        result_fail(&r,
                    "task_id '%s' (%zu bytes) is not a task id: use 1 to 64 of A-Z, a-z, 0-9, "
                    "'_' and '-'; this result is stored under the Nats-Msg-Id",
                    shown, strlen(t.req->task_id));
        end = finish(&t, &r);
    } else {
        end = run_task(&t, &r);
    }
    result_release(&r);
    log_stages(&t);
out:
    slot_set(slot, NULL, NULL);
    task_release(&t);
    if (end != CI_TASK_END_WAIT) /* a waiting task's delivery stays the caller's */
        ci_delivery_free(d);
    return end;
}
