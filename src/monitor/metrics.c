/* metrics.c - the worker's counters, gauges and histograms as atomics, and
 * their rendering in the Prometheus text format (metrics.h). */
#include "monitor/metrics.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upper bounds (seconds) of the histogram buckets; +Inf is implicit. Run
 * times span a 50 ms print to the 1 h cap; queue waits span an idle queue
 * (milliseconds) to a backlog that waits for its max age. */
static const double run_bounds[] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600};
static const double wait_bounds[] = {0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
                                     10,    30,   60,   300, 1800};
#define MAX_BOUNDS 16

struct histogram {
    const char *name;
    const char *help;
    const double *bounds;
    size_t n_bounds;
    atomic_uint_fast64_t buckets[MAX_BOUNDS + 1]; /* not cumulative; last = above every bound */
    atomic_uint_fast64_t count;
    atomic_uint_fast64_t sum_us; /* microseconds: an integer that atomics can add */
};

static const char *const status_names[] = {"succeeded", "failed", "timed_out", "cancelled",
                                           "other"};
#define N_STATUS (sizeof(status_names) / sizeof(status_names[0]))
static const char *const outcome_names[] = {"done",       "duplicate", "dropped", "retry",
                                            "superseded", "stale"};
static const char *const direction_names[] = {"download", "upload"};
static const char *const lane_names[] = {"interactive", "batch"};

_Static_assert(sizeof(outcome_names) / sizeof(outcome_names[0]) == CI_METRICS_N_OUTCOMES,
               "one name per outcome");
_Static_assert(sizeof(direction_names) / sizeof(direction_names[0]) == CI_METRICS_N_DIRECTIONS,
               "one name per direction");
_Static_assert(sizeof(lane_names) / sizeof(lane_names[0]) == CI_METRICS_N_LANES,
               "one name per lane");
_Static_assert(sizeof(run_bounds) / sizeof(run_bounds[0]) <= MAX_BOUNDS, "run buckets");
_Static_assert(sizeof(wait_bounds) / sizeof(wait_bounds[0]) <= MAX_BOUNDS, "wait buckets");

struct ci_metrics {
    char *provider;
    uint64_t slots;
    atomic_uint_fast64_t tasks[N_STATUS];
    atomic_uint_fast64_t deliveries[CI_METRICS_N_OUTCOMES];
    atomic_uint_fast64_t lane_takes[CI_METRICS_N_LANES];
    atomic_int_fast64_t slots_active;
    atomic_uint_fast64_t objstore_bytes[CI_METRICS_N_DIRECTIONS];
    atomic_uint_fast64_t output_chunks[2]; /* published, dropped */
    struct histogram run;
    struct histogram wait;
    ci_metrics_collect_fn collect;
    void *collect_closure;
};

static void histogram_init(struct histogram *h, const char *name, const char *help,
                           const double *bounds, size_t n)
{
    h->name = name;
    h->help = help;
    h->bounds = bounds;
    h->n_bounds = n;
}

ci_status ci_metrics_new(const char *provider, size_t slots, struct ci_metrics **ret,
                         struct ci_error *err)
{
    struct ci_metrics *m = calloc(1, sizeof(*m));
    char *p = strdup(provider ? provider : "");
    if (!m || !p) {
        free(m);
        free(p);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory for the metrics");
    }
    m->provider = p;
    m->slots = slots;
    histogram_init(&m->run, "ci_task_run_seconds",
                   "Seconds from taking a task's message to storing its terminal result.",
                   run_bounds, sizeof(run_bounds) / sizeof(run_bounds[0]));
    histogram_init(&m->wait, "ci_task_queue_wait_seconds",
                   "Seconds a task's message waited in the stream before a worker took it "
                   "(from its JetStream timestamp; a redelivery counts from the first publish).",
                   wait_bounds, sizeof(wait_bounds) / sizeof(wait_bounds[0]));
    *ret = m;
    return CI_OK;
}

void ci_metrics_free(struct ci_metrics *m)
{
    if (!m)
        return;
    free(m->provider);
    free(m);
}

void ci_metrics_set_collector(struct ci_metrics *m, ci_metrics_collect_fn fn, void *closure)
{
    if (!m)
        return;
    m->collect = fn;
    m->collect_closure = closure;
}

static void observe(struct histogram *h, double s)
{
    if (!(s > 0)) /* negative, zero or NaN */
        s = 0;
    size_t i = 0;
    while (i < h->n_bounds && s > h->bounds[i])
        i++;
    atomic_fetch_add(&h->buckets[i], 1);
    atomic_fetch_add(&h->count, 1);
    /* Capped so that one absurd value cannot wrap the sum. */
    double us = s * 1e6;
    atomic_fetch_add(&h->sum_us, us < 1e15 ? (uint64_t)us : (uint64_t)1e15);
}

