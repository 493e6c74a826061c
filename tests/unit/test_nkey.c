/* NKey public key derivation, against the pair in nats-server's docs. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "nats/nkey.h"
#include "testutil.h"

#define SEED "SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY"
#define PUB "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"

static void test_known_pair(void)
{
    char out[57];
    REQUIRE(ci_nkey_public_from_seed(SEED, 58, out, NULL) == CI_OK);
    CHECK_STR(out, PUB);
}

static void test_bad_seeds(void)
{
    char out[57];
    struct ci_error e = {{0}};
    char bad[] = SEED;
    bad[20] = bad[20] == 'A' ? 'B' : 'A';
    CHECK(ci_nkey_public_from_seed(bad, 58, out, &e) == CI_ERR_INVALID);
    CHECK_CONTAINS(e.msg, "checksum");
    CHECK(ci_nkey_public_from_seed(PUB, 56, out, &e) == CI_ERR_INVALID);
    CHECK(ci_nkey_public_from_seed("S1!", 3, out, &e) == CI_ERR_INVALID);
}

static void test_seed_file(void)
{
    char path[] = "/tmp/nkey-test-XXXXXX";
    int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    const char text[] = "# user seed\n" SEED "\n";
    REQUIRE(write(fd, text, sizeof(text) - 1) == (ssize_t)(sizeof(text) - 1));
    close(fd);
    char out[57];
    struct ci_error e = {{0}};
    CHECK(ci_nkey_public_from_seed_file(path, out, &e) == CI_OK);
    CHECK_STR(out, PUB);
    unlink(path);
    CHECK(ci_nkey_public_from_seed_file(path, out, &e) == CI_ERR_IO);
    CHECK_CONTAINS(e.msg, "cannot open");
}

TEST_MAIN(T(test_known_pair), T(test_bad_seeds), T(test_seed_file))
