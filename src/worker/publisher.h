/* publisher.h - publishes an attempt's live output chunks (docs/contract.md
 * §19) from a thread of its own, so that the thread that waits for the run
 * never waits for NATS: a publish blocks when the connection's socket does
 * (a server that stopped reading, a half-open connection, a full buffer),
 * and the run's time limit and cancel must still be enforced on time.
 *
 * put() copies a chunk into a queue bounded in chunks and in bytes (the
 * worker's holds all the output an attempt may publish, ci_publisher_size)
 * and returns at once; the thread publishes the queue in order, one chunk at a
 * time. A chunk that finds the queue full is dropped (its number stays
 * used: a subscriber sees a gap), never one already queued, so chunks go
 * out in the order they were put, with gaps. When the run has ended, end()
 * sets a deadline: until then put() waits for room (the tail that finish()
 * publishes), and drain() waits for the queue to empty; what is still
 * queued at the deadline is dropped. A stuck NATS therefore holds the end
 * of a task for at most the deadline, plus the one publish under way then
 * (a NATS call, which the result's own write would wait behind anyway, and
 * which the connection's write deadline bounds: nats.write_deadline_ms).
 *
 * One publisher per attempt: it lives and dies with its task, which it
 * refers to through ops; a chatty task's full queue drops no other task's
 * chunks. It reaches NATS only through ops, so that it is tested without
 * a server. */
#ifndef CI_PUBLISHER_H
#define CI_PUBLISHER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define CI_PUBLISHER_MAX_CHUNKS 256          /* chunks queued at most, by default */
#define CI_PUBLISHER_MAX_BYTES (1024 * 1024) /* their bytes at most, by default */
#define CI_PUBLISHER_DRAIN_MS 2000           /* the end's wait for the queue */
/* What ci_publisher_size never goes past, whatever it is asked for. */
#define CI_PUBLISHER_HARD_MAX_CHUNKS 8192
#define CI_PUBLISHER_HARD_MAX_BYTES (64 * 1024 * 1024)

struct ci_publisher;

struct ci_publisher_ops {
    /* Publishes one chunk of stream numbered seq; on the publisher's
     * thread. Not CI_OK: the chunk is lost, err says why. */
    ci_status (*publish)(void *ctx, const char *stream, uint64_t seq, const uint8_t *data,
                         size_t len, struct ci_error *err);
    /* Optional: a chunk did not go out, and why: CI_ERR_LIMIT the queue
     * was full, CI_ERR_NOMEM no memory for its copy, CI_ERR_TIMEOUT it was
     * still queued (or waiting for room) at the end's deadline,
     * CI_ERR_CANCELLED still queued when the publisher was stopped or
     * freed, else what publish returned. Called on the thread that found out, never
     * under the publisher's lock. */
    void (*dropped)(void *ctx, const char *stream, uint64_t seq, ci_status s, const char *why);
};

struct ci_publisher_opts {
    const struct ci_publisher_ops *ops;
    void *ctx;
    /* 0: the defaults above (tests make them small) */
    size_t max_chunks;
    size_t max_bytes;
};

/* Sizes o's queue to hold bytes of chunks at once, when they come in
 * chunks of min_chunk bytes or more but for a few smaller ones: max_bytes
 * is bytes (at least CI_PUBLISHER_MAX_BYTES), max_chunks bytes / min_chunk
 * plus CI_PUBLISHER_MAX_CHUNKS for the smaller ones; neither past the hard
 * bounds above. A queue that holds all an attempt can put drops nothing
 * while NATS takes the chunks, however much faster the code writes them. */
void ci_publisher_size(struct ci_publisher_opts *o, uint64_t bytes, size_t min_chunk);

struct ci_publisher_stats {
    uint64_t published; /* chunks publish() took */
    uint64_t bytes;     /* ... their bytes */
    uint64_t refused;   /* dropped by put(): the queue was full (till the end's
                           deadline, after end()), or no memory for the copy */
    uint64_t failed;    /* publish() failed */
    uint64_t left;      /* still queued at the end's deadline, at stop() or at free() */
};

/* Starts the thread. */
ci_status ci_publisher_new(const struct ci_publisher_opts *o, struct ci_publisher **ret,
                           struct ci_error *err);
/* Drops what is still queued, waits for the publish under way, stops the
 * thread. Accepts NULL. */
void ci_publisher_free(struct ci_publisher *p);

/* Queues a copy of the chunk. The queue is full when the chunk would take
 * it past max_chunks or max_bytes (an empty queue takes any chunk). Before
 * end(), never waits: CI_ERR_LIMIT when the queue is full (the chunk is
 * dropped). After it, waits for room until the deadline (CI_ERR_TIMEOUT
 * past it). CI_ERR_NOMEM: no memory for the copy. Every chunk that is not
 * queued is told to ops->dropped as well. */
ci_status ci_publisher_put(struct ci_publisher *p, const char *stream, uint64_t seq,
                           const uint8_t *data, size_t len, struct ci_error *err);
/* The run has ended: from now on put() may wait for room, and drain() waits,
 * until deadline_ms (monotonic, ci_mono_ms). Called again, it moves the
 * deadline. */
void ci_publisher_end(struct ci_publisher *p, int64_t deadline_ms);
/* Waits until every chunk queued was published, or the deadline end() set
 * passed; drops what is still queued then, and returns once no publish is
 * under way: nothing put before drain() is published after it. CI_OK: all
 * went out (or failed in publish()); CI_ERR_TIMEOUT: some were dropped.
 * Without end() it does not wait: stop(p, NULL), and CI_ERR_CANCELLED when
 * it dropped some. The publisher stays usable. */
ci_status ci_publisher_drain(struct ci_publisher *p);
/* Drops what is queued at once (told CI_ERR_CANCELLED, with why, or a
 * reason of its own when NULL), and returns once no publish is under way:
 * nothing put before stop() is published after it. For an attempt whose
 * result will not be stored: its last chunks are worth nothing, and must
 * not follow what it publishes next. The publisher stays usable. */
void ci_publisher_stop(struct ci_publisher *p, const char *why);

void ci_publisher_stats(const struct ci_publisher *p, struct ci_publisher_stats *ret);

#endif
