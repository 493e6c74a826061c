/* test_objstore.c - the object store's pure parts: name encoding, digest,
 * and the meta JSON that other clients read and write. The network parts
 * are tested against a real server and nats.js in
 * tests/integration/objstore_interop.test.mjs. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "nats/objstore.h"
#include "testutil.h"

static void check_name(const char *name, const char *want)
{
    char *got = ci_objstore_encode_name(name);
    CHECK_STR(got, want);
    free(got);
}

static void test_encode_name(void)
{
    check_name("", "");
    check_name("a", "YQ==");
    check_name("ab", "YWI=");
    check_name("abc", "YWJj");
    check_name("abc/x.csv", "YWJjL3guY3N2");
    check_name("task-1/figure-1.png", "dGFzay0xL2ZpZ3VyZS0xLnBuZw==");
    /* UTF-8 bytes, as nats.go encodes them. */
    check_name("\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e/\xc3\xbc.csv", "5pel5pys6KqeL8O8LmNzdg==");
    /* The URL alphabet: '-' and '_' instead of '+' and '/'. */
    check_name("\xfb\xff\xbf", "-_-_");
    CHECK(ci_objstore_encode_name(NULL) == NULL);
}

static void test_digest(void)
{
    char *d = ci_objstore_digest("", 0);
    CHECK_STR(d, "SHA-256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU=");
    free(d);
    d = ci_objstore_digest(NULL, 0);
    CHECK_STR(d, "SHA-256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU=");
    free(d);
    d = ci_objstore_digest("hello", 5);
    CHECK_STR(d, "SHA-256=LPJNul-wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=");
    free(d);
}

static struct ci_objmeta sample(void)
{
    struct ci_objmeta m = {
        .name = "abc/x.csv",
        .bucket = "ci-files",
        .nuid = "Z3aL9Qd0xFb1mWc7Yq2R8t",
        .mtime = "2024-01-02T03:04:05.123456789Z",
        .digest = "SHA-256=LPJNul-wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=",
        .size = 307207,
        .chunks = 3,
        .max_chunk_size = 131072,
    };
    return m;
}

static void test_meta_round_trip(void)
{
    struct ci_objmeta m = sample();
    struct ci_error err = {{0}};
    char *json = NULL;
    REQUIRE(ci_objmeta_to_json(&m, &json, &err) == CI_OK);
    struct ci_objmeta back;
    ci_status s = ci_objmeta_from_json(json, strlen(json), &back, &err);
    free(json);
    REQUIRE(s == CI_OK);
    CHECK_STR(back.name, m.name);
    CHECK_STR(back.bucket, m.bucket);
    CHECK_STR(back.nuid, m.nuid);
    CHECK_STR(back.mtime, m.mtime);
    CHECK_STR(back.digest, m.digest);
    CHECK(back.size == m.size);
    CHECK(back.chunks == m.chunks);
    CHECK(back.max_chunk_size == m.max_chunk_size);
    CHECK(!back.deleted);
    ci_objmeta_release(&back);
    CHECK(back.name == NULL);
    ci_objmeta_release(&back); /* twice is harmless */
    ci_objmeta_release(NULL);
}

