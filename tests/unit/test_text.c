/* Unit tests of text.c: strict UTF-8, the unsafe characters, escaping. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/text.h"
#include "testutil.h"

static size_t decode(const char *s, uint32_t *cp)
{
    *cp = 0xFFFFFFFF;
    return ci_text_utf8_decode((const uint8_t *)s, strlen(s), cp);
}

static void test_utf8_decode(void)
{
    uint32_t cp;
    CHECK(decode("A", &cp) == 1 && cp == 'A');
    CHECK(ci_text_utf8_decode((const uint8_t *)"\0", 1, &cp) == 1 && cp == 0);
    CHECK(decode("\xc2\x80", &cp) == 2 && cp == 0x80);
    CHECK(decode("\xc3\xa9", &cp) == 2 && cp == 0xE9);
    CHECK(decode("\xe0\xa0\x80", &cp) == 3 && cp == 0x800);
    CHECK(decode("\xe2\x80\xae", &cp) == 3 && cp == 0x202E);
    CHECK(decode("\xef\xbf\xbd", &cp) == 3 && cp == 0xFFFD);
    CHECK(decode("\xf0\x90\x80\x80", &cp) == 4 && cp == 0x10000);
    CHECK(decode("\xf3\xa0\x80\x81", &cp) == 4 && cp == 0xE0001);
    CHECK(decode("\xf4\x8f\xbf\xbf", &cp) == 4 && cp == 0x10FFFF);
    /* invalid: nothing written */
    static const char *bad[] = {
        "\x80",             /* a lone continuation byte */
        "\xbf",             /* another */
        "\xc0\xaf",         /* overlong '/' */
        "\xc1\xbf",         /* overlong */
        "\xe0\x80\xaf",     /* overlong '/' in three bytes */
        "\xe0\x9f\xbf",     /* overlong U+07FF */
        "\xf0\x80\x80\xaf", /* overlong in four bytes */
        "\xf0\x8f\xbf\xbf", /* overlong U+FFFF */
        "\xed\xa0\x80",     /* surrogate U+D800 */
        "\xed\xbf\xbf",     /* surrogate U+DFFF */
        "\xf4\x90\x80\x80", /* U+110000 */
        "\xf5\x80\x80\x80", /* past the range */
        "\xff",
        "\xfe",
        "\xc3",             /* cut */
        "\xe2\x80",         /* cut */
        "\xf0\x90\x80",     /* cut */
        "\xc3(",            /* not a continuation */
        "\xe2\x80(",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        CHECK(decode(bad[i], &cp) == 0);
        CHECK(cp == 0xFFFFFFFF);
    }
}

static void test_unsafe_set(void)
{
    /* Cc */
    for (uint32_t c = 0; c < 0x20; c++)
        CHECK(ci_text_cp_unsafe(c));
    for (uint32_t c = 0x7F; c <= 0x9F; c++)
        CHECK(ci_text_cp_unsafe(c));
    for (uint32_t c = 0x20; c < 0x7F; c++)
        CHECK(!ci_text_cp_unsafe(c));
    /* Cf of Unicode 17, whole ranges, and Zl, Zp */
    static const uint32_t ranges[][2] = {
        {0x00AD, 0x00AD}, {0x0600, 0x0605}, {0x061C, 0x061C},   {0x06DD, 0x06DD},
        {0x070F, 0x070F}, {0x0890, 0x0891}, {0x08E2, 0x08E2},   {0x180E, 0x180E},
        {0x200B, 0x200F}, {0x202A, 0x202E}, {0x2060, 0x2064},   {0x2066, 0x206F},
        {0xFEFF, 0xFEFF}, {0xFFF9, 0xFFFB}, {0x110BD, 0x110BD}, {0x110CD, 0x110CD},
        {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0001, 0xE0001},
        {0xE0020, 0xE007F}, {0x2028, 0x2029},
    };
    size_t n_unsafe = 0;
    for (size_t i = 0; i < sizeof(ranges) / sizeof(ranges[0]); i++) {
        for (uint32_t c = ranges[i][0]; c <= ranges[i][1]; c++)
            CHECK(ci_text_cp_unsafe(c));
    }
    /* nothing else: count over all of Unicode (65 Cc, 170 Cf in 17.0, 2) */
    for (uint32_t c = 0; c <= 0x10FFFF; c++)
        n_unsafe += ci_text_cp_unsafe(c);
    CHECK(n_unsafe == 65 + 170 + 2);
    /* neighbours and ordinary text */
    static const uint32_t fine[] = {0xA0, 0xE9, 0x2065, 0x202F, 0x2027, 0x2030, 0x3000,
                                    0x4E2D, 0xFFFD, 0xFEFE, 0x1F600, 0xE0000, 0xE0002,
                                    0xE0080, 0x10FFFF};
    for (size_t i = 0; i < sizeof(fine) / sizeof(fine[0]); i++)
        CHECK(!ci_text_cp_unsafe(fine[i]));
}

