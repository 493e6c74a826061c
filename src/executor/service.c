/* service.c - /execute, /cancel/{taskId} and /healthz of ci-executor.
 *
 * Every running task has an entry in a list (under one lock) with its run
 * handle and its client's socket: /cancel finds it there, and a watchdog
 * thread polls the sockets every WATCH_MS for a client that hung up (a
 * worker that gave up on the answer), whose run it cancels. The run itself
 * happens on the connection's thread, from start to wait, as the sandbox
 * requires. */
#include "executor/service.h"

#include <inttypes.h>
#include <jansson.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ci/v1/executor.pb-c.h"
#include "core/codec.h"
#include "core/log.h"
#include "core/request.h"
#include "core/result.h"
#include "core/util.h"
#include "executor/sweep.h"

#define WATCH_MS 200
#define TOMBSTONES 256
#define TOMBSTONE_MS (120 * 1000)
#define SMALL_BODY 1024        /* /cancel and /healthz need none */
#define FRAMING (1024 * 1024)  /* names, labels, limits and tags around code and inputs */
#define SWEEP_MS 5000          /* longest wait for a bare task's leftovers to die */

struct entry {
    char id[65];
    int fd;
    struct ci_run *run; /* NULL until started */
    bool cancel_requested;
    bool client_gone;
    bool shutdown; /* cancelled because the instance stops: answered 500, the code ran */
    struct entry *next;
};

struct tombstone {
    char id[65];
    int64_t at_ms;
};

struct ci_service {
    const struct ci_config *cfg;
    struct ci_provider *provider;
    uint32_t max_running;
    char instance_id[128];
    struct ci_auth *auth;
    bool bare;
    struct ci_reaper *reaper; /* bare mode: reaps a task's orphans while it runs */

    pthread_mutex_t lock;
    struct entry *running;
    uint32_t n_running;
    struct tombstone tombs[TOMBSTONES];
    size_t next_tomb;

    pthread_t watchdog;
    bool watchdog_started;
    atomic_bool stopping;
    atomic_bool draining;
    /* Bare mode: a sweep left a process of a task alive. No task may run
     * beside it: every /execute is refused from then on, /healthz says so,
     * and main() stops the instance (the platform starts a fresh one). */
    atomic_bool unhealthy;

    /* Counters for /healthz. */
    atomic_uint_fast64_t c_requests, c_started, c_finished, c_succeeded, c_failed, c_timed_out,
        c_cancelled, c_rejected, c_busy, c_cancel_calls, c_cancel_hits, c_client_gone,
        c_unauthorized, c_leftovers_killed;
};

/* ---- the running list -------------------------------------------------- */

