/* test_request.c - each rule of docs/contract.md ("Messages", "Limits"), one failing case each. */
#include <stdlib.h>
#include <string.h>

#include "core/codec.h"
#include "core/request.h"
#include "core/util.h"
#include "testutil.h"

static struct ci_config cfg;
static struct ci_error err;

/* The config's limits by hand (the YAML loader is tested on its own). */
static void setup(void)
{
    memset(&cfg, 0, sizeof(cfg));
    cfg.limits.default_timeout_ms = 60000;
    cfg.limits.max_timeout_ms = 60000;
    cfg.limits.default_memory_mb = 1024;
    cfg.limits.max_memory_mb = 4096;
    cfg.limits.max_code_bytes = 1024 * 1024;
    cfg.limits.max_input_bytes = 20 * 1024 * 1024;
    cfg.limits.max_artifact_bytes = 20 * 1024 * 1024;
    cfg.limits.max_output_bytes = 1024 * 1024;
}

static Ci__V1__ExecutionRequest *from_json(const char *json)
{
    ProtobufCMessage *m = NULL;
    if (ci_message_decode(CI_ENC_JSON, &ci__v1__execution_request__descriptor,
                          (const uint8_t *)json, strlen(json), &m, &err)) {
        fprintf(stderr, "decode: %s\n", err.msg);
        return NULL;
    }
    return (Ci__V1__ExecutionRequest *)m;
}

/* Validates the JSON request; returns the status, err holds the reason. */
static ci_status validate_json(const char *json, uint32_t *t, uint32_t *mem)
{
    Ci__V1__ExecutionRequest *r = from_json(json);
    if (!r)
        return CI_ERR_NOMEM; /* never what a test expects */
    err.msg[0] = '\0';
    ci_status s = ci_request_validate(&cfg, r, t, mem, &err);
    ci_message_free(&r->base);
    return s;
}

#define CHECK_REFUSED(json, needle)                                                 \
    do {                                                                            \
        uint32_t t_ = 7, m_ = 7;                                                    \
        ci_status s_ = validate_json(json, &t_, &m_);                               \
        CHECK(s_ == CI_ERR_INVALID || s_ == CI_ERR_LIMIT);                          \
        CHECK(t_ == 7 && m_ == 7); /* outputs untouched on failure */               \
        CHECK_CONTAINS(err.msg, needle);                                            \
    } while (0)

#define OK_JSON "{\"language\":\"python\",\"code\":\"print(1)\""

static void test_task_id(void)
{
    CHECK(ci_task_id_valid("a"));
    CHECK(ci_task_id_valid("Task_1-x"));
    char id[66];
    memset(id, 'a', 64);
    id[64] = '\0';
    CHECK(ci_task_id_valid(id));
    id[64] = 'a';
    id[65] = '\0';
    CHECK(!ci_task_id_valid(id));
    CHECK(!ci_task_id_valid(""));
    CHECK(!ci_task_id_valid(NULL));
    CHECK(!ci_task_id_valid("a b"));
    CHECK(!ci_task_id_valid("a.b"));
    CHECK(!ci_task_id_valid("a/b"));
    CHECK(!ci_task_id_valid("ci.status.>"));
    CHECK(!ci_task_id_valid("\xc3\xa9"));
    setup();
    CHECK_REFUSED(OK_JSON ",\"taskId\":\"bad id!\"}", "task_id 'bad id!' is not valid");
    uint32_t t, m;
    CHECK(validate_json(OK_JSON ",\"taskId\":\"good-1\"}", &t, &m) == CI_OK);
}

/* A session id is one subject token (ci.submit.<id>) and part of object
 * names (sessions/<id>/<step>): the task id's rules, nothing else. */
static void test_session_id(void)
{
    setup();
    uint32_t t, m;
    CHECK(validate_json(OK_JSON ",\"sessionId\":\"s_1-A\"}", &t, &m) == CI_OK);
    CHECK(validate_json(OK_JSON ",\"session_id\":\"s1\"}", &t, &m) == CI_OK);
    CHECK_REFUSED(OK_JSON ",\"sessionId\":\"a.b\"}", "session_id 'a.b' (3 bytes) is not a session id");
    CHECK_REFUSED(OK_JSON ",\"sessionId\":\"*\"}", "is not a session id");
    CHECK_REFUSED(OK_JSON ",\"sessionId\":\">\"}", "is not a session id");
    CHECK_REFUSED(OK_JSON ",\"sessionId\":\"../x\"}", "is not a session id");
    CHECK_REFUSED(OK_JSON ",\"sessionId\":\"a b\"}", "is not a session id");
    CHECK_REFUSED(OK_JSON ",\"sessionId\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}",
                  "(65 bytes) is not a session id");
}

