/* testutil.h - a tiny test harness: CHECK records a failure and goes on,
 * REQUIRE stops the current test, SKIP stops it as "could not check".
 * main() is TEST_MAIN(T(t1), T(t2), ...) or calls t_main().
 *
 * A case that may be unable to check on some machines (it can SKIP) is
 * listed as T_OWN(name): ctest runs it on its own, as unit.<program>.<name>
 * (tests/CMakeLists.txt finds these in the source), so that its skip shows
 * as ctest's "skipped" instead of hiding among the passes of the others. A
 * run of the program with no argument leaves the T_OWN cases out; with case
 * names as arguments it runs just those. A program exits 1 when a case
 * failed, else 77 (SKIP_RETURN_CODE) when a case skipped, else 0. */
#ifndef CI_TESTUTIL_H
#define CI_TESTUTIL_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define T_SKIP_RC 77

static int t_failed, t_checks;
static const char *t_name;
static bool t_skipped; /* the current case said SKIP */

#define CHECK(cond)                                                                 \
    do {                                                                            \
        t_checks++;                                                                 \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: %s: CHECK(%s) failed\n", __FILE__, __LINE__,    \
                    t_name, #cond);                                                 \
            t_failed++;                                                             \
        }                                                                           \
    } while (0)

#define REQUIRE(cond)                                                               \
    do {                                                                            \
        t_checks++;                                                                 \
        if (!(cond)) {                                                              \
            fprintf(stderr, "%s:%d: %s: REQUIRE(%s) failed\n", __FILE__, __LINE__,  \
                    t_name, #cond);                                                 \
            t_failed++;                                                             \
            return;                                                                 \
        }                                                                           \
    } while (0)

#define CHECK_STR(a, b)                                                             \
    do {                                                                            \
        const char *a_ = (a), *b_ = (b);                                            \
        t_checks++;                                                                 \
        if (!a_ || !b_ || strcmp(a_, b_) != 0) {                                    \
            fprintf(stderr, "%s:%d: %s: \"%s\" != \"%s\"\n", __FILE__, __LINE__,    \
                    t_name, a_ ? a_ : "(null)", b_ ? b_ : "(null)");                \
            t_failed++;                                                             \
        }                                                                           \
    } while (0)

#define CHECK_CONTAINS(hay, needle)                                                 \
    do {                                                                            \
        const char *h_ = (hay), *n_ = (needle);                                     \
        t_checks++;                                                                 \
        if (!h_ || !strstr(h_, n_)) {                                               \
            fprintf(stderr, "%s:%d: %s: \"%s\" does not contain \"%s\"\n", __FILE__, \
                    __LINE__, t_name, h_ ? h_ : "(null)", n_);                      \
            t_failed++;                                                             \
        }                                                                           \
    } while (0)

/* SKIP("why, %s", ...): this case cannot check here (the machine lacks what
 * it needs, or is too busy to tell): it stops, and is counted as skipped,
 * never as passed. Only for a T_OWN case: in a run of many, a skip makes
 * the whole program say "skipped". */
#define SKIP(...)                                                                   \
    do {                                                                            \
        fprintf(stderr, "\n*** %s SKIPPED: ", t_name);                              \
        fprintf(stderr, __VA_ARGS__);                                               \
        fputc('\n', stderr);                                                        \
        t_skipped = true;                                                           \
        return;                                                                     \
    } while (0)

typedef void (*t_fn)(void);
struct t_case {
    const char *name;
    t_fn fn;
    bool own; /* T_OWN: ctest runs it on its own */
};
#define T(fn) {#fn, fn, false}
#define T_OWN(fn) {#fn, fn, true}

/* Two results of runs as one: a failure over a skip, a skip over a pass. */
static inline int t_merge(int a, int b)
{
    if ((a && a != T_SKIP_RC) || (b && b != T_SKIP_RC))
        return 1;
    return a == T_SKIP_RC || b == T_SKIP_RC ? T_SKIP_RC : 0;
}

static inline int t_run(const struct t_case *cases, size_t n)
{
    int failed_tests = 0, skipped_tests = 0;
    for (size_t i = 0; i < n; i++) {
        int before = t_failed;
        t_name = cases[i].name;
        t_skipped = false;
        cases[i].fn();
        const char *what = "ok  ";
        if (t_failed != before) {
            failed_tests++;
            what = "FAIL";
        } else if (t_skipped) {
            skipped_tests++;
            what = "skip";
        }
        fprintf(stderr, "%s %s\n", what, cases[i].name);
    }
    fprintf(stderr, "%zu passed, %d failed, %d skipped\n",
            n - (size_t)failed_tests - (size_t)skipped_tests, failed_tests, skipped_tests);
    return failed_tests ? 1 : skipped_tests ? T_SKIP_RC : 0;
}

/* The cases a run of the program takes, into out (room for n): those named
 * by its arguments, each of which must exist, else all but the T_OWN ones.
 * Their count, or -1 after saying why. */
static inline int t_select(int argc, char **argv, const struct t_case *cases, size_t n,
                           struct t_case *out)
{
    size_t k = 0;
    if (argc <= 1) {
        for (size_t i = 0; i < n; i++)
            if (!cases[i].own)
                out[k++] = cases[i];
        return (int)k;
    }
    for (int a = 1; a < argc; a++) {
        size_t i = 0;
        while (i < n && strcmp(cases[i].name, argv[a]) != 0)
            i++;
        if (i == n) {
            fprintf(stderr, "%s: no case '%s' here\n", argv[0], argv[a]);
            return -1;
        }
        for (size_t j = 0; j < k; j++)
            if (out[j].fn == cases[i].fn) {
                fprintf(stderr, "%s: case '%s' named twice\n", argv[0], argv[a]);
                return -1;
            }
        out[k++] = cases[i];
    }
    return (int)k;
}

static inline int t_main(int argc, char **argv, const struct t_case *cases, size_t n)
{
    struct t_case *sel = calloc(n ? n : 1, sizeof(*sel));
    if (!sel)
        return 1;
    int k = t_select(argc, argv, cases, n, sel);
    int rc = k < 0 ? 1 : t_run(sel, (size_t)k);
    free(sel);
    return rc;
}

#define TEST_MAIN(...)                                                              \
    int main(int argc, char **argv)                                                 \
    {                                                                               \
        static const struct t_case cases_[] = {__VA_ARGS__};                        \
        return t_main(argc, argv, cases_, sizeof(cases_) / sizeof(cases_[0]));      \
    }

#endif
