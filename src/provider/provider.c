/* provider.c - the calls through a provider's table (provider.h). */
#include "provider/provider.h"

#include <stdlib.h>
#include <string.h>


void ci_provider_free(struct ci_provider *p)
{
    if (!p)
        return;
    p->ops->destroy(p->ctx);
    free(p);
}

void ci_provider_warm_stats(struct ci_provider *p, struct ci_warm_stats *ret)
{
    memset(ret, 0, sizeof(*ret));
    if (p && p->ops->warm_stats)
        p->ops->warm_stats(p->ctx, ret);
}

const char *ci_provider_isolation(const struct ci_provider *p)
{
    const char *s = p && p->ops->isolation ? p->ops->isolation(p->ctx) : NULL;
    return s ? s : "";
}

void ci_provider_notes(const struct ci_provider *p, struct ci_provider_notes *ret)
{
    memset(ret, 0, sizeof(*ret));
    if (p && p->ops->notes)
        p->ops->notes(p->ctx, ret);
}

unsigned ci_provider_warm_ready(struct ci_provider *p)
{
    struct ci_warm_stats st;
    ci_provider_warm_stats(p, &st);
    return st.ready;
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
