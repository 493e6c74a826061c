/* ci-worker: pulls tasks from NATS JetStream and runs them through the
 * configured provider until SIGTERM or SIGINT, then drains and exits 0. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "nats/broker.h"
#include "core/config.h"
#include "nats/heartbeat.h"
#include "core/log.h"
#include "monitor/metrics.h"
#include "monitor/monitor.h"
#include "provider/registry.h"
#include "core/request.h"
#include "sandbox/sandbox.h"
#include "worker/batchmemo.h"
#include "worker/lanes.h"
#include "worker/manifest.h"
#include "worker/sealwait.h"
#include "worker/task.h"
#include "worker/waitroom.h"
#include "core/util.h"

#define CI_WORKER_VERSION "0.1.0"
#define FETCH_WAIT_MS 1000
/* While session tasks wait in the room, slots fetch briefly, so that a task
 * whose turn came does not wait for a fetch to end; idle workers wait long. */
#define ROOM_FETCH_WAIT_MS 50
/* An idle worker's slots ask the batch lane at most this often between
 * them: under a wait, so that one slot alone still asks after each. */
#define BATCH_LOOK_MS (FETCH_WAIT_MS * 3 / 4)
/* Batches whose seal and lack of a cancel the worker remembers. */
#define BATCH_MEMO_CAP 64
/* Seals that came before the stream showed them (contract §20): how many
 * wait at most, how often they are read again, for how long. */
#define SEALS_WAITING_CAP 256
#define SEAL_FIRST_PAUSE_MS 50
#define SEAL_MAX_PAUSE_MS 1000
#define SEAL_GIVE_UP_MS 30000
#define ROOM_POLL_MS 25 /* how often the room looks up its sessions */
#define TICK_MS 250
#define VERSIONS_TIMEOUT_MS 20000 /* the runtime's Python saying its versions, at start */

static volatile sig_atomic_t g_stop; /* set by the signal handler only */

static void on_signal(int sig) { g_stop = 1; }

struct worker {
    struct ci_worker_env env;
    struct ci_slot *slots;
    pthread_t *threads;
    size_t n_slots;
    atomic_int running_threads;
    atomic_bool ticker_stop;
    atomic_bool failed; /* a slot could not bind: stop, and exit 1 */
    char id[128];
    /* For operators (/metrics, /healthz, /readyz, heartbeats). */
    atomic_int bound_slots;          /* slots bound to the consumer */
    atomic_int_fast64_t last_tick_ms; /* the ticker's last round (monotonic) */
    atomic_bool broker_up;           /* env.broker is set: the others may read it */
    uint64_t nats_disconnects_seen;  /* the ticker's last look at the broker's counts */
    uint64_t nats_reconnects_seen;
    uint64_t nats_recreated_seen;
    int live_output_seen;            /* the ticker's last look: 1 on, 0 off, -1 not yet */
    uint64_t warm_deaths_seen;       /* the same for the warm pool */
    uint64_t warm_ready_at_death;
    bool warm_replacing;
    atomic_uint_fast64_t tasks_done;
    ci_lanes_look batch_look; /* the slots' last look at the batch lane (lanes.h) */
    struct ci_monitor *monitor;
    struct ci_heartbeat *heartbeat;
    struct ci_waitroom *room; /* session tasks waiting for their turn */
    struct ci_manifest_versions versions; /* read once at start (contract §18) */
    bool manifest_failing;                /* the last manifest write failed */
};

struct slot_arg {
    struct worker *w;
    struct ci_slot *slot;
};

/* Whether the slot may run a message that waited in its own queue (see
 * ci_delivery_queued_ms) while it ran another task. Past half the ack wait
 * the server may have redelivered it to another worker, which may be
 * running it now: running this copy too would run the task twice. So it is
 * left alone, neither acked nor nak'ed (a nak of a message delivered again
 * elsewhere could bring a third delivery), and the server redelivers it
 * once its ack wait runs out: nothing is lost. On its last attempt no
 * redelivery will come, so it runs. A fresh message behind a late 408 may
 * pass for queued: it then costs one redelivery after the ack wait, never a
 * loss or a second run. */
static bool take_queued(const struct worker *w, struct ci_delivery *d)
{
    int64_t queued = ci_delivery_queued_ms(d);
    if (queued < 0)
        return true;
    int64_t ack_wait_ms = (int64_t)w->env.cfg->jetstream.ack_wait_s * 1000;
    bool fresh = queued < ack_wait_ms / 2; /* no redelivery can have happened yet */
    bool run = fresh || ci_delivery_last_attempt(d);
    if (run) /* its ack timer has been running: reset it before the task starts */
        ci_delivery_in_progress(d);
    /* Clients set Nats-Msg-Id to the task id; the body is not decoded here. */
    const char *id = ci_delivery_header(d, "Nats-Msg-Id");
    const struct ci_log_field f[] = {
        CI_LOG_S("task_id", id && ci_task_id_valid(id) ? id : ""),
        CI_LOG_N("attempt", ci_delivery_attempt(d)),
        CI_LOG_N("waited_ms", queued), /* at most */
        CI_LOG_N("ack_wait_ms", ack_wait_ms),
        CI_LOG_S("action", !run ? "left_for_redelivery" : fresh ? "run" : "run_last_attempt"),
    };
    ci_log_fields(fresh ? CI_LOG_DEBUG : CI_LOG_WARN, "task.stale_delivery", f,
                  sizeof(f) / sizeof(f[0]));
    if (!run)
        ci_metrics_delivery(w->env.metrics, CI_METRICS_STALE);
    return run;
}

