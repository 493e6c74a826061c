/* registry.c - a provider by its configured name (registry.h). */
#include "provider/registry.h"

#include <string.h>

#include "provider/provider_cloudrun.h"
#include "provider/provider_local.h"

ci_status ci_provider_new(const struct ci_config *cfg, struct ci_provider **ret,
                          struct ci_error *err)
{
    if (strcmp(cfg->worker.provider, "local") == 0)
        return ci_provider_local_new(cfg, ret, err);
    if (strcmp(cfg->worker.provider, "cloudrun") == 0)
        return ci_provider_cloudrun_new(cfg, ret, err);
    return ci_error_set(err, CI_ERR_UNSUPPORTED, "provider '%s' is not built in this worker",
                        cfg->worker.provider);
}
