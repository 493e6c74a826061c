/* batch.h - a batch's events and counts (docs/contract.md §20), without
 * NATS: the bodies of the end and complete events, the seal, and when a
 * batch is complete. The broker carries them (nats/broker.h). */
#ifndef CI_BATCH_H
#define CI_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* An end event's error is cut to this many bytes (on a UTF-8 boundary). */
#define CI_BATCH_ERROR_MAX 256

/* The message count of each subject ci.batches.<b>.<event>: since the
 * server keeps one message per task and event (Nats-Msg-Id), these are
 * task counts. */
struct ci_batch_counts {
    uint64_t taken;
    uint64_t succeeded, failed, timed_out, cancelled; /* the four ended counts */
    uint64_t sealed;   /* 1 once the client sealed the batch */
    uint64_t complete; /* 1 once a worker or the client said so */
    uint64_t cancel;   /* cancel requests (any number) */
};

/* The end event's JSON: {"taskId","status","error"}; status is the enum's
 * name ("TASK_STATUS_FAILED", ci_task_status_name), the error is made valid
 * UTF-8 and cut to CI_BATCH_ERROR_MAX bytes, absent when empty. The end
 * event's subject is the status's Ci-Status name (ci_task_status_short).
 * *ret is the caller's (free). No protobuf here: the broker shares
 * struct ci_batch_counts. */
ci_status ci_batch_end_body(const char *task_id, const char *status, const char *error,
                            char **ret, size_t *ret_len, struct ci_error *err);

/* The seal's total: {"total":"N"} (a decimal string, or a number). Other
 * fields are ignored. CI_ERR_INVALID when there is no such total. */
ci_status ci_batch_seal_total(const uint8_t *data, size_t len, uint64_t *ret_total,
                              struct ci_error *err);

/* Whether the counts say the batch is complete: sealed, and its ended
 * tasks reach total. */
bool ci_batch_is_complete(const struct ci_batch_counts *c, uint64_t total);

/* The complete event's JSON: {"batchId","total","succeeded","failed",
 * "timedOut","cancelled"} with 64-bit numbers as strings. */
ci_status ci_batch_complete_body(const char *batch_id, uint64_t total,
                                 const struct ci_batch_counts *c, char **ret, size_t *ret_len,
                                 struct ci_error *err);

#endif
