/* text.c - strict UTF-8, the characters a name must not hold, and their
 * escaping for a terminal. See text.h. */
#include "core/text.h"

#include <stdio.h>
#include <string.h>

size_t ci_text_utf8_decode(const uint8_t *p, size_t n, uint32_t *ret_cp)
{
    uint8_t c = p[0];
    size_t len;
    uint32_t cp;
    /* The second byte's range excludes overlong forms (E0, F0), surrogates
     * (ED) and code points past U+10FFFF (F4). */
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
        *ret_cp = c;
        return 1;
    }
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
        cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        cp = c & 0x0F;
        lo = c == 0xE0 ? 0xA0 : 0x80;
        hi = c == 0xED ? 0x9F : 0xBF;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        cp = c & 0x07;
        lo = c == 0xF0 ? 0x90 : 0x80;
        hi = c == 0xF4 ? 0x8F : 0xBF;
    } else {
        return 0;
    }
    if (n < len || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    *ret_cp = cp;
    return len;
}

/* Unicode 17.0, General_Category=Cf (DerivedGeneralCategory.txt), in order. */
static const struct {
    uint32_t first, last;
} format_chars[] = {
    {0x00AD, 0x00AD},   /* soft hyphen */
    {0x0600, 0x0605},   /* Arabic number signs */
    {0x061C, 0x061C},   /* Arabic letter mark */
    {0x06DD, 0x06DD},   /* Arabic end of ayah */
    {0x070F, 0x070F},   /* Syriac abbreviation mark */
    {0x0890, 0x0891},   /* Arabic pound/piastre mark above */
    {0x08E2, 0x08E2},   /* Arabic disputed end of ayah */
    {0x180E, 0x180E},   /* Mongolian vowel separator */
    {0x200B, 0x200F},   /* zero width space, ZWNJ, ZWJ, LRM, RLM */
    {0x202A, 0x202E},   /* bidi embeddings and overrides */
    {0x2060, 0x2064},   /* word joiner, invisible operators */
    {0x2066, 0x206F},   /* bidi isolates, deprecated format characters */
    {0xFEFF, 0xFEFF},   /* zero width no-break space (BOM) */
    {0xFFF9, 0xFFFB},   /* interlinear annotation */
    {0x110BD, 0x110BD}, /* Kaithi number sign */
    {0x110CD, 0x110CD}, /* Kaithi number sign above */
    {0x13430, 0x1343F}, /* Egyptian hieroglyph format controls */
    {0x1BCA0, 0x1BCA3}, /* shorthand format controls */
    {0x1D173, 0x1D17A}, /* musical symbol format controls */
    {0xE0001, 0xE0001}, /* language tag */
    {0xE0020, 0xE007F}, /* tag characters */
};

bool ci_text_cp_unsafe(uint32_t cp)
{
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F)) /* Cc */
        return true;
    if (cp == 0x2028 || cp == 0x2029) /* Zl, Zp */
        return true;
    for (size_t i = 0; i < sizeof(format_chars) / sizeof(format_chars[0]); i++) {
        if (cp < format_chars[i].first)
            return false;
        if (cp <= format_chars[i].last)
            return true;
    }
    return false;
}

enum ci_text_verdict ci_text_name_check(const char *s, size_t len, uint32_t *ret_cp)
{
    const uint8_t *p = (const uint8_t *)s;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t n = ci_text_utf8_decode(p + i, len - i, &cp);
        if (n == 0)
            return CI_TEXT_NOT_UTF8;
        if (ci_text_cp_unsafe(cp)) {
            if (ret_cp)
                *ret_cp = cp;
            return CI_TEXT_UNSAFE;
        }
        i += n;
    }
    return CI_TEXT_OK;
}

ci_status ci_text_escape(struct ci_buf *out, const char *s, size_t len, bool keep_lines)
{
    const uint8_t *p = (const uint8_t *)s;
    ci_status st = ci_buf_reserve(out, len);
    size_t plain = 0; /* start of the run not yet copied */
    for (size_t i = 0; i < len && !st;) {
        uint32_t cp = 0;
        size_t n = ci_text_utf8_decode(p + i, len - i, &cp);
        bool line = cp == '\n' || cp == '\t';
        bool escape = n == 0 || (ci_text_cp_unsafe(cp) && !(keep_lines && line));
        if (!escape) {
            i += n;
            continue;
        }
        char e[16];
        if (n == 0) {
            snprintf(e, sizeof(e), "\\x%02x", p[i]);
            n = 1;
        } else if (cp < 0x80) {
            snprintf(e, sizeof(e), "\\x%02x", (unsigned)cp);
        } else if (cp <= 0xFFFF) {
            snprintf(e, sizeof(e), "\\u%04x", (unsigned)cp);
        } else {
            snprintf(e, sizeof(e), "\\U%08x", (unsigned)cp);
        }
        st = ci_buf_append(out, p + plain, i - plain);
        if (!st)
            st = ci_buf_append(out, e, strlen(e));
        i += n;
        plain = i;
    }
    if (!st)
        st = ci_buf_append(out, p + plain, len - plain);
    return st;
}
