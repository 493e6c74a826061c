/* provider_local.h - the `local` provider: tasks run in the namespace
 * sandbox on this machine (sandbox.h), cold or warm. */
#ifndef CI_PROVIDER_LOCAL_H
#define CI_PROVIDER_LOCAL_H

#include "core/config.h"
#include "provider/provider.h"

struct ci_sandbox_probe; /* sandbox/sandbox.h */

/* Probes the machine, then prepares the sandbox (in warm mode the probe's
 * try of a zygote is made with the pool's first: ci_sandbox_probe_deferred).
 * With isolation `auto` on a machine without namespaces this succeeds in the
 * no-sandbox mode (ci_provider_isolation says "none"); when warm mode is
 * unavailable it succeeds and tasks run cold; when the task uids cannot be
 * used every task runs as local.sandbox_uid. ci_provider_notes() says each
 * of these apart; err->msg holds the first of them, "" when none holds. */
ci_status ci_provider_local_new(const struct ci_config *cfg, struct ci_provider **ret,
                                struct ci_error *err);

/* The same on probe, made by the caller (ci_sandbox_probe) on this machine
 * with settings the probe reads as cfg has them: a caller that probed
 * already saves a second probe, which in warm mode starts a zygote and runs
 * a task in it. */
ci_status ci_provider_local_new_probed(const struct ci_config *cfg,
                                       const struct ci_sandbox_probe *probe,
                                       struct ci_provider **ret, struct ci_error *err);

#endif
