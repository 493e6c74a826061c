/* test_broker_drain.c - subscriptions the broker lets go while the read loop
 * may still hand them a message, against a real nats-server (each case
 * skips without one).
 *
 * nats.c 3.4.1's read loop looks a message's subscription up without taking
 * a reference (natsConn_processMsg, src/conn.c: natsHash_Get under subsMu,
 * then natsMsg_create, then natsMutex_Lock(sub->mu); nats.c issue #637,
 * fixed in 3.6.1). A subscription whose last reference goes in between is
 * freed under it: the SEGV in natsMutex_Lock a worker hit at its drain.
 * That window is a few instructions wide; this program widens it: it
 * defines natsMsg_create, which the library calls through its PLT, and
 * sleeps there for the messages a case picks before calling nats.c's own.
 * A case whose message never sat in that window (or a library that does
 * not call this natsMsg_create) skips: it checked nothing. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>

#include "core/util.h"
#include "nats/broker.h"
#include "nats_test_server.h"

/* What the read loop delays: messages whose subject starts with
 * delay_subject, or status 408s (a pull request that expired). */
static pthread_mutex_t delay_lock = PTHREAD_MUTEX_INITIALIZER;
static char delay_subject[256];
static bool delay_408;
static atomic_int delay_ms;
static atomic_int delay_entered, delay_left; /* delayed messages: begun, done */

typedef natsStatus (*create_fn)(natsMsg **, const char *, int, const char *, int, const char *,
                                int, int);

natsStatus natsMsg_create(natsMsg **newMsg, const char *subject, int subjLen, const char *reply,
                          int replyLen, const char *buf, int bufLen, int hdrLen);

natsStatus natsMsg_create(natsMsg **newMsg, const char *subject, int subjLen, const char *reply,
                          int replyLen, const char *buf, int bufLen, int hdrLen)
{
    static create_fn real;
    if (!real)
        real = (create_fn)dlsym(RTLD_NEXT, "natsMsg_create");
    int ms = atomic_load(&delay_ms);
    bool hit = false;
    if (ms > 0) {
        pthread_mutex_lock(&delay_lock);
        size_t n = strlen(delay_subject);
        hit = (n && subjLen >= (int)n && strncmp(subject, delay_subject, n) == 0) ||
              (delay_408 && hdrLen >= 12 && bufLen == hdrLen &&
               memcmp(buf, "NATS/1.0 408", 12) == 0);
        pthread_mutex_unlock(&delay_lock);
    }
    if (hit) {
        atomic_fetch_add(&delay_entered, 1);
        sleep_ms(ms);
    }
    natsStatus s = real(newMsg, subject, subjLen, reply, replyLen, buf, bufLen, hdrLen);
    if (hit)
        atomic_fetch_add(&delay_left, 1); /* the read loop locks the subscription next */
    return s;
}

static void delay_set(const char *subject, bool status_408, int ms)
{
    pthread_mutex_lock(&delay_lock);
    snprintf(delay_subject, sizeof(delay_subject), "%s", subject ? subject : "");
    delay_408 = status_408;
    pthread_mutex_unlock(&delay_lock);
    atomic_store(&delay_entered, 0);
    atomic_store(&delay_left, 0);
    atomic_store(&delay_ms, ms);
}

/* Waits (at most 5 s) until every delayed message went on, then a little
 * for the read loop to lock what it looked up. */
static void delay_wait_done(void)
{
    for (int i = 0; i < 500 && atomic_load(&delay_left) < atomic_load(&delay_entered); i++)
        sleep_ms(10);
    sleep_ms(50);
    atomic_store(&delay_ms, 0);
}

#define PULL_MS 300
#define DELAY_MS 600

/* A slot at the drain: its last fetch timed out (the server's 408 for it
 * came late, or is being handed over), the slot frees its puller at once.
 * The 408 the read loop holds must not find the subscription freed. */
static void t_puller_freed_while_its_408_is_handed_over(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    struct ci_error e = {{0}};
    int exercised = 0;
    /* The 408 comes ~10 ms before the fetch gives up (nats.c asks the
     * server to expire the request that much earlier): on a busy machine it
     * may come later, after the free, and show nothing. A few tries. */
    for (int attempt = 0; attempt < 5 && !exercised; attempt++) {
        struct ci_puller *p = NULL;
        REQUIRE(ci_puller_new(b, &p, &e) == CI_OK);
        delay_set(NULL, true, DELAY_MS);
        struct ci_delivery *d = NULL;
        ci_status s = ci_puller_fetch(p, PULL_MS, &d, &e);
        CHECK(s == CI_ERR_TIMEOUT);
        ci_delivery_free(d);
        /* The read loop looked the subscription up and sleeps: free now. */
        if (atomic_load(&delay_entered) > atomic_load(&delay_left))
            exercised++;
        ci_puller_free(p);
        delay_wait_done();
    }
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
    if (!exercised)
        SKIP("no 408 was being handed over when the puller was freed (machine too busy, or "
             "natsMsg_create not interposed): nothing checked");
}