static void test_name_check(void)
{
    uint32_t cp = 0;
#define NAME(s) ci_text_name_check(s, sizeof(s) - 1, &cp)
    CHECK(NAME("plot.png") == CI_TEXT_OK);
    CHECK(NAME("caf\xc3\xa9 \xe4\xb8\xad.csv") == CI_TEXT_OK);
    CHECK(NAME("") == CI_TEXT_OK); /* length is the caller's rule */
    CHECK(NAME("report\xe2\x80\xaegnp.csv") == CI_TEXT_UNSAFE && cp == 0x202E);
    CHECK(NAME("a\xe2\x80\x8b.csv") == CI_TEXT_UNSAFE && cp == 0x200B);
    CHECK(NAME("a\xef\xbb\xbf.csv") == CI_TEXT_UNSAFE && cp == 0xFEFF);
    CHECK(NAME("line\xe2\x80\xa8.csv") == CI_TEXT_UNSAFE && cp == 0x2028);
    CHECK(NAME("tag\xf3\xa0\x80\x81.csv") == CI_TEXT_UNSAFE && cp == 0xE0001);
    CHECK(NAME("c1\xc2\x9b.csv") == CI_TEXT_UNSAFE && cp == 0x9B);
    CHECK(NAME("esc\x1b[31m.csv") == CI_TEXT_UNSAFE && cp == 0x1B);
    CHECK(NAME("new\nline.csv") == CI_TEXT_UNSAFE && cp == '\n');
    CHECK(NAME("tab\t.csv") == CI_TEXT_UNSAFE && cp == '\t');
    CHECK(NAME("del\x7f.csv") == CI_TEXT_UNSAFE && cp == 0x7F);
    CHECK(ci_text_name_check("a\0b", 3, &cp) == CI_TEXT_UNSAFE && cp == 0);
    CHECK(NAME("bad\xff.csv") == CI_TEXT_NOT_UTF8);
    CHECK(NAME("over\xc0\xaf.csv") == CI_TEXT_NOT_UTF8);
    CHECK(NAME("sur\xed\xa0\x80.csv") == CI_TEXT_NOT_UTF8);
    CHECK(NAME("cut\xe2\x80") == CI_TEXT_NOT_UTF8);
    /* the first problem counts */
    CHECK(NAME("\xff\xe2\x80\xae") == CI_TEXT_NOT_UTF8);
    CHECK(NAME("\xe2\x80\xae\xff") == CI_TEXT_UNSAFE && cp == 0x202E);
    CHECK(ci_text_name_check("x\xe2\x80\x8b", 4, NULL) == CI_TEXT_UNSAFE);
#undef NAME
}

static char *escaped(const char *s, size_t len, bool keep_lines)
{
    struct ci_buf b = CI_BUF_INIT;
    if (ci_text_escape(&b, s, len, keep_lines) != CI_OK) {
        ci_buf_release(&b);
        return NULL;
    }
    if (!b.data) /* nothing appended */
        return strdup("");
    return (char *)ci_buf_steal(&b, NULL);
}

