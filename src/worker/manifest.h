/* manifest.h - the runtime manifest of docs/contract.md §18: what a
 * worker's runtime offers (Python and package versions, limits, network,
 * sessions, isolation), as the JSON the worker writes into
 * jetstream.runtimes_bucket at start and with every heartbeat.
 *
 * The versions come from the runtime's own Python, run once at start
 * outside the sandbox with a fixed script of ours (no task's code), never
 * from a list written by hand. Building the JSON needs no NATS. */
#ifndef CI_MANIFEST_H
#define CI_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "core/status.h"

#define CI_MANIFEST_MAX_PACKAGES 16
#define CI_MANIFEST_VERSION_MAX 64 /* a version string, with its NUL */

struct ci_manifest_package {
    char name[CI_MANIFEST_VERSION_MAX];
    char version[CI_MANIFEST_VERSION_MAX];
};

/* What the runtime's Python said about itself. */
struct ci_manifest_versions {
    bool known;                /* python and packages hold what it said */
    char python[CI_MANIFEST_VERSION_MAX]; /* "3.11.2" */
    struct ci_manifest_package packages[CI_MANIFEST_MAX_PACKAGES];
    size_t n_packages;         /* the shipped packages it found installed */
    bool pip;                  /* the pip module is there (useless without network) */
    char unknown[256];         /* when !known: why, one sentence */
};

/* Runs `python -I -B -c <our script>` (its own environment and process
 * group, stdin /dev/null, 2 GiB of address space, no files written) and
 * reads the versions from its output (at most 64 KiB), killing it after
 * timeout_ms, and whatever it started when it exits. Never fails: when the versions cannot be
 * read, ret->known is false and ret->unknown says why. */
void ci_manifest_read_versions(const char *python, int timeout_ms,
                               struct ci_manifest_versions *ret);
/* Reads the script's JSON output ({"python":"3.11.2","packages":{...}});
 * CI_ERR_INVALID with a reason for anything else (a version must be 1 to
 * 63 of A-Z a-z 0-9 . + - _ !). Exposed for tests. */
ci_status ci_manifest_parse_versions(const char *json, size_t len,
                                     struct ci_manifest_versions *ret, struct ci_error *err);

/* Everything the manifest says; the strings are borrowed. */
struct ci_manifest {
    const struct ci_config *cfg; /* limits, sessions */
    const char *runtime;         /* "python-data-analysis-v1" */
    const char *provider;        /* "local", "cloudrun" */
    bool sessions;               /* the provider runs session steps */
    const char *isolation;       /* "" when not known before a task ran */
    const char *worker;
    const char *version;         /* the worker's */
    int64_t at_ms;
    const struct ci_manifest_versions *versions;
};

/* The manifest's JSON, malloc'd and NUL-terminated. */
ci_status ci_manifest_encode(const struct ci_manifest *m, char **ret_json, size_t *ret_len,
                             struct ci_error *err);

#endif