void ci_metrics_task_end(struct ci_metrics *m, const char *status_short, double run_s)
{
    if (!m)
        return;
    size_t i = 0;
    while (i < N_STATUS - 1 && (!status_short || strcmp(status_short, status_names[i]) != 0))
        i++;
    atomic_fetch_add(&m->tasks[i], 1);
    observe(&m->run, run_s);
}

void ci_metrics_queue_wait(struct ci_metrics *m, double wait_s)
{
    if (m)
        observe(&m->wait, wait_s);
}

void ci_metrics_lane_take(struct ci_metrics *m, enum ci_metrics_lane lane)
{
    if (m && lane >= 0 && lane < CI_METRICS_N_LANES)
        atomic_fetch_add(&m->lane_takes[lane], 1);
}

void ci_metrics_delivery(struct ci_metrics *m, enum ci_metrics_outcome outcome)
{
    if (m && outcome >= 0 && outcome < CI_METRICS_N_OUTCOMES)
        atomic_fetch_add(&m->deliveries[outcome], 1);
}

void ci_metrics_slot_busy(struct ci_metrics *m, bool busy)
{
    if (m)
        atomic_fetch_add(&m->slots_active, busy ? 1 : -1);
}

void ci_metrics_objstore_bytes(struct ci_metrics *m, enum ci_metrics_direction d, uint64_t n)
{
    if (m && d >= 0 && d < CI_METRICS_N_DIRECTIONS)
        atomic_fetch_add(&m->objstore_bytes[d], n);
}

void ci_metrics_output_chunks(struct ci_metrics *m, uint64_t published, uint64_t dropped)
{
    if (!m)
        return;
    atomic_fetch_add(&m->output_chunks[0], published);
    atomic_fetch_add(&m->output_chunks[1], dropped);
}

/* ---- rendering -------------------------------------------------------- */

/* A label value as the format wants it: backslash, quote and newline
 * escaped. The provider name comes from the config, which allows little,
 * but the escaping costs nothing. */
static ci_status label_value(struct ci_buf *b, const char *v)
{
    for (const char *p = v; *p; p++) {
        ci_status s = *p == '\\'  ? ci_buf_append(b, "\\\\", 2)
                      : *p == '"' ? ci_buf_append(b, "\\\"", 2)
                      : *p == '\n' ? ci_buf_append(b, "\\n", 2)
                                   : ci_buf_append(b, p, 1);
        if (s)
            return s;
    }
    return CI_OK;
}

static ci_status header(struct ci_buf *b, const char *name, const char *type, const char *help)
{
    return ci_buf_appendf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A bound as Prometheus writes it: the shortest form that reads back the
 * same ("0.005", "1", "300"). */
static void format_bound(char *out, size_t n, double v)
{
    if (v >= 1 && v < 1e15 && (double)(int64_t)v == v) {
        snprintf(out, n, "%" PRId64, (int64_t)v); /* "10", not "1e+01" */
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, v);
        if (strtod(out, NULL) == v)
            return;
    }
}

static ci_status render_histogram(struct ci_buf *b, struct histogram *h)
{
    ci_status s = header(b, h->name, "histogram", h->help);
    /* Read the buckets first and derive count from them, so that a scrape
     * racing with an observation stays consistent (+Inf == count). */
    uint64_t cum = 0;
    for (size_t i = 0; i <= h->n_bounds && !s; i++) {
        cum += atomic_load(&h->buckets[i]);
        char le[32] = "+Inf";
        if (i < h->n_bounds)
            format_bound(le, sizeof(le), h->bounds[i]);
        s = ci_buf_appendf(b, "%s_bucket{le=\"%s\"} %" PRIu64 "\n", h->name, le, cum);
    }
    uint64_t sum_us = atomic_load(&h->sum_us);
    if (!s)
        s = ci_buf_appendf(b, "%s_sum %" PRIu64 ".%06" PRIu64 "\n%s_count %" PRIu64 "\n", h->name,
                           sum_us / 1000000, sum_us % 1000000, h->name, cum);
    return s;
}

