/* run.c - a run from the worker's side, up to GO and after its end: the
 * channels (the control socket, the code socket, three pipes, a cancel
 * eventfd), the task's rlimits and cgroup, the clone of init (or of the
 * bare child), the uid and gid maps, READY, the inputs written through the
 * /workspace fd, GO; the messages init sends; freeing a run. io.c runs it
 * from GO to its end; warm.c starts it in a zygote instead of a clone. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/text.h"
#include "core/util.h"
#include "sandbox/sandbox_int.h"
#include "sandbox/sched.h"
#include "sandbox/sys.h"

/* Signals init: by pidfd when it is a zygote's child (never a reused pid). */
void signal_init(struct ci_sandbox_run *run, int sig)
{
    if (run->warm)
        sys_pidfd_send_signal(run->pidfd, sig);
    else
        kill(run->pid, sig);
}

/* Has init ended, within timeout_ms? By its pidfd, which reaps nothing:
 * the only way for a zygote's child (not ours to wait for). */
bool init_exited(const struct ci_sandbox_run *run, int timeout_ms)
{
    struct pollfd p = {.fd = run->pidfd, .events = POLLIN};
    int r;
    do
        r = poll(&p, 1, timeout_ms);
    while (r < 0 && errno == EINTR);
    return r != 0;
}

/* Has init (or the bare task) ended? Never blocks, reaps nothing. */
bool run_exited(const struct ci_sandbox_run *run)
{
    if (run->warm)
        return init_exited(run, 0);
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    if (waitid(P_PID, (id_t)run->pid, &si, WEXITED | WNOHANG | WNOWAIT | __WALL) != 0)
        return errno == ECHILD;
    return si.si_pid == run->pid;
}

/* A warm init's exit waits for the task's keeper, which tears the task's
 * memory down at SCHED_IDLE (sb->keeper_idle): whoever waits for that exit
 * puts it back to the normal policy first, or a machine with no idle CPU
 * would hold the wait for seconds. The code's own processes at SCHED_IDLE,
 * dying of SIGKILL as well, go back with it. */
void promote_keeper(const struct ci_sandbox_run *run)
{
    if (run->warm && run->sb->keeper_idle && run->pid > 0)
        sched_promote_idle(run->pid, run->pidfd, 1);
}

/* Kills and reaps whatever of the run is still alive (start failed, the
 * run is freed without a wait, or the sandbox stops with it stuck). A
 * process that SIGKILL cannot end (frozen by the cgroup v1 freezer, stuck in
 * the kernel) would hold this for ever: init is waited for at most
 * KILL_FREE_MS, then left as it is. A warm one is its zygote's to reap; a
 * cold one stays unreaped (run->pid > 0): its pid stays ours, so nothing
 * else can get it, and ci_sandbox_run_free keeps its task uid. */
#define KILL_FREE_MS 5000
#define KEEPER_IDLE_MS 100 /* the reaper's wait for a keeper at SCHED_IDLE, then it is put back */
void run_kill_now(struct ci_sandbox_run *run)
{
    if (run->pid <= 0)
        return;
    if (run->warm) {
        /* SIGKILL on init kills its pid namespace; its zygote reaps it.
         * Its exit waits for the task's keeper (promote_keeper): the
         * reaper, beside the next tasks, leaves it idle for a while; a
         * slot, whose next task waits, does not. */
        signal_init(run, SIGKILL);
        int idle_ms = run->reaper_frees && run->sb->keeper_idle ? KEEPER_IDLE_MS : 0;
        if (!idle_ms || !init_exited(run, idle_ms)) {
            promote_keeper(run);
            init_exited(run, KILL_FREE_MS - idle_ms);
        }
        run->pid = 0;
        return;
    }
    kill(run->pid, SIGKILL);
    if (!run->sb->ns)
        kill(-run->pid, SIGKILL);
    /* Bare mode waits as before: the job's bare_hooks must be called now. */
    if (run->sb->ns && run->pidfd >= 0 && !init_exited(run, KILL_FREE_MS))
        return;
    while (waitpid(run->pid, NULL, __WALL) < 0 && errno == EINTR)
        ;
    run->pid = 0;
    if (!run->sb->ns)
        bare_task_reaped(run);
}