static void *watchdog_main(void *arg)
{
    struct ci_service *s = arg;
    while (!atomic_load(&s->stopping)) {
        pthread_mutex_lock(&s->lock);
        for (struct entry *e = s->running; e; e = e->next) {
            if (e->fd < 0 || !e->run || e->cancel_requested)
                continue;
            struct pollfd p = {.fd = e->fd, .events = POLLRDHUP};
            if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR))) {
                e->cancel_requested = true;
                e->client_gone = true;
                ci_provider_cancel(s->provider, e->run);
                atomic_fetch_add(&s->c_client_gone, 1);
            }
        }
        pthread_mutex_unlock(&s->lock);
        struct timespec ts = {0, WATCH_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static bool tombstoned(struct ci_service *s, const char *id)
{
    int64_t now = ci_mono_ms();
    for (size_t i = 0; i < TOMBSTONES; i++)
        if (s->tombs[i].id[0] && now - s->tombs[i].at_ms < TOMBSTONE_MS &&
            strcmp(s->tombs[i].id, id) == 0)
            return true;
    return false;
}

enum admit { ADMIT_OK, ADMIT_BUSY, ADMIT_DUPLICATE, ADMIT_CANCELLED, ADMIT_DRAINING,
             ADMIT_UNHEALTHY };

static enum admit admit(struct ci_service *s, struct entry *e)
{
    enum admit a = ADMIT_OK;
    pthread_mutex_lock(&s->lock);
    if (atomic_load(&s->unhealthy))
        a = ADMIT_UNHEALTHY;
    else if (atomic_load(&s->draining))
        a = ADMIT_DRAINING;
    else if (tombstoned(s, e->id))
        a = ADMIT_CANCELLED;
    for (struct entry *x = s->running; a == ADMIT_OK && x; x = x->next)
        if (strcmp(x->id, e->id) == 0)
            a = ADMIT_DUPLICATE;
    if (a == ADMIT_OK && s->n_running >= s->max_running)
        a = ADMIT_BUSY;
    if (a == ADMIT_OK) {
        e->next = s->running;
        s->running = e;
        s->n_running++;
    }
    pthread_mutex_unlock(&s->lock);
    return a;
}

/* Publishes the run of e (cancelling it at once if a cancel came first). */
static void entry_set_run(struct ci_service *s, struct entry *e, struct ci_run *run)
{
    pthread_mutex_lock(&s->lock);
    e->run = run;
    if (e->cancel_requested)
        ci_provider_cancel(s->provider, run);
    pthread_mutex_unlock(&s->lock);
}

/* From now on no cancel reaches the run of e (it is about to be freed). */
static void entry_clear_run(struct ci_service *s, struct entry *e)
{
    pthread_mutex_lock(&s->lock);
    e->run = NULL;
    pthread_mutex_unlock(&s->lock);
}

static void entry_remove(struct ci_service *s, struct entry *e)
{
    pthread_mutex_lock(&s->lock);
    for (struct entry **p = &s->running; *p; p = &(*p)->next)
        if (*p == e) {
            *p = e->next;
            s->n_running--;
            break;
        }
    e->run = NULL;
    pthread_mutex_unlock(&s->lock);
}

void ci_service_drain(struct ci_service *s) { atomic_store(&s->draining, true); }

bool ci_service_unhealthy(struct ci_service *s) { return atomic_load(&s->unhealthy); }

uint32_t ci_service_running(struct ci_service *s)
{
    pthread_mutex_lock(&s->lock);
    uint32_t n = s->n_running;
    pthread_mutex_unlock(&s->lock);
    return n;
}

void ci_service_cancel_all(struct ci_service *s)
{
    pthread_mutex_lock(&s->lock);
    for (struct entry *e = s->running; e; e = e->next) {
        e->cancel_requested = true;
        e->shutdown = true;
        if (e->run)
            ci_provider_cancel(s->provider, e->run);
    }
    pthread_mutex_unlock(&s->lock);
}

/* ---- the answer ---------------------------------------------------------- */

struct answer {
    Ci__Executor__V1__ExecuteResponse msg;
    Ci__V1__ExecutionResult res;
    Ci__V1__Usage usage;
    Ci__V1__Artifact *arts;
    Ci__V1__Artifact **art_ptrs;
    Ci__Executor__V1__ArtifactContent *contents;
    Ci__Executor__V1__ArtifactContent **content_ptrs;
    struct ci_result_text text;
};

static void answer_init(struct answer *a, const struct ci_service *s, const char *task_id,
                        const char *runtime, int64_t started_at)
{
    memset(a, 0, sizeof(*a));
    ci__executor__v1__execute_response__init(&a->msg);
    ci__v1__execution_result__init(&a->res);
    ci__v1__usage__init(&a->usage);
    a->msg.result = &a->res;
    a->res.task_id = (char *)task_id;
    a->res.worker = (char *)s->instance_id;
    a->res.runtime = (char *)(runtime && runtime[0] ? runtime : CI_DEFAULT_RUNTIME);
    a->res.started_at_ms = started_at;
    a->res.stdout = (char *)"";
    a->res.stderr = (char *)"";
    ci_result_text_init(&a->text, &a->res);
    a->res.isolation = (char *)"";
    a->res.usage = &a->usage;
}

static void answer_release(struct answer *a)
{
    free(a->arts);
    free(a->art_ptrs);
    free(a->contents);
    free(a->content_ptrs);
    ci_result_text_release(&a->text);
}

static void answer_error(struct answer *a, Ci__V1__TaskStatus status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void answer_error(struct answer *a, Ci__V1__TaskStatus status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->text.error, sizeof(a->text.error), fmt, ap);
    va_end(ap);
    a->res.status = status;
}

/* Fills the result from the outcome (result.h, as the worker does) and
 * adds the artifacts inline; they point into o, which must outlive the
 * encoding. */
static ci_status answer_outcome(struct answer *a, const struct ci_service *s,
                                const struct ci_outcome *o)
{
    if (ci_result_set_outcome(&a->res, &a->usage, &a->text, o, s->cfg->limits.max_output_bytes))
        return CI_ERR_NOMEM;
    /* The cloudrun provider does not carry outputs (contract §17): they
     * would only crowd the response's size budget. */
    a->res.n_outputs = 0;
    a->res.outputs_truncated = false;
    size_t n = o->n_artifacts;
    if (n == 0)
        return CI_OK;
    a->arts = calloc(n, sizeof(*a->arts));
    a->art_ptrs = calloc(n, sizeof(*a->art_ptrs));
    a->contents = calloc(n, sizeof(*a->contents));
    a->content_ptrs = calloc(n, sizeof(*a->content_ptrs));
    if (!a->arts || !a->art_ptrs || !a->contents || !a->content_ptrs)
        return CI_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const struct ci_artifact *src = &o->artifacts[i];
        ci__v1__artifact__init(&a->arts[i]);
        a->arts[i].name = src->name;
        a->arts[i].mime_type = src->mime_type;
        a->arts[i].size = src->len;
        a->arts[i].sha256 = (char *)src->sha256;
        a->arts[i].object = (char *)""; /* no object store here; the worker names it */
        a->art_ptrs[i] = &a->arts[i];
        ci__executor__v1__artifact_content__init(&a->contents[i]);
        a->contents[i].name = src->name;
        a->contents[i].content.data = src->data;
        a->contents[i].content.len = src->len;
        a->content_ptrs[i] = &a->contents[i];
    }
    a->res.artifacts = a->art_ptrs;
    a->res.n_artifacts = n;
    a->msg.contents = a->content_ptrs;
    a->msg.n_contents = n;
    return CI_OK;
}

