/* batch_client.c - a batch on NATS (batch_client.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/batch_client.h"
#include "cli/client.h"
#include "nats/broker.h"

/* What a task's headers (Nats-Msg-Id, Content-Type) add to its message,
 * which the server's max_payload counts too. */
#define HEADER_ROOM 256

/* --- reading --- */

/* A batch stream missing: no worker that serves batches has made it. */
static ci_status no_stream(struct ci_error *err, const char *stream)
{
    return ci_error_set(err, CI_ERR_NOT_FOUND,
                        "stream %s not found: no worker that serves batches has run on this "
                        "NATS yet (workers make it at start)", stream);
}

ci_status ci_batch_read_raw(struct ci_broker *b, const struct ci_config *cfg, const char *batch,
                            struct ci_batch_raw *ret, struct ci_error *err)
{
    struct ci_batch_raw raw;
    memset(&raw, 0, sizeof(raw));
    ci_status s = ci_broker_batch_counts(b, batch, &raw.events, err);
    if (s == CI_ERR_NOT_FOUND)
        return no_stream(err, cfg->jetstream.batch_events_stream);
    if (s)
        return s;
    if (raw.events.sealed) {
        CI_AUTOFREE uint8_t *data = NULL;
        size_t len = 0;
        s = ci_broker_batch_last(b, batch, "sealed", &data, &len, err);
        if (s == CI_OK) {
            struct ci_error pe = {{0}};
            if (ci_batch_seal_total(data, len, &raw.seal_total, &pe))
                return ci_error_set(err, CI_ERR_INVALID, "batch %s: %s", batch, pe.msg);
            raw.sealed = true;
        } else if (s != CI_ERR_NOT_FOUND) { /* not found: expired since the count */
            return s;
        }
    }
    /* Before the seal, the tasks still in the work queue make the total. */
    if (!raw.sealed) {
        s = ci_broker_batch_queued(b, batch, &raw.left, err);
        if (s == CI_ERR_NOT_FOUND)
            return no_stream(err, cfg->jetstream.batch_stream);
        if (s)
            return s;
    }
    *ret = raw;
    return CI_OK;
}

ci_status ci_batch_complete_if_done(struct ci_broker *b, const char *batch,
                                    const struct ci_batch_raw *raw, bool *ret_stored,
                                    struct ci_error *err)
{
    *ret_stored = false;
    if (!raw->sealed || raw->events.complete ||
        !ci_batch_is_complete(&raw->events, raw->seal_total))
        return CI_OK;
    char id[96];
    snprintf(id, sizeof(id), "%s.complete", batch);
    CI_AUTOFREE char *body = NULL;
    size_t len = 0;
    ci_status s = ci_batch_complete_body(batch, raw->seal_total, &raw->events, &body, &len, err);
    bool dup = false;
    if (!s)
        s = ci_broker_batch_publish(b, batch, "complete", id, "application/json", body, len,
                                    &dup, err);
    if (!s)
        *ret_stored = !dup;
    return s;
}

struct ends_read {
    const char *prefix, *batch;
    unsigned mask;
    ci_batch_end_fn fn;
    void *closure;
    size_t unreadable;
};

static bool on_end_msg(void *closure, const char *subject, const uint8_t *data, size_t len)
{
    struct ends_read *r = closure;
    enum ci_batch_event ev = ci_batch_event_of(r->prefix, r->batch, subject);
    if (ev == CI_BATCH_EV_UNKNOWN || !(r->mask & (1u << ev)) || !ci_batch_event_ended(ev))
        return true;
    struct ci_batch_end end;
    if (ci_batch_end_parse(data, len, &end, NULL)) {
        r->unreadable++;
        return true;
    }
    /* The subject says the status; the body is the worker's copy of it. */
    end.event = ev;
    return r->fn(r->closure, &end);
}

ci_status ci_batch_read_ends(struct ci_broker *b, const struct ci_config *cfg, const char *batch,
                             unsigned mask, size_t max, ci_batch_end_fn fn, void *closure,
                             size_t *ret_unreadable, bool *ret_cut, struct ci_error *err)
{
    struct ends_read r = {cfg->jetstream.batch_events_prefix, batch, mask, fn, closure, 0};
    /* One event kind: its own subject, so that the others are not read. */
    const char *only = "*";
    for (int ev = 0; ev < CI_BATCH_EV_COUNT; ev++)
        if (mask == 1u << ev)
            only = ci_batch_event_name((enum ci_batch_event)ev);
    ci_status s = ci_broker_batch_read(b, batch, only, max, on_end_msg, &r, NULL, ret_cut, err);
    if (s == CI_ERR_NOT_FOUND)
        return no_stream(err, cfg->jetstream.batch_events_stream);
    if (ret_unreadable)
        *ret_unreadable = r.unreadable;
    return s;
}

