/* main.c - ci-zygote: a warm Python runtime that forks one fully
 * isolated child per task (local.mode: warm). See zygote.h for the pool
 * that runs it and sandbox_proto.h for what it says to the worker.
 *
 * How a zygote starts. The worker builds it exactly like the init of a cold
 * sandbox (sandbox/init.c): clone with new user, pid, mount, net, ipc, uts (and
 * cgroup) namespaces, the uid map, the read-only tmpfs root, pivot_root,
 * every capability dropped, no_new_privs - then, instead of forking a task,
 * that init executes this program (through an fd the worker opened) with the
 * sandbox's environment. A fresh image: nothing of the worker's memory (its
 * config, its credentials) exists here. It is pid 1 of its pid namespace:
 * when it dies, every process it started dies too.
 *
 * Then: read SETUP (the per-task steps of the plan and the seccomp filter),
 * start Python as `python3 -I -B` would, load runtime/driver.py as the module
 * ci_driver and let it import numpy, pandas, matplotlib (Agg) and openpyxl,
 * freeze the heap, call PyOS_BeforeFork() once, say READY. From here on the
 * zygote runs no Python at all, and allocates nothing: its memory stays as
 * every child expects to find it.
 *
 * Spares. Forking this image costs ~16 ms here, and a freshly forked child
 * pays tens of ms more in copy-on-write faults and first calls. So the
 * zygote keeps spares made ahead of the next tasks (SETUP says how many,
 * local.warm_spares), with no task data in them, and a task's critical
 * path forks nothing:
 *
 *   zygote (single-threaded: /proc/self/task is checked before each fork)
 *     ──clone(VM|VFORK|NEWUSER|NEWPID|NEWNS|NEWNET|NEWIPC|NEWUTS[|NEWCGROUP])──▶ init (pid 1)
 *   init, on the zygote's memory until its exec (spare_init_start): forks the
 *     task process, executes ci-zygote-init (src/zygote/init.c), a small
 *     static program: no copy of this image's page tables for pid 1, none
 *     to tear down when it exits. There it writes its own uid/gid map (1000
 *     -> the zygote's 1000), tells the task process, waits for a SPAWN on a
 *     socketpair kept by the zygote.
 *   task process: the zygote's signal dispositions (a copy), once init
 *     wrote the maps PyOS_AfterFork_Child(); once idle for WARM_UP_DELAY_MS, the steps of
 *     ci_driver._warm_up() (our fixed code: the driver's steps, a small
 *     csv/groupby; at SCHED_IDLE when the worker can undo that) until init tells
 *     it a task came; then it waits for init.
 *
 * One task (one SPAWN with the task's five channel fds): the zygote passes
 * it to the oldest spare's init and makes another spare. The init tells the task
 * process (one byte: stop warming up), then does what the init of a cold
 * sandbox does, with the same messages: sends the worker pidfds of itself
 * and of the task process (HELLO) and waits until the worker has put both
 * in the task's cgroup (moving init would not move a child it already
 * has); makes mounts private and mounts what the task owns - fresh tmpfs
 * /workspace, /tmp and /dev/shm (size, inode limits, nosuid, nodev,
 * nosymfollow on /workspace), a fresh /proc, matplotlib's font list - then
 * READY with the /workspace fd, drops every capability, waits for GO,
 * passes the SPAWN and the task's fds to the task process and reaps. The
 * task process answers with the CPU time its warm-up took, before any task
 * code runs: init leaves it out of what it reports, and the task's
 * RLIMIT_CPU gets it on top.
 *   task: its cgroup namespace, ids and privileges dropped as init's were,
 *     dumpable, OOM score 1000, setsid, the task's rlimits, cwd /workspace,
 *     the same seccomp filter, then ci_driver._warm_main(): reseed random
 *     and numpy, run the code, exit like Python would (threads, atexit,
 *     flush).
 * Each spare serves exactly one task; it dies with its zygote (parent-death
 * signal, and EOF on its socket when the zygote retires).
 *
 * EOF on the request socket (the worker retired this zygote, or is gone):
 * accept nothing more, wait until every child has ended, exit.
 *
 * This is a separate program; the child-side helpers it shares with a cold
 * sandbox and with ci-zygote-init (moving fds, reporting, building mounts,
 * dropping privileges) are src/sandbox/child.c, compiled into each, the SETUP
 * parser is src/sandbox/zsetup.c, and the messages are the same
 * (sandbox_proto.h). It is never built with the sanitizers: their shadow
 * memory would not fit under a task's RLIMIT_AS. */
#include <Python.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <malloc.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sandbox/child.h"
#include "sandbox/sandbox_proto.h"
#include "sandbox/sys.h"
#include "sandbox/zsetup.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; glibc 2.36's headers lack it */
#endif

extern const char ci_driver_py[];
extern const size_t ci_driver_py_len;

#define SETUP_TIMEOUT_MS 30000
#define INIT_FD_PROG 6 /* in a spare's init until its exec: ci-zygote-init (close-on-exec) */
#define TASK_FD_CHAN 7 /* in a spare's task process: the socketpair to its init */
#define SPARE_INIT_STACK 16384 /* the stack of a spare's init until its exec */
#define WARM_UP_DELAY_MS 150 /* a spare idle this long starts to warm up */
#define SPARE_MAP_TIMEOUT_MS 10000 /* longest wait for a new spare to ask for its maps */