/* A batch id is one subject token (ci.batch.<id>, ci.batches.<id>.*); a
 * task is a session's step or a batch's task, not both. */
static void test_batch_id(void)
{
    setup();
    uint32_t t, m;
    CHECK(validate_json(OK_JSON ",\"batchId\":\"b_1-A\"}", &t, &m) == CI_OK);
    CHECK(validate_json(OK_JSON ",\"batch_id\":\"b1\"}", &t, &m) == CI_OK);
    CHECK_REFUSED(OK_JSON ",\"batchId\":\"a.b\"}", "batch_id 'a.b' (3 bytes) is not a batch id");
    CHECK_REFUSED(OK_JSON ",\"batchId\":\"*\"}", "is not a batch id");
    CHECK_REFUSED(OK_JSON ",\"batchId\":\">\"}", "is not a batch id");
    CHECK_REFUSED(OK_JSON ",\"batchId\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}",
                  "(65 bytes) is not a batch id");
    CHECK_REFUSED(OK_JSON ",\"batchId\":\"b1\",\"sessionId\":\"s1\"}",
                  "a session's step or a batch's task, not both");
}

/* Sessions' states are no inputs: a task could read another session's. */
static void test_session_state_no_input(void)
{
    setup();
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"a.csv\",\"object\":\".sessions/victim/1-1\"}]}",
                  "input 'a.csv' names an object under '.sessions/'");
    uint32_t t, m;
    CHECK(validate_json(OK_JSON ",\"files\":[{\"name\":\"a.csv\",\"object\":\"sessions/x\"}]}",
                        &t, &m) == CI_OK);
}

static void test_input_name(void)
{
    CHECK(ci_input_name_valid("sales.csv", 9));
    CHECK(ci_input_name_valid("My File_2-b.xlsx", 16));
    CHECK(ci_input_name_valid("a", 1));
    CHECK(!ci_input_name_valid("", 0));
    CHECK(!ci_input_name_valid(".env", 4));
    CHECK(!ci_input_name_valid("..", 2));
    CHECK(!ci_input_name_valid("../x.csv", 8));
    CHECK(!ci_input_name_valid("a/b", 3));
    CHECK(!ci_input_name_valid("a\\b", 3));
    CHECK(!ci_input_name_valid("a\0b", 3)); /* the NUL is seen through len */
    CHECK(!ci_input_name_valid("caf\xc3\xa9", 5));
    CHECK(!ci_input_name_valid("a\nb", 3));
    CHECK(!ci_input_name_valid("x\xe2\x80\xaegnp.csv", 10)); /* U+202E */
    CHECK(!ci_input_name_valid("a\xe2\x80\x8b", 4));         /* U+200B */
    CHECK(!ci_input_name_valid("a\xff", 2));
    char name[130];
    memset(name, 'n', sizeof(name));
    CHECK(ci_input_name_valid(name, 128));
    CHECK(!ci_input_name_valid(name, 129));
}

static void test_valid_and_defaults(void)
{
    setup();
    uint32_t t = 0, m = 0;
    CHECK(validate_json(OK_JSON "}", &t, &m) == CI_OK);
    CHECK(t == 60000 && m == 1024);
    CHECK(validate_json(OK_JSON ",\"limits\":{\"timeoutMs\":5000,\"memoryMb\":4096},"
                                "\"runtime\":\"python-data-analysis-v1\","
                                "\"policy\":{\"network\":\"disabled\",\"packages\":\"base\"},"
                                "\"files\":[{\"name\":\"a.csv\",\"content\":\"QUJD\"},"
                                "{\"name\":\"b.xlsx\",\"object\":\"up/b.xlsx\"},"
                                "{\"name\":\"empty\",\"content\":\"\"}],"
                                "\"labels\":{\"who\":\"agent\"}}",
                        &t, &m) == CI_OK);
    CHECK(t == 5000 && m == 4096);
    CHECK(validate_json(OK_JSON ",\"policy\":{},\"limits\":{}}", &t, &m) == CI_OK);
    CHECK(t == 60000 && m == 1024);
    /* NULL outputs are allowed */
    Ci__V1__ExecutionRequest *r = from_json(OK_JSON "}");
    REQUIRE(r != NULL);
    CHECK(ci_request_validate(&cfg, r, NULL, NULL, &err) == CI_OK);
    ci_message_free(&r->base);
}

