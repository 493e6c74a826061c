/* test_broker_batches.c - the broker's batch side (contract §20, §21)
 * against a real nats-server 2.9 (-js, its own port and store per case):
 * the streams CI_BATCH and CI_BATCHES and the consumer ci-workers-batch,
 * and their update from other settings; the per-subject counts of a stream
 * info with subjects_filter (nats.c 3.4.1's jsOptions.Stream.Info.
 * SubjectsFilter, which the server must answer), deduplicated by
 * Nats-Msg-Id; the last seal and cancel, read from the stream's leader; the cancel
 * subscription; pulls that do not wait, and their acks by hand. Each case
 * exits 77 (skipped) without a nats-server. */
#include <stdatomic.h>

#include "core/batch.h"
#include "core/util.h"
#include "nats/broker.h"
#include "nats_test_server.h"

#define NS 1000000000LL

/* The streams and the consumer as contract §3, §4 and §21 say. */
static void t_setup_makes_batch_streams(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct raw r = {0};
    REQUIRE(raw_open(&r, srv.url));
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    jsErrCode jerr = 0;
    jsStreamInfo *si = NULL;
    REQUIRE(js_GetStreamInfo(&si, r.js, "CI_BATCH", NULL, &jerr) == NATS_OK);
    CHECK(si->Config->SubjectsLen == 1);
    CHECK_STR(si->Config->Subjects[0], "ci.batch.*");
    CHECK(si->Config->Retention == js_WorkQueuePolicy);
    CHECK(si->Config->Storage == js_FileStorage);
    CHECK(si->Config->MaxAge == 86400 * NS);
    CHECK(si->Config->Duplicates == 3600 * NS);
    CHECK(si->Config->Discard == js_DiscardOld);
    CHECK(si->Config->AllowDirect);
    CHECK(si->Config->MaxMsgSize > 0);
    jsStreamInfo_Destroy(si);
    si = NULL;
    REQUIRE(js_GetStreamInfo(&si, r.js, "CI_BATCHES", NULL, &jerr) == NATS_OK);
    CHECK(si->Config->SubjectsLen == 1);
    CHECK_STR(si->Config->Subjects[0], "ci.batches.>");
    CHECK(si->Config->Retention == js_LimitsPolicy);
    CHECK(si->Config->MaxAge == 86400 * NS);
    CHECK(si->Config->Duplicates == 3600 * NS);
    CHECK(si->Config->AllowDirect);
    jsStreamInfo_Destroy(si);
    jsConsumerInfo *ci = NULL, *ti = NULL;
    REQUIRE(js_GetConsumerInfo(&ci, r.js, "CI_BATCH", "ci-workers-batch", NULL, &jerr) == NATS_OK);
    REQUIRE(js_GetConsumerInfo(&ti, r.js, "CI_TASKS", "ci-workers", NULL, &jerr) == NATS_OK);
    CHECK(ci->Config->AckPolicy == js_AckExplicit);
    CHECK(ci->Config->DeliverPolicy == js_DeliverAll);
    CHECK(ci->Config->AckWait == ti->Config->AckWait);
    CHECK(ci->Config->MaxDeliver == ti->Config->MaxDeliver);
    CHECK(ci->Config->MaxWaiting == ti->Config->MaxWaiting);
    CHECK(ci->Config->MaxAckPending == ti->Config->MaxAckPending);
    CHECK(ci->Config->FilterSubject == NULL || ci->Config->FilterSubject[0] == '\0');
    jsConsumerInfo_Destroy(ci);
    jsConsumerInfo_Destroy(ti);
    ci_broker_free(b);
    raw_close(&r);
    ci_config_free(cfg);
    server_stop(&srv);
}

/* Streams that exist with other settings (an operator's, an older
 * worker's) are updated in place; what they hold stays. */
