/* result.h - what an outcome (job.h) becomes in an ExecutionResult: status,
 * output, usage, exit code, error and hint. One mapping for the worker
 * (task.c) and ci-executor, whatever provider ran the job. The sentences
 * themselves are written where the failure is understood - by the provider,
 * in the outcome; this only fills in for an outcome that has none. */
#ifndef CI_RESULT_H
#define CI_RESULT_H

#include <stddef.h>

#include "ci/v1/ci.pb-c.h"
#include "core/job.h"
#include "core/status.h"

#define CI_RESULT_TEXT_MAX 1024 /* bytes of error and of hint, with the NUL */

/* What a result's strings point into; owned by the caller until the
 * result is encoded. */
struct ci_result_text {
    char *out; /* stdout as UTF-8, within the output cap */
    char *err; /* stderr, likewise */
    /* The outputs' messages; their strings are the outcome's. */
    Ci__V1__Output *outs;
    Ci__V1__Output **out_ptrs;
    Ci__V1__Output__DataEntry *entries;
    Ci__V1__Output__DataEntry **entry_ptrs;
    char error[CI_RESULT_TEXT_MAX];
    char hint[CI_RESULT_TEXT_MAX];
};

/* Points res->error and res->hint at text's buffers (empty). */
void ci_result_text_init(struct ci_result_text *text, Ci__V1__ExecutionResult *res);
/* Frees out, err and the outputs' messages. Accepts NULL. */
void ci_result_text_release(struct ci_result_text *text);

/* Fills res (and usage, which res points to from now on) from o. Output is
 * made valid UTF-8 (an invalid byte becomes U+FFFD) and then cut at
 * output_cap bytes on a character boundary: the cap holds for what is
 * stored. The outputs point into o, which must outlive the encoding.
 * Artifacts are left to the caller. CI_ERR_NOMEM leaves res with empty
 * output and no outputs. */
ci_status ci_result_set_outcome(Ci__V1__ExecutionResult *res, Ci__V1__Usage *usage,
                                struct ci_result_text *text, const struct ci_outcome *o,
                                size_t output_cap);

#endif
