/* client.c - submit, wait, read results and save artifacts: the NATS side
 * of every client front end (client.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/client.h"
#include "core/request.h"
#include "core/text.h"
#include "core/util.h"
#include "nats/broker.h"
#include "nats/objstore.h"

ci_status ci_client_read_file(const char *path, size_t max, uint8_t **ret, size_t *ret_len,
                              struct ci_error *err)
{
    CI_AUTOCLOSE int fd = strcmp(path, "-") == 0 ? dup(0) : open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ci_error_errno(err, errno == ENOENT ? CI_ERR_NOT_FOUND : CI_ERR_IO, errno,
                              "cannot open '%s'", path);
    CI_AUTOBUF struct ci_buf b = CI_BUF_INIT;
    uint8_t chunk[65536];
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ci_error_errno(err, CI_ERR_IO, errno, "cannot read '%s'", path);
        if (n == 0)
            break;
        if (b.len + (size_t)n > max)
            return ci_error_set(err, CI_ERR_LIMIT, "'%s' is larger than %zu bytes", path, max);
        if (ci_buf_append(&b, chunk, (size_t)n))
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    }
    *ret = ci_buf_steal(&b, ret_len);
    return *ret ? CI_OK : ci_error_set(err, CI_ERR_NOMEM, "out of memory");
}

void ci_client_random_id(char out[27])
{
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    uint8_t r[26];
    if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
        for (size_t i = 0; i < sizeof(r); i++)
            r[i] = (uint8_t)(rand() ^ getpid());
    }
    for (size_t i = 0; i < sizeof(r); i++)
        out[i] = alphabet[r[i] % 36];
    out[26] = '\0';
}

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

ci_status ci_client_submit(struct ci_broker *b, const struct ci_config *cfg,
                           const struct ci_submit_args *a, char task_id[65], bool *ret_duplicate,
                           struct ci_error *err)
{
    ci_status s = CI_ERR_NOMEM;
    uint8_t *wire = NULL;
    size_t wire_len = 0;
    Ci__V1__InputFile files[CI_CLIENT_MAX_FILES], *file_ptrs[CI_CLIENT_MAX_FILES];
    uint8_t *file_data[CI_CLIENT_MAX_FILES] = {0};
    char *object_names[CI_CLIENT_MAX_FILES] = {0};
    Ci__V1__ExecutionRequest__LabelsEntry labels[CI_CLIENT_MAX_LABELS],
        *label_ptrs[CI_CLIENT_MAX_LABELS];
    Ci__V1__ExecutionResult__LabelsEntry qlabels[CI_CLIENT_MAX_LABELS],
        *qlabel_ptrs[CI_CLIENT_MAX_LABELS];
    char *label_copies[CI_CLIENT_MAX_LABELS] = {0};
    CI_AUTOFREE char *code = NULL;

    if (a->n_files > CI_CLIENT_MAX_FILES || a->n_labels > CI_CLIENT_MAX_LABELS)
        return ci_error_set(err, CI_ERR_INVALID, "at most %d input files and %d labels",
                            CI_CLIENT_MAX_FILES, CI_CLIENT_MAX_LABELS);
    if (a->code_len > cfg->limits.max_code_bytes)
        return ci_error_set(err, CI_ERR_INVALID, "the code is %zu bytes; the limit is %u bytes",
                            a->code_len, cfg->limits.max_code_bytes);
    /* The code travels as a C string: a NUL would silently cut it. */
    if (memchr(a->code, 0, a->code_len))
        return ci_error_set(err, CI_ERR_INVALID, "the code holds a NUL byte, so it is not Python source");
    code = strndup(a->code, a->code_len);
    if (!code)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    if (a->id)
        snprintf(task_id, 65, "%s", a->id);
    else
        ci_client_random_id(task_id);

    Ci__V1__ExecutionRequest req = CI__V1__EXECUTION_REQUEST__INIT;
    Ci__V1__Limits limits = CI__V1__LIMITS__INIT;
    req.task_id = task_id;
    req.session_id = (char *)(a->session ? a->session : "");
    req.batch_id = (char *)(a->batch ? a->batch : "");
    req.language = (char *)"python";
    req.code = code;
    limits.timeout_ms = a->timeout_ms;
    limits.memory_mb = a->memory_mb;
    req.limits = &limits;
    for (size_t i = 0; i < a->n_files; i++) {
        size_t len = 0;
        const char *name = base_name(a->files[i]);
        if (!ci_input_name_valid(name, strlen(name))) {
            s = ci_error_set(err, CI_ERR_INVALID,
                             "input name '%s' is not allowed: use [A-Za-z0-9._ -], not starting "
                             "with '.'",
                             name);
            goto out;
        }
        for (size_t j = 0; j < i; j++)
            if (strcmp(files[j].name, name) == 0) {
                s = ci_error_set(err, CI_ERR_INVALID,
                                 "two input files are named '%s': each appears as ./NAME, so "
                                 "names must differ",
                                 name);
                goto out;
            }
        s = ci_client_read_file(a->files[i], cfg->limits.max_input_bytes, &file_data[i], &len,
                                err);
        if (s) {
            s = s == CI_ERR_NOMEM ? s : CI_ERR_INVALID;
            goto out;
        }
        ci__v1__input_file__init(&files[i]);
        files[i].name = (char *)name;
        if (len <= CI_CLIENT_INLINE_MAX) {
            files[i].source_case = CI__V1__INPUT_FILE__SOURCE_CONTENT;
            files[i].content.data = file_data[i];
            files[i].content.len = len;
        } else {
            size_t n = strlen("inputs/") + strlen(task_id) + 1 + strlen(name) + 1;
            object_names[i] = malloc(n);
            if (!object_names[i]) {
                s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
                goto out;
            }
            snprintf(object_names[i], n, "inputs/%s/%s", task_id, name);
            s = a->measure ? CI_OK
                           : ci_objstore_put(ci_broker_objstore(b), object_names[i],
                                             file_data[i], len, err);
            if (s)
                goto out;
            files[i].source_case = CI__V1__INPUT_FILE__SOURCE_OBJECT;
            files[i].object = object_names[i];
        }
        file_ptrs[i] = &files[i];
    }
    req.files = file_ptrs;
    req.n_files = a->n_files;
    for (size_t i = 0; i < a->n_labels; i++) {
        label_copies[i] = strdup(a->labels[i]);
        if (!label_copies[i]) {
            s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
            goto out;
        }
        char *eq = strchr(label_copies[i], '=');
        if (!eq) {
            s = ci_error_set(err, CI_ERR_INVALID, "label '%s' is not KEY=VALUE", a->labels[i]);
            goto out;
        }
        *eq = '\0';
        ci__v1__execution_request__labels_entry__init(&labels[i]);
        labels[i].key = label_copies[i];
        labels[i].value = eq + 1;
        label_ptrs[i] = &labels[i];
        ci__v1__execution_result__labels_entry__init(&qlabels[i]);
        qlabels[i].key = labels[i].key;
        qlabels[i].value = labels[i].value;
        qlabel_ptrs[i] = &qlabels[i];
    }
    req.labels = label_ptrs;
    req.n_labels = a->n_labels;

    enum ci_encoding enc = a->wire_json ? CI_ENC_JSON : CI_ENC_PROTOBUF;
    s = ci_message_encode(enc, &req.base, &wire, &wire_len, err);
    if (s)
        goto out;
    if (a->measure) {
        *a->measure = wire_len;
        goto out;
    }

    if (a->batch) {
        s = ci_broker_submit_batch(b, a->batch, task_id, ci_encoding_content_type(enc), wire,
                                   wire_len, ret_duplicate, err);
        goto out;
    }
    /* The QUEUED record lets a reader of the result answer before a worker
     * picks the task up. */
    Ci__V1__ExecutionResult queued = CI__V1__EXECUTION_RESULT__INIT;
    queued.task_id = task_id;
    queued.status = CI__V1__TASK_STATUS__TASK_STATUS_QUEUED;
    /* Entries of the result's own map type: the request's carry another
     * descriptor, which the encoders may follow. */
    queued.labels = qlabel_ptrs;
    queued.n_labels = req.n_labels;
    uint8_t *qbuf = NULL;
    size_t qlen = 0;
    if (ci_message_encode(enc, &queued.base, &qbuf, &qlen, NULL) == CI_OK) {
        s = ci_broker_result_create(b, task_id, qbuf, qlen, err);
        free(qbuf);
        if (s == CI_ERR_INVALID)
            goto out; /* the id is taken */
    }
    s = a->session ? ci_broker_submit_session(b, a->session, task_id,
                                              ci_encoding_content_type(enc), wire, wire_len,
                                              ret_duplicate, err)
                   : ci_broker_submit(b, task_id, ci_encoding_content_type(enc), wire, wire_len,
                                      ret_duplicate, err);