/* Field names and JSON types are what nats.go and nats.js expect. */
static void test_meta_field_names(void)
{
    struct ci_objmeta m = sample();
    struct ci_error err = {{0}};
    char *json = NULL;
    REQUIRE(ci_objmeta_to_json(&m, &json, &err) == CI_OK);
    json_t *o = json_loads(json, 0, NULL);
    free(json);
    REQUIRE(o != NULL);
    CHECK_STR(json_string_value(json_object_get(o, "name")), "abc/x.csv");
    CHECK_STR(json_string_value(json_object_get(o, "bucket")), "ci-files");
    CHECK_STR(json_string_value(json_object_get(o, "nuid")), "Z3aL9Qd0xFb1mWc7Yq2R8t");
    CHECK_STR(json_string_value(json_object_get(o, "mtime")), "2024-01-02T03:04:05.123456789Z");
    CHECK_STR(json_string_value(json_object_get(o, "digest")),
              "SHA-256=LPJNul-wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=");
    CHECK(json_is_integer(json_object_get(o, "size")));
    CHECK(json_integer_value(json_object_get(o, "size")) == 307207);
    CHECK(json_integer_value(json_object_get(o, "chunks")) == 3);
    json_t *opts = json_object_get(o, "options");
    CHECK(json_is_object(opts));
    CHECK(json_integer_value(json_object_get(opts, "max_chunk_size")) == 131072);
    CHECK(json_object_get(o, "deleted") == NULL); /* omitted when false, as Go does */
    json_decref(o);

    m.deleted = true;
    m.size = 0;
    m.chunks = 0;
    m.digest = "";
    REQUIRE(ci_objmeta_to_json(&m, &json, &err) == CI_OK);
    o = json_loads(json, 0, NULL);
    free(json);
    REQUIRE(o != NULL);
    CHECK(json_is_true(json_object_get(o, "deleted")));
    CHECK_STR(json_string_value(json_object_get(o, "digest")), "");
    json_decref(o);
}

/* What nats.js 3.x writes, extra fields and all. */
static void test_meta_from_nats_js(void)
{
    const char *js =
        "{\"bucket\":\"ci-files\",\"nuid\":\"aBcDeFgHiJkLmNoPqRsTuV\",\"size\":5,\"chunks\":1,"
        "\"name\":\"t1/out.csv\",\"description\":\"\",\"options\":{\"max_chunk_size\":131072},"
        "\"headers\":{\"X-A\":[\"1\",\"2\"]},\"metadata\":{\"k\":\"v\"},"
        "\"mtime\":\"2025-01-01T00:00:00.000Z\","
        "\"digest\":\"SHA-256=LPJNul-wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ=\",\"deleted\":false,"
        "\"revision\":7}";
    struct ci_objmeta m;
    struct ci_error err = {{0}};
    REQUIRE(ci_objmeta_from_json(js, strlen(js), &m, &err) == CI_OK);
    CHECK_STR(m.name, "t1/out.csv");
    CHECK_STR(m.bucket, "ci-files");
    CHECK_STR(m.nuid, "aBcDeFgHiJkLmNoPqRsTuV");
    CHECK(m.size == 5 && m.chunks == 1 && m.max_chunk_size == 131072 && !m.deleted);
    ci_objmeta_release(&m);

    /* nats.js deletes by rewriting the meta. */
    const char *del = "{\"name\":\"gone\",\"bucket\":\"b\",\"nuid\":\"n\",\"size\":0,\"chunks\":0,"
                      "\"digest\":\"\",\"deleted\":true,\"mtime\":\"2025-01-01T00:00:00.000Z\"}";
    REQUIRE(ci_objmeta_from_json(del, strlen(del), &m, &err) == CI_OK);
    CHECK(m.deleted);
    CHECK_STR(m.digest, "");
    ci_objmeta_release(&m);

    /* A link (options.link) and its absent fields are tolerated. */
    const char *link = "{\"name\":\"l\",\"bucket\":\"other\",\"options\":{\"link\":{\"bucket\":\"b\","
                       "\"name\":\"x\"}}}";
    REQUIRE(ci_objmeta_from_json(link, strlen(link), &m, &err) == CI_OK);
    CHECK_STR(m.name, "l");
    CHECK(m.nuid == NULL && m.digest == NULL && m.size == 0);
    ci_objmeta_release(&m);

    /* Nulls count as absent. */
    const char *nulls = "{\"name\":\"x\",\"description\":null,\"options\":null,\"deleted\":null,"
                        "\"digest\":null}";
    REQUIRE(ci_objmeta_from_json(nulls, strlen(nulls), &m, &err) == CI_OK);
    CHECK(m.digest == NULL && !m.deleted);
    ci_objmeta_release(&m);
}

