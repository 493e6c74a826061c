/* test_session.c - the session record and a step's plan (docs/contract.md §16). */
#include <string.h>

#include "core/session.h"
#include "testutil.h"

static void test_record_round_trip(void)
{
    struct ci_session_record r = {.step = 3, .state_step = 2, .last_seq = 1042,
                                  .state_bytes = 81234, .created_ms = 1796135410296,
                                  .updated_ms = 1796135420338};
    snprintf(r.last_task_id, sizeof(r.last_task_id), "t-3");
    ci_session_object_name("s1", 2, 1, r.state);
    CHECK_STR(r.state, ".sessions/s1/2-1");
    char *json = NULL;
    size_t len = 0;
    struct ci_error err = {{0}};
    REQUIRE(ci_session_record_encode("s1", &r, &json, &len, &err) == CI_OK);
    CHECK_STR(json, "{\"sessionId\":\"s1\",\"step\":\"3\",\"stateStep\":\"2\",\"lastTaskId\":\"t-3\","
                    "\"lastSeq\":\"1042\",\"state\":\".sessions/s1/2-1\",\"stateBytes\":\"81234\","
                    "\"createdAtMs\":\"1796135410296\",\"updatedAtMs\":\"1796135420338\"}");
    struct ci_session_record back;
    REQUIRE(ci_session_record_parse((const uint8_t *)json, len, &back, &err) == CI_OK);
    CHECK(back.step == 3 && back.state_step == 2 && back.last_seq == 1042);
    CHECK(back.state_bytes == 81234 && back.created_ms == 1796135410296 && !back.closed);
    CHECK_STR(back.last_task_id, "t-3");
    free(json);

    struct ci_session_record closed = {.closed = true, .updated_ms = 5};
    REQUIRE(ci_session_record_encode("s1", &closed, &json, &len, &err) == CI_OK);
    CHECK_STR(json, "{\"sessionId\":\"s1\",\"closed\":true,\"updatedAtMs\":\"5\"}");
    REQUIRE(ci_session_record_parse((const uint8_t *)json, len, &back, &err) == CI_OK);
    CHECK(back.closed);
    free(json);
}

static void test_record_refuses_garbage(void)
{
    struct ci_session_record r;
    struct ci_error err = {{0}};
    const char *bad[] = {
        "", "[]", "not json", "{\"step\":\"x\"}", "{\"step\":\"-1\"}",
        "{\"step\":\"2\",\"stateStep\":\"3\"}", /* a state from the future */
        "{\"closed\":\"yes\"}", "{\"step\":\"99999999999\"}",
        /* longer than a task id */
        "{\"lastTaskId\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK(ci_session_record_parse((const uint8_t *)bad[i], strlen(bad[i]), &r, &err) ==
              CI_ERR_INVALID);
}

static void test_object_names(void)
{
    CHECK(ci_session_object_valid("s1", ".sessions/s1/2-1"));
    CHECK(ci_session_object_valid("s1", ".sessions/s1/4294967295-5"));
    CHECK(!ci_session_object_valid("s1", ".sessions/s2/2-1"));    /* another session's */
    CHECK(!ci_session_object_valid("s1", ".sessions/s1x/2-1"));
    CHECK(!ci_session_object_valid("s1", "sessions/s1/2-1"));     /* a task id's prefix */
    CHECK(!ci_session_object_valid("s1", ".sessions/s1/2"));
    CHECK(!ci_session_object_valid("s1", ".sessions/s1/2-1/x"));
    CHECK(!ci_session_object_valid("s1", ".sessions/s1/../s2/2-1"));
    CHECK(!ci_session_object_valid("s1", ".sessions/s1/-1"));
    CHECK(!ci_session_object_valid("s1", ""));
}

static void test_plan(void)
{
    struct ci_session_plan p;
    ci_session_plan("s1", "t-1", NULL, 1000000, 1200, &p);
    CHECK(p.new_session && !p.previous_gone && p.step == 1 && p.restore_step == 0);

    struct ci_session_record r = {.step = 3, .state_step = 2, .last_seq = 100,
                                  .updated_ms = 1000000};
    snprintf(r.last_task_id, sizeof(r.last_task_id), "t-3");
    snprintf(r.state, sizeof(r.state), ".sessions/s1/2-1");
    ci_session_plan("s1", "t-4", &r, 1000000 + 1199 * 1000, 1200, &p);
    CHECK(!p.new_session && !p.previous_gone && !p.applied && p.step == 4);
    CHECK(p.restore_step == 2);
    CHECK_STR(p.restore_object, ".sessions/s1/2-1");

    ci_session_plan("s1", "t-3", &r, 1000000, 1200, &p); /* redelivered: ran already */
    CHECK(p.applied && p.step == 3);

    ci_session_plan("s1", "t-4", &r, 1000000 + 1201 * 1000, 1200, &p); /* idle too long */
    CHECK(p.new_session && p.previous_gone && p.step == 1 && p.restore_step == 0);
    CHECK_STR(p.stale_object, ".sessions/s1/2-1");

    /* A record a client wrote cannot point a step at another session's state. */
    snprintf(r.state, sizeof(r.state), ".sessions/other/9-1");
    ci_session_plan("s1", "t-4", &r, 1000000, 1200, &p);
    CHECK(p.restore_step == 0 && p.restore_object[0] == '\0' && p.previous_gone);
    snprintf(r.state, sizeof(r.state), ".sessions/s1/2-1");

    r.closed = true;
    ci_session_plan("s1", "t-4", &r, 1000000, 1200, &p);
    CHECK(p.new_session && p.previous_gone && p.step == 1 && p.stale_object[0] == '\0');

    struct ci_session_record none_kept = {.step = 1, .state_step = 0, .last_seq = 5,
                                          .updated_ms = 1000000};
    ci_session_plan("s1", "t-2", &none_kept, 1000000, 1200, &p);
    CHECK(p.step == 2 && p.restore_step == 0 && !p.new_session);
}

TEST_MAIN(T(test_record_round_trip), T(test_record_refuses_garbage), T(test_object_names),
          T(test_plan))
