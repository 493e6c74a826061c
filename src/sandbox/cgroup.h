/* cgroup.h - one cgroup per task: memory, pids and cpu limits, and after the
 * run whether the OOM killer struck and the peak memory.
 *
 * Where the cgroups go. A sandbox owns a parent cgroup P created inside the
 * worker's own cgroup X (never elsewhere: a task must stay under every limit
 * that applies to the worker), and each task gets a child of P:
 *
 *   v2: X/ci-worker-<pid>-<n>/task-<k>, with memory, pids and cpu enabled in
 *       X's and P's cgroup.subtree_control. When X holds processes (a
 *       container whose cgroup is the worker's own), cgroup v2's "no internal
 *       processes" rule forbids enabling them in X: the worker then moves
 *       itself into the leaf X/ci-worker-<pid>-self first (as nsjail does).
 *   v1: the same P/task-<k> under X in each of the memory, pids and cpu
 *       hierarchies (cpu may be co-mounted with cpuacct).
 *
 * A task cgroup is created and limited before its first process exists; the
 * sandbox writes its init's pid into it before init forks anything. After
 * the run it is killed (v2: cgroup.kill), waited for until empty and removed.
 * Parents left behind by a dead worker (its pid no longer exists) are removed
 * when a new root is created.
 *
 * v2 needs Linux >= 5.19 for memory.peak (without it the peak is unknown)
 * and >= 5.14 for cgroup.kill (without it the pids in cgroup.procs are
 * killed one by one). Thread-safe: tasks of one root may be created and
 * removed from several threads at once. Nothing here logs. */
#ifndef CI_CGROUP_H
#define CI_CGROUP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/status.h"

enum ci_cgroup_version { CI_CGROUP_NONE = 0, CI_CGROUP_V1 = 1, CI_CGROUP_V2 = 2 };

enum ci_cgroup_controller { CI_CG_MEMORY, CI_CG_PIDS, CI_CG_CPU, CI_CG_COUNT };

#define CI_CGROUP_PATH_MAX 512

/* The directories of this process's own cgroup (X above), one per
 * controller; with v2 the three are the same directory. */
struct ci_cgroup_places {
    enum ci_cgroup_version version;
    char dir[CI_CG_COUNT][CI_CGROUP_PATH_MAX];
};

/* Finds a hierarchy with memory, pids and cpu from /proc/self/mountinfo and
 * /proc/self/cgroup: v2 when this process's cgroup2 directory lists the three
 * in cgroup.controllers, else v1 when the three v1 hierarchies are mounted.
 * Checks no permission (ci_cgroup_root_new does, by creating). Returns
 * CI_ERR_UNSUPPORTED with the reason when neither exists. */
ci_status ci_cgroup_find(struct ci_cgroup_places *ret, struct ci_error *err);

/* Whether the kernel favors dynamic cgroup changes: a kernel before 6.0
 * (always did), or a cgroup mount with `favordynmods` (kernel-wide). Without
 * it each move of a process into a cgroup after a pause of some 30 ms or
 * more waits for an RCU grace period (the percpu threadgroup rwsem): ~6-8
 * ms measured on a 2-core VM (issue 16), where a warm task's start moves
 * two. A guess from the mount table: on kernels where turning it on is for
 * good (6.18 here), a remount without it leaves the moves fast. */
bool ci_cgroup_favor_dynmods(void);

struct ci_cgroup_root;

/* Removes the parents of dead workers in places, then creates this root's
 * parent P (v2: enabling the controllers, see above). Fails with
 * CI_ERR_UNSUPPORTED and the reason ("mkdir ...: Permission denied") when
 * the worker may not. Tests may pass a directory tree of their own. */
ci_status ci_cgroup_root_new(const struct ci_cgroup_places *places,
                             struct ci_cgroup_root **ret, struct ci_error *err);
/* Removes what is left of the task cgroups, then P. Accepts NULL. */
void ci_cgroup_root_free(struct ci_cgroup_root *root);
enum ci_cgroup_version ci_cgroup_root_version(const struct ci_cgroup_root *root);
/* P in the memory hierarchy (v2: the only one). */
const char *ci_cgroup_root_dir(const struct ci_cgroup_root *root);

struct ci_cgroup_limits {
    uint64_t memory_bytes; /* memory.max; no swap at all */
    uint32_t pids;         /* pids.max: processes and threads */
    uint32_t cpus;         /* cpu.max: whole CPUs of time per period; 0 = no limit */
};

struct ci_cgroup;

/* Creates a task cgroup under root with the limits written. On failure
 * nothing is left behind and err says which file refused. */
ci_status ci_cgroup_new(struct ci_cgroup_root *root, const struct ci_cgroup_limits *lim,
                        struct ci_cgroup **ret, struct ci_error *err);
/* Moves pid (all of its threads) into the task cgroup, in every hierarchy. */
ci_status ci_cgroup_attach(struct ci_cgroup *cg, pid_t pid, struct ci_error *err);

struct ci_cgroup_stats {
    bool has_peak;       /* the kernel reports a peak (v2 memory.peak, v1 max_usage) */
    uint64_t peak_bytes; /* highest memory use: processes, tmpfs pages, page cache */
    uint64_t oom_kills;  /* processes the OOM killer killed because of memory.max */
    bool has_cpu;
    uint64_t cpu_usec;   /* CPU time of every process that ran in it */
};

/* Reads the memory and CPU statistics; call once the processes are gone. Fields it
 * cannot read stay 0/false. */
void ci_cgroup_stats(const struct ci_cgroup *cg, struct ci_cgroup_stats *ret);

/* Kills whatever is still in the task cgroup, waits (at most ~2 s) until it
 * is empty and removes it; a directory that will not go is left for
 * ci_cgroup_root_free(). Frees cg. Accepts NULL. */
void ci_cgroup_free(struct ci_cgroup *cg);

#endif
