/* follow.h - `ci run` and `ci watch --output` showing a task's output as it
 * is written (contract §19), then what the result has beyond it.
 *
 * Each stream's chunks are shown in Ci-Seq order, of the latest attempt: a
 * chunk stored early (a worker's reconnect) waits for the ones before it
 * (chunk_order.h), a chunk of an earlier attempt stored late is not shown.
 * The live chunks are a preview: the result is what counts. At the end the
 * follower prints what the result keeps past what it printed, if what it
 * printed is the start of it: a chunk lost, or not stored yet, is printed
 * from the result, with what followed it, so the bytes are the result's. It
 * does not wait for late chunks: the result holds every byte they carry.
 * When what was printed is not the start of the result (the task ran again
 * after output was shown), it says so and prints the result's text whole. */
#ifndef CI_FOLLOW_H
#define CI_FOLLOW_H

#include <stdio.h>

#include "core/codec.h"
#include "core/status.h"

struct ci_broker;
struct ci_follow;

/* Starts showing the task's stdout on out and its stderr on err. Never
 * fails the caller: without live output (no stream, an older worker, an
 * error) *ret is a follower that shows everything at the end. NULL only
 * when out of memory. */
struct ci_follow *ci_follow_start(struct ci_broker *b, const char *task_id, FILE *out,
                                  FILE *err);

/* Stops following and prints what r's stdout and stderr hold beyond what
 * was shown (all of it when nothing was). r may be NULL: nothing more is
 * printed. Frees f; NULL is fine. */
void ci_follow_finish(struct ci_follow *f, const Ci__V1__ExecutionResult *r);

#endif
