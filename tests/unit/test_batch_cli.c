/* test_batch_cli.c - what a batch is to a client, without NATS
 * (src/cli/batch.c) and the progress bar (src/cli/progress.c): the command
 * line of `ci batch`, ids, the counts of contract §20 from per-subject
 * message counts, status --json, failures grouped by error, JSONL lines as
 * requests, and --file-each globs. The event bodies are core/batch.c's
 * (test_batch_events). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/batch.h"
#include "cli/progress.h"
#include "core/request.h"
#include "testutil.h"

/* --- the command line --- */

static ci_status check(struct ci_batch_cmdline *in, const char *const *ops, size_t n,
                       struct ci_batch_cmd *ret, struct ci_error *e)
{
    in->operands = ops;
    in->n_operands = n;
    memset(e, 0, sizeof(*e));
    return ci_batch_cmdline_check(in, ret, e);
}

static void t_cmdline_verbs(void)
{
    struct ci_batch_cmd c;
    struct ci_error e;
    struct ci_batch_cmdline in = {0};
    CHECK(check(&in, NULL, 0, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "needs a command");
    const char *bad[] = {"frobnicate"};
    CHECK(check(&in, bad, 1, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "'batch frobnicate'");

    const char *st[] = {"status", "b1"};
    CHECK(check(&in, st, 2, &c, &e) == CI_OK);
    CHECK(c.verb == CI_BATCH_STATUS);
    CHECK_STR(c.batch, "b1");
    CHECK(!c.json);
    in.json = true;
    CHECK(check(&in, st, 2, &c, &e) == CI_OK);
    CHECK(c.json);
    in.json = false;

    const char *st0[] = {"status"};
    CHECK(check(&in, st0, 1, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "needs a batch id");
    const char *st3[] = {"status", "b1", "b2"};
    CHECK(check(&in, st3, 3, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "unexpected argument 'b2'");
    const char *dot[] = {"wait", "a.b"};
    CHECK(check(&in, dot, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "'a.b' is not a batch id");
    const char *star[] = {"cancel", "*"};
    CHECK(check(&in, star, 2, &c, &e) == CI_ERR_INVALID);

    const char *w[] = {"wait", "b1"};
    in.wait_set = true;
    CHECK(check(&in, w, 2, &c, &e) == CI_OK);
    CHECK(c.verb == CI_BATCH_WAIT);
    const char *cn[] = {"cancel", "b1"};
    CHECK(check(&in, cn, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "'batch cancel' does not take --wait-ms");
    in.wait_set = false;
    CHECK(check(&in, cn, 2, &c, &e) == CI_OK);
    CHECK(c.verb == CI_BATCH_CANCEL);
    /* --retry-ms: how long wait asks again while NATS does not answer. */
    in.retry_set = true;
    CHECK(check(&in, w, 2, &c, &e) == CI_OK);
    CHECK(c.verb == CI_BATCH_WAIT);
    CHECK(check(&in, st, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "'batch status' does not take --retry-ms: it is for 'ci batch wait'");
    in.retry_set = false;

    const char *rs[] = {"results", "b1"};
    in.jsonl = true;
    CHECK(check(&in, rs, 2, &c, &e) == CI_OK);
    CHECK(c.verb == CI_BATCH_RESULTS && c.jsonl);
    in.jsonl_file = "x";
    CHECK(check(&in, rs, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "without a value");
    in.jsonl_file = NULL;
    in.jsonl = false;
    CHECK(check(&in, rs, 2, &c, &e) == CI_OK);
    CHECK(!c.jsonl);
    in.json = true;
    CHECK(check(&in, rs, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "with --jsonl, not --json");
}

static void t_cmdline_submit(void)
{
    struct ci_batch_cmd c;
    struct ci_error e;
    struct ci_batch_cmdline in = {0};
    const char *s1[] = {"submit", "s.py"};
    CHECK(check(&in, s1, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "needs --file-each 'GLOB'");

    in.file_each = "*.csv";
    CHECK(check(&in, s1, 2, &c, &e) == CI_OK);
    CHECK(c.verb == CI_BATCH_SUBMIT);
    CHECK_STR(c.script, "s.py");
    CHECK_STR(c.glob, "*.csv");
    CHECK(c.batch == NULL && c.jsonl_file == NULL);
    in.batch = "nightly";
    in.n_labels = 2;
    in.timeout_set = in.memory_set = in.wire_json = true;
    CHECK(check(&in, s1, 2, &c, &e) == CI_OK);
    CHECK_STR(c.batch, "nightly");
    in.batch = "no good";
    CHECK(check(&in, s1, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "'no good' is not a batch id");
    in.batch = NULL;

    const char *s0[] = {"submit"};
    CHECK(check(&in, s0, 1, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "needs the script");
    in.n_files = 1;
    CHECK(check(&in, s1, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "does not take --file: each task's input comes from --file-each");
    in.n_files = 0;
    in.id = "t1";
    CHECK(check(&in, s1, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "--id");
    in.id = NULL;
    in.session = "s";
    CHECK(check(&in, s1, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "--session");
    in.session = NULL;
    in.json = true;
    CHECK(check(&in, s1, 2, &c, &e) == CI_ERR_INVALID);
    in.json = false;
    in.file_each = "";
    CHECK(check(&in, s1, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "the pattern is empty");

    /* --jsonl FILE: the file is the operand; --jsonl=FILE: none. */
    struct ci_batch_cmdline j = {.jsonl = true};
    const char *f[] = {"submit", "r.jsonl"};
    CHECK(check(&j, f, 2, &c, &e) == CI_OK);
    CHECK_STR(c.jsonl_file, "r.jsonl");
    CHECK(c.script == NULL && c.glob == NULL);
    CHECK(check(&j, s0, 1, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "needs the JSONL file");
    j.jsonl_file = "q.jsonl";
    CHECK(check(&j, s0, 1, &c, &e) == CI_OK);
    CHECK_STR(c.jsonl_file, "q.jsonl");
    CHECK(check(&j, f, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "unexpected argument 'r.jsonl'");
    j.jsonl_file = NULL;
    j.n_labels = 1;
    CHECK(check(&j, f, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "--label");
    j.n_labels = 0;
    j.timeout_set = true;
    CHECK(check(&j, f, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "a JSONL line sets its own limits");
    j.timeout_set = false;
    j.file_each = "*.csv";
    CHECK(check(&j, f, 2, &c, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "not both");
}

/* --- ids --- */

static void t_ids(void)
{
    char id[19];
    ci_batch_new_id(id);
    CHECK(strlen(id) == 18);
    CHECK(strncmp(id, "b-", 2) == 0);
    CHECK(strspn(id + 2, "0123456789abcdef") == 16);
    CHECK(ci_task_id_valid(id));
    char other[19];
    ci_batch_new_id(other);
    CHECK(strcmp(id, other) != 0);

    char t[65];
    struct ci_error e = {{0}};
    CHECK(ci_batch_task_id("b", 1, t, &e) == CI_OK);
    CHECK_STR(t, "b-1");
    CHECK(ci_batch_task_id("nightly", 100000, t, &e) == CI_OK);
    CHECK_STR(t, "nightly-100000");
    char b63[64];
    memset(b63, 'x', 63);
    b63[63] = '\0';
    CHECK(ci_batch_task_id(b63, 1, t, &e) == CI_ERR_INVALID); /* 65 characters */
    b63[62] = '\0';
    CHECK(ci_batch_task_id(b63, 1, t, &e) == CI_OK); /* 64 */
    CHECK(strlen(t) == 64);

    /* Room for "-<n>" up to the number of tasks. */
    CHECK(ci_batch_id_check(b63, 9, &e) == CI_OK);
    CHECK(ci_batch_id_check(b63, 10, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "leave room for 61");
    CHECK(ci_batch_id_check("b", 100000, &e) == CI_OK);
    CHECK(ci_batch_id_check("a b", 1, &e) == CI_ERR_INVALID);
    CHECK(ci_batch_id_check("", 1, &e) == CI_ERR_INVALID);
}

/* --- events and counts --- */

static void t_event_status(void)
{
    /* core/batch.c keeps the status names without protobuf: they must be
     * ci.proto's. */
    for (int ev = 0; ev < CI_BATCH_EV_COUNT; ev++) {
        const char *name = ci_batch_event_status_name((enum ci_batch_event)ev);
        CHECK(!name == !ci_batch_event_ended((enum ci_batch_event)ev));
        if (name)
            CHECK_STR(name, ci_task_status_name(ci_batch_event_status((enum ci_batch_event)ev)));
        if (name)
            CHECK_STR(ci_batch_event_name((enum ci_batch_event)ev),
                      ci_task_status_short(ci_batch_event_status((enum ci_batch_event)ev)));
    }
    CHECK(ci_batch_event_status(CI_BATCH_EV_TIMED_OUT) ==
          CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT);
}

static struct ci_batch_state counts(uint64_t taken, uint64_t ok, uint64_t failed, uint64_t tout,
                                     uint64_t cancelled, bool sealed, uint64_t seal_total,
                                     uint64_t left)
{
    struct ci_batch_raw raw = {.sealed = sealed, .seal_total = seal_total, .left = left};
    raw.events.taken = taken;
    raw.events.succeeded = ok;
    raw.events.failed = failed;
    raw.events.timed_out = tout;
    raw.events.cancelled = cancelled;
    raw.events.sealed = sealed;
    struct ci_batch_state c;
    ci_batch_state_compute(&raw, &c);
    return c;
}

static void t_counts(void)
{
    /* Sealed: total from the seal, queued = total - taken, running =
     * taken - ended. */
    struct ci_batch_state c = counts(7, 3, 1, 1, 0, true, 20, 999);
    CHECK(c.total == 20 && c.queued == 13 && c.running == 2);
    CHECK(c.succeeded == 3 && c.failed == 1 && c.timed_out == 1 && c.cancelled == 0);
    CHECK(ci_batch_state_ended(&c) == 5);
    CHECK(!ci_batch_state_done(&c));
    /* Every task ended: done. */
    c = counts(20, 17, 2, 0, 1, true, 20, 0);
    CHECK(c.queued == 0 && c.running == 0);
    CHECK(ci_batch_state_done(&c));
    /* Before the seal: taken + the messages left that nobody took. 10 left
     * in CI_BATCH, 4 of them running (taken, not ended, not acked). */
    c = counts(6, 2, 0, 0, 0, false, 0, 10);
    CHECK(c.total == 12 && c.running == 4 && c.queued == 6);
    CHECK(!c.sealed && !ci_batch_state_done(&c));
    /* Before the seal, all ended and acked: total = taken, and not done
     * (the seal may say more). */
    c = counts(5, 5, 0, 0, 0, false, 0, 0);
    CHECK(c.total == 5 && c.queued == 0 && c.running == 0);
    CHECK(!ci_batch_state_done(&c));
    /* An end stored before its message's ack: counted once. */
    c = counts(3, 3, 0, 0, 0, false, 0, 1);
    CHECK(c.total == 4 && c.running == 0); /* a lower bound: one over for a moment */
    /* An end without its taken event: taken is at least ended. */
    c = counts(1, 2, 1, 0, 0, true, 3, 0);
    CHECK(c.running == 0 && c.queued == 0);
    CHECK(ci_batch_state_done(&c));
    /* A seal below what was taken: nothing goes below 0. */
    c = counts(5, 1, 0, 0, 0, true, 3, 0);
    CHECK(c.total == 3 && c.queued == 0 && c.running == 4);
    /* Nothing at all. */
    struct ci_batch_raw none = {0};
    CHECK(!ci_batch_raw_known(&none));
    none.left = 1;
    CHECK(ci_batch_raw_known(&none));
    struct ci_batch_raw only_cancel = {0};
    only_cancel.events.cancel = 1;
    CHECK(ci_batch_raw_known(&only_cancel));
    /* ... but a cancel alone is no batch to cancel (ci batch cancel). */
    CHECK(!ci_batch_raw_submitted(&only_cancel));
    CHECK(!ci_batch_raw_submitted(&(struct ci_batch_raw){0}));
    CHECK(ci_batch_raw_submitted(&(struct ci_batch_raw){.left = 1}));
    CHECK(ci_batch_raw_submitted(&(struct ci_batch_raw){.sealed = true}));
    CHECK(ci_batch_raw_submitted(&(struct ci_batch_raw){.events.taken = 1}));
    CHECK(ci_batch_raw_submitted(&(struct ci_batch_raw){.events.failed = 1, .events.cancel = 2}));
    ci_batch_state_compute(&only_cancel, &c);
    CHECK(c.cancel_requested && !c.complete && c.total == 0);
}

static void t_status_json(void)
{
    struct ci_batch_state c = counts(20, 17, 2, 0, 1, true, 20, 0);
    struct ci_buf b = CI_BUF_INIT;
    CHECK(ci_batch_state_json(&c, &b) == CI_OK);
    CHECK_STR((const char *)b.data, "{\"total\":20,\"queued\":0,\"running\":0,\"succeeded\":17,"
                                    "\"failed\":2,\"timed_out\":0,\"cancelled\":1}");
    ci_buf_release(&b);
}

/* --- failures --- */

static void t_failures(void)
{
    struct ci_batch_failures f;
    ci_batch_failures_init(&f, 4);
    const Ci__V1__TaskStatus F = CI__V1__TASK_STATUS__TASK_STATUS_FAILED,
                             T = CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT;
    CHECK(ci_batch_failures_add(&f, F, "KeyError: 'x'", "b-1") == CI_OK);
    CHECK(ci_batch_failures_add(&f, T, "too slow", "b-2") == CI_OK);
    for (int i = 3; i <= 7; i++) {
        char id[16];
        snprintf(id, sizeof(id), "b-%d", i);
        CHECK(ci_batch_failures_add(&f, F, "ValueError", id) == CI_OK);
    }
    CHECK(ci_batch_failures_add(&f, F, "KeyError: 'x'", "b-8") == CI_OK);
    /* The same text under another status is another group. */
    CHECK(ci_batch_failures_add(&f, T, "KeyError: 'x'", "b-9") == CI_OK);
    /* A fifth group does not fit: counted apart. */
    CHECK(ci_batch_failures_add(&f, F, "other", "b-10") == CI_OK);
    CHECK(ci_batch_failures_add(&f, F, NULL, "b-11") == CI_OK);
    CHECK(f.n == 4);
    CHECK(f.total == 11);
    CHECK(f.ungrouped == 2);
    ci_batch_failures_sort(&f);
    CHECK_STR(f.groups[0].error, "ValueError");
    CHECK(f.groups[0].count == 5);
    CHECK(f.groups[0].n_ids == CI_BATCH_GROUP_IDS);
    CHECK_STR(f.groups[0].ids[0], "b-3");
    CHECK_STR(f.groups[0].ids[2], "b-5");
    CHECK_STR(f.groups[1].error, "KeyError: 'x'");
    CHECK(f.groups[1].status == F && f.groups[1].count == 2);
    CHECK_STR(f.groups[1].ids[1], "b-8");
    /* Equal counts: the first seen first. */
    CHECK(f.groups[2].status == T && f.groups[2].count == 1);
    CHECK_STR(f.groups[2].error, "too slow");
    CHECK(f.groups[3].status == T && f.groups[3].count == 1);
    CHECK_STR(f.groups[3].error, "KeyError: 'x'");
    CHECK_STR(f.groups[3].ids[0], "b-9");
    ci_batch_failures_release(&f);
    ci_batch_failures_release(&f); /* twice is fine */

    ci_batch_failures_init(&f, 100);
    for (int i = 0; i < 50; i++) {
        char err[32];
        snprintf(err, sizeof(err), "e%d", i % 10);
        CHECK(ci_batch_failures_add(&f, F, err, "t") == CI_OK);
    }
    CHECK(f.n == 10 && f.ungrouped == 0);
    for (size_t i = 0; i < f.n; i++)
        CHECK(f.groups[i].count == 5);
    ci_batch_failures_sort(&f);
    CHECK_STR(f.groups[0].error, "e0");
    CHECK_STR(f.groups[9].error, "e9");
    ci_batch_failures_release(&f);
}

/* --- JSONL --- */

static ci_status line(struct ci_config *cfg, size_t no, const char *text,
                      Ci__V1__ExecutionRequest **ret, struct ci_error *e)
{
    memset(e, 0, sizeof(*e));
    return ci_batch_jsonl_request(cfg, "nightly", no, (const uint8_t *)text, strlen(text), ret, e);
}

static void t_jsonl(void)
{
    struct ci_config *cfg = NULL;
    struct ci_error e = {{0}};
    REQUIRE(ci_config_defaults(&cfg, &e) == CI_OK);
    Ci__V1__ExecutionRequest *r = NULL;

    CHECK(line(cfg, 7, "{\"language\":\"python\",\"code\":\"print(1)\"}", &r, &e) == CI_OK);
    if (r) {
        CHECK_STR(r->task_id, "nightly-7");
        CHECK_STR(r->batch_id, "nightly");
        CHECK_STR(r->code, "print(1)");
        ci_message_free(&r->base);
        r = NULL;
    }
    CHECK(line(cfg, 1,
               "{\"taskId\":\"mine\",\"batchId\":\"nightly\",\"language\":\"python\","
               "\"code\":\"x\",\"labels\":{\"a\":\"b\"},\"limits\":{\"timeoutMs\":\"5000\"},"
               "\"files\":[{\"name\":\"d.csv\",\"content\":\"YSxi\"}]}",
               &r, &e) == CI_OK);
    if (r) {
        CHECK_STR(r->task_id, "mine");
        CHECK(r->limits && r->limits->timeout_ms == 5000);
        CHECK(r->n_files == 1 && r->files[0]->content.len == 3);
        CHECK(r->n_labels == 1);
        ci_message_free(&r->base);
        r = NULL;
    }
    /* The request keeps its taskId whatever its number. */
    CHECK(line(cfg, 99, "{\"task_id\":\"snake\",\"language\":\"python\",\"code\":\"x\"}", &r,
               &e) == CI_OK);
    if (r) {
        CHECK_STR(r->task_id, "snake");
        ci_message_free(&r->base);
        r = NULL;
    }

    const struct {
        const char *text;
        const char *says;
    } bad[] = {
        {"{\"language\":\"python\",\"code\":\"x\",\"batchId\":\"other\"}",
         "batchId 'other' is not this batch ('nightly')"},
        {"{\"language\":\"python\",\"code\":\"x\",\"sessionId\":\"s1\"}", "sessionId is set"},
        {"{\"language\":\"python\",\"code\":\"x\",\"nope\":1}", "nope"},
        {"{\"language\":\"python\"}", "code is empty"},
        {"{\"language\":\"python\",\"code\":\"x\",\"taskId\":\"a.b\"}", "task_id 'a.b'"},
        {"{\"language\":\"python\",\"code\":\"x\",\"limits\":{\"timeoutMs\":999999}}",
         "above the limit"},
        {"[1]", ""},
        {"{\"language\":\"python\",\"code\":\"x\"", ""},
        {"", ""},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = NULL;
        ci_status s = line(cfg, 3, bad[i].text, &r, &e);
        CHECK(s == CI_ERR_INVALID || s == CI_ERR_LIMIT);
        CHECK(r == NULL);
        CHECK(e.msg[0] != '\0');
        CHECK_CONTAINS(e.msg, bad[i].says);
    }
    /* A batch id that leaves no room for the line's task id. */
    char long_batch[65];
    memset(long_batch, 'b', 63);
    long_batch[63] = '\0';
    const char *t = "{\"language\":\"python\",\"code\":\"x\"}";
    CHECK(ci_batch_jsonl_request(cfg, long_batch, 12, (const uint8_t *)t, strlen(t), &r, &e) ==
          CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "longer than 64");
    ci_config_free(cfg);

    CHECK(ci_batch_line_blank((const uint8_t *)" \t\r", 3));
    CHECK(ci_batch_line_blank((const uint8_t *)"", 0));
    CHECK(!ci_batch_line_blank((const uint8_t *)" {", 2));
}

static void t_ids_unique(void)
{
    struct ci_batch_id_line ids[5] = {
        {"c", 1}, {"a", 2}, {"b", 3}, {"d", 4}, {"e", 5},
    };
    struct ci_error e = {{0}};
    CHECK(ci_batch_ids_unique(ids, 5, &e) == CI_OK);
    struct ci_batch_id_line dup[6] = {
        {"z", 1}, {"x", 2}, {"y", 3}, {"x", 9}, {"z", 4}, {"q", 5},
    };
    CHECK(ci_batch_ids_unique(dup, 6, &e) == CI_ERR_INVALID);
    /* The pair whose second line comes first: z (1 and 4). */
    CHECK_CONTAINS(e.msg, "lines 1 and 4 both have taskId 'z'");
    CHECK(ci_batch_ids_unique(ids, 0, &e) == CI_OK);
}

/* --- globs --- */

static void touch(const char *dir, const char *name, const char *text)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
        if (write(fd, text, strlen(text)) < 0)
            fprintf(stderr, "write %s failed\n", p);
        close(fd);
    }
}

static void t_glob(void)
{
    char dir[] = "/tmp/ci-test-batch-XXXXXX";
    REQUIRE(mkdtemp(dir));
    /* Bytewise order, whatever the locale: 'B' < '_' < 'a'. */
    const char *names[] = {"b.csv", "a.csv", "_x.csv", "B.csv", "a10.csv", "a2.csv"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        touch(dir, names[i], "x\n");
    touch(dir, "notes.txt", "");
    char pat[512];
    snprintf(pat, sizeof(pat), "%s/*.csv", dir);
    char **paths = NULL;
    size_t n = 0;
    struct ci_error e = {{0}};
    CHECK(ci_batch_glob(pat, 100, &paths, &n, &e) == CI_OK);
    const char *want[] = {"B.csv", "_x.csv", "a.csv", "a10.csv", "a2.csv", "b.csv"};
    CHECK(n == 6);
    for (size_t i = 0; i < n && i < 6; i++) {
        const char *slash = strrchr(paths[i], '/');
        CHECK_STR(slash ? slash + 1 : paths[i], want[i]);
    }
    ci_batch_paths_free(paths, n);

    CHECK(ci_batch_glob(pat, 5, &paths, &n, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "matches 6 files; a batch holds at most 5 tasks");
    snprintf(pat, sizeof(pat), "%s/*.xlsx", dir);
    CHECK(ci_batch_glob(pat, 100, &paths, &n, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "matches no file");
    char sub[512];
    snprintf(sub, sizeof(sub), "%s/zz.csv", dir);
    CHECK(mkdir(sub, 0755) == 0);
    snprintf(pat, sizeof(pat), "%s/*.csv", dir);
    CHECK(ci_batch_glob(pat, 100, &paths, &n, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "zz.csv' is not a regular file");
    rmdir(sub);

    char rm[600];
    snprintf(rm, sizeof(rm), "%s", dir);
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(rm, sizeof(rm), "%s/%s", dir, names[i]);
        unlink(rm);
    }
    snprintf(rm, sizeof(rm), "%s/notes.txt", dir);
    unlink(rm);
    CHECK(rmdir(dir) == 0);
}

/* Every input of --file-each is checked before anything goes out: its
 * name, its size, that it opens; and which make the largest messages. */
static void t_files_check(void)
{
    char dir[] = "/tmp/ci-test-batch-XXXXXX";
    REQUIRE(mkdtemp(dir));
    touch(dir, "a.csv", "12345");
    touch(dir, "b.csv", "123");
    touch(dir, "big-with-long-name.csv", "123456789012");
    touch(dir, "big.csv", "1234567890123");
    touch(dir, "c;d.csv", "x");
    touch(dir, ".hidden.csv", "x");
    char p[6][512];
    const char *names[] = {"a.csv", "b.csv", "big-with-long-name.csv", "big.csv", "c;d.csv",
                           ".hidden.csv"};
    char *paths[6];
    for (int i = 0; i < 6; i++) {
        snprintf(p[i], sizeof(p[i]), "%s/%s", dir, names[i]);
        paths[i] = p[i];
    }
    struct ci_batch_files_extremes x;
    struct ci_error e = {{0}};
    /* Inline up to 10 bytes, at most 20 bytes an input. */
    REQUIRE(ci_batch_files_check(paths, 4, 20, 10, false, &x, &e) == CI_OK);
    CHECK(x.largest_inline == 0);   /* a.csv, 5 bytes */
    CHECK(x.longest_uploaded == 2); /* the longer name of the two above 10 */
    REQUIRE(ci_batch_files_check(paths, 2, 20, 10, false, &x, &e) == CI_OK);
    CHECK(x.largest_inline == 0 && x.longest_uploaded == SIZE_MAX);
    CHECK(ci_batch_files_check(paths, 4, 12, 10, false, &x, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "big.csv' is 13 bytes; an input may be at most 12 bytes");
    CHECK_CONTAINS(e.msg, "nothing was submitted");
    CHECK(ci_batch_files_check(paths, 5, 20, 10, false, &x, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "c;d.csv' cannot be an input: its name 'c;d.csv' is not allowed");
    CHECK(ci_batch_files_check(paths + 5, 1, 20, 10, false, &x, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "must not start with '.'");
    /* The message with a file inline grows with its name too: a.csv (5
     * bytes) against a 4-byte file with a name 6 characters longer. */
    char q[2][512];
    char *pair[] = {q[0], q[1]};
    snprintf(q[0], sizeof(q[0]), "%s/a.csv", dir);
    snprintf(q[1], sizeof(q[1]), "%s/longer-x.csv", dir);
    touch(dir, "longer-x.csv", "1234");
    REQUIRE(ci_batch_files_check(pair, 2, 20, 10, false, &x, &e) == CI_OK);
    CHECK(x.largest_inline == 1);
    /* In JSON the content is base64: 5 bytes make 8 characters, 4 make 8
     * too, and the name decides; 3 bytes make 4. */
    REQUIRE(ci_batch_files_check(pair, 2, 20, 10, true, &x, &e) == CI_OK);
    CHECK(x.largest_inline == 1);
    touch(dir, "longer-x.csv", "123");
    REQUIRE(ci_batch_files_check(pair, 2, 20, 10, false, &x, &e) == CI_OK);
    CHECK(x.largest_inline == 1); /* 3 + 12 against 5 + 5 */
    REQUIRE(ci_batch_files_check(pair, 2, 20, 10, true, &x, &e) == CI_OK);
    CHECK(x.largest_inline == 1); /* 4 + 12 against 8 + 5 */
    unlink(q[1]);
    /* Where the encodings disagree: 9 bytes under an 8-character name
     * against 10 under a 5-character one (protobuf 9 + 8 against 10 + 5;
     * base64 12 + 8 against 16 + 5). */
    snprintf(q[0], sizeof(q[0]), "%s/abcd.csv", dir);
    snprintf(q[1], sizeof(q[1]), "%s/e.csv", dir);
    touch(dir, "abcd.csv", "123456789");
    touch(dir, "e.csv", "1234567890");
    REQUIRE(ci_batch_files_check(pair, 2, 20, 10, false, &x, &e) == CI_OK);
    CHECK(x.largest_inline == 0);
    REQUIRE(ci_batch_files_check(pair, 2, 20, 10, true, &x, &e) == CI_OK);
    CHECK(x.largest_inline == 1);
    unlink(q[0]);
    unlink(q[1]);
    for (int i = 0; i < 6; i++)
        unlink(p[i]);
    char *gone[] = {p[0]};
    CHECK(ci_batch_files_check(gone, 1, 20, 10, false, &x, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "a.csv' cannot be read");
    CHECK(rmdir(dir) == 0);
}

/* --- the progress bar --- */

static void t_progress(void)
{
    char out[64];
    uint64_t seg[3] = {0, 0, 0};
    CHECK(ci_progress_bar(out, sizeof(out), 10, seg, "#x>", 3, 0) == 12);
    CHECK_STR(out, "[..........]");
    seg[0] = 5;
    ci_progress_bar(out, sizeof(out), 10, seg, "#x>", 3, 10);
    CHECK_STR(out, "[#####.....]");
    uint64_t mix[3] = {3, 1, 2}; /* of 10 */
    ci_progress_bar(out, sizeof(out), 10, mix, "#x>", 3, 10);
    CHECK_STR(out, "[###x>>....]");
    /* Rounded down by running sum: 1 of 3 is 3 cells of 10, 2 of 3 is 6. */
    uint64_t thirds[2] = {1, 1};
    ci_progress_bar(out, sizeof(out), 10, thirds, "#x", 2, 3);
    CHECK_STR(out, "[###xxx....]");
    /* Full only when everything is in. */
    uint64_t almost[1] = {999};
    ci_progress_bar(out, sizeof(out), 10, almost, "#", 1, 1000);
    CHECK_STR(out, "[#########.]");
    uint64_t all[2] = {998, 2};
    ci_progress_bar(out, sizeof(out), 10, all, "#x", 2, 1000);
    CHECK_STR(out, "[#########x]");
    /* Segments beyond the total are cut: the second gets what is left. */
    uint64_t over[2] = {8, 8};
    ci_progress_bar(out, sizeof(out), 4, over, "#x", 2, 10);
    CHECK_STR(out, "[###x]");
    uint64_t over1[2] = {12, 8};
    ci_progress_bar(out, sizeof(out), 4, over1, "#x", 2, 10);
    CHECK_STR(out, "[####]");
    /* Huge counts do not overflow. */
    uint64_t big[1] = {UINT64_MAX / 2};
    ci_progress_bar(out, sizeof(out), 10, big, "#", 1, UINT64_MAX);
    CHECK_STR(out, "[####......]");
    /* Cut to the buffer, always terminated. */
    char small[6];
    CHECK(ci_progress_bar(small, sizeof(small), 10, mix, "#x>", 3, 10) == 5);
    CHECK_STR(small, "[###x");
    CHECK(ci_progress_bar(small, 0, 10, mix, "#x>", 3, 10) == 0);

    /* The last column stays free. */
    CHECK(ci_progress_width(80, 40) == 36);
    CHECK(ci_progress_width(200, 40) == 40);
    CHECK(ci_progress_width(50, 40) == 0); /* no room for 10 cells */
    CHECK(ci_progress_width(53, 40) == 0);
    CHECK(ci_progress_width(54, 40) == 10);

    /* A whole line never wider than the terminal less one column: the
     * bar when it fits, else the text alone, cut. */
    const char *text = "3/10 ended (2 ok, 1 not), 1 running, 6 queued"; /* 45 */
    char line[256];
    CHECK(ci_progress_line(line, sizeof(line), 100, mix, "#x>", 3, 10, text) == 40 + 3 + 45);
    CHECK_STR(line, "[############xxxx>>>>>>>>................] 3/10 ended (2 ok, 1 not), 1 "
                    "running, 6 queued");
    CHECK(ci_progress_line(line, sizeof(line), 60, mix, "#x>", 3, 10, text) == 59);
    CHECK_STR(line, "[###x>>.....] 3/10 ended (2 ok, 1 not), 1 running, 6 queued");
    for (int cols = 1; cols <= 120; cols++) {
        size_t len = ci_progress_line(line, sizeof(line), cols, mix, "#x>", 3, 10, text);
        CHECK(len == strlen(line));
        CHECK(len <= (size_t)(cols - 1));
        if (cols >= 47) /* the text whole, a bar only from 59 columns */
            CHECK(strstr(line, text) != NULL);
        CHECK((line[0] == '[') == (cols >= 59));
    }
    CHECK(ci_progress_line(line, sizeof(line), 30, mix, "#x>", 3, 10, text) == 29);
    CHECK_STR(line, "3/10 ended (2 ok, 1 not), 1 r");
    CHECK(ci_progress_line(line, sizeof(line), 0, mix, "#x>", 3, 10, text) == 79); /* 80 */
    CHECK(ci_progress_line(small, sizeof(small), 80, mix, "#x>", 3, 10, text) == 5);
}

TEST_MAIN(T(t_cmdline_verbs), T(t_cmdline_submit), T(t_ids), T(t_event_status), T(t_counts),
          T(t_status_json), T(t_failures), T(t_jsonl), T(t_ids_unique), T(t_glob), T(t_files_check),
          T(t_progress))
