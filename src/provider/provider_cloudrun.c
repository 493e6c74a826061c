/* provider_cloudrun.c - the `cloudrun` provider: every task goes to a
 * ci-executor service (POST <service_url>/execute, schemas/ci/v1/executor.proto)
 * with an OIDC ID token, and comes back as an outcome with its artifacts
 * inline, so that task.c stores it exactly as it stores a local run.
 *
 * Life of a run:
 *   start()  encodes the ExecutionRequest (inputs inline) and returns;
 *   wait()   sends it on the calling slot's thread. Each try has the
 *            whole of the task's time limit plus cloudrun.timeout_margin_ms
 *            for its answer, however long the task waited to be admitted.
 *            It tries again, with exponential backoff and jitter, while the
 *            admission deadline (the same limit plus margin, from the start
 *            of wait()) has not passed: that deadline decides only whether
 *            another try starts (cloudrun.max_attempts, 0 by default, can
 *            cap the tries),
 *            only what cannot have run the code: an ID token that could not
 *            be had for a reason that may pass (the metadata server could
 *            not be reached, or answered 5xx or 429: a 403, a 404, an answer
 *            that is not a JWT or a token file that cannot be read ends the
 *            run FAILED at once), a request that never left (no address, no connection,
 *            no TLS handshake: an executor restarting), and the answers 408,
 *            429, 502 and 503 (not run: busy, no instance, draining) and any
 *            5xx with the executor's "Ci-Not-Run: 1" (http.h). A request that
 *            went out is never sent again otherwise: ci-executor does not
 *            recognise a task it has already run, so a connection that
 *            breaks after sending, a 500 or a 504 ends the run FAILED saying
 *            the code may have run, and so does 409 (another copy of the
 *            task runs there: once it ends, the same request would run the
 *            code again). Any other 4xx ends it FAILED with the
 *            executor's reason. It always ends with an outcome: a service
 *            or token source that cannot be reached gives FAILED with an
 *            error that names it, never a lost or RUNNING task.
 *   cancel() marks the run; a queued POST /cancel/{taskId} (sent by a
 *            small canceller thread, since cancel() must not block) makes the
 *            executor kill the code and answer CANCELLED with the output so
 *            far. If that answer has not come CANCEL_GRACE_MS later, the
 *            transfer is aborted (the executor also cancels a run whose
 *            client went away) and the outcome is CANCELLED without output.
 *
 * Tokens live in idtoken.c and never reach an outcome or an error. */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "ci/v1/executor.pb-c.h"
#include "core/codec.h"
#include "core/config.h"
#include "provider/http.h"
#include "provider/idtoken.h"
#include "provider/provider_cloudrun.h"
#include "core/text.h"
#include "core/util.h"

#define CANCEL_GRACE_MS 1000   /* wait this long for the executor's CANCELLED answer */
#define CANCEL_CALL_TIMEOUT_MS 5000
#define CANCEL_QUEUE_MAX 1024
#define TOKEN_TIMEOUT_MS 10000 /* one metadata server request, at most */
#define REMOTE_TEXT_MAX 400    /* bytes kept of the executor's error text */
#define MAX_ARTIFACTS 4096
/* ci-executor's word that the code did not start (executor.proto). */
#define NOT_RUN_HEADER "Ci-Not-Run"

struct cancel_item {
    char task_id[65];
    struct cancel_item *next;
};

struct cloudrun {
    const struct ci_config *cfg;
    struct ci_http *http;
    struct ci_idtoken *tokens;
    char *base_url;    /* service_url without a trailing '/' */
    char *execute_url; /* base_url + "/execute" */
    size_t max_response;

    /* The canceller thread and its queue of task ids to POST /cancel. */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct cancel_item *head, *tail;
    size_t queued;
    bool stopping;
    bool thread_started;
    pthread_t thread;
};

struct ci_run {
    struct cloudrun *cr;
    char task_id[65];
    uint8_t *body; /* the encoded ExecutionRequest */
    size_t body_len;
    uint32_t timeout_ms;
    unsigned seed; /* jitter */

