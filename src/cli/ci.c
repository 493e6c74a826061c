/* ci - the command-line client: submit Python to the workers, wait, print
 * the output, save the artifacts. See `ci --help`. */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli/batch.h"
#include "cli/batch_client.h"
#include "cli/client.h"
#include "cli/follow.h"
#include "cli/mcp.h"
#include "cli/progress.h"
#include "cli/tools.h"
#include "nats/broker.h"
#include "core/codec.h"
#include "core/config.h"
#include "nats/heartbeat.h"
#include "nats/objstore.h"
#include "core/request.h"
#include "core/session.h"
#include "core/text.h"
#include "core/util.h"

#define MAX_FILES CI_CLIENT_MAX_FILES
#define MAX_LABELS CI_CLIENT_MAX_LABELS
#define MAX_READ (64u * 1024 * 1024)

/* Exit codes of ci itself when the script's own code does not apply. */
#define EXIT_USAGE 2
#define EXIT_INFRA 3
#define EXIT_TIMEOUT 124
#define EXIT_CANCELLED 130

struct opts {
    const char *config;
    const char *url;
    const char *id;
    const char *session;    /* --session: run as that session's next step */
    const char *session_id; /* `ci session show|close ID` */
    const char *files[MAX_FILES];
    size_t n_files;
    const char *labels[MAX_LABELS];
    size_t n_labels;
    uint32_t timeout_ms;
    uint32_t memory_mb;
    int64_t wait_ms;
    bool wait_set;          /* --wait-ms given (ci mcp has a shorter default) */
    int64_t retry_ms;       /* batch wait: how long NATS may not answer */
    bool retry_set;
    const char *save_dir;   /* ci mcp --save-dir */
    const char *format;     /* ci tools --format */
    bool json;
    bool wire_json;
    bool no_save;
    bool output; /* watch: follow the output instead of printing events */
    bool timeout_set, memory_set;
    /* ci batch: the options, and the command checked before connecting */
    const char *file_each;
    const char *batch;
    bool jsonl;
    const char *jsonl_file;
    struct ci_batch_cmd batch_cmd;
};

/* ci_client_put_text: escaped to a terminal, as they are elsewhere. */
static void put_text(FILE *f, const char *s, size_t len) { ci_client_put_text(f, s, len); }

/* printf to f through put_text(): every line ci writes for a person, so
 * that no quoted text is missed. */
__attribute__((format(printf, 2, 3))) static void say(FILE *f, const char *fmt, ...)
{
    char *text = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&text, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    put_text(f, text, (size_t)n);
    free(text);
}

/* The base64 PNG an output holds inline (contract §17), or NULL. */
static const char *output_png(const Ci__V1__Output *out)
{
    for (size_t j = 0; j < out->n_data; j++)
        if (strcmp(out->data[j]->key, "image/png") == 0)
            return out->data[j]->value;
    return NULL;
}

/* Each output's text/plain, as a notebook shows it after the cell's prints;
 * an image kept as an artifact is named. */
static void print_outputs(FILE *f, const Ci__V1__ExecutionResult *r)
{
    for (size_t i = 0; i < r->n_outputs; i++) {
        const Ci__V1__Output *out = r->outputs[i];
        for (size_t j = 0; j < out->n_data; j++) {
            const char *v = out->data[j]->value;
            if (strcmp(out->data[j]->key, "text/plain") != 0)
                continue;
            put_text(f, v, strlen(v));
            if (!*v || v[strlen(v) - 1] != '\n')
                fputc('\n', f);
        }
        if (out->artifact[0])
            say(f, "[image: artifact %s]\n", out->artifact);
        else if (output_png(out))
            say(f, "[image: output %zu, inline PNG]\n", i + 1);
    }
}

/* An inline image is saved as inline-N.png beside the artifacts, so that a
 * figure the code ended with is not lost to a terminal user. The runtime
 * names the images it stores as artifacts output-N.png; a name an
 * artifact has (the code may write any) is never overwritten. */
static int save_output_images(const Ci__V1__ExecutionResult *r)
{
    int failures = 0;
    for (size_t i = 0; i < r->n_outputs; i++) {
        const char *b64 = output_png(r->outputs[i]);
        if (!b64 || r->outputs[i]->artifact[0])
            continue;
        char name[64];
        snprintf(name, sizeof(name), "inline-%zu.png", i + 1);
        bool taken = false;
        for (size_t k = 0; k < r->n_artifacts; k++)
            taken |= strcmp(r->artifacts[k]->name, name) == 0;
        if (taken) {
            say(stderr, "ci: output %zu: its image is not saved: an artifact is named %s\n",
                i + 1, name);
            continue;
        }
        CI_AUTOFREE uint8_t *data = NULL;
        size_t len = 0;
        if (ci_base64_decode(b64, strlen(b64), CI_B64_STD, &data, &len)) {
            say(stderr, "ci: output %zu: its image is not base64; not saved\n", i + 1);
            failures++;
            continue;
        }
        int fd = ci_client_open_artifact(AT_FDCWD, name);
        if (fd < 0 || ci_write_all(fd, data, len)) {
            say(stderr, "ci: cannot write '%s': %s\n", name, strerror(errno));
            failures++;
        } else {
            say(stderr, "ci: saved %s (%zu bytes; the image of output %zu)\n", name, len, i + 1);
        }
        if (fd >= 0)
            close(fd);
    }
    return failures;
}

/* Reads the script and submits it with the options' inputs and labels. */
static int submit(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                  const char *script, char task_id[65])
{
    struct ci_error e = {{0}};
    CI_AUTOFREE uint8_t *code = NULL;
    size_t code_len = 0;
    if (ci_client_read_file(script, cfg->limits.max_code_bytes, &code, &code_len, &e)) {
        say(stderr, "ci: %s\n", e.msg);
        return EXIT_USAGE;
    }
    if (memchr(code, 0, code_len)) {
        say(stderr, "ci: '%s' holds a NUL byte, so it is not Python source\n", script);
        return EXIT_USAGE;
    }
    struct ci_submit_args a = {
        .code = (const char *)code, .code_len = code_len, .id = o->id, .session = o->session,
        .files = o->files, .n_files = o->n_files, .labels = o->labels, .n_labels = o->n_labels,
        .timeout_ms = o->timeout_ms, .memory_mb = o->memory_mb, .wire_json = o->wire_json,
    };
    bool dup = false;
    ci_status s = ci_client_submit(b, cfg, &a, task_id, &dup, &e);
    if (s) {
        say(stderr, "ci: %s\n", e.msg);
        return s == CI_ERR_INVALID ? EXIT_USAGE : EXIT_INFRA;
    }
    if (dup)
        say(stderr, "ci: task %s was already submitted; not queued again\n", task_id);
    return 0;
}

static ci_status get_result(struct ci_broker *b, const char *id, Ci__V1__ExecutionResult **ret,
                            struct ci_error *err)
{
    return ci_client_result_get(b, id, ret, err);
}

static void print_json(const ProtobufCMessage *m)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    struct ci_error e = {{0}};
    if (ci_message_encode(CI_ENC_JSON, m, &buf, &len, &e)) {
        say(stderr, "ci: %s\n", e.msg);
        return;
    }
    fwrite(buf, 1, len, stdout);
    fputc('\n', stdout);
    free(buf);
}

static int save_artifacts(struct ci_broker *b, const Ci__V1__ExecutionResult *r)
{
    int failures = 0;
    for (size_t i = 0; i < r->n_artifacts; i++) {
        const Ci__V1__Artifact *a = r->artifacts[i];
        struct ci_error e = {{0}};
        if (!ci_client_artifact_name_safe(a)) {
            say(stderr,
                "ci: not saving artifact '%s' here: its name is unsafe (hidden, '..', control or "
                "format characters, or not ending in .csv/.png); it is object '%s' in the files "
                "bucket\n",
                a->name, a->object);
            failures++;
            continue;
        }
        uint8_t *data = NULL;
        size_t len = 0;
        if (ci_objstore_get(ci_broker_objstore(b), a->object, MAX_READ, &data, &len, &e)) {
            say(stderr, "ci: artifact '%s': %s\n", a->name, e.msg);
            failures++;
            continue;
        }
        int fd = ci_client_open_artifact(AT_FDCWD, a->name);
        if (fd < 0 || ci_write_all(fd, data, len)) {
            say(stderr, "ci: cannot write '%s': %s\n", a->name, strerror(errno));
            failures++;
        } else {
            say(stderr, "ci: saved %s (%zu bytes)\n", a->name, len);
        }
        if (fd >= 0)
            close(fd);
        free(data);
    }
    return failures;
}

static void print_event(const Ci__V1__StatusEvent *ev, bool json)
{
    if (json)
        print_json(&ev->base);
    else
        say(stdout, "%" PRId64 " %s %s%s%s\n", ev->at_ms, ci_task_status_short(ev->status),
            ev->worker, ev->message[0] ? " " : "", ev->message);
    fflush(stdout);
}

static void on_print_event(const Ci__V1__StatusEvent *ev, void *closure)
{
    if (ev)
        print_event(ev, *(const bool *)closure);
}

/* Waits for the task's terminal event, printing each event with print. */
static ci_status wait_terminal(struct ci_broker *b, const char *id, int64_t wait_ms, bool print,
                               bool json, struct ci_error *err)
{
    return ci_client_wait(b, id, wait_ms, print ? on_print_event : NULL, &json, true, err);
}

