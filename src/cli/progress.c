/* progress.c - a progress bar drawn from counts (progress.h). */
#include "cli/progress.h"

#include <string.h>

size_t ci_progress_bar(char *out, size_t n, int width, const uint64_t *segments,
                       const char *glyphs, size_t n_segments, uint64_t total)
{
    if (n == 0)
        return 0;
    if (width < 0)
        width = 0;
    if (n_segments > CI_PROGRESS_MAX_SEGMENTS)
        n_segments = CI_PROGRESS_MAX_SEGMENTS;
    size_t used = 0;
    const size_t room = n - 1;
#define PUT(ch)                                                                                \
    do {                                                                                       \
        if (used < room)                                                                       \
            out[used++] = (ch);                                                                \
    } while (0)
    PUT('[');
    uint64_t sum = 0;
    int cells = 0;
    for (size_t i = 0; i < n_segments && total; i++) {
        uint64_t add = segments[i];
        if (add > total - sum)
            add = total - sum;
        sum += add;
        /* The cells the running sum reaches (128 bits: no overflow). */
        int reach = sum == total ? width
                                 : (int)((unsigned __int128)(unsigned)width * sum / total);
        if (reach > width)
            reach = width;
        for (; cells < reach; cells++)
            PUT(glyphs[i]);
    }
    for (; cells < width; cells++)
        PUT('.');
    PUT(']');
#undef PUT
    out[used] = '\0';
    return used;
}

int ci_progress_width(int cols, size_t text_len)
{
    long room = (long)cols - 1 - 3 - (long)text_len; /* the last column, "[" "]" and a space */
    if (room < 10)
        return 0;
    return room > 40 ? 40 : (int)room;
}

size_t ci_progress_line(char *out, size_t n, int cols, const uint64_t *segments,
                        const char *glyphs, size_t n_segments, uint64_t total, const char *text)
{
    if (n == 0)
        return 0;
    if (cols < 1)
        cols = 80;
    size_t fit = (size_t)cols - 1; /* characters the line may hold */
    if (fit + 1 > n)
        fit = n - 1;
    size_t text_len = strlen(text);
    int width = ci_progress_width(cols, text_len);
    size_t used = 0;
    if (width) {
        used = ci_progress_bar(out, n, width, segments, glyphs, n_segments, total);
        if (used < fit)
            out[used++] = ' ';
    }
    size_t room = fit > used ? fit - used : 0;
    if (text_len > room)
        text_len = room;
    memcpy(out + used, text, text_len);
    used += text_len;
    out[used] = '\0';
    return used;
}