void bare_task_reaped(struct ci_sandbox_run *run)
{
    void (*ended)(void *) = run->bare_hooks.ended;
    run->bare_hooks.ended = NULL;
    if (ended)
        ended(run->bare_hooks.ctx);
}

/* What a run reads and writes through: the pipes, the socket, the workspace. */
void run_close_io(struct ci_sandbox_run *run)
{
    close_fd(&run->sock);
    close_fd(&run->code_fd);
    close_fd(&run->out_fd);
    close_fd(&run->err_fd);
    close_fd(&run->rep_fd);
    close_fd(&run->ws_fd); /* the last reference to the workspace tmpfs */
    for (int i = 0; i < FD_COUNT; i++)
        close_fd(&run->args.fds[i]);
}

/* The end of a run: every fd but the cancel eventfd (cancel() may still be
 * called until the run is freed) and the bare-mode directory. */
void run_close(struct ci_sandbox_run *run)
{
    run_close_io(run);
    close_fd(&run->pidfd);
    ci_cgroup_free(run->cg); /* namespace mode: init is dead, and with it the run */
    run->cg = NULL;
    /* Bare mode: the task's process group is dead; what left it (setsid)
     * is dead too only if the job's bare_hooks swept it (ci-executor). The
     * ci-worker's no-isolation fallback has none: such a process may still
     * write here while the tree is removed (SECURITY.md). */
    if (run->bare_dir) {
        if (run->bare_dir_fd >= 0)
            remove_tree_at(run->bare_dir_fd, 0);
        rmdir(run->bare_dir);
        free(run->bare_dir);
        run->bare_dir = NULL;
    }
    close_fd(&run->bare_dir_fd);
}

void ci_sandbox_run_free(struct ci_sandbox_run *run)
{
    if (!run)
        return;
    /* Its processes did not exit after SIGKILL: the sandbox's thread
     * frees it once they have, which no slot waits for (reaper.c). */
    if (run->stuck && reaper_take_stuck(run))
        return;
    run_kill_now(run);
    /* A cold init that did not exit within run_kill_now's bound: as a
     * stuck run, its pidfd and cgroup still open, so that it is reaped,
     * its cgroup removed and its uid given back once it exits. */
    if (run->pid > 0 && run->sb->ns && !run->stuck) {
        run->stuck = true;
        if (reaper_take_stuck(run))
            return;
        run->stuck = false;
    }
    bool reaped = run->pid <= 0;
    run_close(run);
    /* Every process of the run is dead; else its uid is never handed out
     * again: a process that may still run has it. */
    if (reaped)
        uids_give_cold(&run->sb->uids, run->uid_slot);
    close_fd(&run->wake_fd);
    for (size_t i = 0; i < sizeof(run->bare_strs) / sizeof(run->bare_strs[0]); i++)
        free(run->bare_strs[i]);
    for (size_t i = 0; i < MAX_ENV; i++)
        free(run->bare_env[i]);
    for (size_t i = 0; i < run->n_inputs; i++)
        free(run->inputs[i].name);
    free(run->inputs);
    for (size_t i = 0; i < run->n_restored; i++)
        free(run->restored[i].name);
    free(run->restored);
    free(run->code);
    free(run);
}

static void set_limit(struct child_args *a, int res, rlim_t soft, rlim_t hard)
{
    a->limits[res].rlim_cur = soft;
    a->limits[res].rlim_max = hard;
    a->limit_set[res] = true;
}

/* Threads of this process ("Threads:" of /proc/self/status); 0 when
 * unknown. */
static rlim_t own_threads(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (!f)
        return 0;
    char line[256];
    unsigned long n = 0;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, "Threads:", 8) == 0) {
            n = strtoul(line + 8, NULL, 10);
            break;
        }
    fclose(f);
    return (rlim_t)n;
}

/* Without a memory cgroup RLIMIT_AS is the memory limit: blunt (it counts
 * address space, and numpy+pandas+matplotlib need ~384 MB of it just to
 * import) but it turns an allocation past the limit into a MemoryError.
 * With the cgroup, which counts what is really used, it is only generous:
 * twice the limit plus 2 GiB. Measured: 32 threads of pandas map 1.3 GB
 * with 68 MB resident (thread stacks, malloc arenas), so any tighter cap
 * would refuse honest code; a single allocation far beyond the limit still
 * fails at once as a MemoryError with a traceback instead of an OOM kill. */