static void test_language(void)
{
    setup();
    CHECK_REFUSED("{\"language\":\"ruby\",\"code\":\"puts 1\"}",
                  "unsupported language 'ruby': only 'python' is supported");
    CHECK_REFUSED("{\"code\":\"print(1)\"}", "unsupported language ''");
    CHECK_REFUSED("{\"language\":\"Python\",\"code\":\"print(1)\"}", "unsupported language 'Python'");
}

static void test_code(void)
{
    setup();
    CHECK_REFUSED("{\"language\":\"python\"}", "code is empty");
    CHECK_REFUSED("{\"language\":\"python\",\"code\":\"\"}", "code is empty");
    cfg.limits.max_code_bytes = 8;
    CHECK_REFUSED("{\"language\":\"python\",\"code\":\"print(123)\"}", "code is 10 bytes; the limit is 8 bytes");
    uint32_t t, m;
    CHECK(validate_json("{\"language\":\"python\",\"code\":\"print(1)\"}", &t, &m) == CI_OK);
    /* megabytes are shown as such */
    setup();
    size_t n = 1024 * 1024 + 300 * 1024;
    char *js = malloc(n + 64);
    REQUIRE(js != NULL);
    size_t o = (size_t)snprintf(js, 64, "{\"language\":\"python\",\"code\":\"");
    memset(js + o, 'x', n);
    memcpy(js + o + n, "\"}", 3);
    CHECK_REFUSED(js, "code is 1.3 MiB; the limit is 1 MiB");
    free(js);
}

static void test_runtime(void)
{
    setup();
    CHECK_REFUSED(OK_JSON ",\"runtime\":\"python-3.13\"}",
                  "unsupported runtime 'python-3.13': only 'python-data-analysis-v1'");
}

static void test_limits(void)
{
    setup();
    CHECK_REFUSED(OK_JSON ",\"limits\":{\"timeoutMs\":90000}}",
                  "timeout_ms 90000 is above the limit of 60000");
    CHECK_REFUSED(OK_JSON ",\"limits\":{\"memoryMb\":8192}}",
                  "memory_mb 8192 is above the limit of 4096");
    uint32_t t, m;
    CHECK(validate_json(OK_JSON ",\"limits\":{\"timeoutMs\":60000,\"memoryMb\":1}}", &t, &m) ==
          CI_OK);
    CHECK(t == 60000 && m == 1);
    /* the defaults come from the config */
    cfg.limits.default_timeout_ms = 1234;
    cfg.limits.default_memory_mb = 99;
    CHECK(validate_json(OK_JSON "}", &t, &m) == CI_OK);
    CHECK(t == 1234 && m == 99);
}

static void test_policy(void)
{
    setup();
    CHECK_REFUSED(OK_JSON ",\"policy\":{\"network\":\"enabled\"}}",
                  "policy.network 'enabled' is not supported");
    CHECK_REFUSED(OK_JSON ",\"policy\":{\"packages\":\"pip\"}}",
                  "policy.packages 'pip' is not supported");
}

