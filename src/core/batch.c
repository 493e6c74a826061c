/* batch.c - the bodies of a batch's events (batch.h, contract §20). */
#include "core/batch.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/request.h"
#include "core/util.h"

static const char *const event_names[CI_BATCH_EV_COUNT] = {
    [CI_BATCH_EV_TAKEN] = "taken",         [CI_BATCH_EV_SUCCEEDED] = "succeeded",
    [CI_BATCH_EV_FAILED] = "failed",       [CI_BATCH_EV_TIMED_OUT] = "timed_out",
    [CI_BATCH_EV_CANCELLED] = "cancelled", [CI_BATCH_EV_SEALED] = "sealed",
    [CI_BATCH_EV_COMPLETE] = "complete",   [CI_BATCH_EV_CANCEL] = "cancel",
};

/* The status names of ci.proto's TaskStatus (ci_task_status_name), kept
 * here so that the broker needs no protobuf; test_batch_cli checks them. */
static const char *const status_names[CI_BATCH_EV_COUNT] = {
    [CI_BATCH_EV_SUCCEEDED] = "TASK_STATUS_SUCCEEDED",
    [CI_BATCH_EV_FAILED] = "TASK_STATUS_FAILED",
    [CI_BATCH_EV_TIMED_OUT] = "TASK_STATUS_TIMED_OUT",
    [CI_BATCH_EV_CANCELLED] = "TASK_STATUS_CANCELLED",
};

const char *ci_batch_event_name(enum ci_batch_event ev)
{
    return ev >= 0 && ev < CI_BATCH_EV_COUNT ? event_names[ev] : "unknown";
}

enum ci_batch_event ci_batch_event_parse(const char *token)
{
    for (int i = 0; token && i < CI_BATCH_EV_COUNT; i++)
        if (strcmp(token, event_names[i]) == 0)
            return (enum ci_batch_event)i;
    return CI_BATCH_EV_UNKNOWN;
}

enum ci_batch_event ci_batch_event_of(const char *prefix, const char *batch, const char *subject)
{
    size_t pn = strlen(prefix), bn = strlen(batch);
    if (strncmp(subject, prefix, pn) != 0 || subject[pn] != '.' ||
        strncmp(subject + pn + 1, batch, bn) != 0 || subject[pn + 1 + bn] != '.')
        return CI_BATCH_EV_UNKNOWN;
    return ci_batch_event_parse(subject + pn + 1 + bn + 1);
}

bool ci_batch_event_ended(enum ci_batch_event ev)
{
    return ev == CI_BATCH_EV_SUCCEEDED || ev == CI_BATCH_EV_FAILED ||
           ev == CI_BATCH_EV_TIMED_OUT || ev == CI_BATCH_EV_CANCELLED;
}

const char *ci_batch_event_status_name(enum ci_batch_event ev)
{
    return ci_batch_event_ended(ev) ? status_names[ev] : NULL;
}

uint64_t *ci_batch_counts_of(struct ci_batch_counts *c, enum ci_batch_event ev)
{
    switch (ev) {
    case CI_BATCH_EV_TAKEN: return &c->taken;
    case CI_BATCH_EV_SUCCEEDED: return &c->succeeded;
    case CI_BATCH_EV_FAILED: return &c->failed;
    case CI_BATCH_EV_TIMED_OUT: return &c->timed_out;
    case CI_BATCH_EV_CANCELLED: return &c->cancelled;
    case CI_BATCH_EV_SEALED: return &c->sealed;
    case CI_BATCH_EV_COMPLETE: return &c->complete;
    case CI_BATCH_EV_CANCEL: return &c->cancel;
    default: return NULL;
    }
}

uint64_t ci_batch_counts_ended(const struct ci_batch_counts *c)
{
    return c->succeeded + c->failed + c->timed_out + c->cancelled;
}

static json_t *u64_str(uint64_t v)
{
    char s[24];
    snprintf(s, sizeof(s), "%" PRIu64, v);
    return json_string(s);
}

/* Dumps o (taking it) into *ret. */
static ci_status dump(json_t *o, int bad, const char *what, char **ret, size_t *ret_len,
                      struct ci_error *err)
{
    char *text = bad ? NULL : json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text)
        return ci_error_set(err, CI_ERR_NOMEM, "cannot encode the %s", what);
    *ret = text;
    *ret_len = strlen(text);
    return CI_OK;
}

