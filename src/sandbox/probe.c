/* probe.c - what this machine allows, found by doing it once at start
 * (ci_sandbox_probe): a clone per namespace layer, the seccomp filter, the
 * whole sandbox running `pass` (with a fresh /proc, else without), a
 * per-task cgroup, and in warm mode a zygote; then the mode the
 * configuration gets, and the lines `ci-worker --probe` prints. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/util.h"
#include "sandbox/sandbox_int.h"
#include "sandbox/sys.h"

/* Can this machine clone with flags? The child exits at once. */
static int try_clone(unsigned long flags)
{
    pid_t pid = sys_clone(flags | SIGCHLD);
    if (pid == 0)
        _exit(0);
    if (pid < 0)
        return errno;
    int st;
    while (waitpid(pid, &st, __WALL) < 0 && errno == EINTR)
        ;
    return 0;
}

/* Runs `pass` through the whole machinery; returns CI_OK when it exited 0. */
static ci_status probe_run(struct ci_sandbox *sb, struct ci_error *err)
{
    static const char code[] = "pass\n";
    struct ci_job job = {.code = code, .code_len = sizeof(code) - 1,
                                 .timeout_ms = 20000, .memory_mb = 1024};
    struct ci_sandbox_run *run;
    ci_status s = ci_sandbox_start(sb, &job, &run, err);
    if (s)
        return s;
    struct ci_sandbox_result r;
    s = ci_sandbox_wait(run, &r);
    ci_sandbox_run_free(run);
    if (s)
        return ci_error_set(err, s, "out of memory");
    if (r.end != CI_SANDBOX_EXITED || !r.has_status || r.status != 0) {
        size_t len = r.outcome.err_len > 200 ? 200 : r.outcome.err_len;
        s = ci_error_set(err, CI_ERR_UNSUPPORTED,
                         "%s could not run the driver: %s (wait status 0x%x, stderr: %.*s)",
                         sb->cfg->local.python,
                         r.outcome.error ? r.outcome.error : "it failed",
                         (unsigned)r.status, (int)len, r.outcome.err ? r.outcome.err : "");
    }
    ci_sandbox_result_release(&r);
    return s;
}

/* Does the seccomp filter load, and does it refuse unshare()? */
static int try_seccomp(void)
{
    struct ci_sandbox scratch;
    memset(&scratch, 0, sizeof(scratch));
    ci_status s = plan_seccomp(&scratch);
    if (s)
        return s == CI_ERR_NOMEM ? ENOMEM : EINVAL;
    pid_t pid = sys_clone(SIGCHLD);
    if (pid == 0) {
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || load_seccomp(&scratch.seccomp) != 0)
            _exit(errno > 0 && errno < 126 ? errno : 126);
        _exit(unshare(CLONE_NEWUSER) != 0 && errno == EPERM ? 0 : 127);
    }
    int e = pid < 0 ? errno : 0;
    int st = 0;
    while (pid > 0 && waitpid(pid, &st, __WALL) < 0 && errno == EINTR)
        ;
    if (pid > 0)
        e = WIFEXITED(st) ? WEXITSTATUS(st) : EINTR;
    if (e == 127)
        e = ENOTSUP; /* loaded but not enforced */
    free(scratch.seccomp.filter);
    return e;
}

/* Why a namespace could not be created, for the people reading the log. */
static const char *clone_errno_hint(int e)
{
    switch (e) {
    case EPERM:
        return " (unprivileged user namespaces are disabled: kernel.unprivileged_userns_clone, "
               "an AppArmor restriction, or a container's seccomp profile)";
    case ENOSPC:
        return " (user.max_user_namespaces is 0 or used up)";
    case EINVAL:
        return " (this kernel was built without it)";
    case EUSERS:
        return " (user namespaces are nested too deeply)";
    default:
        return "";
    }
}

/* Runs `pass` in a per-task cgroup with the sandbox opts describes: the
 * limits are only claimed when that worked. Fills p's cgroup fields and, on
 * success, its isolation string. Fails only for CI_ERR_NOMEM. */