static void t_setup_updates_other_settings(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct raw r = {0};
    REQUIRE(raw_open(&r, srv.url));
    const char *bs[] = {"ci.batch.*"}, *es[] = {"ci.batches.>"};
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = "CI_BATCH";
    sc.Subjects = bs;
    sc.SubjectsLen = 1;
    sc.Retention = js_WorkQueuePolicy;
    sc.Storage = js_FileStorage;
    sc.MaxAge = 3600 * NS;
    sc.Duplicates = 120 * NS;
    jsErrCode jerr = 0;
    REQUIRE(js_AddStream(NULL, r.js, &sc, NULL, &jerr) == NATS_OK);
    jsStreamConfig_Init(&sc);
    sc.Name = "CI_BATCHES";
    sc.Subjects = es;
    sc.SubjectsLen = 1;
    sc.Storage = js_FileStorage;
    sc.MaxAge = 600 * NS;
    REQUIRE(js_AddStream(NULL, r.js, &sc, NULL, &jerr) == NATS_OK);
    REQUIRE(js_Publish(NULL, r.js, "ci.batches.b1.taken", "t-1", 3, NULL, &jerr) == NATS_OK);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    jsStreamInfo *si = NULL;
    REQUIRE(js_GetStreamInfo(&si, r.js, "CI_BATCH", NULL, &jerr) == NATS_OK);
    CHECK(si->Config->MaxAge == 86400 * NS);
    CHECK(si->Config->Duplicates == 3600 * NS);
    CHECK(si->Config->AllowDirect);
    jsStreamInfo_Destroy(si);
    si = NULL;
    REQUIRE(js_GetStreamInfo(&si, r.js, "CI_BATCHES", NULL, &jerr) == NATS_OK);
    CHECK(si->Config->MaxAge == 86400 * NS);
    CHECK(si->Config->Duplicates == 3600 * NS);
    CHECK(si->Config->AllowDirect);
    CHECK(si->State.Msgs == 1);
    jsStreamInfo_Destroy(si);
    ci_broker_free(b);
    raw_close(&r);
    ci_config_free(cfg);
    server_stop(&srv);
}

static ci_status event(struct ci_broker *b, const char *batch, const char *ev, const char *msg_id,
                       const char *body, bool *dup)
{
    struct ci_error e = {{0}};
    ci_status s = ci_broker_batch_publish(b, batch, ev, msg_id, "application/json", body,
                                          strlen(body), dup, &e);
    if (s)
        fprintf(stderr, "publish %s %s: %s\n", batch, ev, e.msg);
    return s;
}

/* The counts are message counts per subject from one stream info with
 * subjects_filter: nats.c 3.4.1 sends it and nats-server 2.9.10 answers
 * with state.subjects. A second event of a task with the same Nats-Msg-Id
 * is dropped (a redelivery publishes again), and another batch whose id
 * starts the same is not counted. */
