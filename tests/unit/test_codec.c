/* test_codec.c - protobuf and proto3 JSON encodings of every ci.proto message. */
#include <stdlib.h>
#include <string.h>

#include "core/codec.h"
#include "testutil.h"

static struct ci_error err;

/* Decodes a JSON literal; NULL on failure (err holds why). */
static ProtobufCMessage *dj(const ProtobufCMessageDescriptor *desc, const char *json)
{
    ProtobufCMessage *m = NULL;
    err.msg[0] = '\0';
    if (ci_message_decode(CI_ENC_JSON, desc, (const uint8_t *)json, strlen(json), &m, &err))
        return NULL;
    return m;
}

static Ci__V1__ExecutionRequest *req_json(const char *json)
{
    return (Ci__V1__ExecutionRequest *)dj(&ci__v1__execution_request__descriptor, json);
}

/* Expects the JSON to be refused with an error containing each needle. */
#define CHECK_JSON_FAILS(json, needle)                                              \
    do {                                                                            \
        ProtobufCMessage *m_ = dj(&ci__v1__execution_request__descriptor, json);    \
        CHECK(m_ == NULL);                                                          \
        ci_message_free(m_);                                                        \
        CHECK_CONTAINS(err.msg, needle);                                            \
    } while (0)

static char *enc_json(const ProtobufCMessage *m)
{
    uint8_t *out = NULL;
    size_t n = 0;
    if (ci_message_encode(CI_ENC_JSON, m, &out, &n, &err))
        return NULL;
    if (out && strlen((char *)out) != n) {
        free(out);
        return NULL;
    }
    return (char *)out;
}

/* Packed bytes are deterministic (fields in number order), so two messages
 * are equal when their encodings are. */
static bool same_pb(const ProtobufCMessage *a, const ProtobufCMessage *b)
{
    size_t na = protobuf_c_message_get_packed_size(a), nb = protobuf_c_message_get_packed_size(b);
    if (na != nb)
        return false;
    uint8_t *ba = malloc(na + 1), *bb = malloc(nb + 1);
    protobuf_c_message_pack(a, ba);
    protobuf_c_message_pack(b, bb);
    bool eq = memcmp(ba, bb, na) == 0;
    free(ba);
    free(bb);
    return eq;
}

/* Encodes m both ways, decodes both, and checks each copy equals m. */
static void roundtrip_both(const ProtobufCMessage *m)
{
    for (int enc = CI_ENC_PROTOBUF; enc <= CI_ENC_JSON; enc++) {
        uint8_t *buf = NULL;
        size_t n = 0;
        CHECK(ci_message_encode(enc, m, &buf, &n, &err) == CI_OK);
        REQUIRE(buf != NULL);
        ProtobufCMessage *back = NULL;
        ci_status s = ci_message_decode(enc, m->descriptor, buf, n, &back, &err);
        if (s)
            fprintf(stderr, "decode (%s): %s\n", enc == CI_ENC_JSON ? "json" : "pb", err.msg);
        CHECK(s == CI_OK);
        if (back)
            CHECK(same_pb(m, back));
        ci_message_free(back);
        free(buf);
    }
}

static void test_content_types(void)
{
    enum ci_encoding e = CI_ENC_JSON;
    CHECK(ci_encoding_from_content_type(NULL, &e, &err) == CI_OK && e == CI_ENC_PROTOBUF);
    e = CI_ENC_JSON;
    CHECK(ci_encoding_from_content_type("", &e, &err) == CI_OK && e == CI_ENC_PROTOBUF);
    CHECK(ci_encoding_from_content_type("application/json", &e, &err) == CI_OK && e == CI_ENC_JSON);
    CHECK(ci_encoding_from_content_type("Application/JSON; charset=utf-8", &e, &err) == CI_OK &&
          e == CI_ENC_JSON);
    CHECK(ci_encoding_from_content_type("application/protobuf", &e, &err) == CI_OK &&
          e == CI_ENC_PROTOBUF);
    e = CI_ENC_JSON;
    CHECK(ci_encoding_from_content_type("application/x-protobuf", &e, &err) == CI_OK &&
          e == CI_ENC_PROTOBUF);
    e = CI_ENC_JSON;
    CHECK(ci_encoding_from_content_type("text/plain", &e, &err) == CI_ERR_INVALID);
    CHECK(e == CI_ENC_JSON); /* untouched on failure */
    CHECK_CONTAINS(err.msg, "text/plain");
    CHECK(ci_encoding_from_content_type("application/jsonx", &e, &err) == CI_ERR_INVALID);
    CHECK_STR(ci_encoding_content_type(CI_ENC_JSON), "application/json");
    CHECK_STR(ci_encoding_content_type(CI_ENC_PROTOBUF), "application/protobuf");
}