static void plan_limits(struct child_args *a, const struct ci_sandbox *sb,
                        const struct ci_job *job)
{
    const struct ci_config *cfg = sb->cfg;
    const rlim_t MiB = 1024 * 1024;
    rlim_t cpu_s = (job->timeout_ms + 999) / 1000 + 1;
    uint32_t biggest_fs = cfg->local.workspace_mb > cfg->local.tmp_mb ? cfg->local.workspace_mb
                                                                       : cfg->local.tmp_mb;
    rlim_t as = (rlim_t)job->memory_mb * MiB;
    if (sb->ns && sb->cgroups)
        as = 2 * as + 2048 * MiB;
    set_limit(a, RLIMIT_AS, as, as);
    set_limit(a, RLIMIT_CPU, cpu_s, cpu_s + 1);
    /* One file may fill a tmpfs; the artifact cap is applied when the files
     * are collected (with a note), not as EFBIG on an intermediate file. */
    set_limit(a, RLIMIT_FSIZE, (rlim_t)biggest_fs * MiB, (rlim_t)biggest_fs * MiB);
    /* NPROC counts the processes (threads) of a real uid. In a user
     * namespace that is the sandbox's own (per-namespace counts since Linux
     * 5.14); bare, as root, the sandbox uid's. Bare and unprivileged the
     * task shares our uid, whose threads count too: max_processes above
     * our own threads now. Other processes of the uid, or threads we start
     * later, leave the task less, never more. */
    rlim_t nproc = cfg->local.max_processes;
    if (!sb->ns && !sb->outside_root)
        nproc += own_threads();
    set_limit(a, RLIMIT_NPROC, nproc, nproc);
    set_limit(a, RLIMIT_NOFILE, cfg->local.max_open_files, cfg->local.max_open_files);
    set_limit(a, RLIMIT_CORE, 0, 0);
    set_limit(a, RLIMIT_MEMLOCK, 64 * 1024, 64 * 1024);
    set_limit(a, RLIMIT_MSGQUEUE, 1024, 1024);
    set_limit(a, RLIMIT_RTPRIO, 0, 0);
    set_limit(a, RLIMIT_STACK, 8 * MiB, 8 * MiB);
    /* Queued signals are counted per user in each user namespace and again
     * for the namespace's owner (us): with no limit of its own a task could
     * queue up to ours and make every other task's sigqueue() fail. */
    set_limit(a, RLIMIT_SIGPENDING, 256, 256);
    set_limit(a, RLIMIT_LOCKS, 256, 256);
    if (!sb->ns) {
        /* Without namespaces, the rest too: no higher priority, no
         * real-time time. */
        set_limit(a, RLIMIT_NICE, 0, 0);
        set_limit(a, RLIMIT_RTTIME, 0, 0);
    }
}

/* A single path component the sandbox may write under: not '.' or '..', no
 * '/', and UTF-8 without control or format characters (core/text.h). */
bool plain_name(const char *name)
{
    size_t len = strlen(name);
    return len > 0 && len < 256 && !strchr(name, '/') && strcmp(name, ".") != 0 &&
           strcmp(name, "..") != 0 && ci_text_name_check(name, len, NULL) == CI_TEXT_OK;
}

/* Writes the inputs, and a session step's files, into the workspace through
 * its fd. The files are
 * created as the sandbox user (setfsuid is per thread): a root worker has
 * no mapping in the sandbox's user namespace and could not create them
 * itself, and the code must be able to overwrite its inputs. */
