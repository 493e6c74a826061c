/* init.c - ci-zygote-init: the init (pid 1) of each warm task, a small
 * static program. See src/zygote/main.c for the whole picture.
 *
 * The zygote clones a spare's init with CLONE_VM|CLONE_VFORK and the task's
 * namespaces: on the zygote's memory, with raw system calls only, that child
 * forks the task process (a copy of the zygote, which warms up) and then
 * executes this program through an fd the worker opened (O_PATH, like
 * ci-zygote's own; close-on-exec, so it is gone here and the task process
 * closed its copy). So pid 1 holds no copy of the ~100 MB runtime: no page
 * tables to copy for it at each spawn, none to tear down when it exits.
 *
 * It starts with the zygote's 0-2 (/dev/null, /dev/null, the zygote's
 * stderr), INIT_FD_ZYGOTE, INIT_FD_CHAN and INIT_FD_SETUP (zsetup.h), its
 * arguments (the protocol, which must be its own; "u" when the zygote
 * writes its maps, else "-"; the task process's pid), every signal blocked
 * and every namespace capability ambient (its uid is not mapped yet:
 * nothing else would survive the exec; it clears them at once). From there
 * it does what a spare's init did when
 * it was a copy of the zygote: its maps, then, once a SPAWN comes, what a
 * cold init does (HELLO with pidfds, mounts, READY, GO), then it hands the
 * task's fds to the task process and reaps.
 *
 * Never built with the sanitizers (as ci-zygote): static, no allocation
 * after the setup is read. */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static struct zsetup zs;

/* One task: the request and its fds. */
struct task_req {
    struct zmsg_spawn spawn;
    int fds[FD_COUNT];
};

/* After kill(-1): is the task's keeper all that is left in the namespace
 * but us? Our /proc is the namespace's (a process stays in it until reaped). */
static bool only_keeper_left(pid_t keeper)
{
    char buf[1024];
    bool other = false;
    int dir = keeper > 0 ? open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    if (dir < 0)
        return false;
    for (;;) {
        long got = syscall(SYS_getdents64, dir, buf, sizeof(buf));
        if (got <= 0) {
            other = other || got < 0;
            break;
        }
        for (long off = 0; off < got;) {
            unsigned short reclen;
            memcpy(&reclen, buf + off + 16, sizeof(reclen)); /* d_reclen in linux_dirent64 */
            const char *name = buf + off + 19;
            off += reclen;
            if (name[0] < '0' || name[0] > '9')
                continue;
            long pid = strtol(name, NULL, 10);
            if (pid != 1 && pid != keeper)
                other = true;
        }
    }
    close(dir);
    return !other;
}

/* Adds the keeper's CPU time so far to done: its exit is not waited for
 * (see reap_all), but it runs in the code's memory, so code that patches
 * the instructions it sleeps on can make it compute, and that time is the
 * task's. Read from /proc/<keeper>/stat (utime and stime, fields 14-15).
 * Called once it has its SIGKILL: what it adds after that is its exit. */
static void add_keeper_cpu(pid_t keeper, struct msg *done)
{
    char path[32];
    unsigned long long ticks[2]; /* utime, stime */
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)keeper);
    long hz = sysconf(_SC_CLK_TCK);
    if (hz <= 0 || child_stat_fields(path, 14, 2, ticks) != 0)
        return;
    done->utime_us += (int64_t)(ticks[0] * 1000000 / (unsigned long long)hz);
    done->stime_us += (int64_t)(ticks[1] * 1000000 / (unsigned long long)hz);
}

/* As init.c's reap_all() (the cold one): reap until the task is gone or the
 * worker says stop (a signal from outside the namespace), kill what is left,
 * report. Everything but the task's keeper is reaped first, so that the
 * report counts it; the keeper's exit (the task's memory going away) is not
 * waited for. note: the task process's CPU time before its task, not
 * reported, and its keeper. */
