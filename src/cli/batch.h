/* batch.h - what a batch is to a client (docs/contract.md §20), without
 * NATS: the command line of `ci batch`, batch and task ids, the counts
 * from the message counts of the batch's event subjects, the grouping of
 * failures, the lines of a JSONL file, and the files of a glob. The event
 * bodies and the complete test are core/batch.h's, shared with the
 * worker; batch_client.h does the NATS side. */
#ifndef CI_CLI_BATCH_H
#define CI_CLI_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/batch.h"
#include "core/codec.h"
#include "core/config.h"
#include "core/status.h"
#include "core/util.h"

/* The most tasks one `ci batch submit` publishes. */
#define CI_BATCH_MAX_TASKS 100000
/* The longest JSONL line (a request with inline inputs, in base64). */
#define CI_BATCH_MAX_LINE (64u * 1024 * 1024)

/* --- the command line --- */

enum ci_batch_verb {
    CI_BATCH_SUBMIT,
    CI_BATCH_STATUS,
    CI_BATCH_WAIT,
    CI_BATCH_RESULTS,
    CI_BATCH_CANCEL,
};

/* What main() parsed after `ci batch`: the operands, and which of ci's
 * options were given. */
struct ci_batch_cmdline {
    const char *const *operands; /* the verb first */
    size_t n_operands;
    const char *file_each; /* --file-each GLOB */
    const char *batch;     /* --batch ID */
    bool jsonl;            /* --jsonl, or --jsonl=FILE: */
    const char *jsonl_file;
    bool json, wait_set, retry_set, timeout_set, memory_set, no_save, wire_json, output;
    size_t n_labels, n_files;
    const char *id, *session, *format, *save_dir;
};

/* A checked command. */
struct ci_batch_cmd {
    enum ci_batch_verb verb;
    const char *script;     /* submit --file-each: the code */
    const char *glob;       /* submit --file-each */
    const char *jsonl_file; /* submit --jsonl */
    const char *batch;      /* submit: --batch or NULL (a new id); the others: the operand */
    bool json;              /* status --json */
    bool jsonl;             /* results --jsonl */
};

/* Checks the command line of `ci batch`: the verb, its operands, and that
 * each option given belongs to it. CI_ERR_INVALID with one sentence. */
ci_status ci_batch_cmdline_check(const struct ci_batch_cmdline *in, struct ci_batch_cmd *ret,
                                 struct ci_error *err);

/* --- ids --- */

/* "b-" and 16 random lower-case hex digits. */
void ci_batch_new_id(char out[19]);
/* Whether batch is a batch id and leaves room for the task ids of n_tasks
 * tasks, "<batch>-<n>" being at most 64 characters. CI_ERR_INVALID. */
ci_status ci_batch_id_check(const char *batch, uint64_t n_tasks, struct ci_error *err);
/* "<batch>-<n>"; CI_ERR_INVALID when that is longer than 64. */
ci_status ci_batch_task_id(const char *batch, uint64_t n, char out[65], struct ci_error *err);

/* --- counts --- */

/* The status of an end event (core/batch.h's enum): TASK_STATUS_RUNNING
 * for taken, UNSPECIFIED for the others. */
Ci__V1__TaskStatus ci_batch_event_status(enum ci_batch_event ev);

/* What the streams say of a batch. */
struct ci_batch_raw {
    struct ci_batch_counts events; /* messages on each event subject */
    bool sealed;                   /* the seal was read */
    uint64_t seal_total;           /* the seal's total, when sealed */
    uint64_t left;                 /* messages still on <batch_subject>.<b> */
};

/* The counts of contract §20 "Counting", as `ci batch` shows them. Before
 * the seal, total is taken + (left - running): the tasks submitted so far,
 * a task that has ended but is not acked yet counted twice. */
struct ci_batch_state {
    uint64_t total, queued, running, succeeded, failed, timed_out, cancelled;
    bool sealed, complete, cancel_requested;
};

/* Computes the counts; never below 0 where the messages disagree (a seal
 * total below what was taken, an end without its taken). */
void ci_batch_state_compute(const struct ci_batch_raw *raw, struct ci_batch_state *ret);
uint64_t ci_batch_state_ended(const struct ci_batch_state *c);
/* The batch is complete: ci_batch_is_complete, the worker's test. */
bool ci_batch_state_done(const struct ci_batch_state *c);
/* Whether the streams know the batch at all (a cancel of it is enough). */
bool ci_batch_raw_known(const struct ci_batch_raw *raw);
/* Whether the batch was submitted: a task of it in the queue, its seal, or
 * an event of one of its tasks; a cancel alone is not enough. */
