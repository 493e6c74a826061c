/* request.c - the rules of docs/contract.md ("Messages", "Limits") for an ExecutionRequest.
 *
 * Every error is one sentence that names the culprit and says what would be
 * accepted, because it goes back to an agent as ExecutionResult.error. User
 * text quoted in an error is cut short and reduced to printable ASCII.
 *
 * Strings: a request decoded by ci_message_decode() never holds a NUL inside a
 * string (the codec refuses one, since a char * would silently cut it), so the
 * checks here may use strlen(). */
#include "core/request.h"
#include "core/session.h"

#include "core/text.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* Limits on what a caller may attach; not in the config because no agent
 * has a reason to come near them. */
#define MAX_INPUT_FILES 256
#define MAX_INPUT_NAME 128
#define MAX_OBJECT_NAME 1024
#define MAX_LABELS 64
#define MAX_LABEL_KEY 256
#define MAX_LABEL_VALUE 1024
#define QUOTE_CAP 64

static void quote(char *out, size_t outsz, const char *s)
{
    size_t len = s ? strlen(s) : 0;
    size_t cap = outsz - 1, o = 0;
    for (size_t i = 0; i < len && o < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        out[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (len > cap && o >= 3)
        memcpy(out + o - 3, "...", 3);
    out[o] = '\0';
}

/* "512 bytes", "1.5 KiB", "20 MiB", "23.4 MiB"; with exact set, always one
 * decimal ("20.0 MiB") so that two sizes can be compared as shown. */
static void fmt_size(char *out, size_t outsz, uint64_t n, bool exact)
{
    const uint64_t kib = 1024, mib = 1024 * 1024;
    uint64_t unit = n < kib ? 1 : n < mib ? kib : mib;
    const char *name = unit == 1 ? "bytes" : unit == kib ? "KiB" : "MiB";
    if (unit == 1 || (!exact && n % unit == 0))
        snprintf(out, outsz, "%" PRIu64 " %s", n / unit, name);
    else
        snprintf(out, outsz, "%.1f %s", (double)n / (double)unit, name);
}

/* "<what> <size>; the limit is <limit>", in bytes when rounding would make
 * the two look equal. */
static ci_status too_big(struct ci_error *err, const char *what, uint64_t size, uint64_t limit)
{
    char a[48], b[48];
    fmt_size(a, sizeof(a), size, true);
    fmt_size(b, sizeof(b), limit, true);
    bool same = strcmp(a, b) == 0;
    fmt_size(a, sizeof(a), size, false);
    fmt_size(b, sizeof(b), limit, false);
    if (same)
        return ci_error_set(err, CI_ERR_LIMIT,
                            "%s %" PRIu64 " bytes; the limit is %" PRIu64 " bytes (%s)", what,
                            size, limit, b);
    return ci_error_set(err, CI_ERR_LIMIT, "%s %s; the limit is %s", what, a, b);
}

bool ci_task_id_valid(const char *id)
{
    if (!id)
        return false;
    size_t n = 0;
    for (; id[n]; n++) {
        char c = id[n];
        if (n >= 64 || !((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
                         (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return n >= 1;
}

/* Why name is not an acceptable input file name, or NULL when it is; a
 * reason that names a character is written into buf. A character that is
 * invisible or reorders text (U+202E, U+200B, ...) is named as such: the
 * agent cannot see it in its own name. */
static const char *name_problem(const char *name, size_t len, char *buf, size_t bufsz)
{
    if (!name || len == 0)
        return "a file name is required";
    if (len > MAX_INPUT_NAME)
        return "it is longer than 128 bytes";
    for (size_t i = 0; i < len; i++)
        if (name[i] == '/' || name[i] == '\\')
            return "use a plain file name, not a path";
    uint32_t cp = 0;
    switch (ci_text_name_check(name, len, &cp)) {
    case CI_TEXT_NOT_UTF8: return "it is not valid UTF-8";
    case CI_TEXT_UNSAFE:
        snprintf(buf, bufsz,
                 "it holds U+%04" PRIX32 ", a control or format character that is invisible or "
                 "moves or reorders text",
                 cp);
        return buf;
    case CI_TEXT_OK: break;
    }
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-' || c == ' '))
            return "use only letters, digits, '.', '_', '-' and spaces";
    }
    if (name[0] == '.')
        return "it must not start with '.'";
    return NULL;
}

const char *ci_input_name_problem(const char *name, size_t len, char *buf, size_t bufsz)
{
    return name_problem(name, len, buf, bufsz);
}

bool ci_input_name_valid(const char *name, size_t len)
{
    char buf[128];
    return name_problem(name, len, buf, sizeof(buf)) == NULL;
}

static ci_status check_files(const struct ci_config *cfg, const Ci__V1__ExecutionRequest *req,
                             struct ci_error *err)
{
    char q[QUOTE_CAP + 1];
    if (req->n_files > MAX_INPUT_FILES)
        return ci_error_set(err, CI_ERR_LIMIT, "the request has %zu input files; the limit is %d",
                            req->n_files, MAX_INPUT_FILES);
    uint64_t total = 0;
    for (size_t i = 0; i < req->n_files; i++) {
        const Ci__V1__InputFile *f = req->files ? req->files[i] : NULL;
        if (!f)
            return ci_error_set(err, CI_ERR_INVALID, "input file %zu is empty", i + 1);
        const char *name = f->name ? f->name : "";
        char reason[128];
        const char *why = name_problem(name, strlen(name), reason, sizeof(reason));
        quote(q, sizeof(q), name);
        if (why && !*name)
            return ci_error_set(err, CI_ERR_INVALID, "input file %zu has no name: %s", i + 1,
                                why);
        if (why)
            return ci_error_set(err, CI_ERR_INVALID,
                                "input name '%s' is not allowed: %s (at most 128 of letters, "
                                "digits, '.', '_', '-' and spaces, not starting with '.')",
                                q, why);
        for (size_t j = 0; j < i; j++)
            if (req->files[j] && req->files[j]->name && strcmp(req->files[j]->name, name) == 0)
                return ci_error_set(err, CI_ERR_INVALID,
                                    "input name '%s' is used by more than one input file", q);
        switch (f->source_case) {
        case CI__V1__INPUT_FILE__SOURCE_CONTENT:
            total += f->content.len;
            break;
        case CI__V1__INPUT_FILE__SOURCE_OBJECT: {
            size_t n = f->object ? strlen(f->object) : 0;
            if (n == 0)
                return ci_error_set(err, CI_ERR_INVALID,
                                    "input '%s' names an empty object: give the name of an "
                                    "object in the files bucket",
                                    q);
            if (n > MAX_OBJECT_NAME)
                return ci_error_set(err, CI_ERR_INVALID,
                                    "input '%s' names an object of %zu bytes; object names are "
                                    "at most %d bytes",
                                    q, n, MAX_OBJECT_NAME);
            /* A session's state is its own (docs/contract.md §16). */
            if (strncmp(f->object, CI_SESSION_OBJECT_PREFIX,
                        strlen(CI_SESSION_OBJECT_PREFIX)) == 0)
                return ci_error_set(err, CI_ERR_INVALID,
                                    "input '%s' names an object under '%s', where sessions keep "
                                    "their state: no task may read it",
                                    q, CI_SESSION_OBJECT_PREFIX);
            break;
        }
        default:
            return ci_error_set(err, CI_ERR_INVALID,
                                "input '%s' has neither content nor object: set one of them", q);
        }
    }
    if (total > cfg->limits.max_input_bytes)
        return too_big(err, "input files total", total, cfg->limits.max_input_bytes);
    return CI_OK;
}

static ci_status check_labels(const Ci__V1__ExecutionRequest *req, struct ci_error *err)
{
    char q[QUOTE_CAP + 1];
    if (req->n_labels > MAX_LABELS)
        return ci_error_set(err, CI_ERR_LIMIT, "the request has %zu labels; the limit is %d",
                            req->n_labels, MAX_LABELS);
    for (size_t i = 0; i < req->n_labels; i++) {
        const Ci__V1__ExecutionRequest__LabelsEntry *l = req->labels ? req->labels[i] : NULL;
        if (!l)
            return ci_error_set(err, CI_ERR_INVALID, "label %zu is empty", i + 1);
        size_t kn = l->key ? strlen(l->key) : 0;
        size_t vn = l->value ? strlen(l->value) : 0;
        if (kn == 0)
            return ci_error_set(err, CI_ERR_INVALID,
                                "label %zu has an empty key: a label needs a name", i + 1);
        quote(q, sizeof(q), l->key);
        if (kn > MAX_LABEL_KEY)
            return ci_error_set(err, CI_ERR_LIMIT,
                                "label key '%s' is %zu bytes; the limit is %d bytes", q, kn,
                                MAX_LABEL_KEY);
        if (vn > MAX_LABEL_VALUE)
            return ci_error_set(err, CI_ERR_LIMIT,
                                "the value of label '%s' is %zu bytes; the limit is %d bytes", q,
                                vn, MAX_LABEL_VALUE);
    }
    return CI_OK;
}

bool ci_request_labels_ok(const Ci__V1__ExecutionRequest *req)
{
    return check_labels(req, NULL) == CI_OK;
}

ci_status ci_request_validate(const struct ci_config *cfg, const Ci__V1__ExecutionRequest *req,
                              uint32_t *ret_timeout_ms, uint32_t *ret_memory_mb,
                              struct ci_error *err)
{
    char q[QUOTE_CAP + 1];
    if (!req)
        return ci_error_set(err, CI_ERR_INVALID, "the request is empty");

    if (req->task_id && req->task_id[0] && !ci_task_id_valid(req->task_id)) {
        quote(q, sizeof(q), req->task_id);
        return ci_error_set(err, CI_ERR_INVALID,
                            "task_id '%s' is not valid: use 1 to 64 of A-Z, a-z, 0-9, '_' and '-'",
                            q);
    }

    const char *lang = req->language ? req->language : "";
    if (strcmp(lang, "python") != 0) {
        quote(q, sizeof(q), lang);
        return ci_error_set(err, CI_ERR_INVALID,
                            "unsupported language '%s': only 'python' is supported", q);
    }

    size_t code_len = req->code ? strlen(req->code) : 0;
    if (code_len == 0)
        return ci_error_set(err, CI_ERR_INVALID, "code is empty: send the Python source to run");
    if (code_len > cfg->limits.max_code_bytes)
        return too_big(err, "code is", code_len, cfg->limits.max_code_bytes);

    const char *runtime = req->runtime ? req->runtime : "";
    if (*runtime && strcmp(runtime, CI_DEFAULT_RUNTIME) != 0) {
        quote(q, sizeof(q), runtime);
        return ci_error_set(err, CI_ERR_INVALID,
                            "unsupported runtime '%s': only '" CI_DEFAULT_RUNTIME
                            "' is available",
                            q);
    }

    uint32_t timeout_ms = req->limits ? req->limits->timeout_ms : 0;
    uint32_t memory_mb = req->limits ? req->limits->memory_mb : 0;
    if (timeout_ms == 0)
        timeout_ms = cfg->limits.default_timeout_ms;
    else if (timeout_ms > cfg->limits.max_timeout_ms)
        return ci_error_set(err, CI_ERR_LIMIT, "timeout_ms %" PRIu32 " is above the limit of %" PRIu32,
                            timeout_ms, cfg->limits.max_timeout_ms);
    if (memory_mb == 0)
        memory_mb = cfg->limits.default_memory_mb;
    else if (memory_mb > cfg->limits.max_memory_mb)
        return ci_error_set(err, CI_ERR_LIMIT, "memory_mb %" PRIu32 " is above the limit of %" PRIu32,
                            memory_mb, cfg->limits.max_memory_mb);

    if (req->session_id && req->session_id[0] && !ci_task_id_valid(req->session_id)) {
        quote(q, sizeof(q), req->session_id);
        return ci_error_set(err, CI_ERR_INVALID,
                            "session_id '%s' (%zu bytes) is not a session id: use 1 to 64 of "
                            "A-Z, a-z, 0-9, '_' and '-'",
                            q, strlen(req->session_id));
    }

    if (req->batch_id && req->batch_id[0] && !ci_task_id_valid(req->batch_id)) {
        quote(q, sizeof(q), req->batch_id);
        return ci_error_set(err, CI_ERR_INVALID,
                            "batch_id '%s' (%zu bytes) is not a batch id: use 1 to 64 of "
                            "A-Z, a-z, 0-9, '_' and '-'",
                            q, strlen(req->batch_id));
    }
    if (req->batch_id && req->batch_id[0] && req->session_id && req->session_id[0])
        return ci_error_set(err, CI_ERR_INVALID,
                            "a task is a session's step or a batch's task, not both: drop "
                            "session_id or batch_id");

    if (req->policy) {
        const char *net = req->policy->network ? req->policy->network : "";
        const char *pkg = req->policy->packages ? req->policy->packages : "";
        if (*net && strcmp(net, "disabled") != 0) {
            quote(q, sizeof(q), net);
            return ci_error_set(err, CI_ERR_INVALID,
                                "policy.network '%s' is not supported: the only choice is "
                                "'disabled' (no network)",
                                q);
        }
        if (*pkg && strcmp(pkg, "base") != 0) {
            quote(q, sizeof(q), pkg);
            return ci_error_set(err, CI_ERR_INVALID,
                                "policy.packages '%s' is not supported: the only choice is 'base' "
                                "(numpy, pandas, matplotlib, openpyxl; no pip install)",
                                q);
        }
    }

    ci_status s = check_files(cfg, req, err);
    if (s)
        return s;
    s = check_labels(req, err);
    if (s)
        return s;

    if (ret_timeout_ms)
        *ret_timeout_ms = timeout_ms;
    if (ret_memory_mb)
        *ret_memory_mb = memory_mb;
    return CI_OK;
}