_Static_assert(CI_TASK_END_SUPERSEDED == (int)CI_METRICS_SUPERSEDED,
               "a task's end is its delivery outcome in the metrics");
/* CI_TASK_END_WAIT disposes of nothing: no outcome of its own (run_task). */
_Static_assert(CI_TASK_END_WAIT == CI_TASK_END_SUPERSEDED + 1,
               "every task end but WAIT is a delivery outcome");

/* The room reaches NATS through these (worker/waitroom.h). */
static ci_status room_first_seq(void *ctx, const char *session_id, uint64_t *ret_seq,
                                struct ci_error *err)
{
    struct worker *w = ctx;
    return ci_broker_session_first_seq(w->env.broker, session_id, ret_seq, err);
}
static void room_in_progress(void *ctx, struct ci_delivery *d) { ci_delivery_in_progress(d); }
static void room_nak(void *ctx, struct ci_delivery *d, int64_t delay_ms)
{
    ci_delivery_nak(d, delay_ms);
}
static bool room_last_attempt(void *ctx, struct ci_delivery *d)
{
    return ci_delivery_last_attempt(d);
}
static void room_free(void *ctx, struct ci_delivery *d) { ci_delivery_free(d); }

static const struct ci_waitroom_ops room_ops = {
    .first_seq = room_first_seq,
    .in_progress = room_in_progress,
    .nak = room_nak,
    .last_attempt = room_last_attempt,
    .free = room_free,
};

/* A session task whose turn has not come goes to the room; the slot is
 * free again. */
static void hold_task(struct worker *w, struct ci_slot *slot, struct ci_delivery *d,
                      const struct ci_task_wait *wait)
{
    /* The slot no longer has it: the ticker must not touch a delivery that
     * the room may free (task.c should have cleared these already). */
    pthread_mutex_lock(&slot->lock);
    if (slot->delivery == d)
        slot->delivery = NULL;
    slot->task_id[0] = '\0';
    pthread_mutex_unlock(&slot->lock);
    const struct ci_log_field f[] = {
        CI_LOG_S("task_id", wait->task_id),
        CI_LOG_S("session_id", wait->session_id),
        CI_LOG_N("seq", (int64_t)wait->seq),
    };
    size_t nf = sizeof(f) / sizeof(f[0]);
    switch (ci_waitroom_hold(w->room, d, wait)) {
    case CI_WAITROOM_HELD:
        ci_log_fields(CI_LOG_DEBUG, "session.task_waiting", f, nf);
        break;
    case CI_WAITROOM_FULL: /* nak'ed with a delay: counts as a delivery (contract §16) */
        ci_log_fields(CI_LOG_WARN, "session.waiting_room_full", f, nf);
        ci_metrics_delivery(w->env.metrics, CI_METRICS_RETRY);
        break;
    case CI_WAITROOM_RETURNED:
        ci_log_fields(CI_LOG_INFO, "session.task_returned", f, nf);
        break;
    }
}

static void run_task(struct worker *w, struct ci_slot *slot, struct ci_delivery *d,
                     const struct ci_task_wait *resumed)
{
    ci_metrics_slot_busy(w->env.metrics, true);
    struct ci_task_wait wait;
    memset(&wait, 0, sizeof(wait));
    enum ci_task_end end = ci_task_process(&w->env, slot, d, resumed, &wait);
    ci_metrics_slot_busy(w->env.metrics, false);
    if (end == CI_TASK_END_WAIT) {
        hold_task(w, slot, d, &wait);
        return;
    }
    ci_metrics_delivery(w->env.metrics, (enum ci_metrics_outcome)end);
    if (end == CI_TASK_END_DONE)
        atomic_fetch_add(&w->tasks_done, 1);
}

/* Asks one lane as the lanes policy says: a long poll (shorter while
 * session tasks wait in the room, so that one whose turn came does not
 * wait for it), or a pull that does not wait. CI_ERR_TIMEOUT: none. */
static ci_status ask_lane(struct worker *w, struct ci_puller *p, const struct ci_lane_ask *a,
                          struct ci_delivery **ret, struct ci_error *e)
{
    if (!a->wait)
        return ci_puller_fetch_nowait(p, ret, e);
    int wait_ms = ci_waitroom_count(w->room) ? ROOM_FETCH_WAIT_MS : FETCH_WAIT_MS;
    return ci_puller_fetch(p, wait_ms, ret, e);
}

/* One round of asks (worker/lanes.h): the first task a lane gives, its
 * lane in *ret_lane; CI_ERR_TIMEOUT when neither had one; an error of the
 * lane that failed (the round stops there). */
static ci_status take_task(struct worker *w, struct ci_puller *const pullers[2],
                           struct ci_lanes *lanes, struct ci_delivery **ret,
                           enum ci_lane *ret_lane, struct ci_error *e)
{
    struct ci_lane_ask asks[2];
    size_t n = ci_lanes_plan(lanes, asks);
    ci_status s = CI_ERR_TIMEOUT;
    for (size_t i = 0; i < n && !g_stop; i++) {
        if (ci_lanes_batch_skip(asks, i, &w->batch_look, ci_mono_ms(), BATCH_LOOK_MS)) {
            ci_lanes_took(lanes, asks[i].lane, false);
            continue;
        }
        s = ask_lane(w, pullers[asks[i].lane], &asks[i], ret, e);
        if (asks[i].lane == CI_LANE_BATCH && (s == CI_OK || s == CI_ERR_TIMEOUT))
            ci_lanes_batch_found(&w->batch_look, s == CI_OK, ci_mono_ms());
        ci_lanes_took(lanes, asks[i].lane, s == CI_OK);
        *ret_lane = asks[i].lane;
        if (s != CI_ERR_TIMEOUT)
            break;
    }
    return s;
}