static void test_status_names(void)
{
    CHECK_STR(ci_task_status_name(CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED),
              "TASK_STATUS_SUCCEEDED");
    CHECK_STR(ci_task_status_name(CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT),
              "TASK_STATUS_TIMED_OUT");
    CHECK_STR(ci_task_status_short(CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED), "succeeded");
    CHECK_STR(ci_task_status_short(CI__V1__TASK_STATUS__TASK_STATUS_RUNNING), "running");
    CHECK_STR(ci_task_status_short(CI__V1__TASK_STATUS__TASK_STATUS_QUEUED), "queued");
    CHECK_STR(ci_task_status_short(CI__V1__TASK_STATUS__TASK_STATUS_FAILED), "failed");
    CHECK_STR(ci_task_status_short(CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT), "timed_out");
    CHECK_STR(ci_task_status_short(CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED), "cancelled");
    CHECK_STR(ci_task_status_short(CI__V1__TASK_STATUS__TASK_STATUS_UNSPECIFIED), "unspecified");
    CHECK_STR(ci_task_status_short((Ci__V1__TaskStatus)99), "unspecified");
    CHECK(ci_task_status_terminal(CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED));
    CHECK(ci_task_status_terminal(CI__V1__TASK_STATUS__TASK_STATUS_FAILED));
    CHECK(ci_task_status_terminal(CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT));
    CHECK(ci_task_status_terminal(CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED));
    CHECK(!ci_task_status_terminal(CI__V1__TASK_STATUS__TASK_STATUS_RUNNING));
    CHECK(!ci_task_status_terminal(CI__V1__TASK_STATUS__TASK_STATUS_QUEUED));
    CHECK(!ci_task_status_terminal(CI__V1__TASK_STATUS__TASK_STATUS_UNSPECIFIED));
}

static void test_request_roundtrip(void)
{
    Ci__V1__InputFile f1 = CI__V1__INPUT_FILE__INIT, f2 = CI__V1__INPUT_FILE__INIT,
                      f3 = CI__V1__INPUT_FILE__INIT;
    static uint8_t bin[] = {0, 1, 2, 0xfb, 0xff, 'a', '\n'};
    f1.name = "sales.csv";
    f1.source_case = CI__V1__INPUT_FILE__SOURCE_CONTENT;
    f1.content.data = bin;
    f1.content.len = sizeof(bin);
    f2.name = "big.xlsx";
    f2.source_case = CI__V1__INPUT_FILE__SOURCE_OBJECT;
    f2.object = "uploads/big.xlsx";
    f3.name = "empty.txt"; /* a oneof member set to its default */
    f3.source_case = CI__V1__INPUT_FILE__SOURCE_CONTENT;
    Ci__V1__InputFile *files[] = {&f1, &f2, &f3};
    Ci__V1__Limits lim = CI__V1__LIMITS__INIT;
    lim.timeout_ms = 5000;
    lim.memory_mb = 2048;
    Ci__V1__Policy pol = CI__V1__POLICY__INIT;
    pol.network = "disabled";
    pol.packages = "base";
    Ci__V1__ExecutionRequest__LabelsEntry l1 = CI__V1__EXECUTION_REQUEST__LABELS_ENTRY__INIT,
                                          l2 = CI__V1__EXECUTION_REQUEST__LABELS_ENTRY__INIT;
    l1.key = "agent";
    l1.value = "planner \xc3\xa9";
    l2.key = "run";
    l2.value = "";
    Ci__V1__ExecutionRequest__LabelsEntry *labels[] = {&l1, &l2};
    Ci__V1__ExecutionRequest r = CI__V1__EXECUTION_REQUEST__INIT;
    r.task_id = "task-1_A";
    r.language = "python";
    r.code = "import pandas as pd\nprint(\"\\u00e9\", 1)\n";
    r.n_files = 3;
    r.files = files;
    r.limits = &lim;
    r.policy = &pol;
    r.runtime = "python-data-analysis-v1";
    r.n_labels = 2;
    r.labels = labels;
    roundtrip_both(&r.base);

    char *js = enc_json(&r.base);
    REQUIRE(js != NULL);
    CHECK_CONTAINS(js, "\"taskId\":\"task-1_A\"");
    CHECK_CONTAINS(js, "\"limits\":{\"timeoutMs\":5000,\"memoryMb\":2048}");
    CHECK_CONTAINS(js, "{\"name\":\"sales.csv\",\"content\":\"AAEC+/9hCg==\"}");
    CHECK_CONTAINS(js, "{\"name\":\"big.xlsx\",\"object\":\"uploads/big.xlsx\"}");
    CHECK_CONTAINS(js, "{\"name\":\"empty.txt\",\"content\":\"\"}");
    CHECK_CONTAINS(js, "\"labels\":{\"agent\":\"planner \xc3\xa9\",\"run\":\"\"}");
    CHECK(strstr(js, "\": ") == NULL && strstr(js, ", \"") == NULL); /* compact */
    CHECK(strstr(js, "task_id") == NULL);
    free(js);

    /* the decoded JSON gives the same fields back, and frees cleanly */
    uint8_t *buf;
    size_t n;
    REQUIRE(ci_message_encode(CI_ENC_JSON, &r.base, &buf, &n, &err) == CI_OK);
    ProtobufCMessage *m = NULL;
    REQUIRE(ci_message_decode(CI_ENC_JSON, &ci__v1__execution_request__descriptor, buf, n, &m,
                              &err) == CI_OK);
    free(buf);
    Ci__V1__ExecutionRequest *d = (Ci__V1__ExecutionRequest *)m;
    REQUIRE(d->n_files == 3);
    CHECK(d->files[0]->source_case == CI__V1__INPUT_FILE__SOURCE_CONTENT);
    CHECK(d->files[0]->content.len == sizeof(bin) && memcmp(d->files[0]->content.data, bin, sizeof(bin)) == 0);
    CHECK(d->files[1]->source_case == CI__V1__INPUT_FILE__SOURCE_OBJECT);
    CHECK_STR(d->files[1]->object, "uploads/big.xlsx");
    CHECK(d->files[2]->source_case == CI__V1__INPUT_FILE__SOURCE_CONTENT);
    CHECK(d->files[2]->content.len == 0);
    REQUIRE(d->n_labels == 2);
    CHECK_STR(d->labels[0]->key, "agent");
    CHECK_STR(d->labels[1]->value, "");
    CHECK(d->limits && d->limits->timeout_ms == 5000);
    ci_message_free(m);

    /* an empty message: "{}" and zero protobuf bytes */
    Ci__V1__ExecutionRequest e = CI__V1__EXECUTION_REQUEST__INIT;
    js = enc_json(&e.base);
    CHECK_STR(js, "{}");
    free(js);
    REQUIRE(ci_message_encode(CI_ENC_PROTOBUF, &e.base, &buf, &n, &err) == CI_OK);
    CHECK(n == 0 && buf != NULL);
    free(buf);
    roundtrip_both(&e.base);
}