#define KEEPER_STACK 16384

/* With task uids: the spare init (later the task's init) holding each uid
 * of our block, 0 if none; freed when we reap it (its tasks are dead). */
static pid_t uid_holder[MAX_UID_BLOCK];

/* 1 while the task process's keeper sets itself up, then 0 (start_keeper). */
static pid_t keeper_setting_up;

/* Everything the children need, filled before the first fork and never
 * changed after it. */
static struct {
    struct zsetup s;          /* SETUP */
    int setup_fd;             /* its sealed memfd, for each spare's init */
    int init_prog;            /* ci-zygote-init (O_PATH, close-on-exec) */
    PyObject *warm_main;      /* ci_driver._warm_main */
    PyObject *warm_up;        /* ci_driver._warm_up */
    int task_dir;             /* /proc/self/task, to count our threads */
    int collapse_err;         /* collapse_heap()'s, for READY */
    int64_t collapsed_kb;
} z = {.setup_fd = -1, .init_prog = -1, .task_dir = -1};

/* One task: the request and its fds, at the zygote's numbers. */
struct task_req {
    struct zmsg_spawn spawn;
    int fds[FD_COUNT];
};

/* ---------------------------------------------------------------------- */
/* Small system helpers (those a cold sandbox uses too: sandbox/child.h)  */
/* ---------------------------------------------------------------------- */

/* Threads of this process, from its open /proc/self/task, without allocating. */
static int count_threads(int task_dir)
{
    char buf[1024];
    int n = 0;
    if (task_dir < 0 || lseek(task_dir, 0, SEEK_SET) != 0)
        return -1;
    for (;;) {
        long got = syscall(SYS_getdents64, task_dir, buf, sizeof(buf));
        if (got < 0)
            return -1;
        if (got == 0)
            return n;
        for (long off = 0; off < got;) {
            unsigned short reclen;
            memcpy(&reclen, buf + off + 16, sizeof(reclen)); /* d_reclen in linux_dirent64 */
            const char *name = buf + off + 19;
            if (name[0] != '.')
                n++;
            off += reclen;
        }
    }
}

/* ---------------------------------------------------------------------- */
/* The task process                                                        */
/* ---------------------------------------------------------------------- */

static int64_t tv_us(struct timeval tv)
{
    return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec;
}

/* The keeper: a process that shares the task process's memory and holds
 * nothing else (no fd, every signal blocked), asleep until init kills it.
 * When the task process exits, its address space - the whole interpreter,
 * ~100 MB mapped - is not torn down in its own exit but in the keeper's, after
 * init has reaped the task and reported: the ~10 ms that unmapping takes
 * here are off the task's path. Made after the seccomp filter, the ids and
 * the limits, so it can do nothing the code could not. No libc state is
 * touched (it shares our TLS): raw syscalls, errno only on a failure. */
static int keeper_main(void *arg)
{
    (void)arg;
    sigset_t all;
    sigfillset(&all);
    syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, NULL, (size_t)(_NSIG / 8));
    if (syscall(SYS_close_range, 0U, ~0U, 0U) != 0)
        for (long fd = 0; fd < 1024; fd++)
            syscall(SYS_close, fd);
    __atomic_store_n(&keeper_setting_up, 0, __ATOMIC_RELEASE);
    syscall(SYS_futex, &keeper_setting_up, FUTEX_WAKE, 1, NULL, NULL, 0);
    for (;;)
        syscall(SYS_ppoll, NULL, 0UL, NULL, NULL, (size_t)(_NSIG / 8));
    return 0;
}

/* Returns once the keeper holds nothing. Until then it has a copy of our
 * fds (the task's stdout and stderr among them), takes signals and runs
 * on our TLS: the code must not run beside that. Its own start gave no
 * such order - a keeper forked onto a busy CPU first ran after the code
 * had ended (t_warm_keeper). */
static pid_t start_keeper(void)
{
    static char stack[KEEPER_STACK] __attribute__((aligned(16)));
    /* Written before the clone: its page is then an anonymous one of our
     * own (not the file's, nor shared with the zygote), which both sides
     * key the futex by. */
    __atomic_store_n(&keeper_setting_up, 1, __ATOMIC_RELAXED);
    /* CLONE_PARENT: init's child, out of the reach of the code's wait().
     * CLONE_CHILD_CLEARTID: a keeper killed before it is ready clears the
     * word and wakes us too (a shared-futex wake, hence no _PRIVATE here). */
    pid_t pid = clone(keeper_main, stack + sizeof(stack),
                      CLONE_VM | CLONE_PARENT | CLONE_CHILD_CLEARTID, NULL, (pid_t *)NULL,
                      (void *)NULL, &keeper_setting_up);
    if (pid <= 0)
        return 0;
    while (__atomic_load_n(&keeper_setting_up, __ATOMIC_ACQUIRE) != 0)
        syscall(SYS_futex, &keeper_setting_up, FUTEX_WAIT, 1, NULL, NULL, 0);
    return pid;
}

/* After GO, with the task's fds at 0..4 and the channel to init at
 * FD_COUNT: the task. It was forked before init was placed and dropped its
 * privileges, so it does both itself. note: the CPU time its warm-up took,
 * which RLIMIT_CPU must not count, to pass on to init with the keeper. */
