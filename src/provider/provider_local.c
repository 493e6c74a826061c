/* provider_local.c - the `local` provider: runs tasks in the namespace
 * sandbox on this machine (sandbox.h) and says what the run means for the
 * agent: the outcome kind, the exit code, and the error and hint sentences. */
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "core/config.h"
#include "provider/provider_local.h"
#include "sandbox/sandbox.h"
#include "core/util.h"

#define RUNTIME "python-data-analysis-v1"
#define REPORT_TEXT_MAX 1000 /* bytes kept of an error or hint from the driver */

struct local {
    const struct ci_config *cfg;
    struct ci_sandbox *sb;
    struct ci_provider_notes notes; /* set once, before any other thread sees it */
};

struct ci_run {
    struct ci_sandbox_run *sb_run;
    uint32_t timeout_ms;
    uint32_t memory_mb;
};

/* The driver's report: NUL-terminated key/value strings. Written by code
 * the user controls, so every value is capped and sanitized. */
struct report {
    char *kind;
    char *error;
    char *hint;
    uint64_t peak_kb;
};

static void report_release(struct report *r)
{
    free(r->kind);
    free(r->error);
    free(r->hint);
    memset(r, 0, sizeof(*r));
}

static char *report_text(const char *v, size_t len)
{
    if (len > REPORT_TEXT_MAX)
        len = REPORT_TEXT_MAX;
    return ci_utf8_sanitize((const uint8_t *)v, len, NULL);
}

static void parse_report(const char *data, size_t len, struct report *r)
{
    const char *key, *val;
    size_t pos = 0, vlen;
    while (ci_report_next(data, len, &pos, &key, &val, &vlen)) {
        char **slot = strcmp(key, "kind") == 0    ? &r->kind
                      : strcmp(key, "error") == 0 ? &r->error
                      : strcmp(key, "hint") == 0  ? &r->hint
                                                  : NULL;
        if (slot) {
            free(*slot);
            *slot = report_text(val, vlen);
        } else if (strcmp(key, "peak_kb") == 0) {
            char *end = NULL;
            unsigned long long v = strtoull(val, &end, 10);
            if (end && *end == '\0' && vlen > 0)
                r->peak_kb = v;
        }
        /* The session_* keys are the sandbox's (outcome.session). */
    }
}

/* "5 s", "2.5 s" */
static void fmt_seconds(uint32_t ms, char *out, size_t size)
{
    if (ms % 1000 == 0)
        snprintf(out, size, "%u s", ms / 1000);
    else
        snprintf(out, size, "%.3g s", ms / 1000.0);
}

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

static bool memory_signal(int sig)
{
    return sig == SIGKILL || sig == SIGSEGV || sig == SIGBUS || sig == SIGABRT;
}

/* Fills kind, exit code, error and hint of o from what the sandbox saw. */
static ci_status interpret(const struct local *l, const struct ci_run *run,
                           struct ci_sandbox_result *res, struct ci_outcome *o)
{
    const struct ci_config *cfg = l->cfg;
    struct report rep = {0};
    parse_report(res->report, res->report_len, &rep);
    char limit[32], max[32];
    fmt_seconds(run->timeout_ms, limit, sizeof(limit));
    fmt_seconds(cfg->limits.max_timeout_ms, max, sizeof(max));
    /* Peak memory: the cgroup's when it has one (every process, and what
     * the code wrote to its tmpfs); else python's own high-water mark when
     * it reported one (the rusage also counts what the worker had mapped
     * before execve). */
    if (!res->cgroup_peak && rep.peak_kb && res->end == CI_SANDBOX_EXITED)
        o->memory_mb = (uint32_t)((rep.peak_kb + 1023) / 1024);