out:
    free(wire);
    for (size_t i = 0; i < CI_CLIENT_MAX_FILES; i++) {
        free(file_data[i]);
        free(object_names[i]);
    }
    for (size_t i = 0; i < CI_CLIENT_MAX_LABELS; i++)
        free(label_copies[i]);
    return s;
}

ci_status ci_client_result_decode(const uint8_t *buf, size_t len,
                                  Ci__V1__ExecutionResult **ret, struct ci_error *err)
{
    ProtobufCMessage *m = NULL;
    /* The encoding follows the request, which may not have been ours. */
    if (ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_result__descriptor, buf, len, &m,
                          NULL) &&
        ci_message_decode(CI_ENC_JSON, &ci__v1__execution_result__descriptor, buf, len, &m, err))
        return CI_ERR_INVALID;
    *ret = (Ci__V1__ExecutionResult *)m;
    return CI_OK;
}

ci_status ci_client_result_get(struct ci_broker *b, const char *id,
                               Ci__V1__ExecutionResult **ret, struct ci_error *err)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    ci_status s = ci_broker_result_get(b, id, &buf, &len, NULL, err);
    if (s)
        return s;
    *ret = NULL;
    s = ci_client_result_decode(buf, len, ret, err);
    free(buf);
    return s;
}

/* Whether the stored result is terminal; then fn gets it as the event that
 * was missed. A safety net for a terminal event that never came. */