static void t_counts_by_subject(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    struct ci_batch_counts c;
    struct ci_error e = {{0}};
    memset(&c, 0xff, sizeof(c));
    REQUIRE(ci_broker_batch_counts(b, "b1", &c, &e) == CI_OK);
    CHECK(c.taken == 0 && c.succeeded == 0 && c.sealed == 0 && c.cancel == 0);
    bool dup = true;
    CHECK(event(b, "b1", "taken", "t-1.taken", "t-1", &dup) == CI_OK && !dup);
    CHECK(event(b, "b1", "taken", "t-2.taken", "t-2", &dup) == CI_OK && !dup);
    CHECK(event(b, "b1", "taken", "t-3.taken", "t-3", &dup) == CI_OK && !dup);
    CHECK(event(b, "b1", "taken", "t-1.taken", "t-1", &dup) == CI_OK && dup); /* attempt 2 */
    CHECK(event(b, "b1", "succeeded", "t-1.end", "{}", &dup) == CI_OK && !dup);
    CHECK(event(b, "b1", "succeeded", "t-1.end", "{}", &dup) == CI_OK && dup);
    CHECK(event(b, "b1", "failed", "t-2.end", "{}", NULL) == CI_OK);
    CHECK(event(b, "b1", "timed_out", "t-3.end", "{}", NULL) == CI_OK);
    CHECK(event(b, "b10", "taken", "u-1.taken", "u-1", NULL) == CI_OK);
    CHECK(event(b, "b10", "cancelled", "u-1.end", "{}", NULL) == CI_OK);
    CHECK(event(b, "b1", "sealed", "b1.sealed", "{\"total\":\"3\"}", NULL) == CI_OK);
    CHECK(event(b, "b1", "cancel", NULL, "", NULL) == CI_OK);
    CHECK(event(b, "b1", "cancel", NULL, "", NULL) == CI_OK); /* no id: every one is kept */
    REQUIRE(ci_broker_batch_counts(b, "b1", &c, &e) == CI_OK);
    CHECK(c.taken == 3);
    CHECK(c.succeeded == 1);
    CHECK(c.failed == 1);
    CHECK(c.timed_out == 1);
    CHECK(c.cancelled == 0);
    CHECK(c.sealed == 1);
    CHECK(c.complete == 0);
    CHECK(c.cancel == 2);
    CHECK(ci_batch_is_complete(&c, 3));
    REQUIRE(ci_broker_batch_counts(b, "b10", &c, &e) == CI_OK);
    CHECK(c.taken == 1 && c.cancelled == 1 && c.succeeded == 0 && c.sealed == 0);
    CHECK(ci_broker_batch_counts(b, "b.1", &c, &e) == CI_ERR_INVALID);
    CHECK(ci_broker_batch_counts(b, "*", &c, &e) == CI_ERR_INVALID);
    CHECK(ci_broker_batch_publish(b, "b>", "taken", NULL, NULL, "", 0, NULL, &e) ==
          CI_ERR_INVALID);
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
}

/* The seal and a cancel are read as the subject's last message (from the
 * stream's leader: t_last_read_from_leader), the last of several, as a
 * NUL-terminated copy. */
static void t_last_seal_and_cancel(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    uint8_t *data = NULL;
    size_t len = 0;
    struct ci_error e = {{0}};
    CHECK(ci_broker_batch_last(b, "b1", "sealed", &data, &len, &e) == CI_ERR_NOT_FOUND);
    CHECK(ci_broker_batch_last(b, "b1", "cancel", &data, &len, &e) == CI_ERR_NOT_FOUND);
    CHECK(event(b, "b1", "sealed", "b1.sealed", "{\"total\":\"200\"}", NULL) == CI_OK);
    CHECK(event(b, "b2", "cancel", NULL, "", NULL) == CI_OK);
    REQUIRE(ci_broker_batch_last(b, "b1", "sealed", &data, &len, &e) == CI_OK);
    uint64_t total = 0;
    CHECK(ci_batch_seal_total(data, len, &total, &e) == CI_OK && total == 200);
    free(data);
    data = NULL;
    CHECK(ci_broker_batch_last(b, "b1", "cancel", &data, &len, &e) == CI_ERR_NOT_FOUND);
    CHECK(ci_broker_batch_last(b, "b2", "cancel", &data, &len, &e) == CI_OK);
    CHECK(len == 0);
    free(data);
    data = NULL;

    CHECK(ci_broker_batch_last(b, "b3", "sealed", &data, &len, &e) == CI_ERR_NOT_FOUND);
    REQUIRE(ci_broker_batch_last(b, "b1", "sealed", &data, &len, &e) == CI_OK);
    CHECK(len == strlen("{\"total\":\"200\"}") && memcmp(data, "{\"total\":\"200\"}", len) == 0);
    CHECK(data[len] == '\0');
    free(data);
    data = NULL;
    CHECK(event(b, "b3", "sealed", NULL, "{\"total\":\"1\"}", NULL) == CI_OK);
    CHECK(event(b, "b3", "sealed", NULL, "{\"total\":\"2\"}", NULL) == CI_OK);
    REQUIRE(ci_broker_batch_last(b, "b3", "sealed", &data, &len, &e) == CI_OK);
    CHECK(ci_batch_seal_total(data, len, &total, &e) == CI_OK && total == 2);
    free(data);
    data = NULL;
    /* When the stream stored it (a worker keeps the seal only while the
     * stream does): the server's clock, this machine's here. */
    int64_t stored_ms = 0, before = ci_now_ms();
    CHECK(event(b, "b4", "sealed", NULL, "{\"total\":\"3\"}", NULL) == CI_OK);
    REQUIRE(ci_broker_batch_last_at(b, "b4", "sealed", &data, &len, &stored_ms, &e) == CI_OK);
    CHECK(stored_ms >= before - 1000 && stored_ms <= ci_now_ms() + 1000);
    free(data);
    data = NULL;
    CHECK(ci_broker_batch_last(b, "b..d", "sealed", &data, &len, &e) == CI_ERR_INVALID);
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
}