    /* The sandbox's own sentence, when it broke, becomes part of ours. */
    CI_AUTOFREE char *why = CI_STEAL(&o->error);
    switch (res->end) {
    case CI_SANDBOX_TIMED_OUT:
        o->kind = CI_OUTCOME_TIMED_OUT;
        o->has_exit_code = true;
        o->exit_code = 128 + SIGKILL;
        o->error = fmt("the code did not finish within the time limit of %" PRIu32 " ms",
                       run->timeout_ms);
        o->hint = run->timeout_ms < cfg->limits.max_timeout_ms
                      ? fmt("make the code faster or work on less data, or raise "
                            "limits.timeout_ms (at most %s)", max)
                      : fmt("make the code faster or work on less data (%s is the longest "
                            "time allowed)", max);
        break;
    case CI_SANDBOX_CANCELLED:
        o->kind = CI_OUTCOME_CANCELLED;
        o->has_exit_code = true;
        o->exit_code = 128 + SIGKILL;
        o->error = fmt("the task was cancelled");
        break;
    case CI_SANDBOX_BROKEN:
        o->kind = CI_OUTCOME_ERROR;
        o->error = fmt("the sandbox failed: %s", why ? why : "unknown error");
        break;
    case CI_SANDBOX_EXITED: {
        if (res->exec_failed) {
            o->kind = CI_OUTCOME_ERROR;
            o->error = fmt("the Python runtime could not be started (%s)",
                           why ? why : "exec failed");
            break;
        }
        int st = res->status;
        int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
        o->has_exit_code = true;
        o->exit_code = sig ? 128 + sig : WEXITSTATUS(st);
        /* With a cgroup its OOM killer says it (whichever process it took);
         * without one, a deadly signal near the limit is the best guess.
         * The report is the code's to write (its fd is in the code's
         * process): it may name a MemoryError only for a run that failed,
         * never turn a clean exit into a failure. */
        bool near_limit = (uint64_t)o->memory_mb * 2 >= run->memory_mb;
        bool reported = rep.kind && strcmp(rep.kind, "memory") == 0 && o->exit_code != 0;
        bool memory = reported || res->oom_killed ||
                      (!res->cgroup && memory_signal(sig) && near_limit);
        if (memory) {
            o->kind = CI_OUTCOME_MEMORY;
            o->error = fmt("the code exceeded the memory limit of %u MiB", run->memory_mb);
            o->hint = run->memory_mb < cfg->limits.max_memory_mb
                          ? fmt("use less memory (read only the columns and rows you need, "
                                "use smaller dtypes, process the data in chunks), or raise "
                                "limits.memory_mb (at most %u)", cfg->limits.max_memory_mb)
                          : fmt("use less memory: read only the columns and rows you need, "
                                "use smaller dtypes, process the data in chunks");
            break;
        }
        if (sig == SIGXCPU) {
            o->kind = CI_OUTCOME_TIMED_OUT;
            o->error = fmt("the code used more CPU time than the time limit of %s allows", limit);
            o->hint = fmt("use fewer threads or processes, or make the code faster");
            break;
        }
        o->kind = CI_OUTCOME_EXITED;
        if (o->exit_code == 0)
            break;
        if (rep.error)
            o->error = CI_STEAL(&rep.error);
        else if (sig)
            o->error = fmt("the code was killed by signal %d (%s)", sig, strsignal(sig));
        else
            o->error = fmt("the code exited with code %d", o->exit_code);
        o->hint = CI_STEAL(&rep.hint);
        break;
    }
    }
    report_release(&rep);
    /* A run killed for time or memory, cancelled or broken has no outputs
     * (contract §17): a file the code wrote before is not the driver's. */
    if (o->kind != CI_OUTCOME_EXITED) {
        for (size_t i = 0; i < o->n_outputs; i++)
            ci_output_release(&o->outputs[i]);
        free(o->outputs);
        o->outputs = NULL;
        o->n_outputs = 0;
    }
    if (!o->error && (o->kind != CI_OUTCOME_EXITED || o->exit_code != 0))
        return CI_ERR_NOMEM;

