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
/* Whether a task's live output may be published (contract §19): the
 * config wants it and its stream is there. When the stream could not be
 * made (a server without room for jetstream.output_max_mb), false with why
 * ("" when the config does not want it); ci_broker_check tries again.
 * Thread-safe. */
bool ci_broker_live_output(struct ci_broker *b, char *why, size_t n);
/* How many times it made what was gone again. */
uint64_t ci_broker_recreated(const struct ci_broker *b);

/* Destroys the subscriptions let go of while NATS did not answer (they
 * wait for a round trip that proves nats.c's read loop holds none of them:
 * broker.c, release_sub), once NATS answers. For a periodic thread of the
 * caller's, never a NATS callback; costs nothing when none waits. */
void ci_broker_release_pending(struct ci_broker *b);
/* How many such wait now (for tests and logs). */
size_t ci_broker_pending_releases(struct ci_broker *b);

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

/* A puller on the interactive lane: consumer jetstream.consumer on the
 * tasks stream. */
ci_status ci_puller_new(struct ci_broker *b, struct ci_puller **ret, struct ci_error *err);
/* A puller on the batch lane (contract §21): jetstream.batch_consumer on
 * jetstream.batch_stream, checked to exist. The lane is asked with pulls
 * that do not wait; its subscription for long polls is made on the first
 * ci_puller_fetch only, so that no stray pull request can fill a queue
 * nobody reads. */
ci_status ci_puller_new_batch(struct ci_broker *b, struct ci_puller **ret, struct ci_error *err);
void ci_puller_free(struct ci_puller *p);
/* Takes one task. CI_ERR_TIMEOUT when none came within timeout_ms. Not
 * thread-safe: one slot fetches from a puller. */
ci_status ci_puller_fetch(struct ci_puller *p, int timeout_ms, struct ci_delivery **ret,
                          struct ci_error *err);
/* Takes one task if one is there now, without waiting for one to come (a
 * pull request with no_wait): CI_ERR_TIMEOUT when none is. Its delivery is
 * never a queued one (ci_delivery_queued_ms -1). Not thread-safe, as
 * ci_puller_fetch. */
ci_status ci_puller_fetch_nowait(struct ci_puller *p, struct ci_delivery **ret,
                                 struct ci_error *err);
/* The reply subject of the puller's long polls, NULL before the first
 * (tests: a pull request on its behalf). */
const char *ci_puller_inbox(const struct ci_puller *p);

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

/* The latest record of each of n tasks (ids[0] .. ids[n-1]), read as
 * ci_broker_result_get reads one (from the bucket stream's leader), with
 * up to window requests in flight at once instead of one round trip each.
 * fn gets each answer as it comes, in any order: the index of its id, and
 * CI_OK with the record (len bytes, valid during the call) or
 * CI_ERR_NOT_FOUND (none, or a deleted one). fn returns false to ask
 * nothing more; the requests in flight are still answered, and given to
 * fn, before this returns. Another status when a request fails, or a
 * lookup goes unanswered for 5 s (CI_ERR_TIMEOUT). */
typedef bool (*ci_result_each_fn)(void *closure, size_t i, ci_status s, const uint8_t *data,
                                  size_t len);
ci_status ci_broker_results_get_many(struct ci_broker *b, const char (*ids)[65], size_t n,
                                     size_t window, ci_result_each_fn fn, void *closure,
                                     struct ci_error *err);

/* Publishes an encoded StatusEvent on <status_prefix>.<task_id> through
 * JetStream, with the Ci-Task-Id, Ci-Status and Content-Type headers. With
 * msg_id (Nats-Msg-Id), the stream keeps one event per id within its
 * duplicate window: a retried publish whose ack was lost is not doubled. */
ci_status ci_broker_event_publish(struct ci_broker *b, const char *task_id,
                                  const char *status_short, const char *content_type,
                                  const char *msg_id, const void *data, size_t len,
                                  struct ci_error *err);
/* Publishes one chunk of a task's live output (contract §19) on
 * <output_prefix>.<task_id>.<stream> (stream "stdout" or "stderr") with the
 * Ci-Task-Id, Ci-Attempt and Ci-Seq headers. A core publish into the
 * output stream's subject: it never waits for the server, so it cannot
 * slow a task down. CI_ERR_NATS when the connection is not up (a chunk
 * never goes into the reconnect buffer, which acks and results need) or
 * the library could not take the message. Thread-safe. */
