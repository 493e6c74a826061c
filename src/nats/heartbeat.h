/* heartbeat.h - every worker announces itself in the KV bucket
 * jetstream.workers_bucket ("ci-workers"), key = worker id, every
 * worker.heartbeat_s seconds. The bucket's TTL is three heartbeats, so a
 * worker that died (SIGKILL, a lost node) vanishes from it on its own; one
 * that stops cleanly deletes its entry. `ci stats` lists the entries.
 *
 * The value is JSON, readable with `nats kv get ci-workers <id>`:
 *   {"worker":"w1","provider":"local","slots":4,"active":1,"ready":true,
 *    "startedAtMs":"1700000000000","atMs":"1700000012345","tasksDone":"17",
 *    "version":"0.1.0"}
 * (64-bit integers as strings, as in the rest of the contract's JSON). */
#ifndef CI_HEARTBEAT_H
#define CI_HEARTBEAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nats/broker.h"
#include "core/status.h"

struct ci_heartbeat_info {
    char *worker;
    char *provider;
    char *version;
    uint32_t slots;
    uint32_t active;
    bool ready;
    int64_t started_at_ms;
    int64_t at_ms;
    uint64_t tasks_done;
};

/* JSON of info, malloc'd and NUL-terminated. */
ci_status ci_heartbeat_encode(const struct ci_heartbeat_info *info, char **ret_json,
                              size_t *ret_len, struct ci_error *err);
/* Reads what ci_heartbeat_encode wrote (at most 64 KiB; unknown fields are
 * ignored, missing ones stay 0/""). Release with ci_heartbeat_info_release. */
ci_status ci_heartbeat_decode(const uint8_t *json, size_t len, struct ci_heartbeat_info *ret,
                              struct ci_error *err);
void ci_heartbeat_info_release(struct ci_heartbeat_info *info);

/* Fills the fields that change (active, ready, tasks_done) before each
 * heartbeat; called on the heartbeat's thread. The strings are the
 * caller's and stay borrowed. */
typedef void (*ci_heartbeat_fill_fn)(void *closure, struct ci_heartbeat_info *info);

struct ci_heartbeat;

/* Opens (creating) the bucket with a TTL of three periods, then writes a
 * heartbeat at once and every period_s seconds on a thread of its own. A
 * failed write is retried at the next period; the caller learns of
 * failures through ci_heartbeat_failures(). */
ci_status ci_heartbeat_start(struct ci_broker *b, const char *worker_id, uint32_t period_s,
                             ci_heartbeat_fill_fn fill, void *closure,
                             struct ci_heartbeat **ret, struct ci_error *err);
/* Writes that failed in a row (0 after a success). */
uint32_t ci_heartbeat_failures(const struct ci_heartbeat *h);
/* Stops the thread and deletes this worker's entry (best effort). Accepts
 * NULL. Call before the broker is freed. */
void ci_heartbeat_stop(struct ci_heartbeat *h);

#endif
