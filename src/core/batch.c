/* batch.c - the bodies of a batch's events (batch.h, contract §20). */
#include "core/batch.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

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
    uint64_t ended = c->succeeded + c->failed + c->timed_out + c->cancelled;
    return c->sealed > 0 && ended >= total;
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