static ci_status probe_cgroups(const struct ci_config *cfg, struct build_opts opts,
                               struct ci_sandbox_probe *p)
{
    struct ci_error err = {{0}};
    struct ci_cgroup_places places;
    struct ci_sandbox *sb = NULL;
    ci_status s = ci_cgroup_find(&places, &err);
    if (!s)
        s = ci_cgroup_root_new(&places, &opts.cgroups, &err);
    if (!s && (s = sandbox_build(cfg, &opts, &sb, &err)))
        ci_cgroup_root_free(opts.cgroups);
    if (!s)
        s = probe_run(sb, &err);
    if (!s) {
        p->cgroup_version = places.version;
        p->cgroup_favor_dynmods = ci_cgroup_favor_dynmods();
        snprintf(p->cgroup_dir, sizeof(p->cgroup_dir), "%.255s", places.dir[CI_CG_MEMORY]);
        snprintf(p->isolation, sizeof(p->isolation), "%s", sb->isolation);
    } else {
        snprintf(p->cgroup_failure, sizeof(p->cgroup_failure), "%s", err.msg);
    }
    ci_sandbox_free(sb); /* and its cgroup root */
    return s == CI_ERR_NOMEM ? s : CI_OK;
}

ci_status warm_try(struct ci_sandbox *sb, struct ci_error *err)
{
    static const char code[] = "pass\n";
    struct ci_job job = {.code = code, .code_len = sizeof(code) - 1, .timeout_ms = 20000,
                         .memory_mb = 1024};
    struct ci_sandbox_run *run = NULL;
    bool fallback = false;
    ci_status s = run_start(sb, &job, true, &fallback, &run, err);
    struct ci_sandbox_result r;
    if (!s && (s = ci_sandbox_wait(run, &r)) == CI_OK) {
        if (r.end != CI_SANDBOX_EXITED || !r.has_status || r.status != 0) {
            size_t len = r.outcome.err_len > 200 ? 200 : r.outcome.err_len;
            s = ci_error_set(err, CI_ERR_UNSUPPORTED,
                             "a task in the zygote failed: %s (wait status 0x%x, stderr: %.*s)",
                             r.outcome.error ? r.outcome.error : "it failed", (unsigned)r.status,
                             (int)len, r.outcome.err ? r.outcome.err : "");
        }
        ci_sandbox_result_release(&r);
    }
    ci_sandbox_run_free(run);
    return s;
}

/* The probe's try: start one zygote and run `pass` in a child of it (not
 * falling back to cold). Fills p's warm fields; fails only for NOMEM. */
static ci_status probe_warm(const struct ci_config *cfg, struct build_opts opts,
                            struct ci_sandbox_probe *p)
{
    struct ci_error err = {{0}};
    struct ci_sandbox *sb = NULL;
    int64_t t0 = ci_mono_ms();
    opts.cgroups = NULL; /* the cgroups were probed apart */
    ci_status s = sandbox_build(cfg, &opts, &sb, &err);
    if (!s)
        s = warm_start(sb, 1, &err);
    if (!s) {
        p->warm_start_ms = ci_mono_ms() - t0;
        s = warm_try(sb, &err);
    }
    p->warm_ok = s == CI_OK;
    if (s)
        snprintf(p->warm_failure, sizeof(p->warm_failure), "%.479s", err.msg);
    ci_sandbox_free(sb);
    return s == CI_ERR_NOMEM ? s : CI_OK;
}

static ci_status probe(const struct ci_config *cfg, bool defer_warm,
                       struct ci_sandbox_probe *ret)
{
    /* ret is the explanation of a failure too: filled whatever happens. */
    struct ci_sandbox_probe p;
    memset(&p, 0, sizeof(p));
    memset(ret, 0, sizeof(*ret));
    p.requested = cfg->local.isolation;
    snprintf(p.isolation, sizeof(p.isolation), "none");
    char ebuf[128];

    /* One clone per layer (each with a user namespace, as the sandbox does). */
    p.layer_errno[CI_LAYER_USER] = try_clone(CLONE_NEWUSER);
    p.layer_ok[CI_LAYER_USER] = p.layer_errno[CI_LAYER_USER] == 0;
    struct build_opts opts = {0};
    bool all_required = true;
    for (int i = 0; i < CI_LAYER_COUNT; i++) {
        if (i != CI_LAYER_USER) {
            p.layer_errno[i] = p.layer_ok[CI_LAYER_USER]
                                   ? try_clone(CLONE_NEWUSER | sandbox_layers[i].flag)
                                   : p.layer_errno[CI_LAYER_USER];
            p.layer_ok[i] = p.layer_errno[i] == 0;
        }
        if (p.layer_ok[i]) {
            opts.clone_flags |= sandbox_layers[i].flag;
        } else if (sandbox_layers[i].required && all_required) {
            all_required = false;
            snprintf(p.failure, sizeof(p.failure),
                     "%s namespaces are not available: clone(%s%s): %s%s", sandbox_layers[i].noun,
                     i == CI_LAYER_USER ? "" : "CLONE_NEWUSER|", sandbox_layers[i].flag_name,
                     strerror_r(p.layer_errno[i], ebuf, sizeof(ebuf)),
                     clone_errno_hint(p.layer_errno[i]));
        }
    }
    p.seccomp_errno = try_seccomp();
    p.seccomp_ok = p.seccomp_errno == 0;
    opts.with_seccomp = p.seccomp_ok;

