/* test_broker_sessions.c - the broker's session side (contract §16)
 * against a real nats-server (-js, its own port and store per case): the
 * tasks stream's subjects and its update from an older worker's stream,
 * submit on a session's subject, the first sequence by direct get before
 * and after acks, the sessions bucket (compare-and-set, put, list), a
 * client without the bucket, and a deleted bucket made again. Each case
 * exits 77 (skipped) without a nats-server. */
#include "core/util.h"
#include "nats/broker.h"
#include "nats_test_server.h"

static bool stream_has_subject(jsStreamInfo *si, const char *subj)
{
    for (int i = 0; i < si->Config->SubjectsLen; i++)
        if (strcmp(si->Config->Subjects[i], subj) == 0)
            return true;
    return false;
}

/* A worker of the previous version made CI_TASKS with ci.submit alone and
 * no direct gets, its consumer, and left a task in it: this version's
 * setup takes the stream over in place, the task still there. */
static void t_setup_upgrades_old_stream(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct raw r = {0};
    REQUIRE(raw_open(&r, srv.url));
    const char *old_subjects[] = {"ci.submit"};
    jsStreamConfig sc;
    jsStreamConfig_Init(&sc);
    sc.Name = "CI_TASKS";
    sc.Subjects = old_subjects;
    sc.SubjectsLen = 1;
    sc.Retention = js_WorkQueuePolicy;
    sc.Storage = js_FileStorage;
    sc.MaxAge = 3600LL * 1000000000LL;
    jsErrCode jerr = 0;
    CHECK(js_AddStream(NULL, r.js, &sc, NULL, &jerr) == NATS_OK);
    jsConsumerConfig cc; /* as the previous version's setup made it */
    jsConsumerConfig_Init(&cc);
    cc.Durable = "ci-workers";
    cc.Description = "ci-worker task queue";
    cc.AckPolicy = js_AckExplicit;
    cc.DeliverPolicy = js_DeliverAll;
    cc.AckWait = (int64_t)cfg->jetstream.ack_wait_s * 1000000000LL;
    cc.MaxDeliver = cfg->jetstream.max_deliver;
    cc.MaxAckPending = -1;
    cc.MaxWaiting = 4096;
    CHECK(js_AddConsumer(NULL, r.js, "CI_TASKS", &cc, NULL, &jerr) == NATS_OK);
    CHECK(js_Publish(NULL, r.js, "ci.submit", "old", 3, NULL, &jerr) == NATS_OK);
    /* Before the update a session subject has no stream. */
    CHECK(js_Publish(NULL, r.js, "ci.submit.s1", "x", 1, NULL, &jerr) != NATS_OK);

    struct ci_broker *b = NULL;
    struct ci_error e = {{0}};
    REQUIRE(ci_broker_connect(cfg, &b, &e) == CI_OK);
    CHECK(ci_broker_setup(b, true, &e) == CI_OK);
    if (e.msg[0])
        fprintf(stderr, "setup: %s\n", e.msg);
    jsStreamInfo *si = NULL;
    REQUIRE(js_GetStreamInfo(&si, r.js, "CI_TASKS", NULL, &jerr) == NATS_OK);
    CHECK(si->Config->SubjectsLen == 2);
    CHECK(stream_has_subject(si, "ci.submit"));
    CHECK(stream_has_subject(si, "ci.submit.*"));
    CHECK(si->Config->AllowDirect);
    CHECK(si->Config->Retention == js_WorkQueuePolicy);
    CHECK(si->State.Msgs == 1); /* the old task is still there */
    jsStreamInfo_Destroy(si);
    jsConsumerInfo *ci = NULL;
    REQUIRE(js_GetConsumerInfo(&ci, r.js, "CI_TASKS", "ci-workers", NULL, &jerr) == NATS_OK);
    CHECK(ci->Config->FilterSubject == NULL || ci->Config->FilterSubject[0] == '\0');
    jsConsumerInfo_Destroy(ci);
    /* Setup twice (many workers at once, a restart) changes nothing. */
    CHECK(ci_broker_setup(b, true, &e) == CI_OK);
    CHECK(js_Publish(NULL, r.js, "ci.submit.s1", "x", 1, NULL, &jerr) == NATS_OK);
    /* The old task and the session's are both delivered. */
    struct ci_puller *p = NULL;
    REQUIRE(ci_puller_new(b, &p, &e) == CI_OK);
    int got = 0;
    for (int i = 0; i < 2; i++) {
        struct ci_delivery *d = NULL;
        if (ci_puller_fetch(p, 2000, &d, &e) != CI_OK)
            break;
        got++;
        CHECK_STR(ci_delivery_subject(d), i == 0 ? "ci.submit" : "ci.submit.s1");
        CHECK(ci_delivery_seq(d) == (uint64_t)i + 1);
        CHECK(ci_delivery_ack(d) == CI_OK);
        ci_delivery_free(d);
    }
    CHECK(got == 2);
    ci_puller_free(p);
    ci_broker_free(b);
    raw_close(&r);
    ci_config_free(cfg);
    server_stop(&srv);
}

