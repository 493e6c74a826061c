/* sandbox_int.h - private to src/sandbox: the state of a prepared sandbox
 * (struct ci_sandbox: the plan, built once and then only read), the limits
 * several files share, and what one file of the sandbox calls in another.
 * The API is sandbox.h; sandbox.c says which file holds what. */
#ifndef CI_SANDBOX_INT_H
#define CI_SANDBOX_INT_H

#include <linux/filter.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/config.h"
#include "core/job.h"
#include "core/status.h"
#include "sandbox/cgroup.h"
#include "sandbox/child.h"
#include "sandbox/sandbox.h"
#include "sandbox/sandbox_proto.h"
#include "sandbox/zygote.h"

#define UIDS_MAX_BLOCKS 128
#define NEWROOT "/tmp" /* built in the private mount namespace: the host's /tmp is untouched */
#define MAX_OPS 64
#define MAX_ENV 24
#define READY_TIMEOUT_MS 10000 /* longest wait for a sandbox to be built */
#define ARTIFACT_MAX_ENTRIES 1000

/* The task uids (uids.c). */
struct task_uids {
    bool on;               /* the worker is root and local.task_uid_count > 0 */
    uint32_t first, count; /* the range */
    uint32_t cold;         /* its first `cold` uids: one per cold run at a time */
    uint32_t block;        /* then blocks of `block`: one per zygote */
    uint32_t blocks;
    pthread_mutex_t lock;  /* cold_used, block_taken */
    uint8_t *cold_used;
    bool block_taken[UIDS_MAX_BLOCKS]; /* a zygote holds it, until the pool reaps it */
};

/* A prepared sandbox: the plan every run of it follows (plan.c, seccomp.c),
 * built once by ci_sandbox_new() and then only read, from several threads
 * at once and in the children. */
/* Runs freed on the sandbox's own thread (reaper.c): ended warm runs, and
 * runs whose processes did not exit after SIGKILL (stuck), either mode. */
struct reaper {
    bool running; /* the thread runs: set before the first run, cleared after the last */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* on CLOCK_MONOTONIC */
    bool stopping;
    struct ci_sandbox_run *head, *tail; /* the queue, oldest first */
    unsigned pending, max_pending;      /* queued or being freed; the most allowed */
    struct ci_sandbox_run *stuck;       /* freed once their init has exited, any order */
};

struct ci_sandbox {
    const struct ci_config *cfg;
    bool ns;             /* false: the no-isolation fallback */
    bool with_proc;
    unsigned long clone_flags;
    bool outside_root;   /* the worker is root: map to cfg->local.sandbox_uid */
    bool pin_oom;        /* we have CAP_SYS_RESOURCE: pin_oom_score() holds */
    uid_t outside_uid;   /* the id the sandbox user is outside (init's, with task uids) */
    struct task_uids uids;
    /* Each sandbox's own inotify quota (its user namespace's sysctls), a
     * share of the limit the kernel counts for the namespace's owner (us)
     * across all of them: "" when not set (no /proc). */
    char *inotify_instances, *inotify_watches;
    gid_t outside_gid;
    char isolation[128];
    struct ci_cgroup_root *cgroups; /* per-task cgroups; NULL: rlimits only */
    struct op ops[MAX_OPS];
    size_t n_ops;
    char *uid_map;       /* "1000 65534 1\n" */
    char *gid_map;
    char *argv_store[6];
    char *envp_ns[MAX_ENV]; /* the environment in the sandbox (NULL-terminated) */
    struct sock_fprog seccomp; /* the task's filter; .filter NULL when not used */
    /* Warm mode (warm.c): the zygotes; NULL when tasks run cold. */
    struct ci_zygote_pool *warm;
    char *zygote_path;
    char *zygote_init_path; /* ci-zygote-init, beside zygote_path */
    char *zygote_argv[2];
    atomic_ulong warm_fallbacks; /* tasks that ran cold because no zygote took them */
    int warm_ops[ZYGOTE_MAX_OPS]; /* the ops each zygote task runs itself (index in ops) */
    size_t n_warm_ops;
    bool warm_idle; /* spares warm up at SCHED_IDLE: we reset each task's at HELLO */
    bool keeper_idle; /* keepers tear a task's memory down at SCHED_IDLE: whoever waits
                       * for one puts it back (promote_keeper; zygote.c at the stop) */
    struct reaper reaper; /* ended warm runs freed beside the next tasks; stuck runs */
    char warm_failure[480]; /* ci_sandbox_warm_failure() */
    /* Every string the plan points to, freed with the sandbox. */
    char **strs;
    size_t n_strs, cap_strs;
};

/* The namespace layers: how each is created and named. */
struct sandbox_layer {
    const char *name;   /* as in an isolation string */
    const char *noun;   /* as in "user namespaces are not available" */
    unsigned long flag;
    const char *flag_name;
    bool required;
};
extern const struct sandbox_layer sandbox_layers[CI_LAYER_COUNT];