__attribute__((noreturn)) static void task_main(const struct zmsg_spawn *sp, struct task_note note)
{
    int64_t warm_us = note.utime_us + note.stime_us;
    /* The worker moved us into the task's cgroup along with init (HELLO
     * carried our pidfd): the same view of it as init's. */
    if (z.s.cgroupns)
        (void)unshare(CLONE_NEWCGROUP);
    /* The warm-up ran Python in this process: a thread a library started
     * would keep our privileges and no filter, as the calls below act on
     * the calling thread only. */
    int dir = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int threads = count_threads(dir);
    if (dir >= 0)
        close(dir);
    if (threads != 1)
        child_fail(FD_SOCK, STEP_ZYGOTE_THREADS, 0, threads < 0 ? errno : EBUSY);
    if (sys_setresgid(SANDBOX_ID) != 0)
        child_fail(FD_SOCK, STEP_SETGID, 0, errno);
    if (sys_setresuid(SANDBOX_ID) != 0)
        child_fail(FD_SOCK, STEP_SETUID, 0, errno);
    enum step failed = child_drop_privileges(0);
    if (failed)
        child_fail(FD_SOCK, failed, 0, errno);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    /* As in init.c: our /proc files are ours, and the OOM killer of the
     * task's cgroup takes the code, never init. */
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (adj >= 0) {
        ssize_t w = write(adj, "1000", 4);
        (void)w;
        close(adj);
    }
    if (setsid() < 0)
        child_fail(FD_SOCK, STEP_SETSID, 0, errno);
    for (int r = 0; r < RLIM_NLIMITS; r++) {
        if (!sp->limits[r].set)
            continue;
        struct rlimit want = {(rlim_t)sp->limits[r].cur, (rlim_t)sp->limits[r].max};
        if (r == RLIMIT_CPU && warm_us > 0) { /* whole seconds: the warm-up's on top */
            rlim_t extra = (rlim_t)((warm_us + 999999) / 1000000);
            if (want.rlim_cur != RLIM_INFINITY)
                want.rlim_cur += extra;
            if (want.rlim_max != RLIM_INFINITY)
                want.rlim_max += extra;
        }
        struct rlimit have;
        if (getrlimit((__rlimit_resource_t)r, &have) == 0 && have.rlim_max != RLIM_INFINITY) {
            if (want.rlim_max > have.rlim_max)
                want.rlim_max = have.rlim_max;
            if (want.rlim_cur > want.rlim_max)
                want.rlim_cur = want.rlim_max;
        }
        if (setrlimit((__rlimit_resource_t)r, &want) != 0)
            child_fail(FD_SOCK, STEP_RLIMIT, r, errno);
    }
    if (chdir("/workspace") != 0)
        child_fail(FD_SOCK, STEP_CHDIR, 0, errno);
    /* Last: from here on the calls above would be refused. */
    if (z.s.filter.filter &&
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &z.s.filter) != 0)
        child_fail(FD_SOCK, STEP_SECCOMP, 0, errno);
    close(FD_SOCK); /* the code gets 0-3 only, as after execve in a cold task */
    note.keeper = start_keeper(); /* none: the exit is only slower */
    /* Its teardown gives way to the next task's start (ZSETUP_IDLE_KEEPER).
     * Set here, not by the keeper itself: before the code runs, and with
     * the keeper at the normal policy until then, so that our start never
     * waits for an idle process. */
    struct sched_param idle = {.sched_priority = 0};
    if (z.s.idle_keeper && note.keeper > 0)
        (void)sched_setscheduler(note.keeper, SCHED_IDLE, &idle);
    (void)send(FD_COUNT, &note, sizeof(note), MSG_NOSIGNAL); /* fails only if init is gone */
    close(FD_COUNT);

    PyObject *r = PyObject_CallNoArgs(z.warm_main); /* never returns when all is well */
    Py_XDECREF(r);
    static const char msg[] = "ci-zygote: the driver returned instead of exiting\n";
    ssize_t w = write(FD_ERR, msg, sizeof(msg) - 1);
    (void)w;
    _exit(1);
}

/* A spare's task process, forked by its init ahead of any task: it warms
 * the runtime up with our own fixed code (ci_driver._warm_up: the lazy
 * imports, caches and copy-on-write faults of the first calls, paid here
 * instead of by the task), then waits for init to hand it the task's fds
 * and limits at GO. No task data exists in this process before that. */