static ci_status write_inputs(struct ci_sandbox_run *run, const struct ci_job *job,
                              struct ci_error *err)
{
    const struct ci_sandbox *sb = run->sb;
    bool switch_fs = sb->outside_root;
    if (switch_fs) {
        sys_setfsgid(sb->outside_gid);
        sys_setfsuid(run->task_uid);
    }
    ci_status s = CI_OK;
    for (size_t i = 0; i < job->n_files && !s; i++) {
        const struct ci_file *f = &job->files[i];
        int fd = openat(run->ws_fd, f->name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                        0644);
        if (fd < 0) {
            s = errno == EEXIST
                    ? ci_error_set(err, CI_ERR_INVALID, "input '%s' is listed twice", f->name)
                    : ci_error_errno(err, CI_ERR_IO, errno, "cannot create input '%s'", f->name);
            break;
        }
        if (ci_write_all(fd, f->data, f->len) != CI_OK) {
            int e = errno;
            s = e == ENOSPC || e == EFBIG
                    ? ci_error_set(err, CI_ERR_LIMIT,
                                   "the inputs do not fit in the workspace of %u MiB",
                                   sb->cfg->local.workspace_mb)
                    : ci_error_errno(err, CI_ERR_IO, e, "cannot write input '%s'", f->name);
        }
        close(fd);
    }
    if (!s)
        s = session_write(run, job, err);
    if (switch_fs) {
        sys_setfsuid(0);
        sys_setfsgid(0);
    }
    return s;
}

static ci_status digest_inputs(struct ci_sandbox_run *run, const struct ci_job *job,
                               struct ci_error *err)
{
    if (!job->n_files)
        return CI_OK;
    run->inputs = calloc(job->n_files, sizeof(*run->inputs));
    if (!run->inputs)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < job->n_files; i++) {
        const struct ci_file *f = &job->files[i];
        if (!f->name || !plain_name(f->name))
            return ci_error_set(err, CI_ERR_INVALID, "input name '%s' is not a plain file name",
                                f->name ? f->name : "");
        run->inputs[i].name = strdup(f->name);
        if (!run->inputs[i].name)
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        ci_sha256_hex(f->data ? f->data : (const uint8_t *)"", f->len, run->inputs[i].sha256);
        run->n_inputs++;
    }
    return CI_OK;
}

/* Receives one message from the child within timeout_ms with up to n fds
 * (a READY carries the workspace fd, a HELLO two pidfds) into ret_fds[],
 * the rest -1; fds beyond n are closed. */
ci_status recv_msg_fds(int sock, int timeout_ms, struct msg *m, int *ret_fds, int n)
{
    for (int i = 0; i < n; i++)
        ret_fds[i] = -1;
    struct pollfd p = {.fd = sock, .events = POLLIN};
    int r;
    do
        r = poll(&p, 1, timeout_ms);
    while (r < 0 && errno == EINTR);
    if (r == 0)
        return CI_ERR_TIMEOUT;
    if (r < 0)
        return CI_ERR_SYS;
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } cm;
    struct iovec iov = {.iov_base = m, .iov_len = sizeof(*m)};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                        .msg_controllen = sizeof(cm.buf)};
    ssize_t got;
    do
        got = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
    if (got <= 0)
        return CI_ERR_IO; /* EOF: the child is gone */
    int fds[2], k = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (k < 2)
                fds[k++] = fd;
            else
                close(fd);
        }
    }
    bool ok = got == (ssize_t)sizeof(*m) && !(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC));
    for (int i = 0; i < k; i++) {
        if (ok && i < n)
            ret_fds[i] = fds[i];
        else
            close(fds[i]);
    }
    return ok ? CI_OK : CI_ERR_INTEGRITY;
}

/* As recv_msg_fds() with at most one fd; ret_fd may be NULL. */
ci_status recv_msg_on(int sock, int timeout_ms, struct msg *m, int *ret_fd)
{
    int fd;
    ci_status s = recv_msg_fds(sock, timeout_ms, m, &fd, 1);
    if (ret_fd)
        *ret_fd = fd;
    else if (fd >= 0)
        close(fd);
    return s;
}

ci_status recv_msg(struct ci_sandbox_run *run, int timeout_ms, struct msg *m,
                   int *ret_fd)
{
    return recv_msg_on(run->sock, timeout_ms, m, ret_fd);
}

/* The host pid behind a pidfd (its fdinfo), or -1. */
pid_t pidfd_pid(int pidfd)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", pidfd);
    if (child_read_small(path, buf, sizeof(buf)) != 0)
        return -1;
    const char *p = strstr(buf, "\nPid:");
    long pid = -1;
    if (p)
        pid = strtol(p + 5, NULL, 10);
    return pid > 0 ? (pid_t)pid : -1;
}

/* The uid that inside uid `inside` of pid's user namespace is here, read
 * from its uid_map (which shows the outside ids as the reader sees them),
 * or (uid_t)-1. */