/* "session s1, step 3: restored step 2; state kept (81234 bytes); not kept: fh (open file)" */
static void print_session(FILE *f, const char *prefix, const Ci__V1__SessionInfo *si)
{
    if (!si)
        return;
    say(f, "%ssession %s, step %u: %s", prefix, si->session_id, si->step,
        si->new_session ? "new session" : "");
    if (si->previous_state_gone)
        say(f, " (the earlier state is gone: the session had expired, was closed or lost it)");
    if (si->restored_from_step)
        say(f, "%srestored step %u", si->new_session ? "; " : "", si->restored_from_step);
    else if (!si->new_session)
        say(f, "nothing restored");
    if (si->state_kept)
        say(f, "; state kept (%" PRIu64 " bytes)", si->state_bytes);
    else
        say(f, "; this step's state not kept");
    for (size_t i = 0; i < si->n_dropped; i++)
        say(f, "%s%s", i ? ", " : "; not kept: ", si->dropped[i]);
    say(f, "\n");
}

static void print_summary(const Ci__V1__ExecutionResult *r)
{
    say(stdout, "task:      %s\nstatus:    %s\n", r->task_id, ci_task_status_short(r->status));
    if (r->_exit_code_case == CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE)
        say(stdout, "exit code: %d\n", r->exit_code);
    if (r->error[0])
        say(stdout, "error:     %s\n", r->error);
    if (r->hint[0])
        say(stdout, "hint:      %s\n", r->hint);
    if (r->usage)
        say(stdout, "usage:     %" PRIu64 " ms, %" PRIu64 " ms cpu, %u MiB\n",
            r->usage->duration_ms, r->usage->cpu_ms, r->usage->memory_mb);
    if (r->worker[0])
        say(stdout, "worker:    %s (attempt %u, isolation %s)\n", r->worker, r->attempt,
            r->isolation);
    print_session(stdout, "session:   ", r->session);
    for (size_t i = 0; i < r->n_artifacts; i++)
        say(stdout, "artifact:  %s (%s, %" PRIu64 " bytes) object %s\n", r->artifacts[i]->name,
            r->artifacts[i]->mime_type, r->artifacts[i]->size, r->artifacts[i]->object);
    if (r->stdout[0])
        say(stdout, "--- stdout%s ---\n%s\n", r->stdout_truncated ? " (truncated)" : "",
            r->stdout);
    if (r->n_outputs || r->outputs_truncated) {
        say(stdout, "--- outputs (%zu%s) ---\n", r->n_outputs,
            r->outputs_truncated ? ", more were left out" : "");
        print_outputs(stdout, r);
    }
    if (r->stderr[0])
        say(stdout, "--- stderr%s ---\n%s\n", r->stderr_truncated ? " (truncated)" : "",
            r->stderr);
}

static int exit_code_of(const Ci__V1__ExecutionResult *r)
{
    switch (r->status) {
    case CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED: return 0;
    case CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT: return EXIT_TIMEOUT;
    case CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED: return EXIT_CANCELLED;
    default:
        if (r->_exit_code_case == CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE && r->exit_code)
            return r->exit_code & 0xff ? r->exit_code & 0xff : 1;
        return 1;
    }
}

/* The most heartbeat entries `ci stats` reads. */
#define MAX_WORKERS 10000

struct stats_workers {
    struct ci_buf text; /* one line per worker, or JSON objects joined by ',' */
    size_t n;
    bool json;
    int64_t now_ms;
};

static void human_age(char *out, size_t n, int64_t ms)
{
    if (ms < 0)
        ms = 0;
    if (ms < 120000)
        snprintf(out, n, "%" PRId64 " s", ms / 1000);
    else if (ms < 7200000)
        snprintf(out, n, "%" PRId64 " min", ms / 60000);
    else
        snprintf(out, n, "%" PRId64 " h", ms / 3600000);
}

static void on_worker(void *closure, const char *id, const uint8_t *data, size_t len,
                      int64_t written_ms)
{
    struct stats_workers *sw = closure;
    struct ci_heartbeat_info hb;
    if (ci_heartbeat_decode(data, len, &hb, NULL))
        return; /* not ours: skip it rather than fail the listing */
    int64_t seen = sw->now_ms - written_ms;
    if (sw->json) {
        /* The heartbeat is JSON already; add when the server stored it. */
        ci_buf_appendf(&sw->text, "%s{\"heartbeat\":%.*s,\"seenMsAgo\":\"%" PRId64 "\"}",
                       sw->n ? "," : "", (int)len, (const char *)data, seen);
    } else {
        char ago[32], up[32];
        human_age(ago, sizeof(ago), seen);
        human_age(up, sizeof(up), written_ms - hb.started_at_ms);
        ci_buf_appendf(&sw->text,
                       "  %-24s %-9s slots %u  running %u  %-9s done %" PRIu64
                       "  seen %s ago  up %s\n",
                       id, hb.provider, hb.slots, hb.active,
                       hb.ready ? "ready" : "not-ready", hb.tasks_done, ago, up);
    }
    sw->n++;
    ci_heartbeat_info_release(&hb);
}

static int cmd_stats(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                     const char *unused)
{
    bool json = o->json;
    struct ci_error e = {{0}};
    struct ci_queue_stats q;
    if (ci_broker_queue_stats(b, &q, &e)) {
        say(stderr, "ci: %s\n", e.msg);
        return EXIT_INFRA;
    }
    /* The batch lane (contract §21), when a worker that serves it made it. */
    const char *bstream = cfg->jetstream.batch_stream, *bconsumer = cfg->jetstream.batch_consumer;
    struct ci_queue_stats bq;
    ci_status bs = ci_broker_batch_queue_stats(b, &bq, &e);
    if (bs && bs != CI_ERR_NOT_FOUND) {
        say(stderr, "ci: %s\n", e.msg);
        return EXIT_INFRA;
    }
    char batch_json[512];
    if (bs)
        snprintf(batch_json, sizeof(batch_json), "null");
    else
        snprintf(batch_json, sizeof(batch_json),
                 "{\"stream\":\"%s\",\"consumer\":\"%s\",\"streamMsgs\":\"%" PRIu64
                 "\",\"pending\":\"%" PRIu64 "\",\"ackPending\":\"%" PRIu64
                 "\",\"redelivered\":\"%" PRIu64 "\",\"waiting\":\"%" PRIu64 "\"}",
                 bstream, bconsumer, bq.stream_msgs, bq.pending, bq.ack_pending,
                 bq.redelivered, bq.waiting);
    struct stats_workers sw = {.json = json, .now_ms = ci_now_ms()};
    bool have_bucket = true;
    ci_status s = ci_broker_workers_open(b, false, 0, &e);
    if (s == CI_ERR_NOT_FOUND)
        have_bucket = false;
    else if (s || ci_broker_workers_list(b, MAX_WORKERS, on_worker, &sw, &e)) {
        say(stderr, "ci: %s\n", e.msg);
        ci_buf_release(&sw.text);
        return EXIT_INFRA;
    }
    if (json) {
        /* JSON for a machine, raw like print_json(). */
        printf("{\"queue\":{\"stream\":\"%s\",\"consumer\":\"%s\",\"streamMsgs\":\"%" PRIu64
               "\",\"pending\":\"%" PRIu64 "\",\"ackPending\":\"%" PRIu64
               "\",\"redelivered\":\"%" PRIu64 "\",\"waiting\":\"%" PRIu64
               "\"},\"batchQueue\":%s,\"workers\":[%s]}\n",
               cfg->jetstream.tasks_stream, cfg->jetstream.consumer, q.stream_msgs, q.pending,
               q.ack_pending, q.redelivered, q.waiting, batch_json,
               sw.text.data ? (const char *)sw.text.data : "");
    } else {
        say(stdout, "queue:        %" PRIu64 " waiting for a worker (consumer %s; stream %s holds %" PRIu64
               ")\n",
               q.pending, cfg->jetstream.consumer, cfg->jetstream.tasks_stream, q.stream_msgs);
        say(stdout, "in flight:    %" PRIu64 " (%" PRIu64 " of them delivered more than once)\n",
               q.ack_pending, q.redelivered);
        say(stdout, "idle pulls:   %" PRIu64 "\n", q.waiting);
        if (bs)
            say(stdout, "batch queue:  none (no consumer %s on stream %s: no worker that serves "
                "batches has run)\n", bconsumer, bstream);
        else
            say(stdout, "batch queue:  %" PRIu64 " waiting for a worker (consumer %s; stream %s "
                "holds %" PRIu64 "), %" PRIu64 " in flight (%" PRIu64 " of them delivered more "
                "than once)\n", bq.pending, bconsumer, bstream, bq.stream_msgs,
                bq.ack_pending, bq.redelivered);
        if (!have_bucket)
            say(stdout, "workers:      unknown (no heartbeat bucket %s: no worker with heartbeats "
                   "has run)\n",
                   cfg->jetstream.workers_bucket);
        else
            say(stdout, "workers:      %zu alive (an entry expires after three missed heartbeats)\n%s",
                   sw.n, sw.text.data ? (const char *)sw.text.data : "");
    }
    ci_buf_release(&sw.text);
    return 0;
}

/* --- ci runtimes: the manifests workers published (contract §18) --- */

#define MAX_RUNTIMES 100
#define MANIFEST_MAX (256 * 1024) /* a record larger than this is not ours */

struct runtime_list {
    struct ci_buf text;
    size_t n;
    bool json;
    int64_t now_ms;
};

/* The string field key of o, or dflt. */
static const char *jstr(json_t *o, const char *key, const char *dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_string(v) ? json_string_value(v) : dflt;
}

static const char *yes_no(json_t *v)
{
    return json_is_true(v) ? "yes" : json_is_false(v) ? "no" : "unknown";
}