static void test_escape(void)
{
    static const char out[] = "out:\x1b[2J\x1b]52;c;ZXZpbA==\x07\xc2\x9b" "1A\xe2\x80\xae"
                              "evil\rover\x7f\ttab\xe2\x80\x8b\n";
    char *s = escaped(out, sizeof(out) - 1, true);
    CHECK_STR(s, "out:\\x1b[2J\\x1b]52;c;ZXZpbA==\\x07\\u009b1A\\u202eevil\\x0dover\\x7f\ttab"
                 "\\u200b\n");
    CHECK(s && !strchr(s, 0x1b) && !strchr(s, '\r'));
    free(s);
    s = escaped(out, sizeof(out) - 1, false);
    CHECK_STR(s, "out:\\x1b[2J\\x1b]52;c;ZXZpbA==\\x07\\u009b1A\\u202eevil\\x0dover\\x7f\\x09tab"
                 "\\u200b\\x0a");
    free(s);
    /* plain text, backslashes and all, is left alone */
    static const char plain[] = "caf\xc3\xa9 \xe4\xb8\xad \\x1b \xf0\x9f\x98\x80\n";
    s = escaped(plain, sizeof(plain) - 1, true);
    CHECK_STR(s, plain);
    free(s);
    /* bytes that are not UTF-8 one by one, four-byte characters in 8 digits */
    static const char odd[] = "a\xff\xc0\xaf" "b\xe2\x80" "c\xf3\xa0\x80\x81" "d\xf3\xa0\x81\x81";
    s = escaped(odd, sizeof(odd) - 1, true);
    CHECK_STR(s, "a\\xff\\xc0\\xafb\\xe2\\x80c\\U000e0001d\\U000e0041");
    free(s);
    /* a NUL inside */
    s = escaped("a\0b", 3, true);
    CHECK_STR(s, "a\\x00b");
    free(s);
    s = escaped("", 0, true);
    CHECK_STR(s, "");
    free(s);
    /* appends */
    struct ci_buf b = CI_BUF_INIT;
    REQUIRE(ci_buf_append(&b, "ci: ", 4) == CI_OK);
    REQUIRE(ci_text_escape(&b, "\x1b", 1, true) == CI_OK);
    CHECK_STR((char *)b.data, "ci: \\x1b");
    ci_buf_release(&b);
}

/* The table against the Unicode Character Database of the machine, where
 * Debian's unicode-data is installed: every Cc, Cf, Zl and Zp character it
 * lists is unsafe, and every other character it lists is not. (The file may
 * be of an older Unicode: characters it does not list are not checked.) */
static void test_unicode_data(void)
{
    const char *path = "/usr/share/unicode/UnicodeData.txt";
    FILE *f = fopen(path, "re");
    if (!f)
        SKIP("%s is missing (Debian package unicode-data)", path);
    char line[512];
    unsigned long first = 0;
    size_t listed = 0, wrong = 0;
    while (fgets(line, sizeof(line), f)) {
        char *semi1 = strchr(line, ';');
        char *semi2 = semi1 ? strchr(semi1 + 1, ';') : NULL;
        char *semi3 = semi2 ? strchr(semi2 + 1, ';') : NULL;
        if (!semi3)
            continue;
        unsigned long cp = strtoul(line, NULL, 16);
        char cat[3] = {semi2[1], semi2[2], '\0'};
        bool is_first = strstr(semi1, ", First>;") != NULL;
        bool is_last = strstr(semi1, ", Last>;") != NULL;
        if (is_first) {
            first = cp;
            continue;
        }
        unsigned long from = is_last ? first : cp;
        bool want = !strcmp(cat, "Cc") || !strcmp(cat, "Cf") || !strcmp(cat, "Zl") ||
                    !strcmp(cat, "Zp");
        for (unsigned long c = from; c <= cp; c++) {
            listed++;
            if (ci_text_cp_unsafe((uint32_t)c) != want) {
                if (wrong++ < 10)
                    fprintf(stderr, "U+%04lX (%s) is %s by the table\n", c, cat,
                            want ? "not unsafe" : "unsafe");
            }
        }
    }
    fclose(f);
    CHECK(listed > 100000);
    CHECK(wrong == 0);
}

TEST_MAIN(T(test_utf8_decode), T(test_unsafe_set), T(test_name_check), T(test_escape),
          T_OWN(test_unicode_data))