    /* Killed, yet its processes did not exit: the sandbox's sentence says
     * so, after ours (a broken run's has it already). */
    o->unreaped = res->unreaped;
    if (res->unreaped && why && o->error &&
        (res->end == CI_SANDBOX_TIMED_OUT || res->end == CI_SANDBOX_CANCELLED)) {
        char *e = fmt("%s; %s", o->error, why);
        if (!e)
            return CI_ERR_NOMEM;
        free(o->error);
        o->error = e;
    }
    if (res->artifact_note) {
        char *e = o->error ? fmt("%s; %s", o->error, res->artifact_note)
                           : strdup(res->artifact_note);
        if (!e)
            return CI_ERR_NOMEM;
        free(o->error);
        o->error = e;
    }
    return CI_OK;
}

static ci_status local_start(void *ctx, const struct ci_job *job, struct ci_run **ret_run,
                             struct ci_error *err)
{
    struct local *l = ctx;
    if (job->runtime && job->runtime[0] && strcmp(job->runtime, RUNTIME) != 0)
        return ci_error_set(err, CI_ERR_UNSUPPORTED,
                            "runtime '%s' is not available on this worker; it runs " RUNTIME,
                            job->runtime);
    if (!job->timeout_ms || !job->memory_mb) /* request.h defaults them */
        return ci_error_set(err, CI_ERR_INVALID, "the job has no time or memory limit");
    CI_AUTOFREE struct ci_run *run = calloc(1, sizeof(*run));
    if (!run)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    run->timeout_ms = job->timeout_ms;
    run->memory_mb = job->memory_mb;
    ci_status s = ci_sandbox_start(l->sb, job, &run->sb_run, err);
    if (s)
        return s;
    *ret_run = CI_STEAL(&run);
    return CI_OK;
}

/* stdout and stderr travel as proto3 strings, which the C encoders end at
 * the first NUL byte: whatever the code printed after one was lost without
 * a word. A NUL becomes an invalid byte, shown as U+FFFD like any other. */
static void mask_nul(char *p, size_t len)
{
    for (size_t i = 0; p && i < len; i++)
        if (p[i] == '\0')
            p[i] = (char)0xff;
}

static ci_status local_wait(void *ctx, struct ci_run *run, struct ci_outcome *ret)
{
    struct local *l = ctx;
    struct ci_sandbox_result res;
    ci_status s = ci_sandbox_wait(run->sb_run, &res);
    if (s)
        return s;
    struct ci_outcome o = res.outcome;
    memset(&res.outcome, 0, sizeof(res.outcome));
    mask_nul(o.out, o.out_len);
    mask_nul(o.err, o.err_len);
    s = interpret(l, run, &res, &o);
    ci_sandbox_result_release(&res);
    if (s) {
        ci_outcome_release(&o);
        return s;
    }
    *ret = o;
    return CI_OK;
}

static void local_cancel(void *ctx, struct ci_run *run)
{
    (void)ctx;
    if (run)
        ci_sandbox_cancel(run->sb_run);
}

static void local_release(void *ctx, struct ci_run *run)
{
    (void)ctx;
    if (!run)
        return;
    ci_sandbox_run_release(run->sb_run);
    free(run);
}

static void local_destroy(void *ctx)
{
    struct local *l = ctx;
    if (!l)
        return;
    ci_sandbox_free(l->sb);
    free(l);
}

static void local_warm_stats(void *ctx, struct ci_warm_stats *ret)
{
    const struct local *l = ctx;
    struct ci_zygote_stats st;
    uint64_t fallbacks;
    if (!ci_sandbox_warm_stats(l->sb, &st, &fallbacks))
        return;
    ret->ready = st.ready;
    ret->became_ready = st.became_ready;
    ret->died = st.failed + st.crashed;
    ret->fallbacks = fallbacks;
    snprintf(ret->last_failure, sizeof(ret->last_failure), "%s", st.last_failure);
}

static const char *local_isolation(void *ctx)
{
    const struct local *l = ctx;
    return ci_sandbox_isolation(l->sb);
}

