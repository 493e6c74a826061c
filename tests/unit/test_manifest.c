/* test_manifest.c - the runtime manifest (contract §18) without NATS: its
 * JSON from a config and versions, what the version parser refuses, and the
 * versions read from a Python (this machine's, when it has one). */
#include <dirent.h>
#include <jansson.h>
#include <string.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/config.h"
#include "core/util.h"
#include "worker/manifest.h"
#include "testutil.h"

static json_t *encode(const struct ci_manifest *m)
{
    char *text = NULL;
    size_t len = 0;
    if (ci_manifest_encode(m, &text, &len, NULL) != CI_OK)
        return NULL;
    json_t *o = json_loadb(text, len, 0, NULL);
    free(text);
    return o;
}

static const char *str(json_t *o, const char *path1, const char *path2)
{
    json_t *v = json_object_get(o, path1);
    if (path2)
        v = json_object_get(v, path2);
    return json_is_string(v) ? json_string_value(v) : "(missing)";
}

static void test_encode_local(void)
{
    struct ci_config *cfg = NULL;
    REQUIRE(ci_config_defaults(&cfg, NULL) == CI_OK);
    cfg->limits.max_memory_mb = 2048;
    struct ci_manifest_versions v;
    const char *py = "{\"python\":\"3.11.2\",\"packages\":{\"numpy\":\"1.24.2\","
                     "\"pandas\":\"1.5.3\"},\"pip\":true}";
    REQUIRE(ci_manifest_parse_versions(py, strlen(py), &v, NULL) == CI_OK);
    struct ci_manifest m = {
        .cfg = cfg, .runtime = "python-data-analysis-v1", .provider = "local", .sessions = true,
        .isolation = "user,pid,net,mnt", .worker = "w1", .version = "0.1.0",
        .at_ms = 9007199254740993LL, .versions = &v,
    };
    json_t *o = encode(&m);
    REQUIRE(o != NULL);
    CHECK_STR(str(o, "runtime", NULL), "python-data-analysis-v1");
    CHECK_STR(str(o, "python", NULL), "3.11.2");
    CHECK_STR(str(o, "packages", "numpy"), "1.24.2");
    CHECK_STR(str(o, "packages", "pandas"), "1.5.3");
    CHECK(json_object_size(json_object_get(o, "packages")) == 2);
    CHECK(json_object_get(o, "versionsUnknown") == NULL);
    /* An empty network namespace: no network, so pip cannot install. */
    CHECK(json_is_false(json_object_get(o, "network")));
    CHECK(json_is_false(json_object_get(o, "pip")));
    CHECK_STR(str(o, "limits", "maxMemoryMb"), "2048");
    CHECK_STR(str(o, "limits", "defaultTimeoutMs"), "60000");
    CHECK_STR(str(o, "limits", "maxOutputBytes"), "1048576");
    CHECK(json_is_true(json_object_get(json_object_get(o, "sessions"), "available")));
    CHECK_STR(str(o, "sessions", "idleS"), "1200");
    CHECK_STR(str(o, "sessions", "maxStateMb"), "64");
    CHECK_STR(str(o, "isolation", NULL), "user,pid,net,mnt");
    CHECK_STR(str(o, "atMs", NULL), "9007199254740993"); /* above 2^53: a string */
    CHECK(json_array_size(json_object_get(o, "artifacts")) == 2);
    json_decref(o);

    /* No sandbox: the host's network, and pip where the module is. */
    m.isolation = "none";
    o = encode(&m);
    REQUIRE(o != NULL);
    CHECK(json_is_true(json_object_get(o, "network")));
    CHECK(json_is_true(json_object_get(o, "pip")));
    json_decref(o);
    ci_config_free(cfg);
}

static void test_encode_unknown(void)
{
    struct ci_config *cfg = NULL;
    REQUIRE(ci_config_defaults(&cfg, NULL) == CI_OK);
    struct ci_manifest_versions v = {.known = false, .unknown = "cannot see the executor's Python"};
    struct ci_manifest m = {
        .cfg = cfg, .runtime = "python-data-analysis-v1", .provider = "cloudrun",
        .sessions = false, .isolation = "", .worker = "w2", .version = "0.1.0", .at_ms = 1,
        .versions = &v,
    };
    json_t *o = encode(&m);
    REQUIRE(o != NULL);
    /* Never invented: no python, no packages, and why. */
    CHECK(json_object_get(o, "python") == NULL);
    CHECK(json_object_get(o, "packages") == NULL);
    CHECK_STR(str(o, "versionsUnknown", NULL), "cannot see the executor's Python");
    CHECK(json_object_get(o, "network") == NULL); /* unknown with the isolation */
    CHECK(json_is_false(json_object_get(json_object_get(o, "sessions"), "available")));
    CHECK(json_object_get(json_object_get(o, "sessions"), "idleS") == NULL);
    CHECK_STR(str(o, "isolation", NULL), "");
    CHECK_STR(str(o, "provider", NULL), "cloudrun");
    json_decref(o);
    ci_config_free(cfg);
}

