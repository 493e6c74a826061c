/* progress.h - a progress bar on one line of a terminal, drawn from
 * counts: "[####xx>>>.......]". Pure text: the caller writes it (with a
 * carriage return before it) and decides how often. */
#ifndef CI_PROGRESS_H
#define CI_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#define CI_PROGRESS_MAX_SEGMENTS 8

/* Writes "[" + width cells + "]" into out (n bytes, NUL-terminated, cut
 * to fit). Segment i takes its share of total in cells of glyphs[i], one
 * after the other; the cells left are '.'. A segment's cells are those its
 * running sum reaches (rounded down), so the bar fills only when the
 * segments add up to total, and a bar of 0 of 0 is empty. Segments beyond
 * total are cut. Returns the length written. */
size_t ci_progress_bar(char *out, size_t n, int width, const uint64_t *segments,
                       const char *glyphs, size_t n_segments, uint64_t total);

/* The width of a bar for a line of cols columns that also holds text of
 * text_len characters (and leaves the last column free: a line as wide as
 * the terminal wraps on some): between 10 and 40 cells, 0 when it does not
 * fit. */
int ci_progress_width(int cols, size_t text_len);

/* One line of a progress view that fits a terminal of cols columns (80
 * when cols < 1): "[bar] text" with a bar of ci_progress_width, or the
 * text alone when no bar fits, cut to leave the last column free, so that
 * a redraw after "\r" never wraps. text is ASCII (ids and counts). Writes
 * into out (n bytes, NUL-terminated); returns the length. */
size_t ci_progress_line(char *out, size_t n, int cols, const uint64_t *segments,
                        const char *glyphs, size_t n_segments, uint64_t total, const char *text);

#endif