/* Counts the requests a raw connection sees on a subject. */
static void on_request(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure)
{
    atomic_fetch_add((atomic_int *)closure, 1);
    natsMsg_Destroy(msg);
}

/* A worker reads a batch's cancel (and the seal) from the stream's leader,
 * as a task's own cancel, never with a direct get: any replica answers a
 * direct get, and one that lags says "none" for a cancel just stored, so a
 * task taken right after the cancel would run. The requests are watched on
 * their API subjects: direct gets on $JS.API.DIRECT.GET.<stream>, leader
 * reads on $JS.API.STREAM.MSG.GET.<stream>. */
static void t_last_read_from_leader(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct raw r = {0};
    REQUIRE(raw_open(&r, srv.url));
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    atomic_int direct = 0, leader = 0;
    natsSubscription *ds = NULL, *ls = NULL;
    REQUIRE(natsConnection_Subscribe(&ds, r.nc, "$JS.API.DIRECT.GET.CI_BATCHES.>", on_request,
                                     &direct) == NATS_OK);
    REQUIRE(natsConnection_Subscribe(&ls, r.nc, "$JS.API.STREAM.MSG.GET.CI_BATCHES", on_request,
                                     &leader) == NATS_OK);
    natsSubscription *ds2 = NULL;
    REQUIRE(natsConnection_Subscribe(&ds2, r.nc, "$JS.API.DIRECT.GET.CI_BATCHES", on_request,
                                     &direct) == NATS_OK);
    REQUIRE(natsConnection_Flush(r.nc) == NATS_OK);
    CHECK(event(b, "b2", "cancel", NULL, "", NULL) == CI_OK);
    uint8_t *data = NULL;
    size_t len = 0;
    struct ci_error e = {{0}};
    CHECK(ci_broker_batch_last(b, "b1", "cancel", &data, &len, &e) == CI_ERR_NOT_FOUND);
    REQUIRE(ci_broker_batch_last(b, "b2", "cancel", &data, &len, &e) == CI_OK);
    free(data);
    /* The raw connection has seen both requests once it has seen the
     * second (one connection to the server delivers in order). */
    for (int i = 0; i < 200 && atomic_load(&leader) + atomic_load(&direct) < 2; i++)
        sleep_ms(10);
    CHECK(atomic_load(&leader) == 2);
    CHECK(atomic_load(&direct) == 0);
    natsSubscription_Destroy(ds);
    natsSubscription_Destroy(ds2);
    natsSubscription_Destroy(ls);
    ci_broker_free(b);
    raw_close(&r);
    ci_config_free(cfg);
    server_stop(&srv);
}

struct seen {
    atomic_int n;
    char last[65];
};

static void on_batch_cancel(const char *batch_id, void *closure)
{
    struct seen *s = closure;
    snprintf(s->last, sizeof(s->last), "%s", batch_id);
    atomic_fetch_add(&s->n, 1);
}

/* Every worker hears a cancel of any batch (a core subscription on
 * ci.batches.*.cancel); other events are not cancels. */
