/* registry.h - the providers a worker can be configured with, by name
 * (worker.provider). Only programs that may run any of them link this;
 * ci-executor links the local provider alone. */
#ifndef CI_PROVIDER_REGISTRY_H
#define CI_PROVIDER_REGISTRY_H

#include "core/config.h"
#include "provider/provider.h"

/* Creates the provider named in cfg->worker.provider. */
ci_status ci_provider_new(const struct ci_config *cfg, struct ci_provider **ret,
                          struct ci_error *err);

#endif
