/* codec.h - the wire encodings of the contract: protobuf (protobuf-c) and the
 * proto3 canonical JSON mapping (jansson), driven by the generated
 * descriptors so that every message of schemas/ci/v1/ci.proto works the same.
 *
 * Messages returned by the decoders are freed with ci_message_free(),
 * whichever encoding they came from. */
#ifndef CI_CODEC_H
#define CI_CODEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ci/v1/ci.pb-c.h"
#include "core/status.h"

enum ci_encoding {
    CI_ENC_PROTOBUF,
    CI_ENC_JSON,
};

/* NULL, "" and "application/protobuf" (also "application/x-protobuf") give
 * protobuf, "application/json" gives JSON; parameters after ';' and case are
 * ignored. Anything else is CI_ERR_INVALID with err naming the type. */
ci_status ci_encoding_from_content_type(const char *content_type, enum ci_encoding *ret,
                                        struct ci_error *err);
const char *ci_encoding_content_type(enum ci_encoding enc);

/* Encodes msg; *ret is malloc'd (NUL-terminated for JSON). */
ci_status ci_message_encode(enum ci_encoding enc, const ProtobufCMessage *msg, uint8_t **ret,
                            size_t *ret_len, struct ci_error *err);

/* Decodes data as a message of type desc. Unknown JSON fields, wrong JSON
 * types, bad base64, out-of-range numbers and invalid UTF-8 in strings are
 * CI_ERR_INVALID with err saying which field. */
ci_status ci_message_decode(enum ci_encoding enc, const ProtobufCMessageDescriptor *desc,
                            const uint8_t *data, size_t len, ProtobufCMessage **ret,
                            struct ci_error *err);

void ci_message_free(ProtobufCMessage *msg);

/* Names of TaskStatus values: "TASK_STATUS_SUCCEEDED" and the lower-case
 * short form used in the Ci-Status header ("succeeded"). */
const char *ci_task_status_name(Ci__V1__TaskStatus s);
const char *ci_task_status_short(Ci__V1__TaskStatus s);
bool ci_task_status_terminal(Ci__V1__TaskStatus s);

#endif
