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
 * left, and its cgroup.
 *
 * At stop, what is still queued is freed in parallel, each run on a thread
 * of its own, beside the run the reaper's thread is freeing: the stop
 * takes as long as the slowest of them, not their sum. One run's free is
 * bounded (run_kill_now: 5 s for init to go; ci_cgroup_free: 2 s per
 * controller directory that does not empty: 11 s with cgroup v1's three,
 * should an init not exit at all), so the stop is too, whatever the number
 * of slots. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>

#include "sandbox/sandbox_int.h"

/* A run whose peak memory was above this is freed by its caller: its
 * memory is gone before the slot takes another task, as before. */
#define REAPER_MAX_PEAK_MB 256

static void *free_main(void *arg)
{
    ci_sandbox_run_free(arg);
    return NULL;
}

/* Frees the runs of list at once: SIGKILL to every init first (their
 * teardowns overlap in the kernel), then each freed on a thread of its own
 * (inline when one cannot start), all joined. */
static void free_in_parallel(struct ci_sandbox_run *list)
{
    size_t n = 0;
    for (struct ci_sandbox_run *run = list; run; run = run->reap_next, n++)
        signal_init(run, SIGKILL);
    pthread_t *t = n ? calloc(n, sizeof(*t)) : NULL;
    bool *started = n ? calloc(n, sizeof(*started)) : NULL;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    size_t i = 0;
    for (struct ci_sandbox_run *run = list, *next; run; run = next, i++) {
        next = run->reap_next;
        if (!t || !started || pthread_create(&t[i], NULL, free_main, run) != 0)
            ci_sandbox_run_free(run);
        else
            started[i] = true;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    for (i = 0; i < n && t && started; i++)
        if (started[i])
            pthread_join(t[i], NULL);
    free(t);
    free(started);
}

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
    struct ci_sandbox_run *queued = r->head; /* ours; the thread ends after its current one */
    r->head = r->tail = NULL;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    free_in_parallel(queued);
    pthread_join(r->thread, NULL);
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