static void fill_result(Ci__V1__ExecutionResult *r, Ci__V1__Artifact **arts,
                        Ci__V1__Usage *usage, Ci__V1__ExecutionResult__LabelsEntry **labels)
{
    r->task_id = "t42";
    r->status = CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED;
    r->stdout = "hello\n";
    r->stderr = "warning: x\n";
    r->_exit_code_case = CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE;
    r->exit_code = 0;
    r->n_artifacts = 2;
    r->artifacts = arts;
    r->usage = usage;
    r->error = "ZeroDivisionError: division by zero";
    r->hint = "check the divisor";
    r->stdout_truncated = 1;
    r->stderr_truncated = 1;
    r->worker = "w-1";
    r->attempt = 2;
    r->started_at_ms = 1700000000000LL;
    r->finished_at_ms = -1; /* negative int64 still round-trips */
    r->n_labels = 1;
    r->labels = labels;
    r->runtime = "python-data-analysis-v1";
    r->stdout_total_bytes = 18446744073709551615ULL;
    r->stderr_total_bytes = 4294967296ULL;
    r->isolation = "user,pid,net,mnt,ipc,uts,seccomp,cgroup";
}

static void test_result_roundtrip(void)
{
    Ci__V1__Artifact a1 = CI__V1__ARTIFACT__INIT, a2 = CI__V1__ARTIFACT__INIT;
    a1.name = "out.csv";
    a1.mime_type = "text/csv";
    a1.size = 12;
    a1.sha256 = "ab";
    a1.object = "t42/out.csv";
    a2.name = "figure-1.png";
    a2.mime_type = "image/png";
    a2.size = 5000000000ULL;
    Ci__V1__Artifact *arts[] = {&a1, &a2};
    Ci__V1__Usage u = CI__V1__USAGE__INIT;
    u.duration_ms = 1234;
    u.memory_mb = 77;
    u.cpu_ms = 999;
    Ci__V1__ExecutionResult__LabelsEntry l = CI__V1__EXECUTION_RESULT__LABELS_ENTRY__INIT;
    l.key = "k";
    l.value = "v";
    Ci__V1__ExecutionResult__LabelsEntry *labels[] = {&l};
    Ci__V1__ExecutionResult r = CI__V1__EXECUTION_RESULT__INIT;
    fill_result(&r, arts, &u, labels);
    roundtrip_both(&r.base);

    char *js = enc_json(&r.base);
    REQUIRE(js != NULL);
    CHECK_CONTAINS(js, "\"status\":\"TASK_STATUS_SUCCEEDED\"");
    CHECK_CONTAINS(js, "\"exitCode\":0");
    CHECK_CONTAINS(js, "\"startedAtMs\":\"1700000000000\"");
    CHECK_CONTAINS(js, "\"finishedAtMs\":\"-1\"");
    CHECK_CONTAINS(js, "\"stdoutTotalBytes\":\"18446744073709551615\"");
    CHECK_CONTAINS(js, "\"size\":\"5000000000\"");
    CHECK_CONTAINS(js, "\"mimeType\":\"image/png\"");
    CHECK_CONTAINS(js, "\"usage\":{\"durationMs\":\"1234\",\"memoryMb\":77,\"cpuMs\":\"999\"}");
    CHECK_CONTAINS(js, "\"stdoutTruncated\":true");
    CHECK_CONTAINS(js, "\"attempt\":2");
    CHECK_CONTAINS(js, "\"labels\":{\"k\":\"v\"}");
    free(js);

    /* exit_code absent: no "exitCode" in JSON, and absence survives */
    r._exit_code_case = CI__V1__EXECUTION_RESULT___EXIT_CODE__NOT_SET;
    js = enc_json(&r.base);
    REQUIRE(js != NULL);
    CHECK(strstr(js, "exitCode") == NULL);
    ProtobufCMessage *m = dj(&ci__v1__execution_result__descriptor, js);
    REQUIRE(m != NULL);
    CHECK(((Ci__V1__ExecutionResult *)m)->_exit_code_case ==
          CI__V1__EXECUTION_RESULT___EXIT_CODE__NOT_SET);
    ci_message_free(m);
    free(js);
    roundtrip_both(&r.base);

    /* exit_code present as 0 is kept apart from absent, both ways */
    r._exit_code_case = CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE;
    r.exit_code = 0;
    uint8_t *buf;
    size_t n;
    REQUIRE(ci_message_encode(CI_ENC_PROTOBUF, &r.base, &buf, &n, &err) == CI_OK);
    m = NULL;
    REQUIRE(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_result__descriptor, buf, n, &m,
                              &err) == CI_OK);
    CHECK(((Ci__V1__ExecutionResult *)m)->_exit_code_case ==
          CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE);
    CHECK(((Ci__V1__ExecutionResult *)m)->exit_code == 0);
    ci_message_free(m);
    free(buf);
    m = dj(&ci__v1__execution_result__descriptor, "{\"exitCode\":0}");
    REQUIRE(m != NULL);
    CHECK(((Ci__V1__ExecutionResult *)m)->_exit_code_case ==
          CI__V1__EXECUTION_RESULT___EXIT_CODE_EXIT_CODE);
    ci_message_free(m);
    m = dj(&ci__v1__execution_result__descriptor, "{\"exit_code\":-9}");
    REQUIRE(m != NULL);
    CHECK(((Ci__V1__ExecutionResult *)m)->exit_code == -9);
    ci_message_free(m);
    m = dj(&ci__v1__execution_result__descriptor, "{\"exitCode\":null}");
    REQUIRE(m != NULL);
    CHECK(((Ci__V1__ExecutionResult *)m)->_exit_code_case ==
          CI__V1__EXECUTION_RESULT___EXIT_CODE__NOT_SET);
    ci_message_free(m);
}