uid_t outside_uid_of(pid_t pid, uid_t inside)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/uid_map", (int)pid);
    if (child_read_small(path, buf, sizeof(buf)) != 0)
        return (uid_t)-1;
    for (char *line = buf; *line;) {
        unsigned long first, lower, count;
        if (sscanf(line, "%lu %lu %lu", &first, &lower, &count) == 3 && inside >= first &&
            inside - first < count)
            return (uid_t)(lower + (inside - first));
        char *nl = strchr(line, '\n');
        if (!nl)
            break;
        line = nl + 1;
    }
    return (uid_t)-1;
}

/* The task process's OOM score: 1000, the first process its cgroup's OOM
 * killer takes. Written here, by a worker with CAP_SYS_RESOURCE, it is also
 * the lowest the code may set (the kernel's oom_score_adj_min, inherited by
 * its children): code cannot lower it to have init taken instead. Without
 * that capability the task raises its own score, and could lower it back:
 * best effort, as an OOM kill of init is still reported as what it is. */
void pin_oom_score(const struct ci_sandbox *sb, pid_t task)
{
    if (!sb->pin_oom || task <= 0)
        return;
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/oom_score_adj", (int)task);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t w = write(fd, "1000", 4);
    (void)w;
    close(fd);
}

/* Turns a MSG_FAILED into one sentence. */
void describe_failure(const struct ci_sandbox *sb, const struct msg *m, char *out,
                      size_t size)
{
    const char *what = m->step > 0 && m->step < STEP_COUNT ? step_names[m->step] : "set up";
    if (m->step == STEP_OP && m->op >= 0 && (size_t)m->op < sb->n_ops)
        what = sb->ops[m->op].what;
    char ebuf[128];
    snprintf(out, size, "%s: %s", what, strerror_r(m->err, ebuf, sizeof(ebuf)));
}

ci_status write_proc_file(pid_t pid, const char *name, const char *text,
                          struct ci_error *err)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return ci_error_errno(err, CI_ERR_UNSUPPORTED, errno,
                              "user namespaces are not usable: open %s", path);
    ssize_t w = write(fd, text, strlen(text));
    int e = errno;
    close(fd);
    if (w != (ssize_t)strlen(text))
        return ci_error_errno(err, CI_ERR_UNSUPPORTED, w < 0 ? e : EIO,
                              "user namespaces are not usable: writing '%.*s' to %s",
                              (int)strcspn(text, "\n"), text, path);
    return CI_OK;
}

static ci_status open_channels(struct ci_sandbox_run *run, struct ci_error *err)
{
    int sv[2], code[2], out[2], errp[2], rep[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "socketpair");
    run->sock = sv[0];
    run->args.fds[FD_SOCK] = sv[1];
    /* The code goes through a socket, not a pipe: send(MSG_NOSIGNAL) cannot
     * raise SIGPIPE in the worker when the task dies without reading. */
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, code) != 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "socketpair");
    run->code_fd = code[0];
    run->args.fds[FD_CODE] = code[1];
    shutdown(code[0], SHUT_RD);
    if (pipe2(out, O_CLOEXEC) != 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "pipe");
    run->out_fd = out[0];
    run->args.fds[FD_OUT] = out[1];
    if (pipe2(errp, O_CLOEXEC) != 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "pipe");
    run->err_fd = errp[0];
    run->args.fds[FD_ERR] = errp[1];
    if (pipe2(rep, O_CLOEXEC) != 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "pipe");
    run->rep_fd = rep[0];
    run->args.fds[FD_REPORT] = rep[1];
    run->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (run->wake_fd < 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "eventfd");
    return CI_OK;
}

void close_child_ends(struct ci_sandbox_run *run)
{
    for (int i = 0; i < FD_COUNT; i++)
        close_fd(&run->args.fds[i]);
}

ci_status send_byte(struct ci_sandbox_run *run)
{
    char c = 1;
    return send(run->sock, &c, 1, MSG_NOSIGNAL) == 1 ? CI_OK : CI_ERR_IO;
}

/* The end of a start, cold or warm: init builds its sandbox and says READY
 * with /workspace; the inputs go in; GO. A failure before READY sets
 * *ret_fallback (when not NULL): nothing of the task has run. */