static void t_cancel_subscription(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    struct seen seen = {0};
    struct ci_error e = {{0}};
    REQUIRE(ci_broker_on_batch_cancel(b, on_batch_cancel, &seen, &e) == CI_OK);
    CHECK(event(b, "b7", "taken", "x.taken", "x", NULL) == CI_OK);
    CHECK(event(b, "b7", "cancel", NULL, "", NULL) == CI_OK);
    for (int i = 0; i < 200 && atomic_load(&seen.n) == 0; i++)
        sleep_ms(10);
    sleep_ms(100); /* nothing else comes */
    CHECK(atomic_load(&seen.n) == 1);
    CHECK_STR(seen.last, "b7");
    ci_broker_free(b); /* waits for the handler */
    ci_config_free(cfg);
    server_stop(&srv);
}

static ci_status submit(struct ci_broker *b, const char *batch, const char *task)
{
    struct ci_error e = {{0}};
    bool dup = true;
    ci_status s = ci_broker_submit_batch(b, batch, task, "application/json", "{}", 2, &dup, &e);
    if (s)
        fprintf(stderr, "submit %s: %s\n", task, e.msg);
    return s ? s : dup ? CI_ERR_CONFLICT : CI_OK;
}

/* A pull that does not wait takes what is there at once, and says none at
 * once on an empty lane (no expiry to sit out); its acks, naks, terms and
 * in-progress acks are published by hand and work as nats.c's. */
static void t_pull_without_waiting(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    struct ci_error e = {{0}};
    struct ci_puller *p = NULL, *ip = NULL;
    REQUIRE(ci_puller_new_batch(b, &p, &e) == CI_OK);
    REQUIRE(ci_puller_new(b, &ip, &e) == CI_OK);
    struct ci_delivery *d = NULL;
    int64_t t0 = ci_mono_ms();
    CHECK(ci_puller_fetch_nowait(p, &d, &e) == CI_ERR_TIMEOUT);
    CHECK(ci_puller_fetch_nowait(ip, &d, &e) == CI_ERR_TIMEOUT);
    CHECK(ci_mono_ms() - t0 < 1000); /* two round trips, not an expiry */
    CHECK(submit(b, "b1", "t-1") == CI_OK);
    CHECK(submit(b, "b1", "t-2") == CI_OK);
    CHECK(submit(b, "b2", "t-3") == CI_OK);
    CHECK(submit(b, "b1", "t-1") == CI_ERR_CONFLICT); /* the window drops a resubmit */
    uint64_t queued = 0;
    CHECK(ci_broker_batch_queued(b, "b1", &queued, &e) == CI_OK && queued == 2);
    struct ci_queue_stats qs, is;
    REQUIRE(ci_broker_batch_queue_stats(b, &qs, &e) == CI_OK);
    CHECK(qs.stream_msgs == 3 && qs.pending == 3 && qs.ack_pending == 0);
    REQUIRE(ci_broker_queue_stats(b, &is, &e) == CI_OK);
    CHECK(is.stream_msgs == 0 && is.pending == 0); /* the other lane */
    CHECK(ci_puller_fetch_nowait(ip, &d, &e) == CI_ERR_TIMEOUT); /* the other lane */

    REQUIRE(ci_puller_fetch_nowait(p, &d, &e) == CI_OK);
    CHECK_STR(ci_delivery_subject(d), "ci.batch.b1");
    CHECK_STR(ci_delivery_header(d, "Nats-Msg-Id"), "t-1");
    CHECK(ci_delivery_attempt(d) == 1);
    CHECK(ci_delivery_seq(d) == 1);
    CHECK(ci_delivery_queued_ms(d) == -1);
    CHECK(ci_delivery_published_ms(d) > 0);
    CHECK(ci_delivery_in_progress(d) == CI_OK);
    CHECK(ci_delivery_nak(d, 0) == CI_OK); /* at once: redelivered as attempt 2 */
    ci_delivery_free(d);
    d = NULL;
    /* The server handles acks apart from pulls: t-2 may come before t-1's
     * redelivery. Take until the three are in hand. */
    struct ci_delivery *got[3] = {0}; /* t-1 (attempt 2), t-2, t-3 */
    for (int i = 0; i < 200 && !(got[0] && got[1] && got[2]); i++) {
        ci_status st = ci_puller_fetch_nowait(p, &d, &e);
        if (st == CI_ERR_TIMEOUT) {
            sleep_ms(10);
            continue;
        }
        REQUIRE(st == CI_OK);
        const char *id = ci_delivery_header(d, "Nats-Msg-Id");
        int k = id[2] - '1';
        REQUIRE(k >= 0 && k < 3 && !got[k]);
        CHECK(ci_delivery_attempt(d) == (k == 0 ? 2u : 1u));
        CHECK_STR(ci_delivery_subject(d), k == 2 ? "ci.batch.b2" : "ci.batch.b1");
        got[k] = d;
        d = NULL;
    }
    REQUIRE(got[0] && got[1] && got[2]);
    CHECK(ci_delivery_ack(got[0]) == CI_OK);
    CHECK(ci_delivery_nak(got[1], 60000) == CI_OK); /* later: not now */
    CHECK(ci_delivery_term(got[2]) == CI_OK); /* term removes it from a WorkQueue stream */
    for (int i = 0; i < 3; i++)
        ci_delivery_free(got[i]);
    sleep_ms(100);
    CHECK(ci_puller_fetch_nowait(p, &d, &e) == CI_ERR_TIMEOUT);
    /* The ack and the term removed theirs: t-2 waits for its delay. */
    for (int i = 0; i < 50; i++) {
        if (ci_broker_batch_queued(b, "b1", &queued, &e) == CI_OK && queued == 1)
            break;
        sleep_ms(20);
    }
    CHECK(queued == 1);
    CHECK(ci_broker_batch_queued(b, "b2", &queued, &e) == CI_OK && queued == 0);
    /* A long poll on the batch lane works too (the JetStream subscription). */
    CHECK(submit(b, "b3", "t-4") == CI_OK);
    REQUIRE(ci_puller_fetch(p, 2000, &d, &e) == CI_OK);
    CHECK_STR(ci_delivery_header(d, "Nats-Msg-Id"), "t-4");
    CHECK(ci_delivery_ack(d) == CI_OK);
    ci_delivery_free(d);
    ci_puller_free(p);
    ci_puller_free(ip);
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
}

