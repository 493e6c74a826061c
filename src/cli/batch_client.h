/* batch_client.h - a batch on NATS, for `ci batch` (docs/contract.md §20):
 * submit its tasks and seal it, read its counts, its end events and its
 * results, cancel it. Nothing here writes to stdout or stderr: progress and
 * outcomes go to the caller. */
#ifndef CI_BATCH_CLIENT_H
#define CI_BATCH_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/batch.h"
#include "core/codec.h"
#include "core/config.h"
#include "core/status.h"

struct ci_broker;

/* A batch to submit. Either paths (--file-each: code runs once per file)
 * or jsonl_path (one request per line). */
struct ci_batch_submit {
    const char *batch; /* the batch id, checked */
    bool batch_new;    /* made by this submission (b- and random digits): no other
                          task can have an id <batch>-<n>, none is looked up */
    /* --file-each */
    const char *code;
    size_t code_len;
    char *const *paths; /* sorted: task n (from 1) gets paths[n-1] */
    size_t n_paths;
    const char *const *labels;
    size_t n_labels;
    uint32_t timeout_ms, memory_mb;
    /* --jsonl */
    const char *jsonl_path;
    bool wire_json;
};

/* What a submission did. */
struct ci_batch_submitted {
    uint64_t total;     /* tasks of the batch */
    uint64_t published; /* stored in CI_BATCH now */
    uint64_t duplicates; /* dropped by CI_BATCH: queued already (within its window) */
    uint64_t skipped;    /* not published: a worker took them, or their result is terminal */
    bool seal_was_there; /* sealed by an earlier submission (with the same total) */
    bool sealed;         /* the seal is stored, by this submission or an earlier one:
                            a failure after it (the counts, complete) left every task out */
    bool completed;      /* this submission stored the complete event */
    bool in_use;         /* it stopped at a task id that a queued task of another
                            batch has (CI_ERR_INVALID), the tasks before it out */
    struct ci_batch_state counts; /* read after sealing */
};

/* Called after each task, with how many are done of total: first as they
 * are "checked" (before anything goes out), then "submitted". */
typedef void (*ci_batch_progress_fn)(void *closure, const char *stage, uint64_t done,
                                     uint64_t total);

/* Checks every input (and that no task id is in use outside the batch: a
 * record in ci-results of another batch's task, or of one outside any),
 * then publishes every task of the batch on <batch_subject>.<b> with
 * Nats-Msg-Id = its id, skipping those a worker took or whose result is
 * terminal already, then the seal, and
 * the complete event when every task has ended (contract §20). A JSONL file
 * is read twice: every line is checked before the first task goes out.
 * CI_ERR_INVALID when the caller's input is at fault (err names the file,
 * line or input), CI_ERR_CONFLICT when the batch was sealed with another
 * total; another status for NATS. */
ci_status ci_batch_submit(struct ci_broker *b, const struct ci_config *cfg,
                          const struct ci_batch_submit *s, ci_batch_progress_fn progress,
                          void *closure, struct ci_batch_submitted *ret, struct ci_error *err);

/* What the streams say of the batch now. CI_ERR_NOT_FOUND when the
 * batch streams do not exist (no worker with batches has run). */
ci_status ci_batch_read_raw(struct ci_broker *b, const struct ci_config *cfg, const char *batch,
                            struct ci_batch_raw *ret, struct ci_error *err);

/* Publishes the complete event when the seal was read and the counts say
 * the batch is complete (ci_batch_is_complete, as a worker does);
 * *ret_stored: this call stored it (the server keeps one per batch). */
ci_status ci_batch_complete_if_done(struct ci_broker *b, const char *batch,
                                    const struct ci_batch_raw *raw, bool *ret_stored,
                                    struct ci_error *err);

/* Calls fn with each end event of the batch, in the order they were
 * stored, until none is left (ci_broker_batch_read); only those of the
 * events in mask (bits 1 << CI_BATCH_EV_...). At most max messages are
 * read (SIZE_MAX: all; with several kinds in mask, all of the batch's
 * events count, taken and cancel too); *ret_cut (may be NULL) says that
 * some were left unread. fn returns false to stop. An event body that is
 * not the contract's is skipped and counted in *ret_unreadable (may be
 * NULL). */
typedef bool (*ci_batch_end_fn)(void *closure, const struct ci_batch_end *end);
ci_status ci_batch_read_ends(struct ci_broker *b, const struct ci_config *cfg, const char *batch,
                             unsigned mask, size_t max, ci_batch_end_fn fn, void *closure,
                             size_t *ret_unreadable, bool *ret_cut, struct ci_error *err);

/* The JSON line of an ended task's result (contract §20): its record in
 * ci-results in the JSON mapping whatever its encoding; when the record
 * has expired (*ret_expired) or cannot be decoded,
 * {"taskId","status","error","batchId"} made from the end event.
 * Malloc'd, without a newline. */
ci_status ci_batch_result_line(struct ci_broker *b, const char *batch,
                               const struct ci_batch_end *end, char **ret, size_t *ret_len,
                               bool *ret_expired, struct ci_error *err);

/* Publishes the batch's cancel (JetStream, kept in CI_BATCHES). */
ci_status ci_batch_cancel(struct ci_broker *b, const struct ci_config *cfg, const char *batch,
                          struct ci_error *err);

#endif
