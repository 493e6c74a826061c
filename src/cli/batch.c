/* batch.c - a batch to a client, without NATS (batch.h). */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/batch.h"
#include "core/request.h"

/* --- the command line --- */

enum opt_bit {
    O_FILE_EACH = 1u << 0,
    O_BATCH = 1u << 1,
    O_JSONL = 1u << 2,
    O_JSON = 1u << 3,
    O_WAIT = 1u << 4,
    O_TIMEOUT = 1u << 5,
    O_MEMORY = 1u << 6,
    O_NO_SAVE = 1u << 7,
    O_WIRE_JSON = 1u << 8,
    O_LABEL = 1u << 9,
    O_FILE = 1u << 10,
    O_ID = 1u << 11,
    O_SESSION = 1u << 12,
    O_FORMAT = 1u << 13,
    O_SAVE_DIR = 1u << 14,
    O_OUTPUT = 1u << 15,
    O_RETRY = 1u << 16,
};

static const struct {
    unsigned bit;
    const char *name;
    const char *why; /* said when it does not apply; NULL: nothing more */
} opt_names[] = {
    {O_FILE_EACH, "--file-each", "it is for 'ci batch submit'"},
    {O_BATCH, "--batch", "the batch is the operand here"},
    {O_JSONL, "--jsonl", NULL},
    {O_JSON, "--json", NULL},
    {O_WAIT, "--wait-ms", "it is for 'ci batch wait'"},
    {O_TIMEOUT, "--timeout-ms", "it is for 'ci batch submit --file-each' (a JSONL line sets "
                                "its own limits)"},
    {O_MEMORY, "--memory-mb", "it is for 'ci batch submit --file-each' (a JSONL line sets "
                              "its own limits)"},
    {O_NO_SAVE, "--no-save", "batch commands save no artifacts"},
    {O_WIRE_JSON, "--wire-json", "it is for 'ci batch submit'"},
    {O_LABEL, "--label", "it is for 'ci batch submit --file-each' (a JSONL line sets its "
                         "own labels)"},
    {O_FILE, "--file", "each task's input comes from --file-each"},
    {O_ID, "--id", "task ids are <batch>-<n>: name the batch with --batch"},
    {O_SESSION, "--session", "a batch task is not a session's step"},
    {O_FORMAT, "--format", "it is for 'ci tools'"},
    {O_SAVE_DIR, "--save-dir", "it is for 'ci mcp'"},
    {O_OUTPUT, "--output", "it is for 'ci watch'"},
    {O_RETRY, "--retry-ms", "it is for 'ci batch wait'"},
};

static unsigned given_options(const struct ci_batch_cmdline *in)
{
    unsigned g = 0;
    g |= in->file_each ? O_FILE_EACH : 0;
    g |= in->batch ? O_BATCH : 0;
    g |= in->jsonl ? O_JSONL : 0;
    g |= in->json ? O_JSON : 0;
    g |= in->wait_set ? O_WAIT : 0;
    g |= in->timeout_set ? O_TIMEOUT : 0;
    g |= in->memory_set ? O_MEMORY : 0;
    g |= in->no_save ? O_NO_SAVE : 0;
    g |= in->wire_json ? O_WIRE_JSON : 0;
    g |= in->n_labels ? O_LABEL : 0;
    g |= in->n_files ? O_FILE : 0;
    g |= in->id ? O_ID : 0;
    g |= in->session ? O_SESSION : 0;
    g |= in->format ? O_FORMAT : 0;
    g |= in->save_dir ? O_SAVE_DIR : 0;
    g |= in->output ? O_OUTPUT : 0;
    g |= in->retry_set ? O_RETRY : 0;
    return g;
}

static const struct {
    const char *name;
    enum ci_batch_verb verb;
} verbs[] = {
    {"submit", CI_BATCH_SUBMIT}, {"status", CI_BATCH_STATUS}, {"wait", CI_BATCH_WAIT},
    {"results", CI_BATCH_RESULTS}, {"cancel", CI_BATCH_CANCEL},
};