static void on_runtime(void *closure, const char *name, const uint8_t *data, size_t len,
                       int64_t written_ms)
{
    struct runtime_list *rl = closure;
    json_t *m = len <= MANIFEST_MAX ? json_loadb((const char *)data, len, 0, NULL) : NULL;
    if (rl->json) {
        if (json_is_object(m)) /* as stored: JSON already */
            ci_buf_appendf(&rl->text, "%s%.*s", rl->n ? "," : "", (int)len, (const char *)data);
        else
            ci_buf_appendf(&rl->text, "%s{\"runtime\":\"%s\",\"unreadable\":true}",
                           rl->n ? "," : "", name);
        rl->n++;
        json_decref(m);
        return;
    }
    rl->n++;
    if (!json_is_object(m)) {
        ci_buf_appendf(&rl->text, "%s (not a manifest)\n", name);
        json_decref(m);
        return;
    }
    char ago[32];
    human_age(ago, sizeof(ago), rl->now_ms - written_ms);
    ci_buf_appendf(&rl->text, "%s (worker %s, version %s, written %s ago)\n", name,
                   jstr(m, "worker", "?"), jstr(m, "version", "?"), ago);
    json_t *pkgs = json_object_get(m, "packages");
    if (json_is_string(json_object_get(m, "python")) && json_is_object(pkgs)) {
        ci_buf_appendf(&rl->text, "  python:     %s\n  packages:  ", jstr(m, "python", ""));
        const char *k;
        json_t *v;
        size_t i = 0;
        json_object_foreach(pkgs, k, v)
            ci_buf_appendf(&rl->text, "%s %s %s", i++ ? "," : "", k,
                           json_is_string(v) ? json_string_value(v) : "?");
        ci_buf_appendf(&rl->text, "%s\n", i ? "" : " none");
    } else {
        ci_buf_appendf(&rl->text, "  versions:   unknown (%s)\n",
                       jstr(m, "versionsUnknown", "not in the manifest"));
    }
    ci_buf_appendf(&rl->text, "  network:    %s   pip: %s\n", yes_no(json_object_get(m, "network")),
                   yes_no(json_object_get(m, "pip")));
    ci_buf_appendf(&rl->text, "  inputs:     %s\n", jstr(m, "inputs", "?"));
    json_t *l = json_object_get(m, "limits");
    ci_buf_appendf(&rl->text,
                   "  limits:     timeout %s ms (max %s), memory %s MiB (max %s),\n"
                   "              code %s bytes, inputs %s bytes, artifacts %s bytes,\n"
                   "              stdout and stderr %s bytes each\n",
                   jstr(l, "defaultTimeoutMs", "?"), jstr(l, "maxTimeoutMs", "?"),
                   jstr(l, "defaultMemoryMb", "?"), jstr(l, "maxMemoryMb", "?"),
                   jstr(l, "maxCodeBytes", "?"), jstr(l, "maxInputBytes", "?"),
                   jstr(l, "maxArtifactBytes", "?"), jstr(l, "maxOutputBytes", "?"));
    json_t *arts = json_object_get(m, "artifacts");
    ci_buf_appendf(&rl->text, "  artifacts: ");
    size_t ai;
    json_t *av;
    json_array_foreach(arts, ai, av)
        ci_buf_appendf(&rl->text, "%s %s", ai ? "," : "", json_is_string(av) ? json_string_value(av) : "?");
    ci_buf_appendf(&rl->text, "\n");
    json_t *ss = json_object_get(m, "sessions");
    if (json_is_true(json_object_get(ss, "available")))
        ci_buf_appendf(&rl->text,
                       "  sessions:   yes (idle %s s, state up to %s MiB; keeps %s; drops %s)\n",
                       jstr(ss, "idleS", "?"), jstr(ss, "maxStateMb", "?"),
                       jstr(ss, "keeps", "?"), jstr(ss, "drops", "?"));
    else
        ci_buf_appendf(&rl->text, "  sessions:   no (%s)\n", jstr(ss, "why", "not offered"));
    const char *iso = jstr(m, "isolation", "");
    ci_buf_appendf(&rl->text, "  isolation:  %s\n  provider:   %s\n",
                   iso[0] ? iso : "unknown until a task ran", jstr(m, "provider", "?"));
    json_decref(m);
}

static int cmd_runtimes(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                        const char *unused)
{
    struct ci_error e = {{0}};
    struct runtime_list rl = {.json = o->json, .now_ms = ci_now_ms()};
    ci_status s = ci_broker_runtimes_list(b, MAX_RUNTIMES, on_runtime, &rl, &e);
    if (s && s != CI_ERR_NOT_FOUND) {
        say(stderr, "ci: %s\n", e.msg);
        ci_buf_release(&rl.text);
        return EXIT_INFRA;
    }
    int rc = 0;
    if (o->json) {
        printf("[%s]\n", rl.text.data ? (const char *)rl.text.data : "");
    } else if (!rl.n) {
        say(stderr, "ci: no runtime manifest in %s: no worker of this version has published "
            "one in the last %u s (is a worker running?)\n",
            cfg->jetstream.runtimes_bucket, cfg->jetstream.max_age_s);
        rc = EXIT_USAGE; /* nothing to show, as for a task or batch that is not there */
    } else {
        say(stdout, "%s", (const char *)rl.text.data);
    }
    ci_buf_release(&rl.text);
    return rc;
}

/* What ci run prints after the output: the outputs' text, cuts, the error,
 * the hint, the session. */
static void print_end(const Ci__V1__ExecutionResult *r)
{
    print_outputs(stdout, r);
    fflush(stdout);
    if (r->stdout_truncated)
        say(stderr, "ci: stdout was cut: the code wrote %" PRIu64 " bytes\n",
            r->stdout_total_bytes);
    if (r->stderr_truncated)
        say(stderr, "ci: stderr was cut: the code wrote %" PRIu64 " bytes\n",
            r->stderr_total_bytes);
    if (r->status != CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED || r->error[0])
        say(stderr, "ci: %s: %s\n", ci_task_status_short(r->status), r->error);
    if (r->hint[0])
        say(stderr, "ci: hint: %s\n", r->hint);
    if (r->outputs_truncated)
        say(stderr, "ci: the code showed more outputs than a result keeps (20, 2 MiB); "
                    "the rest were left out\n");
    print_session(stderr, "ci: ", r->session);
}

/* A wait that ended without the task's end: --wait-ms ran out (s
 * CI_ERR_TIMEOUT, exit 124; the task goes on), or NATS failed (exit 3). */
static int wait_failed(const char *id, ci_status s, const struct ci_error *e)
{
    if (s != CI_ERR_TIMEOUT) {
        say(stderr, "ci: %s\n", e->msg);
        return EXIT_INFRA;
    }
    say(stderr, "ci: %s (it goes on: 'ci get %s' gives its result once it ends)\n", e->msg,
        id);
    return EXIT_TIMEOUT;
}

/* Waits for the task's end and reads its result into *ret. Without --json,
 * its output is shown as it is written (contract §19), then the rest of it
 * and print_end(). 0, or the exit code of a failure (said on stderr). */
static int follow_to_end(struct ci_broker *b, const struct opts *o, const char *id,
                         Ci__V1__ExecutionResult **ret)
{
    struct ci_error e = {{0}};
    struct ci_follow *live = o->json ? NULL : ci_follow_start(b, id, stdout, stderr);
    ci_status s = wait_terminal(b, id, o->wait_ms, false, false, &e);
    if (s || get_result(b, id, ret, &e)) {
        ci_follow_finish(live, NULL);
        return wait_failed(id, s, &e);
    }
    if (o->json)
        return 0;
    if (live) {
        ci_follow_finish(live, *ret);
    } else {
        put_text(stdout, (*ret)->stdout, strlen((*ret)->stdout));
        fflush(stdout);
        put_text(stderr, (*ret)->stderr, strlen((*ret)->stderr));
    }
    print_end(*ret);
    return 0;
}

/* run and submit: submits the script; with wait, waits for the result,
 * prints it, saves the artifacts and returns the script's exit code. */
static int run_script(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                      const char *script, bool wait)
{
    char id[65];
    int rc = submit(b, cfg, o, script, id);
    if (rc)
        return rc;
    if (!wait) {
        say(stdout, "%s\n", id);
        return 0;
    }
    Ci__V1__ExecutionResult *r = NULL;
    rc = follow_to_end(b, o, id, &r);
    if (rc)
        return rc;
    if (o->json)
        print_json(&r->base);
    int failures = 0;
    if (!o->no_save) {
        failures += save_artifacts(b, r);
        failures += save_output_images(r);
    }
    rc = exit_code_of(r);
    if (rc == 0 && failures)
        rc = EXIT_INFRA;
    ci_message_free(&r->base);
    return rc;
}

static int cmd_get(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                   const char *id)
{
    struct ci_error e = {{0}};
    Ci__V1__ExecutionResult *r = NULL;
    ci_status s = get_result(b, id, &r, &e);
    if (s) {
        say(stderr, "ci: %s\n", e.msg);
        return s == CI_ERR_NOT_FOUND ? EXIT_USAGE : EXIT_INFRA;
    }
    if (o->json)
        print_json(&r->base);
    else
        print_summary(r);
    ci_message_free(&r->base);
    return 0;
}

static int cmd_watch(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                     const char *id)
{
    struct ci_error e = {{0}};
    if (o->output) {
        /* As ci run shows a task, for one submitted elsewhere. */
        Ci__V1__ExecutionResult *r = NULL;
        int rc = follow_to_end(b, o, id, &r);
        if (rc)
            return rc;
        if (o->json)
            print_json(&r->base);
        rc = exit_code_of(r);
        ci_message_free(&r->base);
        return rc;
    }
    ci_status s = wait_terminal(b, id, o->wait_ms, true, o->json, &e);
    return s ? wait_failed(id, s, &e) : 0;
}

static int cmd_cancel(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                      const char *id)
{
    struct ci_error e = {{0}};
    if (ci_broker_cancel_publish(b, id, &e)) {
        say(stderr, "ci: %s\n", e.msg);
        return EXIT_INFRA;
    }
    return 0;
}

/* --- ci session ls | show ID | close ID --- */

#define MAX_SESSIONS 10000

struct session_list {
    struct ci_buf text;
    size_t n;
    bool json;
    int64_t now_ms;
    uint32_t idle_s;
};

