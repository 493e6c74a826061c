/* sandbox.c - a prepared sandbox (struct ci_sandbox, sandbox_int.h):
 * ci_sandbox_new() builds its plan once, in the mode the probe chose, and
 * starts its zygotes in warm mode; ci_sandbox_free() ends it. See sandbox.h
 * for the picture.
 *
 * The sandbox's files, in the order of a run's life:
 *   sys.h        system calls glibc does not wrap (or wraps with locks a
 *                cloned child must not take);
 *   plan.c       the plan: a list of typed setup operations (bubblewrap
 *                style) and every string the child needs;
 *   seccomp.c    the task's seccomp filter, built once as a BPF program;
 *   init.c       the child side: init (build the root, pivot, drop
 *                privileges, reap) and the task (rlimits, exec python3) -
 *                no malloc, no locks;
 *   child.c      init's helpers that ci-zygote compiles too;
 *   run.c        the parent side up to GO (clone, maps, inputs), a run's
 *                messages and its end;
 *   io.c         from GO to the end: the I/O loop, kill, reap, the result;
 *   artifacts.c  the artifact walk;
 *   probe.c      what this machine allows, and the mode it gets;
 *   warm.c       warm mode: the zygotes' setup and launch, a run's start
 *                in one (the pool is zygote.c, a zygote src/zygote/main.c);
 *   reaper.c     ended warm runs freed beside the next tasks, and runs
 *                whose processes outlived SIGKILL once they have exited;
 *   sched.c      the scheduling policy of our own processes: a keeper at
 *                SCHED_IDLE, put back when we wait for it;
 *   cgroup.c     the task's cgroup;
 *   uids.c       the task uids: a uid of its own for each task's code;
 *   report.c     the driver's report, read;
 *   session.c    a session step's state in and out of the workspace;
 *   outputs.c    the rich outputs the driver left, checked (docs/contract.md §17).
 * sandbox_int.h holds what they share, sandbox_proto.h what the worker and
 * the processes of a sandbox say to each other.
 *
 * Child and parent talk over a SOCK_SEQPACKET socketpair: the parent sends
 * one byte after writing the uid map and one byte as GO; the child sends
 * READY (with the /workspace fd), FAILED (step + errno) or DONE (the task's
 * wait status and rusage). A failing setup step is therefore reported as
 * "mount /proc: Operation not permitted", never as a silent exit.
 *
 * Building the sandbox (init_main up to GO) is kept apart from running the
 * task (task_exec, reap_all). Warm mode (warm.c, zygote.h) builds a
 * zygote's sandbox with the same init_main, which then executes ci-zygote
 * instead of forking a task; each task's init in the zygote speaks the same
 * messages (sandbox_proto.h), so a warm run differs from a cold one only
 * in how it starts (start_warm) and in that its init is not our child. */
#include "sandbox/sandbox.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "sandbox/sandbox_int.h"
#include "sandbox/sys.h"

const struct sandbox_layer sandbox_layers[CI_LAYER_COUNT] = {
    [CI_LAYER_USER] = {"user", "user", CLONE_NEWUSER, "CLONE_NEWUSER", true},
    [CI_LAYER_PID] = {"pid", "pid", CLONE_NEWPID, "CLONE_NEWPID", true},
    [CI_LAYER_NET] = {"net", "network", CLONE_NEWNET, "CLONE_NEWNET", true},
    [CI_LAYER_MNT] = {"mnt", "mount", CLONE_NEWNS, "CLONE_NEWNS", true},
    [CI_LAYER_IPC] = {"ipc", "IPC", CLONE_NEWIPC, "CLONE_NEWIPC", true},
    [CI_LAYER_UTS] = {"uts", "UTS", CLONE_NEWUTS, "CLONE_NEWUTS", true},
    [CI_LAYER_CGROUP] = {"cgroupns", "cgroup", CLONE_NEWCGROUP, "CLONE_NEWCGROUP", false},
};

void ci_sandbox_free(struct ci_sandbox *sb)
{
    if (!sb)
        return;
    reaper_stop(sb); /* first: its runs' inits are the zygotes' children */
    ci_zygote_pool_free(sb->warm); /* its zygotes use the plan */
    uids_release(&sb->uids);
    free(sb->seccomp.filter);
    ci_cgroup_root_free(sb->cgroups);
    for (size_t i = 0; i < sb->n_strs; i++)
        free(sb->strs[i]);
    free(sb->strs);
    free(sb);
}

const char *ci_sandbox_isolation(const struct ci_sandbox *sb) { return sb->isolation; }

const char *ci_sandbox_warm_failure(const struct ci_sandbox *sb) { return sb->warm_failure; }

/* A task's share of an inotify limit the kernel counts per user for the
 * owner of every sandbox's namespace (us, and our uid's other processes):
 * half of it split between the task slots, so that no task can take what
 * another task, or the host, needs. */