bool ci_batch_raw_submitted(const struct ci_batch_raw *raw);

/* Exactly {"total":N,"queued":N,"running":N,"succeeded":N,"failed":N,
 * "timed_out":N,"cancelled":N} (`ci batch status --json`). */
ci_status ci_batch_state_json(const struct ci_batch_state *c, struct ci_buf *out);

/* --- failures grouped by their error --- */

#define CI_BATCH_GROUP_IDS 3 /* task ids kept per group */

struct ci_batch_group {
    Ci__V1__TaskStatus status;
    char *error;
    uint64_t count;
    char ids[CI_BATCH_GROUP_IDS][65]; /* the first tasks of the group */
    size_t n_ids;
    size_t order; /* when it was first seen */
};

struct ci_batch_failures {
    struct ci_batch_group *groups;
    size_t n, cap, max_groups;
    uint64_t total;     /* failures added */
    uint64_t ungrouped; /* of them, in no group: max_groups were full */
};

void ci_batch_failures_init(struct ci_batch_failures *f, size_t max_groups);
void ci_batch_failures_release(struct ci_batch_failures *f);
/* Counts the failure of task_id in the group of its status and error. */
ci_status ci_batch_failures_add(struct ci_batch_failures *f, Ci__V1__TaskStatus status,
                                const char *error, const char *task_id);
/* Orders the groups: the largest first, then the first seen. */
void ci_batch_failures_sort(struct ci_batch_failures *f);

/* --- JSONL: one ExecutionRequest per line --- */

/* Whether a line holds only white space (it is skipped). */
bool ci_batch_line_blank(const uint8_t *line, size_t len);
/* Decodes a line as the n-th request of the file (from 1, blank lines not
 * counted), an ExecutionRequest of batch (the JSON mapping, contract §10),
 * and makes it one: its taskId kept, else "<batch>-<n>"; its batchId
 * absent or batch; no sessionId. Checked against the limits of cfg.
 * CI_ERR_INVALID (CI_ERR_LIMIT) with err saying what (the caller names the
 * line). Free with ci_message_free. */
ci_status ci_batch_jsonl_request(const struct ci_config *cfg, const char *batch, size_t n,
                                 const uint8_t *line, size_t len,
                                 Ci__V1__ExecutionRequest **ret, struct ci_error *err);

/* A task id and where it came from, to find one used twice. */
struct ci_batch_id_line {
    char id[65];
    size_t line;
};
/* Sorts ids and fails (CI_ERR_INVALID) naming both lines of the first id
 * that two of them share. */
ci_status ci_batch_ids_unique(struct ci_batch_id_line *ids, size_t n, struct ci_error *err);

/* --- --file-each GLOB --- */

/* The files pattern matches (glob(3)), sorted bytewise so that the same
 * files give the same order (and task ids) in any locale. CI_ERR_INVALID
 * when none matches, when more than max do, or when one is not a regular
 * file; err names it. Free with ci_batch_paths_free. */
ci_status ci_batch_glob(const char *pattern, size_t max, char ***ret, size_t *ret_n,
                        struct ci_error *err);
void ci_batch_paths_free(char **paths, size_t n);

/* Which inputs of a --file-each batch make its largest messages: of the
 * files sent inline (of at most inline_max bytes), the one whose name and
 * content make the most bytes in the encoding (protobuf, or JSON with the
 * content in base64), and of the files above that (uploaded, the message
 * names them) the one with the longest name; SIZE_MAX for none. */
struct ci_batch_files_extremes {
    size_t largest_inline, longest_uploaded;
};
/* Checks every input of a --file-each batch before any task goes out (a
 * refusal half way would leave the batch half published and unsealed):
 * the name the task sees it under (its base name, the contract's input
 * name rules), its size (at most max_bytes, limits.max_input_bytes) and
 * that it can be opened. CI_ERR_INVALID naming the first file at fault. */
ci_status ci_batch_files_check(char *const *paths, size_t n, uint64_t max_bytes,
                               size_t inline_max, bool json, struct ci_batch_files_extremes *ret,
                               struct ci_error *err);

#endif