static void on_session(void *closure, const char *id, const uint8_t *data, size_t len,
                       int64_t written_ms)
{
    struct session_list *sl = closure;
    struct ci_session_record rec;
    bool ours = ci_session_record_parse(data, len, &rec, NULL) == CI_OK;
    if (sl->json) {
        /* The record is JSON already (when a worker wrote it). */
        if (ours)
            ci_buf_appendf(&sl->text, "%s%.*s", sl->n ? "," : "", (int)len, (const char *)data);
        else
            ci_buf_appendf(&sl->text, "%s{\"sessionId\":\"%s\",\"unreadable\":true}",
                           sl->n ? "," : "", id);
    } else if (!ours) {
        ci_buf_appendf(&sl->text, "  %-24s (not a session record)\n", id);
    } else if (rec.closed) {
        ci_buf_appendf(&sl->text, "  %-24s closed\n", id);
    } else {
        char ago[32];
        human_age(ago, sizeof(ago), sl->now_ms - rec.updated_ms);
        bool expired = rec.updated_ms + (int64_t)sl->idle_s * 1000 < sl->now_ms;
        ci_buf_appendf(&sl->text, "  %-24s step %-5u state %s%" PRIu64 " bytes  last step %s ago%s\n",
                       id, rec.step, rec.state_step ? "" : "none, ",
                       rec.state_bytes, ago, expired ? "  (expired)" : "");
    }
    (void)written_ms;
    sl->n++;
}

static int session_ls(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o)
{
    struct ci_error e = {{0}};
    struct session_list sl = {.json = o->json, .now_ms = ci_now_ms(),
                              .idle_s = cfg->sessions.idle_s};
    ci_status s = ci_broker_sessions_list(b, MAX_SESSIONS, on_session, &sl, &e);
    if (s && s != CI_ERR_NOT_FOUND) {
        say(stderr, "ci: %s\n", e.msg);
        ci_buf_release(&sl.text);
        return EXIT_INFRA;
    }
    if (o->json)
        printf("[%s]\n", sl.text.data ? (const char *)sl.text.data : "");
    else if (!sl.n)
        say(stdout, "no sessions (records live %u s after their last step)\n",
            cfg->jetstream.max_age_s);
    else
        say(stdout, "%s", (const char *)sl.text.data);
    ci_buf_release(&sl.text);
    return 0;
}

/* The record of id: 0 and *ret filled, EXIT_USAGE when there is none, else
 * EXIT_INFRA. */
static int session_read(struct ci_broker *b, const char *id, struct ci_session_record *ret,
                        uint8_t **ret_raw, size_t *ret_len)
{
    struct ci_error e = {{0}};
    ci_status s = ci_broker_session_get(b, id, ret_raw, ret_len, NULL, &e);
    if (s == CI_ERR_NOT_FOUND) {
        say(stderr, "ci: no session '%s' (never used, or its record expired)\n", id);
        return EXIT_USAGE;
    }
    if (s) {
        say(stderr, "ci: %s\n", e.msg);
        return EXIT_INFRA;
    }
    if (ci_session_record_parse(*ret_raw, *ret_len, ret, &e)) {
        say(stderr, "ci: session '%s': %s\n", id, e.msg);
        return EXIT_INFRA;
    }
    return 0;
}

static int session_show(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o)
{
    struct ci_session_record rec;
    CI_AUTOFREE uint8_t *raw = NULL;
    size_t len = 0;
    int rc = session_read(b, o->session_id, &rec, &raw, &len);
    if (rc)
        return rc;
    if (o->json) {
        printf("%.*s\n", (int)len, (const char *)raw);
        return 0;
    }
    if (rec.closed) {
        say(stdout, "session:    %s\nstate:      closed\n", o->session_id);
        return 0;
    }
    int64_t now = ci_now_ms();
    char ago[32], age[32];
    human_age(ago, sizeof(ago), now - rec.updated_ms);
    human_age(age, sizeof(age), now - rec.created_ms);
    int64_t left = rec.updated_ms + (int64_t)cfg->sessions.idle_s * 1000 - now;
    say(stdout, "session:    %s\nsteps:      %u (last task %s, %s ago; started %s ago)\n",
        o->session_id, rec.step, rec.last_task_id, ago, age);
    if (rec.state_step)
        say(stdout, "state:      of step %u, %" PRIu64 " bytes, object %s\n", rec.state_step,
            rec.state_bytes, rec.state);
    else
        say(stdout, "state:      none kept yet\n");
    if (left > 0) {
        char in[32];
        human_age(in, sizeof(in), left);
        say(stdout, "expires:    in %s without a step (sessions.idle_s %u)\n", in,
            cfg->sessions.idle_s);
    } else {
        say(stdout, "expires:    expired (idle for more than sessions.idle_s %u s): its next "
            "step starts afresh\n", cfg->sessions.idle_s);
    }
    return 0;
}

static int session_close(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o)
{
    struct ci_error e = {{0}};
    struct ci_session_record rec, closed = {.closed = true};
    /* Compare-and-set: a step that ends meanwhile writes a newer record,
     * whose state is the one to delete. */
    for (int tries = 0;; tries++) {
        CI_AUTOFREE uint8_t *raw = NULL;
        size_t len = 0;
        uint64_t rev = 0;
        ci_status s = ci_broker_session_get(b, o->session_id, &raw, &len, &rev, &e);
        if (s == CI_ERR_NOT_FOUND) {
            say(stderr, "ci: no session '%s' (never used, or its record expired)\n", o->session_id);
            return EXIT_USAGE;
        }
        if (s) {
            say(stderr, "ci: %s\n", e.msg);
            return EXIT_INFRA;
        }
        if (ci_session_record_parse(raw, len, &rec, NULL))
            memset(&rec, 0, sizeof(rec)); /* not a record: close it all the same */
        closed.updated_ms = ci_now_ms();
        CI_AUTOFREE char *json = NULL;
        size_t jlen = 0;
        if (ci_session_record_encode(o->session_id, &closed, &json, &jlen, &e)) {
            say(stderr, "ci: %s\n", e.msg);
            return EXIT_INFRA;
        }
        s = ci_broker_session_swap(b, o->session_id, json, jlen, rev, NULL, &e);
        if (s == CI_OK)
            break;
        if (s != CI_ERR_CONFLICT || tries == 4) {
            say(stderr, "ci: %s\n", e.msg);
            return EXIT_INFRA;
        }
    }
    if (!rec.closed && rec.state_step && ci_session_object_valid(o->session_id, rec.state) &&
        ci_objstore_delete(ci_broker_objstore(b), rec.state, &e) && e.msg[0])
        say(stderr, "ci: the session is closed, but its state %s could not be deleted "
            "(it expires within %u s): %s\n", rec.state, cfg->jetstream.max_age_s, e.msg);
    if (!o->json)
        say(stdout, "session %s closed\n", o->session_id);
    return 0;
}

static int cmd_session(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                       const char *sub)
{
    if (strcmp(sub, "ls") == 0)
        return session_ls(b, cfg, o);
    if (strcmp(sub, "show") == 0)
        return session_show(b, cfg, o);
    return session_close(b, cfg, o);
}

static int cmd_run(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                   const char *script)
{
    return run_script(b, cfg, o, script, true);
}

static int cmd_submit(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                      const char *script)
{
    return run_script(b, cfg, o, script, false);
}

/* `ci mcp`: serves MCP on stdin/stdout until stdin ends. */
static int cmd_mcp(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                   const char *unused)
{
    /* Below the 60 s after which MCP hosts (the official SDK) give up on a
     * request: a longer task comes back as its id, for get_result. */
    struct ci_mcp_opts mo = {.wait_ms = o->wait_set ? o->wait_ms : 45000,
                             .save_dir = o->save_dir};
    return ci_mcp_serve(b, cfg, &mo);
}

/* `ci tools`: the tool definitions of `ci mcp` in an API's shape. */
static int cmd_tools(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                     const char *unused)
{
    enum ci_tools_format f = CI_TOOLS_OPENAI;
    if (o->format && !ci_tools_format_parse(o->format, &f)) {
        say(stderr, "ci: --format '%s': use openai, anthropic or mcp\n", o->format);
        return EXIT_USAGE;
    }
    struct ci_error e = {{0}};
    json_t *manifest = NULL;
    if (ci_tools_manifest(b, &manifest, &e))
        say(stderr, "ci: the runtime manifest cannot be read (%s); describing the tool from the "
            "config\n", e.msg);
    json_t *tools = ci_tools_build(f, manifest, cfg);
    json_decref(manifest);
    char *text = tools ? json_dumps(tools, JSON_INDENT(2)) : NULL;
    json_decref(tools);
    if (!text) {
        say(stderr, "ci: out of memory\n");
        return EXIT_INFRA;
    }
    printf("%s\n", text);
    free(text);
    return 0;
}

/* --- ci batch: submit, status, wait, results, cancel (contract §20) --- */

/* Groups shown by `ci batch wait`, and the end events read to make them. */
#define WAIT_GROUPS_SHOWN 10
#define WAIT_GROUPS_MAX 100
#define WAIT_FAILURES_READ 10000

/* The terminal's width, asked each time (it may be resized): the
 * terminal's own (TIOCGWINSZ), else $COLUMNS, else 80. */
static int terminal_columns(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    const char *env = getenv("COLUMNS");
    long cols = env ? strtol(env, NULL, 10) : 0;
    return cols > 0 && cols < 10000 ? (int)cols : 80;
}

/* One line of progress on stderr: on a terminal, text (short) after a
 * bar, fitted to the terminal's width (a line that wraps cannot be redrawn
 * in place) and redrawn in place ("\r", then erase to the end of the
 * line); a plain line of long_text otherwise. */
