/* reaper.c - warm runs freed on a thread of the sandbox's own
 * (ci_sandbox_run_release), so that the slot that ran one takes its next
 * task at once.
 *
 * Freeing a warm run waits for its init to be gone - which, as pid 1 of
 * the task's pid namespace, waits for the keeper to tear the task's
 * address space down and tears its own copy of the zygote's down - and
 * then removes the task's cgroup: measured on a 2-core VM (issue 16),
 * 15-60 ms per task, all of it after the result and the terminal event,
 * with the slot idle. Here it overlaps with the next task.
 *
 * What may wait here is bounded: at most max_pending runs (the worker's
 * slots), and only runs that ended (waited for) and stayed small
 * (REAPER_MAX_PEAK_MB): what is being freed beside the running tasks is at
 * most max_pending such runs. Any other run, and every run when the queue
 * is full, is freed by the caller as before. Nothing of a queued run can
 * act any more: its code has ended, init reported, and every process
 * left in its pid namespace has had SIGKILL; only the kernel's teardown is
 * left, and its cgroup. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "sandbox/sandbox_int.h"

/* A run whose peak memory was above this is freed by its caller: its
 * memory is gone before the slot takes another task, as before. */
#define REAPER_MAX_PEAK_MB 256

static void *reaper_main(void *arg)
{
    struct ci_sandbox *sb = arg;
    struct reaper *r = &sb->reaper;
    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (!r->head && !r->stopping)
            pthread_cond_wait(&r->cond, &r->lock);
        struct ci_sandbox_run *run = r->head;
        if (!run)
            break; /* stopping, and nothing left */
        r->head = run->reap_next;
        if (!r->head)
            r->tail = NULL;
        pthread_mutex_unlock(&r->lock);
        ci_sandbox_run_free(run);
        pthread_mutex_lock(&r->lock);
        r->pending--;
    }
    pthread_mutex_unlock(&r->lock);
    return NULL;
}

ci_status reaper_start(struct ci_sandbox *sb, unsigned max_pending)
{
    struct reaper *r = &sb->reaper;
    if (pthread_mutex_init(&r->lock, NULL) != 0)
        return CI_ERR_SYS;
    if (pthread_cond_init(&r->cond, NULL) != 0) {
        pthread_mutex_destroy(&r->lock);
        return CI_ERR_SYS;
    }
    r->max_pending = max_pending ? max_pending : 1;
    /* No signal for this thread: the worker's are the main thread's. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int e = pthread_create(&r->thread, NULL, reaper_main, sb);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0) {
        pthread_cond_destroy(&r->cond);
        pthread_mutex_destroy(&r->lock);
        /* EAGAIN is a thread or pids limit, not memory: the sandbox goes
         * on without the thread. */
        return e == ENOMEM ? CI_ERR_NOMEM : CI_ERR_SYS;
    }
    r->running = true;
    return CI_OK;
}

void reaper_stop(struct ci_sandbox *sb)
{
    struct reaper *r = &sb->reaper;
    if (!r->running)
        return;
    pthread_mutex_lock(&r->lock);
    r->stopping = true;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    pthread_join(r->thread, NULL); /* it frees what is queued first */
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    r->running = false;
}

void ci_sandbox_run_release(struct ci_sandbox_run *run)
{
    if (!run)
        return;
    struct reaper *r = &run->sb->reaper;
    bool queued = false;
    if (r->running && run->warm && run->waited && run->peak_mb <= REAPER_MAX_PEAK_MB) {
        pthread_mutex_lock(&r->lock);
        if (!r->stopping && r->pending < r->max_pending) {
            run->reap_next = NULL;
            if (r->tail)
                r->tail->reap_next = run;
            else
                r->head = run;
            r->tail = run;
            r->pending++;
            queued = true;
            pthread_cond_signal(&r->cond);
        }
        pthread_mutex_unlock(&r->lock);
    }
    if (!queued)
        ci_sandbox_run_free(run);
}
