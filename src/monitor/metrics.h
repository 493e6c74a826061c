/* metrics.h - the worker's counters, gauges and histograms, rendered in the
 * Prometheus text exposition format (version 0.0.4) for GET /metrics.
 *
 * Every update is a lock-free atomic on a struct the caller owns and passes
 * around (no global state): slots, the task code and the NATS callbacks may
 * update it from any thread while a scrape renders it. Every update function
 * accepts m == NULL and then does nothing, so code under test can run
 * without metrics.
 *
 * Values that live elsewhere (the NATS connection, the warm pool) are read
 * at scrape time through a collector callback rather than copied.
 *
 *   ci_tasks_total{status,provider}          terminal results written here
 *   ci_task_deliveries_total{outcome}        every message taken: done, duplicate,
 *                                            dropped, retry, superseded, stale
 *   ci_task_run_seconds                      histogram: message taken -> terminal
 *                                            result stored
 *   ci_task_queue_wait_seconds               histogram: JetStream publish -> taken
 *   ci_lane_tasks_total{lane}                messages taken from each lane: interactive
 *                                            (the tasks stream), batch (contract §21)
 *   ci_slots_active, ci_slots_free           gauges
 *   ci_warm_pool_size                        gauge (collector)
 *   ci_warm_deaths_total                     counter (collector)
 *   ci_warm_fallbacks_total                  counter (collector): warm mode, tasks run cold
 *   ci_nats_connected                        gauge (collector)
 *   ci_nats_reconnects_total                 counter (collector)
 *   ci_objstore_bytes_total{direction}       inputs downloaded, artifacts uploaded
 *   ci_output_chunks_total{outcome}          live output chunks: published, dropped */
#ifndef CI_METRICS_H
#define CI_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/util.h"

struct ci_metrics;

/* Outcomes of one delivery; the order of enum ci_task_end (task.h). */
enum ci_metrics_outcome {
    CI_METRICS_DONE,
    CI_METRICS_DUPLICATE,
    CI_METRICS_DROPPED,
    CI_METRICS_RETRY,
    CI_METRICS_SUPERSEDED, /* a later attempt overtook this one (task.h) */
    CI_METRICS_STALE, /* not a task end: a stale copy left for redelivery (main.c) */
    CI_METRICS_N_OUTCOMES,
};

/* The lanes a slot takes tasks from (worker/lanes.h). */
enum ci_metrics_lane {
    CI_METRICS_INTERACTIVE,
    CI_METRICS_BATCH,
    CI_METRICS_N_LANES,
};

enum ci_metrics_direction {
    CI_METRICS_DOWNLOAD, /* input objects read from the files bucket */
    CI_METRICS_UPLOAD,   /* artifacts written to the files bucket */
    CI_METRICS_N_DIRECTIONS,
};

/* What the collector reports at scrape time. */
struct ci_metrics_live {
    uint64_t nats_reconnects;
    bool nats_connected;
    int64_t warm_pool_size; /* sandboxes ready to take a task; 0 without a pool */
    uint64_t warm_deaths;   /* warm runtimes that died without being retired */
    uint64_t warm_fallbacks; /* tasks run cold in warm mode: no zygote took them */
    uint64_t session_tasks_waiting; /* held in the waiting room (worker/waitroom.h) */
};
typedef void (*ci_metrics_collect_fn)(void *closure, struct ci_metrics_live *ret);

/* A new set of metrics, all zero. provider is the provider label of
 * ci_tasks_total (copied); slots the number of task slots. */
ci_status ci_metrics_new(const char *provider, size_t slots, struct ci_metrics **ret,
                         struct ci_error *err);
void ci_metrics_free(struct ci_metrics *m);

/* Sets the callback that fills the live values at each render; NULL for
 * none (they read as 0). Call before serving, not while rendering. */
void ci_metrics_set_collector(struct ci_metrics *m, ci_metrics_collect_fn fn, void *closure);

/* A task reached a terminal status: status_short is a Ci-Status value
 * ("succeeded", "failed", "timed_out", "cancelled"); run_s the seconds from
 * taking its message to storing the result. */
void ci_metrics_task_end(struct ci_metrics *m, const char *status_short, double run_s);
/* A message was taken: seconds it waited in the stream since it was
 * published (its JetStream timestamp); a negative wait (clock skew between
 * hosts) counts as 0. */
void ci_metrics_queue_wait(struct ci_metrics *m, double wait_s);
/* A slot took a message from lane. */
void ci_metrics_lane_take(struct ci_metrics *m, enum ci_metrics_lane lane);
/* How a delivery was disposed of. */
void ci_metrics_delivery(struct ci_metrics *m, enum ci_metrics_outcome outcome);
/* A slot took (busy true) or finished (false) a message. */
void ci_metrics_slot_busy(struct ci_metrics *m, bool busy);
void ci_metrics_objstore_bytes(struct ci_metrics *m, enum ci_metrics_direction d, uint64_t n);
/* Chunks of a task's live output that were published and that were lost. */
void ci_metrics_output_chunks(struct ci_metrics *m, uint64_t published, uint64_t dropped);

/* Appends the whole exposition to out. CI_ERR_NOMEM when out cannot grow. */
ci_status ci_metrics_render(struct ci_metrics *m, struct ci_buf *out);

#endif
