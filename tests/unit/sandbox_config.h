/* The limits and sandbox settings the sandbox's unit tests share (the
 * config a worker gets from its defaults, minus what each test sets). */
#ifndef CI_TEST_SANDBOX_CONFIG_H
#define CI_TEST_SANDBOX_CONFIG_H

#include "core/config.h"

static inline void sandbox_test_defaults(struct ci_config *c, enum ci_isolation isolation)
{
    c->worker.provider = "local";
    c->limits.default_timeout_ms = 60000;
    c->limits.max_timeout_ms = 60000;
    c->limits.default_memory_mb = 1024;
    c->limits.max_memory_mb = 4096;
    c->limits.max_code_bytes = 1 << 20;
    c->limits.max_input_bytes = 20 << 20;
    c->limits.max_artifact_bytes = 20 << 20;
    c->limits.max_output_bytes = 1 << 20;
    c->local.isolation = isolation;
    c->local.python = "/usr/bin/python3";
    c->local.sandbox_uid = 65534;
    c->local.sandbox_gid = 65534;
    c->local.workspace_mb = 256;
    c->local.tmp_mb = 64;
    c->local.max_processes = 64;
    c->local.max_open_files = 256;
    c->local.cpus = 1;
}

#endif
