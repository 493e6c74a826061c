/* fuzz_heartbeat - libFuzzer target for ci_heartbeat_decode, the parser of
 * the ci-workers bucket's entries that `ci stats` reads: any client allowed
 * to write that bucket can put anything there. Whatever it accepts must
 * encode again and decode to the same fields. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nats/heartbeat.h"

/* heartbeat.c also holds the heartbeat thread, which writes through the
 * broker; the decoder never reaches it, so these stand in for broker.c
 * (which would drag in all of NATS) and must never run. */
ci_status ci_broker_workers_open(struct ci_broker *b, bool create, uint32_t ttl_s,
                                 struct ci_error *err)
{
    (void)b, (void)create, (void)ttl_s, (void)err;
    abort();
}

ci_status ci_broker_worker_put(struct ci_broker *b, const char *worker_id, const void *data,
                               size_t len, struct ci_error *err)
{
    (void)b, (void)worker_id, (void)data, (void)len, (void)err;
    abort();
}

ci_status ci_broker_worker_delete(struct ci_broker *b, const char *worker_id,
                                  struct ci_error *err)
{
    (void)b, (void)worker_id, (void)err;
    abort();
}

static int same(const char *a, const char *b)
{
    return strcmp(a ? a : "", b ? b : "") == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ci_heartbeat_info hb;
    struct ci_error err;
    if (ci_heartbeat_decode(data, size, &hb, &err) != CI_OK)
        return 0;
    char *json = NULL;
    size_t len = 0;
    if (ci_heartbeat_encode(&hb, &json, &len, &err) == CI_OK) {
        if (strlen(json) != len)
            abort();
        struct ci_heartbeat_info back;
        if (ci_heartbeat_decode((const uint8_t *)json, len, &back, &err) != CI_OK)
            abort();
        if (!same(hb.worker, back.worker) || !same(hb.provider, back.provider) ||
            !same(hb.version, back.version) || hb.slots != back.slots ||
            hb.active != back.active || hb.ready != back.ready ||
            hb.started_at_ms != back.started_at_ms || hb.at_ms != back.at_ms ||
            hb.tasks_done != back.tasks_done)
            abort();
        ci_heartbeat_info_release(&back);
        free(json);
    }
    ci_heartbeat_info_release(&hb);
    return 0;
}