static uint32_t inotify_share(const char *path, uint32_t fallback, uint32_t slots)
{
    char buf[32];
    unsigned long v = 0;
    FILE *f = fopen(path, "re");
    if (f && fgets(buf, sizeof(buf), f))
        v = strtoul(buf, NULL, 10);
    if (f)
        fclose(f);
    if (v == 0 || v > 1u << 30)
        v = fallback; /* unreadable, or INT_MAX (a user namespace's own): the kernel's default */
    unsigned long share = v / 2 / (slots ? slots : 1);
    return share ? (uint32_t)share : 1;
}

static void isolation_string(unsigned long flags, char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < CI_LAYER_COUNT; i++) {
        if (!(flags & sandbox_layers[i].flag))
            continue;
        int n = snprintf(out + used, size - used, "%s%s", used ? "," : "", sandbox_layers[i].name);
        if (n < 0 || (size_t)n >= size - used)
            break;
        used += (size_t)n;
    }
    if (!used)
        snprintf(out, size, "none");
}

/* Builds a sandbox plan without consulting a probe: the probe uses it too. */
ci_status sandbox_build(const struct ci_config *cfg, const struct build_opts *o,
                        struct ci_sandbox **ret, struct ci_error *err)
{
    const char *python = cfg->local.python;
    if (!python || python[0] != '/' || access(python, X_OK) != 0)
        return ci_error_errno(err, CI_ERR_INVALID, errno,
                              "local.python '%s' is not an executable absolute path",
                              python ? python : "");
    if (o->clone_flags && strncmp(python, "/usr/", 5) != 0)
        return ci_error_set(err, CI_ERR_INVALID,
                            "local.python '%s' must live under /usr: only /usr is visible "
                            "in the sandbox", python);
    bool root = geteuid() == 0;
    if (root && (cfg->local.sandbox_uid == 0 || cfg->local.sandbox_gid == 0))
        return ci_error_set(err, CI_ERR_INVALID,
                            "local.sandbox_uid and local.sandbox_gid must not be 0: the "
                            "sandbox must never be root outside");

    CI_AUTOFREE struct ci_sandbox *sb = calloc(1, sizeof(*sb));
    if (!sb)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    sb->cfg = cfg;
    sb->ns = o->clone_flags != 0;
    sb->with_proc = o->with_proc;
    sb->clone_flags = o->clone_flags;
    sb->outside_root = root;
    sb->pin_oom = sys_has_cap(CAP_SYS_RESOURCE);
    /* Unprivileged, the only id we may map is our own. */
    sb->outside_uid = root ? cfg->local.sandbox_uid : geteuid();
    sb->outside_gid = root ? cfg->local.sandbox_gid : getegid();
    isolation_string(o->clone_flags, sb->isolation, sizeof(sb->isolation));
    size_t used = strlen(sb->isolation);
    if (sb->ns && o->with_seccomp && used < sizeof(sb->isolation))
        used += (size_t)snprintf(sb->isolation + used, sizeof(sb->isolation) - used, ",seccomp");
    if (sb->ns && o->cgroups && used < sizeof(sb->isolation))
        snprintf(sb->isolation + used, sizeof(sb->isolation) - used, "%s",
                 ci_cgroup_root_version(o->cgroups) == CI_CGROUP_V2 ? ",cgroup" : ",cgroup1");

    ci_status s = CI_OK;
    if (sb->ns) {
        s = uids_init(&sb->uids, cfg, root && !o->no_task_uids, cfg->local.mode == CI_MODE_WARM,
                      err);
        if (s) {
            struct ci_sandbox *tmp = CI_STEAL(&sb);
            ci_sandbox_free(tmp);
            return s;
        }
        if (o->with_proc) {
            uint32_t slots = ci_config_slots(cfg);
            sb->inotify_instances = plan_str(
                sb, "%u", inotify_share("/proc/sys/user/max_inotify_instances", 128, slots));
            sb->inotify_watches = plan_str(
                sb, "%u", inotify_share("/proc/sys/user/max_inotify_watches", 8192, slots));
            if (!sb->inotify_instances || !sb->inotify_watches)
                s = CI_ERR_NOMEM;
        }
        sb->uid_map = plan_str(sb, "%d %u 1\n", SANDBOX_ID, (unsigned)sb->outside_uid);
        sb->gid_map = plan_str(sb, "%d %u 1\n", SANDBOX_ID, (unsigned)sb->outside_gid);
        if (!sb->uid_map || !sb->gid_map)
            s = CI_ERR_NOMEM;
        if (!s)
            s = plan_root(sb);
        if (!s)
            s = plan_env(sb, sb->envp_ns, "/workspace", "/tmp");
    }
    if (!s && o->with_seccomp)
        s = plan_seccomp(sb);
    if (!s) {
        sb->argv_store[0] = plan_str(sb, "python3");
        sb->argv_store[1] = plan_str(sb, "-I");
        sb->argv_store[2] = plan_str(sb, "-B");
        sb->argv_store[3] = plan_str(sb, "-c");
        sb->argv_store[4] = plan_str(sb, "%s", ci_driver_py);
        sb->argv_store[5] = NULL;
        for (int i = 0; i < 5; i++)
            if (!sb->argv_store[i])
                s = CI_ERR_NOMEM;
    }
    if (!s && sb->ns)
        sb->cgroups = o->cgroups; /* from here on freed with the sandbox */
    if (s) {
        struct ci_sandbox *tmp = CI_STEAL(&sb);
        ci_sandbox_free(tmp);
        return s == CI_ERR_NOMEM
                   ? ci_error_set(err, s, "out of memory while preparing the sandbox")
                   : ci_error_set(err, s, "the seccomp filter could not be built");
    }
    *ret = CI_STEAL(&sb);
    return CI_OK;
}