/* A task that CI_BATCH drops as a copy (the same Nats-Msg-Id within its
 * window) is refused when the message the stream kept is on another
 * batch's subject: that batch's queued task has the id (contract §20). A
 * copy on the same subject, or one whose message is gone (taken and
 * acked), is a duplicate for the caller to judge. */
static void t_submit_copy_of_another_batch(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    struct ci_error e = {{0}};
    bool dup = true;
    CHECK(ci_broker_submit_batch(b, "b1", "t-1", "application/json", "{}", 2, &dup, &e) ==
          CI_OK);
    CHECK(!dup);
    CHECK(ci_broker_submit_batch(b, "b1", "t-1", "application/json", "{}", 2, &dup, &e) ==
          CI_OK);
    CHECK(dup); /* its own copy, still queued */
    dup = false;
    CHECK(ci_broker_submit_batch(b, "b2", "t-1", "application/json", "{}", 2, &dup, &e) ==
          CI_ERR_CONFLICT);
    CHECK(strstr(e.msg, "task id 't-1' is in use: a task of batch 'b1', queued or running, has "
                        "it (CI_BATCH dropped this task as a copy of its message 1 on "
                        "'ci.batch.b1')") != NULL);
    uint64_t queued = 0;
    CHECK(ci_broker_batch_queued(b, "b2", &queued, &e) == CI_OK && queued == 0);
    CHECK(ci_broker_batch_queued(b, "b1", &queued, &e) == CI_OK && queued == 1);
    /* Taken and acked: the stream keeps the id, not the message. */
    struct ci_puller *p = NULL;
    struct ci_delivery *d = NULL;
    REQUIRE(ci_puller_new_batch(b, &p, &e) == CI_OK);
    REQUIRE(ci_puller_fetch_nowait(p, &d, &e) == CI_OK);
    CHECK(ci_delivery_ack(d) == CI_OK);
    ci_delivery_free(d);
    for (int i = 0; i < 100; i++) {
        if (ci_broker_batch_queued(b, "b1", &queued, &e) == CI_OK && queued == 0)
            break;
        sleep_ms(20);
    }
    REQUIRE(queued == 0);
    dup = false;
    CHECK(ci_broker_submit_batch(b, "b2", "t-1", "application/json", "{}", 2, &dup, &e) ==
          CI_OK);
    CHECK(dup);
    CHECK(ci_broker_batch_queued(b, "b2", &queued, &e) == CI_OK && queued == 0);
    ci_puller_free(p);
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
}