static atomic_int cancels_seen;
static void on_cancel(const char *task_id, void *closure)
{
    (void)task_id;
    (void)closure;
    atomic_fetch_add(&cancels_seen, 1);
}

/* The worker frees its broker while a cancel is being handed over to the
 * cancel subscription: the subscription must outlive the read loop. */
static void t_handler_freed_while_a_message_is_handed_over(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    struct raw r = {0};
    REQUIRE(raw_open(&r, srv.url));
    struct ci_error e = {{0}};
    REQUIRE(ci_broker_on_cancel(b, on_cancel, NULL, &e) == CI_OK);
    char prefix[128];
    snprintf(prefix, sizeof(prefix), "%s.", cfg->jetstream.cancel_prefix);
    delay_set(prefix, false, DELAY_MS);
    char subj[160];
    snprintf(subj, sizeof(subj), "%st-drain-1", prefix);
    /* Again until one is in the read loop's hands: the broker's SUB may
     * reach the server after the first. */
    for (int i = 0; i < 300 && atomic_load(&delay_entered) == 0; i++) {
        if (i % 10 == 0)
            CHECK(natsConnection_PublishString(r.nc, subj, "") == NATS_OK);
        sleep_ms(10);
    }
    bool exercised = atomic_load(&delay_entered) > atomic_load(&delay_left);
    ci_broker_free(b); /* the read loop holds the cancel subscription */
    delay_wait_done();
    raw_close(&r);
    ci_config_free(cfg);
    server_stop(&srv);
    if (!exercised)
        SKIP("the cancel was not being handed over when the broker was freed: nothing checked");
}

/* Waits (at most 3 s) until the n-th delayed message is in the read
 * loop's hands (looked up, not yet handed over); whether it is. */
static bool delay_holding(int n)
{
    for (int i = 0; i < 300; i++) {
        int in = atomic_load(&delay_entered);
        if (in >= n && in > atomic_load(&delay_left))
            return true;
        sleep_ms(10);
    }
    return false;
}

/* A batch slot's pull that does not wait: its answer (a 404, the queue is
 * empty) is held by the read loop past the pull's own wait (2 s), so the
 * slot drops the inbox while the read loop holds it (nowait_drop). */
static void t_nowait_inbox_dropped_while_its_answer_is_handed_over(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    struct ci_error e = {{0}};
    struct ci_puller *p = NULL;
    REQUIRE(ci_puller_new_batch(b, &p, &e) == CI_OK);
    /* Only the pull's answer comes on an inbox meanwhile. */
    delay_set("_INBOX.", false, 2600);
    struct ci_delivery *d = NULL;
    ci_status s = ci_puller_fetch_nowait(p, &d, &e);
    /* The answer came (looked up: the subscription was there) and was held
     * past the wait, which gave up on it. */
    bool exercised = s != CI_OK && e.msg[0] && atomic_load(&delay_entered) > 0;
    ci_delivery_free(d);
    delay_wait_done();
    /* The puller still works: a fresh inbox, an answer in time. */
    if (exercised)
        CHECK(ci_puller_fetch_nowait(p, &d, &e) == CI_ERR_TIMEOUT);
    ci_puller_free(p);
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
    if (!exercised)
        SKIP("the pull's answer was not held past its wait: nothing checked");
}

static atomic_bool batch_held; /* the next event was held when the reader stopped */
static bool on_batch_event(void *closure, const char *subject, const uint8_t *data, size_t len)
{
    (void)closure;
    (void)subject;
    (void)data;
    (void)len;
    atomic_store(&batch_held, delay_holding(2));
    return false; /* enough */
}

/* A reader of a batch's events (ci batch status, ci batch results) stops
 * after the first of three while the read loop holds the second. */
static void t_batch_read_stopped_while_the_next_event_is_handed_over(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    struct ci_error e = {{0}};
    for (int i = 0; i < 3; i++)
        REQUIRE(ci_broker_batch_publish(b, "bdrain", "taken", NULL, NULL, "x", 1, NULL, &e) ==
                CI_OK);
    char prefix[160];
    snprintf(prefix, sizeof(prefix), "%s.bdrain.", cfg->jetstream.batch_events_prefix);
    atomic_store(&batch_held, false);
    delay_set(prefix, false, DELAY_MS);
    size_t read = 0;
    bool cut = false;
    CHECK(ci_broker_batch_read(b, "bdrain", "taken", 3, on_batch_event, NULL, &read, &cut, &e) ==
          CI_OK);
    CHECK(read == 1 && cut);
    bool exercised = atomic_load(&batch_held);
    delay_wait_done();
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
    if (!exercised)
        SKIP("the next event was not held when the reader stopped: nothing checked");
}

