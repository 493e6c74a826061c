/* test_heartbeat.c - the heartbeat's JSON: round trip, 64-bit integers as
 * strings (or numbers on input), what decode refuses, and a heartbeat that
 * cannot start without a broker. */
#include <stdlib.h>

#include "nats/heartbeat.h"
#include "testutil.h"

static void test_round_trip(void)
{
    struct ci_heartbeat_info in = {
        .worker = "w-1.a_b", .provider = "local", .version = "0.1.0", .slots = 4, .active = 3,
        .ready = true, .started_at_ms = 1700000000000, .at_ms = 1700000012345,
        .tasks_done = 9007199254740993ULL, /* above 2^53: kept exact as a string */
    };
    char *json = NULL;
    size_t len = 0;
    REQUIRE(ci_heartbeat_encode(&in, &json, &len, NULL) == CI_OK);
    CHECK(len == strlen(json));
    CHECK_CONTAINS(json, "\"startedAtMs\":\"1700000000000\"");
    CHECK_CONTAINS(json, "\"tasksDone\":\"9007199254740993\"");
    CHECK_CONTAINS(json, "\"ready\":true");
    struct ci_heartbeat_info out;
    REQUIRE(ci_heartbeat_decode((const uint8_t *)json, len, &out, NULL) == CI_OK);
    CHECK_STR(out.worker, "w-1.a_b");
    CHECK_STR(out.provider, "local");
    CHECK_STR(out.version, "0.1.0");
    CHECK(out.slots == 4 && out.active == 3 && out.ready);
    CHECK(out.started_at_ms == 1700000000000 && out.at_ms == 1700000012345);
    CHECK(out.tasks_done == 9007199254740993ULL);
    ci_heartbeat_info_release(&out);
    ci_heartbeat_info_release(&out); /* twice: fields were cleared */
    ci_heartbeat_info_release(NULL);
    free(json);
}

static void test_decode_lenient_and_strict(void)
{
    struct ci_heartbeat_info out;
    /* Numbers accepted where we write strings; unknown fields ignored;
     * missing ones empty. */
    const char *ok = "{\"worker\":\"x\",\"startedAtMs\":12,\"extra\":[1,2]}";
    REQUIRE(ci_heartbeat_decode((const uint8_t *)ok, strlen(ok), &out, NULL) == CI_OK);
    CHECK_STR(out.worker, "x");
    CHECK_STR(out.provider, "");
    CHECK(out.started_at_ms == 12 && out.slots == 0 && !out.ready);
    ci_heartbeat_info_release(&out);

    const char *bad[] = {"", "[]", "\"x\"", "{", "{\"worker\":1,\"worker\":2}", "nul"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct ci_heartbeat_info sentinel = {.slots = 77};
        struct ci_error e = {{0}};
        CHECK(ci_heartbeat_decode((const uint8_t *)bad[i], strlen(bad[i]), &sentinel, &e) ==
              CI_ERR_INVALID);
        CHECK(sentinel.slots == 77); /* untouched on failure */
        CHECK_CONTAINS(e.msg, "not a JSON object");
    }
    size_t n = 70 * 1024;
    char *big = malloc(n);
    REQUIRE(big);
    memset(big, ' ', n);
    struct ci_error e = {{0}};
    CHECK(ci_heartbeat_decode((const uint8_t *)big, n, &out, &e) == CI_ERR_LIMIT);
    free(big);
}

static void test_start_needs_arguments(void)
{
    struct ci_heartbeat *h = (struct ci_heartbeat *)&h;
    struct ci_error e = {{0}};
    CHECK(ci_heartbeat_start(NULL, "w", 10, NULL, NULL, &h, &e) == CI_ERR_INVALID);
    CHECK(h == (struct ci_heartbeat *)&h);
    CHECK(ci_heartbeat_failures(NULL) == 0);
    ci_heartbeat_stop(NULL);
}

TEST_MAIN(T(test_round_trip), T(test_decode_lenient_and_strict), T(test_start_needs_arguments))
