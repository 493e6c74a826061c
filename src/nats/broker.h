/* broker.h - everything the worker and the `ci` client do on NATS: the
 * connection, the streams, the work-queue consumer, the results bucket, the
 * status events and the cancel subjects of docs/contract.md. Only the NATS
 * glue (src/nats) sees nats.c: this header and objstore.h, heartbeat.h do
 * not include it. */
#ifndef CI_BROKER_H
#define CI_BROKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/status.h"

struct ci_broker;
struct ci_objstore; /* objstore.h */
struct ci_puller;   /* one pull subscription on the work queue, per slot */
struct ci_delivery; /* one message taken from the work queue */

/* Connects with reconnect (forever by default) and the configured
 * credentials. The config must outlive the broker. CI_ERR_NATS (or
 * CI_ERR_TIMEOUT) when no server could be reached, which may change;
 * CI_ERR_INVALID or CI_ERR_IO when the options themselves are wrong
 * (credential, NKey or TLS files), which will not. */
ci_status ci_broker_connect(const struct ci_config *cfg, struct ci_broker **ret,
                            struct ci_error *err);

/* With create: creates or updates every stream, the durable consumer, the
 * results bucket and the object store, idempotently (many workers may run
 * this at once). Without: binds to what a worker created. */
ci_status ci_broker_setup(struct ci_broker *b, bool create, struct ci_error *err);

/* Stops the cancel handler (returns once it can no longer run), flushes
 * what is buffered (acks, events; at most 2 s), closes and frees all. */
void ci_broker_free(struct ci_broker *b);

/* The server URLs (comma-separated) with the user information of each
 * ("user:password@", a token@) replaced by "<redacted>", for logs and
 * errors: they never carry credentials. Cut to fit n. */
void ci_broker_redact_urls(const char *urls, char *out, size_t n);

/* A worker's broker makes a stream, the consumer or the results bucket
 * again when it finds one gone (an operator deleted it), and tries the
 * operation once more. When that fails, this says why (true, with why
 * filled) until a later recovery works. Thread-safe. */
bool ci_broker_problem(struct ci_broker *b, char *why, size_t n);
/* Looks for what may have gone without any write failing (a deleted
 * CI_TASKS: idle fetches only time out) and makes it again; true when it
 * did. A few JetStream requests: call it now and then, not per task. */
bool ci_broker_check(struct ci_broker *b);
/* How many times it made what was gone again. */
uint64_t ci_broker_recreated(const struct ci_broker *b);

/* Releases the NATS library's own threads and memory; call once at exit. */
void ci_broker_library_close(void);

struct ci_objstore *ci_broker_objstore(struct ci_broker *b);
/* The server's max_payload: the largest message or KV value we may send. */
int64_t ci_broker_max_payload(const struct ci_broker *b);
/* Reconnects since start, and whether the connection is up now. */
uint64_t ci_broker_reconnects(const struct ci_broker *b);
/* Times the connection was lost since start (a count, so that an outage
 * shorter than anybody's look is still seen). */
uint64_t ci_broker_disconnects(const struct ci_broker *b);
bool ci_broker_connected(const struct ci_broker *b);
/* Whether the connection is closed for good (nats.max_reconnects used up). */
bool ci_broker_closed(const struct ci_broker *b);

/* --- the work queue (workers) --- */

ci_status ci_puller_new(struct ci_broker *b, struct ci_puller **ret, struct ci_error *err);
void ci_puller_free(struct ci_puller *p);
/* Takes one task. CI_ERR_TIMEOUT when none came within timeout_ms. Not
 * thread-safe: one slot fetches from a puller. */
ci_status ci_puller_fetch(struct ci_puller *p, int timeout_ms, struct ci_delivery **ret,
                          struct ci_error *err);

const uint8_t *ci_delivery_data(const struct ci_delivery *d, size_t *ret_len);
/* The header's first value, its name matched in any case, or NULL. */
const char *ci_delivery_header(const struct ci_delivery *d, const char *key);
/* JetStream delivery count, 1 on the first try. */
uint32_t ci_delivery_attempt(const struct ci_delivery *d);
/* When the message was stored in the stream (Unix ms, the server's clock),
 * the same on every redelivery; 0 when unknown. */
