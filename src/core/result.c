/* result.c - an outcome as an ExecutionResult (result.h). */
#include "core/result.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

void ci_result_text_init(struct ci_result_text *text, Ci__V1__ExecutionResult *res)
{
    memset(text, 0, sizeof(*text));
    res->error = text->error;
    res->hint = text->hint;
}

void ci_result_text_release(struct ci_result_text *text)
{
    if (!text)
        return;
    free(text->out);
    free(text->err);
    text->out = text->err = NULL;
    free(text->outs);
    free(text->out_ptrs);
    free(text->entries);
    free(text->entry_ptrs);
    text->outs = NULL;
    text->out_ptrs = NULL;
    text->entries = NULL;
    text->entry_ptrs = NULL;
}

/* res->outputs from o's: messages in text, strings borrowed from o. */
static ci_status set_outputs(Ci__V1__ExecutionResult *res, struct ci_result_text *text,
                             const struct ci_outcome *o)
{
    res->outputs_truncated = o->outputs_truncated;
    size_t n = o->n_outputs, n_data = 0;
    if (!n)
        return CI_OK;
    for (size_t i = 0; i < n; i++)
        n_data += o->outputs[i].n_data;
    free(text->outs);
    free(text->out_ptrs);
    free(text->entries);
    free(text->entry_ptrs);
    text->outs = calloc(n, sizeof(*text->outs));
    text->out_ptrs = calloc(n, sizeof(*text->out_ptrs));
    text->entries = calloc(n_data ? n_data : 1, sizeof(*text->entries));
    text->entry_ptrs = calloc(n_data ? n_data : 1, sizeof(*text->entry_ptrs));
    if (!text->outs || !text->out_ptrs || !text->entries || !text->entry_ptrs)
        return CI_ERR_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const struct ci_output *src = &o->outputs[i];
        Ci__V1__Output *m = &text->outs[i];
        ci__v1__output__init(m);
        m->kind = (char *)src->kind;
        m->truncated = src->truncated;
        m->total_rows = src->total_rows;
        m->artifact = src->artifact ? src->artifact : (char *)"";
        m->data = &text->entry_ptrs[k];
        m->n_data = src->n_data;
        for (size_t j = 0; j < src->n_data; j++, k++) {
            ci__v1__output__data_entry__init(&text->entries[k]);
            text->entries[k].key = (char *)src->data[j].mime_type;
            text->entries[k].value = src->data[j].value;
            text->entry_ptrs[k] = &text->entries[k];
        }
        text->out_ptrs[i] = m;
    }
    res->outputs = text->out_ptrs;
    res->n_outputs = n;
    return CI_OK;
}

/* Valid UTF-8 of the raw bytes, cut at cap on a character boundary. */
static char *output_text(const char *raw, size_t len, size_t cap, bool *ret_cut)
{
    size_t n = 0;
    char *t = ci_utf8_sanitize((const uint8_t *)(raw ? raw : ""), raw ? len : 0, &n);
    *ret_cut = false;
    if (t && n > cap) {
        n = cap;
        while (n > 0 && ((unsigned char)t[n] & 0xC0) == 0x80)
            n--;
        t[n] = '\0';
        *ret_cut = true;
    }
    return t;
}

/* The sentence for an outcome whose provider gave none. */
static void default_error(const struct ci_outcome *o, char *out, size_t size)
{
    switch (o->kind) {
    case CI_OUTCOME_EXITED:
        if (!o->has_exit_code || o->exit_code != 0)
            snprintf(out, size, "the code exited with code %d",
                     o->has_exit_code ? o->exit_code : -1);
        break;
    case CI_OUTCOME_TIMED_OUT:
        snprintf(out, size, "the code did not finish within its time limit");
        break;
    case CI_OUTCOME_CANCELLED:
        snprintf(out, size, "the task was cancelled");
        break;
    case CI_OUTCOME_MEMORY:
        snprintf(out, size, "the code exceeded its memory limit");
        break;
    case CI_OUTCOME_ERROR:
        snprintf(out, size, "the sandbox failed to run the code");
        break;
    }
}

static Ci__V1__TaskStatus status_of(const struct ci_outcome *o)
{
    switch (o->kind) {
    case CI_OUTCOME_EXITED:
        return o->has_exit_code && o->exit_code == 0 ? CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED
                                                     : CI__V1__TASK_STATUS__TASK_STATUS_FAILED;
    case CI_OUTCOME_TIMED_OUT:
        return CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT;
    case CI_OUTCOME_CANCELLED:
        return CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED;
    case CI_OUTCOME_MEMORY:
    case CI_OUTCOME_ERROR:
        break;
    }
    return CI__V1__TASK_STATUS__TASK_STATUS_FAILED;
}

ci_status ci_result_set_outcome(Ci__V1__ExecutionResult *res, Ci__V1__Usage *usage,
                                struct ci_result_text *text, const struct ci_outcome *o,
                                size_t output_cap)
{
    res->status = status_of(o);
    /* A successful run keeps a note (e.g. artifacts over the cap) as its
     * error; any other outcome always has one. */
    if (o->error)
        snprintf(text->error, sizeof(text->error), "%s", o->error);
    else
        default_error(o, text->error, sizeof(text->error));
    if (o->hint)
        snprintf(text->hint, sizeof(text->hint), "%s", o->hint);
    res->error = text->error;
    res->hint = text->hint;

    usage->duration_ms = o->duration_ms;
    usage->cpu_ms = o->cpu_ms;
    usage->memory_mb = o->memory_mb;
    res->usage = usage;
    res->isolation = (char *)o->isolation;
    if (o->has_exit_code) {
        res->_exit_code_case = CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE;
        res->exit_code = o->exit_code;
    }

    bool out_cut = false, err_cut = false;
    free(text->out);
    free(text->err);
    text->out = output_text(o->out, o->out_len, output_cap, &out_cut);
    text->err = output_text(o->err, o->err_len, output_cap, &err_cut);
    res->stdout = text->out ? text->out : (char *)"";
    res->stderr = text->err ? text->err : (char *)"";
    res->stdout_total_bytes = o->out_total;
    res->stderr_total_bytes = o->err_total;
    res->stdout_truncated = out_cut || o->out_total > o->out_len;
    res->stderr_truncated = err_cut || o->err_total > o->err_len;
    if (!text->out || !text->err) {
        res->stdout = res->stderr = (char *)"";
        return CI_ERR_NOMEM;
    }
    if (set_outputs(res, text, o)) {
        res->n_outputs = 0;
        res->outputs_truncated = true;
        return CI_ERR_NOMEM;
    }
    return CI_OK;
}
