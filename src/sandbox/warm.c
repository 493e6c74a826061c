/* warm.c - warm mode (local.mode: warm) on the worker's side: the SETUP
 * plan for the zygotes (zygote.c keeps the pool), the launch of one, and
 * a run's start in one (start_warm).
 *
 * A zygote (src/zygote/main.c) is built like the init of a cold sandbox,
 * then executes ci-zygote instead of forking a task. Each task's init in
 * the zygote runs the per-task part of the plan itself - its /workspace,
 * /tmp, /dev/shm, /proc and what goes into /tmp - and speaks the same
 * messages as a cold init, after a HELLO that carries pidfds of itself and
 * of its task process (forked ahead, see src/zygote/main.c): from there on
 * a warm run is a cold run whose init is not our child. */
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/util.h"
#include "sandbox/sandbox_int.h"
#include "sandbox/sched.h"
#include "sandbox/sys.h"

/* The steps of the plan each task of a zygote runs in its own mount
 * namespace, on top of the zygote's (identical) root. */
static bool op_per_task(const struct op *op)
{
    const char *rel = op->path + strlen(NEWROOT);
    switch (op->kind) {
    case OP_TMPFS:
        return strcmp(rel, "/workspace") == 0 || strcmp(rel, "/tmp") == 0 ||
               strcmp(rel, "/dev/shm") == 0;
    case OP_PROC:
        return true;
    case OP_DIR:
    case OP_FILE:
        return strncmp(rel, "/tmp/", 5) == 0;
    default:
        return false;
    }
}

/* A task's failing step, as an index into sb->ops. */
int warm_op_index(const struct ci_sandbox *sb, int op)
{
    return op >= 0 && (size_t)op < sb->n_warm_ops ? sb->warm_ops[op] : -1;
}

/* Spares per zygote: local.warm_spares, or enough for every slot to find
 * one when tasks come all at once (slots / zygotes, rounded up). */
static uint32_t warm_spares(const struct ci_config *cfg)
{
    uint32_t n = cfg->local.warm_spares;
    if (n == 0) {
        uint32_t pool = cfg->local.warm_pool_size ? cfg->local.warm_pool_size : 1;
        n = (ci_config_slots(cfg) + pool - 1) / pool;
    }
    return n < 1 ? 1 : n > ZYGOTE_MAX_SPARES ? ZYGOTE_MAX_SPARES : n;
}