ci_status ci_batch_cmdline_check(const struct ci_batch_cmdline *in, struct ci_batch_cmd *ret,
                                 struct ci_error *err)
{
    struct ci_batch_cmd c = {0};
    if (in->n_operands == 0)
        return ci_error_set(err, CI_ERR_INVALID,
                            "'batch' needs a command: submit, status, wait, results or cancel");
    const char *verb = in->operands[0];
    size_t v = 0;
    while (v < sizeof(verbs) / sizeof(verbs[0]) && strcmp(verbs[v].name, verb) != 0)
        v++;
    if (v == sizeof(verbs) / sizeof(verbs[0]))
        return ci_error_set(err, CI_ERR_INVALID,
                            "'batch %.64s': use batch submit, status, wait, results or cancel",
                            verb);
    c.verb = verbs[v].verb;
    unsigned allowed = 0;
    size_t want = 1; /* operands after the verb */
    switch (c.verb) {
    case CI_BATCH_SUBMIT:
        if (in->file_each && in->jsonl)
            return ci_error_set(err, CI_ERR_INVALID,
                                "'batch submit' takes --file-each or --jsonl, not both");
        if (in->file_each) {
            allowed = O_FILE_EACH | O_BATCH | O_LABEL | O_TIMEOUT | O_MEMORY | O_WIRE_JSON;
            c.glob = in->file_each;
        } else if (in->jsonl) {
            allowed = O_JSONL | O_BATCH | O_WIRE_JSON;
            want = in->jsonl_file ? 0 : 1;
        } else {
            return ci_error_set(err, CI_ERR_INVALID,
                                "'batch submit' needs --file-each 'GLOB' (SCRIPT runs once per "
                                "file) or --jsonl FILE (one request per line)");
        }
        break;
    case CI_BATCH_STATUS: allowed = O_JSON; break;
    case CI_BATCH_WAIT: allowed = O_WAIT | O_RETRY; break;
    case CI_BATCH_RESULTS: allowed = O_JSONL; break;
    case CI_BATCH_CANCEL: allowed = 0; break;
    }
    unsigned bad = given_options(in) & ~allowed;
    for (size_t i = 0; bad && i < sizeof(opt_names) / sizeof(opt_names[0]); i++) {
        if (!(bad & opt_names[i].bit))
            continue;
        if (c.verb == CI_BATCH_RESULTS && opt_names[i].bit == O_JSON)
            return ci_error_set(err, CI_ERR_INVALID,
                                "'batch results' prints JSON lines with --jsonl, not --json");
        return ci_error_set(err, CI_ERR_INVALID, "'batch %s' does not take %s%s%s", verb,
                            opt_names[i].name, opt_names[i].why ? ": " : "",
                            opt_names[i].why ? opt_names[i].why : "");
    }
    if (c.verb == CI_BATCH_RESULTS && in->jsonl_file)
        return ci_error_set(err, CI_ERR_INVALID,
                            "'batch results' takes --jsonl without a value: the lines go to "
                            "standard output");
    size_t have = in->n_operands - 1;
    if (have < want) {
        const char *what = c.verb != CI_BATCH_SUBMIT ? "a batch id"
                           : in->jsonl                 ? "the JSONL file"
                                                       : "the script (SCRIPT.py, or - for stdin)";
        return ci_error_set(err, CI_ERR_INVALID, "'batch %s' needs %s", verb, what);
    }
    if (have > want)
        return ci_error_set(err, CI_ERR_INVALID, "'batch %s': unexpected argument '%.200s'", verb,
                            in->operands[1 + want]);
    const char *operand = want ? in->operands[1] : NULL;
    if (c.verb == CI_BATCH_SUBMIT) {
        if (in->jsonl)
            c.jsonl_file = in->jsonl_file ? in->jsonl_file : operand;
        else
            c.script = operand;
        c.batch = in->batch;
        if (c.jsonl_file && !c.jsonl_file[0])
            return ci_error_set(err, CI_ERR_INVALID, "--jsonl: the file name is empty");
        if (c.glob && !c.glob[0])
            return ci_error_set(err, CI_ERR_INVALID, "--file-each: the pattern is empty");
    } else {
        c.batch = operand;
    }
    if (c.batch && !ci_task_id_valid(c.batch))
        return ci_error_set(err, CI_ERR_INVALID,
                            "'%.80s' is not a batch id: use 1 to 64 of A-Z a-z 0-9 _ -", c.batch);
    c.json = in->json;
    c.jsonl = c.verb == CI_BATCH_RESULTS && in->jsonl;
    *ret = c;
    return CI_OK;
}

