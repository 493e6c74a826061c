/* sched.c - the scheduling policy of the sandbox's own processes (sched.h). */
#include "sandbox/sched.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

struct probe {
    pid_t tid;
    int ready[2]; /* the thread says it lowered itself (its tid is set) */
    int done[2];  /* closed once we tried: it may end */
};

static void *probe_main(void *arg)
{
    struct probe *p = arg;
    struct sched_param none = {.sched_priority = 0};
    p->tid = (pid_t)syscall(SYS_gettid);
    char c = sched_setscheduler(0, SCHED_IDLE, &none) == 0 ? 'y' : 'n';
    if (write(p->ready[1], &c, 1) == 1)
        while (read(p->done[0], &c, 1) < 0 && errno == EINTR) /* until EOF */
            ;
    return NULL;
}

bool sched_can_renice(void)
{
    struct probe p = {.ready = {-1, -1}, .done = {-1, -1}};
    if (pipe2(p.ready, O_CLOEXEC) != 0)
        return false;
    if (pipe2(p.done, O_CLOEXEC) != 0) {
        close(p.ready[0]);
        close(p.ready[1]);
        return false;
    }
    bool ok = false;
    pthread_t t;
    if (pthread_create(&t, NULL, probe_main, &p) == 0) {
        char c = 'n';
        if (read(p.ready[0], &c, 1) == 1 && c == 'y') {
            struct sched_param none = {.sched_priority = 0};
            ok = sched_setscheduler(p.tid, SCHED_OTHER, &none) == 0;
        }
        close(p.done[1]);
        p.done[1] = -1;
        pthread_join(t, NULL);
    }
    close(p.ready[0]);
    close(p.ready[1]);
    close(p.done[0]);
    if (p.done[1] >= 0)
        close(p.done[1]);
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
    if (sched_getscheduler(pid) == SCHED_IDLE) { /* SCHED_RESET_ON_FORK is not part of it */
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