ci_status ci_metrics_render(struct ci_metrics *m, struct ci_buf *b)
{
    if (!m || !b)
        return CI_ERR_INVALID;
    struct ci_metrics_live live = {0};
    if (m->collect)
        m->collect(m->collect_closure, &live);
    ci_status s = header(b, "ci_tasks_total", "counter",
                         "Tasks this worker ended, by terminal status and provider.");
    for (size_t i = 0; i < N_STATUS && !s; i++) {
        s = ci_buf_appendf(b, "ci_tasks_total{status=\"%s\",provider=\"", status_names[i]);
        if (!s)
            s = label_value(b, m->provider);
        if (!s)
            s = ci_buf_appendf(b, "\"} %" PRIu64 "\n", (uint64_t)atomic_load(&m->tasks[i]));
    }
    if (!s)
        s = header(b, "ci_task_deliveries_total", "counter",
                   "Messages taken from the work queue, by how they were disposed of: done "
                   "(terminal result, acked), duplicate (had a result already), dropped (no "
                   "valid task id), retry (nak'ed after an infrastructure failure), "
                   "superseded (a later attempt took the task over: this result dropped), "
                   "stale (waited in the worker past half the ack wait: left for "
                   "redelivery).");
    for (size_t i = 0; i < CI_METRICS_N_OUTCOMES && !s; i++)
        s = ci_buf_appendf(b, "ci_task_deliveries_total{outcome=\"%s\"} %" PRIu64 "\n",
                           outcome_names[i], (uint64_t)atomic_load(&m->deliveries[i]));
    if (!s)
        s = header(b, "ci_lane_tasks_total", "counter",
                   "Messages taken from each lane: interactive (the tasks stream), batch (the "
                   "batch stream, served after the interactive one).");
    for (size_t i = 0; i < CI_METRICS_N_LANES && !s; i++)
        s = ci_buf_appendf(b, "ci_lane_tasks_total{lane=\"%s\"} %" PRIu64 "\n", lane_names[i],
                           (uint64_t)atomic_load(&m->lane_takes[i]));
    if (!s)
        s = render_histogram(b, &m->run);
    if (!s)
        s = render_histogram(b, &m->wait);

    int64_t active = atomic_load(&m->slots_active);
    if (active < 0)
        active = 0;
    int64_t free_slots = (int64_t)m->slots - active;
    if (free_slots < 0)
        free_slots = 0;
    if (!s)
        s = header(b, "ci_slots_active", "gauge", "Task slots running a task now.");
    if (!s)
        s = ci_buf_appendf(b, "ci_slots_active %" PRId64 "\n", active);
    if (!s)
        s = header(b, "ci_slots_free", "gauge", "Task slots waiting for a task now.");
    if (!s)
        s = ci_buf_appendf(b, "ci_slots_free %" PRId64 "\n", free_slots);
    if (!s)
        s = header(b, "ci_warm_pool_size", "gauge",
                   "Sandboxes prepared ahead and ready to take a task (0 without a warm pool).");
    if (!s)
        s = ci_buf_appendf(b, "ci_warm_pool_size %" PRId64 "\n",
                           live.warm_pool_size > 0 ? live.warm_pool_size : 0);
    if (!s)
        s = header(b, "ci_warm_deaths_total", "counter",
                   "Warm runtimes (zygotes) that died without being retired; each is replaced.");
    if (!s)
        s = ci_buf_appendf(b, "ci_warm_deaths_total %" PRIu64 "\n", live.warm_deaths);
    if (!s)
        s = header(b, "ci_warm_fallbacks_total", "counter",
                   "Tasks that ran cold although the worker runs warm: no zygote could take them.");
    if (!s)
        s = ci_buf_appendf(b, "ci_warm_fallbacks_total %" PRIu64 "\n", live.warm_fallbacks);
    if (!s)
        s = header(b, "ci_session_tasks_waiting", "gauge",
                   "Session tasks held apart from the slots until their turn comes.");
    if (!s)
        s = ci_buf_appendf(b, "ci_session_tasks_waiting %" PRIu64 "\n",
                           live.session_tasks_waiting);
    if (!s)
        s = header(b, "ci_nats_connected", "gauge", "1 while the NATS connection is up.");
    if (!s)
        s = ci_buf_appendf(b, "ci_nats_connected %d\n", live.nats_connected ? 1 : 0);
    if (!s)
        s = header(b, "ci_nats_reconnects_total", "counter",
                   "Times the NATS connection was re-established since the worker started.");
    if (!s)
        s = ci_buf_appendf(b, "ci_nats_reconnects_total %" PRIu64 "\n", live.nats_reconnects);
    if (!s)
        s = header(b, "ci_objstore_bytes_total", "counter",
                   "Bytes moved through the files bucket: input objects downloaded, artifacts "
                   "uploaded.");
    for (size_t i = 0; i < CI_METRICS_N_DIRECTIONS && !s; i++)
        s = ci_buf_appendf(b, "ci_objstore_bytes_total{direction=\"%s\"} %" PRIu64 "\n",
                           direction_names[i], (uint64_t)atomic_load(&m->objstore_bytes[i]));
    if (!s)
        s = header(b, "ci_output_chunks_total", "counter",
                   "Chunks of live output (contract section 19): published, or dropped because "
                   "NATS did not take them.");
    if (!s)
        s = ci_buf_appendf(b,
                           "ci_output_chunks_total{outcome=\"published\"} %" PRIu64 "\n"
                           "ci_output_chunks_total{outcome=\"dropped\"} %" PRIu64 "\n",
                           (uint64_t)atomic_load(&m->output_chunks[0]),
                           (uint64_t)atomic_load(&m->output_chunks[1]));
    return s ? CI_ERR_NOMEM : CI_OK;
}