static void count_status(struct ci_service *s, Ci__V1__TaskStatus st)
{
    switch (st) {
    case CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED: atomic_fetch_add(&s->c_succeeded, 1); break;
    case CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT: atomic_fetch_add(&s->c_timed_out, 1); break;
    case CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED: atomic_fetch_add(&s->c_cancelled, 1); break;
    default: atomic_fetch_add(&s->c_failed, 1); break;
    }
}

/* ---- routes ------------------------------------------------------------- */

static void rejected(struct ci_service *s, struct ci_httpd_response *resp, unsigned status,
                     const char *task_id, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void rejected(struct ci_service *s, struct ci_httpd_response *resp, unsigned status,
                     const char *task_id, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ci_httpd_error(resp, status, "%s", msg);
    /* A 500 comes after the code started: a failed run, not a refusal. */
    atomic_fetch_add(status == 429 ? &s->c_busy : status == 500 ? &s->c_failed : &s->c_rejected, 1);
    /* The reason may quote request text: only the status is logged. */
    ci_log_num(CI_LOG_INFO, "execute.rejected", "http_status", status, "task_id",
               task_id ? task_id : "", NULL);
}

static void num(char *out, size_t n, uint64_t v) { snprintf(out, n, "%" PRIu64, v); }

/* Bare mode: what one task left behind (out of its process group, by
 * setsid) is swept once the sandbox has reaped the task's own process,
 * before it reads the artifacts and removes the task's directory (the
 * job's bare_hooks, job.h). */
struct bare_sweep {
    struct ci_reaper *reaper;
    bool done;
    unsigned killed, left;
};

static void bare_task_started(void *ctx, pid_t task)
{
    struct bare_sweep *b = ctx;
    ci_reaper_watch(b->reaper, task);
}

static void bare_task_ended(void *ctx)
{
    struct bare_sweep *b = ctx;
    ci_reaper_unwatch(b->reaper);
    b->killed = ci_sweep_children(SWEEP_MS, &b->left);
    b->done = true;
}

/* After the run: sweeps now if the sandbox never did (no task process was
 * started), then counts and logs. Something still there after the sweep
 * (a process that cannot be killed, or a child that cannot be reaped) could
 * watch the next task: the instance takes no more. */
static void sweep_report(struct ci_service *s, const char *task_id, struct bare_sweep *b)
{
    if (!b->done)
        bare_task_ended(b);
    if (b->killed == 0 && b->left == 0)
        return;
    atomic_fetch_add(&s->c_leftovers_killed, b->killed);
    ci_log_num(b->left ? CI_LOG_ERROR : CI_LOG_WARN, "execute.leftovers_killed", "processes",
               b->killed, "task_id", task_id, "still_alive", b->left ? "true" : "false", NULL);
    if (b->left) {
        atomic_store(&s->unhealthy, true);
        ci_log_num(CI_LOG_ERROR, "executor.unhealthy", "children_left", b->left, "task_id",
                   task_id, "error",
                   "a process the task left is still there after the sweep; this instance "
                   "takes no more tasks and stops",
                   NULL);
    }
}

static void handle_execute(struct ci_service *s, const struct ci_httpd_request *hr,
                           struct ci_httpd_response *resp)
{
    int64_t t0 = ci_mono_ms();
    int64_t started_at = ci_now_ms();
    struct ci_error e = {{0}};
    enum ci_encoding enc;
    if (ci_encoding_from_content_type(hr->content_type, &enc, &e)) {
        rejected(s, resp, 415, NULL, "%s", e.msg);
        return;
    }
    ProtobufCMessage *m = NULL;
    if (ci_message_decode(enc, &ci__v1__execution_request__descriptor, hr->body, hr->body_len,
                          &m, &e)) {
        rejected(s, resp, 400, NULL, "the request is not a valid ExecutionRequest: %s", e.msg);
        return;
    }
    Ci__V1__ExecutionRequest *req = (Ci__V1__ExecutionRequest *)m;
    const char *id = req->task_id ? req->task_id : "";
    uint32_t timeout_ms = 0, memory_mb = 0;
    struct entry ent = {.fd = hr->client_fd};
    struct ci_run *run = NULL;
    struct ci_outcome o;
    memset(&o, 0, sizeof(o));
    struct answer a;
    bool admitted = false;
    uint64_t input_bytes = 0;

    if (!ci_task_id_valid(id)) {
        rejected(s, resp, 400, NULL, "task_id is required: 1 to 64 of A-Z, a-z, 0-9, '_' and '-'");
        goto out_free_req;
    }
    for (size_t i = 0; i < req->n_files; i++)
        if (req->files[i] && req->files[i]->source_case == CI__V1__INPUT_FILE__SOURCE_OBJECT) {
            rejected(s, resp, 400, id,
                     "input %zu names an object: the executor takes inputs inline only (the "
                     "worker fetches objects first)",
                     i + 1);
            goto out_free_req;
        } else if (req->files[i]) {
            input_bytes += req->files[i]->content.len;
        }
    ci_status vs = ci_request_validate(s->cfg, req, &timeout_ms, &memory_mb, &e);
    if (vs) {
        rejected(s, resp, vs == CI_ERR_LIMIT ? 413 : 400, id, "%s", e.msg);
        goto out_free_req;
    }

    snprintf(ent.id, sizeof(ent.id), "%s", id);
    answer_init(&a, s, id, req->runtime, started_at);
    switch (admit(s, &ent)) {
    case ADMIT_BUSY:
        if (s->bare)
            rejected(s, resp, 429, id,
                     "this executor instance runs one task at a time (no namespace sandbox, "
                     "local.isolation: none) and is busy; try again shortly");
        else
            rejected(s, resp, 429, id,
                     "this executor instance runs %u tasks, its limit; try again shortly",
                     s->max_running);
        resp->retry_after_s = 1;
        resp->not_run = true;
        goto out_answer;
    case ADMIT_DRAINING:
        rejected(s, resp, 503, id, "this executor instance is shutting down; run the task again");
        resp->not_run = true;
        goto out_answer;
    case ADMIT_UNHEALTHY:
        rejected(s, resp, 503, id,
                 "this executor instance could not end every process an earlier task left "
                 "(local.isolation: none) and takes no more tasks; run the task again");
        resp->not_run = true;
        goto out_answer;
    case ADMIT_DUPLICATE:
        /* Not run now, but sending it again once the other copy ends would
         * run the code twice: no Retry-After. */
        rejected(s, resp, 409, id, "task %s is already running on this executor instance", id);
        resp->not_run = true;
        goto out_answer;
    case ADMIT_CANCELLED:
        answer_error(&a, CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED,
                     "the task was cancelled before it ran");
        break;
    case ADMIT_OK:
        admitted = true;
        break;
    }

    atomic_fetch_add(&s->c_started, 1);
    struct bare_sweep sweep = {.reaper = s->reaper};
    const struct ci_bare_hooks bare_hooks = {
        .started = bare_task_started, .ended = bare_task_ended, .ctx = &sweep};
    if (admitted) {
        /* The connection waits for as long as the task runs. */
        ci_httpd_set_idle_timeout(hr, 0);
        struct ci_file *files = req->n_files ? calloc(req->n_files, sizeof(*files)) : NULL;
        if (req->n_files && !files) {
            answer_error(&a, CI__V1__TASK_STATUS__TASK_STATUS_FAILED,
                         "the executor ran out of memory");
        } else {
            for (size_t i = 0; i < req->n_files; i++) {
                files[i].name = req->files[i]->name;
                files[i].data = req->files[i]->content.data;
                files[i].len = req->files[i]->content.len;
            }
            struct ci_job job = {
                .task_id = id,
                .runtime = a.res.runtime,
                .code = req->code,
                .code_len = strlen(req->code),
                .files = files,
                .n_files = req->n_files,
                .timeout_ms = timeout_ms,
                .memory_mb = memory_mb,
                .bare_hooks = s->bare ? &bare_hooks : NULL,
            };
            if (ci_provider_start(s->provider, &job, &run, &e)) {
                answer_error(&a, CI__V1__TASK_STATUS__TASK_STATUS_FAILED, "%s", e.msg);
                run = NULL;
            } else {
                entry_set_run(s, &ent, run);
                if (ci_provider_wait(s->provider, run, &o)) {
                    ci_outcome_release(&o);
                    o.kind = CI_OUTCOME_ERROR;
                    o.error = strdup("the sandbox failed while running the code");
                }
            }
            free(files);
        }
        entry_clear_run(s, &ent);
        ci_provider_release(s->provider, run);
        if (s->bare)
            sweep_report(s, id, &sweep);
        /* Only now may the next task come in (bare: nothing of this one is left). */
        entry_remove(s, &ent);
        /* From here on the code has run: a failure is a 500, which no
         * worker sends again (never the not-run 503). */
        if (ent.shutdown && o.kind == CI_OUTCOME_CANCELLED) { /* not one that ended first */
            rejected(s, resp, 500, id,
                     "this executor instance was shut down while the task ran and stopped it "
                     "(worker.drain_timeout_s passed); the code may have run in part");
            goto out_answer;
        }
        if (run && answer_outcome(&a, s, &o)) {
            rejected(s, resp, 500, id, "the executor ran out of memory building the answer");
            goto out_answer;
        }
    }
    a.res.finished_at_ms = ci_now_ms();

    uint8_t *body = NULL;
    size_t body_len = 0;
    if (ci_message_encode(enc, &a.msg.base, &body, &body_len, &e)) {
        /* A 500 whether the code ran or not (cancelled before it ran). */
        rejected(s, resp, 500, id, "the executor could not encode the answer: %s", e.msg);
        goto out_answer;
    }
    resp->status = 200;
    resp->content_type = ci_encoding_content_type(enc);
    resp->body = body;
    resp->body_len = body_len;
    atomic_fetch_add(&s->c_finished, 1);
    count_status(s, a.res.status);

    char dur[24], reqb[24], respb[24], inb[24], codeb[24], nin[24], nart[24];
    num(dur, sizeof(dur), (uint64_t)(ci_mono_ms() - t0));
    num(reqb, sizeof(reqb), hr->body_len);
    num(respb, sizeof(respb), body_len);
    num(inb, sizeof(inb), input_bytes);
    num(codeb, sizeof(codeb), strlen(req->code));
    num(nin, sizeof(nin), req->n_files);
    num(nart, sizeof(nart), a.res.n_artifacts);
    ci_log_num(CI_LOG_INFO, "execute.done", "timeout_ms", timeout_ms, "task_id", id, "status",
               ci_task_status_short(a.res.status), "duration_ms", dur, "request_bytes", reqb,
               "response_bytes", respb, "code_bytes", codeb, "inputs", nin, "input_bytes", inb,
               "artifacts", nart, "auth", hr->has_authorization ? "present" : "absent",
               "client_gone", ent.client_gone ? "true" : "false", "isolation", a.res.isolation,
               NULL);
out_answer:
    answer_release(&a);
    ci_outcome_release(&o);
out_free_req:
    ci_message_free(m);
}

static void handle_cancel(struct ci_service *s, const char *id, struct ci_httpd_response *resp)
{
    atomic_fetch_add(&s->c_cancel_calls, 1);
    if (!ci_task_id_valid(id)) {
        ci_httpd_error(resp, 400, "the task id in /cancel/{taskId} must be 1 to 64 of A-Z, a-z, "
                                  "0-9, '_' and '-'");
        return;
    }
    bool found = false;
    pthread_mutex_lock(&s->lock);
    for (struct entry *e = s->running; e; e = e->next)
        if (strcmp(e->id, id) == 0) {
            found = true;
            e->cancel_requested = true;
            if (e->run)
                ci_provider_cancel(s->provider, e->run);
        }
    if (!found) {
        struct tombstone *t = &s->tombs[s->next_tomb++ % TOMBSTONES];
        snprintf(t->id, sizeof(t->id), "%s", id);
        t->at_ms = ci_mono_ms();
    }
    pthread_mutex_unlock(&s->lock);
    ci_log(CI_LOG_INFO, "cancel.request", "task_id", id, "running", found ? "true" : "false",
           NULL);
    if (!found) {
        ci_httpd_error(resp, 404, "task %s is not running on this executor instance; if it "
                                  "arrives within 2 minutes it will not run",
                       id);
        return;
    }
    atomic_fetch_add(&s->c_cancel_hits, 1);
    json_t *o = json_pack("{s:s, s:b}", "taskId", id, "cancelled", 1);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) {
        ci_httpd_error(resp, 503, "out of memory");
        return;
    }
    resp->status = 200;
    resp->content_type = "application/json";
    resp->body = (uint8_t *)text;
    resp->body_len = strlen(text);
}

