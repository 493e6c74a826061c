/* natsutil.h - private to src/nats: what the NATS glue modules share about
 * nats.c itself. One mapping of a nats.c failure to ci_status and a
 * sentence, and cleanup attributes for nats.c's types. Nothing outside
 * src/nats includes this (or nats.h). */
#ifndef CI_NATSUTIL_H
#define CI_NATSUTIL_H

#include <nats/nats.h>
#include <stdbool.h>

#include "core/status.h"
#include "core/util.h"

/* Records "<what>: <nats.c's text>[: <its last error>][ (JetStream error N)]"
 * and maps the status: a full store (the server's, or a stream's byte
 * limit) is CI_ERR_FULL, NATS_TIMEOUT is CI_ERR_TIMEOUT, NATS_NO_MEMORY
 * CI_ERR_NOMEM, anything else CI_ERR_NATS. err may be NULL. */
ci_status ci_nats_fail(struct ci_error *err, natsStatus ns, jsErrCode jerr, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Whether a failure means one of our streams (or buckets) is gone, e.g.
 * deleted by an operator: the server says the stream is not found, or
 * nobody answers on its subjects. */
static inline bool ci_nats_gone(natsStatus ns, jsErrCode jerr)
{
    return ns == NATS_NO_RESPONDERS || jerr == JSStreamNotFoundErr;
}

CI_DEFINE_CLEANUP(natsMsg, natsMsg_Destroy)
CI_DEFINE_CLEANUP(natsInbox, natsInbox_Destroy)
CI_DEFINE_CLEANUP(natsOptions, natsOptions_Destroy)
CI_DEFINE_CLEANUP(natsConnection, natsConnection_Destroy)
CI_DEFINE_CLEANUP(jsCtx, jsCtx_Destroy)
CI_DEFINE_CLEANUP(jsPubAck, jsPubAck_Destroy)
CI_DEFINE_CLEANUP(jsStreamInfo, jsStreamInfo_Destroy)
CI_DEFINE_CLEANUP(jsConsumerInfo, jsConsumerInfo_Destroy)
CI_DEFINE_CLEANUP(jsMsgMetaData, jsMsgMetaData_Destroy)
CI_DEFINE_CLEANUP(kvStore, kvStore_Destroy)
CI_DEFINE_CLEANUP(kvEntry, kvEntry_Destroy)

/* No cleanup for natsSubscription on purpose: one that may still get a
 * message on an open connection must not simply be destroyed (nats.c
 * 3.4.1's read loop may hold it: broker.c, release_sub). */

/* natsMsgList and kvKeysList live on the stack: their destructors take the
 * struct itself. */
static inline void natsMsgList_Destroyp(natsMsgList *l) { natsMsgList_Destroy(l); }
static inline void kvKeysList_Destroyp(kvKeysList *l) { kvKeysList_Destroy(l); }

#endif