/* Rich outputs (docs/contract.md section 17): a repeated message holding a
 * string map, both encodings; JSON names and the map as an object. */
static void test_result_outputs(void)
{
    Ci__V1__Output__DataEntry d1 = CI__V1__OUTPUT__DATA_ENTRY__INIT,
                              d2 = CI__V1__OUTPUT__DATA_ENTRY__INIT;
    d1.key = "text/plain";
    d1.value = "   a\n0  1";
    d2.key = "application/json";
    d2.value = "[{\"a\":1}]";
    Ci__V1__Output__DataEntry *data[] = {&d1, &d2};
    Ci__V1__Output o1 = CI__V1__OUTPUT__INIT, o2 = CI__V1__OUTPUT__INIT;
    o1.kind = "display";
    o1.n_data = 2;
    o1.data = data;
    o1.total_rows = 1000;
    o1.truncated = true;
    o2.kind = "result";
    o2.artifact = "output-2.png";
    Ci__V1__Output *outs[] = {&o1, &o2};
    Ci__V1__ExecutionResult r = CI__V1__EXECUTION_RESULT__INIT;
    r.task_id = "t1";
    r.n_outputs = 2;
    r.outputs = outs;
    r.outputs_truncated = true;
    roundtrip_both(&r.base);

    char *js = enc_json(&r.base);
    REQUIRE(js != NULL);
    CHECK_CONTAINS(js, "\"outputs\":[{\"data\":{\"text/plain\":\"   a\\n0  1\","
                       "\"application/json\":\"[{\\\"a\\\":1}]\"},\"kind\":\"display\","
                       "\"truncated\":true,\"totalRows\":\"1000\"},"
                       "{\"kind\":\"result\",\"artifact\":\"output-2.png\"}]");
    CHECK_CONTAINS(js, "\"outputsTruncated\":true");
    ProtobufCMessage *m = dj(&ci__v1__execution_result__descriptor, js);
    REQUIRE(m != NULL);
    Ci__V1__ExecutionResult *back = (Ci__V1__ExecutionResult *)m;
    REQUIRE(back->n_outputs == 2);
    REQUIRE(back->outputs[0]->n_data == 2);
    CHECK_STR(back->outputs[0]->data[1]->key, "application/json");
    CHECK_STR(back->outputs[0]->data[1]->value, "[{\"a\":1}]");
    CHECK(back->outputs[0]->total_rows == 1000);
    CHECK_STR(back->outputs[1]->artifact, "output-2.png");
    ci_message_free(m);
    free(js);

    /* the proto names are read too; a map value must be a string */
    m = dj(&ci__v1__execution_result__descriptor,
           "{\"outputs\":[{\"data\":{\"text/plain\":\"1\"},\"total_rows\":3}],"
           "\"outputs_truncated\":true}");
    REQUIRE(m != NULL);
    back = (Ci__V1__ExecutionResult *)m;
    REQUIRE(back->n_outputs == 1);
    CHECK(back->outputs[0]->total_rows == 3);
    CHECK(back->outputs_truncated);
    ci_message_free(m);
    CHECK(dj(&ci__v1__execution_result__descriptor,
             "{\"outputs\":[{\"data\":{\"text/plain\":1}}]}") == NULL);
}

