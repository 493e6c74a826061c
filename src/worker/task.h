/* task.h - one task from the work queue to its terminal result: decode,
 * validate, honour an early cancel, RUNNING, inputs, provider, artifacts,
 * terminal result in KV, terminal event, ack. */
#ifndef CI_TASK_H
#define CI_TASK_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "nats/broker.h"
#include "core/config.h"
#include "monitor/metrics.h"
#include "provider/provider.h"

struct ci_batch_memo; /* worker/batchmemo.h */

/* What every slot shares; read-only while tasks run. */
struct ci_worker_env {
    const struct ci_config *cfg;
    struct ci_broker *broker;
    struct ci_provider *provider;
    const char *worker_id;
    struct ci_metrics *metrics; /* NULL = none; updated with atomics */
    /* What the worker knows of batches (seals, no cancel): NULL = nothing,
     * every batch task asks NATS. Thread-safe. */
    struct ci_batch_memo *batches;
};

/* A slot runs one task at a time. Its fields are shared with the cancel
 * callback and the in-progress ticker, under lock. */
struct ci_slot {
    pthread_mutex_t lock;
    char task_id[65];             /* "" when idle */
    char batch_id[65];            /* the batch its task counts in (contract §20), or "" */
    struct ci_delivery *delivery; /* the message being worked on */
    struct ci_run *run;           /* set while the provider runs it */
    bool cancel_requested;
    bool batch_cancelled;         /* ... by a cancel of its batch */
    int64_t last_progress_ms;     /* last in-progress ack (monotonic) */
};

/* Counters for logs (and later metrics). */
enum ci_task_end {
    CI_TASK_END_DONE,       /* a terminal result was written and the message acked */
    CI_TASK_END_DUPLICATE,  /* it had a terminal result already: acked, not run again */
    CI_TASK_END_DROPPED,    /* no valid task id: terminated and logged */
    CI_TASK_END_RETRY,      /* an infrastructure failure: nak'ed for a later try */
    CI_TASK_END_SUPERSEDED, /* a later attempt overtook this one: its result was dropped */
    CI_TASK_END_WAIT,       /* a session task whose turn has not come (an older task of its
                               session is still in the stream): NOT disposed of, the caller
                               keeps d and hands it to ci_task_process again later */
};

/* What a CI_TASK_END_WAIT task waits for: until no message older than seq
 * is left on its session's subject (ci_broker_session_first_seq). */
struct ci_task_wait {
    char task_id[65];
    char session_id[65];
    uint64_t seq;   /* the task's own sequence in the tasks stream */
    bool cancelled; /* a cancel came for it while it waited: it ends CANCELLED */
};

/* Processes one delivery and disposes of it (ack, term or nak), taking
 * ownership of d - except on CI_TASK_END_WAIT, when d stays the caller's
 * and *ret_wait says what it waits for. resumed is NULL for a task fresh
 * from the queue, else what the caller held it for: its turn came (the
 * session order is not looked at again), or it was cancelled meanwhile (it
 * ends CANCELLED without running). */
enum ci_task_end ci_task_process(const struct ci_worker_env *env, struct ci_slot *slot,
                                 struct ci_delivery *d, const struct ci_task_wait *resumed,
                                 struct ci_task_wait *ret_wait);

/* Marks the slot's task cancelled if it is task_id, and kills its run. */
void ci_slot_cancel(const struct ci_worker_env *env, struct ci_slot *slot, const char *task_id);
/* The same for the slot's task if it counts in batch batch_id (a message
 * on ci.batches.<batch_id>.cancel, contract §20). */
void ci_slot_cancel_batch(const struct ci_worker_env *env, struct ci_slot *slot,
                          const char *batch_id);
/* A batch was sealed (contract §20): its complete event if every task of
 * it has ended already (a seal after the last end, which no end can see).
 * Reads the seal from the stream first, so that an end stored after the
 * count sees it. One try: CI_ERR_NOT_FOUND while the stream does not show
 * the seal yet (the message may come first), another error when NATS
 * failed (both to be tried again: worker/sealwait.h); CI_OK, or
 * CI_ERR_INVALID for a seal without a total (logged). */
ci_status ci_task_batch_sealed(const struct ci_worker_env *env, const char *batch_id,
                               struct ci_error *err);

#endif
