/* sched.h - the scheduling policy of the sandbox's own processes: a
 * spare's warm-up and a task's keeper run at SCHED_IDLE where the worker
 * can put them back, and it does so whenever it has to wait for them. */
#ifndef CI_SANDBOX_SCHED_H
#define CI_SANDBOX_SCHED_H

#include <stdbool.h>
#include <sys/types.h>

/* Can we take another process out of SCHED_IDLE? Tried on a child (with
 * RLIMIT_NICE 0), not read off our capabilities: in a user namespace
 * CAP_SYS_NICE shows but does not count (the kernel asks the initial
 * namespace's). Forks: call it once, at setup. */
bool sched_can_renice(void);

/* Can we list a process's children (/proc/PID/task/TID/children, which
 * CONFIG_PROC_CHILDREN gives)? Without it nothing can be put back. */
bool sched_can_list_children(void);

/* Puts the children of pid - and theirs, depth levels down - that run at
 * SCHED_IDLE back to SCHED_OTHER; no other policy is changed. pidfd (-1:
 * none) is pid's: when it says pid has exited, the pid may be another
 * process's by now and nothing is done. Best effort. */
void sched_promote_idle(pid_t pid, int pidfd, int depth);

#endif
