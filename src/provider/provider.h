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

struct ci_config;

struct ci_run; /* opaque, provider-specific */

struct ci_provider_ops {
    const char *name;
    ci_status (*start)(void *ctx, const struct ci_job *job, struct ci_run **ret_run,
                       struct ci_error *err);
    ci_status (*wait)(void *ctx, struct ci_run *run, struct ci_outcome *ret_outcome);
    void (*cancel)(void *ctx, struct ci_run *run);
    void (*release)(void *ctx, struct ci_run *run);
    void (*destroy)(void *ctx);
};

struct ci_provider {
    const struct ci_provider_ops *ops;
    void *ctx;
};

/* Creates the provider named in cfg->worker.provider. */
ci_status ci_provider_new(const struct ci_config *cfg, struct ci_provider **ret,
                          struct ci_error *err);
void ci_provider_free(struct ci_provider *p);

static inline const char *ci_provider_name(const struct ci_provider *p) { return p->ops->name; }
/* Zygotes of the local provider ready to take a task (local.mode: warm,
 * zygote.h); 0 for another provider or in cold mode. Thread-safe. */
unsigned ci_provider_warm_ready(struct ci_provider *p);
ci_status ci_provider_start(struct ci_provider *p, const struct ci_job *job,
                            struct ci_run **ret_run, struct ci_error *err);
ci_status ci_provider_wait(struct ci_provider *p, struct ci_run *run, struct ci_outcome *ret);
void ci_provider_cancel(struct ci_provider *p, struct ci_run *run);
void ci_provider_release(struct ci_provider *p, struct ci_run *run);

/* Constructors of the providers (provider_local.c, provider_cloudrun.c). */
ci_status ci_provider_local_new(const struct ci_config *cfg, struct ci_provider **ret,
                                struct ci_error *err);
/* The `cloudrun` provider: tasks run on a ci-executor service at
 * cfg->cloudrun.service_url (CI_ERR_INVALID when it is not set). */
ci_status ci_provider_cloudrun_new(const struct ci_config *cfg, struct ci_provider **ret,
                                   struct ci_error *err);

#endif