static void local_notes(void *ctx, struct ci_provider_notes *ret)
{
    const struct local *l = ctx;
    *ret = l->notes;
}

/* What the probe and the sandbox leave the operator to hear of, each fact
 * on its own. */
static void notes_fill(const struct ci_config *cfg, const struct ci_sandbox_probe *probe,
                       const struct ci_sandbox *sb, struct ci_provider_notes *ret)
{
    memset(ret, 0, sizeof(*ret));
    if (probe->warning[0])
        snprintf(ret->no_sandbox, sizeof(ret->no_sandbox), "%s", probe->warning);
    if (cfg->local.mode == CI_MODE_WARM && probe->sandboxed &&
        strcmp(ci_sandbox_mode(sb), "warm") != 0)
        snprintf(ret->warm_unavailable, sizeof(ret->warm_unavailable),
                 "warm mode is unavailable, tasks run cold: %.400s",
                 probe->warm_failure[0]           ? probe->warm_failure
                 : ci_sandbox_warm_failure(sb)[0] ? ci_sandbox_warm_failure(sb)
                                                  : "the zygotes did not start");
    if (probe->cgroup_version && !probe->cgroup_favor_dynmods)
        snprintf(ret->slow_cgroup_moves, sizeof(ret->slow_cgroup_moves),
                 "no cgroup mount has favordynmods: a task that starts after a pause of some "
                 "30 ms or more may wait for an RCU grace period (6-8 ms measured on a 2-core "
                 "VM) when its processes are moved into its cgroup; on the host, remount "
                 "cgroup2 with favordynmods to avoid it (README, Operating)");
    if (probe->task_uids_off)
        snprintf(ret->task_uids_off, sizeof(ret->task_uids_off),
                 "every task runs as local.sandbox_uid: the task uids (local.task_uid_first, "
                 "task_uid_count) could not be used: %.380s",
                 probe->task_uids_failure);
}

static const struct ci_provider_ops local_ops = {
    .name = "local",
    .start = local_start,
    .wait = local_wait,
    .cancel = local_cancel,
    .release = local_release,
    .destroy = local_destroy,
    .warm_stats = local_warm_stats,
    .sessions = true,
    .isolation = local_isolation,
    .notes = local_notes,
};

ci_status ci_provider_local_new(const struct ci_config *cfg, struct ci_provider **ret,
                                struct ci_error *err)
{
    /* The warm try with the pool's first zygote rather than one of the
     * probe's own: a zygote start less before the first task. */
    struct ci_sandbox_probe probe;
    ci_status s = ci_sandbox_probe_deferred(cfg, &probe);
    if (s == CI_ERR_NOMEM)
        return ci_error_set(err, s, "out of memory while probing the sandbox");
    /* Any other failure: ci_sandbox_new() refuses with the probe's reason. */
    return ci_provider_local_new_probed(cfg, &probe, ret, err);
}

ci_status ci_provider_local_new_probed(const struct ci_config *cfg,
                                       const struct ci_sandbox_probe *probe,
                                       struct ci_provider **ret, struct ci_error *err)
{
    CI_AUTOFREE struct local *l = calloc(1, sizeof(*l));
    CI_AUTOFREE struct ci_provider *p = calloc(1, sizeof(*p));
    if (!l || !p)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    l->cfg = cfg;
    ci_status s = ci_sandbox_new(cfg, probe, &l->sb, err);
    if (s)
        return s;
    notes_fill(cfg, probe, l->sb, &l->notes);
    if (err) {
        /* The first of the notes, for a caller that logs one line. */
        const struct ci_provider_notes *n = &l->notes;
        snprintf(err->msg, sizeof(err->msg), "%s",
                 n->no_sandbox[0]         ? n->no_sandbox
                 : n->warm_unavailable[0] ? n->warm_unavailable
                                          : n->task_uids_off);
    }
    p->ops = &local_ops;
    p->ctx = CI_STEAL(&l);
    *ret = CI_STEAL(&p);
    return CI_OK;
}
