#include "provider/provider.h"

#include <stdlib.h>
#include <string.h>

#include "core/config.h"

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

void ci_provider_free(struct ci_provider *p)
{
    if (!p)
        return;
    p->ops->destroy(p->ctx);
    free(p);
}

ci_status ci_provider_start(struct ci_provider *p, const struct ci_job *job,
                            struct ci_run **ret_run, struct ci_error *err)
{
    return p->ops->start(p->ctx, job, ret_run, err);
}

ci_status ci_provider_wait(struct ci_provider *p, struct ci_run *run, struct ci_outcome *ret)
{
    return p->ops->wait(p->ctx, run, ret);
}

void ci_provider_cancel(struct ci_provider *p, struct ci_run *run)
{
    p->ops->cancel(p->ctx, run);
}

void ci_provider_release(struct ci_provider *p, struct ci_run *run)
{
    if (run)
        p->ops->release(p->ctx, run);
}