/* A message that a long poll's request brought after its fetch gave up
 * (a request that outlived its Fetch on the server) waits in the puller's
 * queue: the next pull that does not wait takes it first, as queued. */
static void t_nowait_takes_queued_first(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct raw r = {0};
    REQUIRE(raw_open(&r, srv.url));
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    struct ci_error e = {{0}};
    struct ci_puller *p = NULL;
    REQUIRE(ci_puller_new(b, &p, &e) == CI_OK);
    struct ci_delivery *d = NULL;
    CHECK(ci_puller_fetch(p, 100, &d, &e) == CI_ERR_TIMEOUT);
    REQUIRE(ci_puller_inbox(p));
    const char *req = "{\"batch\":1,\"expires\":60000000000}";
    REQUIRE(natsConnection_PublishRequestString(r.nc, "$JS.API.CONSUMER.MSG.NEXT.CI_TASKS.ci-workers",
                                                ci_puller_inbox(p), req) == NATS_OK);
    REQUIRE(natsConnection_Flush(r.nc) == NATS_OK);
    sleep_ms(100);
    bool dup = true;
    REQUIRE(ci_broker_submit(b, "t-q", "application/json", "{}", 2, &dup, &e) == CI_OK);
    sleep_ms(300); /* delivered to the stray request: into the puller's queue */
    REQUIRE(ci_puller_fetch_nowait(p, &d, &e) == CI_OK);
    CHECK_STR(ci_delivery_header(d, "Nats-Msg-Id"), "t-q");
    CHECK(ci_delivery_queued_ms(d) >= 0); /* it waited: the slot checks it is fresh */
    CHECK(ci_delivery_ack(d) == CI_OK);
    ci_delivery_free(d);
    d = NULL;
    CHECK(ci_puller_fetch_nowait(p, &d, &e) == CI_ERR_TIMEOUT);
    ci_puller_free(p);
    ci_broker_free(b);
    raw_close(&r);
    ci_config_free(cfg);
    server_stop(&srv);
}

/* A deleted CI_BATCHES is made again by a worker that publishes an event,
 * and the event is stored. */
static void t_deleted_events_stream(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct raw r = {0};
    REQUIRE(raw_open(&r, srv.url));
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    jsErrCode jerr = 0;
    REQUIRE(js_DeleteStream(r.js, "CI_BATCHES", NULL, &jerr) == NATS_OK);
    CHECK(event(b, "b1", "taken", "t-1.taken", "t-1", NULL) == CI_OK);
    CHECK(ci_broker_recreated(b) == 1);
    struct ci_batch_counts c;
    struct ci_error e = {{0}};
    CHECK(ci_broker_batch_counts(b, "b1", &c, &e) == CI_OK && c.taken == 1);
    REQUIRE(js_DeleteStream(r.js, "CI_BATCH", NULL, &jerr) == NATS_OK);
    CHECK(ci_broker_check(b));
    jsConsumerInfo *ci = NULL;
    CHECK(js_GetConsumerInfo(&ci, r.js, "CI_BATCH", "ci-workers-batch", NULL, &jerr) == NATS_OK);
    jsConsumerInfo_Destroy(ci);
    ci_broker_free(b);
    raw_close(&r);
    ci_config_free(cfg);
    server_stop(&srv);
}

