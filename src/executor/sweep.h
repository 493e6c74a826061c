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

#include "core/status.h"

/* Makes this process the reaper of its descendants' orphans
 * (PR_SET_CHILD_SUBREAPER). */
ci_status ci_sweep_init(struct ci_error *err);

/* Kills (SIGKILL) and reaps every child of this process, again and again
 * as their own children are handed over, until none is left or timeout_ms
 * passed. Call only when no task runs: it takes every child. Returns how
 * many processes it killed; *ret_left (may be NULL) is how many children
 * were still there at the end (0 unless something cannot be killed). */
unsigned ci_sweep_children(int timeout_ms, unsigned *ret_left);

#endif