__attribute__((noreturn)) static void prefork_task_main(int chan)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    /* Our init's first byte: our namespace's maps are written (our ids are
     * 1000 from now on). EOF: it failed, or is gone. Python's dispositions
     * are ours already (a copy of the zygote's); its mask blocked all. */
    if (!child_wait_byte(chan))
        _exit(0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* Only CPU nothing else wants (the worker resets it when a task comes):
     * a queue of tasks then runs first. */
    struct sched_param idle = {.sched_priority = 0};
    if (z.s.idle_warmup)
        (void)sched_setscheduler(0, SCHED_IDLE, &idle);
    PyOS_AfterFork_Child();
    /* Step by step, and no further once a task has come (init's note). A
     * step cannot be cut short, and a task that comes in the middle of one
     * waits for it: so none starts while tasks come back to back (the next
     * one is then likely within WARM_UP_DELAY_MS), where the warm-up would
     * only move the cost from one task to the next. */
    PyObject *steps = PyObject_CallNoArgs(z.warm_up);
    Py_ssize_t n = steps && PyTuple_Check(steps) ? PyTuple_GET_SIZE(steps) : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        struct pollfd p = {.fd = chan, .events = POLLIN};
        if (poll(&p, 1, i == 0 ? WARM_UP_DELAY_MS : 0) != 0)
            break;
        PyObject *r = PyObject_CallNoArgs(PyTuple_GET_ITEM(steps, i));
        if (!r)
            break;
        Py_DECREF(r);
    }
    if (PyErr_Occurred())
        PyErr_PrintEx(0); /* only slower: to the zygote's stderr, the task still runs;
                           * 0: no sys.last_exc for the task to find */
    Py_XDECREF(steps);

    struct zmsg_spawn sp;
    int fds[FD_COUNT];
    if (!child_wait_byte(chan) || child_recv_fds(chan, &sp, sizeof(sp), fds, 0) != 1)
        _exit(0); /* init went away before a task came */
    /* What the warm-up cost is not the task's: init takes it off the CPU
     * time it reports, task_main() puts it on top of RLIMIT_CPU. No task
     * code has run yet: this is true. */
    struct rusage ru;
    struct task_note note = {0};
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        note.utime_us = tv_us(ru.ru_utime);
        note.stime_us = tv_us(ru.ru_stime);
    }
    if (sp.type != ZMSG_SPAWN || child_move_fds(fds, chan) != 0)
        child_fail(fds[FD_SOCK], STEP_FDS, 0, errno);
    task_main(&sp, note);
}

/* ---------------------------------------------------------------------- */
/* A spare's init, until it executes ci-zygote-init                      */
/* ---------------------------------------------------------------------- */

/* With task uids, the maps of a spare's namespace, written by us (which
 * takes CAP_SETUID and CAP_SETGID here): its uid 1000 is `uid` of our
 * block, one no other spare or task of ours has; INIT_ID is our own uid,
 * for its init. Its gid is ours, and setgroups stays denied. */
static int write_spare_maps(pid_t pid, uint32_t uid)
{
    char path[48], map[64];
    int n = snprintf(map, sizeof(map), "%d %u 1\n%d %d 1\n", SANDBOX_ID, uid, INIT_ID,
                     SANDBOX_ID);
    if (n <= 0 || (size_t)n >= sizeof(map))
        return -1;
    snprintf(path, sizeof(path), "/proc/%d/setgroups", (int)pid);
    if (child_write_file(path, "deny\n", 5, 0) != 0)
        return -1;
    snprintf(path, sizeof(path), "/proc/%d/uid_map", (int)pid);
    if (child_write_file(path, map, (size_t)n, 0) != 0)
        return -1;
    n = snprintf(map, sizeof(map), "%d %d 1\n", SANDBOX_ID, SANDBOX_ID);
    snprintf(path, sizeof(path), "/proc/%d/gid_map", (int)pid);
    return child_write_file(path, map, (size_t)n, 0);
}

/* What a spare's init, cloned on our memory, leaves us when it fails
 * before its exec (it writes nothing else of ours). */
struct spare_start {
    int sock;       /* its end of the socketpair to us */
    int step, err;  /* 0, or the step that failed and its errno */
};

/* Moves fd to target (flags: 0 or O_CLOEXEC); -1 if it could not. */
static int move_fd(int fd, int target, int flags)
{
    if (fd == target)
        return (int)syscall(SYS_fcntl, fd, F_SETFD, flags ? FD_CLOEXEC : 0);
    if (syscall(SYS_dup3, fd, target, flags) < 0)
        return -1;
    return (int)syscall(SYS_close, fd);
}

/* A spare's init from its clone (CLONE_VM|CLONE_VFORK and the task's
 * namespaces) to its exec: on our memory, on a stack that is part of ours,
 * while we wait. So: raw system calls only (no malloc, stdio, locks: ours),
 * every signal blocked (spare_make), no write to our globals. It puts its
 * fds where ci-zygote-init wants them (zsetup.h), forks the task process (a
 * copy of our memory, as every child was), raises every capability of its
 * new namespace as ambient (its uid is not mapped yet: nothing else would
 * survive the exec) and executes ci-zygote-init. Returns only on failure. */
