/* provider_local.h - the `local` provider: tasks run in the namespace
 * sandbox on this machine (sandbox.h), cold or warm. */
#ifndef CI_PROVIDER_LOCAL_H
#define CI_PROVIDER_LOCAL_H

#include "core/config.h"
#include "provider/provider.h"

struct ci_sandbox_probe; /* sandbox/sandbox.h */

/* Probes the machine, then prepares the sandbox. With isolation `auto` on a
 * machine without namespaces this succeeds in the no-sandbox mode and leaves
 * the warning to log in err->msg; on a normal success err->msg is "". */
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