static void test_files(void)
{
    setup();
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"../x.csv\",\"content\":\"QQ\"}]}",
                  "input name '../x.csv' is not allowed: use a plain file name");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\".env\",\"content\":\"QQ\"}]}",
                  "input name '.env' is not allowed: it must not start with '.'");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"a*b\",\"content\":\"QQ\"}]}",
                  "input name 'a*b' is not allowed: use only letters");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"caf\xc3\xa9.csv\",\"content\":\"QQ\"}]}",
                  "input name 'caf??.csv' is not allowed");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"content\":\"QQ\"}]}", "input file 1 has no name");
    /* characters that are invisible or reorder text are named */
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"x\\u202egnp.csv\",\"content\":\"QQ\"}]}",
                  "input name 'x???gnp.csv' is not allowed: it holds U+202E, a control or format "
                  "character");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"a\xe2\x80\x8b.csv\",\"content\":\"QQ\"}]}",
                  "it holds U+200B,");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"\\ufeffa.csv\",\"content\":\"QQ\"}]}",
                  "it holds U+FEFF,");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"a\\u2028.csv\",\"content\":\"QQ\"}]}",
                  "it holds U+2028,");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"a\\udb40\\udc41.csv\",\"content\":\"QQ\"}]}",
                  "it holds U+E0041,");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"a\\u001b[31m\",\"content\":\"QQ\"}]}",
                  "input name 'a?[31m' is not allowed: it holds U+001B,");
    char js[512];
    char longname[140];
    memset(longname, 'a', 129);
    longname[129] = '\0';
    snprintf(js, sizeof(js), OK_JSON ",\"files\":[{\"name\":\"%s\",\"content\":\"QQ\"}]}", longname);
    CHECK_REFUSED(js, "longer than 128 bytes");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"a.csv\"}]}",
                  "input 'a.csv' has neither content nor object");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"a.csv\",\"object\":\"\"}]}",
                  "input 'a.csv' names an empty object");
    CHECK_REFUSED(OK_JSON ",\"files\":[{\"name\":\"a.csv\",\"content\":\"QQ\"},"
                          "{\"name\":\"b.csv\",\"content\":\"QQ\"},"
                          "{\"name\":\"a.csv\",\"object\":\"o\"}]}",
                  "input name 'a.csv' is used by more than one input file");

    /* object names: at most 1024 bytes */
    size_t n = 1025;
    char *big = malloc(n + 256);
    REQUIRE(big != NULL);
    size_t o = (size_t)snprintf(big, 256, OK_JSON ",\"files\":[{\"name\":\"a\",\"object\":\"");
    memset(big + o, 'o', n);
    memcpy(big + o + n, "\"}]}", 5);
    CHECK_REFUSED(big, "input 'a' names an object of 1025 bytes");
    memcpy(big + o + n - 1, "\"}]}", 5);
    uint32_t t, m;
    CHECK(validate_json(big, &t, &m) == CI_OK);
    free(big);

    /* a NUL inside a name cannot reach the validator: the codec refuses it */
    static const uint8_t nul_name[] = {0x12, 0x06, 'p', 'y', 't', 'h', 'o', 'n', 0x1a, 0x01, 'x',
                                       0x22, 0x07, 0x0a, 0x03, 'a', 0, 'b', 0x12, 0x00};
    ProtobufCMessage *msg = NULL;
    CHECK(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_request__descriptor, nul_name,
                            sizeof(nul_name), &msg, &err) == CI_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "files[0].name");
    CHECK(msg == NULL);

    /* nor a name that is not UTF-8 (JSON cannot even carry one) */
    static const uint8_t bad_name[] = {0x12, 0x06, 'p', 'y', 't', 'h', 'o', 'n', 0x1a, 0x01, 'x',
                                       0x22, 0x07, 0x0a, 0x03, 'a', 0xff, 'b', 0x12, 0x00};
    CHECK(ci_message_decode(CI_ENC_PROTOBUF, &ci__v1__execution_request__descriptor, bad_name,
                            sizeof(bad_name), &msg, &err) == CI_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "files[0].name");
    CHECK(msg == NULL);
}

static void test_file_count(void)
{
    setup();
    struct ci_buf b = CI_BUF_INIT;
    REQUIRE(ci_buf_appendf(&b, OK_JSON ",\"files\":[") == CI_OK);
    for (int i = 0; i < 257; i++)
        REQUIRE(ci_buf_appendf(&b, "%s{\"name\":\"f%d\",\"content\":\"\"}", i ? "," : "", i) == CI_OK);
    REQUIRE(ci_buf_appendf(&b, "]}") == CI_OK);
    CHECK_REFUSED((char *)b.data, "257 input files; the limit is 256");
    ci_buf_release(&b);
}