static void test_status_event(void)
{
    Ci__V1__StatusEvent ev = CI__V1__STATUS_EVENT__INIT;
    ev.task_id = "t1";
    ev.status = CI__V1__TASK_STATUS__TASK_STATUS_RUNNING;
    ev.at_ms = 123;
    ev._exit_code_case = CI__V1__STATUS_EVENT___EXIT_CODE_EXIT_CODE;
    ev.exit_code = 0;
    char *js = enc_json(&ev.base);
    CHECK_STR(js, "{\"taskId\":\"t1\",\"status\":\"TASK_STATUS_RUNNING\",\"atMs\":\"123\",\"exitCode\":0}");
    free(js);
    roundtrip_both(&ev.base);
    ev.worker = "w";
    ev.message = "started";
    ev._exit_code_case = CI__V1__STATUS_EVENT___EXIT_CODE__NOT_SET;
    js = enc_json(&ev.base);
    CHECK_STR(js, "{\"taskId\":\"t1\",\"status\":\"TASK_STATUS_RUNNING\",\"atMs\":\"123\","
                  "\"worker\":\"w\",\"message\":\"started\"}");
    free(js);
    roundtrip_both(&ev.base);
    /* an enum value with no name is written as its number and read back */
    ev.status = (Ci__V1__TaskStatus)42;
    js = enc_json(&ev.base);
    CHECK_CONTAINS(js, "\"status\":42");
    free(js);
    roundtrip_both(&ev.base);
}

static void test_contract_example(void)
{
    Ci__V1__ExecutionRequest *r =
        req_json("{\"language\":\"python\",\"code\":\"print(1)\",\"limits\":{\"timeoutMs\":5000}}");
    REQUIRE(r != NULL);
    CHECK_STR(r->language, "python");
    CHECK_STR(r->code, "print(1)");
    CHECK_STR(r->task_id, "");
    CHECK(r->limits != NULL && r->limits->timeout_ms == 5000 && r->limits->memory_mb == 0);
    CHECK(r->policy == NULL);
    CHECK(r->n_files == 0 && r->n_labels == 0);
    ci_message_free(&r->base);
}

static void test_json_input_forms(void)
{
    /* snake_case names, 32-bit ints as strings and as integral reals */
    Ci__V1__ExecutionRequest *r = req_json(
        "{\"task_id\":\"a\",\"limits\":{\"timeout_ms\":\"5000\",\"memory_mb\":1.024e3},"
        "\"files\":[{\"name\":\"x\",\"content\":\"AAEC-_9hCg\"}],\"labels\":{\"a\":\"b\"},"
        "\"policy\":null,\"runtime\":null}");
    if (!r)
        fprintf(stderr, "%s\n", err.msg);
    REQUIRE(r != NULL);
    CHECK_STR(r->task_id, "a");
    CHECK(r->limits->timeout_ms == 5000 && r->limits->memory_mb == 1024);
    REQUIRE(r->n_files == 1);
    static const uint8_t bin[] = {0, 1, 2, 0xfb, 0xff, 'a', '\n'};
    CHECK(r->files[0]->content.len == 7 && memcmp(r->files[0]->content.data, bin, 7) == 0);
    CHECK(r->policy == NULL);
    CHECK_STR(r->runtime, "");
    ci_message_free(&r->base);

    /* 64-bit ints as numbers and strings, enums as names and numbers */
    ProtobufCMessage *m = dj(&ci__v1__execution_result__descriptor,
                             "{\"startedAtMs\":1700000000000,\"finishedAtMs\":\"-5\","
                             "\"stdoutTotalBytes\":\"18446744073709551615\",\"status\":3,"
                             "\"usage\":{\"cpuMs\":\"0\",\"durationMs\":7}}");
    if (!m)
        fprintf(stderr, "%s\n", err.msg);
    REQUIRE(m != NULL);
    Ci__V1__ExecutionResult *res = (Ci__V1__ExecutionResult *)m;
    CHECK(res->started_at_ms == 1700000000000LL);
    CHECK(res->finished_at_ms == -5);
    CHECK(res->stdout_total_bytes == 18446744073709551615ULL);
    CHECK(res->status == CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED);
    CHECK(res->usage && res->usage->duration_ms == 7);
    ci_message_free(m);
    m = dj(&ci__v1__execution_result__descriptor, "{\"status\":\"TASK_STATUS_TIMED_OUT\"}");
    REQUIRE(m != NULL);
    CHECK(((Ci__V1__ExecutionResult *)m)->status == CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT);
    ci_message_free(m);

    /* padded and unpadded, standard and URL-safe base64 */
    const char *b64[] = {"\"/+8=\"", "\"_-8\"", "\"/+8\"", "\"_-8=\""};
    for (size_t i = 0; i < 4; i++) {
        char js[128];
        snprintf(js, sizeof(js), "{\"files\":[{\"name\":\"x\",\"content\":%s}]}", b64[i]);
        r = req_json(js);
        CHECK(r != NULL);
        if (r) {
            CHECK(r->files[0]->content.len == 2 && r->files[0]->content.data[0] == 0xff &&
                  r->files[0]->content.data[1] == 0xef);
            ci_message_free(&r->base);
        }
    }

    /* whitespace, unicode escapes and a body that is not NUL-terminated */
    static const char body[] = " { \"code\" : \"\\u00e9\\ud83d\\ude00\" } XXXX";
    m = NULL;
    CHECK(ci_message_decode(CI_ENC_JSON, &ci__v1__execution_request__descriptor,
                            (const uint8_t *)body, sizeof(body) - 1 - 5, &m, &err) == CI_OK);
    if (m)
        CHECK_STR(((Ci__V1__ExecutionRequest *)m)->code, "\xc3\xa9\xf0\x9f\x98\x80");
    ci_message_free(m);
}