int64_t ci_delivery_published_ms(const struct ci_delivery *d);
bool ci_delivery_last_attempt(const struct ci_delivery *d);
/* -1 when the message came on the fetch's own pull request. Otherwise it
 * had been waiting in the puller's queue, delivered to a pull request that
 * outlived an earlier fetch, its ack timer running (the server may have
 * redelivered it elsewhere already): at most this many ms. A fresh message
 * behind a late 408 may pass for queued: never the other way round. */
int64_t ci_delivery_queued_ms(const struct ci_delivery *d);
/* The subject it was published on ("ci.submit", "ci.submit.s1"). */
const char *ci_delivery_subject(const struct ci_delivery *d);
/* Its sequence in the tasks stream (the same on every redelivery); 0 when unknown. */
uint64_t ci_delivery_seq(const struct ci_delivery *d);
ci_status ci_delivery_ack(struct ci_delivery *d);
/* Removes the message for good: never redelivered. */
ci_status ci_delivery_term(struct ci_delivery *d);
/* Resets the server's ack timer while a task runs. Thread-safe. */
ci_status ci_delivery_in_progress(struct ci_delivery *d);
ci_status ci_delivery_nak(struct ci_delivery *d, int64_t delay_ms);
void ci_delivery_free(struct ci_delivery *d);

/* --- results, events, cancel --- */

/* Writes the result of a task only if its record is still at revision rev
 * (0: only if it has none, or a deleted one), and gives the new revision.
 * This fences attempts: one that a later attempt of the task overtook
 * (it wrote RUNNING or a result since) gets CI_ERR_CONFLICT, and must not
 * overwrite it. */
ci_status ci_broker_result_swap(struct ci_broker *b, const char *task_id, const void *data,
                                size_t len, uint64_t rev, uint64_t *ret_rev,
                                struct ci_error *err);
/* Writes the result only when no record of the task exists yet (the
 * client's QUEUED record). CI_ERR_INVALID when one exists. */
ci_status ci_broker_result_create(struct ci_broker *b, const char *task_id, const void *data,
                                  size_t len, struct ci_error *err);
/* Reads the latest result, and its revision when ret_rev is not NULL (also
 * that of a deleted record: 0 only when there never was one, or it expired).
 * CI_ERR_NOT_FOUND when there is none. */
ci_status ci_broker_result_get(struct ci_broker *b, const char *task_id, uint8_t **ret_data,
                               size_t *ret_len, uint64_t *ret_rev, struct ci_error *err);

/* Publishes an encoded StatusEvent on <status_prefix>.<task_id> through
 * JetStream, with the Ci-Task-Id, Ci-Status and Content-Type headers. With
 * msg_id (Nats-Msg-Id), the stream keeps one event per id within its
 * duplicate window: a retried publish whose ack was lost is not doubled. */
ci_status ci_broker_event_publish(struct ci_broker *b, const char *task_id,
                                  const char *status_short, const char *content_type,
                                  const char *msg_id, const void *data, size_t len,
                                  struct ci_error *err);
/* The Ci-Status header of the task's last status event, copied into ret
 * (size ret_size). CI_ERR_NOT_FOUND when the task has no event. */
ci_status ci_broker_event_last_status(struct ci_broker *b, const char *task_id, char *ret,
                                      size_t ret_size, struct ci_error *err);

/* Whether a cancel for task_id is on the cancel stream. */
ci_status ci_broker_cancel_requested(struct ci_broker *b, const char *task_id, bool *ret,
                                     struct ci_error *err);
/* Publishes an empty cancel message for task_id (clients). */
ci_status ci_broker_cancel_publish(struct ci_broker *b, const char *task_id,
                                   struct ci_error *err);

typedef void (*ci_cancel_fn)(const char *task_id, void *closure);
/* Calls fn (on a NATS thread) for every cancel published from now on. */
ci_status ci_broker_on_cancel(struct ci_broker *b, ci_cancel_fn fn, void *closure,
                              struct ci_error *err);

/* --- the fleet: queue state and worker heartbeats (`ci stats`, workers) --- */

