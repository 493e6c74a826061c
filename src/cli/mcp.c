/* mcp.c - `ci mcp`: a Model Context Protocol server over stdio (mcp.h).
 *
 * The MCP stdio transport: JSON-RPC 2.0 messages, one per line, on stdin and
 * stdout (a line may be a batch, as 2025-03-26 allowed). One call at a
 * time: a call waiting for its task (at most --wait-ms) holds the next.
 * A call that asks for progress gets notifications/progress meanwhile. Protocol misuse (not JSON, not a request, an unknown method or
 * tool, params that are not an object) gets a JSON-RPC error; anything a
 * model can correct (a bad argument, a missing file, NATS down, the code
 * failing) is a tool result with isError set and one sentence saying why. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/client.h"
#include "cli/mcp.h"
#include "cli/tools.h"
#include "core/request.h"
#include "core/text.h"
#include "core/util.h"
#include "nats/broker.h"
#include "nats/objstore.h"

#define MCP_VERSION "0.1.0"
/* A longer message is answered with an error and skipped, not buffered. */
#define LINE_MAX_BYTES (32u * 1024 * 1024)
/* stdout and stderr as a model sees them: a long one keeps its head and its
 * tail (where the last traceback is), so that a result stays ~20 KB. */
#define TEXT_KEEP 8000
#define TEXT_SIDE 3500
/* Images inlined into one result, each and in all; artifacts looked at. */
#define MAX_IMAGES 8
/* base64 of it stays under 5 MB, the most some model APIs take per image */
#define IMAGE_MAX (3700u * 1024)
#define IMAGES_TOTAL (8u * 1024 * 1024)
#define MAX_ARTIFACTS 50
#define ARTIFACT_READ_MAX (32u * 1024 * 1024)
#define MAX_PATH_ARG 4096
/* A call that asked for progress hears of each status change, and this
 * often while nothing changes (clients reset their timeouts on it). */
#define PROGRESS_EVERY_MS 5000
/* Requests in one JSON-RPC batch (2025-03-26; later versions dropped them). */
#define BATCH_MAX 64

static const char *const versions[] = {"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"};

struct mcp {
    struct ci_broker *b;
    const struct ci_config *cfg;
    const struct ci_mcp_opts *o;
    FILE *out;
    int save_fd; /* the save folder, opened on first use; -1 before */
    char save_path[PATH_MAX];
    json_t *batch; /* the replies of the batch being handled; NULL outside one */
    int64_t batch_deadline_ms; /* the batch's calls wait until then, together */
    bool progress_message;     /* the version has ProgressNotification.message */
    /* The call being handled: its progressToken (borrowed; NULL when it
     * asked for none) and what its notifications said last. */
    json_t *progress_token;
    int64_t progress_n, progress_last_ms, call_started_ms;
    const char *progress_state;
};

struct reader {
    uint8_t buf[65536];
    size_t pos, len;
};

/* The next line of stdin without its '\n' in *line: 1, or 0 at the end.
 * *too_long when it was longer than LINE_MAX_BYTES; its bytes are dropped. */
static int next_line(struct reader *r, struct ci_buf *line, bool *too_long)
{
    bool any = false;
    line->len = 0;
    *too_long = false;
    for (;;) {
        if (r->pos == r->len) {
            ssize_t n = read(0, r->buf, sizeof(r->buf));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0)
                return any ? 1 : 0;
            r->pos = 0;
            r->len = (size_t)n;
        }
        any = true;
        const uint8_t *start = r->buf + r->pos;
        size_t avail = r->len - r->pos;
        const uint8_t *nl = memchr(start, '\n', avail);
        size_t n = nl ? (size_t)(nl - start) : avail;
        if (!*too_long && (line->len + n > LINE_MAX_BYTES || ci_buf_append(line, start, n))) {
            *too_long = true;
            ci_buf_release(line);
        }
        r->pos += n + (nl ? 1 : 0);
        if (nl)
            return 1;
    }
}

/* A JSON string of s that is valid UTF-8 whatever s holds. */
static json_t *text_value(const char *s, size_t len)
{
    json_t *v = json_stringn(s, len);
    if (v)
        return v;
    CI_AUTOBUF struct ci_buf b = CI_BUF_INIT;
    if (ci_text_escape(&b, s, len, true))
        return NULL;
    return json_stringn(b.data ? (const char *)b.data : "", b.len);
}

static void write_msg(struct mcp *m, json_t *msg)
{
    char *s = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    json_decref(msg);
    if (!s) {
        fprintf(stderr, "ci mcp: out of memory writing a reply\n");
        return;
    }
    fputs(s, m->out);
    fputc('\n', m->out);
    fflush(m->out);
    free(s);
}