static void test_parse_refuses(void)
{
    static const char *bad[] = {
        "",
        "[]",
        "{\"packages\":{}}",
        "{\"python\":\"3.11\",\"packages\":[]}",
        "{\"python\":\"3 11\",\"packages\":{}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct ci_manifest_versions v = {.known = true};
        struct ci_error e = {{0}};
        CHECK(ci_manifest_parse_versions(bad[i], strlen(bad[i]), &v, &e) == CI_ERR_INVALID);
        CHECK(e.msg[0] != '\0');
    }
    /* An odd package entry is left out; the others and Python's version stand. */
    static const char *odd[] = {
        "{\"python\":\"3.11\",\"packages\":{\"numpy\":\"1.0\\u001b[31m\",\"pandas\":\"1.5.3\"}}",
        "{\"python\":\"3.11\",\"packages\":{\"numpy\":1,\"pandas\":\"1.5.3\"}}",
        "{\"python\":\"3.11\",\"packages\":{\"a b\":\"1\",\"pandas\":\"1.5.3\"}}",
    };
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        struct ci_manifest_versions v;
        struct ci_error e = {{0}};
        CHECK(ci_manifest_parse_versions(odd[i], strlen(odd[i]), &v, &e) == CI_OK);
        CHECK(v.known && v.n_packages == 1);
        CHECK_STR(v.packages[0].name, "pandas");
        CHECK_STR(v.python, "3.11");
    }
}

/* Whether a process "sleep <arg>" lives (a zombie has no command line). */
static bool sleeper_alive(const char *arg)
{
    char want[64];
    int wn = snprintf(want, sizeof(want), "sleep%c%s", 0, arg) + 1;
    DIR *d = opendir("/proc");
    if (!d)
        return false;
    bool found = false;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        char path[300], buf[64] = {0};
        snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        found = n == (size_t)wn && memcmp(buf, want, (size_t)wn) == 0;
    }
    closedir(d);
    return found;
}

static void test_read_versions(void)
{
    struct ci_manifest_versions v;
    ci_manifest_read_versions("/nonexistent/python3", 5000, &v);
    CHECK(!v.known);
    CHECK_CONTAINS(v.unknown, "/nonexistent/python3");
    /* A program that exits at once without JSON. */
    ci_manifest_read_versions("/bin/false", 5000, &v);
    CHECK(!v.known && v.unknown[0]);
    if (access("/usr/bin/python3", X_OK) != 0)
        return;
    ci_manifest_read_versions("/usr/bin/python3", 20000, &v);
    CHECK(v.known);
    CHECK(v.python[0] == '3');
}

/* The interpreter runs limited (a runaway one cannot take the machine),
 * and what it leaves behind holding its stdout is killed when it exits:
 * the answer comes at once, not at the deadline. */
static void t_versions_limited(void)
{
    struct ci_manifest_versions v;
    char dir[] = "/tmp/ci-manifest-XXXXXX";
    REQUIRE(mkdtemp(dir));
    char fake[256], arg[32];
    snprintf(fake, sizeof(fake), "%s/python3", dir);
    /* Unique to this run, and gone by itself in 2 minutes if not killed. */
    snprintf(arg, sizeof(arg), "120.%d", (int)getpid());
    FILE *f = fopen(fake, "w");
    REQUIRE(f);
    fprintf(f,
            "#!/bin/sh\n"
            "[ \"$(ulimit -v)\" = unlimited ] && { echo no memory limit >&2; exit 3; }\n"
            "[ \"$(ulimit -f)\" = 0 ] || { echo no file size limit >&2; exit 4; }\n"
            "sleep %s &\n"
            "printf '{\"python\":\"3.11.2\",\"packages\":{\"numpy\":\"1.24.2\"},\"pip\":false}'\n",
            arg);
    fclose(f);
    chmod(fake, 0755);
    if (access(fake, X_OK) != 0) {
        unlink(fake);
        rmdir(dir);
        SKIP("cannot execute a script under /tmp (mounted noexec?)");
    }
    int64_t t0 = ci_mono_ms();
    ci_manifest_read_versions(fake, 30000, &v);
    CHECK(ci_mono_ms() - t0 < 25000);
    CHECK(v.known);
    if (!v.known)
        fprintf(stderr, "    unknown: %s\n", v.unknown);
    CHECK_STR(v.python, "3.11.2");
    /* Killed with its group (SIGKILL takes a moment to land). */
    for (int64_t until = ci_mono_ms() + 10000; sleeper_alive(arg) && ci_mono_ms() < until;)
        usleep(10000);
    CHECK(!sleeper_alive(arg));
    unlink(fake);
    rmdir(dir);
}

TEST_MAIN(T(test_encode_local), T(test_encode_unknown), T(test_parse_refuses),
          T(test_read_versions), T_OWN(t_versions_limited))