static void handle_healthz(struct ci_service *s, struct ci_httpd_response *resp)
{
    bool unhealthy = atomic_load(&s->unhealthy);
#define C(x) (json_int_t) atomic_load(&s->x)
    json_t *o = json_pack("{s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
                          "s:I, s:I, s:s, s:s}",
                          "status", unhealthy ? "unhealthy" : "ok", "running", (json_int_t)ci_service_running(s),
                          "maxRunning", (json_int_t)s->max_running, "requests", C(c_requests),
                          "started", C(c_started), "finished", C(c_finished), "succeeded",
                          C(c_succeeded), "failed", C(c_failed), "timedOut", C(c_timed_out),
                          "cancelled", C(c_cancelled), "rejected", C(c_rejected), "busy",
                          C(c_busy), "cancelCalls", C(c_cancel_calls), "cancelHits",
                          C(c_cancel_hits), "clientGone", C(c_client_gone), "unauthorized",
                          C(c_unauthorized), "leftoversKilled", C(c_leftovers_killed), "auth",
                          s->auth ? "google-id-token" : "none", "isolation",
                          s->bare ? "none" : "sandbox");
#undef C
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) {
        ci_httpd_error(resp, 503, "out of memory");
        return;
    }
    /* 503 for a liveness probe: this instance must be replaced. */
    resp->status = unhealthy ? 503 : 200;
    resp->content_type = "application/json";
    resp->body = (uint8_t *)text;
    resp->body_len = strlen(text);
}