/* The SETUP plan (sandbox_proto.h) for sb's zygotes. */
static ci_status warm_setup(struct ci_sandbox *sb, struct ci_buf *out)
{
    static const uint32_t kinds[] = {[OP_TMPFS] = ZOP_TMPFS, [OP_DIR] = ZOP_DIR,
                                     [OP_FILE] = ZOP_FILE, [OP_PROC] = ZOP_PROC};
    struct zsetup_head h = {.clone_flags = sb->clone_flags,
                            .filter_len = sb->seccomp.filter ? sb->seccomp.len : 0,
                            .python_len = (uint32_t)strlen(sb->cfg->local.python) + 1,
                            .spares = warm_spares(sb->cfg)};
    if (sb->cgroups && (sb->clone_flags & CLONE_NEWCGROUP))
        h.flags |= ZSETUP_CGROUPNS;
    /* A spare's warm-up then takes only CPU nothing else wants, and we put
     * its task back to normal when it comes: if we could not, the warm-up
     * competes with the tasks running. */
    sb->warm_idle = sched_can_renice();
    if (sb->warm_idle)
        h.flags |= ZSETUP_IDLE_WARMUP;
    /* A keeper's teardown at SCHED_IDLE gave way to the next task's start
     * (issue 16: a fan-out did 3-11% more tasks/s). Only with per-task
     * cgroups, where a task's processes are weighed as one against the
     * others' (measured so); and only where we can find a keeper to put
     * it back when we wait for it. */
    sb->keeper_idle = sb->warm_idle && sb->cgroups && sched_can_list_children();
    if (sb->keeper_idle)
        h.flags |= ZSETUP_IDLE_KEEPER;
    if (sb->uids.on) {
        h.flags |= ZSETUP_TASK_UIDS;
        h.uid_block = sb->uids.block;
    }
    if (sb->inotify_instances) {
        h.inotify_instances = (uint32_t)strtoul(sb->inotify_instances, NULL, 10);
        h.inotify_watches = (uint32_t)strtoul(sb->inotify_watches, NULL, 10);
    }
    sb->n_warm_ops = 0;
    for (size_t i = 0; i < sb->n_ops; i++)
        if (op_per_task(&sb->ops[i])) {
            if (sb->n_warm_ops == ZYGOTE_MAX_OPS)
                return CI_ERR_LIMIT;
            sb->warm_ops[sb->n_warm_ops++] = (int)i;
        }
    h.n_ops = (uint32_t)sb->n_warm_ops;
    ci_status s = ci_buf_append(out, &h, sizeof(h));
    for (size_t k = 0; k < sb->n_warm_ops && !s; k++) {
        const struct op *op = &sb->ops[sb->warm_ops[k]];
        const char *rel = op->path + strlen(NEWROOT);
        const char *data = op->data ? op->data : "";
        size_t len = op->kind == OP_FILE ? op->data_len : strlen(data);
        struct zop_head oh = {.kind = kinds[op->kind], .path_len = (uint32_t)strlen(rel) + 1,
                              .data_len = (uint32_t)len + 1, .flags = op->flags};
        s = ci_buf_append(out, &oh, sizeof(oh));
        if (!s)
            s = ci_buf_append(out, rel, oh.path_len);
        if (!s)
            s = ci_buf_append(out, data, len);
        if (!s)
            s = ci_buf_append(out, "", 1);
    }
    if (!s && h.filter_len)
        s = ci_buf_append(out, sb->seccomp.filter, h.filter_len * sizeof(struct sock_filter));
    if (!s)
        s = ci_buf_append(out, sb->cfg->local.python, h.python_len);
    return s;
}

/* The pool's reaped callback: the zygote and every task it ran are gone. */
static void zygote_reaped(void *ctx, const struct ci_zygote_proc *proc)
{
    struct ci_sandbox *sb = ctx;
    uids_give_block(&sb->uids, proc->tag);
}

/* The pool's launch callback: a cold sandbox's init that becomes a zygote.
 * Runs on the pool's thread, which the zygote dies with. */