/* A reply: written now, or kept for the batch's array. */
static void send_msg(struct mcp *m, json_t *msg)
{
    if (m->batch && msg)
        json_array_append_new(m->batch, msg);
    else
        write_msg(m, msg);
}

/* notifications/progress of the call being handled, if it asked: on each
 * status event, and every PROGRESS_EVERY_MS while none comes. Written at
 * once, even inside a batch. */
static void on_progress(const Ci__V1__StatusEvent *ev, void *closure)
{
    struct mcp *m = closure;
    /* The end needs none: the result follows at once. */
    if (!m->progress_token || (ev && ci_task_status_terminal(ev->status)))
        return;
    int64_t now = ci_mono_ms();
    if (!ev && now - m->progress_last_ms < PROGRESS_EVERY_MS)
        return;
    char text[256];
    if (ev) {
        bool running = ev->status == CI__V1__TASK_STATUS__TASK_STATUS_RUNNING;
        if (running || ev->status == CI__V1__TASK_STATUS__TASK_STATUS_QUEUED)
            m->progress_state = running ? "running" : "waiting for a worker";
        if (running && ev->worker && ev->worker[0])
            snprintf(text, sizeof(text), "running on worker %.64s", ev->worker);
        else
            snprintf(text, sizeof(text), "%s", ci_task_status_short(ev->status));
    } else {
        snprintf(text, sizeof(text), "still %s after %" PRId64 " s", m->progress_state,
                 (now - m->call_started_ms) / 1000);
    }
    m->progress_last_ms = now;
    json_t *params = json_pack("{s:O, s:I}", "progressToken", m->progress_token, "progress",
                               (json_int_t)++m->progress_n);
    if (params && m->progress_message) /* 2024-11-05 has no message */
        json_object_set_new(params, "message", json_string(text));
    write_msg(m, json_pack("{s:s, s:s, s:o}", "jsonrpc", "2.0", "method",
                           "notifications/progress", "params", params));
}

static void reply(struct mcp *m, json_t *id, json_t *result)
{
    send_msg(m, json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id ? id : json_null(),
                          "result", result));
}

__attribute__((format(printf, 4, 5))) static void reply_error(struct mcp *m, json_t *id,
                                                              int code, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    json_t *msg = text_value(text, strlen(text));
    send_msg(m, json_pack("{s:s, s:O, s:{s:i, s:o}}", "jsonrpc", "2.0", "id",
                          id ? id : json_null(), "error", "code", code, "message", msg));
}

/* A tool result of one text block. */
static json_t *tool_text(bool is_error, const char *text)
{
    return json_pack("{s:[{s:s, s:o}], s:b}", "content", "type", "text", "text",
                     text_value(text, strlen(text)), "isError", is_error);
}

__attribute__((format(printf, 1, 2))) static json_t *tool_error(const char *fmt, ...)
{
    char *text = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&text, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    json_t *r = tool_text(true, text);
    free(text);
    return r;
}

/* Connects (again) when there is no usable connection. */
static ci_status ensure_broker(struct mcp *m, struct ci_error *err)
{
    if (m->b && ci_broker_closed(m->b)) {
        ci_broker_free(m->b);
        m->b = NULL;
    }
    if (m->b)
        return CI_OK;
    ci_status s = ci_broker_connect(m->cfg, &m->b, err);
    if (s == CI_OK)
        s = ci_broker_setup(m->b, false, err);
    if (s) {
        ci_broker_free(m->b);
        m->b = NULL;
    }
    return s;
}

static json_t *nats_down(struct mcp *m, const struct ci_error *e)
{
    char urls[512];
    ci_broker_redact_urls(m->cfg->nats.url, urls, sizeof(urls));
    return tool_error("The code service cannot be reached (NATS at %s): %s. Nothing was run; try "
                      "again later.",
                      urls, e->msg);
}

/* --- results as a model sees them --- */

static size_t utf8_back(const char *s, size_t i)
{
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    return i;
}

static size_t utf8_fwd(const char *s, size_t len, size_t i)
{
    while (i < len && ((unsigned char)s[i] & 0xC0) == 0x80)
        i++;
    return i;
}

static void append_stream(struct ci_buf *t, const char *label, const char *s, bool truncated,
                          uint64_t total)
{
    size_t len = strlen(s);
    if (!len && !truncated)
        return;
    ci_buf_appendf(t, "--- %s ---\n", label);
    if (len <= TEXT_KEEP) {
        ci_buf_append(t, s, len);
    } else {
        size_t head = utf8_back(s, TEXT_SIDE);
        size_t tail = utf8_fwd(s, len, len - TEXT_SIDE);
        ci_buf_append(t, s, head);
        ci_buf_appendf(t, "\n[... %zu bytes cut here to keep this short; print less, or write "
                          "large output to a CSV file ...]\n",
                       tail - head);
        ci_buf_append(t, s + tail, len - tail);
    }
    if (len && s[len - 1] != '\n')
        ci_buf_appendf(t, "\n");
    if (truncated)
        ci_buf_appendf(t, "[the code wrote %" PRIu64 " bytes to %s; the service kept only the "
                          "first %zu]\n",
                       total, label, len);
}