static void progress_line(bool tty, const uint64_t *segments, size_t n_segments, uint64_t total,
                          const char *text, const char *long_text)
{
    if (!tty) {
        say(stderr, "ci: %s\n", long_text);
        return;
    }
    char line[512];
    ci_progress_line(line, sizeof(line), terminal_columns(), segments, "#x>", n_segments, total,
                     text);
    /* The controls are ours: written as they are, not through say(). */
    fprintf(stderr, "\r%s\x1b[K", line);
    fflush(stderr);
}

struct submit_progress {
    bool tty;
    int64_t last_ms;
    bool drawn;
};

static void on_submit_progress(void *closure, const char *stage, uint64_t done, uint64_t total)
{
    struct submit_progress *p = closure;
    int64_t now = ci_mono_ms();
    /* A terminal is redrawn ten times a second; a log gets a line every
     * 5 s of a long submission. */
    if (done != total && now - p->last_ms < (p->tty ? 100 : 5000))
        return;
    if (!p->tty && done == total && !p->drawn)
        return; /* a short submission: the summary says it all */
    p->last_ms = now;
    p->drawn = true;
    char text[96];
    snprintf(text, sizeof(text), "%" PRIu64 "/%" PRIu64 " tasks %s", done, total, stage);
    progress_line(p->tty, &done, 1, total, text, text);
}

static int batch_submit(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o)
{
    const struct ci_batch_cmd *c = &o->batch_cmd;
    struct ci_error e = {{0}};
    char new_id[19];
    const char *batch = c->batch;
    if (!batch) {
        ci_batch_new_id(new_id);
        batch = new_id;
    }
    struct ci_batch_submit a = {
        .batch = batch, .batch_new = !c->batch, .labels = o->labels, .n_labels = o->n_labels,
        .timeout_ms = o->timeout_ms, .memory_mb = o->memory_mb, .jsonl_path = c->jsonl_file,
        .wire_json = o->wire_json,
    };
    CI_AUTOFREE uint8_t *code = NULL;
    char **paths = NULL;
    if (c->glob) {
        size_t code_len = 0;
        if (ci_client_read_file(c->script, cfg->limits.max_code_bytes, &code, &code_len, &e)) {
            say(stderr, "ci: %s\n", e.msg);
            return EXIT_USAGE;
        }
        if (memchr(code, 0, code_len)) {
            say(stderr, "ci: '%s' holds a NUL byte, so it is not Python source\n", c->script);
            return EXIT_USAGE;
        }
        if (ci_batch_glob(c->glob, CI_BATCH_MAX_TASKS, &paths, &a.n_paths, &e)) {
            say(stderr, "ci: %s\n", e.msg);
            return EXIT_USAGE;
        }
        a.code = (const char *)code;
        a.code_len = code_len;
        a.paths = paths;
    }
    struct submit_progress p = {.tty = isatty(STDERR_FILENO), .last_ms = ci_mono_ms()};
    struct ci_batch_submitted r;
    ci_status s = ci_batch_submit(b, cfg, &a, on_submit_progress, &p, &r, &e);
    ci_batch_paths_free(paths, a.n_paths);
    if (p.tty && p.drawn)
        fputc('\n', stderr);
    if (s) {
        uint64_t done = r.published + r.duplicates + r.skipped;
        say(stderr, "ci: %s\n", e.msg);
        if (r.sealed)
            say(stderr, "ci: batch %s: all %" PRIu64 " tasks went out and the seal is "
                "published; what failed came after it (the counts, and the complete event if "
                "every task had ended already, which a worker that sees the seal publishes "
                "too): running the same command%s%s again does it (nothing runs twice)\n",
                batch, r.total, c->batch ? "" : " with --batch ", c->batch ? "" : batch);
        else if (done && r.in_use && c->jsonl_file)
            say(stderr, "ci: batch %s: %" PRIu64 " of %" PRIu64 " tasks went out before this; "
                "it is not sealed: once the line has another taskId, run the same "
                "command%s%s again to finish it (run as it is, it stops at that line again)\n", batch, done, r.total,
                c->batch ? "" : " with --batch ", c->batch ? "" : batch);
        else if (done && r.in_use)
            say(stderr, "ci: batch %s: %" PRIu64 " of %" PRIu64 " tasks went out before this; "
                "it is not sealed and cannot be finished under this id: cancel it (ci batch "
                "cancel %s)\n", batch, done, r.total, batch);
        else if (done)
            say(stderr, "ci: batch %s: %" PRIu64 " of %" PRIu64 " tasks went out before this; "
                "it is not sealed: run the same command%s%s again to finish it (nothing "
                "runs twice)\n", batch, done, r.total, c->batch ? "" : " with --batch ",
                c->batch ? "" : batch);
        return s == CI_ERR_INVALID || s == CI_ERR_CONFLICT ? EXIT_USAGE : EXIT_INFRA;
    }
    say(stdout, "%s\n", batch);
    fflush(stdout);
    say(stderr, "ci: batch %s: %" PRIu64 " tasks: %" PRIu64 " submitted", batch, r.total,
        r.published);
    if (r.duplicates)
        say(stderr, ", %" PRIu64 " queued already (not queued again)", r.duplicates);
    if (r.skipped)
        say(stderr, ", %" PRIu64 " skipped (taken by a worker already, or their result is "
                    "terminal)", r.skipped);
    say(stderr, "; %s\n", r.seal_was_there ? "sealed already" : "sealed");
    if (ci_batch_state_done(&r.counts))
        say(stderr, "ci: batch %s: every task has ended%s\n", batch,
            r.completed ? "; the complete event is published" : "");
    return 0;
}

/* A failure of NATS that may pass: a request nobody answered in time, a
 * connection being made again. */
static bool nats_transient(ci_status s) { return s == CI_ERR_TIMEOUT || s == CI_ERR_NATS; }

/* Reads the counts of the batch; *ret_known false (and *ret untouched)
 * when the streams know nothing of it. */
static ci_status batch_read(struct ci_broker *b, const struct ci_config *cfg, const char *batch,
                            struct ci_batch_state *ret, bool *ret_known, struct ci_error *err)
{
    struct ci_batch_raw raw;
    *ret_known = false;
    ci_status s = ci_batch_read_raw(b, cfg, batch, &raw, err);
    if (s)
        return s;
    *ret_known = ci_batch_raw_known(&raw);
    if (*ret_known)
        ci_batch_state_compute(&raw, ret);
    return CI_OK;
}

static void say_no_batch(const char *batch, const char *waited)
{
    say(stderr, "ci: no batch '%s'%s: no task or event of it is stored (never submitted, a "
        "typo, older than its streams keep messages, or its submission is still checking its "
        "inputs: nothing goes out before they all pass)\n", batch, waited);
}

/* The counts of the batch: 0, EXIT_USAGE when the streams know nothing of
 * it, EXIT_INFRA; said on stderr. */
static int batch_counts(struct ci_broker *b, const struct ci_config *cfg, const char *batch,
                        struct ci_batch_state *ret)
{
    struct ci_error e = {{0}};
    bool known = false;
    if (batch_read(b, cfg, batch, ret, &known, &e)) {
        say(stderr, "ci: %s\n", e.msg);
        return EXIT_INFRA;
    }
    if (!known) {
        say_no_batch(batch, "");
        return EXIT_USAGE;
    }
    return 0;
}

static int batch_status(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o)
{
    const char *batch = o->batch_cmd.batch;
    struct ci_batch_state c;
    int rc = batch_counts(b, cfg, batch, &c);
    if (rc)
        return rc;
    if (o->batch_cmd.json) {
        struct ci_buf j = CI_BUF_INIT;
        if (ci_batch_state_json(&c, &j)) {
            say(stderr, "ci: out of memory\n");
            return EXIT_INFRA;
        }
        printf("%s\n", (const char *)j.data);
        ci_buf_release(&j);
        return 0;
    }
    say(stdout, "batch:      %s\n", batch);
    if (c.sealed)
        say(stdout, "tasks:      %" PRIu64 " (sealed)\n", c.total);
    else
        say(stdout, "tasks:      %" PRIu64 " so far (not sealed: its submission has not "
            "finished)\n", c.total);
    say(stdout, "queued:     %" PRIu64 "\nrunning:    %" PRIu64 "\nsucceeded:  %" PRIu64
        "\nfailed:     %" PRIu64 "\ntimed out:  %" PRIu64 "\ncancelled:  %" PRIu64 "\n",
        c.queued, c.running, c.succeeded, c.failed, c.timed_out, c.cancelled);
    if (c.cancel_requested)
        say(stdout, "cancel:     requested (tasks not ended yet end cancelled)\n");
    say(stdout, "complete:   %s\n", c.complete                   ? "yes"
                                    : ci_batch_state_done(&c) ? "every task ended"
                                                               : "no");
    return 0;
}

/* The counts in a few words, for the progress bar of a terminal. */
static void wait_text_short(char *out, size_t n, const struct ci_batch_state *c)
{
    snprintf(out, n,
             "%" PRIu64 "/%" PRIu64 "%s ended (%" PRIu64 " ok, %" PRIu64 " not), %" PRIu64
             " running, %" PRIu64 " queued",
             ci_batch_state_ended(c), c->total, c->sealed ? "" : "+", c->succeeded,
             c->failed + c->timed_out + c->cancelled, c->running, c->queued);
}

static void wait_text(char *out, size_t n, const struct ci_batch_state *c)
{
    snprintf(out, n,
             "%" PRIu64 "/%" PRIu64 "%s ended: %" PRIu64 " succeeded, %" PRIu64 " failed, %" PRIu64
             " timed out, %" PRIu64 " cancelled; %" PRIu64 " running, %" PRIu64 " queued",
             ci_batch_state_ended(c), c->total, c->sealed ? "" : "+", c->succeeded, c->failed,
             c->timed_out, c->cancelled, c->running, c->queued);
}