/* --- ids --- */

void ci_batch_new_id(char out[19])
{
    static const char hex[] = "0123456789abcdef";
    uint8_t r[8];
    if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
        uint64_t x = (uint64_t)ci_now_ms() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)ci_mono_ms();
        memcpy(r, &x, sizeof(r));
    }
    out[0] = 'b';
    out[1] = '-';
    for (size_t i = 0; i < sizeof(r); i++) {
        out[2 + 2 * i] = hex[r[i] >> 4];
        out[3 + 2 * i] = hex[r[i] & 15];
    }
    out[18] = '\0';
}

static size_t digits(uint64_t n)
{
    size_t d = 1;
    while (n >= 10) {
        n /= 10;
        d++;
    }
    return d;
}

ci_status ci_batch_id_check(const char *batch, uint64_t n_tasks, struct ci_error *err)
{
    if (!batch || !ci_task_id_valid(batch))
        return ci_error_set(err, CI_ERR_INVALID,
                            "'%.80s' is not a batch id: use 1 to 64 of A-Z a-z 0-9 _ -",
                            batch ? batch : "");
    size_t room = 64 - 1 - digits(n_tasks ? n_tasks : 1);
    if (strlen(batch) > room)
        return ci_error_set(err, CI_ERR_INVALID,
                            "batch id '%s' is %zu characters; with %" PRIu64
                            " tasks their ids (<batch>-<n>, at most 64) leave room for %zu",
                            batch, strlen(batch), n_tasks, room);
    return CI_OK;
}

ci_status ci_batch_task_id(const char *batch, uint64_t n, char out[65], struct ci_error *err)
{
    int k = snprintf(out, 65, "%s-%" PRIu64, batch, n);
    if (k < 0 || k > 64)
        return ci_error_set(err, CI_ERR_INVALID,
                            "task id '%.64s-%" PRIu64 "' would be longer than 64 characters",
                            batch, n);
    return CI_OK;
}

/* --- counts --- */

Ci__V1__TaskStatus ci_batch_event_status(enum ci_batch_event ev)
{
    switch (ev) {
    case CI_BATCH_EV_SUCCEEDED: return CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED;
    case CI_BATCH_EV_FAILED: return CI__V1__TASK_STATUS__TASK_STATUS_FAILED;
    case CI_BATCH_EV_TIMED_OUT: return CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT;
    case CI_BATCH_EV_CANCELLED: return CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED;
    case CI_BATCH_EV_TAKEN: return CI__V1__TASK_STATUS__TASK_STATUS_RUNNING;
    default: return CI__V1__TASK_STATUS__TASK_STATUS_UNSPECIFIED;
    }
}