static void append_session(struct ci_buf *t, const Ci__V1__SessionInfo *si)
{
    ci_buf_appendf(t, "session: %s, step %u", si->session_id, si->step);
    if (si->new_session)
        ci_buf_appendf(t, "; a new session%s", si->previous_state_gone
                                                   ? " (the earlier state is gone: the session "
                                                     "had expired or was closed; define your "
                                                     "variables again)"
                                                   : "");
    if (si->restored_from_step)
        ci_buf_appendf(t, "; restored the state of step %u", si->restored_from_step);
    else if (!si->new_session)
        ci_buf_appendf(t, "; nothing restored");
    ci_buf_appendf(t, si->state_kept ? "; this step's state was kept for the next"
                                     : "; this step's state was NOT kept (the next step starts "
                                       "from the previous state)");
    for (size_t i = 0; i < si->n_dropped; i++)
        ci_buf_appendf(t, "%s%s", i ? ", " : "; not kept (cannot be saved): ", si->dropped[i]);
    ci_buf_appendf(t, "\n");
}

/* The save folder, made and opened on first use: ours alone (0700, owned
 * by us, not a symlink), since the default lies under a shared /tmp. */
static int save_dir(struct mcp *m, struct ci_error *err)
{
    if (m->save_fd >= 0)
        return m->save_fd;
    char path[PATH_MAX];
    int n;
    if (m->o->save_dir) {
        n = snprintf(path, sizeof(path), "%s", m->o->save_dir);
    } else {
        const char *tmp = getenv("TMPDIR");
        n = snprintf(path, sizeof(path), "%s/ci-mcp-%u", tmp && tmp[0] == '/' ? tmp : "/tmp",
                     (unsigned)geteuid());
    }
    if (n < 0 || (size_t)n >= sizeof(path)) {
        ci_error_set(err, CI_ERR_INVALID, "the save folder's path is too long");
        return -1;
    }
    if (mkdir(path, 0700) != 0 && errno != EEXIST) {
        ci_error_errno(err, CI_ERR_IO, errno, "cannot make folder '%s'", path);
        return -1;
    }
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        ci_error_errno(err, CI_ERR_IO, errno, "cannot open folder '%s'", path);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    if (st.st_uid != geteuid()) {
        ci_error_set(err, CI_ERR_INVALID, "folder '%s' belongs to another user", path);
        close(fd);
        return -1;
    }
    /* The default lies in a shared /tmp: others must not be able to swap
     * what is in it. A folder the user named is theirs to set. */
    if (!m->o->save_dir && (st.st_mode & 077) && fchmod(fd, 0700) != 0) {
        ci_error_errno(err, CI_ERR_IO, errno, "folder '%s' is open to others", path);
        close(fd);
        return -1;
    }
    if (!realpath(path, m->save_path))
        snprintf(m->save_path, sizeof(m->save_path), "%s", path);
    m->save_fd = fd;
    return fd;
}

/* Saves one artifact as <save folder>/<task id>/<name>; a line in t says
 * where, or why not. */
