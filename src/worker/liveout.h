/* liveout.h - the live output of one attempt (docs/contract.md §19): what
 * the code writes to stdout and stderr, made into the text the result will
 * keep (valid UTF-8, an invalid byte or a NUL as U+FFFD, at most the output
 * cap of each stream, never cut inside a character) and published in
 * numbered chunks while the code runs: once LIVEOUT_FLUSH_BYTES are
 * pending, or LIVEOUT_DELAY_MS after the first pending byte came, in chunks
 * of at most LIVEOUT_MAX_CHUNK. When the attempt ends, finish() publishes
 * what the result keeps beyond what went out: bytes of a character held
 * back, or everything, for a provider that did not stream.
 *
 * A chunk that could not be published is lost: its number is skipped (a
 * client sees the gap and takes the result) and the rest goes on. Nothing
 * here can change or delay the result.
 *
 * It reaches NATS only through ops, so that it is tested without a server.
 * Not thread-safe: the thread that waits for the run feeds it (through the
 * sink, ci_liveout_sink), then the task's thread finishes it. */
#ifndef CI_LIVEOUT_H
#define CI_LIVEOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/job.h"
#include "core/status.h"

#define CI_LIVEOUT_FLUSH_BYTES (16 * 1024) /* pending this much goes out at once */
#define CI_LIVEOUT_MAX_CHUNK (64 * 1024)   /* the largest chunk */
#define CI_LIVEOUT_DELAY_MS 50             /* the longest a pending byte waits */

struct ci_liveout;

struct ci_liveout_ops {
    /* Publishes one chunk of stream ("stdout" or "stderr") numbered seq
     * (from 1 per stream). Not CI_OK: the chunk is lost, err says why.
     * Called on the thread that waits for the run: it must not wait for
     * NATS while the run goes on (the worker's hands the chunk to a
     * publisher, publisher.h; after run_ended it may wait a little). */
    ci_status (*publish)(void *ctx, const char *stream, uint64_t seq, const uint8_t *data,
                         size_t len, struct ci_error *err);
    /* Optional: the run ended (ci_liveout_flush), and its last chunks are
     * about to be published. The worker's lets them wait a little for room
     * in its publisher's queue from now on (publisher.h, end()). */
    void (*run_ended)(void *ctx);
};

struct ci_liveout_opts {
    const struct ci_liveout_ops *ops;
    void *ctx;
    size_t cap;           /* bytes of text kept of each stream (limits.max_output_bytes) */
    /* 0: the defaults above (tests make them small) */
    size_t flush_bytes;
    size_t max_chunk;     /* at least 4: a character always fits */
    int64_t delay_ms;
};

/* What went out, for the log line and the metrics. */
struct ci_liveout_stats {
    uint64_t chunks;      /* published */
    uint64_t dropped;     /* lost: their numbers were skipped */
    uint64_t bytes;       /* of the published chunks */
    char error[256];      /* why the first chunk was lost; "" when none was */
};

ci_status ci_liveout_new(const struct ci_liveout_opts *o, struct ci_liveout **ret,
                         struct ci_error *err);
/* Accepts NULL. Drops what was not published. */
void ci_liveout_free(struct ci_liveout *lo);

/* Bytes the code wrote to stream, as the run's capture keeps them (the
 * sandbox hands over only those), at now (monotonic ms). Publishes what
 * is due by size. */
void ci_liveout_write(struct ci_liveout *lo, enum ci_output_stream stream, const uint8_t *data,
                      size_t len, int64_t now_ms);
/* Publishes what is due at now_ms; returns the ms until the next chunk is
 * due, or -1 when nothing is pending. */
int64_t ci_liveout_tick(struct ci_liveout *lo, int64_t now_ms);
/* The run ended: tells ops->run_ended, then publishes everything pending
 * now. Bytes of a character not complete yet stay for finish(), which
 * knows how the result ends. */
void ci_liveout_flush(struct ci_liveout *lo);
/* The result's text of stdout and of stderr (NUL-terminated, as the stored
 * result keeps them): publishes of each what was not published yet, after
 * what was, in chunks of at most max_chunk. What was published live is a
 * prefix of that text; when the result is shorter (it was cut to fit a
 * message), nothing more goes out. Call it before the terminal event; a
 * second call publishes only what a longer text adds. */
void ci_liveout_finish(struct ci_liveout *lo, const char *out, const char *err);
/* Whether finish() with this text would publish anything. */
bool ci_liveout_owes(const struct ci_liveout *lo, const char *out, const char *err);

void ci_liveout_stats(const struct ci_liveout *lo, struct ci_liveout_stats *ret);

/* A sink (job.h) that feeds lo with the monotonic clock and flushes it
 * when the run's output is complete; lo must outlive the run's wait. */
struct ci_output_sink ci_liveout_sink(struct ci_liveout *lo);

#endif
