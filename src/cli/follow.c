/* follow.c - a task's output as it is written, then the rest (follow.h). */
#include "cli/follow.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/client.h"
#include "core/util.h"
#include "nats/broker.h"

/* What was shown of one stream of the attempt being shown. */
struct shown {
    FILE *f;
    struct ci_buf text; /* every byte shown, to compare with the result */
    uint64_t next_seq;  /* the Ci-Seq expected next */
    bool broken;        /* a gap or a failed copy: nothing more is shown live */
};

struct ci_follow {
    pthread_mutex_t lock;
    struct ci_output_follow *sub; /* NULL: no live output */
    uint32_t attempt;             /* the attempt being shown; 0 before any chunk */
    bool closed;                  /* finish() began: chunks are ignored */
    struct shown out, err;
};

static void on_chunk(void *closure, const char *stream, uint32_t attempt, uint64_t seq,
                     const uint8_t *data, size_t len)
{
    struct ci_follow *f = closure;
    pthread_mutex_lock(&f->lock);
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
            both[i]->next_seq = 1;
            both[i]->broken = false;
        }
    }
    struct shown *s = strcmp(stream, "stdout") == 0 ? &f->out : &f->err;
    if (s->broken)
        goto out;
    if (seq != s->next_seq || ci_buf_append(&s->text, data, len)) {
        s->broken = true; /* the rest comes from the result */
        goto out;
    }
    s->next_seq++;
    ci_client_put_text(s->f, (const char *)data, len);
    fflush(s->f);
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
    f->out = (struct shown){.f = out, .text = CI_BUF_INIT, .next_seq = 1};
    f->err = (struct shown){.f = err, .text = CI_BUF_INIT, .next_seq = 1};
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
        fprintf(note, "\nci: the output shown so far is not the result's (a chunk was lost, or "
                      "the task ran again); the result's follows\n");
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
    ci_output_follow_free(f->sub); /* on_chunk is done for good */
    if (r) {
        bool same = r->attempt == f->attempt;
        rest(&f->out, r->stdout ? r->stdout : "", same, r->stdout_truncated, f->err.f);
        rest(&f->err, r->stderr ? r->stderr : "", same, r->stderr_truncated, f->err.f);
    }
    ci_buf_release(&f->out.text);
    ci_buf_release(&f->err.text);
    pthread_mutex_destroy(&f->lock);
    free(f);
}
