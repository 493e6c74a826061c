/* sandbox_proto.h - what the worker and the processes of a sandbox say to
 * each other. Internal to src/sandbox and the ci-zygote program
 * (src/zygote/main.c); nothing else includes it.
 *
 * Two conversations, both over SOCK_SEQPACKET socketpairs (one message per
 * send, never split or merged):
 *
 * 1. A run (cold and warm alike), on the run's control socket (FD_SOCK in
 *    the sandbox): the worker sends one byte when the sandbox may go on (it
 *    has written the maps or placed the process in its cgroup) and one byte
 *    as GO; the sandbox's init sends struct msg: HELLO (warm only, with
 *    pidfds of itself and of the task process, in that order), READY (with the /workspace fd), FAILED (a step and an
 *    errno) or DONE (the task's wait status and rusage).
 *
 * 2. A zygote (warm mode), on its request socket (ZYGOTE_FD_REQ in the
 *    zygote): the worker sends SETUP once (the per-task part of the sandbox
 *    plan and the seccomp filter), then one SPAWN per task, with the task's
 *    five channel fds (SCM_RIGHTS, in enum order). The zygote answers SETUP
 *    with READY or FAILED (a sentence); a SPAWN is answered by the task's
 *    own init on the task's control socket (conversation 1), or with a
 *    FAILED msg there when the zygote could not start it. EOF on the
 *    request socket tells the zygote to stop once its children are gone. */
#ifndef CI_SANDBOX_PROTO_H
#define CI_SANDBOX_PROTO_H

#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>

#define SANDBOX_ID 1000  /* the sandbox's uid and gid, inside */
#define INIT_ID 999      /* init's uid, inside, when tasks have uids of their own */
#define TASK_IDS_INSIDE 100000 /* where a zygote's block of task uids starts, inside it */
#define SIG_STOP SIGUSR1 /* worker -> init: kill everything, reap, report */

/* fd numbers in a sandbox's init (and a zygote's children). */
enum { FD_CODE = 0, FD_OUT = 1, FD_ERR = 2, FD_REPORT = 3, FD_SOCK = 4, FD_COUNT = 5 };

/* The setup steps a FAILED message can name. */
enum step {
    STEP_NONE,
    STEP_FDS,
    STEP_WAIT_MAPS,
    STEP_SETGROUPS,
    STEP_SETGID,
    STEP_SETUID,
    STEP_PRIVATE,
    STEP_OP,
    STEP_PIVOT,
    STEP_DETACH,
    STEP_REMOUNT_ROOT,
    STEP_HOSTNAME,
    STEP_WORKSPACE,
    STEP_DROP_CAPS,
    STEP_NO_NEW_PRIVS,
    STEP_FORK,
    STEP_SETSID,
    STEP_RLIMIT,
    STEP_CHDIR,
    STEP_SECCOMP,
    STEP_EXEC,
    /* warm mode */
    STEP_ZYGOTE_THREADS, /* the zygote is not single-threaded: it must not fork */
    STEP_ZYGOTE_CLONE,   /* the zygote could not clone the task's init */
    STEP_MAPS,           /* the task's init writes its own uid and gid maps */
    STEP_HELLO,          /* the task's init sends pidfds of itself and the task */
    STEP_PYTHON,         /* the task could not call the driver */
    STEP_ZYGOTE_MOUNTS,  /* a zygote's init detaches its own /workspace and /dev/shm */
    STEP_ZYGOTE_INIT,    /* a spare's init executes ci-zygote-init, which reads SETUP */
    STEP_COUNT,
};

static const char *const step_names[STEP_COUNT] = {
    [STEP_NONE] = "start",
    [STEP_FDS] = "set up the file descriptors",
    [STEP_WAIT_MAPS] = "wait for the uid map",
    [STEP_SETGROUPS] = "drop the supplementary groups",
    [STEP_SETGID] = "switch to the sandbox group",
    [STEP_SETUID] = "switch to the sandbox user",
    [STEP_PRIVATE] = "make all mounts private",
    [STEP_OP] = "build the root",
    [STEP_PIVOT] = "pivot_root into the new root",
    [STEP_DETACH] = "detach the old root",
    [STEP_REMOUNT_ROOT] = "remount the new root read-only",
    [STEP_HOSTNAME] = "set the hostname",
    [STEP_WORKSPACE] = "open /workspace",
    [STEP_DROP_CAPS] = "drop all capabilities",
    [STEP_NO_NEW_PRIVS] = "set no_new_privs",
    [STEP_FORK] = "start the task process",
    [STEP_SETSID] = "start a new session",
    [STEP_RLIMIT] = "set the resource limits",
    [STEP_CHDIR] = "enter the workspace",
    [STEP_SECCOMP] = "load the seccomp filter",
    [STEP_EXEC] = "execute python3",
    [STEP_ZYGOTE_THREADS] = "fork the warm runtime (it has more than one thread)",
    [STEP_ZYGOTE_CLONE] = "clone the task's namespaces from the warm runtime",
    [STEP_MAPS] = "write the task's uid and gid maps",
    [STEP_HELLO] = "report the task's processes to the worker",
    [STEP_PYTHON] = "start the driver in the warm runtime",
    [STEP_ZYGOTE_MOUNTS] = "detach the warm runtime's own /workspace and /dev/shm",
    [STEP_ZYGOTE_INIT] = "start the task's init (ci-zygote-init)",
};