ci_status ci_batch_result_line(struct ci_broker *b, const char *batch,
                               const struct ci_batch_end *end, char **ret, size_t *ret_len,
                               bool *ret_expired, struct ci_error *err)
{
    Ci__V1__ExecutionResult *r = NULL;
    ci_status s = ci_client_result_get(b, end->task_id, &r, err);
    uint8_t *line = NULL;
    size_t len = 0;
    *ret_expired = s == CI_ERR_NOT_FOUND;
    if (s == CI_OK) {
        s = ci_message_encode(CI_ENC_JSON, &r->base, &line, &len, err);
        ci_message_free(&r->base);
    } else if (s == CI_ERR_NOT_FOUND || s == CI_ERR_INVALID) {
        /* Results live an hour, a batch's events a day: what the end event
         * says stands in for a record that is gone, or that is not an
         * ExecutionResult (contract §20). */
        char why[1024];
        snprintf(why, sizeof(why), "%s%s%.700s",
                 s == CI_ERR_NOT_FOUND ? "the result expired from the results bucket"
                                       : "the stored result cannot be read",
                 end->error[0] ? "; the task's end event said: " : "", end->error);
        Ci__V1__ExecutionResult x = CI__V1__EXECUTION_RESULT__INIT;
        x.task_id = (char *)end->task_id;
        x.status = ci_batch_event_status(end->event);
        x.error = why;
        x.batch_id = (char *)batch;
        s = ci_message_encode(CI_ENC_JSON, &x.base, &line, &len, err);
    }
    if (s)
        return s;
    *ret = (char *)line;
    *ret_len = len;
    return CI_OK;
}

ci_status ci_batch_cancel(struct ci_broker *b, const struct ci_config *cfg, const char *batch,
                          struct ci_error *err)
{
    ci_status s = ci_broker_batch_publish(b, batch, "cancel", NULL, NULL, "", 0, NULL, err);
    if (s == CI_ERR_NOT_FOUND)
        return no_stream(err, cfg->jetstream.batch_events_stream);
    return s;
}

/* --- a JSONL file, line by line --- */

struct lines {
    int fd;
    const char *path;
    uint8_t *buf;
    size_t cap, start, end;
    bool eof;
    size_t line_no;  /* of the line returned last */
    size_t requests; /* lines that were not blank, so far */
};

static ci_status lines_open(struct lines *l, const char *path, struct ci_error *err)
{
    memset(l, 0, sizeof(*l));
    l->path = path;
    if (strcmp(path, "-") == 0)
        return ci_error_set(err, CI_ERR_INVALID,
                            "--jsonl: give a file, not standard input: it is read twice (every "
                            "line is checked before the first task goes out)");
    l->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (l->fd < 0)
        return ci_error_errno(err, CI_ERR_INVALID, errno, "cannot open '%.200s'", path);
    return CI_OK;
}

static void lines_close(struct lines *l)
{
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
    free(l->buf);
    l->buf = NULL;
}

static ci_status lines_rewind(struct lines *l, struct ci_error *err)
{
    if (lseek(l->fd, 0, SEEK_SET) != 0)
        return ci_error_errno(err, CI_ERR_INVALID, errno, "cannot read '%.200s' again", l->path);
    l->start = l->end = 0;
    l->eof = false;
    l->line_no = 0;
    l->requests = 0;
    return CI_OK;
}

/* The next line, without its newline, valid until the next call.
 * CI_ERR_NOT_FOUND at the end of the file. */