/* What ci_broker_results_get_many gave for each id. */
struct many {
    int calls, stop_at; /* stop_at: the call that returns false (0: none) */
    ci_status s[300];
    char data[300][16];
    int seen[300];
};

static bool on_many(void *closure, size_t i, ci_status s, const uint8_t *data, size_t len)
{
    struct many *m = closure;
    m->calls++;
    if (i < 300) {
        m->s[i] = s;
        m->seen[i]++;
        snprintf(m->data[i], sizeof(m->data[i]), "%.*s", (int)len, data ? (const char *)data : "");
    }
    return m->calls != m->stop_at;
}

/* `ci batch submit`'s lookups (contract §20): many records read with a
 * window of requests in flight, each answer given to its id: a record, none,
 * a deleted or purged one (none); asking stops when fn says so, with the
 * requests in flight still answered. */
static void t_results_get_many(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct raw r = {0};
    REQUIRE(raw_open(&r, srv.url));
    struct ci_broker *b = worker_broker(cfg);
    REQUIRE(b);
    kvStore *kv = NULL;
    REQUIRE(js_KeyValue(&kv, r.js, cfg->jetstream.results_bucket) == NATS_OK);
    static char ids[300][65];
    for (int i = 0; i < 300; i++) {
        snprintf(ids[i], sizeof(ids[i]), "t-%d", i);
        char v[16];
        snprintf(v, sizeof(v), "rec-%d", i);
        if (i % 3 == 0)
            REQUIRE(kvStore_PutString(NULL, kv, ids[i], v) == NATS_OK);
    }
    REQUIRE(kvStore_PutString(NULL, kv, "t-1", "gone") == NATS_OK);
    REQUIRE(kvStore_Delete(kv, "t-1") == NATS_OK);
    REQUIRE(kvStore_PutString(NULL, kv, "t-2", "gone") == NATS_OK);
    REQUIRE(kvStore_Purge(kv, "t-2", NULL) == NATS_OK);
    static struct many m;
    memset(&m, 0, sizeof(m));
    struct ci_error e = {{0}};
    CHECK(ci_broker_results_get_many(b, (const char(*)[65])ids, 300, 8, on_many, &m, &e) ==
          CI_OK);
    CHECK(m.calls == 300);
    for (int i = 0; i < 300; i++) {
        CHECK(m.seen[i] == 1);
        if (i % 3 == 0) {
            char v[16];
            snprintf(v, sizeof(v), "rec-%d", i);
            CHECK(m.s[i] == CI_OK);
            CHECK_STR(m.data[i], v);
        } else {
            CHECK(m.s[i] == CI_ERR_NOT_FOUND);
        }
    }
    /* Stopped at the first answer: the other 7 requests in flight are
     * answered, and nothing more is asked. */
    memset(&m, 0, sizeof(m));
    m.stop_at = 1;
    CHECK(ci_broker_results_get_many(b, (const char(*)[65])ids, 300, 8, on_many, &m, &e) ==
          CI_OK);
    CHECK(m.calls == 8);
    CHECK(ci_broker_results_get_many(b, (const char(*)[65])ids, 0, 8, on_many, &m, &e) == CI_OK);
    kvStore_Destroy(kv);
    ci_broker_free(b);
    raw_close(&r);
    ci_config_free(cfg);
    server_stop(&srv);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    static const struct t_case cases[] = {
        T_OWN(t_setup_makes_batch_streams), T_OWN(t_setup_updates_other_settings),
        T_OWN(t_counts_by_subject),         T_OWN(t_last_seal_and_cancel),
        T_OWN(t_cancel_subscription),       T_OWN(t_pull_without_waiting),
        T_OWN(t_nowait_takes_queued_first), T_OWN(t_deleted_events_stream),
        T_OWN(t_last_read_from_leader),     T_OWN(t_results_get_many),
        T_OWN(t_submit_copy_of_another_batch),
    };
    int rc = t_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
    ci_broker_library_close();
    return rc;
}
