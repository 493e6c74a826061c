/* job.c - releasing what a run produced (job.h). */
#include "core/job.h"

#include <stdlib.h>
#include <string.h>

void ci_artifact_release(struct ci_artifact *a)
{
    if (!a)
        return;
    free(a->name);
    free(a->mime_type);
    free(a->data);
    memset(a, 0, sizeof(*a));
}

void ci_output_release(struct ci_output *out)
{
    if (!out)
        return;
    for (size_t i = 0; i < out->n_data; i++)
        free(out->data[i].value);
    free(out->artifact);
    memset(out, 0, sizeof(*out));
}

void ci_outcome_release(struct ci_outcome *o)
{
    if (!o)
        return;
    free(o->out);
    free(o->err);
    for (size_t i = 0; i < o->n_artifacts; i++)
        ci_artifact_release(&o->artifacts[i]);
    free(o->artifacts);
    free(o->error);
    free(o->hint);
    free(o->session.restore_error);
    free(o->session.dropped);
    free(o->session.state);
    free(o->session.state_error);
    for (size_t i = 0; i < o->n_outputs; i++)
        ci_output_release(&o->outputs[i]);
    free(o->outputs);
    memset(o, 0, sizeof(*o));
}
