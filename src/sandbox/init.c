/* init.c - the processes of a cold sandbox, from clone() to execve():
 * init, pid 1 (builds the root from the plan, pivots into it, drops every
 * privilege, forks the task, reaps everything and reports), the task
 * (oom score, session, rlimits, the seccomp filter, python3), a zygote's
 * init (built the same, then it executes ci-zygote) and the child of the
 * no-isolation fallback. They run in a copy of the multi-threaded worker:
 * nothing here allocates, takes a lock or calls a glibc wrapper that
 * signals other threads. All they need comes prepared in struct
 * child_args; the steps, messages and fd numbers are in sandbox_proto.h.
 *
 * Building the sandbox (init_main up to GO) is kept apart from running the
 * task (task_exec, reap_all): a zygote's init builds the same sandbox and
 * executes ci-zygote instead of forking a task. */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sandbox/child.h"
#include "sandbox/sandbox_int.h"
#include "sandbox/sys.h"

/* Default dispositions and an empty mask: the worker's handlers must never
 * run in a sandbox process, and ignored signals would survive execve. */
static void reset_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        sigaction(sig, &sa, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* Enters the new root and forgets the old one. */
static enum step pivot_into_newroot(void)
{
    if (chdir(NEWROOT) != 0 || sys_pivot_root(".", ".") != 0)
        return STEP_PIVOT;
    if (umount2(".", MNT_DETACH) != 0 || chdir("/") != 0)
        return STEP_DETACH;
    if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL))
        return STEP_REMOUNT_ROOT;
    return STEP_NONE;
}

/* The task process: rlimits, a new session, then python3. */
__attribute__((noreturn)) static void task_exec(const struct child_args *a)
{
    const struct ci_sandbox *sb = a->sb;
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL); /* init blocks some; the mask survives execve */
    /* When the memory cgroup runs out, its OOM killer must pick the code,
     * never init (a fork of the worker, which may look bigger): anyone may
     * raise their own score. Init's non-dumpable flag (inherited) makes our
     * /proc files root's: execve() would clear it anyway. Best effort: /proc
     * may be missing. */
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (adj >= 0) {
        ssize_t w = write(adj, "1000", 4);
        (void)w;
        close(adj);
    }
    if (setsid() < 0)
        child_fail(FD_SOCK, STEP_SETSID, 0, errno);
    if (a->drop_to_sandbox_ids) {
        /* Bare mode as root: at least never run the code as root. */
        if (sys_setgroups0() != 0)
            child_fail(FD_SOCK, STEP_SETGROUPS, 0, errno);
        if (sys_setresgid(sb->cfg->local.sandbox_gid) != 0)
            child_fail(FD_SOCK, STEP_SETGID, 0, errno);
        if (sys_setresuid(sb->cfg->local.sandbox_uid) != 0)
            child_fail(FD_SOCK, STEP_SETUID, 0, errno);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0); /* cleared by the id change */
    }
    if (!sb->ns && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        child_fail(FD_SOCK, STEP_NO_NEW_PRIVS, 0, errno);
    for (int r = 0; r < RLIM_NLIMITS; r++) {
        if (!a->limit_set[r])
            continue;
        /* Never above the worker's own hard limit: that would need a capability. */
        struct rlimit want = a->limits[r], have;
        if (getrlimit((__rlimit_resource_t)r, &have) == 0 && have.rlim_max != RLIM_INFINITY) {
            if (want.rlim_max > have.rlim_max)
                want.rlim_max = have.rlim_max;
            if (want.rlim_cur > want.rlim_max)
                want.rlim_cur = want.rlim_max;
        }
        if (setrlimit((__rlimit_resource_t)r, &want) != 0)
            child_fail(FD_SOCK, STEP_RLIMIT, r, errno);
    }
    if (chdir(a->workdir) != 0)
        child_fail(FD_SOCK, STEP_CHDIR, 0, errno);
    /* The socket stays open until execve succeeds, to report its failure. */
    if (fcntl(FD_SOCK, F_SETFD, FD_CLOEXEC) != 0)
        child_fail(FD_SOCK, STEP_FDS, 0, errno);
    /* Last: from here on the calls above would be refused. */
    if (sb->seccomp.filter && load_seccomp(&sb->seccomp) != 0)
        child_fail(FD_SOCK, STEP_SECCOMP, 0, errno);
    execve(sb->cfg->local.python, sb->argv_store, a->envp);
    child_fail(FD_SOCK, STEP_EXEC, 0, errno);
}

__attribute__((noreturn)) static void reap_all(pid_t task);

/* Warm mode: this init becomes a zygote (src/zygote/main.c). The root is
 * built; drop every privilege, say READY (without a workspace: the
 * zygote's tasks get their own) and execute the ci-zygote program the
 * worker opened, with the sandbox's environment. A fresh image: nothing of
 * the worker's memory, which this process holds a copy of, survives the
 * execve. */