/* What a sandbox is made of; the probe finds out what this machine allows. */
struct build_opts {
    unsigned long clone_flags; /* 0: the no-isolation fallback */
    bool with_proc;
    bool with_seccomp;
    struct ci_cgroup_root *cgroups; /* namespace mode only; the sandbox takes it on success */
    bool no_task_uids; /* every task as local.sandbox_uid (the probe found task uids failing) */
};

/* What one run hands to its child: all prepared before the clone. */
struct child_args {
    const struct ci_sandbox *sb;
    int fds[FD_COUNT];        /* the child's ends, at parent numbers */
    struct rlimit limits[RLIM_NLIMITS];
    bool limit_set[RLIM_NLIMITS];
    const char *workdir;      /* the task's cwd */
    char *const *envp;
    bool drop_to_sandbox_ids; /* bare mode as root */
    bool zygote;              /* init becomes a zygote: FD_CODE holds its program */
    bool task_uids;           /* the code has a uid of its own: init becomes INIT_ID (cold),
                               * or the zygote maps its spares' uids (warm) */
};

/* An input as written, to tell an unchanged input from an artifact. */
struct input_digest {
    char *name;
    char sha256[65];
};

/* One run of a sandbox, from ci_sandbox_start() (run.c, warm.c) through
 * ci_sandbox_wait() (io.c) to ci_sandbox_run_free(). */
struct ci_sandbox_run {
    struct ci_sandbox *sb;
    struct child_args args;
    pid_t pid;          /* init (or the bare task); 0 once reaped */
    int pidfd;
    int sock;           /* our end of the control socket */
    int code_fd;        /* our end of the code socket; -1 once all is written */
    int out_fd, err_fd, rep_fd;
    int wake_fd;        /* eventfd written by cancel() */
    int ws_fd;          /* /workspace */
    struct ci_cgroup *cg; /* the task's cgroup, removed once everything in it is dead */
    atomic_bool cancel_requested;
    char *code;         /* our copy: the job is only borrowed during start */
    size_t code_len, code_off;
    int64_t t_go, t_end, deadline;
    struct ci_run_marks marks; /* its stages, for the outcome (job.h) */
    bool waited;        /* ci_sandbox_wait() returned: nothing of it runs any more */
    uint32_t peak_mb;   /* its peak memory, as the outcome says */
    struct ci_sandbox_run *reap_next; /* in the reaper's queue, or its stuck list */
    int64_t kill_at;    /* when init gets SIGKILL if it has not stopped by itself */
    int64_t killed_at;  /* when init got SIGKILL from the wait; 0: it did not */
    bool reaper_frees;  /* the reaper's thread frees it, nothing queued behind it: its
                         * keeper may stay idle for KEEPER_IDLE_MS (run_kill_now) */
    bool stuck;         /* init had not exited KILL_WAIT_MS after its SIGKILL when the
                         * wait gave up on it (io.c): the reaper frees the run once it has */
    uint32_t timeout_ms;
    struct input_digest *inputs;
    size_t n_inputs;
    /* bare mode */
    char *bare_dir;     /* the private 0700 directory, removed at the end */
    int bare_dir_fd;
    char *bare_env[MAX_ENV];
    char *bare_strs[2];
    struct ci_bare_hooks bare_hooks; /* the job's, if any; ended is cleared once called */
    struct ci_output_sink sink;      /* the job's, if any (write NULL: none) */
    /* warm mode: init is a child of a zygote, known by its pidfd only */
    bool warm;
    /* task uids: the cold slot this run holds (UINT32_MAX: none), the
     * code's uid outside (inputs are written as it), the maps of a cold run */
    uint32_t uid_slot;
    uid_t task_uid;
    char uid_map[80];
    /* a session step (session.c) */
    bool session_on;
    uint64_t max_state_bytes;
    struct input_digest *restored; /* the files the driver restored, sorted by name */
    size_t n_restored;
};

/* Closes *fd if it is open and marks it closed. */
static inline void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* reaper.c: ended warm runs freed on a thread of the sandbox's own, at
 * most max_pending at a time (ci_sandbox_run_release); stuck runs freed
 * there once their init has exited (reaper_take_stuck: false when the thread
 * cannot take it). stop() frees what is queued or stuck, then ends the
 * thread. */
ci_status reaper_start(struct ci_sandbox *sb, unsigned max_pending);
void reaper_stop(struct ci_sandbox *sb);
bool reaper_take_stuck(struct ci_sandbox_run *run);

/* sandbox.c: a sandbox built as o says, whatever the probe found. */
ci_status sandbox_build(const struct ci_config *cfg, const struct build_opts *o,
                        struct ci_sandbox **ret, struct ci_error *err);