static void test_json_errors(void)
{
    CHECK_JSON_FAILS("{\"language\":\"python\",\"x\":1}", "unknown field 'x' in ExecutionRequest");
    CHECK_JSON_FAILS("{\"limits\":{\"timeout\":1}}", "unknown field 'limits.timeout'");
    CHECK_CONTAINS(err.msg, "timeoutMs");
    CHECK_JSON_FAILS("{\"limits\":{\"timeoutMs\":\"abc\"}}", "field 'limits.timeoutMs'");
    CHECK_JSON_FAILS("{\"limits\":{\"timeoutMs\":true}}", "field 'limits.timeoutMs': expected a number");
    CHECK_JSON_FAILS("{\"limits\":{\"timeoutMs\":1.5}}", "not an integer");
    CHECK_JSON_FAILS("{\"limits\":{\"timeoutMs\":-1}}", "out of range for uint32");
    CHECK_JSON_FAILS("{\"limits\":{\"timeoutMs\":4294967296}}", "out of range for uint32");
    CHECK_JSON_FAILS("{\"limits\":{\"timeoutMs\":\"4294967296\"}}", "out of range");
    CHECK_JSON_FAILS("{\"limits\":{\"timeoutMs\":\"+5\"}}", "not an integer");
    CHECK_JSON_FAILS("{\"limits\":{\"timeoutMs\":\" 5\"}}", "not an integer");
    CHECK_JSON_FAILS("{\"limits\":{\"timeoutMs\":1e300}}", "out of range");
    CHECK_JSON_FAILS("{\"limits\":5}", "field 'limits': expected an object");
    CHECK_JSON_FAILS("{\"code\":5}", "field 'code': expected a string");
    CHECK_JSON_FAILS("{\"files\":{}}", "field 'files': expected an array");
    CHECK_JSON_FAILS("{\"files\":[{\"name\":7}]}", "field 'files[0].name'");
    CHECK_JSON_FAILS("{\"files\":[null]}", "files[0]");
    CHECK_JSON_FAILS("{\"files\":[{\"name\":\"a\",\"content\":\"!!!!\"}]}", "files[0].content");
    CHECK_CONTAINS(err.msg, "base64");
    CHECK_JSON_FAILS("{\"files\":[{\"name\":\"a\",\"content\":\"QQ=\"}]}", "base64");
    CHECK_JSON_FAILS("{\"files\":[{\"name\":\"a\",\"content\":\"Q\"}]}", "base64");
    CHECK_JSON_FAILS("{\"files\":[{\"name\":\"a\",\"content\":\"QQ\",\"object\":\"o\"}]}",
                     "cannot both be set");
    CHECK_JSON_FAILS("{\"labels\":[\"a\"]}", "field 'labels': expected an object");
    CHECK_JSON_FAILS("{\"labels\":{\"a\":1}}", "labels[\"a\"]");
    CHECK_JSON_FAILS("{\"labels\":{\"a\":null}}", "null");
    CHECK_JSON_FAILS("{\"limits\":{\"timeoutMs\":1,\"timeout_ms\":2}}", "given twice");
    CHECK_JSON_FAILS("{\"code\":\"a\",\"code\":\"b\"}", "not valid JSON");
    CHECK_JSON_FAILS("[1,2]", "must be a JSON object");
    CHECK_JSON_FAILS("\"str\"", "not valid JSON");
    CHECK_JSON_FAILS("", "not valid JSON");
    CHECK_JSON_FAILS("{\"code\":\"a\\u0000b\"}", "not valid JSON");
    CHECK_JSON_FAILS("{\"code\":\"\xff\xfe\"}", "not valid JSON");
    CHECK_JSON_FAILS("{\"code\":\"\xed\xa0\x80\"}", "not valid JSON"); /* a surrogate */
    CHECK_JSON_FAILS("{\"code\":\"a\"} trailing", "not valid JSON");
    CHECK_JSON_FAILS("{\"\xc3\xa9\xff\":1}", "not valid JSON");

    ProtobufCMessage *m = dj(&ci__v1__execution_result__descriptor, "{\"status\":\"DONE\"}");
    CHECK(m == NULL);
    CHECK_CONTAINS(err.msg, "unknown TaskStatus value 'DONE'");
    CHECK_CONTAINS(err.msg, "TASK_STATUS_SUCCEEDED");
    m = dj(&ci__v1__execution_result__descriptor, "{\"status\":1.5}");
    CHECK(m == NULL);
    m = dj(&ci__v1__execution_result__descriptor, "{\"stdoutTruncated\":1}");
    CHECK(m == NULL);
    CHECK_CONTAINS(err.msg, "field 'stdoutTruncated': expected true or false");
    m = dj(&ci__v1__execution_result__descriptor, "{\"exitCode\":2147483648}");
    CHECK(m == NULL);
    CHECK_CONTAINS(err.msg, "out of range for int32");
    m = dj(&ci__v1__execution_result__descriptor, "{\"startedAtMs\":\"9223372036854775808\"}");
    CHECK(m == NULL);
    CHECK_CONTAINS(err.msg, "out of range for int64");
    m = dj(&ci__v1__execution_result__descriptor, "{\"stdoutTotalBytes\":\"18446744073709551616\"}");
    CHECK(m == NULL);
    CHECK_CONTAINS(err.msg, "out of range for uint64");
    m = dj(&ci__v1__execution_result__descriptor, "{\"stdoutTotalBytes\":\"-1\"}");
    CHECK(m == NULL);
    m = dj(&ci__v1__execution_result__descriptor, "{\"artifacts\":[{\"size\":{}}]}");
    CHECK(m == NULL);
    CHECK_CONTAINS(err.msg, "field 'artifacts[0].size': expected a number");

    /* user text in errors is cut short and kept to printable ASCII */
    char big[600];
    memset(big, 'k', sizeof(big));
    memcpy(big, "{\"\xc3\xa9", 4);
    memcpy(big + sizeof(big) - 5, "\":1}", 5);
    CHECK_JSON_FAILS(big, "unknown field '??kkk");
    for (const char *c = err.msg; *c; c++)
        CHECK((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f);

    /* hostile nesting stops cleanly */
    size_t depth = 100000;
    char *deep = malloc(depth * 2 + 32);
    REQUIRE(deep != NULL);
    size_t o = 0;
    o += (size_t)snprintf(deep, 32, "{\"files\":");
    for (size_t i = 0; i < depth; i++)
        deep[o++] = '[';
    for (size_t i = 0; i < depth; i++)
        deep[o++] = ']';
    deep[o++] = '}';
    deep[o] = '\0';
    CHECK_JSON_FAILS(deep, "JSON");
    free(deep);
}

static void test_protobuf_errors(void)
{
    ProtobufCMessage *m = NULL;
    static const uint8_t junk[] = {0x0a, 0x05, 'a'}; /* length past the end */
    CHECK(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_request__descriptor, junk,
                            sizeof(junk), &m, &err) == CI_ERR_INVALID);
    CHECK(m == NULL);
    CHECK_CONTAINS(err.msg, "not a valid protobuf ExecutionRequest");

    const char *js = "{\"language\":\"python\",\"code\":\"print(1)\"}";
    CHECK(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_request__descriptor,
                            (const uint8_t *)js, strlen(js), &m, &err) == CI_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "application/json");

    /* field number 0, spelled as a two-byte varint, which protobuf-c would
     * accept and then write back in a form it refuses */
    static const uint8_t field0[] = {0x81, 0x00, 1, 2, 3, 4, 5, 6, 7, 8};
    CHECK(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_request__descriptor, field0,
                            sizeof(field0), &m, &err) == CI_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "not a valid protobuf ExecutionRequest");

    /* strings that C cannot hold or that are not UTF-8 are refused */
    static const uint8_t bad_utf8[] = {0x1a, 0x02, 0xc3, 0x28}; /* code = "\xc3(" */
    CHECK(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_request__descriptor, bad_utf8,
                            sizeof(bad_utf8), &m, &err) == CI_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "field 'code' is not valid UTF-8");
    /* files[1].name = "a\0b.csv" */
    static const uint8_t nul_name[] = {0x22, 0x03, 0x0a, 0x01, 'x',                       /* files[0] */
                                       0x22, 0x09, 0x0a, 0x07, 'a', 0, 'b', '.', 'c', 's', 'v'};
    CHECK(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_request__descriptor, nul_name,
                            sizeof(nul_name), &m, &err) == CI_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "field 'files[1].name' contains a NUL byte");
    /* bytes may hold anything */
    static const uint8_t bin[] = {0x22, 0x07, 0x0a, 0x01, 'x', 0x12, 0x02, 0x00, 0xff};
    m = NULL;
    CHECK(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_request__descriptor, bin,
                            sizeof(bin), &m, &err) == CI_OK);
    if (m) {
        Ci__V1__ExecutionRequest *r = (Ci__V1__ExecutionRequest *)m;
        CHECK(r->n_files == 1 && r->files[0]->content.len == 2);
    }
    ci_message_free(m);
    /* unknown fields are skipped, as protobuf readers do */
    static const uint8_t unk[] = {0x1a, 0x01, 'x', 0xf8, 0x07, 0x01, 0x82, 0x08, 0x01, 0xff};
    m = NULL;
    CHECK(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_request__descriptor, unk,
                            sizeof(unk), &m, &err) == CI_OK);
    if (m)
        CHECK_STR(((Ci__V1__ExecutionRequest *)m)->code, "x");
    ci_message_free(m);
    /* an empty body is an empty message */
    m = NULL;
    CHECK(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_request__descriptor, NULL, 0, &m,
                            &err) == CI_OK);
    CHECK(m != NULL);
    ci_message_free(m);
    ci_message_free(NULL);
}