void ci_service_handle(void *ctx, const struct ci_httpd_request *req,
                       struct ci_httpd_response *resp)
{
    struct ci_service *s = ctx;
    atomic_fetch_add(&s->c_requests, 1);
    bool post = strcmp(req->method, "POST") == 0;
    bool get = strcmp(req->method, "GET") == 0 || strcmp(req->method, "HEAD") == 0;
    if (strcmp(req->path, "/execute") == 0) {
        if (post)
            handle_execute(s, req, resp);
        else
            ci_httpd_error(resp, 405, "use POST for /execute");
    } else if (strncmp(req->path, "/cancel/", 8) == 0) {
        if (post)
            handle_cancel(s, req->path + 8, resp);
        else
            ci_httpd_error(resp, 405, "use POST for /cancel/{taskId}");
    } else if (strcmp(req->path, "/healthz") == 0) {
        if (get)
            handle_healthz(s, resp);
        else
            ci_httpd_error(resp, 405, "use GET for /healthz");
    } else {
        ci_httpd_error(resp, 404, "no such endpoint: POST /execute, POST /cancel/{taskId} and "
                                  "GET /healthz are served");
    }
}

size_t ci_service_body_limit(void *ctx, const char *method, const char *path,
                             const char *content_type)
{
    struct ci_service *s = ctx;
    if (strcmp(method, "POST") != 0 || strcmp(path, "/execute") != 0)
        return SMALL_BODY;
    enum ci_encoding enc = CI_ENC_PROTOBUF;
    if (ci_encoding_from_content_type(content_type, &enc, NULL))
        return SMALL_BODY; /* answered 415 once read */
    uint64_t code = s->cfg->limits.max_code_bytes, inputs = s->cfg->limits.max_input_bytes;
    /* JSON: a character of code may take 6 bytes (\u0001), inputs are base64. */
    uint64_t limit = enc == CI_ENC_JSON ? code * 6 + (inputs + 2) / 3 * 4 + FRAMING
                                        : code + inputs + FRAMING;
    return limit > SIZE_MAX ? SIZE_MAX : (size_t)limit;
}

