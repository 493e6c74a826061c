/* sandbox.h - runs one Python task in a fresh Linux namespace sandbox.
 *
 * The mechanism only: namespaces, a new root filesystem, one unprivileged
 * id, a cgroup per task (cgroup.h), rlimits, the I/O loop and the artifact
 * walk. What an outcome means for
 * the agent (error and hint sentences) is decided in provider_local.c.
 *
 * Shape of a sandbox (sandbox.c lists the files that hold each part):
 *
 *   worker: creates the task's cgroup with its limits (memory.max, no swap,
 *     pids.max, cpu.max), then
 *   worker ──clone(NEWUSER|NEWPID|NEWNS|NEWNET|NEWIPC|NEWUTS|NEWCGROUP)──▶ init (pid 1)
 *     puts init in the cgroup before init does anything (init waits for a
 *     byte), writes uid_map/gid_map (sandbox uid 1000 = one unprivileged id outside),
 *     waits for READY + the /workspace fd, writes the inputs through that fd,
 *     sends GO; then polls stdout, stderr, the report pipe, the code socket,
 *     init's pidfd and a cancel eventfd until init reports DONE.
 *   init: builds a tmpfs root (read-only /usr, a few /etc files, a minimal
 *     /dev, a fresh /proc, tmpfs /workspace and /tmp), pivot_root()s into it,
 *     drops every capability, forks the task and reaps every process until
 *     the task exits - or until the worker asks it to stop (timeout, cancel:
 *     SIGUSR1, honoured only from outside the namespace); then it kills
 *     everything left, reaps it and reports the task's wait status with the
 *     CPU time and peak memory of all it reaped. If init does not stop in
 *     time, SIGKILL on init kills the whole pid namespace.
 *   task: oom_score_adj 1000 (the OOM killer takes the code, not init),
 *     setsid, rlimits, a seccomp filter (deny list), then
 *     python3 -I -B -c <driver.py>; the code on stdin, the driver's report
 *     on fd 3.
 *   after: the worker reads the cgroup's OOM kills and peak memory, kills
 *     what is left in it, waits until it is empty and removes it.
 *
 * Limits. With a cgroup (v2 where memory, pids and cpu can be delegated to
 * the worker, else v1 as root; the probe says which, and results say
 * "cgroup" or "cgroup1" in their isolation string) memory is memory.max
 * without swap - tmpfs pages the code writes included, the inputs the
 * worker writes are charged to the worker - and RLIMIT_AS is only a
 * generous cap (2 x memory + 2 GiB). Without one (unprivileged, or no
 * delegation) RLIMIT_AS = the memory limit, RLIMIT_NPROC and RLIMIT_CPU are
 * the only limits. local.isolation: required requires the namespaces only;
 * local.require_cgroup requires the cgroup too. The no-isolation fallback
 * never uses cgroups.
 *
 * Warm mode (local.mode: warm, see zygote.h and src/zygote/main.c): a zygote
 * with numpy, pandas, matplotlib and openpyxl imported sits in a sandbox
 * built as above (its own user, pid, mount, net, ipc and uts namespaces,
 * the read-only root), started by an execve of ci-zygote so that it holds
 * nothing of the worker. Per task it clones a child with new user, pid,
 * mount, net, ipc, uts (and cgroup) namespaces: that child is the task's
 * init, mounts the task's own /workspace, /tmp, /dev/shm and /proc, joins
 * the task's cgroup (the worker moves it), and forks the task, which gets
 * the same rlimits and seccomp filter and runs the driver in the already
 * warm interpreter. Every layer above stays, and so does the isolation
 * string; timeouts, cancels, limits and artifacts work as in a cold run.
 *
 * When the machine cannot create the namespaces (and local.isolation is not
 * `required`), or when local.isolation is `none`, a run is a plain fork with
 * the same rlimits, its own process group and a private 0700 temp directory:
 * no isolation at all, and every result says "none".
 *
 * Threads: the worker is multi-threaded, so nothing between clone() and
 * execve() allocates, takes a lock or calls a glibc wrapper that signals
 * other threads (set*id go through syscall()). Everything the child needs is
 * prepared before the clone. */