static uint64_t sub0(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

void ci_batch_state_compute(const struct ci_batch_raw *raw, struct ci_batch_state *ret)
{
    const struct ci_batch_counts *ev = &raw->events;
    struct ci_batch_state c = {
        .succeeded = ev->succeeded,
        .failed = ev->failed,
        .timed_out = ev->timed_out,
        .cancelled = ev->cancelled,
        .sealed = raw->sealed,
        .complete = ev->complete > 0,
        .cancel_requested = ev->cancel > 0,
    };
    uint64_t ended = ci_batch_counts_ended(ev);
    /* Every ended task was taken first (a worker publishes taken, then the
     * end); should a taken event be missing, the end still counts. */
    uint64_t taken = ev->taken;
    if (taken < ended)
        taken = ended;
    c.running = taken - ended;
    if (raw->sealed) {
        c.total = raw->seal_total;
    } else {
        /* The messages left in the batch stream are the tasks not acked
         * yet: those queued, those running, and for a moment one that
         * ended and whose worker has not acked it yet, which counts
         * twice then (contract §20: message counts cannot tell it from a
         * queued one). */
        c.total = taken + sub0(raw->left, c.running);
    }
    c.queued = sub0(c.total, taken);
    *ret = c;
}

uint64_t ci_batch_state_ended(const struct ci_batch_state *c)
{
    return c->succeeded + c->failed + c->timed_out + c->cancelled;
}

bool ci_batch_state_done(const struct ci_batch_state *c)
{
    const struct ci_batch_counts ev = {
        .succeeded = c->succeeded, .failed = c->failed, .timed_out = c->timed_out,
        .cancelled = c->cancelled, .sealed = c->sealed ? 1 : 0,
    };
    return ci_batch_is_complete(&ev, c->total);
}

bool ci_batch_raw_known(const struct ci_batch_raw *raw)
{
    if (raw->sealed || raw->left)
        return true;
    struct ci_batch_counts ev = raw->events;
    for (int i = 0; i < CI_BATCH_EV_COUNT; i++)
        if (*ci_batch_counts_of(&ev, (enum ci_batch_event)i))
            return true;
    return false;
}

bool ci_batch_raw_submitted(const struct ci_batch_raw *raw)
{
    if (raw->sealed || raw->left)
        return true;
    struct ci_batch_counts ev = raw->events;
    for (int i = 0; i < CI_BATCH_EV_COUNT; i++)
        if (i != CI_BATCH_EV_CANCEL && *ci_batch_counts_of(&ev, (enum ci_batch_event)i))
            return true;
    return false;
}

ci_status ci_batch_state_json(const struct ci_batch_state *c, struct ci_buf *out)
{
    return ci_buf_appendf(out,
                          "{\"total\":%" PRIu64 ",\"queued\":%" PRIu64 ",\"running\":%" PRIu64
                          ",\"succeeded\":%" PRIu64 ",\"failed\":%" PRIu64
                          ",\"timed_out\":%" PRIu64 ",\"cancelled\":%" PRIu64 "}",
                          c->total, c->queued, c->running, c->succeeded, c->failed,
                          c->timed_out, c->cancelled);
}

/* --- failures grouped by their error --- */

void ci_batch_failures_init(struct ci_batch_failures *f, size_t max_groups)
{
    memset(f, 0, sizeof(*f));
    f->max_groups = max_groups;
}

void ci_batch_failures_release(struct ci_batch_failures *f)
{
    for (size_t i = 0; i < f->n; i++)
        free(f->groups[i].error);
    free(f->groups);
    memset(f, 0, sizeof(*f));
}

ci_status ci_batch_failures_add(struct ci_batch_failures *f, Ci__V1__TaskStatus status,
                                const char *error, const char *task_id)
{
    if (!error)
        error = "";
    f->total++;
    struct ci_batch_group *g = NULL;
    for (size_t i = 0; i < f->n && !g; i++)
        if (f->groups[i].status == status && strcmp(f->groups[i].error, error) == 0)
            g = &f->groups[i];
    if (!g) {
        if (f->n == f->max_groups) {
            f->ungrouped++;
            return CI_OK;
        }
        if (f->n == f->cap) {
            size_t cap = f->cap ? f->cap * 2 : 8;
            struct ci_batch_group *grown = realloc(f->groups, cap * sizeof(*grown));
            if (!grown)
                return CI_ERR_NOMEM;
            f->groups = grown;
            f->cap = cap;
        }
        char *copy = strdup(error);
        if (!copy)
            return CI_ERR_NOMEM;
        g = &f->groups[f->n];
        memset(g, 0, sizeof(*g));
        g->status = status;
        g->error = copy;
        g->order = f->n++;
    }
    g->count++;
    if (g->n_ids < CI_BATCH_GROUP_IDS)
        snprintf(g->ids[g->n_ids++], sizeof(g->ids[0]), "%s", task_id ? task_id : "");
    return CI_OK;
}

static int by_count(const void *a, const void *b)
{
    const struct ci_batch_group *x = a, *y = b;
    if (x->count != y->count)
        return x->count > y->count ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

void ci_batch_failures_sort(struct ci_batch_failures *f)
{
    if (f->n > 1)
        qsort(f->groups, f->n, sizeof(f->groups[0]), by_count);
}

/* --- JSONL --- */

bool ci_batch_line_blank(const uint8_t *line, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r' && line[i] != '\n')
            return false;
    return true;
}

/* Replaces a string field of a decoded message (which frees what is not
 * the descriptor's default ""). */
static ci_status set_string(char **field, const char *value)
{
    char *copy = strdup(value);
    if (!copy)
        return CI_ERR_NOMEM;
    if (*field && *field != protobuf_c_empty_string)
        free(*field);
    *field = copy;
    return CI_OK;
}

ci_status ci_batch_jsonl_request(const struct ci_config *cfg, const char *batch, size_t n,
                                 const uint8_t *line, size_t len,
                                 Ci__V1__ExecutionRequest **ret, struct ci_error *err)
{
    ProtobufCMessage *m = NULL;
    ci_status s = ci_message_decode(CI_ENC_JSON, &ci__v1__execution_request__descriptor, line,
                                    len, &m, err);
    if (s)
        return s == CI_ERR_NOMEM ? s : CI_ERR_INVALID;
    Ci__V1__ExecutionRequest *req = (Ci__V1__ExecutionRequest *)m;
    if (req->batch_id[0] && strcmp(req->batch_id, batch) != 0) {
        s = ci_error_set(err, CI_ERR_INVALID,
                         "batchId '%.80s' is not this batch ('%s'): leave it out or make it "
                         "equal", req->batch_id, batch);
        goto out;
    }
    if (req->session_id[0]) {
        s = ci_error_set(err, CI_ERR_INVALID,
                         "sessionId is set: a batch task is not a session's step");
        goto out;
    }
    char id[65];
    if (!req->task_id[0]) {
        s = ci_batch_task_id(batch, n, id, err);
        if (!s && (s = set_string(&req->task_id, id)))
            ci_error_set(err, s, "out of memory");
        if (s)
            goto out;
    }
    if (!req->batch_id[0] && (s = set_string(&req->batch_id, batch))) {
        ci_error_set(err, s, "out of memory");
        goto out;
    }
    s = ci_request_validate(cfg, req, NULL, NULL, err);
out:
    if (s) {
        ci_message_free(m);
        return s;
    }
    *ret = req;
    return CI_OK;
}

static int by_id(const void *a, const void *b)
{
    const struct ci_batch_id_line *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    if (c)
        return c;
    return x->line < y->line ? -1 : x->line > y->line;
}

ci_status ci_batch_ids_unique(struct ci_batch_id_line *ids, size_t n, struct ci_error *err)
{
    if (n > 1)
        qsort(ids, n, sizeof(ids[0]), by_id);
    /* Among several pairs, the one whose second line comes first. */
    size_t best = 0;
    for (size_t i = 1; i < n; i++)
        if (strcmp(ids[i - 1].id, ids[i].id) == 0 && (!best || ids[i].line < ids[best].line))
            best = i;
    if (best)
        return ci_error_set(err, CI_ERR_INVALID, "lines %zu and %zu both have taskId '%s'",
                            ids[best - 1].line, ids[best].line, ids[best].id);
    return CI_OK;
}

/* --- --file-each GLOB --- */

static int by_path(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void ci_batch_paths_free(char **paths, size_t n)
{
    for (size_t i = 0; paths && i < n; i++)
        free(paths[i]);
    free(paths);
}

static const char *base_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The bytes of a varint holding v (protobuf). */
static uint64_t varint_len(uint64_t v)
{
    uint64_t n = 1;
    for (; v >= 0x80; v >>= 7)
        n++;
    return n;
}

/* What an InputFile with its content inline adds to a task's message,
 * but for what every such file adds alike: name and content with their
 * tags and lengths (protobuf), or the name and the content in base64
 * (JSON; names need no escapes). The request around it grows with it. */
static uint64_t inline_bytes(uint64_t size, size_t name_len, bool json)
{
    if (json)
        return name_len + (size + 2) / 3 * 4;
    return 1 + varint_len(name_len) + name_len + 1 + varint_len(size) + size;
}

ci_status ci_batch_files_check(char *const *paths, size_t n, uint64_t max_bytes,
                               size_t inline_max, bool json, struct ci_batch_files_extremes *ret,
                               struct ci_error *err)
{
    struct ci_batch_files_extremes x = {SIZE_MAX, SIZE_MAX};
    uint64_t largest = 0;
    size_t longest = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = paths[i], *name = base_of(p);
        char why[128];
        const char *problem = ci_input_name_problem(name, strlen(name), why, sizeof(why));
        if (problem)
            return ci_error_set(err, CI_ERR_INVALID,
                                "--file-each: '%.200s' cannot be an input: its name '%.130s' is "
                                "not allowed (%s; at most 128 of letters, digits, '.', '_', '-' "
                                "and spaces, not starting with '.'); nothing was submitted",
                                p, name, problem);
        int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) != 0) {
            int e = errno;
            if (fd >= 0)
                close(fd);
            return ci_error_errno(err, CI_ERR_INVALID, e,
                                  "--file-each: '%.200s' cannot be read; nothing was submitted",
                                  p);
        }
        close(fd);
        if (!S_ISREG(st.st_mode))
            return ci_error_set(err, CI_ERR_INVALID,
                                "--file-each: '%.200s' is not a regular file; nothing was "
                                "submitted", p);
        uint64_t size = (uint64_t)st.st_size;
        if (size > max_bytes)
            return ci_error_set(err, CI_ERR_INVALID,
                                "--file-each: '%.200s' is %" PRIu64 " bytes; an input may be at "
                                "most %" PRIu64 " bytes (limits.max_input_bytes); nothing was "
                                "submitted", p, size, max_bytes);
        uint64_t bytes = inline_bytes(size, strlen(name), json);
        if (size <= inline_max && (x.largest_inline == SIZE_MAX || bytes > largest)) {
            x.largest_inline = i;
            largest = bytes;
        }
        if (size > inline_max && (x.longest_uploaded == SIZE_MAX || strlen(name) > longest)) {
            x.longest_uploaded = i;
            longest = strlen(name);
        }
    }
    *ret = x;
    return CI_OK;
}