    /* The whole sandbox, with /proc, then without it if /proc is what failed. */
    struct ci_error err = {{0}};
    if (all_required) {
        opts.with_proc = true;
        for (int attempt = 0; attempt < 3; attempt++) {
            struct ci_sandbox *sb = NULL;
            ci_status s = sandbox_build(cfg, &opts, &sb, &err);
            if (s == CI_ERR_NOMEM) {
                snprintf(p.failure, sizeof(p.failure), "out of memory");
                *ret = p;
                return s;
            }
            if (!s)
                s = probe_run(sb, &err);
            if (!s)
                snprintf(p.isolation, sizeof(p.isolation), "%s", sb->isolation);
            ci_sandbox_free(sb);
            if (!s) {
                p.setup_ok = p.python_ok = true;
                p.proc_ok = opts.with_proc;
                break;
            }
            if (opts.with_proc && strstr(err.msg, "mount /proc")) {
                opts.with_proc = false; /* again, without a fresh /proc */
                snprintf(p.proc_failure, sizeof(p.proc_failure), "%.200s", err.msg);
                continue;
            }
            /* The task uids (a range this machine may not map, or too
             * small) must never cost the sandbox: again, with one uid. */
            if (!opts.no_task_uids && geteuid() == 0 && cfg->local.task_uid_count) {
                opts.no_task_uids = true;
                p.task_uids_off = true;
                snprintf(p.task_uids_failure, sizeof(p.task_uids_failure), "%.300s", err.msg);
                continue;
            }
            snprintf(p.failure, sizeof(p.failure), "%s", err.msg);
            break;
        }
    }

    p.sandboxed = p.setup_ok && p.requested != CI_ISOLATION_NONE;
    if (p.sandboxed && probe_cgroups(cfg, opts, &p) == CI_ERR_NOMEM) {
        snprintf(p.failure, sizeof(p.failure), "out of memory");
        *ret = p;
        return CI_ERR_NOMEM;
    }
    p.warm_requested = cfg->local.mode == CI_MODE_WARM;
    if (p.warm_requested && !p.sandboxed)
        snprintf(p.warm_failure, sizeof(p.warm_failure),
                 "warm mode needs the namespace sandbox, which is not in use");
    if (p.warm_requested && p.sandboxed && defer_warm)
        p.warm_deferred = true;
    else if (p.warm_requested && p.sandboxed && probe_warm(cfg, opts, &p) == CI_ERR_NOMEM) {
        snprintf(p.failure, sizeof(p.failure), "out of memory");
        *ret = p;
        return CI_ERR_NOMEM;
    }
    if (!p.sandboxed)
        snprintf(p.isolation, sizeof(p.isolation), "none");
    if (!p.sandboxed && p.requested != CI_ISOLATION_REQUIRED) {
        /* The fallback must at least run python. */
        struct ci_sandbox *sb = NULL;
        struct build_opts bare = {.with_seccomp = p.seccomp_ok};
        ci_status s = sandbox_build(cfg, &bare, &sb, &err);
        if (s == CI_ERR_NOMEM) {
            snprintf(p.failure, sizeof(p.failure), "out of memory");
            *ret = p;
            return s;
        }
        if (!s)
            s = probe_run(sb, &err);
        ci_sandbox_free(sb);
        p.python_ok = s == CI_OK;
        if (s)
            snprintf(p.python_failure, sizeof(p.python_failure), "%.250s", err.msg);
        if (p.requested == CI_ISOLATION_AUTO)
            snprintf(p.warning, sizeof(p.warning),
                     "tasks run WITHOUT a sandbox (isolation: auto): %.440s", p.failure);
    }
    p.cgroup_required = cfg->local.require_cgroup;
    if (p.cgroup_required && !p.cgroup_version)
        snprintf(p.failure, sizeof(p.failure),
                 "per-task cgroups are required (local.require_cgroup: true) but %.400s",
                 p.cgroup_failure[0] ? p.cgroup_failure
                 : p.sandboxed       ? "they were not tried"
                                     : "they need the namespace sandbox, which is not in use");
    *ret = p;
    if (!p.sandboxed && p.requested == CI_ISOLATION_REQUIRED)
        return CI_ERR_UNSUPPORTED;
    if (p.cgroup_required && !p.cgroup_version)
        return CI_ERR_UNSUPPORTED;
    return p.python_ok ? CI_OK : CI_ERR_UNSUPPORTED;
}