/* The work queue as the server sees it. */
struct ci_queue_stats {
    uint64_t stream_msgs;  /* messages in the tasks stream: queued + in flight */
    uint64_t pending;      /* not yet delivered to any worker */
    uint64_t ack_pending;  /* delivered, not acked yet: running (or lost, until ack wait) */
    uint64_t redelivered;  /* of ack_pending, delivered more than once */
    uint64_t waiting;      /* pull requests of idle slots waiting for a task */
};
ci_status ci_broker_queue_stats(struct ci_broker *b, struct ci_queue_stats *ret,
                                struct ci_error *err);

/* Binds the heartbeat bucket (jetstream.workers_bucket); with create, first
 * creates it with a TTL of ttl_s (an entry not refreshed within it
 * vanishes). Without create, CI_ERR_NOT_FOUND when no worker made it. */
ci_status ci_broker_workers_open(struct ci_broker *b, bool create, uint32_t ttl_s,
                                 struct ci_error *err);
/* Writes (or deletes, on a clean stop) this worker's heartbeat entry. */
ci_status ci_broker_worker_put(struct ci_broker *b, const char *worker_id, const void *data,
                               size_t len, struct ci_error *err);
ci_status ci_broker_worker_delete(struct ci_broker *b, const char *worker_id,
                                  struct ci_error *err);
/* Calls fn for each live heartbeat entry, at most max of them; written_ms
 * is when the server stored it (Unix ms). */
typedef void (*ci_worker_entry_fn)(void *closure, const char *worker_id, const uint8_t *data,
                                   size_t len, int64_t written_ms);
ci_status ci_broker_workers_list(struct ci_broker *b, size_t max, ci_worker_entry_fn fn,
                                 void *closure, struct ci_error *err);

/* --- sessions (docs/contract.md §16) --- */

/* The stream sequence of the oldest message still in the tasks stream on
 * the session's subject (<submit_subject>.<session_id>): a direct get, next
 * by subject from sequence 1. CI_ERR_NOT_FOUND when there is none. */
ci_status ci_broker_session_first_seq(struct ci_broker *b, const char *session_id,
                                      uint64_t *ret_seq, struct ci_error *err);
/* The session's record in jetstream.sessions_bucket and its revision.
 * CI_ERR_NOT_FOUND when there is none (never written, deleted or expired). */
ci_status ci_broker_session_get(struct ci_broker *b, const char *session_id, uint8_t **ret_data,
                                size_t *ret_len, uint64_t *ret_rev, struct ci_error *err);
/* Writes the record only if it is still at revision rev (0: only if there
 * is none, or a deleted one); CI_ERR_CONFLICT otherwise. */
ci_status ci_broker_session_swap(struct ci_broker *b, const char *session_id, const void *data,
                                 size_t len, uint64_t rev, uint64_t *ret_rev,
                                 struct ci_error *err);
/* Writes the record whatever it was (a client closing the session). */
ci_status ci_broker_session_put(struct ci_broker *b, const char *session_id, const void *data,
                                size_t len, struct ci_error *err);
/* Calls fn for each live record, at most max of them; written_ms is when
 * the server stored it (Unix ms). CI_ERR_NOT_FOUND when the bucket does not
 * exist (no worker of this version ran yet). */
ci_status ci_broker_sessions_list(struct ci_broker *b, size_t max, ci_worker_entry_fn fn,
                                  void *closure, struct ci_error *err);

/* --- the runtime manifest (docs/contract.md §18) --- */

/* Writes the manifest JSON of runtime (a worker at start and with its
 * heartbeat) into jetstream.runtimes_bucket, made with create. */
ci_status ci_broker_runtime_put(struct ci_broker *b, const char *runtime, const void *data,
                                size_t len, struct ci_error *err);
/* The manifest of runtime. CI_ERR_NOT_FOUND when no worker published one
 * (or the bucket does not exist: no worker of this version ran). */
ci_status ci_broker_runtime_get(struct ci_broker *b, const char *runtime, uint8_t **ret_data,
                                size_t *ret_len, struct ci_error *err);
/* Calls fn for each manifest in the bucket, at most max of them; written_ms
 * is when the server stored it. CI_ERR_NOT_FOUND when there is no bucket. */