static bool on_failure(void *closure, const struct ci_batch_end *end)
{
    return ci_batch_failures_add(closure, ci_batch_event_status(end->event), end->error,
                                 end->task_id) == CI_OK;
}

/* The failures of an ended batch, grouped by error, on stdout. */
static int print_failures(struct ci_broker *b, const struct ci_config *cfg, const char *batch,
                          const struct ci_batch_state *c)
{
    struct ci_error e = {{0}};
    struct ci_batch_failures f;
    ci_batch_failures_init(&f, WAIT_GROUPS_MAX);
    size_t unreadable = 0;
    unsigned kinds[] = {CI_BATCH_EV_FAILED, CI_BATCH_EV_TIMED_OUT, CI_BATCH_EV_CANCELLED};
    ci_status s = CI_OK;
    for (size_t i = 0; !s && i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        size_t bad = 0;
        s = ci_batch_read_ends(b, cfg, batch, 1u << kinds[i], WAIT_FAILURES_READ, on_failure, &f,
                               &bad, NULL, &e);
        unreadable += bad;
    }
    if (s) {
        say(stderr, "ci: %s\n", e.msg);
        ci_batch_failures_release(&f);
        return EXIT_INFRA;
    }
    ci_batch_failures_sort(&f);
    say(stdout, "batch %s: %" PRIu64 " of %" PRIu64 " tasks succeeded; %" PRIu64 " failed, %"
        PRIu64 " timed out, %" PRIu64 " cancelled\n", batch, c->succeeded, c->total, c->failed,
        c->timed_out, c->cancelled);
    for (size_t i = 0; i < f.n && i < WAIT_GROUPS_SHOWN; i++) {
        const struct ci_batch_group *g = &f.groups[i];
        say(stdout, "  %" PRIu64 " %s: %s\n    tasks ", g->count, ci_task_status_short(g->status),
            g->error[0] ? g->error : "(no error given)");
        for (size_t k = 0; k < g->n_ids; k++)
            say(stdout, "%s%s", k ? ", " : "", g->ids[k]);
        say(stdout, "%s\n", g->count > g->n_ids ? ", ..." : "");
    }
    if (f.n > WAIT_GROUPS_SHOWN || f.ungrouped) {
        uint64_t rest = f.ungrouped;
        for (size_t i = WAIT_GROUPS_SHOWN; i < f.n; i++)
            rest += f.groups[i].count;
        say(stdout, "  %" PRIu64 " more with other errors\n", rest);
    }
    uint64_t ended_bad = c->failed + c->timed_out + c->cancelled;
    if (f.total < ended_bad && !unreadable)
        say(stdout, "  (grouped from the first %" PRIu64 " failures)\n", f.total);
    if (unreadable)
        say(stdout, "  (%zu end events could not be read)\n", unreadable);
    say(stdout, "ci batch results %s --jsonl gives every result\n", batch);
    ci_batch_failures_release(&f);
    return 1;
}

static void sleep_ms(int64_t ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* How long `ci batch wait` goes on asking while NATS does not answer
 * (each request itself waits up to 5 s) before it gives up with exit 3,
 * unless --retry-ms says. */
#define WAIT_NATS_RETRY_MS 30000
/* How long it waits for a batch of which nothing is stored yet to appear
 * before it says there is none (exit 2): its submission publishes nothing
 * before every input is checked (contract §20). */
#define WAIT_APPEAR_MS 60000

static int batch_wait(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o)
{
    const char *batch = o->batch_cmd.batch;
    /* A batch may take hours: by default wait as long as its streams keep
     * it (batches.max_age_s, 24 h). */
    int64_t wait_ms = o->wait_set ? o->wait_ms : 86400000;
    int64_t appear_ms = wait_ms < WAIT_APPEAR_MS ? wait_ms : WAIT_APPEAR_MS;
    /* A long batch followed over a link that drops for minutes may ask
     * again for longer; a script that would rather know at once, for less. */
    int64_t retry_ms = o->retry_set ? o->retry_ms : WAIT_NATS_RETRY_MS;
    char retry_text[32];
    if (retry_ms % 1000 == 0)
        snprintf(retry_text, sizeof(retry_text), "%" PRId64 " s", retry_ms / 1000);
    else
        snprintf(retry_text, sizeof(retry_text), "%" PRId64 " ms", retry_ms);
    int64_t start = ci_mono_ms(), deadline = start + wait_ms, last_line = 0, last_ok = start;
    bool tty = isatty(STDERR_FILENO), drawn = false, failing = false, absent = false;
    char text[256] = "", said[256] = "", brief[160];
    struct ci_batch_state c;
    for (;;) {
        struct ci_error e = {{0}};
        bool known = false;
        ci_status s = batch_read(b, cfg, batch, &c, &known, &e);
        int64_t now = ci_mono_ms();
        if (s && drawn && tty) {
            fputc('\n', stderr); /* below the progress line */
            drawn = false;
        }
        if (s && !nats_transient(s)) {
            say(stderr, "ci: %s\n", e.msg);
            return EXIT_INFRA;
        }
        if (s) {
            /* A request that timed out once, or a reconnect, is no reason
             * to stop following a batch that runs for hours: asked again,
             * within a bound. --wait-ms running out meanwhile is still a
             * timeout, as the table of exit codes says. */
            if (now >= deadline) {
                say(stderr, "ci: batch %s: not every task ended within %" PRId64 " ms%s%s "
                    "(NATS has not answered for %" PRId64 " s: %s)\n", batch, wait_ms,
                    text[0] ? ": " : "", text, (now - last_ok) / 1000, e.msg);
                return EXIT_TIMEOUT;
            }
            if (now - last_ok >= retry_ms) {
                say(stderr, "ci: batch %s: %s (no answer for %" PRId64 " s, --retry-ms %" PRId64
                    ": giving up)\n", batch, e.msg, (now - last_ok) / 1000, retry_ms);
                return EXIT_INFRA;
            }
            if (!failing)
                say(stderr, "ci: batch %s: %s; asking again for up to %s\n", batch, e.msg,
                    retry_text);
            failing = true;
            int64_t left = deadline - now;
            sleep_ms(left < 500 ? left : 500);
            continue;
        }
        if (failing)
            say(stderr, "ci: batch %s: NATS answers again\n", batch);
        failing = false;
        last_ok = now;
        /* `submit --batch B & wait B`: the submission may still be checking
         * its inputs. Waited for, within a bound: a typo ends in exit 2. */
        if (!known) {
            if (now - start >= appear_ms) {
                char waited[64];
                snprintf(waited, sizeof(waited), " (waited %" PRId64 " s for it)",
                         (now - start) / 1000);
                say_no_batch(batch, waited);
                return EXIT_USAGE;
            }
            if (!absent)
                say(stderr, "ci: batch %s: nothing of it is stored yet; waiting up to %" PRId64
                    " s for its submission to publish it\n", batch, appear_ms / 1000);
            absent = true;
            int64_t left = start + appear_ms - now;
            sleep_ms(left < 500 ? left : 500);
            continue;
        }
        bool done = ci_batch_state_done(&c);
        wait_text(text, sizeof(text), &c);
        /* A terminal shows every poll; a log a line when the counts moved,
         * at most every 5 s, and the last. */
        if (tty || !drawn || done || (strcmp(text, said) != 0 && now - last_line >= 5000)) {
            uint64_t seg[3] = {c.succeeded, c.failed + c.timed_out + c.cancelled, c.running};
            wait_text_short(brief, sizeof(brief), &c);
            progress_line(tty, seg, 3, c.total, brief, text);
            snprintf(said, sizeof(said), "%s", text);
            last_line = now;
            drawn = true;
        }
        if (done)
            break;
        if (now >= deadline) {
            if (tty)
                fputc('\n', stderr);
            say(stderr, "ci: batch %s: not every task ended within %" PRId64 " ms: %s%s\n", batch,
                wait_ms, text,
                c.sealed ? "" : " (and it is not sealed: its submission has not finished)");
            return EXIT_TIMEOUT;
        }
        int64_t left = deadline - now;
        sleep_ms(left < 500 ? left : 500);
    }
    if (tty)
        fputc('\n', stderr);
    if (c.succeeded >= c.total) {
        say(stdout, "batch %s: all %" PRIu64 " tasks succeeded\n", batch, c.total);
        return 0;
    }
    return print_failures(b, cfg, batch, &c);
}

struct results_out {
    struct ci_broker *b;
    const char *batch;
    bool jsonl;
    uint64_t lines, expired;
    ci_status failed;
    struct ci_error e;
};

static bool on_result(void *closure, const struct ci_batch_end *end)
{
    struct results_out *r = closure;
    r->lines++;
    if (!r->jsonl) {
        say(stdout, "%s %s%s%s\n", end->task_id, ci_batch_event_name(end->event),
            end->error[0] ? ": " : "", end->error);
        return true;
    }
    char *line = NULL;
    size_t len = 0;
    bool expired = false;
    r->failed = ci_batch_result_line(r->b, r->batch, end, &line, &len, &expired, &r->e);
    if (r->failed)
        return false;
    r->expired += expired;
    fwrite(line, 1, len, stdout);
    fputc('\n', stdout);
    free(line);
    return true;
}

static int batch_results(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o)
{
    const char *batch = o->batch_cmd.batch;
    struct ci_batch_state c;
    int rc = batch_counts(b, cfg, batch, &c);
    if (rc)
        return rc;
    struct results_out r = {.b = b, .batch = batch, .jsonl = o->batch_cmd.jsonl};
    unsigned ends = 1u << CI_BATCH_EV_SUCCEEDED | 1u << CI_BATCH_EV_FAILED |
                    1u << CI_BATCH_EV_TIMED_OUT | 1u << CI_BATCH_EV_CANCELLED;
    size_t unreadable = 0;
    bool cut = false;
    struct ci_error e = {{0}};
    /* Every event of the batch goes by (one subject filter: taken and
     * cancel events too, in any number): read until none is pending, not
     * up to a guess of how many there are. */
    ci_status s = ci_batch_read_ends(b, cfg, batch, ends, SIZE_MAX, on_result, &r, &unreadable,
                                     &cut, &e);
    fflush(stdout);
    if (r.failed || s) {
        say(stderr, "ci: %s\n", r.failed ? r.e.msg : e.msg);
        return EXIT_INFRA;
    }
    /* Ended tasks stay ended: fewer end events than were counted a moment
     * ago means the read missed some, unless they expired meanwhile (a
     * batch's events live batches.max_age_s, a day): then the count after
     * the read is the smaller. */
    uint64_t ended = ci_batch_state_ended(&c);
    if (!cut && r.lines + unreadable < ended) {
        struct ci_batch_state after;
        bool known = false;
        if (batch_read(b, cfg, batch, &after, &known, &e) == CI_OK) {
            uint64_t now = known ? ci_batch_state_ended(&after) : 0;
            ended = now < ended ? now : ended;
        }
    }
    if (cut || r.lines + unreadable < ended) {
        say(stderr, "ci: the results are cut: %" PRIu64 " of the %" PRIu64 " ended tasks' end "
            "events were read%s\n", r.lines, ended,
            cut ? " (the read stopped with events left)" : "");
        return EXIT_INFRA;
    }
    if (r.expired)
        say(stderr, "ci: %" PRIu64 " results had expired from the results bucket: their lines "
            "hold the status and error of the task's end event\n", r.expired);
    if (unreadable)
        say(stderr, "ci: %zu end events could not be read and are left out\n", unreadable);
    if (!ci_batch_state_done(&c))
        say(stderr, "ci: %" PRIu64 " of %" PRIu64 "%s tasks have ended; the others have no "
            "result yet\n", r.lines, c.total, c.sealed ? "" : "+");
    return 0;
}

static int batch_cancel(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o)
{
    const char *batch = o->batch_cmd.batch;
    struct ci_error e = {{0}};
    struct ci_batch_raw raw;
    if (ci_batch_read_raw(b, cfg, batch, &raw, &e)) {
        say(stderr, "ci: %s\n", e.msg);
        return EXIT_INFRA;
    }
    /* A cancel of a batch nobody submitted would wait there for a day and
     * cancel a later batch that happens to get the id (a typo, most
     * likely): refused. */
    if (!ci_batch_raw_submitted(&raw)) {
        say(stderr, "ci: no batch '%s': no task of it is stored (never submitted, a typo, or "
            "older than its streams keep messages); nothing was cancelled\n", batch);
        return EXIT_USAGE;
    }
    if (ci_batch_cancel(b, cfg, batch, &e)) {
        say(stderr, "ci: %s\n", e.msg);
        return EXIT_INFRA;
    }
    struct ci_batch_state c;
    ci_batch_state_compute(&raw, &c);
    say(stdout, "batch %s: cancel published on %s.%s.cancel\n", batch,
        cfg->jetstream.batch_events_prefix, batch);
    say(stderr, "ci: its %" PRIu64 "%s tasks not ended yet end cancelled (%" PRIu64
        " queued are never run, %" PRIu64 " running are stopped); the %" PRIu64
        " ended keep their results\n", c.queued + c.running, c.sealed ? "" : "+", c.queued,
        c.running, ci_batch_state_ended(&c));
    return 0;
}

static int cmd_batch(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
                     const char *unused)
{
    switch (o->batch_cmd.verb) {
    case CI_BATCH_SUBMIT: return batch_submit(b, cfg, o);
    case CI_BATCH_STATUS: return batch_status(b, cfg, o);
    case CI_BATCH_WAIT: return batch_wait(b, cfg, o);
    case CI_BATCH_RESULTS: return batch_results(b, cfg, o);
    case CI_BATCH_CANCEL: return batch_cancel(b, cfg, o);
    }
    return EXIT_USAGE;
}

/* The commands, for dispatch and for the usage text. A help that needs more
 * than one line continues after '\n', indented under the first. */
struct command {
    const char *name;
    const char *operand; /* its name in the usage; NULL: the command takes none */
    bool task_id;        /* the operand is a task id, checked before connecting */
    int (*run)(struct ci_broker *b, const struct ci_config *cfg, const struct opts *o,
               const char *arg);
    const char *help;
    bool offline_ok; /* runs (b NULL) when NATS cannot be reached */
};

static const struct command commands[] = {
    {"run", "SCRIPT.py", false, cmd_run,
     "submit, wait, print stdout/stderr, save artifacts here,\n"
     "exit with the script's exit code (124 timed out, 130 cancelled,\n"
     "1 failed before running, 3 NATS or service error)", false},
    {"submit", "SCRIPT.py", false, cmd_submit, "submit and print the task id", false},
    {"get", "ID", true, cmd_get, "print the task's result", false},
    {"watch", "ID", true, cmd_watch,
     "print the task's status events until it ends; with --output,\n"
     "its stdout and stderr as they are written, and its exit code", false},
    {"cancel", "ID", true, cmd_cancel, "ask the workers to cancel the task", false},
    {"session", "ls|show ID|close ID", false, cmd_session,
     "list sessions, show one, or close one (its state is deleted;\n"
     "its next task starts a new session)", false},
    {"stats", NULL, false, cmd_stats,
     "queue depth of both lanes (interactive, batch), tasks in flight,\n"
     "redeliveries, and the workers seen recently (from their\n"
     "heartbeats)", false},
    {"runtimes", NULL, false, cmd_runtimes,
     "what each runtime offers (Python and package versions, limits,\n"
     "network, sessions, isolation), as its workers published it", false},
    {"mcp", NULL, false, cmd_mcp,
     "serve the tools run_python, get_result, cancel to an agent\n"
     "over MCP (JSON-RPC on stdin/stdout)", true},
    {"tools", NULL, false, cmd_tools,
     "print the tool definitions for an agent API as JSON\n"
     "(--format openai|anthropic|mcp; openai by default)", true},
    {"batch", "COMMAND ...", false, cmd_batch,
     "many tasks followed as one (batch commands below)", false},
};

static const struct command *find_command(const char *name)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(commands[i].name, name) == 0)
            return &commands[i];
    return NULL;
}