static const char *route_name(const char *path)
{
    return strcmp(path, "/execute") == 0        ? "/execute"
           : strncmp(path, "/cancel/", 8) == 0 ? "/cancel/{taskId}"
           : strcmp(path, "/healthz") == 0     ? "/healthz"
                                               : "other";
}

bool ci_service_authorize(void *ctx, const char *method, const char *path,
                          const char *authorization, bool *ret_trusted,
                          struct ci_httpd_response *resp)
{
    struct ci_service *s = ctx;
    /* No check here: whatever is in front checked (executor.auth none). */
    if (!s->auth) {
        *ret_trusted = true;
        return true;
    }
    /* Counters only, for probes that hold no token (kubelet, Cloud Run's):
     * open to anyone, so the connection stays untrusted. */
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (get && strcmp(path, "/healthz") == 0)
        return true;
    struct ci_auth_verdict v;
    ci_status st = ci_auth_check(s->auth, authorization, ci_now_ms() / 1000, &v);
    if (!st) {
        *ret_trusted = true;
        return true;
    }
    atomic_fetch_add(&s->c_requests, 1);
    atomic_fetch_add(&s->c_unauthorized, 1);
    if (st == CI_ERR_NOMEM) {
        ci_httpd_error(resp, 503, "the executor ran out of memory checking the ID token");
        resp->not_run = true;
        return false;
    }
    bool missing = strcmp(v.reason, "missing") == 0;
    /* Which check failed goes to the log only; the caller hears one word. */
    ci_log(CI_LOG_WARN, "auth.refused", "route", route_name(path), "reason", v.detail, "email",
           v.email, NULL);
    if (missing)
        ci_httpd_error(resp, 401, "a Google-signed ID token is required (Authorization: Bearer)");
    else
        ci_httpd_error(resp, 401, "the ID token was refused (%s)", v.reason);
    resp->www_authenticate = missing ? "Bearer realm=\"ci-executor\""
                                     : "Bearer realm=\"ci-executor\", error=\"invalid_token\"";
    return false;
}