static ci_status lines_next(struct lines *l, const uint8_t **ret, size_t *ret_len,
                            struct ci_error *err)
{
    for (;;) {
        uint8_t *nl = l->end > l->start ? memchr(l->buf + l->start, '\n', l->end - l->start)
                                        : NULL;
        if (nl || (l->eof && l->end > l->start)) {
            size_t len = nl ? (size_t)(nl - (l->buf + l->start)) : l->end - l->start;
            *ret = l->buf + l->start;
            *ret_len = len;
            l->start += len + (nl ? 1 : 0);
            l->line_no++;
            if (len > CI_BATCH_MAX_LINE)
                return ci_error_set(err, CI_ERR_INVALID, "%.200s:%zu: the line is longer than "
                                    "%u bytes", l->path, l->line_no, CI_BATCH_MAX_LINE);
            return CI_OK;
        }
        if (l->eof)
            return CI_ERR_NOT_FOUND;
        if (l->end - l->start > CI_BATCH_MAX_LINE)
            return ci_error_set(err, CI_ERR_INVALID, "%.200s:%zu: the line is longer than %u "
                                "bytes", l->path, l->line_no + 1, CI_BATCH_MAX_LINE);
        if (l->start) { /* keep the partial line at the front */
            memmove(l->buf, l->buf + l->start, l->end - l->start);
            l->end -= l->start;
            l->start = 0;
        }
        if (l->end == l->cap) {
            size_t cap = l->cap ? l->cap * 2 : 65536;
            uint8_t *grown = realloc(l->buf, cap);
            if (!grown)
                return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
            l->buf = grown;
            l->cap = cap;
        }
        ssize_t n = read(l->fd, l->buf + l->end, l->cap - l->end);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ci_error_errno(err, CI_ERR_INVALID, errno, "cannot read '%.200s'", l->path);
        if (n == 0)
            l->eof = true;
        l->end += (size_t)n;
    }
}

/* The request of the next non-blank line, the file's l->requests-th (its
 * default task id <batch>-<n> counts requests, not lines: a blank line
 * added or removed changes no id); CI_ERR_NOT_FOUND at the end. An error
 * names the file and the line. */
static ci_status next_request(struct lines *l, const struct ci_config *cfg, const char *batch,
                              Ci__V1__ExecutionRequest **ret, struct ci_error *err)
{
    for (;;) {
        const uint8_t *line = NULL;
        size_t len = 0;
        ci_status s = lines_next(l, &line, &len, err);
        if (s)
            return s;
        if (ci_batch_line_blank(line, len))
            continue;
        l->requests++;
        struct ci_error e = {{0}};
        s = ci_batch_jsonl_request(cfg, batch, l->requests, line, len, ret, &e);
        if (s)
            return ci_error_set(err, s == CI_ERR_NOMEM ? s : CI_ERR_INVALID, "%.200s:%zu: %s",
                                l->path, l->line_no, e.msg);
        return CI_OK;
    }
}

/* Pass one: every line decodes, keeps the rules, fits in a message, and
 * no two share a task id. Gives the task ids in the file's order, with
 * their lines (*ret_ids, the caller's; their count is the number of tasks). */
