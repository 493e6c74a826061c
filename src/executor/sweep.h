/* sweep.h - nothing of a task outlives it when tasks run without a pid
 * namespace (local.isolation: none).
 *
 * A bare task runs in its own process group, which is killed when it ends;
 * but a process that called setsid() (or double-forked into a new session)
 * is out of that group and would live on, as the same uid as the next
 * task, to watch it. So the executor makes itself a child subreaper: every
 * orphan of a task becomes its child instead of init's, and as soon as the
 * sandbox has reaped a task's own process (one task at a time in this mode;
 * the job's bare_hooks, core/job.h) it kills and reaps every child it has,
 * before the sandbox reads the task's artifacts and removes its directory:
 * nothing of the task runs while they are. */
#ifndef CI_SWEEP_H
#define CI_SWEEP_H

#include <sys/types.h>

#include "core/status.h"

/* Makes this process the reaper of its descendants' orphans
 * (PR_SET_CHILD_SUBREAPER). */
ci_status ci_sweep_init(struct ci_error *err);

/* While a bare task runs, its orphans that exit stay zombies until reaped,
 * and a zombie still counts against the task's RLIMIT_NPROC (`sh -c 'x &'`
 * in a loop would soon fail with EAGAIN). A reaper is a thread that, from
 * ci_reaper_watch(task) to ci_reaper_unwatch(), reaps every child of this
 * process that has exited except task, which the sandbox waits for. */
struct ci_reaper;

ci_status ci_reaper_new(struct ci_reaper **ret, struct ci_error *err);
/* Stops the thread. Accepts NULL. */
void ci_reaper_free(struct ci_reaper *r);
/* task is the bare task's process, just started: reap its orphans. */
void ci_reaper_watch(struct ci_reaper *r, pid_t task);
/* Stops reaping; returns once no waitpid() of the reaper is in progress
 * (the caller may then reap and reuse pids freely). */
void ci_reaper_unwatch(struct ci_reaper *r);

/* Kills (SIGKILL) and reaps every child of this process, again and again
 * as their own children are handed over, until none is left or timeout_ms
 * passed. Call only when no task runs: it takes every child. Returns how
 * many processes it killed; *ret_left (may be NULL) is how many children
 * were still there at the end, alive or not reapable (0 unless something
 * cannot be killed, or a zombie is held by a tracer). */
unsigned ci_sweep_children(int timeout_ms, unsigned *ret_left);

#endif