ci_status finish_start(struct ci_sandbox_run *run, const struct ci_job *job,
                       bool *ret_fallback, struct ci_error *err)
{
    const struct ci_sandbox *sb = run->sb;
    bool dummy;
    bool *fallback = ret_fallback ? ret_fallback : &dummy;
    struct msg m;
    int fds[2]; /* the /workspace; a cold init's task process (a pidfd) */
    ci_status s = recv_msg_fds(run->sock, READY_TIMEOUT_MS, &m, fds, 2);
    run->marks.ready_us = ci_now_us();
    int ws = fds[0];
    if (fds[1] >= 0) {
        if (!run->warm && m.type == MSG_READY)
            pin_oom_score(sb, pidfd_pid(fds[1]));
        close(fds[1]);
    }
    *fallback = true;
    if (s == CI_ERR_TIMEOUT)
        return ci_error_set(err, CI_ERR_TIMEOUT, "the sandbox was not built within %d s",
                            READY_TIMEOUT_MS / 1000);
    if (s)
        return ci_error_set(err, CI_ERR_SYS, "the sandbox's init died during its setup");
    if (m.type == MSG_FAILED) {
        char what[256];
        if (run->warm && m.step == STEP_OP)
            m.op = warm_op_index(sb, m.op);
        describe_failure(sb, &m, what, sizeof(what));
        return ci_error_set(err, CI_ERR_SYS, "the sandbox could not be set up: %s", what);
    }
    if (m.type != MSG_READY || ws < 0) {
        if (ws >= 0)
            close(ws);
        return ci_error_set(err, CI_ERR_INTEGRITY, "the sandbox's init sent a bad message");
    }
    *fallback = false;
    run->ws_fd = ws;
    if ((s = write_inputs(run, job, err)))
        return s;
    if (send_byte(run) != CI_OK)
        return ci_error_set(err, CI_ERR_SYS, "the sandbox's init died before the code started");
    return CI_OK;
}

/* The task's cgroup exists, with its limits, before any of its processes. */
ci_status new_task_cgroup(struct ci_sandbox_run *run, const struct ci_job *job,
                          struct ci_error *err)
{
    const struct ci_sandbox *sb = run->sb;
    if (!sb->cgroups)
        return CI_OK;
    struct ci_cgroup_limits lim = {.memory_bytes = (uint64_t)job->memory_mb << 20,
                                   .pids = sb->cfg->local.max_processes,
                                   .cpus = sb->cfg->local.cpus};
    struct ci_error cg_err = {{0}};
    ci_status s = ci_cgroup_new(sb->cgroups, &lim, &run->cg, &cg_err);
    if (s)
        return ci_error_set(err, s, "the sandbox could not be set up: %s", cg_err.msg);
    return CI_OK;
}

/* Namespace mode: clone init, map ids, wait for READY, inputs, GO. */
static ci_status start_ns(struct ci_sandbox_run *run, const struct ci_job *job,
                          struct ci_error *err)
{
    const struct ci_sandbox *sb = run->sb;
    run->args.workdir = "/workspace";
    run->args.envp = sb->envp_ns;
    ci_status s = new_task_cgroup(run, job, err);
    if (s)
        return s;
    run->marks.cgroup_us = ci_now_us();
    const char *uid_map = sb->uid_map;
    if (sb->uids.on) {
        if (uids_take_cold(&run->sb->uids, &run->uid_slot) != CI_OK)
            return ci_error_set(err, CI_ERR_FULL, "every task uid of the cold runs is taken "
                                "(a killed run whose processes have not exited holds one, "
                                "or more runs at once than task slots)");
        run->task_uid = sb->uids.first + run->uid_slot;
        int n = snprintf(run->uid_map, sizeof(run->uid_map), "%d %u 1\n%d %u 1\n", SANDBOX_ID,
                         (unsigned)run->task_uid, INIT_ID, (unsigned)sb->outside_uid);
        if (n <= 0 || (size_t)n >= sizeof(run->uid_map))
            return ci_error_set(err, CI_ERR_SYS, "the task's uid map does not fit");
        uid_map = run->uid_map;
        run->args.task_uids = true;
    }