static ci_status submit(struct ci_broker *b, const char *session, const char *task)
{
    struct ci_error e = {{0}};
    bool dup = true;
    ci_status s = session ? ci_broker_submit_session(b, session, task, "application/json", "{}",
                                                     2, &dup, &e)
                          : ci_broker_submit(b, task, "application/json", "{}", 2, &dup, &e);
    if (s)
        fprintf(stderr, "submit %s: %s\n", task, e.msg);
    return s ? s : dup ? CI_ERR_CONFLICT : CI_OK;
}

/* The first sequence of a session is its oldest task still in the stream:
 * a task acked is gone from the WorkQueue stream, and the next one is
 * first; other sessions and plain tasks do not count. */
static void t_first_seq_follows_acks(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = NULL;
    struct ci_error e = {{0}};
    REQUIRE(ci_broker_connect(cfg, &b, &e) == CI_OK);
    REQUIRE(ci_broker_setup(b, true, &e) == CI_OK);
    uint64_t seq = 99;
    CHECK(ci_broker_session_first_seq(b, "s1", &seq, &e) == CI_ERR_NOT_FOUND);
    CHECK(seq == 99);
    CHECK(submit(b, NULL, "t-0") == CI_OK);       /* seq 1 */
    CHECK(submit(b, "s1", "t-1") == CI_OK);       /* seq 2 */
    CHECK(submit(b, "s2", "t-2") == CI_OK);       /* seq 3 */
    CHECK(submit(b, "s1", "t-3") == CI_OK);       /* seq 4 */
    CHECK(submit(b, "s1", "t-3") == CI_ERR_CONFLICT); /* a duplicate by Nats-Msg-Id */
    CHECK(ci_broker_session_first_seq(b, "s1", &seq, &e) == CI_OK);
    CHECK(seq == 2);
    CHECK(ci_broker_session_first_seq(b, "s2", &seq, &e) == CI_OK);
    CHECK(seq == 3);
    CHECK(ci_broker_session_first_seq(b, "s3", &seq, &e) == CI_ERR_NOT_FOUND);
    CHECK(ci_broker_session_first_seq(b, "a.b", &seq, &e) == CI_ERR_INVALID);
    CHECK(ci_broker_session_first_seq(b, "*", &seq, &e) == CI_ERR_INVALID);
    CHECK(ci_broker_submit_session(b, "s>", "t-x", "application/json", "{}", 2, NULL, &e) ==
          CI_ERR_INVALID);

    struct ci_puller *p = NULL;
    REQUIRE(ci_puller_new(b, &p, &e) == CI_OK);
    struct ci_delivery *d[4] = {0};
    const char *subjects[4] = {"ci.submit", "ci.submit.s1", "ci.submit.s2", "ci.submit.s1"};
    const char *ids[4] = {"t-0", "t-1", "t-2", "t-3"};
    for (int i = 0; i < 4; i++) {
        REQUIRE(ci_puller_fetch(p, 2000, &d[i], &e) == CI_OK);
        CHECK_STR(ci_delivery_subject(d[i]), subjects[i]);
        CHECK(ci_delivery_seq(d[i]) == (uint64_t)i + 1);
        CHECK_STR(ci_delivery_header(d[i], "Nats-Msg-Id"), ids[i]);
    }
    /* Delivered but not acked: still in the stream, still first. */
    CHECK(ci_broker_session_first_seq(b, "s1", &seq, &e) == CI_OK);
    CHECK(seq == 2);
    /* A nak does not remove it either. */
    CHECK(ci_delivery_nak(d[2], 60000) == CI_OK);
    sleep_ms(100);
    CHECK(ci_broker_session_first_seq(b, "s2", &seq, &e) == CI_OK);
    CHECK(seq == 3);
    /* The ack does: the next task of the session is first. */
    CHECK(ci_delivery_ack(d[1]) == CI_OK);
    /* The ack is not confirmed: give it a moment (a loaded machine: 10 s). */
    for (int64_t until = ci_mono_ms() + 10000; ci_mono_ms() < until;) {
        if (ci_broker_session_first_seq(b, "s1", &seq, &e) == CI_OK && seq == 4)
            break;
        sleep_ms(20);
    }
    CHECK(seq == 4);
    CHECK(ci_delivery_term(d[3]) == CI_OK); /* term removes it from a WorkQueue stream */
    ci_status s = CI_OK;
    for (int64_t until = ci_mono_ms() + 10000; ci_mono_ms() < until;) {
        s = ci_broker_session_first_seq(b, "s1", &seq, &e);
        if (s == CI_ERR_NOT_FOUND)
            break;
        sleep_ms(20);
    }
    CHECK(s == CI_ERR_NOT_FOUND);
    for (int i = 0; i < 4; i++) {
        if (i == 0)
            ci_delivery_ack(d[i]);
        ci_delivery_free(d[i]);
    }
    ci_puller_free(p);
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
}

