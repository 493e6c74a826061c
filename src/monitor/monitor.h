/* monitor.h - the worker's HTTP endpoint for operators (libmicrohttpd, one
 * internal thread polling every connection):
 *
 *   GET /metrics   the metrics of metrics.h, Prometheus text format 0.0.4
 *   GET /healthz   200 while the process works (its live callback says so),
 *                  else 503: for a liveness probe
 *   GET /readyz    200 when the worker can take tasks (connected to NATS,
 *                  every slot bound to the consumer, sandbox probe passed),
 *                  else 503 with the reason: for a readiness probe
 *
 * Anything else is 404 (405 for a method other than GET or HEAD). Bodies
 * are never read. It serves only a few small answers, so connections are
 * bounded (16) and an idle one is closed after 10 s: a slow client cannot
 * hold the worker's resources. Only main() uses this module. */
#ifndef CI_MONITOR_H
#define CI_MONITOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "monitor/metrics.h"
#include "core/status.h"

struct ci_monitor;

/* Says whether the worker is live (or ready); if not, one sentence why in
 * why (size why_size). Called on the monitor's thread. */
typedef bool (*ci_monitor_check_fn)(void *closure, char *why, size_t why_size);

struct ci_monitor_options {
    const char *addr;           /* "IPv4:port" or "[IPv6]:port"; port 0 = any free one */
    bool any_port_if_taken;     /* addr's port in use: any free port of its host instead */
    struct ci_metrics *metrics; /* rendered by /metrics; must outlive the monitor */
    ci_monitor_check_fn live;   /* NULL = always live */
    ci_monitor_check_fn ready;  /* NULL = always ready */
    void *closure;
};

/* Binds addr and starts serving on a thread of its own. CI_ERR_INVALID for
 * an address that is not numeric host:port, CI_ERR_SYS when it cannot be
 * bound (in use, not local). */
ci_status ci_monitor_start(const struct ci_monitor_options *o, struct ci_monitor **ret,
                           struct ci_error *err);
/* The address it listens on, with the real port ("127.0.0.1:41234"). */
const char *ci_monitor_address(const struct ci_monitor *m);
/* Stops serving, closes every connection and frees m. Accepts NULL. */
void ci_monitor_stop(struct ci_monitor *m);

#endif