    pid_t pid = sys_clone(sb->clone_flags | SIGCHLD);
    if (pid < 0)
        return ci_error_errno(err, CI_ERR_UNSUPPORTED, errno, "clone of the sandbox failed");
    if (pid == 0)
        init_main(&run->args);
    run->pid = pid;
    run->pidfd = sys_pidfd_open(pid);
    close_child_ends(run);

    /* Init waits for our first byte before it does anything: inside its
     * cgroup before it forks, writes a file or mounts a tmpfs. */
    if (run->cg) {
        struct ci_error cg_err = {{0}};
        if ((s = ci_cgroup_attach(run->cg, pid, &cg_err)))
            return ci_error_set(err, s, "the sandbox could not be set up: %s", cg_err.msg);
    }
    /* An unprivileged writer may only map its own id, after denying
     * setgroups. Root keeps setgroups allowed so init can drop gid 0. */
    if (!sb->outside_root && (s = write_proc_file(pid, "setgroups", "deny\n", err)))
        return s;
    if ((s = write_proc_file(pid, "uid_map", uid_map, err)) ||
        (s = write_proc_file(pid, "gid_map", sb->gid_map, err)))
        return s;
    if (send_byte(run) != CI_OK)
        return ci_error_set(err, CI_ERR_SYS, "the sandbox's init died before its setup");
    run->marks.acquired_us = ci_now_us();
    return finish_start(run, job, NULL, err);
}