static ci_status launch_zygote(void *ctx, struct ci_zygote_proc *ret, struct ci_error *err)
{
    struct ci_sandbox *sb = ctx;
    struct child_args a;
    memset(&a, 0, sizeof(a));
    a.sb = sb;
    a.zygote = true;
    a.envp = sb->envp_ns;
    a.workdir = "/";
    int sv[2] = {-1, -1}, errp[2] = {-1, -1}, null = -1, pidfd = -1;
    pid_t pid = -1;
    ci_status s = CI_OK;
    /* Task uids: the zygote's namespace maps its own 1000 to init's uid
     * outside and a block of the range at TASK_IDS_INSIDE, which it hands
     * to its spares (uids.c). */
    const char *uid_map = sb->uid_map;
    char block_map[96];
    int block = -1;
    if (sb->uids.on) {
        block = uids_take_block(&sb->uids);
        if (block < 0)
            return ci_error_set(err, CI_ERR_LIMIT, "no block of task uids is free for another "
                                "zygote (local.task_uid_count)");
        int n = snprintf(block_map, sizeof(block_map), "%d %u 1\n%d %u %u\n", SANDBOX_ID,
                         (unsigned)sb->outside_uid, TASK_IDS_INSIDE,
                         sb->uids.first + sb->uids.cold + (unsigned)block * sb->uids.block,
                         sb->uids.block);
        if (n <= 0 || (size_t)n >= sizeof(block_map)) {
            uids_give_block(&sb->uids, block);
            return ci_error_set(err, CI_ERR_SYS, "the zygote's uid map does not fit");
        }
        uid_map = block_map;
        a.task_uids = true;
    }
    int prog = open(sb->zygote_path, O_PATH | O_CLOEXEC);
    if (prog < 0) {
        s = ci_error_errno(err, CI_ERR_UNSUPPORTED, errno, "cannot open the zygote program %s",
                           sb->zygote_path);
        goto out;
    }
    /* Each task's init executes it: sent with SETUP, and never in a task
     * (close-on-exec in the zygote, closed by its task processes). */
    ret->init_fd = open(sb->zygote_init_path, O_PATH | O_CLOEXEC);
    if (ret->init_fd < 0) {
        s = ci_error_errno(err, CI_ERR_UNSUPPORTED, errno, "cannot open %s, the program of "
                           "each warm task's init (build ci-zygote-init beside ci-zygote)",
                           sb->zygote_init_path);
        goto out;
    }
    null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null < 0 || socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0 ||
        pipe2(errp, O_CLOEXEC) != 0) {
        s = ci_error_errno(err, CI_ERR_SYS, errno, "cannot create the zygote's channels");
        goto out;
    }
    /* fd 0 carries the program to execute: a zygote reads no code. */
    a.fds[FD_CODE] = prog;
    a.fds[FD_OUT] = null;
    a.fds[FD_ERR] = errp[1];
    a.fds[FD_REPORT] = null;
    a.fds[FD_SOCK] = sv[1];
    pid = sys_clone(sb->clone_flags | SIGCHLD);
    if (pid < 0) {
        s = ci_error_errno(err, CI_ERR_UNSUPPORTED, errno, "clone of the zygote's sandbox failed");
        goto out;
    }
    if (pid == 0)
        init_main(&a);
    pidfd = sys_pidfd_open(pid);
    close_fd(&prog);
    close_fd(&null);
    close_fd(&errp[1]);
    close_fd(&sv[1]);
    if (pidfd < 0) {
        s = ci_error_errno(err, CI_ERR_SYS, errno, "pidfd_open of the zygote");
        goto out;
    }
    if ((!sb->outside_root && (s = write_proc_file(pid, "setgroups", "deny\n", err))) ||
        (s = write_proc_file(pid, "uid_map", uid_map, err)) ||
        (s = write_proc_file(pid, "gid_map", sb->gid_map, err)))
        goto out;
    char go = 1;
    if (send(sv[0], &go, 1, MSG_NOSIGNAL) != 1) {
        s = ci_error_set(err, CI_ERR_SYS, "the zygote's init died before its setup");
        goto out;
    }
    struct msg m;
    s = recv_msg_on(sv[0], READY_TIMEOUT_MS, &m, NULL);
    if (!s && m.type == MSG_FAILED) {
        char what[256];
        describe_failure(sb, &m, what, sizeof(what));
        s = ci_error_set(err, CI_ERR_SYS, "the zygote's sandbox could not be set up: %s", what);
    } else if (s || m.type != MSG_READY) {
        s = ci_error_set(err, CI_ERR_SYS, "the zygote's init died during its setup");
    }
    if (s)
        goto out;
    ret->pid = pid;
    ret->pidfd = pidfd;
    ret->sock = sv[0];
    ret->err_fd = errp[0];
    ret->tag = block; /* given back when the pool reaps it (zygote_reaped) */
    return CI_OK;
out:
    if (pid > 0) {
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, __WALL) < 0 && errno == EINTR)
            ;
    }
    uids_give_block(&sb->uids, block); /* its zygote is dead */
    close_fd(&ret->init_fd);
    close_fd(&pidfd);
    close_fd(&prog);
    close_fd(&null);
    close_fd(&sv[0]);
    close_fd(&sv[1]);
    close_fd(&errp[0]);
    close_fd(&errp[1]);
    return s;
}

/* Where ci-zygote is: local.zygote, or beside the running program; and
 * ci-zygote-init, the program of each warm task's init, beside it. */
