/* session.c - a session's record and the plan of a step (session.h). */
#include "core/session.h"

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

/* A number written as a string (or, leniently, as a JSON integer). */
static bool get_u64(json_t *o, const char *key, uint64_t *ret)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        *ret = 0;
        return true;
    }
    if (json_is_integer(v) && json_integer_value(v) >= 0) {
        *ret = (uint64_t)json_integer_value(v);
        return true;
    }
    if (!json_is_string(v))
        return false;
    const char *s = json_string_value(v);
    char *end = NULL;
    if (!*s || *s == '-')
        return false;
    unsigned long long n = strtoull(s, &end, 10);
    if (*end)
        return false;
    *ret = n;
    return true;
}

static bool get_str(json_t *o, const char *key, char *out, size_t n)
{
    json_t *v = json_object_get(o, key);
    if (!v) {
        out[0] = '\0';
        return true;
    }
    if (!json_is_string(v) || json_string_length(v) >= n)
        return false;
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return true;
}

ci_status ci_session_record_parse(const uint8_t *data, size_t len,
                                  struct ci_session_record *ret, struct ci_error *err)
{
    memset(ret, 0, sizeof(*ret));
    json_error_t je;
    json_t *o = json_loadb((const char *)data, len, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return ci_error_set(err, CI_ERR_INVALID, "the session record is not a JSON object");
    }
    uint64_t step = 0, state_step = 0, created = 0, updated = 0;
    json_t *closed = json_object_get(o, "closed");
    bool ok = get_u64(o, "step", &step) && get_u64(o, "stateStep", &state_step) &&
              get_u64(o, "lastSeq", &ret->last_seq) &&
              get_u64(o, "stateBytes", &ret->state_bytes) &&
              get_u64(o, "createdAtMs", &created) && get_u64(o, "updatedAtMs", &updated) &&
              get_str(o, "lastTaskId", ret->last_task_id, sizeof(ret->last_task_id)) &&
              get_str(o, "state", ret->state, sizeof(ret->state)) &&
              (!closed || json_is_boolean(closed)) && step <= UINT32_MAX &&
              state_step <= step && created <= INT64_MAX && updated <= INT64_MAX;
    ret->closed = closed && json_is_true(closed);
    json_decref(o);
    if (!ok) {
        memset(ret, 0, sizeof(*ret));
        return ci_error_set(err, CI_ERR_INVALID, "the session record has a field of the wrong kind");
    }
    ret->step = (uint32_t)step;
    ret->state_step = (uint32_t)state_step;
    ret->created_ms = (int64_t)created;
    ret->updated_ms = (int64_t)updated;
    return CI_OK;
}

ci_status ci_session_record_encode(const char *session_id, const struct ci_session_record *r,
                                   char **ret, size_t *ret_len, struct ci_error *err)
{
    json_t *o = json_object();
    if (!o)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    int bad = json_object_set_new(o, "sessionId", json_string(session_id));
    if (r->closed) {
        bad |= json_object_set_new(o, "closed", json_true());
    } else {
        bad |= json_object_set_new(o, "step", u64_str(r->step));
        bad |= json_object_set_new(o, "stateStep", u64_str(r->state_step));
        bad |= json_object_set_new(o, "lastTaskId", json_string(r->last_task_id));
        bad |= json_object_set_new(o, "lastSeq", u64_str(r->last_seq));
        bad |= json_object_set_new(o, "state", json_string(r->state));
        bad |= json_object_set_new(o, "stateBytes", u64_str(r->state_bytes));
        bad |= json_object_set_new(o, "createdAtMs", u64_str((uint64_t)r->created_ms));
    }
    bad |= json_object_set_new(o, "updatedAtMs", u64_str((uint64_t)r->updated_ms));
    char *text = bad ? NULL : json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(o);
    if (!text) /* json_string refuses what is not UTF-8: ids are ASCII */
        return ci_error_set(err, CI_ERR_NOMEM, "cannot encode the session record");
    *ret = text;
    *ret_len = strlen(text);
    return CI_OK;
}

void ci_session_object_name(const char *session_id, uint32_t step, uint32_t attempt,
                            char out[CI_SESSION_OBJECT_MAX])
{
    snprintf(out, CI_SESSION_OBJECT_MAX, CI_SESSION_OBJECT_PREFIX "%s/%" PRIu32 "-%" PRIu32,
             session_id, step, attempt);
}

bool ci_session_object_valid(const char *session_id, const char *name)
{
    size_t pre = strlen(CI_SESSION_OBJECT_PREFIX), id = strlen(session_id);
    if (strncmp(name, CI_SESSION_OBJECT_PREFIX, pre) != 0 ||
        strncmp(name + pre, session_id, id) != 0 || name[pre + id] != '/')
        return false;
    const char *p = name + pre + id + 1;
    size_t digits = strspn(p, "0123456789");
    if (!digits || digits > 10 || p[digits] != '-')
        return false;
    p += digits + 1;
    digits = strspn(p, "0123456789");
    return digits && digits <= 10 && !p[digits];
}

/* A record may be a client's (a close writes one): its state is restored
 * only when it names an object of this session's own. */
void ci_session_plan(const char *session_id, const char *task_id,
                     const struct ci_session_record *rec, int64_t now_ms, uint32_t idle_s,
                     struct ci_session_plan *ret)
{
    memset(ret, 0, sizeof(*ret));
    ret->created_ms = now_ms;
    if (!rec) {
        ret->new_session = true;
        ret->step = 1;
        return;
    }
    if (rec->closed || rec->step >= UINT32_MAX - 1) {
        ret->new_session = ret->previous_gone = true;
        ret->step = 1;
        return;
    }
    /* Redelivered after its worker stored the record: task ids are unique,
     * stream sequences start again when the stream is made again. */
    if (task_id && strcmp(rec->last_task_id, task_id) == 0) {
        ret->applied = true;
        ret->step = rec->step;
        ret->restore_step = rec->state_step;
        ret->created_ms = rec->created_ms;
        return;
    }
    if (rec->updated_ms + (int64_t)idle_s * 1000 < now_ms) {
        ret->new_session = ret->previous_gone = true;
        ret->step = 1;
        if (ci_session_object_valid(session_id, rec->state))
            snprintf(ret->stale_object, sizeof(ret->stale_object), "%s", rec->state);
        return;
    }
    ret->step = rec->step + 1;
    ret->created_ms = rec->created_ms;
    if (rec->state_step && ci_session_object_valid(session_id, rec->state)) {
        ret->restore_step = rec->state_step;
        snprintf(ret->restore_object, sizeof(ret->restore_object), "%s", rec->state);
    } else if (rec->state_step) {
        ret->previous_gone = true; /* a state this session cannot have */
    }
}
