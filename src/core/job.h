/* job.h - one unit of work as every runner sees it: the job (code, inputs,
 * limits) and what running it produced (the outcome, with its artifacts).
 *
 * These are plain data shared by the providers (provider.h) and the
 * sandbox (sandbox.h); neither owns the other's types. */
#ifndef CI_JOB_H
#define CI_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* An input file, already fetched (inline or from the object store). */
struct ci_file {
    char *name;
    uint8_t *data;
    size_t len;
};

/* For a caller that runs one bare task at a time (local.isolation none) as
 * the child subreaper of its orphans (ci-executor, src/executor/sweep.h).
 * A bare task's own process group is killed when it ends, but a process it
 * put in a session of its own lives on as the caller's child; only such a
 * caller can find it, and only it knows that every child it has is the
 * task's. So the sandbox tells it when the task's process exists
 * (started: from then on it may reap the task's other children as they
 * exit, never this pid, which the sandbox waits for) and when that process
 * has been reaped (ended: it kills and reaps every child it has, before the
 * sandbox reads the artifacts and removes the task's directory). Both are
 * called on the thread that starts and waits for the run, ended at most
 * once. The namespace sandbox ignores them (its init's death kills every
 * process of the task), and so do remote providers. */
struct ci_bare_hooks {
    void (*started)(void *ctx, pid_t task);
    void (*ended)(void *ctx);
    void *ctx;
};

/* Where a run's output goes while the code runs (docs/contract.md §19),
 * besides the outcome, which still gets all of it. write() gets exactly
 * the bytes the outcome keeps of each stream (the first output cap bytes),
 * in order, as they are read; tick() does what is due and says in how
 * many ms it wants to be called again (-1: not before more output); end()
 * says that the output is complete (once, when the code's pipes are
 * drained, before the artifacts are read). All are called only on the
 * thread that waits for the run, and never after the wait returned. A
 * provider that cannot stream (a remote one) ignores the sink: its caller
 * finds the output in the outcome. */
enum ci_output_stream { CI_OUTPUT_STDOUT = 1, CI_OUTPUT_STDERR = 2 };
struct ci_output_sink {
    void (*write)(void *ctx, enum ci_output_stream stream, const uint8_t *data, size_t len);
    int64_t (*tick)(void *ctx);
    void (*end)(void *ctx);
    void *ctx;
};

/* A step of a session (docs/contract.md §16). The state is an archive the
 * previous step's sandbox made; it is handed to this step's sandbox as it
 * came and never decoded outside one. */
struct ci_session_job {
    bool on;                  /* the job is a session step: restore, then save */
    const uint8_t *state;     /* the archive to restore; NULL: nothing (a new session) */
    size_t state_len;
    uint64_t max_state_bytes; /* the most the step may leave (sessions.max_state_mb) */
};

/* What to run: borrowed from the caller for the whole run. Limits are
 * validated and defaulted before a job is made (request.h). */
struct ci_job {
    const char *task_id;
    const char *runtime; /* "" or NULL: the default runtime */
    const char *code;
    size_t code_len;
    const struct ci_file *files;
    size_t n_files;
    uint32_t timeout_ms;
    uint32_t memory_mb;
    const struct ci_bare_hooks *bare_hooks; /* NULL: none (copied at start) */
    const struct ci_output_sink *output;    /* NULL: none (copied at start; its ctx must
                                               outlive the wait) */
    struct ci_session_job session;          /* .on false: not a session step */
};

struct ci_artifact {
    char *name;      /* relative path as the code wrote it */
    char *mime_type; /* "text/csv" or "image/png" */
    uint8_t *data;
    size_t len;
    char sha256[65];
};

enum ci_outcome_kind {
    CI_OUTCOME_EXITED,    /* the code ran and exited; exit_code is set */
    CI_OUTCOME_TIMED_OUT, /* the time limit killed it */
    CI_OUTCOME_CANCELLED, /* a cancel killed it */
    CI_OUTCOME_MEMORY,    /* the memory limit was exceeded */
    CI_OUTCOME_ERROR,     /* the code could not run or the run broke; see error */
};

/* What a session step's sandbox said about the state (all empty when the
 * job was no session step). Everything here came from the sandbox: the
 * texts are capped and sanitized, the archive is opaque. */
struct ci_session_outcome {
    bool restored;       /* the state given was restored before the code ran */
    bool keep_previous;  /* it could not be loaded for want of memory or room: what the
                            step leaves must not replace it */
    char *restore_error; /* why it could not be, or NULL */
    char *dropped;       /* names not kept, one per line: "fh (open file)"; NULL: none */
    uint8_t *state;      /* the archive the step left; NULL when none (state_error says why) */
    size_t state_len;
    char *state_error;   /* why no state is left, or NULL */
};

/* A rich output (docs/contract.md §17): a value the code showed, rendered in
 * the sandbox and only checked outside it. The MIME types and kind are
 * static strings (never freed); the values are valid UTF-8 without NUL,
 * each within its cap. */
#define CI_OUTPUT_MIME_MAX 4 /* text/plain, text/html, application/json, image/png */
struct ci_output_data {
    const char *mime_type;
    char *value;
};

struct ci_output {
    const char *kind; /* "result" or "display" */
    struct ci_output_data data[CI_OUTPUT_MIME_MAX];
    size_t n_data;
    bool truncated;      /* a representation was cut to its cap */
    uint64_t total_rows; /* of a DataFrame or Series */
    char *artifact;      /* the artifact an image too large to inline is, or NULL */
};

/* When a local run passed its stages (ci_now_us(), 0: not reached or not
 * known): for the worker's stage timings (its task.stages log line), never
 * part of a result. A remote provider leaves them 0. */
struct ci_run_marks {
    int64_t cgroup_us;    /* the task's cgroup made (none: the start) */
    int64_t acquired_us;  /* warm: the spare's init took the task (HELLO); cold: init cloned */
    int64_t ready_us;     /* init built the task's mounts (READY) */
    int64_t go_us;        /* the inputs written, GO sent: the code starts */
    int64_t end_us;       /* the code's end seen (init's DONE, or its exit) */
    int64_t collected_us; /* output drained, artifacts and outputs read */
};

/* Everything a run produced. Owned by whoever waited for it. */
struct ci_outcome {
    enum ci_outcome_kind kind;
    bool has_exit_code;
    int32_t exit_code;
    char *out; /* stdout, raw bytes, at most the output cap, NUL-terminated */
    size_t out_len;
    uint64_t out_total; /* bytes the code wrote, before the cut */
    char *err; /* stderr, likewise */
    size_t err_len;
    uint64_t err_total;
    struct ci_artifact *artifacts;
    size_t n_artifacts;
    uint64_t duration_ms;
    uint64_t cpu_ms;
    uint32_t memory_mb; /* peak resident memory */
    char *error;        /* one sentence for the agent, or NULL */
    char *hint;         /* what to try next, or NULL */
    char isolation[128]; /* layers that ran: "user,pid,net,mnt,ipc,uts" or "none" */
    struct ci_session_outcome session;
    struct ci_output *outputs; /* in the order the code made them */
    size_t n_outputs;
    bool outputs_truncated;    /* more were made than kept */
    struct ci_run_marks marks;
    /* Its processes outlived SIGKILL (frozen, or stuck in the kernel): the
     * provider stopped waiting for them (local; error says so too). */
    bool unreaped;
};

/* Both accept NULL and leave the struct zeroed. */
void ci_outcome_release(struct ci_outcome *o);
void ci_artifact_release(struct ci_artifact *a);
void ci_output_release(struct ci_output *out);

#endif