ci_status ci_batch_end_body(const char *task_id, const char *status, const char *error,
                            char **ret, size_t *ret_len, struct ci_error *err)
{
    json_t *o = json_object();
    if (!o)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    int bad = json_object_set_new(o, "taskId", json_string(task_id));
    bad |= json_object_set_new(o, "status", json_string(status));
    if (error && error[0]) {
        /* Valid UTF-8 first (U+FFFD may lengthen it), then the cut, on a
         * character's first byte. */
        size_t n = 0;
        CI_AUTOFREE char *clean = ci_utf8_sanitize((const uint8_t *)error, strlen(error), &n);
        if (!clean) {
            json_decref(o);
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        }
        if (n > CI_BATCH_ERROR_MAX) {
            n = CI_BATCH_ERROR_MAX;
            while (n > 0 && ((unsigned char)clean[n] & 0xC0) == 0x80)
                n--;
        }
        bad |= json_object_set_new(o, "error", json_stringn(clean, n));
    }
    return dump(o, bad, "end event", ret, ret_len, err);
}

/* Copies s into out (n bytes), cut where a UTF-8 sequence begins. */
static void copy_cut(char *out, size_t n, const char *s)
{
    size_t len = strlen(s);
    if (len >= n) {
        len = n - 1;
        while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80)
            len--;
    }
    memcpy(out, s, len);
    out[len] = '\0';
}

ci_status ci_batch_end_parse(const uint8_t *data, size_t len, struct ci_batch_end *ret,
                             struct ci_error *err)
{
    json_t *j = json_loadb((const char *)data, len, 0, NULL);
    json_t *id = json_object_get(j, "taskId");
    json_t *st = json_object_get(j, "status");
    json_t *er = json_object_get(j, "error");
    const char *ids = json_is_string(id) ? json_string_value(id) : "";
    ci_status s = CI_OK;
    if (!json_is_object(j) || !ci_task_id_valid(ids) || !json_is_string(st) ||
        (er && !json_is_string(er)))
        s = ci_error_set(err, CI_ERR_INVALID,
                         "an end event is not {\"taskId\",\"status\",\"error\"} (%zu bytes)",
                         len);
    struct ci_batch_end e = {.event = CI_BATCH_EV_UNKNOWN};
    if (!s) {
        snprintf(e.task_id, sizeof(e.task_id), "%s", ids);
        const char *name = json_string_value(st);
        for (int ev = 0; ev < CI_BATCH_EV_COUNT; ev++)
            if (status_names[ev] && strcmp(name, status_names[ev]) == 0)
                e.event = (enum ci_batch_event)ev;
        if (e.event == CI_BATCH_EV_UNKNOWN)
            s = ci_error_set(err, CI_ERR_INVALID, "an end event of task %s says status '%.40s'",
                             e.task_id, name);
        copy_cut(e.error, sizeof(e.error), er ? json_string_value(er) : "");
    }
    json_decref(j);
    if (!s)
        *ret = e;
    return s;
}

ci_status ci_batch_seal_body(uint64_t total, char **ret, size_t *ret_len, struct ci_error *err)
{
    json_t *o = json_object();
    if (!o)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    int bad = json_object_set_new(o, "total", u64_str(total));
    return dump(o, bad, "seal", ret, ret_len, err);
}

ci_status ci_batch_seal_total(const uint8_t *data, size_t len, uint64_t *ret_total,
                              struct ci_error *err)
{
    json_error_t je;
    json_t *o = json_loadb((const char *)data, len, JSON_REJECT_DUPLICATES, &je);
    json_t *t = o && json_is_object(o) ? json_object_get(o, "total") : NULL;
    uint64_t total = 0;
    bool ok = false;
    if (json_is_integer(t) && json_integer_value(t) >= 0) {
        total = (uint64_t)json_integer_value(t);
        ok = true;
    } else if (json_is_string(t)) {
        const char *s = json_string_value(t);
        char *end = NULL;
        errno = 0;
        unsigned long long x = strtoull(s, &end, 10);
        ok = s[0] >= '0' && s[0] <= '9' && errno == 0 && end && *end == '\0';
        total = (uint64_t)x;
    }
    json_decref(o);
    if (!ok)
        return ci_error_set(err, CI_ERR_INVALID,
                            "the seal is not {\"total\":\"N\"} with N a whole number");
    *ret_total = total;
    return CI_OK;
}

bool ci_batch_is_complete(const struct ci_batch_counts *c, uint64_t total)
{
    return c->sealed > 0 && ci_batch_counts_ended(c) >= total;
}

ci_status ci_batch_complete_body(const char *batch_id, uint64_t total,
                                 const struct ci_batch_counts *c, char **ret, size_t *ret_len,
                                 struct ci_error *err)
{
    json_t *o = json_object();
    if (!o)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    int bad = json_object_set_new(o, "batchId", json_string(batch_id));
    bad |= json_object_set_new(o, "total", u64_str(total));
    bad |= json_object_set_new(o, "succeeded", u64_str(c->succeeded));
    bad |= json_object_set_new(o, "failed", u64_str(c->failed));
    bad |= json_object_set_new(o, "timedOut", u64_str(c->timed_out));
    bad |= json_object_set_new(o, "cancelled", u64_str(c->cancelled));
    return dump(o, bad, "complete event", ret, ret_len, err);
}