/* plan.c: the root filesystem as steps, the environment, their strings. */
char *plan_str(struct ci_sandbox *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
struct op *plan_op(struct ci_sandbox *sb, enum op_kind kind, const char *rel, const char *what);
ci_status plan_root(struct ci_sandbox *sb);
ci_status plan_env(struct ci_sandbox *sb, char **envp, const char *home, const char *tmp);
void plan_font_cache(struct ci_sandbox *sb);

/* seccomp.c: the task's filter into sb->seccomp. */
ci_status plan_seccomp(struct ci_sandbox *sb);

/* init.c: the child of a run, namespaced or bare. */
__attribute__((noreturn)) void init_main(const struct child_args *a);
__attribute__((noreturn)) void bare_main(const struct child_args *a);

/* probe.c: runs `pass` in a child of one of sb's zygotes (never cold), the
 * warm try of the probe, or of ci_sandbox_new after a deferred probe. */
ci_status warm_try(struct ci_sandbox *sb, struct ci_error *err);

/* run.c: a run's start, its processes and channels, its messages, its end. */
ci_status run_start(struct ci_sandbox *sb, const struct ci_job *job, bool warm,
                    bool *ret_fallback, struct ci_sandbox_run **ret, struct ci_error *err);
ci_status new_task_cgroup(struct ci_sandbox_run *run, const struct ci_job *job,
                          struct ci_error *err);
ci_status finish_start(struct ci_sandbox_run *run, const struct ci_job *job, bool *ret_fallback,
                       struct ci_error *err);
ci_status write_proc_file(pid_t pid, const char *name, const char *text, struct ci_error *err);
void promote_keeper(const struct ci_sandbox_run *run);
pid_t pidfd_pid(int pidfd);
uid_t outside_uid_of(pid_t pid, uid_t inside);
void pin_oom_score(const struct ci_sandbox *sb, pid_t task);
void close_child_ends(struct ci_sandbox_run *run);
ci_status send_byte(struct ci_sandbox_run *run);
/* Bare mode: the task's process has been reaped; the caller's hook (if
 * any) kills what it left before the artifacts are read. */
void bare_task_reaped(struct ci_sandbox_run *run);
void send_code(struct ci_sandbox_run *run);
ci_status recv_msg(struct ci_sandbox_run *run, int timeout_ms, struct msg *m, int *ret_fd);
ci_status recv_msg_on(int sock, int timeout_ms, struct msg *m, int *ret_fd);
ci_status recv_msg_fds(int sock, int timeout_ms, struct msg *m, int *ret_fds, int n);
void describe_failure(const struct ci_sandbox *sb, const struct msg *m, char *out, size_t size);
void signal_init(struct ci_sandbox_run *run, int sig);
bool init_exited(const struct ci_sandbox_run *run, int timeout_ms);
bool run_exited(const struct ci_sandbox_run *run);
void run_kill_now(struct ci_sandbox_run *run);
void run_close_io(struct ci_sandbox_run *run);
void run_close(struct ci_sandbox_run *run);
bool plain_name(const char *name);

/* artifacts.c: the artifact walk; a bare run's directory removed. */
ci_status collect_artifacts(struct ci_sandbox_run *run, struct ci_sandbox_result *r);
int open_beneath(int dirfd, const char *name, int flags);
/* Reads a small file of the workspace (a regular file of one link, nothing
 * followed), at most max bytes: artifacts.c. */
ci_status read_beneath(int ws_fd, const char *name, uint64_t max, uint8_t **ret_data,
                       size_t *ret_len, uint64_t *ret_size);
void remove_tree_at(int dirfd, int depth);

/* session.c: a session step's files before the code (written as write_inputs
 * writes, its fs ids switched), its state and report keys after the run
 * (into r->outcome.session, before the artifact walk), the names that are
 * never artifacts, the restored files that are none when unchanged. */
ci_status session_write(struct ci_sandbox_run *run, const struct ci_job *job,
                        struct ci_error *err);
ci_status session_collect(struct ci_sandbox_run *run, struct ci_sandbox_result *r);
bool session_reserved_name(const char *name);
bool session_unchanged(const struct ci_sandbox_run *run, const char *rel, const char *sha);

/* outputs.c: the rich outputs the driver left in .ci-outputs, checked, into
 * r->outcome (after the artifact walk: an image's artifact must be one);
 * the names that are never artifacts nor part of a state. */
ci_status outputs_collect(struct ci_sandbox_run *run, struct ci_sandbox_result *r);
bool outputs_reserved_name(const char *name);

/* uids.c: the task uids. */
ci_status uids_init(struct task_uids *u, const struct ci_config *cfg, bool root, bool warm,
                    struct ci_error *err);
void uids_release(struct task_uids *u);
ci_status uids_take_cold(struct task_uids *u, uint32_t *ret_slot); /* CI_ERR_LIMIT: none free */
void uids_give_cold(struct task_uids *u, uint32_t slot);
int uids_take_block(struct task_uids *u); /* -1: none free */
void uids_give_block(struct task_uids *u, int block);

/* warm.c: the zygotes of a sandbox, and a run's start in one. */
ci_status warm_start(struct ci_sandbox *sb, unsigned pool_size, struct ci_error *err);
ci_status start_warm(struct ci_sandbox_run *run, const struct ci_job *job, bool *ret_fallback,
                     struct ci_error *err);
int warm_op_index(const struct ci_sandbox *sb, int op);

#endif