/* A slot takes a ready session task before it fetches; then a task from
 * the interactive lane or the batch lane, as worker/lanes.h decides (a
 * pull on each, apart). After SIGTERM it fetches no more; the room gives
 * back what it holds (ci_waitroom_drain) but tasks on their last attempt,
 * which the slots still run when their turn comes, within the drain. */
static void *slot_main(void *p)
{
    struct slot_arg *a = p;
    struct worker *w = a->w;
    struct ci_puller *pullers[2] = {NULL, NULL}; /* by enum ci_lane */
    struct ci_lanes lanes;
    ci_lanes_init(&lanes, w->env.cfg->worker.batch_every);
    struct ci_error e = {{0}};
    if (ci_puller_new(w->env.broker, &pullers[CI_LANE_INTERACTIVE], &e) ||
        ci_puller_new_batch(w->env.broker, &pullers[CI_LANE_BATCH], &e)) {
        ci_log(CI_LOG_ERROR, "slot.bind_failed", "error", e.msg, NULL);
        atomic_store(&w->failed, true);
        g_stop = 1;
        goto out;
    }
    atomic_fetch_add(&w->bound_slots, 1);
    while (!g_stop || ci_waitroom_count(w->room) > 0) {
        struct ci_delivery *d = NULL;
        struct ci_task_wait ready;
        if (g_stop) {
            size_t back = ci_waitroom_drain(w->room);
            if (back)
                ci_log_num(CI_LOG_INFO, "session.tasks_returned", "count", (int64_t)back,
                           NULL);
            if (ci_waitroom_take(w->room, ROOM_FETCH_WAIT_MS, &d, &ready))
                run_task(w, a->slot, d, &ready);
            continue;
        }
        if (ci_waitroom_take(w->room, 0, &d, &ready)) {
            run_task(w, a->slot, d, &ready);
            continue;
        }
        enum ci_lane lane = CI_LANE_INTERACTIVE;
        ci_status s = take_task(w, pullers, &lanes, &d, &lane, &e);
        if (s == CI_ERR_TIMEOUT)
            continue;
        if (s && ci_broker_closed(w->env.broker)) {
            /* nats.max_reconnects used up: nothing will ever come again. */
            ci_log(CI_LOG_ERROR, "slot.connection_closed", "error", e.msg, NULL);
            atomic_store(&w->failed, true);
            g_stop = 1;
            break;
        }
        if (s) {
            /* 409s after a leader change, a reconnect in progress: retry. */
            ci_log(CI_LOG_DEBUG, "slot.fetch_failed", "error", e.msg, "lane",
                   lane == CI_LANE_BATCH ? "batch" : "interactive", NULL);
            struct timespec ts = {0, 200 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        ci_metrics_lane_take(w->env.metrics,
                             lane == CI_LANE_BATCH ? CI_METRICS_BATCH : CI_METRICS_INTERACTIVE);
        if (!take_queued(w, d)) {
            ci_delivery_free(d);
            continue;
        }
        if (g_stop && !ci_delivery_last_attempt(d)) {
            /* Came in after SIGTERM: a draining worker takes no new task, so
             * hand it back at once for another worker. Not on its last
             * attempt: the server would never deliver it again, so it runs
             * here, within the drain. */
            ci_delivery_nak(d, 0);
            ci_delivery_free(d);
            continue; /* the room may still hold a last attempt */
        }
        run_task(w, a->slot, d, NULL);
    }
    if (pullers[CI_LANE_INTERACTIVE] && pullers[CI_LANE_BATCH])
        atomic_fetch_sub(&w->bound_slots, 1);
out:
    ci_puller_free(pullers[CI_LANE_INTERACTIVE]);
    ci_puller_free(pullers[CI_LANE_BATCH]);
    atomic_fetch_sub(&w->running_threads, 1);
    free(a);
    return NULL;
}

/* An operator needs to see NATS go and come back: one line each time. The
 * broker counts both (an outage shorter than a tick is still counted); the
 * ticker says what changed since its last look. */
static void log_connection_change(struct worker *w)
{
    if (!atomic_load(&w->broker_up))
        return;
    uint64_t gone = ci_broker_disconnects(w->env.broker);
    uint64_t back = ci_broker_reconnects(w->env.broker);
    if (gone > w->nats_disconnects_seen)
        ci_log_num(CI_LOG_WARN, "worker.nats_disconnected", "disconnects", (int64_t)gone,
                   "state", ci_broker_closed(w->env.broker) ? "closed" : "reconnecting", NULL);
    if (back > w->nats_reconnects_seen)
        ci_log_num(CI_LOG_INFO, "worker.nats_reconnected", "reconnects", (int64_t)back, NULL);
    w->nats_disconnects_seen = gone;
    w->nats_reconnects_seen = back;
    uint64_t made = ci_broker_recreated(w->env.broker);
    if (made > w->nats_recreated_seen)
        ci_log_num(CI_LOG_WARN, "worker.nats_recreated", "times", (int64_t)made, "what",
                   "a stream or bucket was found deleted and was created again", NULL);
    w->nats_recreated_seen = made;
}

/* Live output (contract §19) off because its stream could not be made,
 * and on again once the periodic check made it: said once each way. */
static void log_live_output_change(struct worker *w)
{
    if (!w->env.cfg->jetstream.live_output || !atomic_load(&w->broker_up))
        return;
    char why[400];
    int on = ci_broker_live_output(w->env.broker, why, sizeof(why)) ? 1 : 0;
    if (on == w->live_output_seen || (on && w->live_output_seen < 0)) {
        w->live_output_seen = on;
        return;
    }
    if (on)
        ci_log(CI_LOG_INFO, "worker.live_output_on", "stream", w->env.cfg->jetstream.output_stream,
               NULL);
    else
        ci_log(CI_LOG_WARN, "worker.live_output_off", "stream",
               w->env.cfg->jetstream.output_stream, "error", why, "what",
               "tasks run without live output (their results keep their output); lower "
               "jetstream.output_max_mb or give the JetStream store more room",
               NULL);
    w->live_output_seen = on;
}

/* A warm runtime that dies is replaced by the pool on its own; the
 * operator sees both in the log (and the deaths in /metrics). */
static void log_warm_pool_change(struct worker *w)
{
    struct ci_warm_stats st;
    ci_provider_warm_stats(w->env.provider, &st);
    if (st.died > w->warm_deaths_seen) {
        const struct ci_log_field f[] = {
            CI_LOG_N("died", (int64_t)st.died),
            CI_LOG_N("ready", st.ready),
            CI_LOG_S("last_failure", st.last_failure),
        };
        ci_log_fields(CI_LOG_WARN, "worker.zygote_died", f, sizeof(f) / sizeof(f[0]));
        w->warm_deaths_seen = st.died;
        w->warm_ready_at_death = st.became_ready;
        w->warm_replacing = true;
    } else if (w->warm_replacing && st.became_ready > w->warm_ready_at_death) {
        ci_log_num(CI_LOG_INFO, "worker.zygote_replaced", "ready", st.ready, NULL);
        w->warm_replacing = false;
    }
}

/* Keeps every running task's message alive: the server redelivers a
 * message whose ack timer runs out, so each one gets an in-progress ack at
 * a third of the ack wait. */
static void *ticker_main(void *p)
{
    struct worker *w = p;
    int64_t every = (int64_t)w->env.cfg->jetstream.ack_wait_s * 1000 / 3;
    while (!atomic_load(&w->ticker_stop)) {
        int64_t now = ci_mono_ms();
        atomic_store(&w->last_tick_ms, now);
        log_connection_change(w);
        log_live_output_change(w);
        log_warm_pool_change(w);
        if (atomic_load(&w->broker_up))
            ci_broker_release_pending(w->env.broker);
        for (size_t i = 0; i < w->n_slots; i++) {
            struct ci_slot *s = &w->slots[i];
            pthread_mutex_lock(&s->lock);
            if (s->delivery && now - s->last_progress_ms >= every) {
                ci_delivery_in_progress(s->delivery);
                s->last_progress_ms = now;
            }
            pthread_mutex_unlock(&s->lock);
        }
        struct timespec ts = {0, TICK_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

/* --- what operators see: /healthz, /readyz, /metrics, heartbeats --- */

/* Live while the ticker goes round: a worker whose ticker is stuck can no
 * longer keep its tasks' messages alive, and is better restarted. */
static bool worker_live(void *closure, char *why, size_t n)
{
    struct worker *w = closure;
    int64_t idle = ci_mono_ms() - atomic_load(&w->last_tick_ms);
    if (idle <= 10000)
        return true;
    snprintf(why, n, "the in-progress ticker has not run for %lld ms", (long long)idle);
    return false;
}

/* Ready when it can take tasks: connected, every slot bound to the
 * consumer, not draining. The sandbox probe passed before any of this
 * started (a failed probe stops the worker at start). */
static bool worker_ready(void *closure, char *why, size_t n)
{
    struct worker *w = closure;
    int bound = atomic_load(&w->bound_slots);
    if (g_stop)
        snprintf(why, n, "draining: the worker takes no new task");
    else if (!atomic_load(&w->broker_up))
        snprintf(why, n, "connecting to NATS and setting up JetStream");
    else if (!ci_broker_connected(w->env.broker))
        snprintf(why, n, "not connected to NATS");
    else if (ci_broker_problem(w->env.broker, why, n))
        ; /* why says it */
    else if (bound < (int)w->n_slots)
        snprintf(why, n, "%d of %zu slots bound to the task consumers", bound, w->n_slots);
    else
        return true;
    return false;
}

static void collect_live(void *closure, struct ci_metrics_live *ret)
{
    struct worker *w = closure;
    bool up = atomic_load(&w->broker_up);
    ret->nats_reconnects = up ? ci_broker_reconnects(w->env.broker) : 0;
    ret->nats_connected = up && ci_broker_connected(w->env.broker);
    /* The warm pool (local.mode: warm): zygotes ready to take a task. */
    struct ci_warm_stats ws;
    ci_provider_warm_stats(w->env.provider, &ws);
    ret->warm_pool_size = ws.ready;
    ret->warm_deaths = ws.died;
    ret->warm_fallbacks = ws.fallbacks;
    ret->session_tasks_waiting = ci_waitroom_count(w->room);
}

static void fill_heartbeat(void *closure, struct ci_heartbeat_info *info)
{
    struct worker *w = closure;
    char why[8];
    info->worker = w->id;
    info->provider = (char *)ci_provider_name(w->env.provider);
    info->version = (char *)CI_WORKER_VERSION;
    info->slots = (uint32_t)w->n_slots;
    int free_slots = 0;
    for (size_t i = 0; i < w->n_slots; i++) {
        pthread_mutex_lock(&w->slots[i].lock);
        free_slots += w->slots[i].task_id[0] == '\0';
        pthread_mutex_unlock(&w->slots[i].lock);
    }
    info->active = (uint32_t)w->n_slots - (uint32_t)free_slots;
    info->ready = worker_ready(w, why, sizeof(why));
    info->tasks_done = atomic_load(&w->tasks_done);
}

/* The runtime manifest (contract §18): written after setup and then with
 * every heartbeat, so that it outlives the bucket's TTL while a worker
 * runs. Only `ci runtimes` and tool descriptions miss it when a write
 * fails: logged (once until it works again), never fatal. */
static void publish_manifest(struct worker *w)
{
    const struct ci_provider *p = w->env.provider;
    struct ci_manifest m = {
        .cfg = w->env.cfg,
        .runtime = CI_DEFAULT_RUNTIME,
        .provider = ci_provider_name(p),
        .sessions = p->ops->sessions,
        .isolation = ci_provider_isolation(p),
        .worker = w->id,
        .version = CI_WORKER_VERSION,
        .at_ms = ci_now_ms(),
        .versions = &w->versions,
    };
    char *json = NULL;
    size_t len = 0;
    struct ci_error e = {{0}};
    ci_status r = ci_manifest_encode(&m, &json, &len, &e);
    if (!r)
        r = ci_broker_runtime_put(w->env.broker, CI_DEFAULT_RUNTIME, json, len, &e);
    free(json);
    if (r && !w->manifest_failing)
        ci_log(CI_LOG_WARN, "worker.manifest_failed", "error", e.msg, NULL);
    else if (!r && w->manifest_failing)
        ci_log(CI_LOG_INFO, "worker.manifest_written", NULL);
    w->manifest_failing = r != CI_OK;
}

/* The versions come from the runtime's own Python. A remote provider's
 * runtime is not this machine's: its versions stay unknown, not guessed. */
static void read_versions(struct worker *w)
{
    const struct ci_config *cfg = w->env.cfg;
    if (strcmp(ci_provider_name(w->env.provider), "local") != 0) {
        memset(&w->versions, 0, sizeof(w->versions));
        snprintf(w->versions.unknown, sizeof(w->versions.unknown),
                 "the %s provider runs another machine's Python, which this worker cannot see",
                 ci_provider_name(w->env.provider));
        return;
    }
    ci_manifest_read_versions(cfg->local.python, VERSIONS_TIMEOUT_MS, &w->versions);
    if (!w->versions.known)
        ci_log(CI_LOG_WARN, "worker.versions_unknown", "error", w->versions.unknown, NULL);
}

static void on_cancel(const char *task_id, void *closure)
{
    struct worker *w = closure;
    for (size_t i = 0; i < w->n_slots; i++)
        ci_slot_cancel(&w->env, &w->slots[i], task_id);
    /* A held task ends CANCELLED at once: a slot takes it now. */
    ci_waitroom_cancel(w->room, task_id);
}

/* A seal (contract §20): the batch may be complete already. The body is
 * read again from the stream (ci_task_batch_sealed), on the seal thread:
 * the stream may show it only later. */
static void on_batch_sealed(const char *batch_id, const void *body, size_t len, void *closure)
{
    struct worker *w = closure;
    (void)body;
    (void)len;
    ci_sealwait_add(w->env.seals, batch_id);
}

static ci_status try_seal(void *closure, const char *batch_id, struct ci_error *err)
{
    struct worker *w = closure;
    return ci_task_batch_sealed(&w->env, batch_id, err);
}

/* A cancel of a batch (contract §20): every running task of it. Tasks of
 * the batch that come later find it in the memo (or on the stream, should
 * the memo have made room). The memo first: a slot that looked at the
 * batch before is seen by the loop below (its batch_id was set before it
 * looked). */
static void on_batch_cancel(const char *batch_id, void *closure)
{
    struct worker *w = closure;
    /* It sticks a while: the stream may not show it to a task taken a
     * moment later yet (and may refuse it: then it does not stick). */
    ci_batch_memo_cancel(w->env.batches, batch_id, ci_now_ms());
    for (size_t i = 0; i < w->n_slots; i++)
        ci_slot_cancel_batch(&w->env, &w->slots[i], batch_id);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: ci-worker [--config FILE] [--probe] [--check-config] [--version]\n"
            "  --config FILE    worker configuration (YAML); defaults apply without it\n"
            "  --probe          print which sandbox layers this machine grants, then exit\n"
            "                   (non-zero when local.isolation is 'required' and unmet)\n"
            "  --check-config   load and validate the configuration, print it, exit\n"
            "environment: CI_NATS_URL overrides nats.url\n");
}

/* JetStream may not answer yet when the worker starts beside it (a cluster
 * still electing its leaders, a server recovering its streams): the setup
 * is tried again, with a growing pause, for up to SETUP_RETRY_MS; SIGTERM
 * or SIGINT ends the wait. A refusal that lasts (a stream with settings
 * that cannot be updated) is only reported later. */
#define SETUP_RETRY_MS 60000

static ci_status setup_broker(struct ci_broker *b, struct ci_error *err)
{
    int64_t deadline = ci_mono_ms() + SETUP_RETRY_MS;
    int64_t pause_ms = 250;
    for (;;) {
        ci_status s = ci_broker_setup(b, true, err);
        /* CI_ERR_FULL too: a cluster still starting may have no peers to
         * place a stream or the consumer on ("insufficient resources"). */
        if ((s != CI_ERR_NATS && s != CI_ERR_TIMEOUT && s != CI_ERR_FULL) ||
            ci_mono_ms() + pause_ms > deadline)
            return s;
        ci_log(CI_LOG_WARN, "worker.nats_setup_retry", "error", err->msg, NULL);
        for (int64_t slept = 0; slept < pause_ms && !g_stop; slept += 50) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (g_stop)
            return s;
        pause_ms = pause_ms * 2 > 4000 ? 4000 : pause_ms * 2;
    }
}

/* A worker may start before its server (a pod before the NATS pods, a
 * laptop): it tries again with a growing pause, logging a try at most
 * every CONNECT_LOG_MS after the first few, until it connects, SIGTERM, or
 * nats.max_reconnects more tries when that is not -1. What can never work
 * (the URL, credential or TLS files) fails at once: the config check
 * refuses a bad URL, and the broker says CI_ERR_INVALID for the files. */
#define CONNECT_PAUSE_MAX_MS 5000
#define CONNECT_LOG_MS 30000

static ci_status connect_broker(const struct ci_config *cfg, struct ci_broker **ret,
                                struct ci_error *err)
{
    int64_t pause_ms = 250, last_log = 0;
    for (uint64_t attempt = 1;; attempt++) {
        ci_status s = ci_broker_connect(cfg, ret, err);
        if (s != CI_ERR_NATS && s != CI_ERR_TIMEOUT)
            return s;
        /* The first try and nats.max_reconnects more, as after a lost connection. */
        if (cfg->nats.max_reconnects >= 0 && attempt > (uint64_t)cfg->nats.max_reconnects)
            return s;
        int64_t now = ci_mono_ms();
        if (attempt <= 3 || now - last_log >= CONNECT_LOG_MS) {
            const struct ci_log_field f[] = {
                CI_LOG_N("attempt", (int64_t)attempt),
                CI_LOG_S("error", err->msg),
                CI_LOG_N("next_try_ms", pause_ms),
            };
            ci_log_fields(CI_LOG_WARN, "worker.nats_connect_retry", f, sizeof(f) / sizeof(f[0]));
            last_log = now;
        }
        for (int64_t slept = 0; slept < pause_ms && !g_stop; slept += 50) {
            struct timespec ts = {0, 50 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (g_stop)
            return ci_error_set(err, CI_ERR_CANCELLED, "stopped while connecting to NATS");
        pause_ms = pause_ms * 2 > CONNECT_PAUSE_MAX_MS ? CONNECT_PAUSE_MAX_MS : pause_ms * 2;
    }
}

/* Each thing the provider found as it started, once, under its own name:
 * only worker.no_isolation means tasks run without namespaces. */
static void log_provider_notes(const struct ci_provider *provider)
{
    struct ci_provider_notes notes;
    ci_provider_notes(provider, &notes);
    if (notes.no_sandbox[0]) /* isolation: auto fell back to no sandbox */
        ci_log(CI_LOG_WARN, "worker.no_isolation", "warning", notes.no_sandbox, NULL);
    if (notes.warm_unavailable[0]) /* tasks run cold, in the sandbox */
        ci_log(CI_LOG_WARN, "worker.warm_unavailable", "warning", notes.warm_unavailable, NULL);
    if (notes.task_uids_off[0])
        ci_log(CI_LOG_WARN, "worker.task_uids_off", "warning", notes.task_uids_off, NULL);
    if (notes.slow_cgroup_moves[0]) /* a latency, not a risk */
        ci_log(CI_LOG_INFO, "worker.slow_cgroup_moves", "note", notes.slow_cgroup_moves, NULL);
}

static int run_worker(const struct ci_config *cfg)
{
    struct worker w;
    memset(&w, 0, sizeof(w));
    w.live_output_seen = -1;
    struct ci_error e = {{0}};
    int rc = 1;
    pthread_t ticker;
    bool ticker_started = false;

    if (cfg->worker.id && cfg->worker.id[0]) {
        snprintf(w.id, sizeof(w.id), "%s", cfg->worker.id);
    } else {
        char host[64] = "worker";
        gethostname(host, sizeof(host) - 1);
        snprintf(w.id, sizeof(w.id), "%s-%d", host, (int)getpid());
    }
    ci_log_init(ci_log_level_from_name(cfg->worker.log_level), w.id);
    w.env.cfg = cfg;
    w.env.worker_id = w.id;

    /* The sandbox first: a machine that cannot run tasks safely fails here,
     * before it takes any task. */
    if (ci_provider_new(cfg, &w.env.provider, &e)) {
        ci_log(CI_LOG_ERROR, "worker.provider_failed", "error", e.msg, NULL);
        goto out;
    }
    log_provider_notes(w.env.provider);
    read_versions(&w);
    w.n_slots = ci_config_slots(cfg);
    w.slots = calloc(w.n_slots, sizeof(*w.slots));
    w.threads = calloc(w.n_slots, sizeof(*w.threads));
    if (!w.slots || !w.threads) {
        ci_log(CI_LOG_ERROR, "worker.nomem", NULL);
        goto out;
    }
    for (size_t i = 0; i < w.n_slots; i++)
        pthread_mutex_init(&w.slots[i].lock, NULL);
    if (ci_metrics_new(ci_provider_name(w.env.provider), w.n_slots, &w.env.metrics, &e)) {
        ci_log(CI_LOG_ERROR, "worker.nomem", "error", e.msg, NULL);
        goto out;
    }
    if (ci_batch_memo_new(BATCH_MEMO_CAP, &w.env.batches, &e)) {
        ci_log(CI_LOG_ERROR, "worker.nomem", "error", e.msg, NULL);
        goto out;
    }
    /* The room before anything that reads it (metrics, slots, cancels);
     * its thread uses the broker only for tasks held, after it is up. */
    struct ci_waitroom_opts ro = {
        .ops = &room_ops,
        .ctx = &w,
        .max_waiting = cfg->sessions.max_waiting,
        .poll_ms = ROOM_POLL_MS,
        .progress_every_ms = (int64_t)cfg->jetstream.ack_wait_s * 1000 / 3,
    };
    if (ci_waitroom_new(&ro, &w.room, &e)) {
        ci_log(CI_LOG_ERROR, "worker.waitroom_failed", "error", e.msg, NULL);
        goto out;
    }
    ci_metrics_set_collector(w.env.metrics, collect_live, &w);
    atomic_store(&w.last_tick_ms, ci_mono_ms());
    if (cfg->worker.metrics_addr[0]) {
        /* Only the default gives way: several workers on one machine with
         * the shipped config each get a port; a chosen address is kept. */
        bool fallback = !ci_config_was_set(cfg, "worker.metrics_addr");
        struct ci_monitor_options mo = {
            .addr = cfg->worker.metrics_addr,
            .any_port_if_taken = fallback,
            .metrics = w.env.metrics,
            .live = worker_live,
            .ready = worker_ready,
            .closure = &w,
        };
        if (ci_monitor_start(&mo, &w.monitor, &e)) {
            ci_log(CI_LOG_ERROR, "worker.monitor_failed", "error", e.msg, NULL);
            goto out;
        }
        if (fallback && strcmp(ci_monitor_address(w.monitor), cfg->worker.metrics_addr) != 0)
            ci_log(CI_LOG_WARN, "worker.metrics_port_taken", "wanted", cfg->worker.metrics_addr,
                   "metrics_addr", ci_monitor_address(w.monitor), NULL);
    }
    /* The ticker first: /healthz stays live while NATS is awaited. Once
     * tasks run it keeps their messages alive: without it a task longer
     * than the ack wait would be redelivered, and run twice. */
    if (pthread_create(&ticker, NULL, ticker_main, &w) != 0) {
        ci_log(CI_LOG_ERROR, "worker.thread_failed", "thread", "ticker", NULL);
        goto out;
    }
    ticker_started = true;
    ci_log(CI_LOG_INFO, "worker.starting", "metrics_addr", ci_monitor_address(w.monitor), NULL);
    ci_status cs = connect_broker(cfg, &w.env.broker, &e);
    if (cs == CI_ERR_CANCELLED) {
        rc = 0; /* stopped before it took anything */
        goto out;
    }
    if (cs || setup_broker(w.env.broker, &e)) {
        if (g_stop) { /* SIGTERM while it waited: a clean stop */
            rc = 0;
            goto out;
        }
        ci_log(CI_LOG_ERROR, "worker.nats_failed", "error", e.msg, NULL);
        goto out;
    }
    atomic_store(&w.broker_up, true);
    if (cfg->worker.heartbeat_s &&
        ci_heartbeat_start(w.env.broker, w.id, cfg->worker.heartbeat_s, fill_heartbeat, &w,
                           &w.heartbeat, &e))
        /* Only `ci stats` misses this worker: not a reason to stop. */
        ci_log(CI_LOG_WARN, "worker.heartbeat_failed", "error", e.msg, NULL);
    publish_manifest(&w);
    struct ci_sealwait_opts so = {
        .fn = try_seal,
        .closure = &w,
        .cap = SEALS_WAITING_CAP,
        .first_ms = SEAL_FIRST_PAUSE_MS,
        .max_pause_ms = SEAL_MAX_PAUSE_MS,
        .give_up_ms = SEAL_GIVE_UP_MS,
    };
    if (ci_sealwait_start(&so, &w.env.seals, &e)) {
        ci_log(CI_LOG_ERROR, "worker.thread_failed", "thread", "seals", "error", e.msg, NULL);
        goto out;
    }
    if (ci_broker_on_cancel(w.env.broker, on_cancel, &w, &e) ||
        ci_broker_on_batch_cancel(w.env.broker, on_batch_cancel, &w, &e) ||
        ci_broker_on_batch_sealed(w.env.broker, on_batch_sealed, &w, &e)) {
        ci_log(CI_LOG_ERROR, "worker.nats_failed", "error", e.msg, NULL);
        goto out;
    }
    for (size_t i = 0; i < w.n_slots; i++) {
        struct slot_arg *a = malloc(sizeof(*a));
        if (!a) {
            ci_log(CI_LOG_ERROR, "worker.thread_failed", "thread", "slot", NULL);
            atomic_store(&w.failed, true);
            g_stop = 1;
            break;
        }
        a->w = &w;
        a->slot = &w.slots[i];
        atomic_fetch_add(&w.running_threads, 1);
        if (pthread_create(&w.threads[i], NULL, slot_main, a) != 0) {
            atomic_fetch_sub(&w.running_threads, 1);
            free(a);
            w.threads[i] = 0;
            ci_log(CI_LOG_ERROR, "worker.thread_failed", "thread", "slot", NULL);
            atomic_store(&w.failed, true);
            g_stop = 1;
            break;
        }
    }
    /* "ready" in the log means what /readyz means: every slot is bound. A
     * slot that cannot bind stops the worker (g_stop). */
    while (!g_stop && atomic_load(&w.bound_slots) < (int)w.n_slots) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    char urls[1024];
    ci_broker_redact_urls(cfg->nats.url, urls, sizeof(urls));
    if (!g_stop)
        ci_log_num(CI_LOG_INFO, "worker.ready", "slots", (int64_t)w.n_slots, "provider",
                   ci_provider_name(w.env.provider), "nats", urls, "metrics_addr",
                   ci_monitor_address(w.monitor), NULL);

    /* Now and then (jetstream.check_s), what no failing write would reveal:
     * a deleted CI_TASKS (idle fetches just time out) is made again with its
     * consumer. */
    const int64_t check_every = (int64_t)cfg->jetstream.check_s * 1000;
    int64_t next_check = ci_mono_ms() + check_every;
    /* The manifest with the heartbeat; without heartbeats, often enough
     * that it never expires (a third of the bucket's TTL). */
    int64_t manifest_every = cfg->worker.heartbeat_s
                                 ? (int64_t)cfg->worker.heartbeat_s * 1000
                                 : (int64_t)cfg->jetstream.max_age_s * 1000 / 3;
    int64_t next_manifest = ci_mono_ms() + manifest_every;
    while (!g_stop) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
        if (ci_mono_ms() >= next_check) {
            ci_broker_check(w.env.broker);
            next_check = ci_mono_ms() + check_every;
        }
        if (ci_mono_ms() >= next_manifest) {
            publish_manifest(&w);
            next_manifest = ci_mono_ms() + manifest_every;
        }
    }
    ci_log(CI_LOG_INFO, "worker.draining", NULL);
    /* Running tasks finish within their own limits; past the drain timeout
     * we leave without acking and JetStream redelivers them. */
    int64_t deadline = ci_mono_ms() + (int64_t)cfg->worker.drain_timeout_s * 1000;
    while (atomic_load(&w.running_threads) > 0 && ci_mono_ms() < deadline) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (atomic_load(&w.running_threads) > 0) {
        ci_log(CI_LOG_WARN, "worker.drain_timeout", NULL);
        rc = 1;
        _exit(1); /* threads still hold the provider: do not free under them */
    }
    for (size_t i = 0; i < w.n_slots; i++)
        if (w.threads[i])
            pthread_join(w.threads[i], NULL);
    rc = atomic_load(&w.failed) ? 1 : 0;
out:
    atomic_store(&w.ticker_stop, true);
    if (ticker_started)
        pthread_join(ticker, NULL);
    /* Both read the broker: stop them before it goes. */
    ci_heartbeat_stop(w.heartbeat);
    ci_monitor_stop(w.monitor);
    /* Empty after a drain; otherwise what it holds goes back now, while
     * the connection is up. The cancel handler may still look into it
     * until the broker is freed: freed after that. */
    ci_waitroom_close(w.room);
    /* Its tries use the broker; the seal subscription may still add (no
     * more tries) until the broker is freed. */
    ci_sealwait_stop(w.env.seals);
    ci_broker_free(w.env.broker);
    ci_sealwait_free(w.env.seals);
    ci_waitroom_free(w.room);
    ci_metrics_free(w.env.metrics);
    ci_batch_memo_free(w.env.batches);
    ci_provider_free(w.env.provider);
    for (size_t i = 0; w.slots && i < w.n_slots; i++)
        pthread_mutex_destroy(&w.slots[i].lock);
    free(w.slots);
    free(w.threads);
    ci_log(CI_LOG_INFO, "worker.stopped", NULL);
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'}, {"probe", no_argument, NULL, 'p'},
        {"check-config", no_argument, NULL, 'k'}, {"version", no_argument, NULL, 'v'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0},
    };
    const char *config_path = NULL;
    bool probe = false, check = false;
    int c;
    while ((c = getopt_long(argc, argv, "c:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config_path = optarg; break;
        case 'p': probe = true; break;
        case 'k': check = true; break;
        case 'v': printf("ci-worker %s\n", CI_WORKER_VERSION); return 0;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        usage(stderr);
        return 2;
    }
    /* No core dumps or ptrace of a process that holds NATS credentials.
     * An unprivileged worker must stay dumpable, or it could not write the
     * uid map of its sandboxes (their /proc files would be root's); its
     * sandboxes make themselves non-dumpable once the maps are written. */
    if (geteuid() == 0)
        prctl(PR_SET_DUMPABLE, 0);

    struct ci_config *cfg = NULL;
    struct ci_error e = {{0}};
    ci_status s = config_path ? ci_config_load(config_path, &cfg, &e) : ci_config_defaults(&cfg, &e);
    if (s) {
        fprintf(stderr, "%s\n", e.msg);
        return 2;
    }
    int rc = 0;
    if (check) {
        ci_config_dump(cfg, stdout);
    } else if (probe) {
        struct ci_sandbox_probe p;
        ci_status ps = ci_sandbox_probe(cfg, &p);
        ci_sandbox_probe_print(&p, stdout);
        rc = ps ? 1 : 0;
    } else {
        struct sigaction sa;
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_signal;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        signal(SIGPIPE, SIG_IGN);
        /* Ignored SIGCHLD is inherited across exec (a parent's choice):
         * children would be reaped behind our back, their status lost. */
        signal(SIGCHLD, SIG_DFL);
        rc = run_worker(cfg);
    }
    ci_config_free(cfg);
    ci_broker_library_close();
    return rc;
}
