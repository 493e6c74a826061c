/* heartbeat.c - a worker's heartbeat (heartbeat.h): its JSON both ways, and
 * the thread that writes it to the workers bucket every period. */
#include "nats/heartbeat.h"

#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/util.h"

#define MAX_JSON (64 * 1024)
#define TTL_PERIODS 3
#define MIN_TTL_S 5
#define POLL_MS 100 /* how fast stop() is noticed */

struct ci_heartbeat {
    struct ci_broker *b;
    char *worker_id;
    uint32_t period_s;
    ci_heartbeat_fill_fn fill;
    void *closure;
    int64_t started_at_ms;
    pthread_t thread;
    atomic_bool stop;
    atomic_uint failures;
};

/* ---- JSON ------------------------------------------------------------- */

static json_t *int64_str(int64_t v)
{
    char s[32];
    snprintf(s, sizeof(s), "%" PRId64, v);
    return json_string(s);
}

ci_status ci_heartbeat_encode(const struct ci_heartbeat_info *info, char **ret_json,
                              size_t *ret_len, struct ci_error *err)
{
    json_t *o = json_object();
    if (!o)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    int bad = 0;
    bad |= json_object_set_new(o, "worker", json_string(info->worker ? info->worker : ""));
    bad |= json_object_set_new(o, "provider", json_string(info->provider ? info->provider : ""));
    bad |= json_object_set_new(o, "slots", json_integer(info->slots));
    bad |= json_object_set_new(o, "active", json_integer(info->active));
    bad |= json_object_set_new(o, "ready", json_boolean(info->ready));
    bad |= json_object_set_new(o, "startedAtMs", int64_str(info->started_at_ms));
    bad |= json_object_set_new(o, "atMs", int64_str(info->at_ms));
    bad |= json_object_set_new(o, "tasksDone", int64_str((int64_t)info->tasks_done));
    bad |= json_object_set_new(o, "version", json_string(info->version ? info->version : ""));
    char *text = bad ? NULL : json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!text) /* json_string refuses what is not UTF-8: ids are ASCII */
        return ci_error_set(err, CI_ERR_INVALID, "cannot encode the heartbeat");
    *ret_len = strlen(text);
    *ret_json = text;
    return CI_OK;
}

static char *dup_string(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return strdup(json_is_string(v) ? json_string_value(v) : "");
}

/* An integer written as a string (as we write it) or as a number. */
static int64_t get_int(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    if (json_is_integer(v))
        return json_integer_value(v);
    if (json_is_string(v)) {
        char *end = NULL;
        long long n = strtoll(json_string_value(v), &end, 10);
        return end && *end == '\0' ? (int64_t)n : 0;
    }
    return 0;
}

ci_status ci_heartbeat_decode(const uint8_t *json, size_t len, struct ci_heartbeat_info *ret,
                              struct ci_error *err)
{
    if (len > MAX_JSON)
        return ci_error_set(err, CI_ERR_LIMIT, "a heartbeat of %zu bytes is too large", len);
    json_error_t jerr;
    json_t *o = json_loadb((const char *)json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o || !json_is_object(o)) {
        json_decref(o);
        return ci_error_set(err, CI_ERR_INVALID, "a heartbeat is not a JSON object");
    }
    struct ci_heartbeat_info info = {
        .worker = dup_string(o, "worker"),
        .provider = dup_string(o, "provider"),
        .version = dup_string(o, "version"),
        .slots = (uint32_t)get_int(o, "slots"),
        .active = (uint32_t)get_int(o, "active"),
        .ready = json_is_true(json_object_get(o, "ready")),
        .started_at_ms = get_int(o, "startedAtMs"),
        .at_ms = get_int(o, "atMs"),
        .tasks_done = (uint64_t)get_int(o, "tasksDone"),
    };
    json_decref(o);
    if (!info.worker || !info.provider || !info.version) {
        ci_heartbeat_info_release(&info);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    }
    *ret = info;
    return CI_OK;
}

void ci_heartbeat_info_release(struct ci_heartbeat_info *info)
{
    if (!info)
        return;
    free(info->worker);
    free(info->provider);
    free(info->version);
    info->worker = info->provider = info->version = NULL;
}

/* ---- the thread ------------------------------------------------------- */

static void beat(struct ci_heartbeat *h)
{
    struct ci_heartbeat_info info = {.started_at_ms = h->started_at_ms};
    h->fill(h->closure, &info);
    info.at_ms = ci_now_ms();
    char *json = NULL;
    size_t len = 0;
    struct ci_error e = {{0}};
    if (ci_heartbeat_encode(&info, &json, &len, &e) ||
        ci_broker_worker_put(h->b, h->worker_id, json, len, &e))
        atomic_fetch_add(&h->failures, 1);
    else
        atomic_store(&h->failures, 0);
    free(json);
}

static void *heartbeat_main(void *p)
{
    struct ci_heartbeat *h = p;
    int64_t next = 0;
    while (!atomic_load(&h->stop)) {
        int64_t now = ci_mono_ms();
        if (now >= next) {
            beat(h);
            next = ci_mono_ms() + (int64_t)h->period_s * 1000;
        }
        struct timespec ts = {0, POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

ci_status ci_heartbeat_start(struct ci_broker *b, const char *worker_id, uint32_t period_s,
                             ci_heartbeat_fill_fn fill, void *closure,
                             struct ci_heartbeat **ret, struct ci_error *err)
{
    if (!b || !worker_id || !fill || period_s == 0)
        return ci_error_set(err, CI_ERR_INVALID, "heartbeat: missing argument");
    uint32_t ttl = period_s * TTL_PERIODS;
    ci_status s = ci_broker_workers_open(b, true, ttl < MIN_TTL_S ? MIN_TTL_S : ttl, err);
    if (s)
        return s;
    struct ci_heartbeat *h = calloc(1, sizeof(*h));
    if (!h || !(h->worker_id = strdup(worker_id))) {
        free(h);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    }
    h->b = b;
    h->period_s = period_s;
    h->fill = fill;
    h->closure = closure;
    h->started_at_ms = ci_now_ms();
    if (pthread_create(&h->thread, NULL, heartbeat_main, h) != 0) {
        free(h->worker_id);
        free(h);
        return ci_error_set(err, CI_ERR_SYS, "cannot start the heartbeat thread");
    }
    *ret = h;
    return CI_OK;
}

uint32_t ci_heartbeat_failures(const struct ci_heartbeat *h)
{
    return h ? atomic_load(&((struct ci_heartbeat *)h)->failures) : 0;
}

void ci_heartbeat_stop(struct ci_heartbeat *h)
{
    if (!h)
        return;
    atomic_store(&h->stop, true);
    pthread_join(h->thread, NULL);
    ci_broker_worker_delete(h->b, h->worker_id, NULL);
    free(h->worker_id);
    free(h);
}