static bool result_says_ended(struct ci_broker *b, const char *id, ci_client_event_fn fn,
                              void *closure)
{
    Ci__V1__ExecutionResult *r = NULL;
    if (ci_client_result_get(b, id, &r, NULL))
        return false;
    bool done = ci_task_status_terminal(r->status);
    if (done && fn) {
        Ci__V1__StatusEvent ev = CI__V1__STATUS_EVENT__INIT;
        ev.task_id = r->task_id;
        ev.status = r->status;
        ev.at_ms = r->finished_at_ms;
        ev.worker = r->worker;
        ev.message = r->error;
        if (r->_exit_code_case == CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE) {
            ev._exit_code_case = CI__V1__STATUS_EVENT___EXIT_CODE_EXIT_CODE;
            ev.exit_code = r->exit_code;
        }
        fn(&ev, closure);
    }
    ci_message_free(&r->base);
    return done;
}

ci_status ci_client_wait(struct ci_broker *b, const char *id, int64_t wait_ms,
                         ci_client_event_fn fn, void *closure, bool warn, struct ci_error *err)
{
    struct ci_watch *w = NULL;
    ci_status s = ci_watch_new(b, id, &w, err);
    if (s)
        return s == CI_ERR_TIMEOUT ? CI_ERR_NATS : s; /* a request, not wait_ms */
    int64_t deadline = ci_mono_ms() + wait_ms;
    bool warned = !warn, seen = false;
    int64_t started = ci_mono_ms(), last_check = started;
    for (;;) {
        int64_t left = deadline - ci_mono_ms();
        if (left <= 0) {
            s = ci_error_set(err, CI_ERR_TIMEOUT, "task %s did not end within %" PRId64 " ms",
                             id, wait_ms);
            break;
        }
        const uint8_t *data;
        size_t len;
        const char *ct;
        s = ci_watch_next(w, left < 1000 ? (int)left : 1000, &data, &len, &ct, err);
        if (s == CI_ERR_TIMEOUT) {
            if (fn)
                fn(NULL, closure);
            int64_t now = ci_mono_ms();
            if (!warned && !seen && now - started > 10000) {
                fprintf(stderr, "ci: task %s has not started yet; is a worker running?\n", id);
                warned = true;
            }
            if (now - last_check >= 5000) {
                last_check = now;
                if (result_says_ended(b, id, fn, closure)) {
                    s = CI_OK;
                    break;
                }
            }
            continue;
        }
        if (s)
            break; /* not CI_ERR_TIMEOUT: that is "none came" above */
        enum ci_encoding enc = CI_ENC_PROTOBUF;
        ci_encoding_from_content_type(ct, &enc, NULL);
        ProtobufCMessage *m = NULL;
        if (ci_message_decode(enc, &ci__v1__status_event__descriptor, data, len, &m, NULL))
            continue;
        Ci__V1__StatusEvent *ev = (Ci__V1__StatusEvent *)m;
        seen = true;
        if (fn)
            fn(ev, closure);
        bool done = ci_task_status_terminal(ev->status);
        ci_message_free(m);
        if (done) {
            s = CI_OK;
            break;
        }
    }
    ci_watch_free(w);
    return s;
}