#ifndef CI_SANDBOX_H
#define CI_SANDBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "core/config.h"
#include "core/job.h"
#include "core/status.h"
#include "sandbox/zygote.h"

/* The Python driver (runtime/driver.py), compiled in by cmake/embed.cmake. */
extern const char ci_driver_py[];
extern const size_t ci_driver_py_len;

/* Namespace layers, in the order they are named in an isolation string. */
enum ci_sandbox_layer {
    CI_LAYER_USER,
    CI_LAYER_PID,
    CI_LAYER_NET,
    CI_LAYER_MNT,
    CI_LAYER_IPC,
    CI_LAYER_UTS,
    CI_LAYER_CGROUP, /* cgroup namespace: optional, used when it works */
    CI_LAYER_COUNT,
};

/* What this machine allows, found by actually doing it once. */
struct ci_sandbox_probe {
    bool layer_ok[CI_LAYER_COUNT];
    int layer_errno[CI_LAYER_COUNT]; /* why a layer failed (0 when ok) */
    bool seccomp_ok; /* the seccomp filter loads (used in both modes when it does) */
    int seccomp_errno;
    bool setup_ok;   /* the whole root (tmpfs, binds, pivot_root) could be built */
    bool proc_ok;    /* a fresh /proc could be mounted; if not, /proc stays empty */
    char proc_failure[256]; /* why not */
    bool python_ok;  /* a real run of the driver with `pass` exited 0 */
    char python_failure[256]; /* why not, when the sandbox itself worked */
    bool sandboxed;  /* tasks will run in namespaces */
    /* Per-task cgroups (memory, pids, cpu), tried only with the namespaces:
     * 2 or 1 when a run in one worked, 0 when unavailable (then memory is
     * limited by RLIMIT_AS alone). */
    int cgroup_version;
    bool cgroup_required;     /* local.require_cgroup: no cgroup, no tasks */
    char cgroup_dir[256];     /* where the tasks' cgroups go (the memory one for v1) */
    char cgroup_failure[512]; /* why not; "" when it worked or was not tried */
    bool cgroup_favor_dynmods; /* ci_cgroup_favor_dynmods(), read with the cgroups */
    enum ci_isolation requested;
    char isolation[128]; /* what a result will say: "user,pid,net,mnt,ipc,uts,..." or "none" */
    char failure[512];   /* the first failure, one sentence; "" when none */
    char warning[512];   /* for the log when `auto` fell back to no sandbox; "" otherwise */
    /* Warm mode (local.mode: warm), tried only with the namespace sandbox:
     * a zygote started and a task ran in one of its children. Without it
     * tasks run cold, with the same isolation. */
    bool warm_requested;
    bool warm_ok;
    /* ci_sandbox_probe_deferred: no zygote was tried here; ci_sandbox_new
     * tries the first of its pool instead (warm_ok stays false). */
    bool warm_deferred;
    int64_t warm_start_ms;  /* from the launch to that task's end */
    char warm_failure[480]; /* why not; "" when it worked or was not asked for */
    /* Task uids (local.task_uid_*, root only) failed where one uid works:
     * then every task runs as local.sandbox_uid. */
    bool task_uids_off;
    char task_uids_failure[320];
};

/* Tries every layer the sandbox needs (clone with each namespace, the uid
 * map, seccomp, the tmpfs root with /proc and pivot_root, then python3 with
 * the driver) and decides the mode for cfg->local.isolation. ret is always
 * filled - it is the explanation when something fails. Returns CI_OK when
 * tasks can run in the mode the config asks for (ret->sandboxed says
 * whether that is the sandbox; ret->warning is set when `auto` fell back);
 * CI_ERR_UNSUPPORTED when they cannot (isolation `required` and a layer
 * failed, or python3 does not run; ret->failure says why); CI_ERR_NOMEM.
 * Takes ~0.2 s. */