ci_status ci_batch_glob(const char *pattern, size_t max, char ***ret, size_t *ret_n,
                        struct ci_error *err)
{
    glob_t g;
    memset(&g, 0, sizeof(g));
    int r = glob(pattern, GLOB_NOSORT, NULL, &g);
    if (r == GLOB_NOMATCH) {
        globfree(&g);
        return ci_error_set(err, CI_ERR_INVALID,
                            "--file-each '%.200s' matches no file (quote the pattern so that "
                            "the shell leaves it to ci)", pattern);
    }
    if (r != 0) {
        globfree(&g);
        return ci_error_set(err, r == GLOB_NOSPACE ? CI_ERR_NOMEM : CI_ERR_INVALID,
                            "--file-each '%.200s': the pattern cannot be read (%s)", pattern,
                            r == GLOB_NOSPACE ? "out of memory" : "a folder cannot be read");
    }
    if (g.gl_pathc > max) {
        size_t n = g.gl_pathc;
        globfree(&g);
        return ci_error_set(err, CI_ERR_INVALID,
                            "--file-each '%.200s' matches %zu files; a batch holds at most %zu "
                            "tasks: split it into several batches", pattern, n, max);
    }
    ci_status s = CI_OK;
    char **paths = calloc(g.gl_pathc, sizeof(*paths));
    size_t n = 0;
    if (!paths)
        s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !s && i < g.gl_pathc; i++) {
        struct stat st;
        const char *p = g.gl_pathv[i];
        if (stat(p, &st) != 0)
            s = ci_error_errno(err, CI_ERR_INVALID, errno, "--file-each: '%.200s'", p);
        else if (!S_ISREG(st.st_mode))
            s = ci_error_set(err, CI_ERR_INVALID,
                             "--file-each: '%.200s' is not a regular file: make the pattern "
                             "match files only", p);
        else if (!(paths[n] = strdup(p)))
            s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        else
            n++;
    }
    globfree(&g);
    if (s) {
        ci_batch_paths_free(paths, n);
        return s;
    }
    qsort(paths, n, sizeof(*paths), by_path);
    *ret = paths;
    *ret_n = n;
    return CI_OK;
}