static void save_artifact(struct mcp *m, struct ci_buf *t, const Ci__V1__ExecutionResult *r,
                          const Ci__V1__Artifact *a, const uint8_t *data, size_t len)
{
    struct ci_error e = {{0}};
    if (!ci_client_artifact_name_safe(a)) {
        ci_buf_appendf(t, "- not saved locally: an artifact whose name is unsafe (object '%s')\n",
                       a->object);
        return;
    }
    /* The folder is named after the task: an id is one plain name (the
     * record is a KV value, not to be trusted as a path). */
    if (!ci_task_id_valid(r->task_id)) {
        ci_buf_appendf(t, "- %s: not saved locally: the result's task id is not an id\n",
                       a->name);
        return;
    }
    int dir = save_dir(m, &e);
    if (dir < 0) {
        ci_buf_appendf(t, "- %s: not saved locally: %s\n", a->name, e.msg);
        return;
    }
    int sub = -1;
    int made = mkdirat(dir, r->task_id, 0700);
    if (made != 0 && errno == ENOENT) { /* the folder went (a tmp cleaner): again */
        close(m->save_fd);
        m->save_fd = -1;
        if ((dir = save_dir(m, &e)) < 0) {
            ci_buf_appendf(t, "- %s: not saved locally: %s\n", a->name, e.msg);
            return;
        }
        made = mkdirat(dir, r->task_id, 0700);
    }
    if (made == 0 || errno == EEXIST)
        sub = openat(dir, r->task_id, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int fd = sub >= 0 ? ci_client_open_artifact(sub, a->name) : -1;
    if (fd < 0 || ci_write_all(fd, data, len))
        ci_buf_appendf(t, "- %s: not saved locally: %s\n", a->name, strerror(errno));
    else
        ci_buf_appendf(t, "- %s (%s, %zu bytes) saved to %s/%s/%s\n", a->name, a->mime_type, len,
                       m->save_path, r->task_id, a->name);
    if (fd >= 0)
        close(fd);
    if (sub >= 0)
        close(sub);
}

/* The outputs (docs/contract.md section 17) into the text (each one's
 * text/plain, a long one cut like stdout) and images (an inline PNG, within
 * the limits of a result's images). */
static void append_outputs(struct ci_buf *t, json_t *images, const Ci__V1__ExecutionResult *r,
                           size_t *n_images, size_t *image_bytes)
{
    for (size_t i = 0; i < r->n_outputs; i++) {
        const Ci__V1__Output *out = r->outputs[i];
        char label[64];
        snprintf(label, sizeof(label), "output %zu (%s)", i + 1,
                 strcmp(out->kind, "result") == 0 ? "the last expression's value" : "display");
        for (size_t j = 0; j < out->n_data; j++) {
            const char *key = out->data[j]->key, *v = out->data[j]->value;
            if (strcmp(key, "text/plain") == 0) {
                append_stream(t, label, v, false, 0);
                if (out->total_rows)
                    ci_buf_appendf(t, "[%" PRIu64 " rows in all]\n", out->total_rows);
            } else if (strcmp(key, "image/png") == 0) {
                size_t len = strlen(v) / 4 * 3; /* about: the PNG's bytes */
                if (*n_images < MAX_IMAGES && *image_bytes + len <= IMAGES_TOTAL) {
                    json_t *img = json_pack("{s:s, s:s, s:s}", "type", "image", "data", v,
                                            "mimeType", "image/png");
                    if (img && json_array_append_new(images, img) == 0) {
                        (*n_images)++;
                        *image_bytes += len;
                        ci_buf_appendf(t, "[%s is shown as an image]\n", label);
                    }
                } else {
                    ci_buf_appendf(t, "[%s: an image not shown: at most %d images, %u MiB, per "
                                      "result]\n", label, MAX_IMAGES,
                                   IMAGES_TOTAL / (1024 * 1024));
                }
            }
        }
        if (out->artifact[0])
            ci_buf_appendf(t, "[%s: its image is the file %s, below]\n", label, out->artifact);
    }
    if (r->outputs_truncated)
        ci_buf_appendf(t, "[more outputs were made than a result keeps (20, 2 MiB); the rest "
                          "were left out]\n");
}

/* The tool result for a task that ended: one text block (status, error,
 * hint, session, stdout, outputs, stderr, files), then an image block per
 * PNG (the outputs' first). */
static json_t *result_content(struct mcp *m, const Ci__V1__ExecutionResult *r)
{
    CI_AUTOBUF struct ci_buf t = CI_BUF_INIT;
    json_t *images = json_array();
    bool ok = r->status == CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED;
    ci_buf_appendf(&t, "task %s: %s", r->task_id, ci_task_status_short(r->status));
    if (r->_exit_code_case == CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE)
        ci_buf_appendf(&t, " (exit code %d)", r->exit_code);
    if (r->usage)
        ci_buf_appendf(&t, " in %" PRIu64 " ms, %u MiB", r->usage->duration_ms,
                       r->usage->memory_mb);
    ci_buf_appendf(&t, "\n");
    if (r->error[0])
        ci_buf_appendf(&t, "error: %s\n", r->error);
    if (r->hint[0])
        ci_buf_appendf(&t, "hint: %s\n", r->hint);
    if (r->session)
        append_session(&t, r->session);
    size_t n_images = 0, image_bytes = 0;
    append_stream(&t, "stdout", r->stdout, r->stdout_truncated, r->stdout_total_bytes);
    append_outputs(&t, images, r, &n_images, &image_bytes);
    append_stream(&t, "stderr", r->stderr, r->stderr_truncated, r->stderr_total_bytes);
    if (r->n_artifacts)
        ci_buf_appendf(&t, "files the code wrote:\n");
    for (size_t i = 0; i < r->n_artifacts; i++) {
        const Ci__V1__Artifact *a = r->artifacts[i];
        if (i == MAX_ARTIFACTS) {
            ci_buf_appendf(&t, "- and %zu more, not fetched\n", r->n_artifacts - i);
            break;
        }
        struct ci_error e = {{0}};
        uint8_t *data = NULL;
        size_t len = 0;
        ci_status s = m->b ? ci_objstore_get(ci_broker_objstore(m->b), a->object,
                                             ARTIFACT_READ_MAX, &data, &len, &e)
                           : CI_ERR_NATS;
        if (s) {
            ci_buf_appendf(&t, "- %s: could not be fetched: %s\n", a->name, e.msg);
            continue;
        }
        bool png = strcmp(a->mime_type, "image/png") == 0 && len >= 8 &&
                   memcmp(data, "\x89PNG\r\n\x1a\n", 8) == 0;
        save_artifact(m, &t, r, a, data, len);
        if (png && n_images < MAX_IMAGES && len <= IMAGE_MAX && image_bytes + len <= IMAGES_TOTAL) {
            char *b64 = ci_base64_encode(data, len, CI_B64_STD, true, NULL);
            json_t *img = b64 ? json_pack("{s:s, s:s, s:s}", "type", "image", "data", b64,
                                          "mimeType", "image/png")
                              : NULL;
            free(b64);
            if (img && json_array_append_new(images, img) == 0) {
                n_images++;
                image_bytes += len;
            }
        } else if (png) {
            ci_buf_appendf(&t, "  (not shown as an image: at most %d images, %u MiB, per result)\n",
                           MAX_IMAGES, IMAGES_TOTAL / (1024 * 1024));
        }
        free(data);
    }
    if (!ok && !r->error[0] && !r->hint[0])
        ci_buf_appendf(&t, "the task did not succeed\n");
    json_t *content = json_array();
    json_array_append_new(content,
                          json_pack("{s:s, s:o}", "type", "text", "text",
                                    text_value(t.data ? (const char *)t.data : "", t.len)));
    json_array_extend(content, images);
    json_decref(images);
    return json_pack("{s:o, s:b}", "content", content, "isError", !ok);
}

static json_t *still_running(const char *id, const char *state, int64_t waited_ms)
{
    char text[512];
    snprintf(text, sizeof(text),
             "task %s is still %s after %" PRId64 " s. Call get_result with task_id \"%s\" "
             "to wait for its output again, or cancel with task_id \"%s\" to stop it.",
             id, state, waited_ms / 1000, id, id);
    return tool_text(false, text);
}

/* How long a call may wait for its task: --wait-ms, or in a batch what is
 * left of it (the replies go out together, so the batch waits once). */
static int64_t wait_budget(const struct mcp *m)
{
    if (!m->batch)
        return m->o->wait_ms;
    int64_t left = m->batch_deadline_ms - ci_mono_ms();
    return left > 0 ? left : 0;
}

/* --- the tools --- */

/* Refuses argument names the schema does not have: a misspelt one would
 * otherwise be ignored silently. */
static json_t *unknown_args(json_t *args, const char *const *known)
{
    const char *k;
    json_t *v;
    json_object_foreach(args, k, v) {
        bool found = false;
        for (const char *const *p = known; *p; p++)
            found |= strcmp(k, *p) == 0;
        if (!found)
            return tool_error("unknown argument '%.64s'", k);
    }
    return NULL;
}

static json_t *tool_run(struct mcp *m, json_t *args)
{
    static const char *const known[] = {"code", "session_id", "files", "timeout_ms", NULL};
    json_t *bad = unknown_args(args, known);
    if (bad)
        return bad;
    json_t *code = json_object_get(args, "code");
    json_t *session = json_object_get(args, "session_id");
    json_t *files = json_object_get(args, "files");
    json_t *timeout = json_object_get(args, "timeout_ms");
    if (!json_is_string(code) || json_string_length(code) == 0)
        return tool_error("'code' must be a non-empty string of Python source");
    if (session && !json_is_null(session) &&
        (!json_is_string(session) || !ci_task_id_valid(json_string_value(session))))
        return tool_error("'session_id' must be 1 to 64 of A-Z, a-z, 0-9, '_' and '-'");
    if (files && !json_is_null(files) &&
        (!json_is_array(files) || json_array_size(files) > CI_CLIENT_MAX_FILES))
        return tool_error("'files' must be an array of at most %d local file paths",
                          CI_CLIENT_MAX_FILES);
    if (timeout && !json_is_null(timeout) &&
        (!json_is_integer(timeout) || json_integer_value(timeout) < 1 ||
         json_integer_value(timeout) > UINT32_MAX))
        return tool_error("'timeout_ms' must be a positive integer of milliseconds");
    const char *paths[CI_CLIENT_MAX_FILES];
    size_t n_files = json_is_array(files) ? json_array_size(files) : 0;
    for (size_t i = 0; i < n_files; i++) {
        json_t *f = json_array_get(files, i);
        const char *p = json_string_value(f);
        if (!p || !p[0] || strlen(p) > MAX_PATH_ARG)
            return tool_error("files[%zu] must be a path of 1 to %d bytes", i, MAX_PATH_ARG);
        struct stat st;
        if (stat(p, &st) != 0) {
            char cwd[PATH_MAX];
            return tool_error("input file '%s' cannot be used: %s (paths are on the machine "
                              "running ci mcp%s%s)",
                              p, strerror(errno), p[0] == '/' ? "" : "; relative to ",
                              p[0] == '/' ? "" : getcwd(cwd, sizeof(cwd)) ? cwd : "its folder");
        }
        if (!S_ISREG(st.st_mode))
            return tool_error("input file '%s' is not a regular file", p);
        if ((uint64_t)st.st_size > m->cfg->limits.max_input_bytes)
            return tool_error("input file '%s' is %.1f MiB; inputs may be %.1f MiB in all", p,
                              (double)st.st_size / (1024 * 1024),
                              (double)m->cfg->limits.max_input_bytes / (1024 * 1024));
        /* "-" would mean stdin, which is the protocol here. */
        paths[i] = strcmp(p, "-") == 0 ? "./-" : p;
    }
    struct ci_error e = {{0}};
    if (ensure_broker(m, &e))
        return nats_down(m, &e);
    struct ci_submit_args a = {
        .code = json_string_value(code),
        .code_len = json_string_length(code),
        .session = json_is_string(session) ? json_string_value(session) : NULL,
        .files = paths,
        .n_files = n_files,
        .timeout_ms = json_is_integer(timeout) ? (uint32_t)json_integer_value(timeout) : 0,
    };
    char id[65];
    bool dup = false;
    ci_status s = ci_client_submit(m->b, m->cfg, &a, id, &dup, &e);
    if (s == CI_ERR_INVALID)
        return tool_error("not run: %s", e.msg);
    if (s)
        return tool_error("not run: the task could not be submitted: %s", e.msg);
    s = ci_client_wait(m->b, id, wait_budget(m), on_progress, m, false, &e);
    if (s == CI_ERR_TIMEOUT) {
        Ci__V1__ExecutionResult *r = NULL;
        bool running = ci_client_result_get(m->b, id, &r, NULL) == CI_OK &&
                       r->status == CI__V1__TASK_STATUS__TASK_STATUS_RUNNING;
        if (r)
            ci_message_free(&r->base);
        return still_running(id, running ? "running" : "waiting for a worker",
                             ci_mono_ms() - m->call_started_ms);
    }
    if (s)
        return tool_error("task %s was submitted, but waiting for it failed: %s. Call "
                          "get_result with task_id \"%s\" later.",
                          id, e.msg, id);
    Ci__V1__ExecutionResult *r = NULL;
    if (ci_client_result_get(m->b, id, &r, &e))
        return tool_error("task %s ended, but its result cannot be read: %s", id, e.msg);
    json_t *res = result_content(m, r);
    ci_message_free(&r->base);
    return res;
}

/* The task id argument of get_result and cancel, or NULL with *ret_error. */
static const char *task_arg(json_t *args, json_t **ret_error)
{
    static const char *const known[] = {"task_id", NULL};
    *ret_error = unknown_args(args, known);
    if (*ret_error)
        return NULL;
    const char *id = json_string_value(json_object_get(args, "task_id"));
    if (!id || !ci_task_id_valid(id)) {
        *ret_error = tool_error("'task_id' must be the id run_python returned: 1 to 64 of "
                                "A-Z, a-z, 0-9, '_' and '-'");
        return NULL;
    }
    return id;
}

static json_t *tool_get(struct mcp *m, json_t *args)
{
    json_t *bad = NULL;
    const char *id = task_arg(args, &bad);
    if (!id)
        return bad;
    struct ci_error e = {{0}};
    if (ensure_broker(m, &e))
        return nats_down(m, &e);
    Ci__V1__ExecutionResult *r = NULL;
    ci_status s = ci_client_result_get(m->b, id, &r, &e);
    if (s == CI_ERR_NOT_FOUND)
        return tool_error("there is no task '%s': it was never submitted, or its result expired "
                          "(results are kept %u s)",
                          id, m->cfg->jetstream.max_age_s);
    if (s)
        return tool_error("the result of task %s cannot be read: %s", id, e.msg);
    /* Not ended: wait for it as run_python does, so that an agent coming
     * back does not have to poll. */
    if (!ci_task_status_terminal(r->status)) {
        m->progress_state = r->status == CI__V1__TASK_STATUS__TASK_STATUS_RUNNING
                                ? "running"
                                : "waiting for a worker";
        s = ci_client_wait(m->b, id, wait_budget(m), on_progress, m, false, &e);
        if (s && s != CI_ERR_TIMEOUT)
            fprintf(stderr, "ci mcp: waiting for task %s: %s\n", id, e.msg);
        Ci__V1__ExecutionResult *now = NULL;
        if (ci_client_result_get(m->b, id, &now, NULL) == CI_OK) {
            ci_message_free(&r->base);
            r = now;
        }
    }
    json_t *res;
    if (ci_task_status_terminal(r->status))
        res = result_content(m, r);
    else
        res = still_running(id, r->status == CI__V1__TASK_STATUS__TASK_STATUS_RUNNING
                                    ? "running"
                                    : "waiting for a worker",
                            ci_mono_ms() - m->call_started_ms);
    ci_message_free(&r->base);
    return res;
}

static json_t *tool_cancel(struct mcp *m, json_t *args)
{
    json_t *bad = NULL;
    const char *id = task_arg(args, &bad);
    if (!id)
        return bad;
    struct ci_error e = {{0}};
    if (ensure_broker(m, &e))
        return nats_down(m, &e);
    if (ci_broker_cancel_publish(m->b, id, &e))
        return tool_error("the cancel of task %s could not be sent: %s", id, e.msg);
    char text[512];
    snprintf(text, sizeof(text),
             "cancel of task %s sent. If it was still queued or running it ends CANCELLED "
             "(get_result with task_id \"%s\" shows it); a task that had ended is not affected.",
             id, id);
    return tool_text(false, text);
}

/* --- the methods --- */

static json_t *do_initialize(struct mcp *m, json_t *params)
{
    const char *asked = json_string_value(json_object_get(params, "protocolVersion"));
    const char *v = versions[0];
    for (size_t i = 0; asked && i < sizeof(versions) / sizeof(versions[0]); i++)
        if (strcmp(asked, versions[i]) == 0)
            v = versions[i];
    m->progress_message = strcmp(v, "2024-11-05") != 0;
    return json_pack("{s:s, s:{s:{s:b}}, s:{s:s, s:s}, s:s}", "protocolVersion", v,
                     "capabilities", "tools", "listChanged", 0, "serverInfo", "name", "ci",
                     "version", MCP_VERSION, "instructions",
                     "run_python runs Python in a sandbox on a remote worker pool; pass "
                     "session_id to keep state between runs.");
}

static json_t *do_tools_list(struct mcp *m)
{
    struct ci_error e = {{0}};
    json_t *manifest = NULL;
    /* Without NATS the tools are still listed, described from the config. */
    if (ensure_broker(m, &e) == CI_OK && ci_tools_manifest(m->b, &manifest, &e))
        fprintf(stderr, "ci mcp: the runtime manifest cannot be read: %s\n", e.msg);
    json_t *tools = ci_tools_build(CI_TOOLS_MCP, manifest, m->cfg);
    json_decref(manifest);
    return tools;
}

/* One message (of a batch or alone); msg stays the caller's. */
static void handle_msg(struct mcp *m, json_t *msg)
{
    json_t *id = json_object_get(msg, "id");
    json_t *method = json_object_get(msg, "method");
    json_t *params = json_object_get(msg, "params");
    if (!json_is_object(msg)) {
        reply_error(m, NULL, -32600, "a message must be a JSON object");
        return;
    }
    if (!method && (json_object_get(msg, "result") || json_object_get(msg, "error")))
        return; /* a response; we send no requests */
    if (id && !json_is_string(id) && !json_is_integer(id)) {
        reply_error(m, NULL, -32600, "'id' must be a string or an integer");
        return;
    }
    if (!json_is_string(method) ||
        !json_is_string(json_object_get(msg, "jsonrpc")) ||
        strcmp(json_string_value(json_object_get(msg, "jsonrpc")), "2.0") != 0) {
        reply_error(m, id, -32600, "not a JSON-RPC 2.0 request");
        return;
    }
    if (!id)
        return; /* notifications/initialized, notifications/cancelled, ...: no reply */
    const char *name = json_string_value(method);
    if (params && !json_is_object(params)) {
        reply_error(m, id, -32602, "'params' must be an object");
        return;
    }
    if (strcmp(name, "initialize") == 0 && m->batch) {
        reply_error(m, id, -32600, "initialize must not be part of a batch");
    } else if (strcmp(name, "initialize") == 0) {
        reply(m, id, do_initialize(m, params));
    } else if (strcmp(name, "ping") == 0) {
        reply(m, id, json_object());
    } else if (strcmp(name, "tools/list") == 0) {
        reply(m, id, do_tools_list(m));
    } else if (strcmp(name, "tools/call") == 0) {
        const char *tool = json_string_value(json_object_get(params, "name"));
        json_t *args = json_object_get(params, "arguments");
        if (!tool || (args && !json_is_object(args))) {
            reply_error(m, id, -32602, "tools/call needs 'name' (a string) and 'arguments' (an object)");
            return;
        }
        json_t *empty = json_object();
        if (!args)
            args = empty;
        json_t *token = json_object_get(json_object_get(params, "_meta"), "progressToken");
        m->progress_token = json_is_string(token) || json_is_integer(token) ? token : NULL;
        m->progress_n = 0;
        m->call_started_ms = m->progress_last_ms = ci_mono_ms();
        m->progress_state = "waiting for a worker";
        json_t *res = strcmp(tool, "run_python") == 0   ? tool_run(m, args)
                      : strcmp(tool, "get_result") == 0 ? tool_get(m, args)
                      : strcmp(tool, "cancel") == 0     ? tool_cancel(m, args)
                                                        : NULL;
        json_decref(empty);
        m->progress_token = NULL;
        if (strcmp(tool, "run_python") && strcmp(tool, "get_result") && strcmp(tool, "cancel"))
            reply_error(m, id, -32602, "unknown tool '%.64s': use run_python, get_result or cancel",
                        tool);
        else if (!res)
            reply_error(m, id, -32603, "out of memory");
        else
            reply(m, id, res);
    } else {
        reply_error(m, id, -32601, "method '%.100s' not found", name);
    }
}

/* A line: one message, or a batch (an array of them, protocol 2025-03-26)
 * answered with one array of the replies, or with nothing when all were
 * notifications. */
static void handle(struct mcp *m, const char *data, size_t len)
{
    json_error_t je;
    json_t *msg = json_loadb(data, len, JSON_REJECT_DUPLICATES, &je);
    if (!msg) {
        reply_error(m, NULL, -32700, "parse error: %s (column %d)", je.text, je.column);
        return;
    }
    if (!json_is_array(msg)) {
        handle_msg(m, msg);
    } else if (json_array_size(msg) == 0) {
        reply_error(m, NULL, -32600, "a batch must hold 1 to %d messages", BATCH_MAX);
    } else if (json_array_size(msg) > BATCH_MAX) {
        /* Each request is answered, so that no client waits for it. */
        json_t *errors = json_array();
        char text[128];
        snprintf(text, sizeof(text),
                 "the batch holds more than %d messages; nothing of it ran", BATCH_MAX);
        size_t i;
        json_t *one;
        json_array_foreach(msg, i, one) {
            json_t *id = json_object_get(one, "id");
            if (json_is_string(id) || json_is_integer(id))
                json_array_append_new(
                    errors, json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id,
                                      "error", "code", -32600, "message", text));
        }
        if (json_array_size(errors))
            write_msg(m, errors);
        else {
            json_decref(errors);
            reply_error(m, NULL, -32600, "a batch must hold 1 to %d messages", BATCH_MAX);
        }
    } else {
        m->batch = json_array();
        m->batch_deadline_ms = ci_mono_ms() + m->o->wait_ms;
        size_t i;
        json_t *one;
        json_array_foreach(msg, i, one) {
            handle_msg(m, one);
        }
        json_t *replies = m->batch;
        m->batch = NULL;
        if (json_array_size(replies))
            write_msg(m, replies);
        else
            json_decref(replies);
    }
    json_decref(msg);
}