enum msg_type { MSG_READY = 1, MSG_FAILED, MSG_DONE, MSG_HELLO };

struct msg {
    int32_t type;
    int32_t step; /* MSG_FAILED */
    int32_t op;   /* MSG_FAILED at STEP_OP: index in ops */
    int32_t err;  /* MSG_FAILED: errno */
    int32_t status; /* MSG_DONE: the task's wait status */
    int32_t pad;
    int64_t utime_us, stime_us, maxrss_kb; /* MSG_DONE: every process init reaped */
};

/* --- the zygote --- */

#define ZYGOTE_FD_REQ 4        /* the request socket in the zygote (its init's FD_SOCK) */
#define ZYGOTE_PROTO_VERSION 7 /* 2: HELLO carries the task process's pidfd too; 3: spares;
                                * 4: task uids, inotify quota; 5: SETUP carries
                                * ci-zygote-init, each task's init; 6: READY
                                * carries huge_kb, collapse_err; 7: ZSETUP_IDLE_KEEPER */
/* ci-zygote-init's first argument: the protocol (its own and the
 * zygote's must match: both come from one build). */
#define INIT_ARG_STR_(x) #x
#define INIT_ARG_STR(x) INIT_ARG_STR_(x)
#define INIT_ARG_PROTO INIT_ARG_STR(ZYGOTE_PROTO_VERSION)
#define ZYGOTE_MAX_OPS 16
#define ZYGOTE_MAX_SPARES 16
#define ZYGOTE_SETUP_MAX (4u << 20) /* bytes of one SETUP message, font list included */

enum zmsg_type { ZMSG_SETUP = 1, ZMSG_READY, ZMSG_FAILED, ZMSG_SPAWN };

/* One per-task setup step, run by each task's init in the zygote's root. */
enum zop_kind { ZOP_TMPFS = 1, ZOP_DIR, ZOP_FILE, ZOP_PROC };

struct zop_head {
    uint32_t kind;
    uint32_t path_len;  /* bytes of the path that follows, its NUL included */
    uint32_t data_len;  /* bytes of the data after the path, a NUL included */
    uint32_t pad;
    uint64_t flags;     /* ZOP_TMPFS: mount flags */
};

/* SETUP: a small message with two fds: a sealed memfd holding the plan and
 * ci-zygote-init (O_PATH), the program each task's init executes. The plan: a
 * zsetup_head, n_ops times (zop_head, path, data), the BPF program
 * (filter_len struct sock_filter, may be 0), the python path (NUL included). */
struct zmsg_setup {
    uint32_t type;
    uint32_t version;
    uint64_t size; /* bytes in the memfd */
};

#define ZSETUP_CGROUPNS 1u /* each task's init unshares its cgroup namespace once placed */
#define ZSETUP_TASK_UIDS 4u /* the zygote maps each spare's uid 1000 to one of its block (at
                            * TASK_IDS_INSIDE, uid_block of them) and INIT_ID to its own uid */
#define ZSETUP_IDLE_WARMUP 2u /* spare task processes warm up at SCHED_IDLE; the worker
                               * resets each to SCHED_OTHER when it places it (HELLO) */
#define ZSETUP_IDLE_KEEPER 8u /* the task process puts its keeper at SCHED_IDLE; the worker
                               * puts it back when it waits for it (sched_promote_idle) */

struct zsetup_head {
    uint64_t clone_flags; /* the namespaces of each task (CLONE_NEW*) */
    uint32_t flags;
    uint32_t n_ops;
    uint32_t filter_len;
    uint32_t python_len;
    uint32_t spares; /* sandboxes kept made ahead of the next tasks, 1..ZYGOTE_MAX_SPARES */
    uint32_t uid_block; /* ZSETUP_TASK_UIDS: task uids the zygote's namespace maps */
    uint32_t inotify_instances, inotify_watches; /* each task's quota; 0: not set */
};

/* READY or FAILED from the zygote: text is one sentence ("" for READY). */
struct zmsg_status {
    uint32_t type;
    int32_t err;
    int64_t rss_kb;     /* READY: the zygote's resident memory after the imports */
    int64_t huge_kb;    /* READY: of its anonymous memory, in huge pages */
    int64_t collapsed_kb; /* READY: of that, what it collapsed itself */
    int32_t collapse_err; /* READY: why some of it is not (errno), 0 */
    int32_t pad;
    char text[480];
};

/* SPAWN: the task's rlimits; the five channel fds ride along. The zygote
 * passes it on to a spare init, which passes it to its task process at GO. */
struct zmsg_spawn {
    uint32_t type;
    uint32_t pad;
    struct {
        uint64_t cur, max;
        uint32_t set;
        uint32_t pad;
    } limits[RLIM_NLIMITS];
};

#endif