ci_status ci_broker_runtimes_list(struct ci_broker *b, size_t max, ci_worker_entry_fn fn,
                                  void *closure, struct ci_error *err);

/* --- submitting and watching (clients) --- */

/* JetStream-publishes a request on the submit subject with Nats-Msg-Id =
 * task_id. *ret_duplicate tells whether the server had it already. */
ci_status ci_broker_submit(struct ci_broker *b, const char *task_id, const char *content_type,
                           const void *data, size_t len, bool *ret_duplicate,
                           struct ci_error *err);
/* The same for a step of session_id: on <submit_subject>.<session_id>. */
ci_status ci_broker_submit_session(struct ci_broker *b, const char *session_id,
                                   const char *task_id, const char *content_type,
                                   const void *data, size_t len, bool *ret_duplicate,
                                   struct ci_error *err);

struct ci_watch; /* every status event of one task, from the first */
ci_status ci_watch_new(struct ci_broker *b, const char *task_id, struct ci_watch **ret,
                       struct ci_error *err);
/* Next event body and its Content-Type (valid until the next call).
 * CI_ERR_TIMEOUT when none came within timeout_ms. */
ci_status ci_watch_next(struct ci_watch *w, int timeout_ms, const uint8_t **ret_data,
                        size_t *ret_len, const char **ret_content_type, struct ci_error *err);
void ci_watch_free(struct ci_watch *w);

/* --- batches, the client's side (docs/contract.md §20, §21) ---
 * Generic reads and writes on a stream named by the caller: the batch
 * client (src/cli/batch_client.c) knows the subjects. */

/* JetStream-publishes data on subject, with Nats-Msg-Id msg_id and
 * Content-Type content_type when not NULL. *ret_duplicate (may be NULL):
 * the stream had that id within its duplicate window and dropped this
 * copy. CI_ERR_NOT_FOUND when no stream takes the subject. */
ci_status ci_broker_js_publish(struct ci_broker *b, const char *subject, const char *msg_id,
                               const char *content_type, const void *data, size_t len,
                               bool *ret_duplicate, struct ci_error *err);

/* Calls fn with the message count of each subject of stream that matches
 * filter (a stream-info request with subjects_filter); subjects without a
 * message are not listed. CI_ERR_NOT_FOUND when the stream does not exist. */
typedef void (*ci_subject_count_fn)(void *closure, const char *subject, uint64_t msgs);
ci_status ci_broker_subject_counts(struct ci_broker *b, const char *stream, const char *filter,
                                   ci_subject_count_fn fn, void *closure, struct ci_error *err);

/* The body of the last message on subject in stream (a direct get; a get
 * from the leader when the stream does not allow direct gets), as a
 * NUL-terminated copy. CI_ERR_NOT_FOUND when there is none, or no stream. */
ci_status ci_broker_last_msg(struct ci_broker *b, const char *stream, const char *subject,
                             uint8_t **ret_data, size_t *ret_len, struct ci_error *err);

/* Calls fn with each message of stream on filter (wildcards allowed),
 * oldest first, from the first to the last stored when the read began
 * (an ordered consumer); at most max of them. fn returns false to stop
 * early. *ret_read (may be NULL) gets how many fn saw. CI_ERR_NOT_FOUND
 * when the stream does not exist; CI_ERR_TIMEOUT when the server sent
 * nothing for 10 s in the middle of the read. */
typedef bool (*ci_stream_msg_fn)(void *closure, const char *subject, const uint8_t *data,
                                 size_t len);
ci_status ci_broker_stream_read(struct ci_broker *b, const char *stream, const char *filter,
                                size_t max, ci_stream_msg_fn fn, void *closure, size_t *ret_read,
                                struct ci_error *err);

/* The state of any work-queue consumer, as ci_broker_queue_stats gives
 * that of the interactive lane (the batch lane: CI_BATCH, ci-workers-batch).
 * CI_ERR_NOT_FOUND when the stream or the consumer does not exist. */
ci_status ci_broker_consumer_stats(struct ci_broker *b, const char *stream, const char *consumer,
                                   struct ci_queue_stats *ret, struct ci_error *err);

#endif
