/* chunk_order.h - the chunks of one live output subject of one attempt
 * (contract §19), shown in Ci-Seq order whatever order they are stored in.
 *
 * A worker whose connection is cut mid-task may have what its old socket
 * still held stored after what its new connection sends: chunk 3 before
 * chunk 2. A chunk is shown only once the one before it was; one that comes
 * early is held (a copy) until its turn. A lost chunk is never sent later,
 * and nothing here can tell it from a late one: the chunks after it stay
 * held, within the limits, and the caller takes the rest from the result.
 * No NATS here: tested alone (test_chunk_order). */
#ifndef CI_CHUNK_ORDER_H
#define CI_CHUNK_ORDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

struct ci_chunk_held;

struct ci_chunk_order {
    uint64_t next_seq;          /* the Ci-Seq shown next */
    size_t shown_bytes;         /* bytes of the chunks shown */
    struct ci_chunk_held *held; /* early chunks, by Ci-Seq, all above next_seq */
    size_t n_held, cap_held;
    size_t held_bytes;
    size_t max_held;   /* chunks held at most */
    size_t max_bytes;  /* shown_bytes + held_bytes at most */
    ci_status stopped; /* CI_OK, or why nothing more is taken */
};

/* An order at Ci-Seq 1 that holds at most max_held chunks and takes at most
 * max_bytes in all (shown and held). */
void ci_chunk_order_init(struct ci_chunk_order *o, size_t max_held, size_t max_bytes);

/* Frees what is held. */
void ci_chunk_order_release(struct ci_chunk_order *o);

/* Starts over at Ci-Seq 1 (the task runs again: a new attempt), what was
 * held dropped, a stop forgotten. */
void ci_chunk_order_reset(struct ci_chunk_order *o);

/* Shows one chunk's bytes; a status other than CI_OK stops the order. */
typedef ci_status (*ci_chunk_show_fn)(void *closure, const uint8_t *data, size_t len);

/* Takes chunk seq of len bytes. The one expected next goes to show, then
 * every held one that follows it without a gap, in order. A later one is
 * held until its turn. One shown or held already (a duplicate), or seq 0
 * (no Ci-Seq), is dropped: CI_OK. A failure stops the order, what is held
 * dropped, and every later call returns the same status: CI_ERR_LIMIT when
 * the chunk would pass max_held or max_bytes, CI_ERR_NOMEM, or show's
 * status. */
ci_status ci_chunk_order_put(struct ci_chunk_order *o, uint64_t seq, const uint8_t *data,
                             size_t len, ci_chunk_show_fn show, void *closure);

#endif