static ci_status jsonl_check(struct ci_broker *b, const struct ci_config *cfg,
                             const struct ci_batch_submit *a, struct lines *l,
                             struct ci_batch_id_line **ret_ids, uint64_t *ret_total,
                             struct ci_error *err)
{
    enum ci_encoding enc = a->wire_json ? CI_ENC_JSON : CI_ENC_PROTOBUF;
    int64_t max_payload = ci_broker_max_payload(b);
    struct ci_batch_id_line *ids = NULL, *sorted = NULL;
    size_t n = 0, cap = 0;
    ci_status s;
    for (;;) {
        Ci__V1__ExecutionRequest *req = NULL;
        s = next_request(l, cfg, a->batch, &req, err);
        if (s == CI_ERR_NOT_FOUND) {
            s = CI_OK;
            break;
        }
        if (s)
            break;
        if (n == CI_BATCH_MAX_TASKS) {
            ci_message_free(&req->base);
            s = ci_error_set(err, CI_ERR_INVALID, "%.200s:%zu: more than %d requests; a batch "
                             "holds at most %d tasks: split the file", l->path, l->line_no,
                             CI_BATCH_MAX_TASKS, CI_BATCH_MAX_TASKS);
            break;
        }
        uint8_t *wire = NULL;
        size_t wire_len = 0;
        s = ci_message_encode(enc, &req->base, &wire, &wire_len, err);
        free(wire);
        if (!s && max_payload > 0 && wire_len + HEADER_ROOM > (uint64_t)max_payload)
            s = ci_error_set(err, CI_ERR_INVALID,
                             "%.200s:%zu: the request is %zu bytes; the server takes messages "
                             "of at most %" PRId64 " bytes (headers included): put large "
                             "inputs in the object store and name them (\"object\")",
                             l->path, l->line_no, wire_len, max_payload);
        if (!s && n == cap) {
            size_t c = cap ? cap * 2 : 256;
            struct ci_batch_id_line *grown = realloc(ids, c * sizeof(*grown));
            if (!grown)
                s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
            else {
                ids = grown;
                cap = c;
            }
        }
        if (!s) {
            snprintf(ids[n].id, sizeof(ids[n].id), "%s", req->task_id);
            ids[n++].line = l->line_no;
        }
        ci_message_free(&req->base);
        if (s)
            break;
    }
    if (!s && n == 0)
        s = ci_error_set(err, CI_ERR_INVALID, "'%.200s' holds no request (one JSON object per "
                         "line)", l->path);
    if (!s && !(sorted = malloc(n * sizeof(*sorted))))
        s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    if (!s) {
        memcpy(sorted, ids, n * sizeof(*sorted));
        struct ci_error e = {{0}};
        if (ci_batch_ids_unique(sorted, n, &e))
            s = ci_error_set(err, CI_ERR_INVALID, "%.200s: %s: each task needs its own id",
                             l->path, e.msg);
    }
    free(sorted);
    if (s) {
        free(ids);
        return s;
    }
    *ret_ids = ids;
    *ret_total = n;
    return CI_OK;
}

/* --- submitting --- */

/* Every input of a --file-each batch before the first task goes out: the
 * files (names, sizes, readable: ci_batch_files_check), then the largest
 * messages the tasks make, built as they will be (the file sent inline
 * that makes the most bytes, the uploaded one with the longest name, under
 * the longest task id) against the server's max_payload; the labels are
 * checked with them. */
static ci_status files_check(struct ci_broker *b, const struct ci_config *cfg,
                             const struct ci_batch_submit *a, struct ci_error *err)
{
    struct ci_batch_files_extremes x;
    ci_status s = ci_batch_files_check(a->paths, a->n_paths, cfg->limits.max_input_bytes,
                                       CI_CLIENT_INLINE_MAX, a->wire_json, &x, err);
    if (s)
        return s;
    char id[65];
    if ((s = ci_batch_task_id(a->batch, a->n_paths, id, err)))
        return s;
    int64_t max_payload = ci_broker_max_payload(b);
    size_t which[2] = {x.largest_inline, x.longest_uploaded};
    for (size_t i = 0; i < 2; i++) {
        if (which[i] == SIZE_MAX)
            continue;
        const char *path = a->paths[which[i]];
        char got[65];
        size_t wire_len = 0;
        struct ci_submit_args sa = {
            .code = a->code, .code_len = a->code_len, .id = id,
            .files = &path, .n_files = 1, .labels = a->labels, .n_labels = a->n_labels,
            .timeout_ms = a->timeout_ms, .memory_mb = a->memory_mb, .wire_json = a->wire_json,
            .batch = a->batch, .measure = &wire_len,
        };
        struct ci_error e = {{0}};
        s = ci_client_submit(b, cfg, &sa, got, NULL, &e);
        if (s)
            return ci_error_set(err, s == CI_ERR_NOMEM ? s : CI_ERR_INVALID,
                                "--file-each: '%.200s': %s; nothing was submitted", path, e.msg);
        if (max_payload > 0 && wire_len + HEADER_ROOM > (uint64_t)max_payload)
            return ci_error_set(err, CI_ERR_INVALID,
                                "--file-each: the task for '%.200s' would be a message of %zu "
                                "bytes; the server takes messages of at most %" PRId64 " bytes "
                                "(headers included): make the script or the inputs sent inline "
                                "(up to %d KiB each) smaller; nothing was submitted",
                                path, wire_len, max_payload, CI_CLIENT_INLINE_MAX / 1024);
    }
    return CI_OK;
}

/* The ids of the batch's tasks that a worker took (its taken events, kept
 * batches.max_age_s): such a task is never published again, also after
 * its result and the queue's dedup window (1 h) are gone. Sorted. */
struct taken {
    char (*ids)[65];
    size_t n, cap;
    bool full;
};