static void test_encode_invalid_utf8(void)
{
    Ci__V1__ExecutionResult r = CI__V1__EXECUTION_RESULT__INIT;
    r.task_id = "t";
    r.stdout = "ok \xff\xfe end \xe2\x82";
    Ci__V1__Artifact a = CI__V1__ARTIFACT__INIT;
    a.name = "bad\xc0.csv";
    Ci__V1__Artifact *arts[] = {&a};
    r.n_artifacts = 1;
    r.artifacts = arts;
    char *js = enc_json(&r.base);
    REQUIRE(js != NULL);
    /* each invalid byte becomes one U+FFFD */
    CHECK_CONTAINS(js, "\"stdout\":\"ok \xef\xbf\xbd\xef\xbf\xbd end \xef\xbf\xbd\xef\xbf\xbd\"");
    CHECK_CONTAINS(js, "bad\xef\xbf\xbd.csv");
    free(js);
    uint8_t *buf;
    size_t n;
    REQUIRE(ci_message_encode(CI_ENC_PROTOBUF, &r.base, &buf, &n, &err) == CI_OK);
    ProtobufCMessage *m = NULL;
    CHECK(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_result__descriptor, buf, n, &m,
                            &err) == CI_OK);
    if (m) {
        Ci__V1__ExecutionResult *d = (Ci__V1__ExecutionResult *)m;
        CHECK_STR(d->stdout, "ok \xef\xbf\xbd\xef\xbf\xbd end \xef\xbf\xbd\xef\xbf\xbd");
        CHECK_STR(d->artifacts[0]->name, "bad\xef\xbf\xbd.csv");
        CHECK_STR(d->task_id, "t");
    }
    ci_message_free(m);
    free(buf);
    /* the caller's message is left as it was */
    CHECK_STR(r.stdout, "ok \xff\xfe end \xe2\x82");
}

