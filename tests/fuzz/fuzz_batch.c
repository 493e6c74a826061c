/* fuzz_batch - libFuzzer target for what workers and `ci batch` read from
 * the batch's event stream, which any client allowed to publish there can
 * fill: the seal and the end events (src/core/batch.c), and a JSONL line of
 * a file given to `ci batch submit --jsonl` (src/cli/batch.c). The first byte picks the parser. What a
 * parser accepts must keep its promises: a seal's total encodes and reads
 * back the same, an end event names a valid task and a terminal status,
 * a JSONL request is a valid task of the batch. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/batch.h"
#include "core/request.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct ci_config *cfg;
    if (!cfg && ci_config_defaults(&cfg, NULL) != CI_OK)
        abort();
    if (size == 0)
        return 0;
    uint8_t pick = data[0] % 3;
    data++;
    size--;
    struct ci_error e = {{0}};
    if (pick == 0) {
        uint64_t total = 0;
        if (ci_batch_seal_total(data, size, &total, &e) != CI_OK)
            return 0;
        char *b = NULL;
        size_t n = 0;
        uint64_t again = 0;
        if (ci_batch_seal_body(total, &b, &n, &e) != CI_OK ||
            ci_batch_seal_total((const uint8_t *)b, n, &again, &e) != CI_OK || again != total)
            abort();
        free(b);
    } else if (pick == 1) {
        struct ci_batch_end end;
        if (ci_batch_end_parse(data, size, &end, &e) != CI_OK)
            return 0;
        if (!ci_task_id_valid(end.task_id) ||
            !ci_task_status_terminal(ci_batch_event_status(end.event)) ||
            strlen(end.error) >= sizeof(end.error))
            abort();
    } else {
        Ci__V1__ExecutionRequest *r = NULL;
        if (ci_batch_jsonl_request(cfg, "fuzz", 7, data, size, &r, &e) != CI_OK)
            return 0;
        if (!ci_task_id_valid(r->task_id) || strcmp(r->batch_id, "fuzz") != 0 ||
            r->session_id[0] || ci_request_validate(cfg, r, NULL, NULL, NULL) != CI_OK)
            abort();
        ci_message_free(&r->base);
    }
    return 0;
}
