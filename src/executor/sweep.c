/* sweep.c - kills what a bare task left behind (see sweep.h).
 *
 * The children are found in /proc (each /proc/PID/stat names its parent):
 * /proc/PID/task/TID/children is not offered everywhere (gVisor). */
#include "executor/sweep.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"

#define MAX_ROUND 4096 /* children killed per look at /proc */
#define REAP_EVERY_MS 10 /* how often a watching reaper looks for exited orphans */

struct ci_reaper {
    pthread_mutex_t lock; /* held while reaping, so that unwatch() waits for it */
    pthread_cond_t cond;
    pid_t task; /* 0: not watching */
    bool stopping;
    pthread_t thread;
};

/* Reaps every exited child but task. waitid(WNOWAIT) looks without
 * reaping; if the one it shows is the task itself, the task has ended: the
 * sandbox reaps it and the sweep takes the rest. */
static void reap_orphans(pid_t task)
{
    for (unsigned i = 0; i < MAX_ROUND; i++) {
        siginfo_t si;
        memset(&si, 0, sizeof(si));
        if (waitid(P_ALL, 0, &si, WEXITED | WNOHANG | WNOWAIT | __WALL) != 0 || si.si_pid == 0 ||
            si.si_pid == task)
            return;
        if (waitpid(si.si_pid, NULL, WNOHANG | __WALL) <= 0)
            return;
    }
}

static void *reaper_main(void *arg)
{
    struct ci_reaper *r = arg;
    pthread_mutex_lock(&r->lock);
    while (!r->stopping) {
        if (r->task <= 0) {
            pthread_cond_wait(&r->cond, &r->lock);
            continue;
        }
        reap_orphans(r->task);
        struct timespec ts;
        ci_mono_deadline(&ts, REAP_EVERY_MS);
        pthread_cond_timedwait(&r->cond, &r->lock, &ts);
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

ci_status ci_reaper_new(struct ci_reaper **ret, struct ci_error *err)
{
    struct ci_reaper *r = calloc(1, sizeof(*r));
    if (!r)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&r->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&r->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&r->thread, NULL, reaper_main, r) != 0) {
        pthread_cond_destroy(&r->cond);
        pthread_mutex_destroy(&r->lock);
        free(r);
        return ci_error_set(err, CI_ERR_SYS, "cannot start the executor's reaper thread");
    }
    *ret = r;
    return CI_OK;
}

void ci_reaper_free(struct ci_reaper *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->lock);
    r->stopping = true;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

void ci_reaper_watch(struct ci_reaper *r, pid_t task)
{
    pthread_mutex_lock(&r->lock);
    r->task = task;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
}

void ci_reaper_unwatch(struct ci_reaper *r)
{
    pthread_mutex_lock(&r->lock);
    r->task = 0;
    pthread_mutex_unlock(&r->lock);
}

ci_status ci_sweep_init(struct ci_error *err)
{
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
        return ci_error_errno(err, CI_ERR_SYS, errno,
                              "cannot become the reaper of the tasks' orphans "
                              "(PR_SET_CHILD_SUBREAPER)");
    return CI_OK;
}

/* The parent of pid, from /proc/PID/stat ("pid (comm) state ppid ...
 * num_threads ..."; the comm may hold spaces and parentheses: the last ')'
 * ends it); -1 when it is gone. *ret_zombie: nothing of it runs any more
 * (it needs reaping, not killing). A first thread that called exit(2)
 * alone shows as a zombie while the others run on: that process is alive. */
static pid_t parent_of(const char *pid, bool *ret_zombie)
{
    *ret_zombie = false;
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%s/stat", pid);
    CI_AUTOCLOSE int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *close_paren = strrchr(buf, ')');
    if (!close_paren)
        return -1;
    char state;
    int ppid;
    long threads = 0;
    if (sscanf(close_paren + 1,
               " %c %d %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %ld", &state,
               &ppid, &threads) != 3)
        return -1;
    *ret_zombie = state == 'Z' && threads <= 1;
    return (pid_t)ppid;
}

/* Sends SIGKILL to every process whose parent is us; returns how many. */
static unsigned kill_children(void)
{
    DIR *d = opendir("/proc");
    if (!d)
        return 0;
    pid_t self = getpid();
    unsigned n = 0;
    struct dirent *e;
    while (n < MAX_ROUND && (e = readdir(d)) != NULL) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        bool zombie;
        if (parent_of(e->d_name, &zombie) != self || zombie)
            continue;
        pid_t pid = (pid_t)strtol(e->d_name, NULL, 10);
        if (pid > 0 && kill(pid, SIGKILL) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* Reaps every child that has exited; returns whether a child is left. */
static bool reap(void)
{
    for (;;) {
        pid_t r = waitpid(-1, NULL, WNOHANG | __WALL);
        if (r > 0)
            continue;
        return r == 0; /* 0: children, none exited yet; -1 ECHILD: none */
    }
}

unsigned ci_sweep_children(int timeout_ms, unsigned *ret_left)
{
    unsigned killed = 0;
    int64_t deadline = ci_mono_ms() + timeout_ms;
    /* Kill, reap, look again: a killed process's own children are handed
     * to us when it dies. */
    while (reap() && ci_mono_ms() < deadline) {
        killed += kill_children();
        struct timespec ts = {0, 5 * 1000000L};
        nanosleep(&ts, NULL);
    }
    /* Whatever is still our child: alive, or a zombie we cannot reap (one
     * that another process traces is reported to its tracer first). */
    unsigned left = 0;
    if (reap()) {
        DIR *d = opendir("/proc");
        struct dirent *e;
        pid_t self = getpid();
        bool zombie;
        while (d && (e = readdir(d)) != NULL)
            if (isdigit((unsigned char)e->d_name[0]) && parent_of(e->d_name, &zombie) == self)
                left++;
        if (d)
            closedir(d);
    }
    if (ret_left)
        *ret_left = left;
    return killed;
}
