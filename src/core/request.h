/* request.h - the rules of docs/contract.md for an ExecutionRequest: ids, names,
 * sizes, limits, policy. Each failure is one sentence an agent can act on. */
#ifndef CI_REQUEST_H
#define CI_REQUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ci/v1/ci.pb-c.h"
#include "core/config.h"
#include "core/status.h"

#define CI_DEFAULT_RUNTIME "python-data-analysis-v1"

/* [A-Za-z0-9_-]{1,64} */
bool ci_task_id_valid(const char *id);
/* [A-Za-z0-9._ -]{1,128}, not starting with '.'; len is the byte length so
 * that embedded NULs are caught. */
bool ci_input_name_valid(const char *name, size_t len);
/* Why name is not a valid input name ("use a plain file name, not a
 * path", ...; a reason naming a character is written into buf), or NULL
 * when it is. */
const char *ci_input_name_problem(const char *name, size_t len, char *buf, size_t bufsz);

/* Whether req's labels keep the rules (at most 64; keys 1 to 256 bytes;
 * values at most 1 KiB): only then are they echoed in its result. */
bool ci_request_labels_ok(const Ci__V1__ExecutionRequest *req);

/* Checks req against the contract and the limits in cfg. Input files that
 * name an object are checked by name only; their size is checked once
 * fetched. On success fills the effective limits. */
ci_status ci_request_validate(const struct ci_config *cfg, const Ci__V1__ExecutionRequest *req,
                              uint32_t *ret_timeout_ms, uint32_t *ret_memory_mb,
                              struct ci_error *err);

#endif