/* Bare mode: a private directory, the inputs, then fork and exec. */
static ci_status start_bare(struct ci_sandbox_run *run, const struct ci_job *job,
                            struct ci_error *err)
{
    const struct ci_sandbox *sb = run->sb;
    const char *base = getenv("TMPDIR");
    if (!base || base[0] != '/')
        base = "/tmp";
    if (asprintf(&run->bare_dir, "%s/ci-task-XXXXXX", base) < 0) {
        run->bare_dir = NULL;
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    }
    if (!mkdtemp(run->bare_dir)) { /* mode 0700 */
        int e = errno;
        free(run->bare_dir);
        run->bare_dir = NULL;
        return ci_error_errno(err, CI_ERR_IO, e, "cannot create a task directory in %s", base);
    }
    run->bare_dir_fd = open(run->bare_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (run->bare_dir_fd < 0 || mkdirat(run->bare_dir_fd, "workspace", 0755) != 0 ||
        mkdirat(run->bare_dir_fd, "tmp", 0700) != 0)
        return ci_error_errno(err, CI_ERR_IO, errno, "cannot create the task directory");
    run->ws_fd = openat(run->bare_dir_fd, "workspace", O_RDONLY | O_DIRECTORY | O_NOFOLLOW |
                                                           O_CLOEXEC);
    int tmp_fd = openat(run->bare_dir_fd, "tmp", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (run->ws_fd < 0 || tmp_fd < 0) {
        if (tmp_fd >= 0)
            close(tmp_fd);
        return ci_error_errno(err, CI_ERR_IO, errno, "cannot open the task directory");
    }
    if (sb->outside_root) {
        bool ok = fchown(run->bare_dir_fd, sb->outside_uid, sb->outside_gid) == 0 &&
                  fchown(run->ws_fd, sb->outside_uid, sb->outside_gid) == 0 &&
                  fchown(tmp_fd, sb->outside_uid, sb->outside_gid) == 0;
        if (!ok) {
            int e = errno;
            close(tmp_fd);
            return ci_error_errno(err, CI_ERR_IO, e, "cannot hand the task directory over");
        }
    }
    close(tmp_fd);
    ci_status s = write_inputs(run, job, err);
    if (s)
        return s;

    char *ws = NULL, *tmp = NULL;
    if (asprintf(&ws, "%s/workspace", run->bare_dir) < 0)
        ws = NULL;
    run->bare_strs[0] = ws;
    if (asprintf(&tmp, "%s/tmp", run->bare_dir) < 0)
        tmp = NULL;
    run->bare_strs[1] = tmp;
    if (!ws || !tmp)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    /* plan_env() keeps its strings in the sandbox; for a run we want them in
     * the run: build them in a throwaway plan and move them over. */
    struct ci_sandbox scratch = {0};
    if (plan_env(&scratch, run->bare_env, ws, tmp) != CI_OK) {
        for (size_t i = 0; i < scratch.n_strs; i++)
            free(scratch.strs[i]);
        free(scratch.strs);
        memset(run->bare_env, 0, sizeof(run->bare_env));
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    }
    free(scratch.strs); /* the strings now belong to run->bare_env */
    run->args.workdir = ws;
    run->args.envp = run->bare_env;
    run->args.drop_to_sandbox_ids = sb->outside_root;

    pid_t pid = sys_clone(SIGCHLD);
    if (pid < 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "fork");
    if (pid == 0)
        bare_main(&run->args);
    run->pid = pid;
    run->pidfd = sys_pidfd_open(pid);
    close_child_ends(run);
    if (job->bare_hooks) {
        run->bare_hooks = *job->bare_hooks;
        if (run->bare_hooks.started)
            run->bare_hooks.started(run->bare_hooks.ctx, pid);
    }
    return CI_OK;
}

/* Sends what the code socket takes without blocking. Closing it when all
 * is sent is the driver's EOF; a socket nobody reads any more is closed. */
void send_code(struct ci_sandbox_run *run)
{
    while (run->code_fd >= 0 && run->code_off < run->code_len) {
        ssize_t w = send(run->code_fd, run->code + run->code_off, run->code_len - run->code_off,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN)
            return;
        if (w <= 0)
            break;
        run->code_off += (size_t)w;
    }
    close_fd(&run->code_fd);
}

/* One start, cold or (warm) in a zygote. */
ci_status run_start(struct ci_sandbox *sb, const struct ci_job *job, bool warm,
                    bool *ret_fallback, struct ci_sandbox_run **ret, struct ci_error *err)
{
    struct ci_sandbox_run *run = calloc(1, sizeof(*run));
    if (!run)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    run->sb = sb;
    run->uid_slot = UINT32_MAX;
    run->task_uid = sb->outside_uid;
    run->pidfd = run->sock = run->code_fd = run->out_fd = run->err_fd = run->rep_fd = -1;
    run->wake_fd = run->ws_fd = run->bare_dir_fd = -1;
    for (int i = 0; i < FD_COUNT; i++)
        run->args.fds[i] = -1;
    run->args.sb = sb;
    atomic_init(&run->cancel_requested, false);
    run->code_len = job->code_len;
    run->timeout_ms = job->timeout_ms;
    run->session_on = job->session.on;
    run->max_state_bytes = job->session.max_state_bytes;
    if (job->output)
        run->sink = *job->output;
    plan_limits(&run->args, sb, job);

    ci_status s = CI_OK;
    run->code = malloc(job->code_len + 1);
    if (!run->code)
        s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    else if (job->code_len)
        memcpy(run->code, job->code, job->code_len);
    if (!s)
        s = digest_inputs(run, job, err);
    if (!s)
        s = open_channels(run, err);
    if (!s)
        s = !sb->ns ? start_bare(run, job, err)
            : warm  ? start_warm(run, job, ret_fallback, err)
                    : start_ns(run, job, err);
    if (s) {
        ci_sandbox_run_free(run);
        return s;
    }
    run->t_go = ci_mono_ms();
    run->marks.go_us = ci_now_us();
    run->deadline = run->t_go + job->timeout_ms;
    send_code(run); /* usually all of it fits in the socket buffer now */
    *ret = run;
    return CI_OK;
}

ci_status ci_sandbox_start(struct ci_sandbox *sb, const struct ci_job *job,
                           struct ci_sandbox_run **ret, struct ci_error *err)
{
    if (sb->warm) {
        bool fallback = false;
        ci_status s = run_start(sb, job, true, &fallback, ret, err);
        if (!s || !fallback)
            return s;
        /* No zygote could build this task's sandbox, and nothing of the task
         * ran: run it cold. */
        atomic_fetch_add(&sb->warm_fallbacks, 1);
    }
    return run_start(sb, job, false, NULL, ret, err);
}

void ci_sandbox_cancel(struct ci_sandbox_run *run)
{
    /* After wait() the flag is never read again: harmless. */
    if (!run || atomic_exchange(&run->cancel_requested, true))
        return;
    uint64_t one = 1;
    ssize_t w = write(run->wake_fd, &one, sizeof(one));
    (void)w; /* the flag alone is enough: the loop also polls with a tick */
}
