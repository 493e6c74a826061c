/* fuzz_objmeta - libFuzzer target for ci_objmeta_from_json, the parser of
 * object metadata that any client of the bucket may write. Whatever it
 * accepts must encode again and decode to the same fields. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nats/objstore.h"

static int same(const char *a, const char *b)
{
    if (!a || !b)
        return a == b || (!a && b && !b[0]) || (!b && a && !a[0]);
    return strcmp(a, b) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ci_objmeta m;
    struct ci_error err;
    if (ci_objmeta_from_json((const char *)data, size, &m, &err) != CI_OK)
        return 0;
    char *json = NULL;
    if (ci_objmeta_to_json(&m, &json, &err) == CI_OK) {
        struct ci_objmeta back;
        if (ci_objmeta_from_json(json, strlen(json), &back, &err) != CI_OK)
            abort();
        if (!same(m.name, back.name) || !same(m.bucket, back.bucket) ||
            !same(m.nuid, back.nuid) || !same(m.mtime, back.mtime) ||
            !same(m.digest, back.digest) || m.size != back.size || m.chunks != back.chunks ||
            m.max_chunk_size != back.max_chunk_size || m.deleted != back.deleted)
            abort();
        ci_objmeta_release(&back);
        free(json);
    }
    ci_objmeta_release(&m);
    return 0;
}
