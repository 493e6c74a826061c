/* sched.c - the scheduling policy of the sandbox's own processes (sched.h). */
#include "sandbox/sched.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* A child of ours, at SCHED_IDLE, with no RLIMIT_NICE of its own to leave
 * it by: what takes it out is a capability that counts, the one that takes
 * a keeper or a spare out (theirs are other uids'). Our own thread would
 * not do: RLIMIT_NICE 20 lets its owner take it out without one. */
bool sched_can_renice(void)
{
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0)
        return false;
    pid_t pid = fork();
    if (pid == 0) {
        struct rlimit none = {0, 0};
        struct sched_param p = {.sched_priority = 0};
        char c = setrlimit(RLIMIT_NICE, &none) == 0 && sched_setscheduler(0, SCHED_IDLE, &p) == 0
                     ? 'y'
                     : 'n';
        if (write(ready[1], &c, 1) == 1)
            for (;;)
                pause(); /* until its SIGKILL */
        _exit(0);
    }
    close(ready[1]);
    bool ok = false;
    if (pid > 0) {
        char c = 'n';
        ssize_t n;
        while ((n = read(ready[0], &c, 1)) < 0 && errno == EINTR)
            ;
        if (n == 1 && c == 'y') {
            struct sched_param normal = {.sched_priority = 0};
            ok = sched_setscheduler(pid, SCHED_OTHER, &normal) == 0;
        }
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    close(ready[0]);
    return ok;
}

bool sched_can_list_children(void)
{
    char path[64];
    pid_t tid = (pid_t)syscall(SYS_gettid);
    snprintf(path, sizeof(path), "/proc/self/task/%d/children", (int)tid);
    return access(path, R_OK) == 0;
}

static bool exited(int pidfd)
{
    if (pidfd < 0)
        return false;
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    return poll(&p, 1, 0) != 0;
}

static void promote(pid_t pid, int depth)
{
    int policy = sched_getscheduler(pid); /* SCHED_RESET_ON_FORK may be or'ed in */
    if (policy >= 0 && (policy & ~SCHED_RESET_ON_FORK) == SCHED_IDLE) {
        const struct sched_param normal = {.sched_priority = 0};
        (void)sched_setscheduler(pid, SCHED_OTHER, &normal);
    }
    if (depth > 1)
        sched_promote_idle(pid, -1, depth - 1);
}

void sched_promote_idle(pid_t pid, int pidfd, int depth)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/task/%d/children", (int)pid, (int)pid);
    /* Opened first: the file stays the process's it was opened for. */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    if (exited(pidfd)) {
        close(fd);
        return;
    }
    /* "PID PID ... ": a read may end inside a number (a seq_file returns
     * what fits), so a number counts only once the space after it is in. */
    char buf[256];
    size_t have = 0;
    for (;;) {
        ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        have += (size_t)n;
        buf[have] = '\0';
        char *p = buf, *space;
        while ((space = strchr(p, ' ')) != NULL) {
            *space = '\0';
            char *end = NULL;
            long child = strtol(p, &end, 10);
            if (end != p && *end == '\0' && child > 0)
                promote((pid_t)child, depth);
            p = space + 1;
        }
        have = strlen(p); /* the start of a number, at most a few digits */
        memmove(buf, p, have);
    }
    close(fd);
}