static int spare_init_start(void *arg)
{
    struct spare_start *a = arg;
    enum step step = STEP_FDS;
    syscall(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0); /* dies with us */
    long sock = syscall(SYS_fcntl, a->sock, F_DUPFD_CLOEXEC, 16);
    long setup = syscall(SYS_fcntl, z.setup_fd, F_DUPFD_CLOEXEC, 16);
    long prog = syscall(SYS_fcntl, z.init_prog, F_DUPFD_CLOEXEC, 16);
    if (sock < 0 || setup < 0 || prog < 0 || move_fd((int)sock, INIT_FD_ZYGOTE, 0) != 0 ||
        move_fd((int)setup, INIT_FD_SETUP, 0) != 0 ||
        move_fd((int)prog, INIT_FD_PROG, O_CLOEXEC) != 0)
        goto fail;
    /* Our request socket (ZYGOTE_FD_REQ, where INIT_FD_CHAN goes) and the rest. */
    syscall(SYS_close, INIT_FD_CHAN);
    if (syscall(SYS_close_range, INIT_FD_PROG + 1, ~0U, 0) != 0)
        goto fail;
    int tp[2];
    step = STEP_FORK;
    if (syscall(SYS_socketpair, AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, tp) != 0 ||
        move_fd(tp[0], INIT_FD_CHAN, 0) != 0 || move_fd(tp[1], TASK_FD_CHAN, O_CLOEXEC) != 0)
        goto fail;
    pid_t task = sys_clone(SIGCHLD);
    if (task == 0) {
        /* A copy of our memory of its own now: anything goes. */
        syscall(SYS_close_range, 3U, (unsigned)TASK_FD_CHAN - 1, 0U);
        prefork_task_main(TASK_FD_CHAN);
    }
    if (task < 0)
        goto fail;
    syscall(SYS_close, TASK_FD_CHAN);

    step = STEP_ZYGOTE_INIT;
    struct __user_cap_header_struct ch = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct cd[2];
    memset(cd, 0, sizeof(cd));
    if (syscall(SYS_capget, &ch, cd) != 0)
        goto fail;
    for (int i = 0; i < 2; i++)
        cd[i].inheritable = cd[i].permitted; /* PR_CAP_AMBIENT_RAISE needs both */
    if (syscall(SYS_capset, &ch, cd) != 0)
        goto fail;
    for (long cap = 0; cap < 64; cap++)
        if ((cd[cap / 32].permitted >> (cap % 32)) & 1u)
            syscall(SYS_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0);
    /* Its arguments: the protocol it must speak (a ci-zygote-init of
     * another build refuses), whether the zygote writes its maps (known
     * even when it cannot read SETUP), the task process's pid. */
    char num[16], *p = num + sizeof(num);
    *--p = '\0';
    for (unsigned v = (unsigned)task; v || p == num + sizeof(num) - 1; v /= 10)
        *--p = (char)('0' + v % 10);
    char *argv[] = {"ci-zygote-init", INIT_ARG_PROTO, z.s.uid_block ? "u" : "-", p, NULL};
    char *envp[] = {NULL};
    syscall(SYS_execveat, INIT_FD_PROG, "", argv, envp, AT_EMPTY_PATH);
fail:
    a->step = step;
    a->err = errno; /* our own errno: read only now that this one is failing */
    return 127;     /* the task process, if any, sees EOF on its channel and goes */
}

/* Clones a spare's init on our memory (spare_init_start): the stack it
 * runs on is this function's array, a part of our own [stack] mapping, and
 * so is the task process's, which it forks there and which runs Python on
 * it (whose stack checks then see a real stack). We wait until it has
 * executed ci-zygote-init, or failed. Every signal is blocked meanwhile: a
 * handler of ours must not run on its stack, nor in it. */
__attribute__((noinline)) static pid_t spare_clone(struct spare_start *a)
{
    char stack[SPARE_INIT_STACK] __attribute__((aligned(16)));
    /* Raw: glibc's sigprocmask leaves its own signals (32, 33) unblocked,
     * whose handlers would run on the child's stack in our memory. */
    uint64_t all = ~(uint64_t)0, old = 0;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &old, sizeof(all));
    pid_t pid = clone(spare_init_start, stack + sizeof(stack),
                      (int)(z.s.clone_flags | CLONE_VM | CLONE_VFORK | SIGCHLD), a);
    int e = errno;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old, NULL, sizeof(old));
    __asm__ volatile("" : : "r"(stack) : "memory"); /* the array lives until here */
    errno = e;
    return pid;
}

/* ---------------------------------------------------------------------- */
/* The zygote                                                              */
/* ---------------------------------------------------------------------- */

/* Our heap (what malloc() got from brk() as the runtime was imported) in
 * huge pages wherever a whole aligned 2 MiB of it lies: a fork then copies
 * one page table entry per 2 MiB instead of 512, and an exit tears down as
 * few; a child's first write splits only the 2 MiB it touches and copies
 * 4 KiB. Not the nameless mappings (Python's arenas, numpy's buffers):
 * collapsed too, they gained nothing in a fan-out and cost matplotlib tasks
 * 3-11% (issue 16, two --compare runs): tasks write all over them. Best effort:
 * without MADV_COLLAPSE (Linux < 6.1), THP, or a free huge page, the memory
 * stays in small pages. Returns the first errno, 0 if every range
 * collapsed; *ret_kb: how much did. */
static int collapse_heap(int64_t *ret_kb)
{
    *ret_kb = 0;
    FILE *maps = fopen("/proc/self/maps", "re");
    if (!maps)
        return errno;
    const uintptr_t huge = (uintptr_t)2 << 20;
    char line[512];
    int first = 0;
    bool at_start = true; /* line begins a line of the file (one may be longer) */
    while (fgets(line, sizeof(line), maps)) {
        bool starts = at_start;
        at_start = strchr(line, '\n') != NULL;
        if (!starts)
            continue;
        uintptr_t lo, hi;
        char perms[5];
        int at = 0;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %4s %*s %*s %*s%n", &lo, &hi, perms, &at) < 3 ||
            !at)
            continue;
        const char *name = line + at + strspn(line + at, " \t");
        if (perms[1] != 'w' || perms[3] != 'p' || strncmp(name, "[heap]", 6) != 0)
            continue;
        uintptr_t a = (lo + huge - 1) & ~(huge - 1), b = hi & ~(huge - 1);
        if (b <= a)
            continue;
        if (madvise((void *)a, b - a, MADV_COLLAPSE) == 0)
            *ret_kb += (int64_t)((b - a) >> 10);
        else if (!first)
            first = errno;
    }
    fclose(maps);
    return first;
}