void ci_service_edge_reject(void *ctx, const char *method, const char *path, unsigned status)
{
    struct ci_service *s = ctx;
    atomic_fetch_add(&s->c_requests, 1);
    atomic_fetch_add(&s->c_rejected, 1);
    /* The path is whatever the client sent: only a known route is named. */
    const char *route = route_name(path);
    ci_log_num(CI_LOG_INFO, "execute.rejected", "http_status", status, "method",
               strcmp(method, "POST") == 0 || strcmp(method, "GET") == 0 ? method : "other",
               "route", route, NULL);
}

ci_status ci_service_new(const struct ci_service_options *o, struct ci_service **ret,
                         struct ci_error *err)
{
    struct ci_service *s = calloc(1, sizeof(*s));
    if (!s)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    s->cfg = o->cfg;
    s->provider = o->provider;
    s->max_running = o->max_running ? o->max_running : 1;
    s->auth = o->auth;
    s->bare = o->bare;
    if (s->bare && s->max_running != 1) {
        free(s);
        return ci_error_set(err, CI_ERR_INVALID,
                            "without a namespace sandbox the executor runs one task at a time");
    }
    snprintf(s->instance_id, sizeof(s->instance_id), "%s", o->instance_id ? o->instance_id : "");
    if (s->bare) {
        ci_status rs = ci_reaper_new(&s->reaper, err);
        if (rs) {
            free(s);
            return rs;
        }
    }
    pthread_mutex_init(&s->lock, NULL);
    if (pthread_create(&s->watchdog, NULL, watchdog_main, s) != 0) {
        ci_service_free(s);
        return ci_error_set(err, CI_ERR_SYS, "cannot start the executor's watchdog thread");
    }
    s->watchdog_started = true;
    *ret = s;
    return CI_OK;
}

void ci_service_free(struct ci_service *s)
{
    if (!s)
        return;
    atomic_store(&s->stopping, true);
    if (s->watchdog_started)
        pthread_join(s->watchdog, NULL);
    ci_reaper_free(s->reaper);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