/* The name is chosen by untrusted code, and any file that starts like a
 * PNG is an artifact: so no hidden component (".bashrc",
 * ".ssh/authorized_keys"), no "..", nothing but well-formed UTF-8 without
 * control or format characters (terminal escapes, U+202E turning
 * "x\u202egnp.csv" into "xvsc.png" on screen), and the extension must be
 * that of its type. */
bool ci_client_artifact_name_safe(const Ci__V1__Artifact *a)
{
    const char *name = a->name;
    size_t len = strlen(name);
    if (len == 0 || len > 4096 || name[0] == '/')
        return false;
    for (const char *p = name; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 0 || n > 255 || p[0] == '.')
            return false;
        p += n;
        if (*p == '/')
            p++;
    }
    if (ci_text_name_check(name, len, NULL) != CI_TEXT_OK)
        return false;
    const char *ext = !strcmp(a->mime_type, "text/csv")    ? ".csv"
                      : !strcmp(a->mime_type, "image/png") ? ".png"
                                                           : NULL;
    return ext && len > 4 && strcasecmp(name + len - 4, ext) == 0;
}

int ci_client_open_artifact(int dirfd, const char *name)
{
    char *copy = strdup(name);
    if (!copy)
        return -1;
    int dir = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    char *p = copy;
    for (char *slash; dir >= 0 && (slash = strchr(p, '/')) != NULL; p = slash + 1) {
        *slash = '\0';
        int sub = -1;
        if (mkdirat(dir, p, 0755) == 0 || errno == EEXIST)
            sub = openat(dir, p, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(dir);
        errno = e;
        dir = sub;
    }
    int fd = -1;
    if (dir >= 0) {
        /* O_NONBLOCK: a FIFO of that name fails instead of blocking. */
        fd = openat(dir, p, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
        struct stat st;
        int bad = fd < 0                     ? 0
                  : fstat(fd, &st) != 0      ? errno
                  : !S_ISREG(st.st_mode)     ? EINVAL
                  : ftruncate(fd, 0) != 0    ? errno
                                             : 0;
        if (bad) {
            close(fd);
            fd = -1;
            errno = bad;
        }
        int e = errno;
        close(dir);
        errno = e;
    }
    free(copy);
    return fd;
}

void ci_client_put_text(FILE *f, const char *s, size_t len)
{
    if (!isatty(fileno(f))) {
        fwrite(s, 1, len, f);
        return;
    }
    struct ci_buf b = CI_BUF_INIT;
    if (ci_text_escape(&b, s, len, true) == CI_OK && b.len)
        fwrite(b.data, 1, b.len, f);
    ci_buf_release(&b);
}