static bool on_taken_msg(void *closure, const char *subject, const uint8_t *data, size_t len)
{
    struct taken *t = closure;
    if (len == 0 || len > 64)
        return true;
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 1024;
        void *p = cap <= 2 * (size_t)CI_BATCH_MAX_TASKS ? realloc(t->ids, cap * sizeof(*t->ids))
                                                       : NULL;
        if (!p) {
            t->full = true;
            return false;
        }
        t->ids = p;
        t->cap = cap;
    }
    memcpy(t->ids[t->n], data, len);
    t->ids[t->n][len] = '\0';
    t->n++;
    return true;
}

static int cmp_id(const void *a, const void *b) { return strcmp(a, b); }

static ci_status taken_read(struct ci_broker *b, const char *batch, uint64_t count,
                            struct taken *t, struct ci_error *err)
{
    if (count == 0)
        return CI_OK;
    size_t read = 0;
    ci_status s = ci_broker_batch_read(b, batch, "taken", (size_t)count, on_taken_msg, t, &read,
                                       NULL, err);
    if (!s && t->full)
        s = ci_error_set(err, CI_ERR_NOMEM, "out of memory reading batch %s's taken tasks",
                         batch);
    if (!s)
        qsort(t->ids, t->n, sizeof(*t->ids), cmp_id);
    return s;
}

static bool taken_has(const struct taken *t, const char *id)
{
    return t->n && bsearch(id, t->ids, t->n, sizeof(*t->ids), cmp_id);
}

/* How many lookups `ci batch submit` keeps in flight: enough to hide the
 * round trip (a 100,000-task batch checked one at a time waited ~15 s on
 * a local server before its first task, minutes on a remote one), few
 * enough that the answers waiting stay small. */
#define LOOKUP_WINDOW 64

/* Pass two, its lookups in ci-results and what they decide. */
struct plan {
    const struct ci_batch_submit *a;
    const struct ci_batch_id_line *ids; /* a JSONL file's; NULL for --file-each */
    char (*look)[65];                   /* the ids looked up */
    uint64_t *task_of;                  /* look[i] is the id of task task_of[i] (from 1) */
    bool *skip;
    uint64_t checked, total;
    uint64_t in_use;                    /* the first task whose id is in use, 0: none */
    struct ci_error why;                /* what says so */
    ci_batch_progress_fn progress;
    void *closure;
};

/* How errors name task n: its JSONL line, or its file. */
static void task_what(const struct plan *p, uint64_t n, char *out, size_t size)
{
    if (p->ids)
        snprintf(out, size, "%.200s:%zu", p->a->jsonl_path, p->ids[n - 1].line);
    else
        snprintf(out, size, "--file-each: the task of '%.200s'", p->a->paths[n - 1]);
}

/* One lookup's answer: a terminal record of this batch is skipped; a
 * record of another batch, or of a task outside any batch, means the id
 * is in use: refused, since the task would not run (a terminal result
 * stands, contract §11) or its events would be dropped as copies of the
 * other task's (the same Nats-Msg-Id), and the batch would never complete.
 * A record that cannot be read is taken for none. */
static bool on_lookup(void *closure, size_t i, ci_status s, const uint8_t *data, size_t len)
{
    struct plan *p = closure;
    uint64_t n = p->task_of[i];
    const char *id = p->look[i];
    Ci__V1__ExecutionResult *r = NULL;
    bool go_on = true;
    if (s == CI_OK && ci_client_result_decode(data, len, &r, NULL) == CI_OK) {
        const struct ci_batch_submit *a = p->a;
        const char *other = r->batch_id ? r->batch_id : "";
        if (strcmp(other, a->batch) == 0) {
            p->skip[n - 1] = ci_task_status_terminal(r->status);
        } else if (!p->in_use || n < p->in_use) {
            /* Answers come in any order: the first line or file is named. */
            char whose[96], what[320];
            if (other[0])
                snprintf(whose, sizeof(whose), "a task of batch '%s'", other);
            else
                snprintf(whose, sizeof(whose), "a task outside any batch");
            task_what(p, n, what, sizeof(what));
            ci_error_set(&p->why, CI_ERR_INVALID,
                         "%s: task id '%s' is in use: %s has it (%s in the results bucket); "
                         "task ids must be unique for at least an hour (contract §11): %s; "
                         "nothing was submitted",
                         what, id, whose, ci_task_status_short(r->status),
                         a->jsonl_path ? "give the line another taskId"
                                       : "submit under another --batch");
            p->in_use = n;
            go_on = false;
        }
    }
    if (r)
        ci_message_free(&r->base);
    p->checked++;
    if (p->progress)
        p->progress(p->closure, "checked", p->checked, p->total);
    return go_on;
}