/* N of the "key N kB" line of a /proc file, 0 when it has none. */
static int64_t proc_kb(const char *path, const char *key)
{
    FILE *f = fopen(path, "re");
    char line[256];
    int64_t kb = 0;
    size_t len = strlen(key);
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, key, len) == 0 && sscanf(line + len, "%" SCNd64, &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb;
}

static void send_status(uint32_t type, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void send_status(uint32_t type, int err, const char *fmt, ...)
{
    struct zmsg_status st;
    memset(&st, 0, sizeof(st));
    st.type = type;
    st.err = err;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st.text, sizeof(st.text), fmt, ap);
    va_end(ap);
    if (type == ZMSG_READY) {
        st.huge_kb = proc_kb("/proc/self/smaps_rollup", "AnonHugePages:");
        st.collapse_err = z.collapse_err;
        st.collapsed_kb = z.collapsed_kb;
        st.rss_kb = proc_kb("/proc/self/status", "VmRSS:");
    }
    ssize_t r;
    do
        r = send(ZYGOTE_FD_REQ, &st, sizeof(st), MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
}

__attribute__((noreturn)) static void fail(int err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

__attribute__((noreturn)) static void fail(int err, const char *fmt, ...)
{
    char text[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    send_status(ZMSG_FAILED, err, "%s", text);
    _exit(1);
}

/* Reads SETUP: a small message carrying a sealed memfd with the plan. */
static void read_setup(void)
{
    struct pollfd p = {.fd = ZYGOTE_FD_REQ, .events = POLLIN};
    if (poll(&p, 1, SETUP_TIMEOUT_MS) != 1)
        fail(ETIMEDOUT, "no setup message from the worker");
    struct zmsg_setup m;
    int fds[2] = {-1, -1}, got = 0; /* the plan, ci-zygote-init */
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } cm;
    struct iovec iov = {.iov_base = &m, .iov_len = sizeof(m)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                        .msg_controllen = sizeof(cm.buf)};
    ssize_t n = recvmsg(ZYGOTE_FD_REQ, &mh, MSG_CMSG_CLOEXEC);
    for (struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS)
            for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                if (got < 2)
                    fds[got++] = fd;
                else
                    close(fd);
            }
    if (n != (ssize_t)sizeof(m) || m.type != ZMSG_SETUP || got != 2 ||
        (mh.msg_flags & MSG_CTRUNC))
        fail(EPROTO, "a malformed setup message");
    if (m.version != ZYGOTE_PROTO_VERSION)
        fail(EPROTO, "setup version %u, this zygote speaks %u", m.version,
             ZYGOTE_PROTO_VERSION);
    char *blob, why[200];
    if (zsetup_read(fds[0], m.size, &blob, &z.s, why, sizeof(why)) != 0)
        fail(errno, "%s", why);
    /* blob is kept for the zygote's life: ops point into it. The memfd too:
     * each spare's init reads it again after its exec. */
    z.setup_fd = fds[0];
    z.init_prog = fds[1];
    struct stat st;
    if (fstat(z.init_prog, &st) != 0 || !S_ISREG(st.st_mode))
        fail(EPROTO, "the setup's small init is not a regular file");
    if (z.s.uid_block) {
        struct __user_cap_header_struct ch = {.version = _LINUX_CAPABILITY_VERSION_3};
        struct __user_cap_data_struct cd[2];
        memset(cd, 0, sizeof(cd));
        if (syscall(SYS_capget, &ch, cd) != 0 || !(cd[0].effective >> CAP_SETUID & 1) ||
            !(cd[0].effective >> CAP_SETGID & 1))
            fail(EPERM, "task uids need CAP_SETUID and CAP_SETGID in the zygote's namespace");
    }
}

/* The first line of the pending Python exception, then the whole traceback
 * on stderr (the worker keeps its tail). */
static void python_fail(const char *what)
{
    char text[300] = "unknown error";
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    PyObject *s = value ? PyObject_Str(value) : NULL;
    const char *c = s ? PyUnicode_AsUTF8(s) : NULL;
    const char *name = type ? ((PyTypeObject *)type)->tp_name : "error";
    snprintf(text, sizeof(text), "%s: %.200s", name, c ? c : "");
    Py_XDECREF(s);
    PyErr_Restore(type, value, tb);
    PyErr_Print();
    fflush(stderr);
    fail(0, "%s: %s", what, text);
}

static void python_start(void)
{
    /* The configuration `python3 -I -B -c ...` gets from its command line:
     * isolated, no bytecode written, the locale and UTF-8 handling of a
     * normal start, sys.executable the interpreter the cold path runs. */
    char *argv[] = {"python3", "-I", "-B", "-c", "pass", NULL};
    PyPreConfig pre;
    PyPreConfig_InitPythonConfig(&pre);
    PyStatus st = Py_PreInitializeFromBytesArgs(&pre, 5, argv);
    if (PyStatus_Exception(st))
        fail(0, "python pre-initialization failed: %s", st.err_msg ? st.err_msg : "?");
    PyConfig cfg;
    PyConfig_InitPythonConfig(&cfg);
    st = PyConfig_SetBytesString(&cfg, &cfg.program_name, z.s.python);
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesArgv(&cfg, 5, argv);
    if (!PyStatus_Exception(st))
        st = Py_InitializeFromConfig(&cfg);
    PyConfig_Clear(&cfg);
    if (PyStatus_Exception(st))
        fail(0, "python initialization failed: %s", st.err_msg ? st.err_msg : "?");

    /* The driver as a module that does not run: `__name__` is not __main__.
     * Compiled as "<string>" like `python3 -c`: its frames stay out of the
     * tracebacks the code sees. */
    PyObject *code = Py_CompileString(ci_driver_py, "<string>", Py_file_input);
    if (!code)
        python_fail("the driver does not compile");
    PyObject *mod = PyModule_New("ci_driver");
    PyObject *dict = mod ? PyModule_GetDict(mod) : NULL;
    if (!dict || PyDict_SetItemString(dict, "__builtins__", PyEval_GetBuiltins()) != 0)
        python_fail("cannot create the driver's module");
    PyObject *r = PyEval_EvalCode(code, dict, dict);
    Py_DECREF(code);
    if (!r)
        python_fail("the driver failed to load");
    Py_DECREF(r);
    PyObject *prepare = PyDict_GetItemString(dict, "_warm_prepare");
    z.warm_main = PyDict_GetItemString(dict, "_warm_main");
    z.warm_up = PyDict_GetItemString(dict, "_warm_up");
    if (!prepare || !z.warm_main || !z.warm_up)
        fail(0, "the driver has no _warm_prepare, _warm_up or _warm_main");
    Py_INCREF(z.warm_main);
    Py_INCREF(z.warm_up);
    r = PyObject_CallNoArgs(prepare);
    if (!r)
        python_fail("the runtime could not be imported");
    Py_DECREF(r);
    /* mod stays alive: _warm_main's globals. */
}

/* The runtime must not keep a file open (but the two SETUP brought): every
 * child closes all fds but its five (move_fds), and a Python object still holding one would then use
 * whatever the task opens under that number. */
static void check_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        fail(errno, "cannot list /proc/self/fd");
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end = NULL;
        long fd = strtol(e->d_name, &end, 10);
        if (e->d_name[0] == '.' || !end || *end || fd < FD_COUNT || fd == dirfd(d) ||
            fd == z.setup_fd || fd == z.init_prog) /* ours, for each spare's init */
            continue;
        char path[64], target[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%ld", fd);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = '\0';
        fail(EBUSY, "the runtime left fd %ld open (%s): its children would inherit it", fd,
             target);
    }
    closedir(d);
}