#define HELP_COLUMN 19 /* "  NAME OPERAND" padded to this, then the help */

static void usage(FILE *out)
{
    fputs("usage: ci [OPTIONS] COMMAND ...\ncommands:\n", out);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        const struct command *c = &commands[i];
        char head[64];
        snprintf(head, sizeof(head), "%s%s%s", c->name, c->operand ? " " : "",
                 c->operand ? c->operand : "");
        fprintf(out, "  %-*s", HELP_COLUMN, head);
        for (const char *line = c->help;;) {
            size_t n = strcspn(line, "\n");
            fprintf(out, "%.*s\n", (int)n, line);
            if (!line[n])
                break;
            line += n + 1;
            fprintf(out, "  %-*s", HELP_COLUMN, "");
        }
    }
    fputs("batch commands (a batch's tasks wait behind interactive ones):\n"
          "  batch submit SCRIPT --file-each 'GLOB' [--batch B]\n"
          "                     one task per file the pattern matches (at most 100000),\n"
          "                     SCRIPT reading it as ./NAME; task ids are B-1, B-2, ... in\n"
          "                     the files' sorted order, so the same command again runs\n"
          "                     nothing twice; prints B (default: b- and 16 hex digits)\n"
          "  batch submit --jsonl FILE [--batch B]\n"
          "                     one ExecutionRequest per line, JSON (contract §10); the\n"
          "                     n-th request (blank lines not counted) without taskId\n"
          "                     gets B-<n>\n"
          "  batch status B [--json]\n"
          "                     total, queued, running, succeeded, failed, timed out,\n"
          "                     cancelled\n"
          "  batch wait B       until every task ended; exit 0 when all succeeded, else 1\n"
          "                     with the failures grouped by error (124: --wait-ms passed,\n"
          "                     default 86400000; 2: nothing of B stored within 60 s;\n"
          "                     3: NATS did not answer for --retry-ms)\n"
          "  batch results B --jsonl\n"
          "                     each ended task's result, one JSON line each, in the\n"
          "                     order they ended (without --jsonl: id, status, error)\n"
          "  batch cancel B     tasks not ended yet end cancelled; ended ones keep results\n"
          "options:\n"
          "  --file F           input file (CSV/XLSX), repeatable; SCRIPT reads it as ./NAME\n"
          "  --timeout-ms N     time limit (default: the worker's, 60000)\n"
          "  --memory-mb N      memory limit (default: the worker's, 1024)\n"
          "  --label K=V        label echoed into the result, repeatable\n"
          "  --id ID            task id to use (default: random)\n"
          "  --session S        run/submit SCRIPT as the next step of session S: it starts\n"
          "                     with the globals and files the session's last step left\n"
          "  --json             print results and events as JSON\n"
          "  --wire-json        send the request as JSON instead of protobuf\n"
          "  --no-save          do not write artifacts (and inline output images,\n"
          "                     inline-N.png) to the current folder\n"
          "  --wait-ms N        give up waiting after N ms (default 600000; ci mcp: 45000,\n"
          "                     then run_python returns the task id for get_result)\n"
          "  --save-dir DIR     ci mcp: save CSV/PNG artifacts under DIR/TASK_ID/\n"
          "                     (default $TMPDIR/ci-mcp-UID, made 0700)\n"
          "  --format F         ci tools: openai, anthropic or mcp\n"
          "  --output           ci watch: show the task's output as it is written\n"
          "  --retry-ms N       ci batch wait: while NATS does not answer, ask again for up\n"
          "                     to N ms before giving up with exit 3 (default 30000)\n"
          "  --file-each GLOB   ci batch submit: one task per file matched\n"
          "  --batch B          ci batch submit: the batch id ([A-Za-z0-9_-], short enough\n"
          "                     for B-<n> to be at most 64 characters)\n"
          "  --jsonl [FILE]     ci batch submit: requests from FILE; ci batch results:\n"
          "                     print JSON lines\n"
          "  --url URL          NATS server (default: $CI_NATS_URL, then the config's)\n"
          "  --config FILE      worker.yaml to take names and credentials from\n"
          "Use '-' as SCRIPT to read the code from standard input.\n"
          "exit codes: 0 done; 1 a task failed (ci run exits with the script's own code)\n"
          "or a batch's task did not succeed; 2 a usage error, or no such task, session,\n"
          "batch or runtime manifest; 3 NATS or the service failed; 124 timed out (the\n"
          "task's limit or --wait-ms); 130 cancelled\n",
          out);
}