static void expect_bad(const char *json, ci_status want, const char *msg_part)
{
    struct ci_objmeta m;
    memset(&m, 0xAB, sizeof(m));
    struct ci_objmeta before = m;
    struct ci_error err = {{0}};
    ci_status s = ci_objmeta_from_json(json, strlen(json), &m, &err);
    CHECK(s == want);
    if (s != want)
        fprintf(stderr, "  for %s: got %s (%s)\n", json, ci_status_str(s), err.msg);
    CHECK_CONTAINS(err.msg, msg_part);
    CHECK(memcmp(&m, &before, sizeof(m)) == 0); /* ret untouched on failure */
}

static void test_meta_errors(void)
{
    expect_bad("", CI_ERR_INVALID, "not valid JSON");
    expect_bad("{\"name\":\"x\"", CI_ERR_INVALID, "not valid JSON");
    expect_bad("{\"name\":\"x\"} trailing", CI_ERR_INVALID, "not valid JSON");
    expect_bad("[1,2]", CI_ERR_INVALID, "not a JSON object");
    expect_bad("{}", CI_ERR_INVALID, "no name");
    expect_bad("{\"name\":\"\"}", CI_ERR_INVALID, "no name");
    expect_bad("{\"name\":7}", CI_ERR_INVALID, "'name' is not a string");
    expect_bad("{\"name\":\"x\",\"nuid\":[]}", CI_ERR_INVALID, "'nuid' is not a string");
    expect_bad("{\"name\":\"x\",\"size\":-1}", CI_ERR_INVALID, "'size'");
    expect_bad("{\"name\":\"x\",\"size\":\"5\"}", CI_ERR_INVALID, "'size'");
    expect_bad("{\"name\":\"x\",\"size\":1.5}", CI_ERR_INVALID, "'size'");
    expect_bad("{\"name\":\"x\",\"chunks\":4294967296}", CI_ERR_INVALID, "'chunks'");
    expect_bad("{\"name\":\"x\",\"deleted\":\"yes\"}", CI_ERR_INVALID, "'deleted'");
    expect_bad("{\"name\":\"x\",\"options\":5}", CI_ERR_INVALID, "'options'");
    expect_bad("{\"name\":\"x\",\"options\":{\"max_chunk_size\":-5}}", CI_ERR_INVALID,
               "'max_chunk_size'");
    expect_bad("{\"name\":\"x\",\"name\":\"y\"}", CI_ERR_INVALID, "not valid JSON");

    /* The size of a meta document is capped. */
    size_t big = 70 * 1024;
    char *huge = malloc(big + 64);
    REQUIRE(huge != NULL);
    int n = snprintf(huge, 64, "{\"name\":\"x\",\"description\":\"");
    memset(huge + n, 'a', big);
    memcpy(huge + n + big, "\"}", 3);
    expect_bad(huge, CI_ERR_LIMIT, "limit");
    free(huge);

    struct ci_objmeta m;
    struct ci_error err = {{0}};
    CHECK(ci_objmeta_from_json(NULL, 0, &m, &err) == CI_ERR_INVALID);
}

static void test_meta_encode_errors(void)
{
    struct ci_objmeta m = sample();
    struct ci_error err = {{0}};
    char *json = (char *)"untouched";
    m.name = NULL;
    CHECK(ci_objmeta_to_json(&m, &json, &err) == CI_ERR_INVALID);
    m.name = "";
    CHECK(ci_objmeta_to_json(&m, &json, &err) == CI_ERR_INVALID);
    m.name = "bad\xff utf8";
    CHECK(ci_objmeta_to_json(&m, &json, &err) == CI_ERR_INVALID);
    CHECK_CONTAINS(err.msg, "UTF-8");
    CHECK_STR(json, "untouched");
}

TEST_MAIN(T(test_encode_name), T(test_digest), T(test_meta_round_trip), T(test_meta_field_names),
          T(test_meta_from_nats_js), T(test_meta_errors), T(test_meta_encode_errors))