/* Receives one SPAWN; 1 with rq filled, 0 at EOF, -1 for nothing usable. */
static int recv_request(struct task_req *rq)
{
    int r = child_recv_fds(ZYGOTE_FD_REQ, &rq->spawn, sizeof(rq->spawn), rq->fds, MSG_DONTWAIT);
    if (r == 1 && rq->spawn.type != ZMSG_SPAWN) {
        for (int i = 0; i < FD_COUNT; i++)
            close(rq->fds[i]);
        return -1;
    }
    return r;
}

/* The spares: inits cloned ahead of the next tasks, each with its task
 * process forked and warming up; z.s.spares of them, oldest (the warmest)
 * first, so that tasks coming together each find one and a task's critical
 * path has no fork of this big image and no first-call costs. */
static struct spare {
    pid_t pid;
    int sock; /* our end of its INIT_FD_ZYGOTE */
} spares[ZYGOTE_MAX_SPARES];
static uint32_t n_spares;

/* Forgets spare i (an idle one exits at the EOF, its task process with it). */
static void spare_drop(uint32_t i)
{
    close(spares[i].sock);
    memmove(&spares[i], &spares[i + 1], (n_spares - i - 1) * sizeof(spares[0]));
    n_spares--;
}

static void spare_drop_all(void)
{
    while (n_spares)
        spare_drop(n_spares - 1);
}

/* Clones one more spare; 0, or the step that failed (errno set). */
static enum step spare_make(unsigned long *children)
{
    /* fork() copies one thread: a second one (a library's pool) would leave
     * its locks held in every child. Then this zygote must go. */
    if (count_threads(z.task_dir) != 1) {
        errno = EBUSY;
        return STEP_ZYGOTE_THREADS;
    }
    uint32_t uid = 0;
    if (z.s.uid_block) {
        while (uid < z.s.uid_block && uid_holder[uid])
            uid++;
        if (uid == z.s.uid_block) {
            errno = EAGAIN;
            return STEP_MAPS;
        }
    }
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) != 0)
        return STEP_ZYGOTE_CLONE;
    struct spare_start start = {.sock = sp[1]};
    pid_t pid = spare_clone(&start);
    int e = errno;
    close(sp[1]);
    if (pid < 0) {
        close(sp[0]);
        errno = e;
        return STEP_ZYGOTE_CLONE;
    }
    if (start.step) { /* it failed before its exec, and has exited */
        (*children)++;
        close(sp[0]);
        errno = start.err;
        return (enum step)start.step;
    }
    (*children)++;
    if (z.s.uid_block) {
        uid_holder[uid] = pid; /* until we reap it, whatever happens now */
        /* It asks once it is dumpable (its /proc files ours to write). */
        struct pollfd p = {.fd = sp[0], .events = POLLIN};
        char ask;
        if (poll(&p, 1, SPARE_MAP_TIMEOUT_MS) != 1 || recv(sp[0], &ask, 1, 0) != 1 ||
            write_spare_maps(pid, TASK_IDS_INSIDE + uid) != 0 ||
            send(sp[0], "m", 1, MSG_NOSIGNAL) != 1) {
            e = errno;
            kill(pid, SIGKILL);
            close(sp[0]);
            errno = e;
            return STEP_MAPS;
        }
    }
    spares[n_spares++] = (struct spare){.pid = pid, .sock = sp[0]};
    return STEP_NONE;
}