/* Pass two, before anything goes out: which tasks to publish (skip[n-1]
 * false), and that no task id is in use outside the batch (on_lookup).
 * A task a worker took (its taken event) is skipped without a lookup; so
 * is the lookup of an id <batch>-<n> of a batch id this submission made
 * (nothing else can have it). The others are looked up LOOKUP_WINDOW at a
 * time. ids: a JSONL file's, in its order; NULL for --file-each. */
static ci_status plan(struct ci_broker *b, const struct ci_batch_submit *a,
                      const struct taken *taken, const struct ci_batch_id_line *ids,
                      uint64_t total, bool *skip, ci_batch_progress_fn progress, void *closure,
                      struct ci_error *err)
{
    struct plan p = {.a = a, .ids = ids, .skip = skip, .total = total, .progress = progress,
                     .closure = closure};
    CI_AUTOFREE char(*look)[65] = malloc(total * sizeof(*look));
    CI_AUTOFREE uint64_t *task_of = malloc(total * sizeof(*task_of));
    if (!look || !task_of)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    size_t prefix = strlen(a->batch), n_look = 0;
    for (uint64_t n = 1; n <= total; n++) {
        char id[65];
        if (ids) {
            snprintf(id, sizeof(id), "%s", ids[n - 1].id);
        } else {
            ci_status s = ci_batch_task_id(a->batch, n, id, err);
            if (s)
                return s;
        }
        if (taken_has(taken, id))
            skip[n - 1] = true;
        else if (!(a->batch_new && strncmp(id, a->batch, prefix) == 0 && id[prefix] == '-')) {
            memcpy(look[n_look], id, sizeof(id));
            task_of[n_look++] = n;
        }
    }
    p.look = look;
    p.task_of = task_of;
    p.checked = total - n_look;
    if (progress && p.checked)
        progress(closure, "checked", p.checked, total);
    ci_status s = ci_broker_results_get_many(b, (const char(*)[65])look, n_look, LOOKUP_WINDOW,
                                             on_lookup, &p, err);
    if (!s && p.in_use)
        s = ci_error_set(err, CI_ERR_INVALID, "%s", p.why.msg);
    return s;
}

/* Publishes task n of a --file-each batch. */
static ci_status submit_file(struct ci_broker *b, const struct ci_config *cfg,
                             const struct ci_batch_submit *a, uint64_t n, bool *ret_dup,
                             struct ci_error *err)
{
    char id[65], got[65];
    ci_status s = ci_batch_task_id(a->batch, n, id, err);
    if (s)
        return s;
    struct ci_submit_args sa = {
        .code = a->code, .code_len = a->code_len, .id = id,
        .files = (const char *const *)&a->paths[n - 1], .n_files = 1,
        .labels = a->labels, .n_labels = a->n_labels,
        .timeout_ms = a->timeout_ms, .memory_mb = a->memory_mb, .wire_json = a->wire_json,
        .batch = a->batch,
    };
    return ci_client_submit(b, cfg, &sa, got, ret_dup, err);
}

/* Reads the next request of a JSONL batch, which pass one saw as id, and
 * publishes it unless skip. */
static ci_status submit_line(struct ci_broker *b, const struct ci_config *cfg,
                             const struct ci_batch_submit *a, struct lines *l, const char *id,
                             bool skip, bool *ret_dup, struct ci_error *err)
{
    Ci__V1__ExecutionRequest *req = NULL;
    ci_status s = next_request(l, cfg, a->batch, &req, err);
    if (s == CI_ERR_NOT_FOUND)
        return ci_error_set(err, CI_ERR_INVALID, "'%.200s' changed while it was submitted: it "
                            "has fewer requests than a moment ago", l->path);
    if (s)
        return s;
    if (strcmp(req->task_id, id) != 0)
        s = ci_error_set(err, CI_ERR_INVALID, "%.200s:%zu: the file changed while it was "
                         "submitted: this request's task id is now '%s', not '%s'", l->path,
                         l->line_no, req->task_id, id);
    enum ci_encoding enc = a->wire_json ? CI_ENC_JSON : CI_ENC_PROTOBUF;
    uint8_t *wire = NULL;
    size_t wire_len = 0;
    if (!s && !skip)
        s = ci_message_encode(enc, &req->base, &wire, &wire_len, err);
    if (!s && !skip)
        s = ci_broker_submit_batch(b, a->batch, req->task_id, ci_encoding_content_type(enc),
                                   wire, wire_len, ret_dup, err);
    free(wire);
    ci_message_free(&req->base);
    return s;
}