__attribute__((noreturn)) static void zygote_exec(const struct child_args *a)
{
    /* The zygote's own /workspace and /dev/shm would lie beneath every
     * task's: a task's mount namespace is a copy the kernel locks (no
     * unmount there may show what a mount covers), so they go now; the
     * zygote writes to neither. /tmp goes once its imports are done
     * (matplotlib needs it writable then): ci-zygote's main. /proc stays:
     * the kernel mounts a task's fresh /proc in a user namespace only where
     * a whole proc is already visible. */
    static const char *const own[] = {"/workspace", "/dev/shm"};
    for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++)
        if (umount2(own[i], MNT_DETACH) != 0)
            child_fail(FD_SOCK, STEP_ZYGOTE_MOUNTS, 0, errno);
    /* The zygote keeps CAP_SYS_ADMIN in its namespace (ambient: it
     * survives the exec) until its imports are done, to detach its own
     * /tmp then (ci-zygote's main); with task uids it writes its spares'
     * uid maps, which needs CAP_SETUID and CAP_SETGID there. Its namespace
     * maps only the sandbox's ids. */
    uint64_t keep = 1ull << CAP_SYS_ADMIN;
    if (a->task_uids)
        keep |= (1ull << CAP_SETUID) | (1ull << CAP_SETGID);
    enum step failed = child_drop_privileges(keep);
    if (failed)
        child_fail(FD_SOCK, failed, 0, errno);
    struct msg ready = {.type = MSG_READY};
    child_send(FD_SOCK, &ready);
    syscall(SYS_execveat, FD_CODE, "", a->sb->zygote_argv, a->envp, AT_EMPTY_PATH);
    child_fail(FD_SOCK, STEP_EXEC, 0, errno);
}

/* /proc/1/cmdline is anyone's to read, and a cold init's arguments are the
 * worker's (its program and config paths, a copy in our memory): zero
 * them where the kernel reads them (arg_start..arg_end, fields 48-49 of
 * /proc/self/stat). Best effort. */
static void blank_cmdline(void)
{
    unsigned long long at[2]; /* arg_start, arg_end */
    if (child_stat_fields("/proc/self/stat", 48, 2, at) == 0 && at[0] && at[1] > at[0] &&
        at[1] - at[0] < (1u << 20))
        memset((void *)(uintptr_t)at[0], 0, (size_t)(at[1] - at[0]));
}

