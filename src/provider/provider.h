/* provider.h - how a task is run. The worker only ever talks to a provider
 * through this table; `local` (a namespace sandbox on this machine) and
 * `cloudrun` (a remote /execute service) fill it in.
 *
 * Life of a run: start() returns a run handle at once (or an error that
 * means the code never ran); wait() blocks until the run has ended and fills
 * an outcome; cancel() may be called from any thread at any time between
 * start() and release(), and makes a pending wait() return within a second
 * (after wait() has returned it does nothing); release() frees the run once
 * no other thread can call cancel() on it. Splitting wait() from release()
 * is what makes a cancel racing with the end of a run safe. */
#ifndef CI_PROVIDER_H
#define CI_PROVIDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/job.h"
#include "core/status.h"

struct ci_run; /* opaque, provider-specific */

/* A warm pool as operators see it: all zero for a provider without one. */
struct ci_warm_stats {
    unsigned ready;       /* warm runtimes ready to take a task now */
    uint64_t became_ready; /* warm runtimes that have become ready so far */
    uint64_t died;        /* died without being retired, before or after they were ready */
    uint64_t fallbacks;   /* tasks that ran cold because no warm runtime took them */
    char last_failure[480]; /* why the last one failed to start, "" if none did */
};

/* What a provider found as it started that its operator should hear of once:
 * one sentence per fact, "" where the fact does not hold. Each is logged
 * under its own event: only no_sandbox means tasks run without namespaces. */
struct ci_provider_notes {
    char no_sandbox[512];       /* isolation auto fell back: no namespace sandbox */
    char warm_unavailable[512]; /* local.mode warm, yet tasks run cold: why */
    char task_uids_off[512];    /* every task runs as local.sandbox_uid: why */
    char slow_cgroup_moves[512]; /* each task's start after a pause waits on the kernel */
};

struct ci_provider_ops {
    const char *name;
    ci_status (*start)(void *ctx, const struct ci_job *job, struct ci_run **ret_run,
                       struct ci_error *err);
    ci_status (*wait)(void *ctx, struct ci_run *run, struct ci_outcome *ret_outcome);
    void (*cancel)(void *ctx, struct ci_run *run);
    void (*release)(void *ctx, struct ci_run *run);
    void (*destroy)(void *ctx);
    /* Optional (NULL when the provider keeps no warm pool): the pool's
     * state now. Thread-safe. */
    void (*warm_stats)(void *ctx, struct ci_warm_stats *ret);
    /* Whether it runs session steps: passes ci_job.session's state to the
     * run and fills ci_outcome.session (docs/contract.md §16). */
    bool sessions;
    /* Optional (NULL when it is known only from a task's result, as for a
     * remote executor): the isolation string every run of it carries. */
    const char *(*isolation)(void *ctx);
    /* Optional (NULL when it has none): what it found as it started. */
    void (*notes)(void *ctx, struct ci_provider_notes *ret);
};

struct ci_provider {
    const struct ci_provider_ops *ops;
    void *ctx;
};

void ci_provider_free(struct ci_provider *p);

static inline const char *ci_provider_name(const struct ci_provider *p) { return p->ops->name; }
/* The warm pool's state; all zero for a provider without a warm pool. */
void ci_provider_warm_stats(struct ci_provider *p, struct ci_warm_stats *ret);
/* The isolation string its runs carry ("user,pid,...", "none"), or "" when
 * the provider cannot tell before a task ran. */
const char *ci_provider_isolation(const struct ci_provider *p);
/* What it found as it started; all "" for a provider without notes. */
void ci_provider_notes(const struct ci_provider *p, struct ci_provider_notes *ret);
/* Warm runtimes ready to take a task; 0 for a provider without a warm pool. */
unsigned ci_provider_warm_ready(struct ci_provider *p);
/* CI_ERR_FULL: no room for the run now (the local provider's task uids
 * are all held, some by killed runs whose processes have not exited): the
 * task should be tried again later, not failed. */
ci_status ci_provider_start(struct ci_provider *p, const struct ci_job *job,
                            struct ci_run **ret_run, struct ci_error *err);
ci_status ci_provider_wait(struct ci_provider *p, struct ci_run *run, struct ci_outcome *ret);
void ci_provider_cancel(struct ci_provider *p, struct ci_run *run);
void ci_provider_release(struct ci_provider *p, struct ci_run *run);

#endif