ci_status ci_sandbox_probe(const struct ci_config *cfg, struct ci_sandbox_probe *ret)
{
    return probe(cfg, false, ret);
}

ci_status ci_sandbox_probe_deferred(const struct ci_config *cfg, struct ci_sandbox_probe *ret)
{
    return probe(cfg, true, ret);
}

void ci_sandbox_probe_print(const struct ci_sandbox_probe *p, FILE *out)
{
    char ebuf[128];
    for (int i = 0; i < CI_LAYER_COUNT; i++) {
        if (p->layer_ok[i])
            fprintf(out, "%s: ok\n", sandbox_layers[i].name);
        else
            fprintf(out, "%s: FAILED (%s)%s\n", sandbox_layers[i].name,
                    strerror_r(p->layer_errno[i], ebuf, sizeof(ebuf)),
                    sandbox_layers[i].required ? "" : " - optional");
    }
    if (p->seccomp_ok)
        fprintf(out, "seccomp: ok\n");
    else
        fprintf(out, "seccomp: FAILED (%s) - tasks run without the filter\n",
                strerror_r(p->seccomp_errno, ebuf, sizeof(ebuf)));
    if (p->proc_ok)
        fprintf(out, "proc: ok\n");
    else if (p->proc_failure[0])
        fprintf(out, "proc: unavailable, the sandbox's /proc stays empty (%s)\n", p->proc_failure);
    else
        fprintf(out, "proc: not tried\n");
    if (p->task_uids_off)
        fprintf(out, "task uids: FAILED (%s) - every task runs as local.sandbox_uid\n",
                p->task_uids_failure);
    fprintf(out, "root (tmpfs, read-only binds, pivot_root): %s\n", p->setup_ok ? "ok" : "FAILED");
    if (p->python_ok)
        fprintf(out, "python: ok\n");
    else if (!p->setup_ok && !p->python_failure[0])
        fprintf(out, "python: not tried\n");
    else
        fprintf(out, "python: FAILED%s%s\n", p->python_failure[0] ? ": " : "", p->python_failure);
    if (p->cgroup_version)
        fprintf(out, "cgroup: v%d (memory, pids, cpu limits per task, in %s)%s\n",
                p->cgroup_version, p->cgroup_dir,
                p->cgroup_favor_dynmods ? ""
                                        : "; favordynmods off: a task's start after a pause "
                                          "may wait an RCU grace period for its cgroup moves");
    else if (p->cgroup_failure[0])
        fprintf(out, "cgroup: unavailable, memory is limited by RLIMIT_AS only (%s)\n",
                p->cgroup_failure);
    else
        fprintf(out, "cgroup: not tried (only with the namespace sandbox)\n");
    if (p->warm_ok)
        fprintf(out, "warm: ok (a zygote was ready and ran a task in %lld ms)\n",
                (long long)p->warm_start_ms);
    else if (p->warm_deferred)
        fprintf(out, "warm: left to the sandbox (its first zygote runs a task before any other)\n");
    else if (p->warm_requested)
        fprintf(out, "warm: FAILED (%s) - tasks run cold\n", p->warm_failure);
    else
        fprintf(out, "warm: not requested (local.mode: cold)\n");
    static const char *const modes[] = {[CI_ISOLATION_AUTO] = "auto",
                                        [CI_ISOLATION_REQUIRED] = "required",
                                        [CI_ISOLATION_NONE] = "none"};
    const char *req = (unsigned)p->requested < 3 ? modes[p->requested] : "?";
    if (p->cgroup_required && !p->cgroup_version)
        fprintf(out, "mode: REFUSED - %s\n", p->failure);
    else if (p->sandboxed)
        fprintf(out, "mode: sandbox (%s), isolation %s%s\n", p->isolation, req,
                p->requested == CI_ISOLATION_REQUIRED && !p->cgroup_required
                    ? " (the namespaces; set local.require_cgroup to require the cgroups too)"
                    : "");
    else if (p->requested == CI_ISOLATION_REQUIRED)
        fprintf(out, "mode: REFUSED - isolation is required: %s\n", p->failure);
    else if (p->requested == CI_ISOLATION_NONE)
        fprintf(out, "mode: NO SANDBOX (isolation: none)\n");
    else
        fprintf(out, "mode: NO SANDBOX - %s\n", p->warning);
    if (p->failure[0] && p->sandboxed && !(p->cgroup_required && !p->cgroup_version))
        fprintf(out, "note: %s\n", p->failure);
}