/* A task of the batch that CI_BATCH dropped as a copy of a message that
 * is not on another batch's subject (ci_broker_submit_batch refuses
 * those): on this batch's, or taken and acked since. Its record decides
 * (contract §20): one of another batch or of none is in use
 * (CI_ERR_CONFLICT); one of this batch makes it this batch's own; with
 * none, so does a batch that had tasks stored when the submission began
 * (fresh false), while a fresh one cannot have a copy of its own. A
 * record that cannot be read is taken for none. */
static ci_status copy_check(struct ci_broker *b, const struct ci_batch_submit *a,
                            const char *id, bool fresh, struct ci_error *err)
{
    Ci__V1__ExecutionResult *r = NULL;
    struct ci_error e = {{0}};
    ci_status s = ci_client_result_get(b, id, &r, &e);
    if (s && s != CI_ERR_NOT_FOUND && s != CI_ERR_INVALID)
        return ci_error_set(err, s, "task '%s' was dropped as a copy; its record cannot be "
                            "read: %s", id, e.msg);
    if (s == CI_OK) {
        const char *other = r->batch_id ? r->batch_id : "";
        char whose[96];
        if (other[0])
            snprintf(whose, sizeof(whose), "a task of batch '%.64s'", other);
        else
            snprintf(whose, sizeof(whose), "a task outside any batch");
        bool mine = strcmp(other, a->batch) == 0;
        if (!mine)
            ci_error_set(err, CI_ERR_CONFLICT, "task id '%s' is in use: %s has it (%s in the "
                         "results bucket; CI_BATCH dropped this task as a copy of it)", id,
                         whose, ci_task_status_short(r->status));
        ci_message_free(&r->base);
        return mine ? CI_OK : CI_ERR_CONFLICT;
    }
    if (!fresh)
        return CI_OK;
    return ci_error_set(err, CI_ERR_CONFLICT,
                        "task id '%s' is in use: CI_BATCH dropped this task as a copy of one "
                        "that no record says is of this batch, which had nothing stored when "
                        "this submission began (a task of another batch, or of a submission of "
                        "this batch running at the same time)", id);
}