struct listed {
    int n;
    char last[65];
};

static void on_entry(void *closure, const char *id, const uint8_t *data, size_t len,
                     int64_t written_ms)
{
    struct listed *l = closure;
    l->n++;
    snprintf(l->last, sizeof(l->last), "%s", id);
    (void)data;
    (void)len;
    (void)written_ms;
}

/* The sessions bucket: compare-and-set on the revision, put whatever it
 * was, list; and a client that binds. */
static void t_sessions_bucket(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct ci_broker *b = NULL, *client = NULL;
    struct ci_error e = {{0}};
    REQUIRE(ci_broker_connect(cfg, &b, &e) == CI_OK);
    REQUIRE(ci_broker_setup(b, true, &e) == CI_OK);
    uint8_t *data = NULL;
    size_t len = 0;
    uint64_t rev = 7, r1 = 0, r2 = 0;
    CHECK(ci_broker_session_get(b, "s1", &data, &len, &rev, &e) == CI_ERR_NOT_FOUND);
    CHECK(ci_broker_session_swap(b, "s1", "{\"step\":\"1\"}", 12, 0, &r1, &e) == CI_OK);
    CHECK(r1 > 0);
    CHECK(ci_broker_session_swap(b, "s1", "{\"step\":\"1\"}", 12, 0, NULL, &e) ==
          CI_ERR_CONFLICT); /* one exists already */
    CHECK(ci_broker_session_swap(b, "s1", "{\"step\":\"2\"}", 12, r1, &r2, &e) == CI_OK);
    CHECK(r2 > r1);
    CHECK(ci_broker_session_swap(b, "s1", "{\"step\":\"9\"}", 12, r1, NULL, &e) ==
          CI_ERR_CONFLICT); /* stale */
    CHECK_CONTAINS(e.msg, "changed since revision");
    REQUIRE(ci_broker_session_get(b, "s1", &data, &len, &rev, &e) == CI_OK);
    CHECK(len == 12 && memcmp(data, "{\"step\":\"2\"}", 12) == 0);
    CHECK(rev == r2);
    free(data);
    data = NULL;

    REQUIRE(ci_broker_connect(cfg, &client, &e) == CI_OK);
    REQUIRE(ci_broker_setup(client, false, &e) == CI_OK);
    CHECK(ci_broker_session_put(client, "s1", "{\"closed\":true}", 15, &e) == CI_OK);
    CHECK(ci_broker_session_swap(b, "s1", "{\"step\":\"3\"}", 12, r2, NULL, &e) ==
          CI_ERR_CONFLICT); /* the close came in between */
    REQUIRE(ci_broker_session_get(b, "s1", &data, &len, &rev, &e) == CI_OK);
    CHECK(len == 15 && rev > r2);
    free(data);
    CHECK(ci_broker_session_swap(b, "s-2", "{}", 2, 0, NULL, &e) == CI_OK);
    struct listed l = {0};
    CHECK(ci_broker_sessions_list(client, 100, on_entry, &l, &e) == CI_OK);
    CHECK(l.n == 2);
    CHECK(ci_broker_session_get(b, "s.1", &data, &len, &rev, &e) == CI_ERR_INVALID);
    CHECK(ci_broker_session_put(b, "", "{}", 2, &e) == CI_ERR_INVALID);
    ci_broker_free(client);
    ci_broker_free(b);
    ci_config_free(cfg);
    server_stop(&srv);
}