/* Makes spares until there are z.s.spares; 0, or the step that failed. */
static enum step spares_fill(unsigned long *children)
{
    enum step failed = STEP_NONE;
    while (n_spares < z.s.spares && (failed = spare_make(children)) == STEP_NONE)
        ;
    return failed;
}

/* Hands one task to the oldest spare (one made now if there is none, the
 * next if it died meanwhile), then makes spares up to z.s.spares again. */
static void spawn(const struct task_req *rq, unsigned long *children, bool *broken)
{
    enum step failed = STEP_NONE;
    for (uint32_t attempt = 0; attempt < z.s.spares + 1; attempt++) {
        if (!n_spares && (failed = spare_make(children)) != STEP_NONE)
            break;
        if (child_send_fds(spares[0].sock, &rq->spawn, sizeof(rq->spawn), rq->fds, FD_COUNT) == 0) {
            spare_drop(0); /* it is the task's init now */
            failed = spares_fill(children);
            if (failed == STEP_ZYGOTE_THREADS)
                *broken = true;
            return;
        }
        failed = STEP_ZYGOTE_CLONE; /* it died (its warm-up failed?): another one */
        spare_drop(0);
    }
    struct msg m = {.type = MSG_FAILED, .step = failed, .err = errno};
    child_send(rq->fds[FD_SOCK], &m);
    if (failed == STEP_ZYGOTE_THREADS)
        *broken = true;
}

__attribute__((noreturn)) static void serve(void)
{
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, NULL);
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        fail(errno, "signalfd");
    bool closing = false;
    unsigned long children = 0;
    if (spares_fill(&children) == STEP_ZYGOTE_THREADS)
        closing = true;
    for (;;) {
        if (closing && children == 0)
            _exit(0);
        struct pollfd p[2] = {{.fd = closing ? -1 : ZYGOTE_FD_REQ, .events = POLLIN},
                              {.fd = sfd, .events = POLLIN}};
        if (poll(p, 2, closing ? 1000 : -1) < 0)
            continue; /* EINTR */
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
            ;
        pid_t pid;
        while ((pid = waitpid(-1, NULL, WNOHANG | __WALL)) > 0) {
            if (children)
                children--;
            for (uint32_t u = 0; u < z.s.uid_block; u++)
                if (uid_holder[u] == pid)
                    uid_holder[u] = 0; /* its namespace, and every process in it, is gone */
            for (uint32_t i = 0; i < n_spares; i++)
                if (spares[i].pid == pid) {
                    spare_drop(i); /* the next task makes another */
                    break;
                }
        }
        if (closing || !(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        struct task_req rq;
        int r = recv_request(&rq);
        if (r == 0) {
            closing = true;
            spare_drop_all();
            continue;
        }
        if (r < 0)
            continue;
        bool broken = false;
        spawn(&rq, &children, &broken);
        for (int i = 0; i < FD_COUNT; i++)
            close(rq.fds[i]);
        if (broken) {
            closing = true; /* the worker sees our exit and starts another zygote */
            spare_drop_all();
        }
    }
}

/* Our /tmp (matplotlib's cache dir, which its import needs writable)
 * would lie beneath every task's: a task's mount namespace is a copy the
 * kernel locks, where nothing could detach it. Our imports are done:
 * detach it now and give up CAP_SYS_ADMIN, which our init left us for
 * this only (init.c, zygote_exec). */
static void detach_own_tmp(void)
{
    if (umount2("/tmp", MNT_DETACH) != 0)
        fail(errno, "cannot detach the runtime's own /tmp");
    uint64_t keep = z.s.uid_block ? (1ull << CAP_SETUID) | (1ull << CAP_SETGID) : 0;
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    if ((keep ? sys_capset_keep(keep) : sys_capset_zero()) != 0)
        fail(errno, "cannot drop CAP_SYS_ADMIN");
}

int main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    /* fd 0 is our own program (the worker's O_PATH fd): stdin is /dev/null. */
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || dup2(null, 0) < 0)
        fail(errno, "cannot open /dev/null");
    close(null);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    read_setup();
    python_start();
    /* What the imports and the exercise freed goes back to the kernel: each
     * fork copies the page table entries of our anonymous memory, and each
     * exit tears them down (~1 MiB less here). */
    malloc_trim(0);
    z.collapse_err = collapse_heap(&z.collapsed_kb);
    check_fds();
    z.task_dir = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    detach_own_tmp();
    int threads = count_threads(z.task_dir);
    if (threads != 1)
        fail(EBUSY, "the runtime started %d threads; a zygote must have exactly one "
             "(OPENBLAS_NUM_THREADS and friends must be 1)", threads);
    /* Once and for all: every child is forked from this state. */
    PyOS_BeforeFork();
    send_status(ZMSG_READY, 0, "%s", "");
    serve();
}