static void test_every_prefix_frees(void)
{
    /* decoding each prefix of a full request must fail or succeed without
     * leaking (ASan) - exercises every half-built state */
    const char *js = "{\"taskId\":\"a\",\"files\":[{\"name\":\"x\",\"content\":\"QUJD\"},"
                     "{\"name\":\"y\",\"object\":\"o\"}],\"labels\":{\"a\":\"b\",\"c\":\"d\"},"
                     "\"limits\":{\"timeoutMs\":5},\"policy\":{\"network\":\"disabled\"}}";
    size_t n = strlen(js);
    int ok = 0;
    for (size_t i = 0; i <= n; i++) {
        ProtobufCMessage *m = NULL;
        if (ci_message_decode(CI_ENC_JSON, &ci__v1__execution_request__descriptor,
                              (const uint8_t *)js, i, &m, &err) == CI_OK) {
            ok++;
            ci_message_free(m);
        }
    }
    CHECK(ok == 1);
    /* a failure half-way through a list or a map frees what was built */
    CHECK_JSON_FAILS("{\"files\":[{\"name\":\"x\",\"content\":\"QUJD\"},{\"name\":1}]}",
                     "files[1].name");
    CHECK_JSON_FAILS("{\"labels\":{\"a\":\"b\",\"c\":5}}", "labels[\"c\"]");
    CHECK_JSON_FAILS("{\"code\":\"x\",\"files\":[{\"name\":\"x\",\"object\":\"o\",\"content\":\"\"}]}",
                     "cannot both be set");

    /* the same for protobuf: each prefix of a full encoding */
    Ci__V1__ExecutionRequest *r = req_json(js);
    REQUIRE(r != NULL);
    uint8_t *buf;
    size_t bn;
    REQUIRE(ci_message_encode(CI_ENC_PROTOBUF, &r->base, &buf, &bn, &err) == CI_OK);
    ci_message_free(&r->base);
    for (size_t i = 0; i <= bn; i++) {
        ProtobufCMessage *m = NULL;
        if (ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_request__descriptor, buf, i, &m,
                              &err) == CI_OK)
            ci_message_free(m);
    }
    free(buf);
}

TEST_MAIN(T(test_content_types), T(test_status_names), T(test_request_roundtrip),
          T(test_result_roundtrip), T(test_result_outputs), T(test_status_event), T(test_contract_example),
          T(test_json_input_forms), T(test_json_errors), T(test_protobuf_errors),
          T(test_encode_invalid_utf8), T(test_every_prefix_frees))
