/* tools.h - the tool definitions an agent gets for `ci`: run_python,
 * get_result, cancel. One source for `ci mcp` and `ci tools`; run_python's
 * description is made from the runtime manifest (contract §18) when a worker
 * published one, else from the client's config, and promises nothing else. */
#ifndef CI_TOOLS_H
#define CI_TOOLS_H

#include <jansson.h>

#include "core/config.h"
#include "core/status.h"

struct ci_broker;

#define CI_TOOLS_RUNTIME "python-data-analysis-v1"

enum ci_tools_format {
    CI_TOOLS_MCP,       /* {"tools":[{name, description, inputSchema}]}, with `files` */
    CI_TOOLS_OPENAI,    /* [{"type":"function","function":{name, description, parameters}}] */
    CI_TOOLS_ANTHROPIC, /* [{name, description, input_schema}] */
};

/* "mcp", "openai", "anthropic"; false for anything else. */
bool ci_tools_format_parse(const char *s, enum ci_tools_format *ret);

/* The runtime's manifest, or NULL in *ret when there is none (no worker
 * published one, or b is NULL). An error only when reading it failed. */
ci_status ci_tools_manifest(struct ci_broker *b, json_t **ret, struct ci_error *err);

/* The definitions in format f; manifest may be NULL. NULL when out of memory. */
json_t *ci_tools_build(enum ci_tools_format f, const json_t *manifest,
                       const struct ci_config *cfg);

#endif
