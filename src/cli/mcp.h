/* mcp.h - `ci mcp`: a Model Context Protocol server on stdin/stdout
 * (JSON-RPC 2.0, one message per line) whose tools (tools.h) run Python
 * on the workers. Only protocol goes to stdout; logs go to stderr. */
#ifndef CI_MCP_H
#define CI_MCP_H

#include <stdint.h>

#include "core/config.h"

struct ci_broker;

struct ci_mcp_opts {
    int64_t wait_ms;      /* how long run_python and get_result wait for a task to end */
    const char *save_dir; /* where CSV/PNG artifacts are saved; NULL = $TMPDIR/ci-mcp-UID */
};

/* Serves until stdin ends; returns the process exit code. b may be NULL (NATS
 * was down at start): each tool call then tries to connect again. Takes
 * ownership of b. */
int ci_mcp_serve(struct ci_broker *b, const struct ci_config *cfg, const struct ci_mcp_opts *o);

#endif
