/* provider_cloudrun.h - the `cloudrun` provider: tasks run on a ci-executor
 * service (src/executor) over HTTPS, with an ID token. */
#ifndef CI_PROVIDER_CLOUDRUN_H
#define CI_PROVIDER_CLOUDRUN_H

#include "core/config.h"
#include "provider/provider.h"

/* Tasks run on the service at cfg->cloudrun.service_url (CI_ERR_INVALID
 * when it is not set). */
ci_status ci_provider_cloudrun_new(const struct ci_config *cfg, struct ci_provider **ret,
                                   struct ci_error *err);

#endif
