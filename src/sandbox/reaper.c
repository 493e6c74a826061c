/* reaper.c - warm runs freed on a thread of the sandbox's own
 * (ci_sandbox_run_release), so that the slot that ran one takes its next
 * task at once.
 *
 * Freeing a warm run waits for its init to be gone - which, as pid 1 of
 * the task's pid namespace, waits for the keeper to tear the task's
 * address space down (at SCHED_IDLE for up to 100 ms: run_kill_now) and
 * tears its own copy of the zygote's down - and
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
 * of slots.
 *
 * The thread also takes stuck runs, cold or warm: runs whose init had not
 * exited 10 s after its SIGKILL when ci_sandbox_wait gave up on it (a
 * process of the sandbox frozen, or stuck in the kernel), and cold runs
 * freed without a wait whose init did not exit within run_kill_now's 5 s.
 * Freeing one now
 * would wait for it - for ever for a cold init, which waitpid() reaps -
 * and a slot or the queue behind it with it. So it only waits in a list,
 * looked at every STUCK_POLL_MS without blocking (a poll of init's pidfd,
 * a waitid(WNOHANG|WNOWAIT) of a cold init), and is freed once its init
 * has exited, when the free is quick. Until then its pid (unreaped), its
 * pidfd, its cgroup and its task uid stay its own: none can be reused by
 * another run meanwhile. The list is not bounded by max_pending: each
 * entry is a sandbox that SIGKILL could not end, which no bound of ours
 * frees; the stop frees them as the queue (bounded, then left as they
 * are: see run_kill_now). Not bounded: the stop of a warm sandbox with a
 * stuck run, whose zygote, pid 1 of the run's parent namespace, cannot
 * exit before it, so that the pool's free waits for it (zygote.c). A
 * poll, not a wakeup on each pidfd: simpler, and a second's delay costs
 * nothing to a run that was stuck for 10. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>

#include "core/util.h"
#include "sandbox/sandbox_int.h"

/* A run whose peak memory was above this is freed by its caller: its
 * memory is gone before the slot takes another task, as before. */
#define REAPER_MAX_PEAK_MB 256
#define STUCK_POLL_MS 1000 /* how often stuck runs are looked at */

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

/* Takes the stuck runs whose init has exited off the list (lock held). */
static struct ci_sandbox_run *take_exited(struct reaper *r)
{
    struct ci_sandbox_run *gone = NULL;
    for (struct ci_sandbox_run **p = &r->stuck; *p;) {
        struct ci_sandbox_run *run = *p;
        if (!run_exited(run)) {
            p = &run->reap_next;
            continue;
        }
        *p = run->reap_next;
        run->reap_next = gone;
        gone = run;
    }
    return gone;
}

static void *reaper_main(void *arg)
{
    struct ci_sandbox *sb = arg;
    struct reaper *r = &sb->reaper;
    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (!r->head && !r->stuck && !r->stopping)
            pthread_cond_wait(&r->cond, &r->lock);
        if (!r->head && !r->stopping) { /* stuck ones only: look again in a while */
            struct timespec until;
            ci_mono_deadline(&until, STUCK_POLL_MS);
            pthread_cond_timedwait(&r->cond, &r->lock, &until);
        }
        struct ci_sandbox_run *gone = take_exited(r);
        struct ci_sandbox_run *run = r->head;
        if (run) {
            r->head = run->reap_next;
            if (!r->head)
                r->tail = NULL;
            /* Its keeper may stay idle a while only with nothing queued
             * behind it: one wait at a time, never a full queue's. */
            run->reaper_frees = !r->head;
        }
        if (!run && !gone && r->stopping)
            break; /* nothing left: the stop took the rest */
        pthread_mutex_unlock(&r->lock);
        for (struct ci_sandbox_run *next; gone; gone = next) {
            next = gone->reap_next;
            gone->stuck = false; /* its init has exited: the free is quick */
            ci_sandbox_run_free(gone);
        }
        if (run)
            ci_sandbox_run_free(run);
        pthread_mutex_lock(&r->lock);
        if (run)
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
    pthread_condattr_t ca;
    bool cond_ok = pthread_condattr_init(&ca) == 0;
    if (cond_ok) {
        cond_ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
                  pthread_cond_init(&r->cond, &ca) == 0;
        pthread_condattr_destroy(&ca);
    }
    if (!cond_ok) {
        pthread_mutex_destroy(&r->lock);
        return CI_ERR_SYS;
    }
    /* A stop may have left its counts (ci_sandbox_new starts it again). */
    r->stopping = false;
    r->head = r->tail = r->stuck = NULL;
    r->pending = 0;
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
    if (r->stuck) { /* freed with the queue: bounded (run_kill_now) */
        struct ci_sandbox_run *last = r->stuck;
        while (last->reap_next)
            last = last->reap_next;
        last->reap_next = queued;
        queued = r->stuck;
        r->stuck = NULL;
    }
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    free_in_parallel(queued);
    pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    r->running = false;
}

bool reaper_take_stuck(struct ci_sandbox_run *run)
{
    struct reaper *r = &run->sb->reaper;
    if (!r->running)
        return false;
    pthread_mutex_lock(&r->lock);
    bool taken = !r->stopping;
    if (taken) {
        run->reap_next = r->stuck;
        r->stuck = run;
        pthread_cond_signal(&r->cond);
    }
    pthread_mutex_unlock(&r->lock);
    return taken;
}

void ci_sandbox_run_release(struct ci_sandbox_run *run)
{
    if (!run)
        return;
    struct reaper *r = &run->sb->reaper;
    bool queued = false;
    if (r->running && run->warm && run->waited && !run->stuck &&
        run->peak_mb <= REAPER_MAX_PEAK_MB) {
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
