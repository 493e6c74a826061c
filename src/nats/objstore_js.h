/* objstore_js.h - opening an object store on a nats.c JetStream context.
 * For the NATS glue (broker.c) and tools that hold their own connection
 * (tests/tools/objtool.c); everything else gets its bucket from the broker
 * and never sees nats.h. */
#ifndef CI_OBJSTORE_JS_H
#define CI_OBJSTORE_JS_H

#include <nats/nats.h>

#include "nats/objstore.h"

/* Binds to the bucket; with create, first creates or updates its stream
 * idempotently (many workers may do this at once). */
ci_status ci_objstore_open(jsCtx *js, const struct ci_objstore_opts *opts, bool create,
                           struct ci_objstore **ret, struct ci_error *err);

#endif