ci_status ci_batch_submit(struct ci_broker *b, const struct ci_config *cfg,
                          const struct ci_batch_submit *a, ci_batch_progress_fn progress,
                          void *closure, struct ci_batch_submitted *ret, struct ci_error *err)
{
    struct ci_batch_submitted out;
    memset(&out, 0, sizeof(out));
    struct lines l = {.fd = -1};
    struct ci_batch_id_line *ids = NULL; /* --jsonl: the task ids in the file's order */
    bool *skip = NULL;
    ci_status s = CI_OK;
    /* Pass one: every input, before anything goes out. */
    if (a->jsonl_path) {
        if (!(s = lines_open(&l, a->jsonl_path, err)) &&
            !(s = jsonl_check(b, cfg, a, &l, &ids, &out.total, err)))
            s = lines_rewind(&l, err);
    } else {
        out.total = a->n_paths;
        if (out.total == 0 || out.total > CI_BATCH_MAX_TASKS)
            s = ci_error_set(err, CI_ERR_INVALID, "a batch holds 1 to %d tasks, not %" PRIu64,
                             CI_BATCH_MAX_TASKS, out.total);
        else if (!(s = ci_batch_id_check(a->batch, out.total, err)))
            s = files_check(b, cfg, a, err);
    }
    /* The streams exist, and a seal there already agrees. */
    struct ci_batch_raw raw;
    if (!s)
        s = ci_batch_read_raw(b, cfg, a->batch, &raw, err);
    if (!s && raw.sealed) {
        if (raw.seal_total != out.total)
            s = ci_error_set(err, CI_ERR_CONFLICT,
                             "batch %s was sealed with %" PRIu64 " tasks; this submission has %"
                             PRIu64 ": a batch cannot change once sealed, submit under another "
                             "--batch", a->batch, raw.seal_total, out.total);
        out.seal_was_there = true;
    }
    /* A batch with no task stored when this began has no copy of its own
     * within CI_BATCH's duplicate window: a copy that nothing says is of
     * this batch is another's, and this batch's task of that id would
     * never run nor count (copy_check, contract §20). */
    bool fresh = !s && !ci_batch_raw_submitted(&raw);
    /* Pass two: what goes out, and no task id in use elsewhere. */
    struct taken taken = {0};
    if (!s)
        s = taken_read(b, a->batch, raw.events.taken, &taken, err);
    if (!s && !(skip = calloc(out.total, sizeof(*skip))))
        s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    if (!s)
        s = plan(b, a, &taken, ids, out.total, skip, progress, closure, err);
    free(taken.ids);
    /* Then the tasks. */
    for (uint64_t n = 1; !s && n <= out.total; n++) {
        bool dup = false;
        if (a->jsonl_path)
            s = submit_line(b, cfg, a, &l, ids[n - 1].id, skip[n - 1], &dup, err);
        else if (!skip[n - 1])
            s = submit_file(b, cfg, a, n, &dup, err);
        char id[65];
        if (a->jsonl_path)
            snprintf(id, sizeof(id), "%s", ids[n - 1].id);
        else
            ci_batch_task_id(a->batch, n, id, NULL);
        /* A copy on another batch's subject the broker refused; any other
         * its record judges. */
        if (!s && dup)
            s = copy_check(b, a, id, fresh, err);
        if (s == CI_ERR_CONFLICT) {
            char what[320];
            struct ci_error why = *err;
            if (a->jsonl_path)
                snprintf(what, sizeof(what), "%.200s:%zu", a->jsonl_path, ids[n - 1].line);
            else
                snprintf(what, sizeof(what), "--file-each: the task of '%.200s'",
                         a->paths[n - 1]);
            s = ci_error_set(err, CI_ERR_INVALID, "%s: %s; task ids must be unique (contract "
                             "§11): %s", what, why.msg,
                             a->jsonl_path ? "give the line another taskId"
                                           : "submit under another --batch");
            out.in_use = true;
        }
        if (!s) {
            if (skip[n - 1])
                out.skipped++;
            else if (dup)
                out.duplicates++;
            else
                out.published++;
        }
        if (!s && progress)
            progress(closure, "submitted", n, out.total);
    }
    if (!s && a->jsonl_path) {
        Ci__V1__ExecutionRequest *extra = NULL;
        struct ci_error ignored = {{0}};
        if (next_request(&l, cfg, a->batch, &extra, &ignored) != CI_ERR_NOT_FOUND) {
            ci_message_free(extra ? &extra->base : NULL);
            s = ci_error_set(err, CI_ERR_INVALID, "'%.200s' changed while it was submitted: it "
                             "has more lines than a moment ago; not sealed", l.path);
        }
    }
    lines_close(&l);
    free(ids);
    free(skip);
    if (s) {
        *ret = out;
        return s;
    }
    if (!out.seal_was_there) {
        char id[96];
        snprintf(id, sizeof(id), "%s.sealed", a->batch);
        CI_AUTOFREE char *body = NULL;
        size_t len = 0;
        s = ci_batch_seal_body(out.total, &body, &len, err);
        if (!s)
            s = ci_broker_batch_publish(b, a->batch, "sealed", id, "application/json", body, len,
                                        NULL, err);
    }
    out.sealed = !s;
    /* The last task may have ended before the seal: then no worker saw
     * the batch complete, and the sealer says so (contract §20). */
    if (!s)
        s = ci_batch_read_raw(b, cfg, a->batch, &raw, err);
    if (!s && !raw.sealed) {
        /* The seal is stored, with this total, should the read not
         * show it yet. */
        raw.sealed = true;
        raw.seal_total = out.total;
        raw.events.sealed = 1;
    }
    if (!s) {
        ci_batch_state_compute(&raw, &out.counts);
        s = ci_batch_complete_if_done(b, a->batch, &raw, &out.completed, err);
    }
    *ret = out;
    return s;
}