int main(int argc, char **argv)
{
    static const struct option lopts[] = {
        {"file", required_argument, NULL, 'f'},     {"timeout-ms", required_argument, NULL, 't'},
        {"memory-mb", required_argument, NULL, 'm'}, {"label", required_argument, NULL, 'l'},
        {"id", required_argument, NULL, 'i'},       {"json", no_argument, NULL, 'j'},
        {"wire-json", no_argument, NULL, 'W'},      {"no-save", no_argument, NULL, 'n'},
        {"wait-ms", required_argument, NULL, 'w'},  {"url", required_argument, NULL, 'u'},
        {"config", required_argument, NULL, 'c'},   {"help", no_argument, NULL, 'h'},
        {"session", required_argument, NULL, 'S'},
        {"save-dir", required_argument, NULL, 'D'}, {"format", required_argument, NULL, 'F'},
        {"output", no_argument, NULL, 'O'},        {"retry-ms", required_argument, NULL, 'R'},
        {"file-each", required_argument, NULL, 'E'}, {"batch", required_argument, NULL, 'B'},
        /* A flag for `batch results`; `batch submit --jsonl FILE` takes FILE
         * as its operand (or --jsonl=FILE). */
        {"jsonl", optional_argument, NULL, 'J'},
        {NULL, 0, NULL, 0},
    };
    struct opts o = {.wait_ms = 600000};
    int c;
    char *end;
    while ((c = getopt_long(argc, argv, "f:h", lopts, NULL)) != -1) {
        switch (c) {
        case 'f':
            if (o.n_files == MAX_FILES) {
                say(stderr, "ci: at most %d files\n", MAX_FILES);
                return EXIT_USAGE;
            }
            o.files[o.n_files++] = optarg;
            break;
        case 'l':
            if (o.n_labels == MAX_LABELS) {
                say(stderr, "ci: at most %d labels\n", MAX_LABELS);
                return EXIT_USAGE;
            }
            o.labels[o.n_labels++] = optarg;
            break;
        case 't':
        case 'm':
        case 'R':
        case 'w': {
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno || end == optarg || *end || optarg[0] == '-' || v > UINT32_MAX) {
                say(stderr, "ci: '%s' is not a valid number of %s\n", optarg,
                        c == 'm' ? "MiB" : "ms");
                return EXIT_USAGE;
            }
            if (c == 't') {
                o.timeout_ms = (uint32_t)v;
                o.timeout_set = true;
            } else if (c == 'm') {
                o.memory_mb = (uint32_t)v;
                o.memory_set = true;
            } else if (c == 'R') {
                o.retry_ms = (int64_t)v;
                o.retry_set = true;
            } else {
                o.wait_ms = (int64_t)v;
                o.wait_set = true;
            }
            break;
        }
        case 'i': o.id = optarg; break;
        case 'S': o.session = optarg; break;
        case 'D': o.save_dir = optarg; break;
        case 'F': o.format = optarg; break;
        case 'E': o.file_each = optarg; break;
        case 'B': o.batch = optarg; break;
        case 'J':
            o.jsonl = true;
            o.jsonl_file = optarg;
            break;
        case 'j': o.json = true; break;
        case 'W': o.wire_json = true; break;
        case 'n': o.no_save = true; break;
        case 'O': o.output = true; break;
        case 'u': o.url = optarg; break;
        case 'c': o.config = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return EXIT_USAGE;
        }
    }
    /* GNU getopt moves the operands behind the options, so options may
     * come before or after the command: `ci run x.py --file a.csv`. */
    if (optind >= argc) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const struct command *cmd = find_command(argv[optind]);
    if (!cmd) {
        say(stderr, "ci: unknown command '%s'\n", argv[optind]);
        usage(stderr);
        return EXIT_USAGE;
    }
    if (cmd->run != cmd_batch && (o.file_each || o.batch || o.jsonl)) {
        say(stderr, "ci: --file-each, --batch and --jsonl are for 'ci batch'\n");
        return EXIT_USAGE;
    }
    if (cmd->run != cmd_batch && o.retry_set) {
        say(stderr, "ci: --retry-ms is for 'ci batch wait'\n");
        return EXIT_USAGE;
    }
    if (cmd->run == cmd_batch) {
        struct ci_batch_cmdline bl = {
            .operands = (const char *const *)argv + optind + 1,
            .n_operands = (size_t)(argc - optind - 1),
            .file_each = o.file_each, .batch = o.batch, .jsonl = o.jsonl,
            .jsonl_file = o.jsonl_file, .json = o.json, .wait_set = o.wait_set,
            .retry_set = o.retry_set,
            .timeout_set = o.timeout_set, .memory_set = o.memory_set, .no_save = o.no_save,
            .wire_json = o.wire_json, .n_labels = o.n_labels, .n_files = o.n_files, .id = o.id,
            .session = o.session, .format = o.format, .save_dir = o.save_dir,
            .output = o.output,
        };
        struct ci_error be = {{0}};
        if (ci_batch_cmdline_check(&bl, &o.batch_cmd, &be)) {
            say(stderr, "ci: %s\n", be.msg);
            return EXIT_USAGE;
        }
    }
    int operands = cmd->operand ? 1 : 0;
    const char *arg = operands && optind + 1 < argc ? argv[optind + 1] : NULL;
    if (cmd->run == cmd_batch)
        operands = argc - optind - 1; /* checked above */
    if (cmd->run == cmd_session && arg) {
        bool needs_id = strcmp(arg, "show") == 0 || strcmp(arg, "close") == 0;
        if (!needs_id && strcmp(arg, "ls") != 0) {
            say(stderr, "ci: 'session %s': use 'session ls', 'session show ID' or 'session close ID'\n",
                arg);
            return EXIT_USAGE;
        }
        if (needs_id) {
            o.session_id = optind + 2 < argc ? argv[optind + 2] : NULL;
            if (!o.session_id) {
                say(stderr, "ci: 'session %s' needs a session id\n", arg);
                return EXIT_USAGE;
            }
            if (!ci_task_id_valid(o.session_id)) {
                say(stderr, "ci: '%s' is not a session id ([A-Za-z0-9_-]{1,64})\n", o.session_id);
                return EXIT_USAGE;
            }
            operands = 2;
        }
    }
    if (optind + 1 + operands < argc || (operands && !arg)) {
        if (operands && !arg)
            say(stderr, "ci: '%s' needs an argument\n", cmd->name);
        else
            say(stderr, "ci: unexpected argument '%s'\n", argv[optind + 1 + operands]);
        usage(stderr);
        return EXIT_USAGE;
    }
    if (cmd->task_id && !ci_task_id_valid(arg)) {
        say(stderr, "ci: '%s' is not a task id ([A-Za-z0-9_-]{1,64})\n", arg);
        return EXIT_USAGE;
    }
    /* Checked whole: copied into 65 bytes, a longer id would be cut to a
     * valid one and the task submitted under another id. */
    if (o.id && !ci_task_id_valid(o.id)) {
        say(stderr, "ci: task id '%s' is not [A-Za-z0-9_-]{1,64}\n", o.id);
        return EXIT_USAGE;
    }
    if (o.session && !ci_task_id_valid(o.session)) {
        say(stderr, "ci: session id '%s' is not [A-Za-z0-9_-]{1,64}\n", o.session);
        return EXIT_USAGE;
    }

    struct ci_config *cfg = NULL;
    struct ci_error e = {{0}};
    ci_status s = o.config ? ci_config_load(o.config, &cfg, &e) : ci_config_defaults(&cfg, &e);
    if (s) {
        say(stderr, "ci: %s\n", e.msg);
        return EXIT_USAGE;
    }
    if (o.url) {
        free(cfg->nats.url);
        cfg->nats.url = strdup(o.url);
    }
    free(cfg->nats.name);
    cfg->nats.name = strdup("ci-client");
    cfg->nats.max_reconnects = 5;
    /* `batch wait` asks again for --retry-ms while NATS is away: its
     * connection must go on trying as long (five tries, a second apart, and
     * nats.c closes it for good: every question after that fails). */
    if (cmd->run == cmd_batch && o.batch_cmd.verb == CI_BATCH_WAIT)
        cfg->nats.max_reconnects = -1;
    int rc = EXIT_INFRA;
    struct ci_broker *b = NULL;
    if (!cfg->nats.url || !cfg->nats.name) { /* a NULL url would mean the default server */
        say(stderr, "ci: out of memory\n");
        goto out;
    }
    if (ci_broker_connect(cfg, &b, &e) || ci_broker_setup(b, false, &e)) {
        say(stderr, "ci: %s\n", e.msg);
        if (!cmd->offline_ok)
            goto out;
        ci_broker_free(b);
        b = NULL;
    }
    rc = cmd->run(b, cfg, &o, arg);
    if (cmd->run == cmd_mcp)
        b = NULL; /* ci_mcp_serve() freed it */
out:
    ci_broker_free(b);
    ci_config_free(cfg);
    ci_broker_library_close();
    return rc;
}