    pthread_mutex_t lock; /* the fields below; cancel() comes from other threads */
    pthread_cond_t cond;  /* wakes a backoff sleep on cancel */
    bool cancelled;
    int64_t cancel_at_ms; /* monotonic */
    bool sent;            /* an /execute request may have reached the executor */
    bool done;            /* wait() returned: cancel() does nothing */
};

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    char *s = NULL;
    if (vasprintf(&s, f, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

/* ---- the canceller ------------------------------------------------------ */

static void post_cancel(struct cloudrun *cr, const char *task_id)
{
    char *auth = NULL;
    if (ci_idtoken_header(cr->tokens, CANCEL_CALL_TIMEOUT_MS, NULL, NULL, &auth, NULL))
        return; /* best effort: the executor also stops a run whose client went away */
    char *url = fmt("%s/cancel/%s", cr->base_url, task_id);
    const char *headers[] = {auth, NULL};
    struct ci_http_request req = {
        .method = "POST",
        .url = url,
        .headers = headers,
        .timeout_ms = CANCEL_CALL_TIMEOUT_MS,
        .max_response_bytes = 64 * 1024,
    };
    struct ci_http_response resp;
    if (url && ci_http_do(cr->http, &req, &resp, NULL) == CI_OK)
        ci_http_response_release(&resp);
    free(url);
    ci_idtoken_header_free(auth);
}

static void *canceller_main(void *arg)
{
    struct cloudrun *cr = arg;
    pthread_mutex_lock(&cr->lock);
    while (!cr->stopping) {
        struct cancel_item *it = cr->head;
        if (!it) {
            pthread_cond_wait(&cr->cond, &cr->lock);
            continue;
        }
        cr->head = it->next;
        if (!cr->head)
            cr->tail = NULL;
        cr->queued--;
        pthread_mutex_unlock(&cr->lock);
        post_cancel(cr, it->task_id);
        free(it);
        pthread_mutex_lock(&cr->lock);
    }
    pthread_mutex_unlock(&cr->lock);
    return NULL;
}

static void queue_cancel(struct cloudrun *cr, const char *task_id)
{
    struct cancel_item *it = calloc(1, sizeof(*it));
    if (!it)
        return;
    snprintf(it->task_id, sizeof(it->task_id), "%s", task_id);
    pthread_mutex_lock(&cr->lock);
    if (cr->queued < CANCEL_QUEUE_MAX && !cr->stopping) {
        if (cr->tail)
            cr->tail->next = it;
        else
            cr->head = it;
        cr->tail = it;
        cr->queued++;
        it = NULL;
        pthread_cond_signal(&cr->cond);
    }
    pthread_mutex_unlock(&cr->lock);
    free(it);
}

/* ---- run state ---------------------------------------------------------- */

static bool abort_now(void *arg)
{
    struct ci_run *run = arg;
    pthread_mutex_lock(&run->lock);
    bool c = run->cancelled;
    pthread_mutex_unlock(&run->lock);
    return c;
}

/* During /execute: give the executor CANCEL_GRACE_MS to answer CANCELLED
 * (with the output so far) before dropping the connection. */
static bool abort_after_grace(void *arg)
{
    struct ci_run *run = arg;
    pthread_mutex_lock(&run->lock);
    bool c = run->cancelled && ci_mono_ms() - run->cancel_at_ms >= CANCEL_GRACE_MS;
    pthread_mutex_unlock(&run->lock);
    return c;
}

/* Sleeps ms unless the run is cancelled first; returns whether it was. */
static bool sleep_unless_cancelled(struct ci_run *run, uint32_t ms)
{
    struct timespec ts;
    ci_mono_deadline(&ts, ms);
    pthread_mutex_lock(&run->lock);
    while (!run->cancelled) {
        if (pthread_cond_timedwait(&run->cond, &run->lock, &ts) != 0)
            break; /* ETIMEDOUT */
    }
    bool c = run->cancelled;
    pthread_mutex_unlock(&run->lock);
    return c;
}

/* Marks the run as sent unless it was cancelled; returns false then. */
static bool mark_sent(struct ci_run *run)
{
    pthread_mutex_lock(&run->lock);
    bool ok = !run->cancelled;
    if (ok)
        run->sent = true;
    pthread_mutex_unlock(&run->lock);
    return ok;
}

/* ---- the answer --------------------------------------------------------- */

/* Printable text of at most max bytes from what a remote peer said. */
static char *remote_text(const char *s, size_t len, size_t max)
{
    if (len > max) {
        len = max;
        while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80)
            len--;
    }
    char *t = ci_utf8_sanitize((const uint8_t *)s, len, NULL);
    for (char *p = t; p && *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = ' ';
    return t;
}

/* The "error" of the executor's JSON error body, or NULL. */
static char *error_text(const struct ci_http_response *resp)
{
    if (!resp->body.data || resp->body.len == 0)
        return NULL;
    json_t *root = json_loadb((const char *)resp->body.data, resp->body.len, 0, NULL);
    const char *e = json_is_object(root) ? json_string_value(json_object_get(root, "error")) : NULL;
    char *t = e ? remote_text(e, strlen(e), REMOTE_TEXT_MAX) : NULL;
    json_decref(root);
    return t;
}

static ci_status set_error(struct ci_outcome *o, char *text)
{
    free(o->error);
    o->error = text;
    return text ? CI_OK : CI_ERR_NOMEM;
}

/* An artifact name from a remote peer: a relative path of UTF-8 without
 * control or format characters (the rule of the local walk, core/text.h),
 * backslashes, "..", "." or empty components; it becomes part of an object
 * name. */
static bool artifact_name_ok(const char *name)
{
    size_t len = strlen(name);
    if (len == 0 || len > 1024 || name[0] == '/' || name[len - 1] == '/')
        return false;
    bool ok = ci_text_name_check(name, len, NULL) == CI_TEXT_OK && !strchr(name, '\\');
    for (const char *seg = name; ok && seg;) {
        const char *slash = strchr(seg, '/');
        size_t n = slash ? (size_t)(slash - seg) : strlen(seg);
        ok = n > 0 && !(n == 1 && seg[0] == '.') && !(n == 2 && seg[0] == '.' && seg[1] == '.');
        seg = slash ? slash + 1 : NULL;
    }
    return ok;
}

/* Copies the artifacts of the answer into o after checking each one's
 * content against its name, size, type and digest. */
static ci_status take_artifacts(const struct cloudrun *cr, const Ci__Executor__V1__ExecuteResponse *resp,
                                struct ci_outcome *o, struct ci_error *err)
{
    const Ci__V1__ExecutionResult *res = resp->result;
    size_t n = res->n_artifacts;
    if (n == 0)
        return CI_OK;
    if (n > MAX_ARTIFACTS || resp->n_contents != n)
        return ci_error_set(err, CI_ERR_INTEGRITY,
                            "the executor listed %zu artifacts but sent %zu contents", n,
                            resp->n_contents);
    o->artifacts = calloc(n, sizeof(*o->artifacts));
    if (!o->artifacts)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const Ci__V1__Artifact *a = res->artifacts[i];
        const Ci__Executor__V1__ArtifactContent *c = resp->contents[i];
        if (!a || !c || !a->name || !c->name || strcmp(a->name, c->name) != 0)
            return ci_error_set(err, CI_ERR_INTEGRITY,
                                "the executor's artifact %zu has no matching content", i + 1);
        if (!artifact_name_ok(a->name))
            return ci_error_set(err, CI_ERR_INTEGRITY,
                                "the executor sent an artifact whose name is not a relative path");
        if (!a->mime_type || (strcmp(a->mime_type, "text/csv") != 0 &&
                              strcmp(a->mime_type, "image/png") != 0))
            return ci_error_set(err, CI_ERR_INTEGRITY,
                                "the executor sent an artifact that is neither CSV nor PNG");
        char sha[65];
        ci_sha256_hex(c->content.data ? c->content.data : (const uint8_t *)"", c->content.len,
                      sha);
        if (a->size != c->content.len || !a->sha256 || strcmp(a->sha256, sha) != 0)
            return ci_error_set(err, CI_ERR_INTEGRITY,
                                "artifact %zu from the executor does not match its size and "
                                "sha256 (damaged in transit)",
                                i + 1);
        total += c->content.len;
        if (total > cr->cfg->limits.max_artifact_bytes)
            return ci_error_set(err, CI_ERR_INTEGRITY,
                                "the executor sent more artifact bytes than limits.max_artifact_bytes");
        struct ci_artifact *dst = &o->artifacts[i];
        dst->name = strdup(a->name);
        dst->mime_type = strdup(a->mime_type);
        dst->data = malloc(c->content.len ? c->content.len : 1);
        o->n_artifacts = i + 1;
        if (!dst->name || !dst->mime_type || !dst->data)
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        if (c->content.len)
            memcpy(dst->data, c->content.data, c->content.len);
        dst->len = c->content.len;
        memcpy(dst->sha256, sha, sizeof(sha));
    }
    return CI_OK;
}

/* stdout or stderr of the result, cut to the worker's own cap. */
static ci_status take_stream(const struct cloudrun *cr, const char *text, uint64_t total,
                             bool truncated, char **ret, size_t *ret_len, uint64_t *ret_total)
{
    size_t len = text ? strlen(text) : 0;
    size_t cap = cr->cfg->limits.max_output_bytes;
    if (len > cap) {
        len = cap;
        while (len > 0 && ((unsigned char)text[len] & 0xC0) == 0x80)
            len--;
        truncated = true;
    }
    char *copy = malloc(len + 1);
    if (!copy)
        return CI_ERR_NOMEM;
    if (len)
        memcpy(copy, text, len);
    copy[len] = '\0';
    /* task.c derives "truncated" from total > len. */
    if (total < len || (truncated && total <= len))
        total = truncated ? (uint64_t)len + 1 : len;
    *ret = copy;
    *ret_len = len;
    *ret_total = total;
    return CI_OK;
}

/* Turns the executor's 200 answer into the outcome. */
static ci_status parse_answer(const struct cloudrun *cr, const struct ci_run *run,
                              const struct ci_http_response *http, struct ci_outcome *o,
                              struct ci_error *err)
{
    enum ci_encoding enc;
    struct ci_error e = {{0}};
    if (ci_encoding_from_content_type(http->content_type, &enc, &e))
        return ci_error_set(err, CI_ERR_INTEGRITY,
                            "the executor answered with an unexpected content type: %s", e.msg);
    ProtobufCMessage *m = NULL;
    if (ci_message_decode(enc, &ci__executor__v1__execute_response__descriptor, http->body.data,
                          http->body.len, &m, &e))
        return ci_error_set(err, CI_ERR_INTEGRITY, "the executor's answer cannot be decoded: %s",
                            e.msg);
    Ci__Executor__V1__ExecuteResponse *resp = (Ci__Executor__V1__ExecuteResponse *)m;
    const Ci__V1__ExecutionResult *res = resp->result;
    ci_status s = CI_OK;
    if (!res) {
        s = ci_error_set(err, CI_ERR_INTEGRITY, "the executor's answer holds no result");
        goto out;
    }
    if (!res->task_id || strcmp(res->task_id, run->task_id) != 0) {
        s = ci_error_set(err, CI_ERR_INTEGRITY, "the executor answered for another task");
        goto out;
    }
    bool has_exit = res->_exit_code_case == CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE;
    o->has_exit_code = has_exit;
    o->exit_code = has_exit ? res->exit_code : 0;
    switch (res->status) {
    case CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED:
        o->kind = CI_OUTCOME_EXITED;
        o->has_exit_code = true;
        o->exit_code = 0;
        break;
    case CI__V1__TASK_STATUS__TASK_STATUS_FAILED:
        /* A non-zero exit (memory kills included: the error and hint say
         * so, and task.c gives both kinds the same FAILED result), or a
         * failure before or around the code. */
        o->kind = has_exit && res->exit_code != 0 ? CI_OUTCOME_EXITED : CI_OUTCOME_ERROR;
        break;
    case CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT: o->kind = CI_OUTCOME_TIMED_OUT; break;
    case CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED: o->kind = CI_OUTCOME_CANCELLED; break;
    default:
        s = ci_error_set(err, CI_ERR_INTEGRITY, "the executor answered with status %s",
                         ci_task_status_name(res->status));
        goto out;
    }
    if ((s = take_stream(cr, res->stdout, res->stdout_total_bytes, res->stdout_truncated, &o->out,
                         &o->out_len, &o->out_total)) ||
        (s = take_stream(cr, res->stderr, res->stderr_total_bytes, res->stderr_truncated, &o->err,
                         &o->err_len, &o->err_total))) {
        ci_error_set(err, s, "out of memory");
        goto out;
    }
    if (res->error && res->error[0] &&
        !(o->error = remote_text(res->error, strlen(res->error), 1000))) {
        s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (res->hint && res->hint[0] && !(o->hint = remote_text(res->hint, strlen(res->hint), 1000))) {
        s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (o->kind == CI_OUTCOME_ERROR && !o->error &&
        !(o->error = strdup("the executor reported a failure without a reason"))) {
        s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        goto out;
    }
    if (res->usage) {
        o->duration_ms = res->usage->duration_ms;
        o->cpu_ms = res->usage->cpu_ms;
        o->memory_mb = res->usage->memory_mb;
    }
    size_t k = 0;
    for (const char *p = res->isolation ? res->isolation : ""; *p && k + 1 < sizeof(o->isolation);
         p++)
        if ((unsigned char)*p > 0x20 && *p != 0x7f && (unsigned char)*p < 0x80)
            o->isolation[k++] = *p;
    o->isolation[k] = '\0';
    s = take_artifacts(cr, resp, o, err);
out:
    ci_message_free(m);
    return s;
}

/* ---- the provider ------------------------------------------------------- */

static ci_status cr_start(void *ctx, const struct ci_job *job, struct ci_run **ret_run,
                          struct ci_error *err)
{
    struct cloudrun *cr = ctx;
    Ci__V1__ExecutionRequest req = CI__V1__EXECUTION_REQUEST__INIT;
    Ci__V1__Limits limits = CI__V1__LIMITS__INIT;
    req.task_id = (char *)job->task_id;
    req.language = (char *)"python";
    req.code = (char *)job->code;
    req.runtime = (char *)(job->runtime ? job->runtime : "");
    limits.timeout_ms = job->timeout_ms;
    limits.memory_mb = job->memory_mb;
    req.limits = &limits;
    CI_AUTOFREE Ci__V1__InputFile *files = NULL;
    CI_AUTOFREE Ci__V1__InputFile **file_ptrs = NULL;
    if (job->n_files) {
        files = calloc(job->n_files, sizeof(*files));
        file_ptrs = calloc(job->n_files, sizeof(*file_ptrs));
        if (!files || !file_ptrs)
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < job->n_files; i++) {
            ci__v1__input_file__init(&files[i]);
            files[i].name = job->files[i].name;
            files[i].source_case = CI__V1__INPUT_FILE__SOURCE_CONTENT;
            files[i].content.data = job->files[i].data;
            files[i].content.len = job->files[i].len;
            file_ptrs[i] = &files[i];
        }
        req.files = file_ptrs;
        req.n_files = job->n_files;
    }
    if (!job->timeout_ms || !job->memory_mb) /* request.h defaults them */
        return ci_error_set(err, CI_ERR_INVALID, "the job has no time or memory limit");
    CI_AUTOFREE struct ci_run *run = calloc(1, sizeof(*run));
    if (!run)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    ci_status s = ci_message_encode(CI_ENC_PROTOBUF, &req.base, &run->body, &run->body_len, err);
    if (s)
        return s;
    run->cr = cr;
    snprintf(run->task_id, sizeof(run->task_id), "%s", job->task_id);
    run->timeout_ms = job->timeout_ms;
    run->seed = (unsigned)ci_mono_ms() ^ (unsigned)(uintptr_t)run;
    pthread_mutex_init(&run->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&run->cond, &ca);
    pthread_condattr_destroy(&ca);
    *ret_run = CI_STEAL(&run);
    return CI_OK;
}

/* The outcome of a run that will get no answer from the executor. */
static ci_status end_error(struct ci_outcome *o, char *text)
{
    o->kind = CI_OUTCOME_ERROR;
    return set_error(o, text);
}

static ci_status end_cancelled(struct ci_outcome *o)
{
    o->kind = CI_OUTCOME_CANCELLED;
    return set_error(o, strdup("the task was cancelled"));
}

/* Why the last try failed, for the sentence that ends a run that never got
 * an answer: the token source and the service are different things to fix. */
enum last_failure { LAST_NONE, LAST_TOKEN, LAST_SERVICE };

/* The outcome of a run whose tries all failed before the service ran it. */
static ci_status end_unreachable(struct ci_outcome *o, const struct cloudrun *cr,
                                 enum last_failure kind, const char *last, uint32_t tries,
                                 int64_t elapsed_ms, bool out_of_tries)
{
    double s = (double)elapsed_ms / 1000.0;
    const char *until = out_of_tries ? "cloudrun.max_attempts" : "the task's deadline";
    if (kind == LAST_TOKEN)
        return end_error(o, fmt("%s (%u tries in %.1f s, until %s; the executor service was not "
                                "called)",
                                last, tries, s, until));
    if (out_of_tries)
        return end_error(o, fmt("the executor service at %s could not be reached after %u "
                                "attempts in %.1f s: %s",
                                cr->base_url, tries, s, last[0] ? last : "no answer"));
    return end_error(o, fmt("the executor service at %s could not be reached within the task's "
                            "deadline (%u attempts in %.1f s): %s",
                            cr->base_url, tries, s, last[0] ? last : "no answer"));
}

static ci_status cr_wait(void *ctx, struct ci_run *run, struct ci_outcome *ret)
{
    struct cloudrun *cr = ctx;
    const struct ci_config *cfg = cr->cfg;
    int64_t t0 = ci_mono_ms();
    /* Each try gets all of this for its answer: time spent waiting to be
     * admitted (429, a restarting executor) must not shorten the run. */
    uint32_t attempt_ms = run->timeout_ms + cfg->cloudrun.timeout_margin_ms;
    /* Until then a new try may start (how long to keep trying to get the
     * task admitted); a try that started runs its course. */
    int64_t deadline = t0 + attempt_ms;
    struct ci_outcome o;
    memset(&o, 0, sizeof(o));
    char last[512] = "";
    enum last_failure last_kind = LAST_NONE;
    uint32_t attempt = 0;
    bool token_retried = false;
    ci_status s = CI_OK;

    for (;;) {
        attempt++;
        struct ci_error e = {{0}};
        int64_t left = deadline - ci_mono_ms();
        if (left <= 0) {
            s = end_unreachable(&o, cr, last_kind, last, attempt - 1, ci_mono_ms() - t0, false);
            break;
        }
        char *auth = NULL;
        ci_status ts = ci_idtoken_header(cr->tokens,
                                         (uint32_t)(left < TOKEN_TIMEOUT_MS ? left : TOKEN_TIMEOUT_MS),
                                         abort_now, run, &auth, &e);
        if (ts == CI_ERR_CANCELLED) {
            s = end_cancelled(&o);
            break;
        }
        if (ts == CI_ERR_NOMEM) {
            s = CI_ERR_NOMEM;
            break;
        }
        if (ts == CI_ERR_HTTP || ts == CI_ERR_TIMEOUT || ts == CI_ERR_NOT_FOUND) {
            /* The metadata server could not be reached, or failed (5xx,
             * 429), or the token file is not written yet: it may be there
             * the next time. idtoken.c names the source. */
            snprintf(last, sizeof(last), "%s", e.msg);
            last_kind = LAST_TOKEN;
            goto retry;
        }
        if (ts) {
            /* A 403/404, an answer that is not a JWT, a token file that
             * exists but cannot be read: asking again gives the same. */
            s = end_error(&o, fmt("%s (the executor service was not called)", e.msg));
            break;
        }
        if (!mark_sent(run)) {
            ci_idtoken_header_free(auth);
            s = end_cancelled(&o);
            break;
        }

        const char *headers[] = {auth, "Content-Type: application/protobuf",
                                 "Accept: application/protobuf", NULL};
        bool sent = false;
        struct ci_http_request req = {
            .method = "POST",
            .url = cr->execute_url,
            .headers = headers,
            .body = run->body,
            .body_len = run->body_len,
            .timeout_ms = attempt_ms,
            .max_response_bytes = cr->max_response,
            .should_abort = abort_after_grace,
            .abort_arg = run,
            /* ci-executor does not recognise a task it has already run:
             * once the request is out, it is never sent again. */
            .no_resend = true,
            .ret_sent = &sent,
            .keep_header = NOT_RUN_HEADER,
        };
        struct ci_http_response resp;
        int64_t sent_at = ci_mono_ms();
        ci_status hs = ci_http_do(cr->http, &req, &resp, &e);
        ci_idtoken_header_free(auth);
        if (hs == CI_ERR_CANCELLED) {
            s = end_cancelled(&o);
            break;
        }
        if (hs == CI_ERR_NOMEM) {
            s = CI_ERR_NOMEM;
            break;
        }
        if ((hs == CI_ERR_HTTP || hs == CI_ERR_TIMEOUT) && !sent) {
            /* No address, no connection, no TLS: the request never left,
             * so the code cannot have run. Worth trying until the deadline
             * (an executor restarting, a front without an instance yet). */
            snprintf(last, sizeof(last), "%s", e.msg);
            last_kind = LAST_SERVICE;
            goto retry;
        }
        if (hs == CI_ERR_TIMEOUT) {
            s = end_error(&o, fmt("the executor service at %s did not answer within %" PRId64
                                  " ms (the task's time limit of %u ms plus "
                                  "cloudrun.timeout_margin_ms)",
                                  cr->base_url, ci_mono_ms() - sent_at, run->timeout_ms));
            break;
        }
        if (hs == CI_ERR_HTTP) {
            s = end_error(&o, fmt("the connection to the executor service at %s broke after the "
                                  "task was sent (%s); the code may have run, and the executor "
                                  "does not recognise a task it has already run, so it is not "
                                  "sent again: submit the task again if running it twice is safe",
                                  cr->base_url, e.msg));
            break;
        }
        if (hs) { /* CI_ERR_LIMIT, CI_ERR_INVALID: trying again would not help */
            s = end_error(&o, fmt("the executor service at %s failed: %s", cr->base_url, e.msg));
            break;
        }

        if (resp.status == 200) {
            struct ci_outcome got;
            memset(&got, 0, sizeof(got));
            ci_status ps = parse_answer(cr, run, &resp, &got, &e);
            ci_http_response_release(&resp);
            if (ps == CI_ERR_NOMEM) {
                ci_outcome_release(&got);
                s = CI_ERR_NOMEM;
                break;
            }
            if (ps) {
                ci_outcome_release(&got);
                s = end_error(&o, fmt("the executor's answer was not usable: %s", e.msg));
                break;
            }
            ci_outcome_release(&o);
            o = got;
            break;
        }
        char *why = error_text(&resp);
        long status = resp.status;
        bool not_run = strcmp(resp.kept_header, "1") == 0;
        ci_http_response_release(&resp);
        if ((status == 401 || status == 403) && !token_retried) {
            /* An expired or revoked token: one more try with a fresh one.
             * Cloud Run refuses it before the request reaches the executor. */
            token_retried = true;
            ci_idtoken_invalidate(cr->tokens);
            snprintf(last, sizeof(last), "the service refused the ID token (HTTP %ld)", status);
            last_kind = LAST_SERVICE;
            free(why);
            goto retry;
        }
        if (status == 401 || status == 403) {
            free(why);
            s = end_error(&o, fmt("the executor service at %s refused the worker's ID token "
                                  "(HTTP %ld): the worker's service account needs "
                                  "roles/run.invoker on the service, and cloudrun.audience must "
                                  "be the service's URL",
                                  cr->base_url, status));
            break;
        }
        if (status == 409) {
            s = end_error(&o, fmt("the executor service at %s is already running another copy of "
                                  "this task (HTTP 409: %s), e.g. one sent for an earlier "
                                  "delivery; it is not sent again, so that the code does not run "
                                  "twice",
                                  cr->base_url, why ? why : "no reason given"));
            free(why);
            break;
        }
        if (ci_http_status_retryable(status, not_run)) {
            snprintf(last, sizeof(last), "the service answered HTTP %ld%s%s%s", status,
                     not_run ? " (not run)" : "", why ? ": " : "", why ? why : "");
            last_kind = LAST_SERVICE;
            free(why);
            goto retry;
        }
        if (status >= 500) {
            s = end_error(&o, fmt("the executor service at %s answered HTTP %ld (%s); the code may "
                                  "have run, so the task is not sent again",
                                  cr->base_url, status, why ? why : "no reason given"));
            free(why);
            break;
        }
        s = end_error(&o, fmt("the executor refused the task (HTTP %ld): %s", status,
                              why ? why : "no reason given"));
        free(why);
        break;

    retry:
        if (cfg->cloudrun.max_attempts && attempt >= cfg->cloudrun.max_attempts) {
            s = end_unreachable(&o, cr, last_kind, last, attempt, ci_mono_ms() - t0, true);
            break;
        }
        uint32_t delay = ci_http_backoff_ms(attempt, cfg->cloudrun.backoff_initial_ms,
                                            cfg->cloudrun.backoff_max_ms,
                                            (uint32_t)rand_r(&run->seed));
        if (ci_mono_ms() + delay >= deadline) {
            s = end_unreachable(&o, cr, last_kind, last, attempt, ci_mono_ms() - t0, false);
            break;
        }
        if (sleep_unless_cancelled(run, delay)) {
            s = end_cancelled(&o);
            break;
        }
    }

    pthread_mutex_lock(&run->lock);
    run->done = true;
    pthread_mutex_unlock(&run->lock);
    if (s) {
        ci_outcome_release(&o);
        return s;
    }
    *ret = o;
    return CI_OK;
}

static void cr_cancel(void *ctx, struct ci_run *run)
{
    struct cloudrun *cr = ctx;
    if (!run)
        return;
    pthread_mutex_lock(&run->lock);
    bool send = false;
    if (!run->done && !run->cancelled) {
        run->cancelled = true;
        run->cancel_at_ms = ci_mono_ms();
        pthread_cond_broadcast(&run->cond);
        send = run->sent;
    }
    pthread_mutex_unlock(&run->lock);
    if (send)
        queue_cancel(cr, run->task_id);
}

static void cr_release(void *ctx, struct ci_run *run)
{
    (void)ctx;
    if (!run)
        return;
    pthread_mutex_destroy(&run->lock);
    pthread_cond_destroy(&run->cond);
    free(run->body);
    free(run);
}

static void cr_destroy(void *ctx)
{
    struct cloudrun *cr = ctx;
    if (!cr)
        return;
    if (cr->thread_started) {
        pthread_mutex_lock(&cr->lock);
        cr->stopping = true;
        pthread_cond_signal(&cr->cond);
        pthread_mutex_unlock(&cr->lock);
        pthread_join(cr->thread, NULL);
    }
    for (struct cancel_item *it = cr->head, *next; it; it = next) {
        next = it->next;
        free(it);
    }
    pthread_mutex_destroy(&cr->lock);
    pthread_cond_destroy(&cr->cond);
    ci_idtoken_free(cr->tokens);
    ci_http_free(cr->http);
    free(cr->base_url);
    free(cr->execute_url);
    free(cr);
}

static const struct ci_provider_ops cloudrun_ops = {
    .name = "cloudrun",
    .start = cr_start,
    .wait = cr_wait,
    .cancel = cr_cancel,
    .release = cr_release,
    .destroy = cr_destroy,
};

ci_status ci_provider_cloudrun_new(const struct ci_config *cfg, struct ci_provider **ret,
                                   struct ci_error *err)
{
    const char *url = cfg->cloudrun.service_url;
    if (!url || (strncmp(url, "https://", 8) != 0 && strncmp(url, "http://", 7) != 0) ||
        strlen(url) < 9)
        return ci_error_set(err, CI_ERR_INVALID,
                            "cloudrun.service_url must be the executor service's URL "
                            "(https://...) when worker.provider is cloudrun");
    for (const char *p = url; *p; p++)
        if ((unsigned char)*p <= 0x20 || (unsigned char)*p >= 0x7f || *p == '?' || *p == '#')
            return ci_error_set(err, CI_ERR_INVALID,
                                "cloudrun.service_url must be a plain base URL without spaces, "
                                "query or fragment");
    CI_AUTOFREE struct ci_provider *p = calloc(1, sizeof(*p));
    struct cloudrun *cr = calloc(1, sizeof(*cr));
    if (!p || !cr) {
        free(cr);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    }
    cr->cfg = cfg;
    pthread_mutex_init(&cr->lock, NULL);
    pthread_cond_init(&cr->cond, NULL);
    size_t n = strlen(url);
    while (n > 0 && url[n - 1] == '/')
        n--;
    cr->base_url = strndup(url, n);
    cr->execute_url = cr->base_url ? fmt("%s/execute", cr->base_url) : NULL;
    if (!cr->base_url || !cr->execute_url) {
        cr_destroy(cr);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    }
    /* Room for both streams (UTF-8 repair can triple invalid bytes), the
     * artifacts, and the framing of the result. */
    cr->max_response = (size_t)cfg->limits.max_output_bytes * 6 +
                       (size_t)cfg->limits.max_artifact_bytes + 1024 * 1024;

    uint32_t slots = ci_config_slots(cfg);
    struct ci_http_options ho = {
        .ca_file = cfg->cloudrun.ca_file,
        .connect_timeout_ms = cfg->cloudrun.connect_timeout_ms,
        .max_idle = slots + 2, /* every slot, plus the canceller and a token fetch */
    };
    ci_status s = ci_http_new(&ho, &cr->http, err);
    if (s) {
        cr_destroy(cr);
        return s;
    }
    struct ci_idtoken_options to = {
        .metadata_url = cfg->cloudrun.metadata_url,
        .audience = cfg->cloudrun.audience[0] ? cfg->cloudrun.audience : cr->base_url,
        .token_file = cfg->cloudrun.token_file,
        .refresh_margin_s = cfg->cloudrun.token_refresh_margin_s,
    };
    if ((s = ci_idtoken_new(cr->http, &to, &cr->tokens, err))) {
        cr_destroy(cr);
        return s;
    }
    if (pthread_create(&cr->thread, NULL, canceller_main, cr) != 0) {
        cr_destroy(cr);
        return ci_error_set(err, CI_ERR_SYS, "cannot start the cloudrun canceller thread");
    }
    cr->thread_started = true;
    p->ops = &cloudrun_ops;
    p->ctx = cr;
    if (err)
        err->msg[0] = '\0';
    *ret = CI_STEAL(&p);
    return CI_OK;
}