static void test_input_total(void)
{
    setup();
    /* build the request directly: 23.4 MiB of inline content in two files */
    static Ci__V1__InputFile f1 = CI__V1__INPUT_FILE__INIT, f2 = CI__V1__INPUT_FILE__INIT;
    Ci__V1__InputFile *files[] = {&f1, &f2};
    size_t half = (size_t)(23.4 * 1024 * 1024 / 2);
    uint8_t *data = calloc(1, half);
    REQUIRE(data != NULL);
    f1.name = "a.csv";
    f1.source_case = CI__V1__INPUT_FILE__SOURCE_CONTENT;
    f1.content.data = data;
    f1.content.len = half;
    f2 = f1;
    f2.name = "b.csv";
    Ci__V1__ExecutionRequest r = CI__V1__EXECUTION_REQUEST__INIT;
    r.language = "python";
    r.code = "print(1)";
    r.n_files = 2;
    r.files = files;
    uint32_t t = 7, m = 7;
    CHECK(ci_request_validate(&cfg, &r, &t, &m, &err) == CI_ERR_LIMIT);
    CHECK_CONTAINS(err.msg, "input files total 23.4 MiB; the limit is 20 MiB");
    CHECK(t == 7 && m == 7);
    /* exactly at the limit passes; one byte over says so in bytes */
    f1.content.len = cfg.limits.max_input_bytes / 2;
    f2.content.len = cfg.limits.max_input_bytes / 2;
    CHECK(ci_request_validate(&cfg, &r, &t, &m, &err) == CI_OK);
    f2.content.len++;
    CHECK(ci_request_validate(&cfg, &r, &t, &m, &err) == CI_ERR_LIMIT);
    CHECK_CONTAINS(err.msg, "20971521 bytes; the limit is 20971520 bytes (20 MiB)");
    /* files named by object do not count: they are checked once fetched */
    f2.source_case = CI__V1__INPUT_FILE__SOURCE_OBJECT;
    f2.object = "up/b.csv";
    CHECK(ci_request_validate(&cfg, &r, &t, &m, &err) == CI_OK);
    free(data);
}

static void test_labels(void)
{
    setup();
    struct ci_buf b = CI_BUF_INIT;
    REQUIRE(ci_buf_appendf(&b, OK_JSON ",\"labels\":{") == CI_OK);
    for (int i = 0; i < 65; i++)
        REQUIRE(ci_buf_appendf(&b, "%s\"k%d\":\"v\"", i ? "," : "", i) == CI_OK);
    REQUIRE(ci_buf_appendf(&b, "}}") == CI_OK);
    CHECK_REFUSED((char *)b.data, "65 labels; the limit is 64");
    ci_buf_release(&b);

    char key[300], js[2400];
    memset(key, 'k', 257);
    key[257] = '\0';
    snprintf(js, sizeof(js), OK_JSON ",\"labels\":{\"%s\":\"v\"}}", key);
    CHECK_REFUSED(js, "label key 'kkkk");
    CHECK_CONTAINS(err.msg, "is 257 bytes; the limit is 256 bytes");
    key[256] = '\0';
    uint32_t t, m;
    snprintf(js, sizeof(js), OK_JSON ",\"labels\":{\"%s\":\"v\"}}", key);
    CHECK(validate_json(js, &t, &m) == CI_OK);

    char val[1100];
    memset(val, 'v', 1025);
    val[1025] = '\0';
    snprintf(js, sizeof(js), OK_JSON ",\"labels\":{\"who\":\"%s\"}}", val);
    CHECK_REFUSED(js, "the value of label 'who' is 1025 bytes; the limit is 1024 bytes");
    CHECK(strlen(err.msg) < 200); /* the value is not quoted */

    /* An empty key is refused; only labels that keep the rules are echoed. */
    CHECK_REFUSED(OK_JSON ",\"labels\":{\"a\":\"1\",\"\":\"v\"}}",
                  "label 2 has an empty key");
    Ci__V1__ExecutionRequest *r = from_json(OK_JSON ",\"labels\":{\"\":\"v\"}}");
    REQUIRE(r);
    CHECK(!ci_request_labels_ok(r));
    ci_message_free(&r->base);
    r = from_json(js);
    REQUIRE(r);
    CHECK(!ci_request_labels_ok(r));
    ci_message_free(&r->base);
    r = from_json(OK_JSON ",\"labels\":{\"who\":\"agent\"}}");
    REQUIRE(r);
    CHECK(ci_request_labels_ok(r));
    ci_message_free(&r->base);
}

TEST_MAIN(T(test_task_id), T(test_session_id), T(test_batch_id), T(test_session_state_no_input), T(test_input_name), T(test_valid_and_defaults), T(test_language),
          T(test_code), T(test_runtime), T(test_limits), T(test_policy), T(test_files),
          T(test_file_count), T(test_input_total), T(test_labels))