static ci_status zygote_program(struct ci_sandbox *sb, struct ci_error *err)
{
    const char *conf = sb->cfg->local.zygote;
    char path[4096];
    if (conf && conf[0]) {
        snprintf(path, sizeof(path), "%s", conf);
    } else {
        ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 32);
        if (n <= 0)
            return ci_error_errno(err, CI_ERR_UNSUPPORTED, errno, "readlink /proc/self/exe");
        path[n] = '\0';
        char *slash = strrchr(path, '/');
        if (!slash)
            return ci_error_set(err, CI_ERR_UNSUPPORTED, "cannot tell where ci-zygote is");
        snprintf(slash + 1, sizeof(path) - (size_t)(slash + 1 - path), "ci-zygote");
    }
    if (path[0] != '/')
        return ci_error_set(err, CI_ERR_INVALID, "local.zygote '%s' is not an absolute path",
                            path);
    if (access(path, X_OK) != 0)
        return ci_error_errno(err, CI_ERR_UNSUPPORTED, errno,
                              "the zygote program %s is missing (build ci-zygote beside "
                              "ci-worker, or set local.zygote)", path);
    sb->zygote_path = plan_str(sb, "%s", path);
    sb->zygote_argv[0] = plan_str(sb, "ci-zygote");
    sb->zygote_argv[1] = NULL;
    if (!sb->zygote_path || !sb->zygote_argv[0])
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    /* Opened at each launch, which fails (saying so) when it is missing. */
    char *slash = strrchr(path, '/');
    snprintf(slash + 1, sizeof(path) - (size_t)(slash + 1 - path), "ci-zygote-init");
    sb->zygote_init_path = plan_str(sb, "%s", path);
    if (!sb->zygote_init_path)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    return CI_OK;
}

/* Starts sb's zygotes; on success tasks run warm. */
ci_status warm_start(struct ci_sandbox *sb, unsigned pool_size, struct ci_error *err)
{
    const struct ci_config *cfg = sb->cfg;
    if (!sb->ns || !sb->with_proc)
        return ci_error_set(err, CI_ERR_UNSUPPORTED,
                            "warm mode needs the namespace sandbox with its own /proc");
    ci_status s = zygote_program(sb, err);
    if (s)
        return s;
    struct ci_buf setup = CI_BUF_INIT;
    if ((s = warm_setup(sb, &setup))) {
        ci_buf_release(&setup);
        return ci_error_set(err, s, "cannot prepare the zygote's setup");
    }
    struct ci_zygote_pool_config zc = {
        .size = pool_size,
        .rotate_after = cfg->local.warm_rotate_after ? cfg->local.warm_rotate_after : 200,
        .setup = setup.data,
        .setup_len = setup.len,
        .launch = launch_zygote,
        .reaped = zygote_reaped,
        .launch_ctx = sb,
    };
    s = ci_zygote_pool_new(&zc, &sb->warm, err);
    ci_buf_release(&setup);
    /* Without the thread, runs are freed by the slots (as they are cold). */
    if (!s && reaper_start(sb, ci_config_slots(cfg)) == CI_ERR_NOMEM)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    return s;
}

/* Warm mode: a zygote hands the task to a spare init (cloned ahead, its
 * task process forked and waiting), which says HELLO with pidfds of both;
 * we put both in the task's cgroup, then init builds its mounts like a cold
 * init (finish_start). *ret_fallback: nothing of the task has run. */
