/* child.h - what a sandbox process does for itself before the task's code
 * runs: report to the worker, put its fds in place, build (its part of) the
 * root, drop every privilege. Used by a cold sandbox's init and task
 * (init.c), by ci-zygote's spares (src/zygote/main.c) and by each warm
 * task's init (ci-zygote-init, src/zygote/init.c); each compiles
 * child.c for itself (ci-zygote is built without the sanitizers).
 *
 * Every function here runs in a process cloned from a multi-threaded one,
 * between clone() and execve() (or the task's Python): none allocates,
 * takes a lock or calls a glibc wrapper that signals other threads (the
 * system calls that would are in sys.h). */
#ifndef CI_SANDBOX_CHILD_H
#define CI_SANDBOX_CHILD_H

#include <stdbool.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>

#include "sandbox/sandbox_proto.h"

/* One step of building the root, run in order by init. 0 is no step:
 * child_run_op() refuses it (a zygote sent a kind it does not know). */
enum op_kind {
    OP_TMPFS = 1, /* mount a tmpfs on path with options data */
    OP_DIR,       /* mkdir path */
    OP_SYMLINK,   /* symlink src at path */
    OP_FILE,      /* create path holding data */
    OP_BIND_RO,   /* bind src on path (a dir or a file), read-only, nosuid, nodev */
    OP_BIND_DEV,  /* bind the device node src on path, nosuid, noexec */
    OP_PROC,      /* mount a fresh proc of the pid namespace on path */
};

struct op {
    enum op_kind kind;
    const char *path; /* absolute, under NEWROOT (in a zygote: as the task sees it) */
    const char *src;
    const char *data;
    size_t data_len;
    unsigned long flags; /* OP_TMPFS: mount flags */
    bool dir;            /* OP_BIND_RO: the source is a directory */
    const char *what;    /* for errors: "mount /proc" (the worker's plan only) */
};

/* Sends m on sock (a sandbox's control socket), retrying on EINTR. */
void child_send(int sock, const struct msg *m);

/* Reports a failed step on sock and exits 127. */
__attribute__((noreturn)) void child_fail(int sock, enum step step, int op, int err);

/* Reads one byte from the parent; EOF means the parent is gone. */
bool child_wait_byte(int sock);

/* Sends len bytes of buf with n (at most FD_COUNT) fds attached
 * (SCM_RIGHTS, in order); 0 when all of it went. */
int child_send_fds(int sock, const void *buf, size_t len, const int *fds, int n);
int child_send_with_fd(int sock, const struct msg *m, int fd);

/* Receives one message of exactly len bytes carrying exactly FD_COUNT fds
 * (flags: recvmsg's, MSG_DONTWAIT or 0): 1 with buf and fds filled, 0 at
 * EOF, -1 for nothing usable (what came is closed). */
int child_recv_fds(int sock, void *buf, size_t len, int *fds, int flags);

/* Puts src[0..4] at 0..4, keep (if >= 0) at FD_COUNT, and closes every
 * other fd: O_CLOEXEC only helps at execve, and an init never executes
 * anything. */
int child_move_fds(const int *src, int keep);

/* Writes data to a file opened with O_WRONLY | O_CLOEXEC | O_NOFOLLOW |
 * flags (O_CREAT | O_EXCL for a new one). */
int child_write_file(const char *path, const char *data, size_t len, int flags);

/* Runs one step of the plan; -1 with errno on failure. */
int child_run_op(const struct op *op);

/* Drops every capability for good but those in keep (bit CAP_*), which
 * stay permitted, effective and ambient (across an exec): bounding set,
 * ambient, effective, permitted, inheritable; then no_new_privs. Not
 * dumpable: the task cannot ptrace init or read its /proc entries. Returns
 * the step that failed (errno set), or STEP_NONE. */
enum step child_drop_privileges(uint64_t keep);
/* The end of an init's setup, cold or warm alike: READY with a /workspace
 * fd (the parent writes the inputs through it, reads the artifacts later)
 * and, from a cold init, a pidfd of its task process (task_pidfd, or -1:
 * the worker sets its OOM score), every privilege dropped, then wait for
 * GO; keep: the capabilities child_drop_privileges() keeps. Returns only
 * on GO; any failure is reported on sock (or ends the process). */
void child_ready_then_go(int sock, int task_pidfd, uint64_t keep);

/* Is si (from sigwaitinfo) the worker's stop request? Sent from outside
 * the namespace (si_pid 0) by kill() or pidfd_send_signal() (SI_USER). A
 * process of the sandbox can queue SIG_STOP with any si_pid through
 * rt_sigqueueinfo(), but the kernel refuses it si_code SI_USER. */
static inline bool child_is_stop_request(int sig, const siginfo_t *si)
{
    return sig == SIG_STOP && si->si_code == SI_USER && si->si_pid == 0;
}

/* Sets the sandbox's own inotify quota (its user namespace's sysctls,
 * under a mounted /proc; the caller still has its capabilities); -1 with
 * errno if it could not. */
int child_limit_inotify(const char *instances, const char *watches);

/* Reads what one read() gives of a small file (a /proc one) into buf,
 * NUL-terminated; 0, or -1 if it cannot be opened or is empty. */
int child_read_small(const char *path, char *buf, size_t size);

/* Reads n numeric fields of a /proc/<pid>/stat file from field `first`
 * (numbered from 1, as in proc(5); first >= 3) into ret; 0, or -1. */
int child_stat_fields(const char *path, int first, int n, unsigned long long *ret);

/* Adds what one reaped process used to a DONE message. */
void child_add_rusage(struct msg *m, const struct rusage *ru);

#endif
