/* batch.h - a batch's events and counts (docs/contract.md §20), without
 * NATS: the event subjects' last tokens, the bodies of the end, seal and
 * complete events (written and read), and when a batch is complete. The
 * worker and `ci batch` both use these, so that both sides read and write
 * the same bodies; the broker carries them (nats/broker.h). */
#ifndef CI_BATCH_H
#define CI_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* An end event's error is cut to this many bytes (on a UTF-8 boundary). */
#define CI_BATCH_ERROR_MAX 256

/* A batch's events: the last token of <batch_events_prefix>.<b>.<event>. */
enum ci_batch_event {
    CI_BATCH_EV_TAKEN,
    CI_BATCH_EV_SUCCEEDED,
    CI_BATCH_EV_FAILED,
    CI_BATCH_EV_TIMED_OUT,
    CI_BATCH_EV_CANCELLED,
    CI_BATCH_EV_SEALED,
    CI_BATCH_EV_COMPLETE,
    CI_BATCH_EV_CANCEL,
    CI_BATCH_EV_COUNT,
    CI_BATCH_EV_UNKNOWN = -1,
};
/* "taken", "succeeded", ... "cancel"; "unknown" for anything else. */
const char *ci_batch_event_name(enum ci_batch_event ev);
/* The event named token, or CI_BATCH_EV_UNKNOWN. */
enum ci_batch_event ci_batch_event_parse(const char *token);
/* The event of subject <prefix>.<batch>.<event>, or CI_BATCH_EV_UNKNOWN. */
enum ci_batch_event ci_batch_event_of(const char *prefix, const char *batch, const char *subject);
/* Whether ev is one of the four end events (a terminal status). */
bool ci_batch_event_ended(enum ci_batch_event ev);
/* The status name an end event's body carries ("TASK_STATUS_FAILED", as
 * ci_task_status_name), NULL for an event that is not an end. */
const char *ci_batch_event_status_name(enum ci_batch_event ev);

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
/* The count of event ev in c (NULL for CI_BATCH_EV_UNKNOWN). */
uint64_t *ci_batch_counts_of(struct ci_batch_counts *c, enum ci_batch_event ev);
uint64_t ci_batch_counts_ended(const struct ci_batch_counts *c);

/* The end event's JSON: {"taskId","status","error"}; status is the enum's
 * name ("TASK_STATUS_FAILED", ci_task_status_name), the error is made valid
 * UTF-8 and cut to CI_BATCH_ERROR_MAX bytes, absent when empty. The end
 * event's subject is the status's Ci-Status name (ci_task_status_short).
 * *ret is the caller's (free). No protobuf here: the broker shares
 * struct ci_batch_counts. */
ci_status ci_batch_end_body(const char *task_id, const char *status, const char *error,
                            char **ret, size_t *ret_len, struct ci_error *err);

/* An end event's body as read back. */
struct ci_batch_end {
    char task_id[65];
    enum ci_batch_event event; /* the end event its status names */
    char error[CI_BATCH_ERROR_MAX + 1]; /* cut on a UTF-8 boundary when longer */
};
/* Reads an end event's body: a task id, one of the four terminal status
 * names, and an error that is a string or absent. CI_ERR_INVALID when it
 * is not such a body (anyone allowed to publish on the batch's events can
 * write one). */
ci_status ci_batch_end_parse(const uint8_t *data, size_t len, struct ci_batch_end *ret,
                             struct ci_error *err);

/* The seal's body, {"total":"N"}. *ret is the caller's (free). */
ci_status ci_batch_seal_body(uint64_t total, char **ret, size_t *ret_len, struct ci_error *err);
/* The seal's total: {"total":"N"} (a decimal string, or a number). Other
 * fields are ignored. CI_ERR_INVALID when there is no such total. */
ci_status ci_batch_seal_total(const uint8_t *data, size_t len, uint64_t *ret_total,
                              struct ci_error *err);

/* Whether the counts say the batch is complete: sealed, and its ended
 * tasks reach total. The one test of "complete", for workers and clients. */
bool ci_batch_is_complete(const struct ci_batch_counts *c, uint64_t total);

/* The complete event's JSON: {"batchId","total","succeeded","failed",
 * "timedOut","cancelled"} with 64-bit numbers as strings. */
ci_status ci_batch_complete_body(const char *batch_id, uint64_t total,
                                 const struct ci_batch_counts *c, char **ret, size_t *ret_len,
                                 struct ci_error *err);

#endif