ci_status ci_broker_output_publish(struct ci_broker *b, const char *task_id, const char *stream,
                                   uint32_t attempt, uint64_t seq, const void *data, size_t len,
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
/* The same for the batch lane (contract §21): jetstream.batch_stream and
 * its consumer. CI_ERR_NOT_FOUND when no worker of this version made them
 * (either lane: the stream or the consumer is missing). */
ci_status ci_broker_batch_queue_stats(struct ci_broker *b, struct ci_queue_stats *ret,
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

/* --- batches (docs/contract.md §20) --- */

struct ci_batch_counts; /* core/batch.h */

/* JetStream-publishes an event of a batch on
 * <batch_events_prefix>.<batch_id>.<event>, with Nats-Msg-Id msg_id (NULL:
 * none) and Content-Type (NULL: none): the stream keeps one message per
 * id within batches.duplicate_window_s. One try (and one more when the
 * stream was gone and is made again): callers that must have it stored
 * try again. *ret_duplicate (may be NULL): the stream had the id.
 * CI_ERR_NOT_FOUND when the events stream does not exist (a client, which
 * makes no streams, before any worker of this version ran). */
ci_status ci_broker_batch_publish(struct ci_broker *b, const char *batch_id, const char *event,
                                  const char *msg_id, const char *content_type, const void *data,
                                  size_t len, bool *ret_duplicate, struct ci_error *err);
/* The message count of each of the batch's event subjects: one stream info
 * request with subjects_filter <batch_events_prefix>.<batch_id>.* .
 * CI_ERR_NOT_FOUND when the events stream does not exist. */
ci_status ci_broker_batch_counts(struct ci_broker *b, const char *batch_id,
                                 struct ci_batch_counts *ret, struct ci_error *err);
/* The batch's tasks still in the batch stream (not yet acked: queued, or
 * taken and running): messages on <batch_subject>.<batch_id>.
 * CI_ERR_NOT_FOUND when the batch stream does not exist. */
ci_status ci_broker_batch_queued(struct ci_broker *b, const char *batch_id, uint64_t *ret,
                                 struct ci_error *err);
/* The body of the last message on <batch_events_prefix>.<batch_id>.<event>
 * (NUL-terminated copy, the caller's), read from the stream's leader, so
 * that one stored is never missed (a worker reads a batch's cancel so).
 * CI_ERR_NOT_FOUND when there is none. */
ci_status ci_broker_batch_last(struct ci_broker *b, const char *batch_id, const char *event,
                               uint8_t **ret_data, size_t *ret_len, struct ci_error *err);
/* The same, and *ret_stored_ms: when the stream stored it (wall clock, ms
 * since the epoch, the server's; 0 when the server did not say), so that a
 * copy kept is dropped when the stream drops it (batches.max_age_s). */
ci_status ci_broker_batch_last_at(struct ci_broker *b, const char *batch_id, const char *event,
                                  uint8_t **ret_data, size_t *ret_len, int64_t *ret_stored_ms,
                                  struct ci_error *err);
/* Calls fn with each message on <batch_events_prefix>.<batch_id>.<event>
 * (event "*": all of the batch's events), oldest first, from the first
 * until the consumer has none pending (an ordered consumer; its num_pending
 * is 0 with the last, or, when none comes for a second, the stream has no
 * message past the last one read: the pending count of the server keeps
 * messages that expired during the read), or until max of them
 * (SIZE_MAX: no limit). fn
 * returns false to stop early. *ret_read (may be NULL) gets how many fn
 * saw, *ret_cut (may be NULL) whether messages were left unread (max, or
 * fn stopped). CI_ERR_NOT_FOUND when the stream does not exist;
 * CI_ERR_TIMEOUT when the server sent nothing for 10 s in the middle. */
typedef bool (*ci_batch_msg_fn)(void *closure, const char *subject, const uint8_t *data,
                                size_t len);
ci_status ci_broker_batch_read(struct ci_broker *b, const char *batch_id, const char *event,
                               size_t max, ci_batch_msg_fn fn, void *closure, size_t *ret_read,
                               bool *ret_cut, struct ci_error *err);
/* Calls fn (on a NATS thread) with the batch id of every message published
 * on <batch_events_prefix>.*.cancel from now on. */
ci_status ci_broker_on_batch_cancel(struct ci_broker *b, ci_cancel_fn fn, void *closure,
                                    struct ci_error *err);
/* Calls fn (on a NATS thread) with the batch id and the body of messages on
 * <batch_events_prefix>.*.sealed from now on, each in one worker of the
 * deployment (a queue group named jetstream.batch_consumer). */
typedef void (*ci_batch_sealed_fn)(const char *batch_id, const void *body, size_t len,
                                   void *closure);
ci_status ci_broker_on_batch_sealed(struct ci_broker *b, ci_batch_sealed_fn fn, void *closure,
                                    struct ci_error *err);

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

/* The same for a task of batch_id: on <batch_subject>.<batch_id>. When the
 * batch stream drops it as a copy, the message it kept (at the PubAck's
 * sequence, read from the stream's leader) says whose the id is: one on
 * another batch's subject is CI_ERR_CONFLICT, err naming that batch (its
 * task, queued or running, has the id: contract §20); one on this
 * batch's subject, or none any more (a worker took it and acked it), is
 * *ret_duplicate, whose record the caller may read to know whose it was. */
ci_status ci_broker_submit_batch(struct ci_broker *b, const char *batch_id, const char *task_id,
                                 const char *content_type, const void *data, size_t len,
                                 bool *ret_duplicate, struct ci_error *err);

struct ci_watch; /* every status event of one task, from the first */
ci_status ci_watch_new(struct ci_broker *b, const char *task_id, struct ci_watch **ret,
                       struct ci_error *err);
/* Next event body and its Content-Type (valid until the next call).
 * CI_ERR_TIMEOUT when none came within timeout_ms. */
ci_status ci_watch_next(struct ci_watch *w, int timeout_ms, const uint8_t **ret_data,
                        size_t *ret_len, const char **ret_content_type, struct ci_error *err);
void ci_watch_free(struct ci_watch *w);

/* A task's live output (contract §19), from its first chunk on: fn is called
 * for each chunk, in order, on the NATS library's thread. stream is
 * "stdout" or "stderr"; attempt and seq come from Ci-Attempt and Ci-Seq (0
 * when missing or not a number). CI_ERR_NOT_FOUND when there is no output
 * stream (workers of an earlier version, or live output off). */
typedef void (*ci_output_fn)(void *closure, const char *stream, uint32_t attempt, uint64_t seq,
                             const uint8_t *data, size_t len);
struct ci_output_follow;
ci_status ci_output_follow_new(struct ci_broker *b, const char *task_id, ci_output_fn fn,
                               void *closure, struct ci_output_follow **ret,
                               struct ci_error *err);
/* Stops it; once it returns true, fn is not running and will not be called
 * again. false when the library did not say so within 5 s: fn may still be
 * called, so its closure must be left alive (leaked). NULL is fine. */
bool ci_output_follow_free(struct ci_output_follow *f);

#endif
