/* testutil.h - a tiny test harness: CHECK records a failure and goes on,
 * REQUIRE stops the current test. main() is TEST_MAIN(t1, t2, ...). */
#ifndef CI_TESTUTIL_H
#define CI_TESTUTIL_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static int t_failed, t_checks;
static const char *t_name;

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

typedef void (*t_fn)(void);
struct t_case {
    const char *name;
    t_fn fn;
};
#define T(fn) {#fn, fn}

static inline int t_run(const struct t_case *cases, size_t n)
{
    int failed_tests = 0;
    for (size_t i = 0; i < n; i++) {
        int before = t_failed;
        t_name = cases[i].name;
        cases[i].fn();
        if (t_failed != before)
            failed_tests++;
        fprintf(stderr, "%s %s\n", t_failed != before ? "FAIL" : "ok  ", cases[i].name);
    }
    fprintf(stderr, "%zu passed, %d failed\n", n - (size_t)failed_tests, failed_tests);
    return failed_tests ? 1 : 0;
}

#define TEST_MAIN(...)                                                              \
    int main(void)                                                                  \
    {                                                                               \
        static const struct t_case cases_[] = {__VA_ARGS__};                        \
        return t_run(cases_, sizeof(cases_) / sizeof(cases_[0]));                   \
    }

#endif
