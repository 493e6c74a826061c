/* runtime_stub.c - MERGE: DROP THIS FILE (and its line in CMakeLists.txt).
 *
 * A stand-in for ci_broker_runtime_get() (broker.h, contract §18), which is
 * built on another branch. Weak, so that the real one in broker.c wins the
 * moment it exists; until then no manifest is ever found, and `ci tools` and
 * `ci mcp` describe the tool from the client's config. */
#include "nats/broker.h"

__attribute__((weak)) ci_status ci_broker_runtime_get(struct ci_broker *b, const char *runtime,
                                                      uint8_t **ret_data, size_t *ret_len,
                                                      struct ci_error *err)
{
    (void)b;
    (void)ret_data;
    (void)ret_len;
    return ci_error_set(err, CI_ERR_NOT_FOUND, "no manifest of runtime '%s' (not built yet)",
                        runtime);
}
