/* service.h - what the executor serves, on top of httpd.c:
 *
 *   POST /execute          a ci.v1.ExecutionRequest (protobuf or JSON by
 *                          Content-Type, inputs inline only) is run in the
 *                          local sandbox; the answer is a
 *                          ci.executor.v1.ExecuteResponse in the same
 *                          encoding: the result and the artifacts' bytes.
 *   POST /cancel/{taskId}  kills the run of that task (200), or remembers the
 *                          id for two minutes so that a request for it that
 *                          arrives late never runs (404).
 *   GET  /healthz          200 with counters as JSON ("status": "ok"); 503
 *                          with "status": "unhealthy" once a bare task left
 *                          a process the sweep could not remove.
 *
 * With an auth (auth.h), every route but /healthz first needs a valid ID
 * token: 401 with WWW-Authenticate and a short reason otherwise, decided
 * from the headers before the body is read (ci_service_authorize).
 *
 * A bad request is a 4xx with {"error": "..."}: 400 malformed or against the
 * contract, 413 over a size limit, 415 unknown Content-Type, 409 the task
 * already runs here, 429 every slot is busy. 409, 429 and 503 (draining)
 * carry "Ci-Not-Run: 1": the code did not start. A failure after the code
 * started (the instance stopped it, no memory for the answer) is a 500,
 * which a worker never sends again. A run whose client went away (the
 * connection closed) is cancelled. Logs carry task ids, sizes,
 * statuses and durations only: never code, output, files or tokens. */
#ifndef CI_SERVICE_H
#define CI_SERVICE_H

#include <stddef.h>
#include <stdint.h>

#include "core/config.h"
#include "executor/auth.h"
#include "executor/httpd.h"
#include "provider/provider.h"
#include "core/status.h"

struct ci_service;

struct ci_service_options {
    const struct ci_config *cfg;  /* limits.*; borrowed */
    struct ci_provider *provider; /* runs the tasks (local); borrowed */
    uint32_t max_running;         /* tasks at once; more get 429 */
    const char *instance_id;      /* ExecutionResult.worker */
    struct ci_auth *auth;         /* callers' ID tokens; NULL = no check; borrowed */
    /* Tasks run without namespaces (local.isolation: none): max_running
     * must be 1, and every process a task left is killed (sweep.h) once
     * its own process has been reaped, before its artifacts are read and
     * before the next task may start. */
    bool bare;
};

ci_status ci_service_new(const struct ci_service_options *o, struct ci_service **ret,
                         struct ci_error *err);
/* No request may be in progress. Accepts NULL. */
void ci_service_free(struct ci_service *s);

/* The httpd handler and body limit; ctx is the service. */
void ci_service_handle(void *ctx, const struct ci_httpd_request *req,
                       struct ci_httpd_response *resp);
size_t ci_service_body_limit(void *ctx, const char *method, const char *path,
                             const char *content_type);
bool ci_service_authorize(void *ctx, const char *method, const char *path,
                          const char *authorization, bool *ret_trusted,
                          struct ci_httpd_response *resp);
void ci_service_edge_reject(void *ctx, const char *method, const char *path, unsigned status);

/* From now on /execute answers 503 with Ci-Not-Run (the instance is
 * stopping; a worker tries again elsewhere); running tasks go on. */
void ci_service_drain(struct ci_service *s);
/* Whether a bare task left something the sweep could not remove: /execute
 * answers 503 with Ci-Not-Run and /healthz 503 from then on; the caller
 * should stop the instance. */
bool ci_service_unhealthy(struct ci_service *s);
/* Tasks running now. */
uint32_t ci_service_running(struct ci_service *s);
/* Cancels every running task (shutdown after the drain time); their
 * requests are answered 500: the code ran, so no worker sends it again. */
void ci_service_cancel_all(struct ci_service *s);

#endif
