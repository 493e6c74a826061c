/* zygote.h - the warm pool of the local provider (local.mode: warm): a few
 * zygotes (ci-zygote, src/zygote/main.c), each a Python runtime that already
 * imported numpy, pandas, matplotlib and openpyxl, sitting in the sandbox's
 * outer namespaces, that forks one fully isolated child per task.
 *
 * The pool owns one thread. That thread starts the zygotes (through the
 * launch callback: warm.c builds a zygote like the init of a cold
 * sandbox), sends each its SETUP, waits for its READY, keeps local.
 * warm_pool_size of them, replaces one that died (with a growing delay when
 * they keep failing to start), and rotates them: after rotate_after * 3/4
 * tasks a zygote gets a replacement started; once it has served rotate_after
 * tasks and the replacement is ready, it takes no more tasks, finishes the
 * ones it runs and exits. So children never share one address layout and
 * hash seed for more than about rotate_after tasks; a zygote whose
 * replacement cannot start keeps serving rather than leave the tasks
 * without one (stats.overdue counts those tasks).
 *
 * Thread-safe: ci_zygote_pool_spawn() and _stats() may be called from any
 * thread. Nothing here logs. */
#ifndef CI_ZYGOTE_H
#define CI_ZYGOTE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/status.h"

#define CI_ZYGOTE_MAX_POOL 64

/* A started zygote, before its SETUP: what the launch callback returns. */
struct ci_zygote_proc {
    pid_t pid;  /* a child of the calling thread's process */
    int pidfd;
    int sock;   /* the request socket (SOCK_SEQPACKET) */
    int err_fd; /* its stderr (a pipe), or -1 */
    int init_fd; /* the program of each task's init (O_PATH), sent in SETUP then closed */
    int tag;    /* the launcher's own (warm.c: the zygote's block of task uids) */
};

struct ci_zygote_pool_config {
    unsigned size;         /* zygotes kept ready: 1..CI_ZYGOTE_MAX_POOL */
    unsigned rotate_after; /* tasks per zygote: >= 1 */
    /* The SETUP plan (sandbox_proto.h), copied. */
    const void *setup;
    size_t setup_len;
    /* Starts one zygote up to its exec (called from the pool's thread). */
    ci_status (*launch)(void *ctx, struct ci_zygote_proc *ret, struct ci_error *err);
    /* Optional: a zygote launch() started is reaped, every process it
     * started gone with it (called from the pool's thread, or from
     * ci_zygote_pool_free()). */
    void (*reaped)(void *ctx, const struct ci_zygote_proc *proc);
    void *launch_ctx;
    uint32_t start_timeout_ms; /* longest wait for a zygote's READY (0: 60 s) */
};

struct ci_zygote_pool;

/* Starts the pool's thread and waits (at most start_timeout_ms) until the
 * first zygote is READY. Fails with the zygote's own sentence (an import
 * error, a missing binary...) when it does not become ready; nothing is
 * left running then. */
ci_status ci_zygote_pool_new(const struct ci_zygote_pool_config *cfg,
                             struct ci_zygote_pool **ret, struct ci_error *err);

/* Kills every zygote (and so every task still running in one), reaps them
 * and stops the thread. Accepts NULL. */
void ci_zygote_pool_free(struct ci_zygote_pool *pool);

/* Hands one task to a ready zygote: req (len bytes, a zmsg_spawn) with the
 * task's channel fds (not consumed: the caller closes its copies). The
 * task's init answers on the task's control socket. Fails with
 * CI_ERR_UNSUPPORTED when no zygote is ready (starting, restarting after a
 * crash) or the chosen one is gone: the caller runs the task cold. */
ci_status ci_zygote_pool_spawn(struct ci_zygote_pool *pool, const void *req, size_t len,
                               const int *fds, size_t n_fds, struct ci_error *err);

struct ci_zygote_stats {
    unsigned ready;        /* zygotes taking tasks now */
    uint64_t started;      /* zygotes launched so far */
    uint64_t became_ready; /* of them, reached READY */
    uint64_t failed;       /* died before READY or said FAILED */
    uint64_t crashed;      /* died after READY without being retired */
    uint64_t retired;      /* rotated out */
    uint64_t spawned;      /* tasks handed to a zygote */
    uint64_t overdue;      /* tasks a zygote took past rotate_after */
    pid_t pids[CI_ZYGOTE_MAX_POOL]; /* the ready zygotes (pid in our namespace), 0-terminated */
    int64_t rss_kb;        /* the last zygote's resident memory at READY */
    int64_t huge_kb;       /* of it, anonymous memory in huge pages */
    int64_t collapsed_kb;  /* of that, what the zygote collapsed itself */
    int collapse_err;      /* why not all of it was collapsed (errno), 0 */
    char last_failure[480]; /* why the last zygote failed, "" if none did */
};

void ci_zygote_pool_stats(struct ci_zygote_pool *pool, struct ci_zygote_stats *ret);

#endif