ci_status ci_sandbox_new(const struct ci_config *cfg, const struct ci_sandbox_probe *probe,
                         struct ci_sandbox **ret, struct ci_error *err)
{
    if (!probe->sandboxed && cfg->local.isolation == CI_ISOLATION_REQUIRED)
        return ci_error_set(err, CI_ERR_UNSUPPORTED,
                            "the sandbox is required (local.isolation: required) but %s",
                            probe->failure[0] ? probe->failure : "it is unavailable");
    if (!probe->python_ok)
        return ci_error_set(err, CI_ERR_UNSUPPORTED, "python cannot run: %s",
                            probe->python_failure[0] ? probe->python_failure : probe->failure);
    if (cfg->local.require_cgroup && !probe->cgroup_version)
        return ci_error_set(err, CI_ERR_UNSUPPORTED, "%s", probe->failure);
    struct build_opts opts = {.with_proc = probe->proc_ok, .with_seccomp = probe->seccomp_ok,
                              .no_task_uids = probe->task_uids_off};
    if (probe->sandboxed)
        for (int i = 0; i < CI_LAYER_COUNT; i++)
            if (probe->layer_ok[i])
                opts.clone_flags |= sandbox_layers[i].flag;
    ci_status s;
    if (probe->sandboxed && probe->cgroup_version) {
        /* A root of our own (the probe's is gone). Should that fail now,
         * the isolation string of every result says the cgroup is missing. */
        struct ci_cgroup_places places;
        struct ci_error cg_err = {{0}};
        s = ci_cgroup_find(&places, &cg_err);
        if (!s)
            s = ci_cgroup_root_new(&places, &opts.cgroups, &cg_err);
        if (s == CI_ERR_NOMEM || (s && cfg->local.require_cgroup))
            return ci_error_set(err, s, "per-task cgroups: %s", cg_err.msg);
    }
    struct ci_sandbox *sb = NULL;
    s = sandbox_build(cfg, &opts, &sb, err);
    if (s) {
        ci_cgroup_root_free(opts.cgroups);
        return s;
    }
    if (sb->ns)
        plan_font_cache(sb);
    /* Warm when the probe could run a zygote, or left that try to us (then
     * the first zygote of the pool runs `pass` in a child, as the probe's
     * would have); should that fail now, tasks run cold (ci_sandbox_mode()
     * says which, ci_sandbox_warm_failure() why). */
    if (sb->ns && cfg->local.mode == CI_MODE_WARM && (probe->warm_ok || probe->warm_deferred)) {
        struct ci_error werr = {{0}};
        s = warm_start(sb, cfg->local.warm_pool_size ? cfg->local.warm_pool_size : 1, &werr);
        if (!s && probe->warm_deferred && (s = warm_try(sb, &werr)) != CI_OK) {
            reaper_stop(sb); /* as ci_sandbox_free: first, then the zygotes */
            ci_zygote_pool_free(sb->warm);
            sb->warm = NULL;
        }
        if (s == CI_ERR_NOMEM) {
            ci_sandbox_free(sb);
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        }
        if (s)
            snprintf(sb->warm_failure, sizeof(sb->warm_failure), "%.479s", werr.msg);
    }
    /* Cold too: the thread frees the runs whose processes did not exit
     * after SIGKILL once they have, so that no slot waits for them
     * (reaper.c). Without it (no thread to be had) such a run's free waits
     * a bounded time and leaves what it could not reap. */
    if (sb->ns && !sb->reaper.running && reaper_start(sb, ci_config_slots(cfg)) == CI_ERR_NOMEM) {
        ci_sandbox_free(sb);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    }
    *ret = sb;
    return CI_OK;
}
