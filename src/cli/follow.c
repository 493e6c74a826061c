/* follow.c - a task's output as it is written, then the rest (follow.h). */
#include "cli/follow.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/chunk_order.h"
#include "cli/client.h"
#include "core/util.h"
#include "nats/broker.h"

/* What one stream shows live: a worker publishes at most
 * limits.max_output_bytes of each stream, 16 MiB at the most (config.c), so
 * any worker's output is shown whole, and no more is kept. Early chunks
 * held: more than a reconnect puts out of order (what a socket held: a few
 * MiB, in chunks of 16 KiB or more when output comes fast); past that (a
 * lost chunk, then a task that prints for long after it) the rest comes
 * with the result. */
#define FOLLOW_MAX_BYTES (16u << 20)
#define FOLLOW_MAX_HELD 4096

/* What was shown of one stream of the attempt being shown. */
struct shown {
    FILE *f;
    struct ci_buf text;          /* every byte shown, to compare with the result */
    struct ci_chunk_order order; /* stopped: nothing more is shown live */
};

struct ci_follow {
    pthread_mutex_t lock;
    struct ci_output_follow *sub; /* NULL: no live output */
    uint32_t attempt;             /* the attempt being shown; 0 before any chunk */
    bool closed;                  /* finish() began: chunks are ignored */
    struct shown out, err;
};

static ci_status show(void *closure, const uint8_t *data, size_t len)
{
    struct shown *s = closure;
    if (ci_buf_append(&s->text, data, len))
        return CI_ERR_NOMEM; /* not shown: the rest comes from the result */
    ci_client_put_text(s->f, (const char *)data, len);
    fflush(s->f);
    return CI_OK;
}

static void on_chunk(void *closure, const char *stream, uint32_t attempt, uint64_t seq,
                     const uint8_t *data, size_t len)
{
    struct ci_follow *f = closure;
    pthread_mutex_lock(&f->lock);
    /* A chunk of an attempt before the one shown, stored late (its
     * worker's old socket), is not shown: the task runs again, and the
     * result will be the later attempt's. */
    if (f->closed || attempt == 0 || attempt < f->attempt)
        goto out;
    if (attempt > f->attempt) {
        /* The task runs again: its output starts over. */
        if (f->out.text.len || f->err.text.len) {
            fflush(f->out.f);
            fprintf(f->err.f, "\nci: the task is running again (attempt %u); its output "
                              "starts over\n", attempt);
        }
        f->attempt = attempt;
        struct shown *both[2] = {&f->out, &f->err};
        for (int i = 0; i < 2; i++) {
            both[i]->text.len = 0;
            ci_chunk_order_reset(&both[i]->order);
        }
    }
    struct shown *s = strcmp(stream, "stdout") == 0 ? &f->out : &f->err;
    /* A failure stops the stream's live view: the rest comes from the result. */
    ci_chunk_order_put(&s->order, seq, data, len, show, s);
out:
    pthread_mutex_unlock(&f->lock);
}

struct ci_follow *ci_follow_start(struct ci_broker *b, const char *task_id, FILE *out,
                                  FILE *err)
{
    struct ci_follow *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    pthread_mutex_init(&f->lock, NULL);
    f->out = (struct shown){.f = out, .text = CI_BUF_INIT};
    f->err = (struct shown){.f = err, .text = CI_BUF_INIT};
    ci_chunk_order_init(&f->out.order, FOLLOW_MAX_HELD, FOLLOW_MAX_BYTES);
    ci_chunk_order_init(&f->err.order, FOLLOW_MAX_HELD, FOLLOW_MAX_BYTES);
    struct ci_error e = {{0}};
    if (ci_output_follow_new(b, task_id, on_chunk, f, &f->sub, &e) != CI_OK)
        f->sub = NULL; /* shown at the end, as without live output */
    return f;
}

/* The result's text beyond what was shown, or all of it, with a note. A
 * result cut after the chunks went out (to fit max_payload, or stored
 * without its output) is a prefix of what was shown: nothing more then. */
static void rest(struct shown *s, const char *text, bool same_attempt, bool cut, FILE *note)
{
    size_t len = strlen(text);
    if (s->text.len == 0) {
        ci_client_put_text(s->f, text, len);
    } else if (same_attempt && s->text.len <= len && memcmp(s->text.data, text, s->text.len) == 0) {
        ci_client_put_text(s->f, text + s->text.len, len - s->text.len);
    } else if (same_attempt && cut && len < s->text.len && memcmp(s->text.data, text, len) == 0) {
        /* shown in full already; ci run says it was cut */
    } else {
        fflush(s->f);
        fprintf(note, "\nci: the output shown so far is not the result's (the task ran again, "
                      "or its result was stored without that output); the result's follows\n");
        ci_client_put_text(s->f, text, len);
    }
    fflush(s->f);
}

void ci_follow_finish(struct ci_follow *f, const Ci__V1__ExecutionResult *r)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->lock);
    f->closed = true;
    pthread_mutex_unlock(&f->lock);
    /* Unless on_chunk is done for good, f stays allocated (leaked) for
     * it: it finds f->closed and returns. */
    bool done = ci_output_follow_free(f->sub);
    if (r) {
        bool same = r->attempt == f->attempt;
        rest(&f->out, r->stdout ? r->stdout : "", same, r->stdout_truncated, f->err.f);
        rest(&f->err, r->stderr ? r->stderr : "", same, r->stderr_truncated, f->err.f);
    }
    if (!done)
        return;
    ci_buf_release(&f->out.text);
    ci_buf_release(&f->err.text);
    ci_chunk_order_release(&f->out.order);
    ci_chunk_order_release(&f->err.order);
    pthread_mutex_destroy(&f->lock);
    free(f);
}
