/* session.c - a session step's state at the sandbox's edge (docs/contract.md
 * section 16). Before the code: the worker's `.ci-session`
 * ("max_state_bytes=N") and `.ci-state` (the previous step's archive) go
 * into the workspace. After it, once every process of the run is dead:
 * `.ci-state-out`, read through the workspace fd following nothing, and
 * the driver's session keys of the report (texts capped and sanitized: the
 * code can write the report). The archive is opaque here; only the driver
 * inside the sandbox makes and reads it. The files the driver restored
 * unchanged are no artifacts of this step. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "sandbox/sandbox_int.h"

#define SESSION_FILE ".ci-session"
#define STATE_IN ".ci-state"
#define STATE_OUT ".ci-state-out"
#define STATE_TMP ".ci-state-out.tmp"
#define SESSION_TEXT_MAX 1000          /* bytes kept of a restore or state error */
#define SESSION_DROPPED_MAX (8 * 1024) /* bytes kept of the dropped names */
#define SESSION_FILES_MAX 2000         /* restored files taken from the report */

bool session_reserved_name(const char *name)
{
    return strcmp(name, SESSION_FILE) == 0 || strcmp(name, STATE_IN) == 0 ||
           strcmp(name, STATE_OUT) == 0 || strcmp(name, STATE_TMP) == 0;
}

/* "12.3 MiB" */
static void mib(uint64_t n, char *out, size_t size)
{
    snprintf(out, size, "%.1f MiB", (double)n / (1024.0 * 1024.0));
}

/* "64 MiB", or bytes when the cap is no whole number of MiB */
static void cap_text(uint64_t n, char *out, size_t size)
{
    if (n % (1024 * 1024) == 0)
        snprintf(out, size, "%llu MiB", (unsigned long long)(n >> 20));
    else
        snprintf(out, size, "%llu bytes", (unsigned long long)n);
}

/* Creates name in the workspace with data; 0 or an errno. */
static int write_ws_file(int ws_fd, const char *name, const void *data, size_t len)
{
    int fd = openat(ws_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno;
    int e = ci_write_all(fd, data, len) == CI_OK ? 0 : errno ? errno : EIO;
    if (close(fd) != 0 && !e)
        e = errno;
    return e;
}

ci_status session_write(struct ci_sandbox_run *run, const struct ci_job *job,
                        struct ci_error *err)
{
    if (!run->session_on)
        return CI_OK;
    const struct ci_session_job *sj = &job->session;
    char text[64];
    int n = snprintf(text, sizeof(text), "max_state_bytes=%llu\n",
                     (unsigned long long)sj->max_state_bytes);
    int e = write_ws_file(run->ws_fd, SESSION_FILE, text, (size_t)n);
    if (!e && sj->state)
        e = write_ws_file(run->ws_fd, STATE_IN, sj->state, sj->state_len);
    if (!e)
        return CI_OK;
    if (e == ENOSPC || e == EFBIG || e == EDQUOT) {
        char size[32];
        mib(sj->state_len, size, sizeof(size));
        return ci_error_set(err, CI_ERR_LIMIT,
                            "the session's state (%s) does not fit in the workspace of %u MiB "
                            "(local.workspace_mb)", size, run->sb->cfg->local.workspace_mb);
    }
    return ci_error_errno(err, CI_ERR_IO, e, "cannot write the session's state into the "
                          "workspace");
}

/* A text of the report: at most max bytes (a list cut after its last whole
 * line), sanitized; NULL for an empty one. */
static char *session_text(const char *v, size_t len, size_t max, bool lines, ci_status *s)
{
    if (!v || !len)
        return NULL;
    if (len > max) {
        const char *nl = lines ? memrchr(v, '\n', max) : NULL;
        len = nl ? (size_t)(nl - v) : max;
    }
    char *t = ci_utf8_sanitize((const uint8_t *)v, len, NULL);
    if (!t)
        *s = CI_ERR_NOMEM;
    return t;
}

static int cmp_digest(const void *a, const void *b)
{
    return strcmp(((const struct input_digest *)a)->name, ((const struct input_digest *)b)->name);
}

static bool hex64(const char *p)
{
    for (int i = 0; i < 64; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return false;
    return true;
}

/* session_files: "<sha256 hex> <path>" lines, into run->restored (sorted). */
static ci_status parse_restored(struct ci_sandbox_run *run, const char *v, size_t len)
{
    if (!v)
        return CI_OK;
    run->restored = calloc(SESSION_FILES_MAX, sizeof(*run->restored));
    if (!run->restored)
        return CI_ERR_NOMEM;
    const char *p = v, *end = v + len;
    while (p < end && run->n_restored < SESSION_FILES_MAX) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *line_end = nl ? nl : end;
        size_t n = (size_t)(line_end - p);
        if (n > 65 && p[64] == ' ' && hex64(p)) {
            struct input_digest *d = &run->restored[run->n_restored];
            if (!(d->name = strndup(p + 65, n - 65)))
                return CI_ERR_NOMEM;
            memcpy(d->sha256, p, 64);
            d->sha256[64] = '\0';
            run->n_restored++;
        }
        p = line_end + 1;
    }
    if (run->n_restored)
        qsort(run->restored, run->n_restored, sizeof(*run->restored), cmp_digest);
    return CI_OK;
}

bool session_unchanged(const struct ci_sandbox_run *run, const char *rel, const char *sha)
{
    if (!run->n_restored)
        return false;
    struct input_digest key = {.name = (char *)rel};
    const struct input_digest *d =
        bsearch(&key, run->restored, run->n_restored, sizeof(key), cmp_digest);
    return d && strcmp(d->sha256, sha) == 0;
}


ci_status session_collect(struct ci_sandbox_run *run, struct ci_sandbox_result *r)
{
    if (!run->session_on)
        return CI_OK;
    struct ci_session_outcome *so = &r->outcome.session;
    const char *rep = r->report;
    size_t len = r->report_len, vlen = 0;
    ci_status s = CI_OK;
    const char *v = ci_report_get(rep, len, "session_restored", &vlen);
    so->restored = v && strcmp(v, "1") == 0;
    v = ci_report_get(rep, len, "session_keep_previous", &vlen);
    so->keep_previous = v && strcmp(v, "1") == 0;
    v = ci_report_get(rep, len, "session_restore_error", &vlen);
    so->restore_error = session_text(v, vlen, SESSION_TEXT_MAX, false, &s);
    v = ci_report_get(rep, len, "session_dropped", &vlen);
    so->dropped = session_text(v, vlen, SESSION_DROPPED_MAX, true, &s);
    v = ci_report_get(rep, len, "session_files", &vlen);
    if (!s)
        s = parse_restored(run, v, v ? vlen : 0);
    uint64_t size = 0;
    if (!s)
        s = read_beneath(run->ws_fd, STATE_OUT, run->max_state_bytes, &so->state,
                         &so->state_len, &size);
    if (s || so->state)
        return s;
    if (size > run->max_state_bytes) {
        char have[32], cap[32];
        mib(size, have, sizeof(have));
        cap_text(run->max_state_bytes, cap, sizeof(cap));
        if (asprintf(&so->state_error, "the state is %s, over the cap of %s "
                     "(sessions.max_state_mb)", have, cap) < 0) {
            so->state_error = NULL;
            return CI_ERR_NOMEM;
        }
        return CI_OK;
    }
    v = ci_report_get(rep, len, "session_state_error", &vlen);
    so->state_error = v && vlen ? session_text(v, vlen, SESSION_TEXT_MAX, false, &s)
                                : strdup("the step left no state");
    return !s && so->state_error ? CI_OK : CI_ERR_NOMEM;
}