/* An older deployment has no sessions bucket: a client still sets up, and
 * the session functions say not found. A worker makes the bucket, and the
 * same client then finds it. A worker finds a deleted bucket and makes it
 * again. */
static void t_without_bucket(void)
{
    START(srv);
    struct ci_config *cfg = config_for(&srv);
    REQUIRE(cfg);
    struct raw r = {0};
    REQUIRE(raw_open(&r, srv.url));
    struct ci_broker *w = NULL, *client = NULL;
    struct ci_error e = {{0}};
    REQUIRE(ci_broker_connect(cfg, &w, &e) == CI_OK);
    REQUIRE(ci_broker_setup(w, true, &e) == CI_OK);
    ci_broker_free(w);
    w = NULL;
    jsErrCode jerr = 0;
    REQUIRE(js_DeleteStream(r.js, "KV_ci-sessions", NULL, &jerr) == NATS_OK);

    REQUIRE(ci_broker_connect(cfg, &client, &e) == CI_OK);
    CHECK(ci_broker_setup(client, false, &e) == CI_OK);
    uint8_t *data = NULL;
    size_t len = 0;
    uint64_t rev = 0;
    CHECK(ci_broker_session_get(client, "s1", &data, &len, &rev, &e) == CI_ERR_NOT_FOUND);
    CHECK_CONTAINS(e.msg, "ci-sessions");
    CHECK(ci_broker_session_put(client, "s1", "{}", 2, &e) == CI_ERR_NOT_FOUND);
    CHECK(ci_broker_session_swap(client, "s1", "{}", 2, 0, NULL, &e) == CI_ERR_NOT_FOUND);
    struct listed l = {0};
    CHECK(ci_broker_sessions_list(client, 10, on_entry, &l, &e) == CI_ERR_NOT_FOUND);

    REQUIRE(ci_broker_connect(cfg, &w, &e) == CI_OK);
    REQUIRE(ci_broker_setup(w, true, &e) == CI_OK);
    CHECK(ci_broker_session_swap(w, "s1", "{}", 2, 0, NULL, &e) == CI_OK);
    CHECK(ci_broker_session_get(client, "s1", &data, &len, &rev, &e) == CI_OK);
    free(data);

    /* Deleted under a running worker: the periodic check makes it again. */
    REQUIRE(js_DeleteStream(r.js, "KV_ci-sessions", NULL, &jerr) == NATS_OK);
    CHECK(ci_broker_check(w));
    CHECK(ci_broker_recreated(w) == 1);
    jsStreamInfo *si = NULL;
    CHECK(js_GetStreamInfo(&si, r.js, "KV_ci-sessions", NULL, &jerr) == NATS_OK);
    if (si) {
        CHECK(si->Config->MaxMsgsPerSubject == 1);
        CHECK(si->Config->MaxAge == 3600LL * 1000000000LL);
        CHECK(si->Config->AllowDirect);
    }
    jsStreamInfo_Destroy(si);
    CHECK(ci_broker_session_get(w, "s1", &data, &len, &rev, &e) == CI_ERR_NOT_FOUND);
    ci_broker_free(client);
    ci_broker_free(w);
    raw_close(&r);
    ci_config_free(cfg);
    server_stop(&srv);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    static const struct t_case cases[] = {
        T_OWN(t_setup_upgrades_old_stream),
        T_OWN(t_first_seq_follows_acks),
        T_OWN(t_sessions_bucket),
        T_OWN(t_without_bucket),
    };
    int rc = t_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
    ci_broker_library_close();
    return rc;
}