__attribute__((noreturn)) static void reap_all(pid_t task, struct task_note note)
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
            if (r < 0)
                goto report;
            if (r == 0)
                break;
            child_add_rusage(&done, &ru);
            if (r == note.keeper)
                note.keeper = 0; /* gone early (the code killed it): nothing to skip */
            if (r == task) {
                done.utime_us -= note.utime_us < done.utime_us ? note.utime_us : done.utime_us;
                done.stime_us -= note.stime_us < done.stime_us ? note.stime_us : done.stime_us;
                done.status = st;
                task_done = true;
            }
        }
        if (task_done || stopping) {
            stopping = true;
            kill(-1, SIGKILL);
            if (task_done && only_keeper_left(note.keeper)) {
                add_keeper_cpu(note.keeper, &done);
                goto report;
            }
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

/* Writes "1000 1000 1": the zygote's sandbox user is ours, nobody else.
 * Dumpable meanwhile, which makes these files ours to write. */
static int write_own_maps(void)
{
    char map[32];
    int n = snprintf(map, sizeof(map), "%d %d 1\n", SANDBOX_ID, SANDBOX_ID);
    if (n <= 0 || (size_t)n >= sizeof(map))
        return -1;
    prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
    int rc = child_write_file("/proc/self/setgroups", "deny\n", 5, 0);
    if (rc == 0)
        rc = child_write_file("/proc/self/uid_map", map, (size_t)n, 0);
    if (rc == 0)
        rc = child_write_file("/proc/self/gid_map", map, (size_t)n, 0);
    int e = errno;
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    errno = e;
    return rc;
}

/* Is our child task gone (not reaped: its pid stays ours)? */
static bool task_gone(pid_t task)
{
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    return waitid(P_PID, (id_t)task, &si, WEXITED | WNOHANG | WNOWAIT) != 0 || si.si_pid == task;
}

int main(int argc, char **argv)
{
    /* First: the exec made us dumpable, and our /proc files the uid's. */
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    /* The capabilities came as ambient ones: ours now, for nothing after. */
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0); /* dies with the zygote */
    /* What the zygote ignored stays ignored across the exec: default here. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            sigaction(sig, &dfl, NULL);
    sigset_t waited;
    sigemptyset(&waited);
    sigaddset(&waited, SIGCHLD);
    sigaddset(&waited, SIG_STOP);
    sigprocmask(SIG_SETMASK, &waited, NULL);
    /* ci-zygote-init PROTO u|- TASK_PID (main.c, spare_init_start) */
    char *end = NULL;
    long task_l = argc == 4 ? strtol(argv[3], &end, 10) : 0;
    if (task_l <= 0 || !end || *end)
        _exit(1);
    pid_t task = (pid_t)task_l;
    bool zygote_maps = strcmp(argv[2], "u") == 0;

    /* A failure before the SPAWN is told to the task it would have served. */
    enum step failed = STEP_NONE;
    int failed_err = 0, chan = INIT_FD_CHAN;
    struct stat st;
    char *blob, why[200];
    if (strcmp(argv[1], INIT_ARG_PROTO) != 0) { /* not the zygote's build */
        failed = STEP_ZYGOTE_INIT;
        failed_err = EPROTO;
    } else if (fstat(INIT_FD_SETUP, &st) != 0 ||
        zsetup_read(INIT_FD_SETUP, (uint64_t)st.st_size, &blob, &zs, why, sizeof(why)) != 0) {
        failed = STEP_ZYGOTE_INIT;
        failed_err = errno;
    }
    close(INIT_FD_SETUP);

    if (zygote_maps) { /* even after a failure: the zygote waits for the ask */
        /* The zygote writes our maps (spare_make): dumpable for that (our
         * /proc files are then ours, which is its uid), we ask with a byte
         * and a byte says done. We are INIT_ID from then on, as the zygote
         * is, outside. */
        prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
        if (send(INIT_FD_ZYGOTE, "m", 1, MSG_NOSIGNAL) != 1 || !child_wait_byte(INIT_FD_ZYGOTE))
            _exit(1);
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    } else if (!failed && write_own_maps() != 0) {
        failed = STEP_MAPS;
        failed_err = errno;
    }
    /* The task process waits for its ids before it warms up; without
     * them it has nothing to do (EOF: it exits). */
    if (failed || send(chan, "m", 1, MSG_NOSIGNAL) != 1) {
        close(chan);
        chan = -1;
    }

    /* Wait for a task; a task process that dies first leaves nothing to
     * offer: go, the zygote makes another spare. */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    /* After a failure the task process has gone (EOF on its channel): we
     * stay for the SPAWN, to tell its task why. */
    int sfd = failed ? -1 : signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    for (;;) {
        struct pollfd p[2] = {{.fd = INIT_FD_ZYGOTE, .events = POLLIN},
                              {.fd = sfd, .events = POLLIN}};
        if (poll(p, 2, -1) < 0)
            continue; /* EINTR */
        if (p[1].revents & POLLIN) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
                ;
            if (task_gone(task))
                _exit(1);
        }
        if (p[0].revents)
            break;
    }
    struct task_req rq;
    if (child_recv_fds(INIT_FD_ZYGOTE, &rq.spawn, sizeof(rq.spawn), rq.fds, 0) != 1)
        _exit(0); /* EOF: the zygote retires */
    if (rq.spawn.type != ZMSG_SPAWN || child_move_fds(rq.fds, chan) != 0)
        child_fail(rq.fds[FD_SOCK], STEP_FDS, 0, errno);
    if (chan >= 0) { /* the note: the task process stops warming up */
        char note = 1;
        ssize_t w = send(FD_COUNT, &note, 1, MSG_NOSIGNAL);
        (void)w;
    }
    if (failed)
        child_fail(FD_SOCK, failed, 0, failed_err);
    if (task_gone(task))
        child_fail(FD_SOCK, STEP_FORK, 0, ECHILD);

    /* HELLO with pidfds: the worker learns our pid and the task process's
     * in its namespace, signals us without racing a reused pid, and puts
     * both in the task's cgroup (moving init would not move its child). */
    int pfd[2] = {sys_pidfd_open(getpid()), sys_pidfd_open(task)};
    if (pfd[0] < 0 || pfd[1] < 0)
        child_fail(FD_SOCK, STEP_HELLO, 0, errno);
    struct msg hello = {.type = MSG_HELLO};
    if (child_send_fds(FD_SOCK, &hello, sizeof(hello), pfd, 2) != 0)
        _exit(1);
    close(pfd[0]);
    close(pfd[1]);
    if (!child_wait_byte(FD_SOCK)) /* we and the task process are in the task's cgroup now */
        _exit(1);
    if (zs.cgroupns)
        (void)unshare(CLONE_NEWCGROUP); /* a view only, as in init.c */
    if (sys_setresgid(SANDBOX_ID) != 0)
        child_fail(FD_SOCK, STEP_SETGID, 0, errno);
    /* What we create below is the code's (1000); with task uids we stay
     * INIT_ID otherwise, out of the code's reach, as a cold init does. */
    if ((zs.uid_block ? syscall(SYS_setresuid, INIT_ID, SANDBOX_ID, INIT_ID)
                      : sys_setresuid(SANDBOX_ID)) != 0)
        child_fail(FD_SOCK, STEP_SETUID, 0, errno);
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);

    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        child_fail(FD_SOCK, STEP_PRIVATE, 0, errno);
    for (size_t i = 0; i < zs.n_ops; i++)
        if (child_run_op(&zs.ops[i]) != 0)
            child_fail(FD_SOCK, STEP_OP, (int)i, errno);
    if (sethostname("sandbox", 7) != 0 || setdomainname("sandbox", 7) != 0)
        child_fail(FD_SOCK, STEP_HOSTNAME, 0, errno);
    if (zs.inotify[0][0]) /* best effort, as in init.c */
        (void)child_limit_inotify(zs.inotify[0], zs.inotify[1]);
    uint64_t keep = 0;
    if (zs.uid_block) {
        if (sys_setresuid(INIT_ID) != 0)
            child_fail(FD_SOCK, STEP_SETUID, 0, errno);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        keep = 1ull << CAP_KILL; /* kill(-1) must reach the code's uid */
    }

    child_ready_then_go(FD_SOCK, -1, keep); /* HELLO had the pidfds */

    /* The task process takes it from here, with the task's fds and limits. */
    static const int all[FD_COUNT] = {0, 1, 2, 3, 4};
    if (child_send_fds(FD_COUNT, &rq.spawn, sizeof(rq.spawn), all, FD_COUNT) != 0)
        child_fail(FD_SOCK, STEP_FORK, 0, errno);
    for (int fd = 0; fd < FD_SOCK; fd++)
        close(fd);
    /* Its note comes before any task code runs (or never: it died). */
    struct task_note note = {0};
    ssize_t got;
    do
        got = recv(FD_COUNT, &note, sizeof(note), 0);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof(note) || note.utime_us < 0 || note.stime_us < 0 || note.keeper < 0)
        note = (struct task_note){0};
    close(FD_COUNT);
    reap_all(task, note);
}