ci_status ci_sandbox_probe(const struct ci_config *cfg, struct ci_sandbox_probe *ret);

/* The same, for a caller that makes its sandbox right after: in warm mode
 * no zygote of the probe's own is started (seconds: the runtime's imports);
 * ci_sandbox_new makes the same try with the first zygote of its pool, a
 * task run in one of its children before any other, and runs tasks cold
 * when that fails (ci_sandbox_warm_failure says why). */
ci_status ci_sandbox_probe_deferred(const struct ci_config *cfg, struct ci_sandbox_probe *ret);

/* Prints one line per layer ("user: ok", "net: FAILED (Operation not
 * permitted)", ...) and the mode that will run. For `ci-worker --probe`. */
void ci_sandbox_probe_print(const struct ci_sandbox_probe *p, FILE *out);

/* A prepared sandbox: every path, mount option, argv and environment string
 * a run needs, built once. Safe to use from several threads at once. */
struct ci_sandbox;

/* Prepares a sandbox for cfg (borrowed for the sandbox's life) in the mode
 * the probe chose. Fails when probe says the sandbox is required but
 * unavailable, or when local.python is missing or outside /usr. */
ci_status ci_sandbox_new(const struct ci_config *cfg, const struct ci_sandbox_probe *probe,
                         struct ci_sandbox **ret, struct ci_error *err);
void ci_sandbox_free(struct ci_sandbox *sb);
/* The isolation string every result of this sandbox carries. */
const char *ci_sandbox_isolation(const struct ci_sandbox *sb);

/* "warm" when tasks fork from zygotes (zygote.h), else "cold". Warm tasks
 * get the same isolation (and isolation string) as cold ones: their own
 * user, pid, mount, net, ipc, uts and cgroup namespaces, tmpfs /workspace,
 * /tmp and /dev/shm, rlimits, seccomp filter and cgroup. A warm start that
 * fails before anything of the task ran (no zygote ready, a zygote died)
 * runs the task cold instead. */
const char *ci_sandbox_mode(const struct ci_sandbox *sb);

/* Why tasks run cold although warm mode was asked for and the probe allowed
 * it (or left the try to ci_sandbox_new): the zygotes did not start, or a
 * task in one failed. "" otherwise (a probe that found warm mode unavailable
 * says why in its warm_failure). */
const char *ci_sandbox_warm_failure(const struct ci_sandbox *sb);

/* Warm mode's counters, and how many tasks ran cold because no zygote could
 * take them. Returns false (and leaves ret alone) in cold mode. */
bool ci_sandbox_warm_stats(struct ci_sandbox *sb, struct ci_zygote_stats *ret,
                           uint64_t *ret_fallbacks);

enum ci_sandbox_end {
    CI_SANDBOX_EXITED,    /* the task process ended by itself; see status */
    CI_SANDBOX_TIMED_OUT, /* the deadline passed and everything was killed */
    CI_SANDBOX_CANCELLED, /* ci_sandbox_cancel() was called and everything was killed */
    CI_SANDBOX_BROKEN,    /* the sandbox failed after start; see outcome.error */
};