/* pid 1 of the sandbox: builds it, starts the task, reaps, reports. */
__attribute__((noreturn)) void init_main(const struct child_args *a)
{
    const struct ci_sandbox *sb = a->sb;
    /* Dies with the worker thread that cloned it; if the worker is already
     * gone, the read below sees EOF and init exits. */
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    reset_signals();
    /* Init takes SIGCHLD and SIG_STOP with sigwaitinfo(): blocked from the
     * start, a stop request sent early is kept pending, never lost. */
    sigset_t waited;
    sigemptyset(&waited);
    sigaddset(&waited, SIGCHLD);
    sigaddset(&waited, SIG_STOP);
    sigprocmask(SIG_BLOCK, &waited, NULL);
    if (child_move_fds(a->fds, -1) != 0)
        child_fail(a->fds[FD_SOCK], STEP_FDS, 0, errno);
    blank_cmdline();
    if (!child_wait_byte(FD_SOCK))
        _exit(1);
    /* Init is a copy of the worker's memory (its config, its credentials):
     * the code, which runs as the same id inside, must never read it through
     * /proc/1/mem. An unprivileged worker stays dumpable so that it can write
     * our maps; they are written now. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    /* The parent has put us in the task's cgroup: make it the root of what
     * the sandbox sees in /proc/self/cgroup. Only a view (the code can mount
     * nothing), so a failure is not worth failing the task for. */
    if (sb->cgroups && (sb->clone_flags & CLONE_NEWCGROUP))
        (void)unshare(CLONE_NEWCGROUP);

    /* The parent has written the maps. As root it left setgroups allowed,
     * so that the worker's groups (gid 0) can be dropped here. */
    if (sb->outside_root && sys_setgroups0() != 0)
        child_fail(FD_SOCK, STEP_SETGROUPS, 0, errno);
    /* Uid 0 is not mapped in this namespace, so switching ids keeps the
     * namespace capabilities; every file init creates belongs to 1000. */
    if (sys_setresgid(SANDBOX_ID) != 0)
        child_fail(FD_SOCK, STEP_SETGID, 0, errno);
    if (sys_setresuid(SANDBOX_ID) != 0)
        child_fail(FD_SOCK, STEP_SETUID, 0, errno);
    /* Changing ids clears the parent-death signal: arm it again, or a
     * worker killed with SIGKILL would leave the task running. */
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);

    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        child_fail(FD_SOCK, STEP_PRIVATE, 0, errno);
    for (size_t i = 0; i < sb->n_ops; i++)
        if (child_run_op(&sb->ops[i]) != 0)
            child_fail(FD_SOCK, STEP_OP, (int)i, errno);
    enum step failed = pivot_into_newroot();
    if (failed)
        child_fail(FD_SOCK, failed, 0, errno);
    if (sethostname("sandbox", 7) != 0 || setdomainname("sandbox", 7) != 0)
        child_fail(FD_SOCK, STEP_HOSTNAME, 0, errno);
    if (a->zygote)
        zygote_exec(a);
    if (sb->inotify_instances) /* best effort: a /proc/sys that refuses costs no task */
        (void)child_limit_inotify(sb->inotify_instances, sb->inotify_watches);

    /* The task process is forked before READY, so that the worker can set
     * its OOM score with privilege (pin_oom_score) before any code runs; it
     * waits for our word after GO. */
    int go[2];
    if (pipe2(go, O_CLOEXEC) != 0)
        child_fail(FD_SOCK, STEP_FORK, 0, errno);
    pid_t task = sys_clone(SIGCHLD);
    if (task < 0)
        child_fail(FD_SOCK, STEP_FORK, 0, errno);
    if (task == 0) {
        close(go[1]);
        char c;
        ssize_t r;
        do
            r = read(go[0], &c, 1);
        while (r < 0 && errno == EINTR);
        if (r != 1) /* init is gone */
            _exit(1);
        close(go[0]);
        /* Forked before init dropped its privileges: drop them here. */
        enum step dropped = child_drop_privileges(0);
        if (dropped)
            child_fail(FD_SOCK, dropped, 0, errno);
        task_exec(a);
    }
    close(go[0]);
    /* With task uids, the code is uid 1000 and init another (mapped to
     * local.sandbox_uid outside): the code can then neither signal,
     * prlimit nor renice init. Init keeps CAP_KILL, for kill(-1). */
    uint64_t keep = 0;
    if (a->task_uids) {
        if (sys_setresuid(INIT_ID) != 0)
            child_fail(FD_SOCK, STEP_SETUID, 0, errno);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0); /* cleared by the id change */
        keep = 1ull << CAP_KILL;
    }
    int task_pidfd = sys_pidfd_open(task);
    child_ready_then_go(FD_SOCK, task_pidfd, keep);
    if (task_pidfd >= 0)
        close(task_pidfd);
    if (write(go[1], "g", 1) != 1)
        child_fail(FD_SOCK, STEP_FORK, 0, errno);
    close(go[1]);
    /* Only the task holds the pipes now: the parent sees EOF when the
     * task and everything it started are gone. */
    for (int fd = 0; fd < FD_SOCK; fd++)
        close(fd);
    reap_all(task);
}

/* Init's last duty. Reaps every process until the task has exited, or
 * until the parent asks to stop (timeout, cancel); then kills what is
 * left (orphans included), reaps it too and reports the task's status with
 * the CPU time and peak memory of everything it reaped. Killing init
 * instead would lose that accounting. kill(-1) reaches every process of
 * the namespace: they have init's uid, or init kept CAP_KILL (task uids). */
__attribute__((noreturn)) static void reap_all(pid_t task)
{
    sigset_t waited;
    sigemptyset(&waited);
    sigaddset(&waited, SIGCHLD);
    sigaddset(&waited, SIG_STOP);
    struct msg done = {.type = MSG_DONE};
    bool task_done = false, stopping = false;
    for (;;) {
        for (;;) {
            int st;
            struct rusage ru;
            pid_t r = wait4(-1, &st, __WALL | WNOHANG, &ru);
            if (r < 0 && errno == EINTR)
                continue;
            if (r < 0) /* ECHILD: nothing left in the namespace */
                goto report;
            if (r == 0)
                break;
            child_add_rusage(&done, &ru);
            if (r == task) {
                done.status = st;
                task_done = true;
            }
        }
        if (task_done || stopping) {
            stopping = true;
            kill(-1, SIGKILL); /* again each round: catches the last forks */
        }
        siginfo_t si;
        int sig = sigwaitinfo(&waited, &si);
        if (child_is_stop_request(sig, &si))
            stopping = true;
    }
report:
    if (!task_done)
        _exit(1);
    child_send(FD_SOCK, &done);
    _exit(0);
}

/* The child of a run without namespaces: the task itself. */
__attribute__((noreturn)) void bare_main(const struct child_args *a)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    reset_signals();
    if (child_move_fds(a->fds, -1) != 0)
        child_fail(a->fds[FD_SOCK], STEP_FDS, 0, errno);
    task_exec(a);
}