/* ci run's wait (ci_client_wait) ends at the first terminal event while the
 * read loop holds another. */
static void t_watch_freed_while_the_next_event_is_handed_over(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    struct ci_error e = {{0}};
    for (int i = 0; i < 2; i++)
        REQUIRE(ci_broker_event_publish(b, "t-wdrain", "RUNNING", "application/json", NULL,
                                        "{}", 2, &e) == CI_OK);
    char prefix[160];
    snprintf(prefix, sizeof(prefix), "%s.t-wdrain", cfg->jetstream.status_prefix);
    delay_set(prefix, false, DELAY_MS);
    struct ci_watch *w = NULL;
    REQUIRE(ci_watch_new(b, "t-wdrain", &w, &e) == CI_OK);
    const uint8_t *data = NULL;
    size_t len = 0;
    const char *ct = NULL;
    CHECK(ci_watch_next(w, 5000, &data, &len, &ct, &e) == CI_OK);
    bool exercised = delay_holding(2);
    ci_watch_free(w);
    delay_wait_done();
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
    if (!exercised)
        SKIP("the next event was not held when the watch was freed: nothing checked");
}

static bool on_result(void *closure, size_t i, ci_status s, const uint8_t *data, size_t len)
{
    (void)closure;
    (void)i;
    (void)s;
    (void)data;
    (void)len;
    return true;
}

/* ci batch submit's look-up of results already stored
 * (ci_broker_results_get_many) gives up on a lookup the server answered
 * but the read loop holds past the wait (5 s): it returns with it in
 * flight. */
static void t_results_lookup_abandoned_while_its_answer_is_handed_over(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    struct ci_error e = {{0}};
    const char ids[1][65] = {"t-rdrain"};
    /* Only the lookup's answer comes on an inbox meanwhile. */
    delay_set("_INBOX.", false, 5600);
    ci_status s = ci_broker_results_get_many(b, ids, 1, 1, on_result, NULL, &e);
    bool exercised = s == CI_ERR_TIMEOUT && atomic_load(&delay_entered) > 0;
    delay_wait_done();
    /* The broker still looks results up. */
    if (exercised)
        CHECK(ci_broker_results_get_many(b, ids, 1, 1, on_result, NULL, &e) == CI_OK);
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
    if (!exercised)
        SKIP("the lookup's answer was not held past its wait: nothing checked");
}

static void server_kill(struct server *s)
{
    kill(s->pid, SIGKILL);
    waitpid(s->pid, NULL, 0);
    s->pid = 0;
}

/* A subscription let go of while NATS is away waits (no round trip can
 * prove the read loop is done with it), without waiting out the round
 * trip's 2 s; once NATS answers again, the worker's ticker call destroys
 * it. */
static void t_released_once_nats_answers_again(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    server_kill(&srv);
    for (int i = 0; i < 500 && ci_broker_connected(b); i++)
        sleep_ms(10);
    CHECK(!ci_broker_connected(b));
    struct ci_error e = {{0}};
    const char ids[1][65] = {"t-away"};
    ci_status s = ci_broker_results_get_many(b, ids, 1, 1, on_result, NULL, &e);
    CHECK(s != CI_OK);
    CHECK(ci_broker_pending_releases(b) == 1);
    int64_t t0 = ci_mono_ms();
    ci_broker_release_pending(b); /* still away: no round trip, no wait */
    CHECK(ci_mono_ms() - t0 < 1000);
    CHECK(ci_broker_pending_releases(b) == 1);
    REQUIRE(server_spawn(&srv)); /* the same port and store */
    for (int i = 0; i < 1000 && !ci_broker_connected(b); i++)
        sleep_ms(10);
    CHECK(ci_broker_connected(b));
    ci_broker_release_pending(b);
    CHECK(ci_broker_pending_releases(b) == 0);
    /* A lookup now lets go of its inbox at once. */
    CHECK(ci_broker_results_get_many(b, ids, 1, 1, on_result, NULL, &e) == CI_OK);
    CHECK(ci_broker_pending_releases(b) == 0);
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    static const struct t_case cases[] = {
        T_OWN(t_puller_freed_while_its_408_is_handed_over),
        T_OWN(t_handler_freed_while_a_message_is_handed_over),
        T_OWN(t_nowait_inbox_dropped_while_its_answer_is_handed_over),
        T_OWN(t_batch_read_stopped_while_the_next_event_is_handed_over),
        T_OWN(t_watch_freed_while_the_next_event_is_handed_over),
        T_OWN(t_results_lookup_abandoned_while_its_answer_is_handed_over),
        T_OWN(t_released_once_nats_answers_again),
    };
    int rc = t_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
    ci_broker_library_close();
    return rc;
}
