/* text.h - the one rule for text that untrusted code chose and a person or
 * an agent will read (file names, output shown on a terminal): strict UTF-8,
 * and no character that is invisible or moves, hides or reorders the text
 * around it. */
#ifndef CI_TEXT_H
#define CI_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/util.h"

/* Decodes the well-formed UTF-8 sequence at p (at most n bytes, n > 0):
 * no overlong form, no surrogate, nothing past U+10FFFF. Returns its length
 * and writes the code point to *ret_cp, or returns 0 (and writes nothing)
 * for an invalid or cut sequence. A NUL byte is U+0000, of length 1. */
size_t ci_text_utf8_decode(const uint8_t *p, size_t n, uint32_t *ret_cp);

/* Whether cp is a control character (Unicode category Cc: C0, DEL, C1), a
 * format character (Cf: bidi overrides and isolates such as U+202E,
 * zero-width characters such as U+200B, U+FEFF, tags, ...) or a line or
 * paragraph separator (U+2028, U+2029). The Cf set is that of Unicode 17. */
bool ci_text_cp_unsafe(uint32_t cp);

/* What is wrong with text as a name. */
enum ci_text_verdict {
    CI_TEXT_OK,
    CI_TEXT_NOT_UTF8, /* not well-formed UTF-8 */
    CI_TEXT_UNSAFE,   /* holds a character of ci_text_cp_unsafe() */
};

/* Checks len bytes of s as a name: well-formed UTF-8 without any character
 * of ci_text_cp_unsafe() (so also without NUL, newline or tab). For
 * CI_TEXT_UNSAFE the first such code point goes to *ret_cp (may be NULL). */
enum ci_text_verdict ci_text_name_check(const char *s, size_t len, uint32_t *ret_cp);

/* Appends len bytes of s to out with every character of ci_text_cp_unsafe()
 * escaped, so that what is shown is only text: below U+0080 as "\x1b",
 * above as "\u202e" or "\U000e0001"; a byte that is not part of well-formed
 * UTF-8 as "\xff". With keep_lines, newline and tab stay as they are (output
 * shown on a terminal); without, they are escaped too (a name quoted on one
 * line). The rest, backslashes too, is copied as it is. */
ci_status ci_text_escape(struct ci_buf *out, const char *s, size_t len, bool keep_lines);

#endif