/* What a run produced, before interpretation. */
struct ci_sandbox_result {
    enum ci_sandbox_end end;
    bool has_status;
    int status;         /* the task process's raw wait status, when has_status */
    bool exec_failed;   /* python3 could not be executed */
    bool cgroup;        /* the run had its cgroup: its limits applied, oom_killed is known */
    bool cgroup_peak;   /* outcome.memory_mb is the cgroup's peak (tmpfs pages included) */
    bool oom_killed;    /* the cgroup's OOM killer killed a process of the task */
    /* Timed out or cancelled, and its processes did not exit within 10 s of
     * SIGKILL (frozen by the cgroup v1 freezer, stuck in the kernel): the wait
     * stopped waiting for them, and outcome.error says so. The run's free
     * does not wait for them either (ci_sandbox_run_free). */
    bool unreaped;
    /* out/err/totals, artifacts, duration_ms, cpu_ms, memory_mb, isolation
     * are filled; kind, exit_code, error and hint are left to the caller
     * (error is set only for CI_SANDBOX_BROKEN, and when unreaped). */
    struct ci_outcome outcome;
    char *report;       /* the driver's report (NUL-separated key, value pairs) */
    size_t report_len;
    char *artifact_note; /* "artifacts exceed 20 MiB; 'x.png' was not kept", or NULL */
};

void ci_sandbox_result_release(struct ci_sandbox_result *r);

/* The report (report.c): the next key and value from *pos on (the value is
 * NUL-terminated, vlen bytes); false at the end or at a pair the capture's
 * cap cut short. ci_report_get: key's last value, or NULL. */
bool ci_report_next(const char *data, size_t len, size_t *pos, const char **ret_key,
                    const char **ret_val, size_t *ret_vlen);
const char *ci_report_get(const char *data, size_t len, const char *key, size_t *ret_len);

struct ci_sandbox_run;

/* Builds a fresh sandbox, writes the inputs into /workspace and starts the
 * code; returns as soon as the code runs. The job is borrowed until this
 * returns (the code is copied, the inputs are written), and its limits
 * are taken as they are (0 is not a default here). The deadline (job->timeout_ms)
 * starts now. On failure nothing is left running and err says which setup
 * step failed; CI_ERR_FULL when no task uid of the cold runs is free (a
 * killed run whose processes have not exited may hold one): try again
 * later. The thread that calls this must outlive the run: init gets
 * SIGKILL when it exits (PR_SET_PDEATHSIG is per thread). */
ci_status ci_sandbox_start(struct ci_sandbox *sb, const struct ci_job *job,
                           struct ci_sandbox_run **ret, struct ci_error *err);

/* Collects output until the task ends, the deadline passes or a cancel
 * arrives (handing what it keeps to the job's output sink as it is read,
 * and calling the sink's tick() at least as often as it asks); kills
 * every process of the sandbox, reaps them (waiting at most 10 s for them
 * after SIGKILL: see unreaped), then reads the
 * artifacts and closes the workspace. Call once. Returns CI_OK with ret
 * filled (a broken run is CI_SANDBOX_BROKEN, not an error), or
 * CI_ERR_NOMEM (everything is dead then too). The run stays allocated. */
ci_status ci_sandbox_wait(struct ci_sandbox_run *run, struct ci_sandbox_result *ret);

/* Asks the run to stop: wait() kills everything and returns
 * CI_SANDBOX_CANCELLED within a second. Callable from any thread from
 * start() until ci_sandbox_run_free(); after wait() returned it does
 * nothing. Never signals a process itself. */
void ci_sandbox_cancel(struct ci_sandbox_run *run);

/* Frees a run once no thread can call cancel() on it any more. A run that
 * was never waited for is killed and reaped first (in the namespace
 * sandbox init is waited for at most 5 s, then left as it is). An
 * unreaped run is handed to the sandbox's own thread, which frees it once
 * its processes have exited: this returns at once. Accepts NULL. */
void ci_sandbox_run_free(struct ci_sandbox_run *run);

/* As ci_sandbox_run_free(), except that a warm run that was waited for and
 * used at most a few hundred MiB may be freed on the sandbox's own thread
 * (at most one per task slot at a time): the caller does not wait for its
 * processes' exit and its cgroup's removal. Its fds are closed already;
 * what is left is the kernel's teardown. Accepts NULL. */
void ci_sandbox_run_release(struct ci_sandbox_run *run);

#endif