int ci_mcp_serve(struct ci_broker *b, const struct ci_config *cfg, const struct ci_mcp_opts *o)
{
    /* stdout is the protocol: keep it for ourselves and point fd 1 at
     * stderr, so that nothing else (a library's printf) can ever write into
     * the JSON-RPC stream. */
    int pfd = fcntl(1, F_DUPFD_CLOEXEC, 3);
    FILE *out = pfd >= 0 ? fdopen(pfd, "w") : NULL;
    if (!out || dup2(2, 1) < 0) {
        fprintf(stderr, "ci mcp: cannot set up stdout: %s\n", strerror(errno));
        if (out)
            fclose(out);
        else if (pfd >= 0)
            close(pfd);
        ci_broker_free(b);
        return 3;
    }
    signal(SIGPIPE, SIG_IGN); /* a client gone: writes fail, the read sees the end */
    struct mcp m = {.b = b, .cfg = cfg, .o = o, .out = out, .save_fd = -1};
    struct reader *r = calloc(1, sizeof(*r));
    CI_AUTOBUF struct ci_buf line = CI_BUF_INIT;
    bool too_long = false;
    while (r && next_line(r, &line, &too_long) == 1) {
        if (too_long) {
            reply_error(&m, NULL, -32700, "message longer than %u bytes", LINE_MAX_BYTES);
            continue;
        }
        size_t n = line.len;
        while (n && (line.data[n - 1] == '\r' || line.data[n - 1] == ' ' || line.data[n - 1] == '\t'))
            n--;
        if (n)
            handle(&m, (const char *)line.data, n);
    }
    free(r);
    if (m.save_fd >= 0)
        close(m.save_fd);
    fclose(out);
    ci_broker_free(m.b);
    return 0;
}
