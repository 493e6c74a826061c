/* fuzz_request.c - libFuzzer target for the request path of untrusted bytes:
 * ci_message_decode() (protobuf and JSON) and ci_request_validate().
 *
 * Besides "no crash, no leak, no UB", it checks on every input:
 * - a failure explains itself in printable ASCII (the text may reach an
 *   agent and the logs, so user bytes never appear raw);
 * - whatever decodes re-encodes, and the encoding decodes to the same message
 *   (protobuf bytes compared), in both encodings;
 * - JSON written from a decoded message is stable: encode, decode, encode
 *   gives the same text.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Isrc \
 *     -Ibuild/gen tests/fuzz/fuzz_request.c src/core/codec.c src/core/codec_json.c src/core/request.c \
 *     src/core/util.c src/core/status.c build/gen/ci/v1/ci.pb-c.c \
 *     -lprotobuf-c -ljansson -lcrypto -o fuzz_request
 *   ./fuzz_request -max_total_time=30 tests/fuzz/corpus/request */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ci/v1/executor.pb-c.h"
#include "core/codec.h"
#include "core/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_sentence(const struct ci_error *err)
{
    if (!err->msg[0])
        abort(); /* a failure without a reason */
    for (const char *c = err->msg; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c >= 0x7f)
            abort();
}

static uint8_t *pack(const ProtobufCMessage *m, size_t *len)
{
    uint8_t *buf = NULL;
    struct ci_error err;
    if (ci_message_encode(CI_ENC_PROTOBUF, m, &buf, len, &err))
        abort();
    return buf;
}

/* Encodes m as enc and decodes it back. same: the copy must equal m (not so
 * for protobuf input shown as JSON: unknown fields are dropped and repeated
 * map keys collapse to the last). */
static void roundtrip(enum ci_encoding enc, const ProtobufCMessage *m, bool same)
{
    struct ci_error err;
    uint8_t *buf = NULL;
    size_t n = 0;
    if (ci_message_encode(enc, m, &buf, &n, &err))
        abort();
    ProtobufCMessage *back = NULL;
    if (ci_message_decode(enc, m->descriptor, buf, n, &back, &err))
        abort(); /* our own output must decode */
    if (same) {
        size_t la, lb;
        uint8_t *a = pack(m, &la), *b = pack(back, &lb);
        if (la != lb || memcmp(a, b, la) != 0)
            abort();
        free(a);
        free(b);
    }
    if (enc == CI_ENC_JSON) {
        uint8_t *again = NULL;
        size_t n2 = 0;
        if (ci_message_encode(CI_ENC_JSON, back, &again, &n2, &err))
            abort();
        if (n2 != n || memcmp(again, buf, n) != 0 || again[n2] != '\0')
            abort();
        free(again);
    }
    ci_message_free(back);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct ci_config cfg;
    cfg.limits.default_timeout_ms = 60000;
    cfg.limits.max_timeout_ms = 60000;
    cfg.limits.default_memory_mb = 1024;
    cfg.limits.max_memory_mb = 4096;
    cfg.limits.max_code_bytes = 1024;
    cfg.limits.max_input_bytes = 4096;

    /* Requests from clients, results (read back by clients), and the
     * executor's answers, which the cloudrun provider decodes. */
    const ProtobufCMessageDescriptor *descs[] = {&ci__v1__execution_request__descriptor,
                                                 &ci__v1__execution_result__descriptor,
                                                 &ci__executor__v1__execute_response__descriptor};
    for (int enc = CI_ENC_PROTOBUF; enc <= CI_ENC_JSON; enc++) {
        for (size_t k = 0; k < sizeof(descs) / sizeof(descs[0]); k++) {
            struct ci_error err = {{0}};
            ProtobufCMessage *m = NULL;
            if (ci_message_decode(enc, descs[k], data, size, &m, &err)) {
                check_sentence(&err);
                if (m)
                    abort(); /* ret_ written on failure */
                continue;
            }
            roundtrip(CI_ENC_PROTOBUF, m, true);
            roundtrip(CI_ENC_JSON, m, enc == CI_ENC_JSON);
            if (k == 0) {
                uint32_t t = 0, mem = 0;
                ci_status s = ci_request_validate(&cfg, (const Ci__V1__ExecutionRequest *)m, &t,
                                                  &mem, &err);
                if (s)
                    check_sentence(&err);
                else if (t == 0 || t > 60000 || mem == 0 || mem > 4096)
                    abort();
            }
            ci_message_free(m);
        }
    }
    return 0;
}