ci_status start_warm(struct ci_sandbox_run *run, const struct ci_job *job,
                     bool *ret_fallback, struct ci_error *err)
{
    struct ci_sandbox *sb = run->sb;
    run->args.workdir = "/workspace";
    run->args.envp = sb->envp_ns;
    *ret_fallback = true;
    ci_status s = new_task_cgroup(run, job, err);
    if (s)
        return s;
    run->marks.cgroup_us = ci_now_us();
    struct zmsg_spawn req;
    memset(&req, 0, sizeof(req));
    req.type = ZMSG_SPAWN;
    for (int r = 0; r < RLIM_NLIMITS; r++)
        if (run->args.limit_set[r]) {
            req.limits[r].cur = run->args.limits[r].rlim_cur;
            req.limits[r].max = run->args.limits[r].rlim_max;
            req.limits[r].set = 1;
        }
    if ((s = ci_zygote_pool_spawn(sb->warm, &req, sizeof(req), run->args.fds, FD_COUNT, err)))
        return s;
    close_child_ends(run);

    struct msg m;
    int pfd[2]; /* init, and its task process: forked ahead, warm, waiting */
    s = recv_msg_fds(run->sock, READY_TIMEOUT_MS, &m, pfd, 2);
    run->marks.acquired_us = ci_now_us();
    if (s || m.type != MSG_HELLO || pfd[0] < 0 || pfd[1] < 0) {
        char what[256] = "";
        if (!s && m.type == MSG_FAILED)
            describe_failure(sb, &m, what, sizeof(what));
        else if (!s && m.type == MSG_HELLO)
            snprintf(what, sizeof(what), "its HELLO lacks a pidfd (an older ci-zygote?)");
        for (int i = 0; i < 2; i++)
            if (pfd[i] >= 0)
                close(pfd[i]);
        return ci_error_set(err, CI_ERR_SYS, "the warm runtime did not start the task: %s",
                            what[0] ? what : s == CI_ERR_TIMEOUT ? "no answer" : "it is gone");
    }
    run->warm = true;
    run->pidfd = pfd[0];
    run->pid = pidfd_pid(pfd[0]);
    pid_t task_pid = pidfd_pid(pfd[1]);
    if (run->pid <= 0 || task_pid <= 0) {
        close(pfd[1]);
        return ci_error_set(err, CI_ERR_SYS, "the task's init ended before its setup");
    }
    /* Init waits for our byte: in its cgroup before it mounts. The task
     * process exists already and writing init's pid would not move it, so
     * it goes in too, before it gets the code (at GO). Its pid cannot be
     * reused meanwhile: init reaps nothing until GO. In cgroup v1 and v2 the
     * memory its warm-up touched stays charged where it was (no charge
     * moves with a process): the task's limit counts what the task adds. */
    if (run->cg) {
        struct ci_error cg_err = {{0}};
        if ((s = ci_cgroup_attach(run->cg, run->pid, &cg_err)) ||
            (s = ci_cgroup_attach(run->cg, task_pid, &cg_err))) {
            close(pfd[1]);
            return ci_error_set(err, s, "the sandbox could not be set up: %s", cg_err.msg);
        }
        /* Init waits for our byte and lives on until something kills it
         * (its zygote's death does): then its pid was free between
         * pidfd_pid() and the attach, but pids are handed out in turn, so
         * none was reused in that moment. Fail now rather than later. */
        struct pollfd p = {.fd = pfd[1], .events = POLLIN};
        if (init_exited(run, 0) || poll(&p, 1, 0) != 0) {
            close(pfd[1]);
            return ci_error_set(err, CI_ERR_SYS, "the task's init ended before its setup");
        }
    }
    pin_oom_score(sb, task_pid);
    /* The zygote chose the code's uid: the inputs are written as it. It
     * must be one of the zygotes' blocks (never init's, nor a cold run's),
     * read while init is known to live (its pid cannot be another's). */
    if (sb->uids.on) {
        run->task_uid = outside_uid_of(run->pid, SANDBOX_ID);
        uint32_t warm_first = sb->uids.first + sb->uids.cold;
        if (init_exited(run, 0) || run->task_uid == (uid_t)-1 || run->task_uid < warm_first ||
            run->task_uid - warm_first >= sb->uids.blocks * sb->uids.block) {
            close(pfd[1]);
            return ci_error_set(err, CI_ERR_SYS, "the task's init has no task uid of the range");
        }
    }
    /* Its warm-up ran at SCHED_IDLE: the task runs at the normal policy. */
    struct sched_param normal = {.sched_priority = 0};
    if (sb->warm_idle && sched_setscheduler(task_pid, SCHED_OTHER, &normal) != 0) {
        s = ci_error_errno(err, CI_ERR_SYS, errno, "cannot reset the task's scheduling policy");
        close(pfd[1]);
        return s;
    }
    close(pfd[1]);
    if (send_byte(run) != CI_OK)
        return ci_error_set(err, CI_ERR_SYS, "the sandbox's init died before its setup");
    return finish_start(run, job, ret_fallback, err);
}

const char *ci_sandbox_mode(const struct ci_sandbox *sb)
{
    return sb->warm ? "warm" : "cold";
}

bool ci_sandbox_warm_stats(struct ci_sandbox *sb, struct ci_zygote_stats *ret,
                           uint64_t *ret_fallbacks)
{
    if (!sb->warm)
        return false;
    ci_zygote_pool_stats(sb->warm, ret);
    *ret_fallbacks = atomic_load(&sb->warm_fallbacks);
    return true;
}

