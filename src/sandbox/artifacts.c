/* artifacts.c - what a run leaves behind: once every process of the run is
 * dead (bare mode: its process group, and what left it where the job's
 * bare_hooks swept it), the PNG and CSV files the code wrote into /workspace, read through
 * the workspace fd and following nothing (no symlink, no other mount, one
 * link only), at most ARTIFACT_MAX_DEPTH levels deep and ARTIFACT_MAX_ENTRIES
 * names in all, within limits.max_artifact_bytes (a note says what was
 * left out); an input the code did not change is no artifact, nor is a
 * file a session step restored unchanged or a session's own file, and a name
 * that is not UTF-8 or holds a control or format character is skipped with
 * a note. Also the removal of a bare run's private directory, which lists
 * the same way. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/text.h"
#include "core/util.h"
#include "sandbox/sandbox_int.h"
#include "sandbox/sys.h"

#define ARTIFACT_MAX_DEPTH 8

struct walk {
    struct ci_sandbox_run *run;
    struct ci_artifact *items;
    size_t n, cap;
    uint64_t used, limit;
    unsigned entries;
    dev_t dev;
    struct ci_buf skipped; /* "'a.png', 'b.csv'" */
    unsigned n_skipped;
    struct ci_buf refused; /* "'a\\u202egnp.csv' (U+202E), 'b\\xff' (not UTF-8)" */
    unsigned n_refused;
    bool too_many;
    ci_status s;
};

/* Opens name in dirfd without leaving it: no symlink, no magic link, no
 * other mount, no "..". openat2() where the kernel has it; names are single
 * components, so O_NOFOLLOW plus the st_dev check is the same elsewhere. */
int open_beneath(int dirfd, const char *name, int flags)
{
    struct open_how how = {.flags = (uint64_t)flags,
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
                                      RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV};
    int fd = sys_openat2(dirfd, name, &how);
    if (fd < 0 && errno == ENOSYS)
        fd = openat(dirfd, name, flags);
    return fd;
}

/* Reads name, a regular file of one link on the workspace's filesystem,
 * through ws_fd following nothing. *ret_size: its size (0 when there is no
 * such file); *ret_data NULL when there is none, it is something else, it
 * is over max, or it grew while read. */
ci_status read_beneath(int ws_fd, const char *name, uint64_t max, uint8_t **ret_data,
                       size_t *ret_len, uint64_t *ret_size)
{
    *ret_data = NULL;
    *ret_len = 0;
    *ret_size = 0;
    struct stat ws, st;
    if (fstat(ws_fd, &ws) != 0)
        return CI_OK;
    int fd = open_beneath(ws_fd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return CI_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1 ||
        st.st_dev != ws.st_dev) {
        close(fd);
        return CI_OK;
    }
    uint64_t size = (uint64_t)st.st_size;
    *ret_size = size;
    if (size > max || size > SIZE_MAX - 1) {
        close(fd);
        return CI_OK;
    }
    uint8_t *data = malloc(size + 1);
    if (!data) {
        close(fd);
        return CI_ERR_NOMEM;
    }
    size_t got = 0;
    while (got <= size) { /* one byte more than expected: it must not have grown */
        ssize_t n = pread(fd, data + got, size + 1 - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (got != size) {
        free(data);
        return CI_OK;
    }
    *ret_data = data;
    *ret_len = size;
    return CI_OK;
}

static bool ends_with_csv(const char *name)
{
    size_t len = strlen(name);
    return len >= 4 && strcasecmp(name + len - 4, ".csv") == 0;
}

static void note_skipped(struct walk *w, const char *rel)
{
    w->n_skipped++;
    if (w->n_skipped <= 5 &&
        ci_buf_appendf(&w->skipped, "%s'%s'", w->skipped.len ? ", " : "", rel) != CI_OK)
        w->s = CI_ERR_NOMEM;
}

/* A name we do not hand on: not UTF-8, or with a control or format
 * character (ci_text_cp_unsafe: C0, DEL, C1, bidi overrides such as U+202E,
 * zero-width characters such as U+200B, U+2028). Clients decode names as
 * proto3 strings, and an agent or a person would read "x\u202egnp.csv" as
 * "xvsc.png". The first five are quoted, escaped, in the note. */
static void note_refused(struct walk *w, const char *prefix, const char *name,
                         enum ci_text_verdict v, uint32_t cp)
{
    if (++w->n_refused > 5)
        return;
    struct ci_buf *b = &w->refused;
    /* The prefix is made of names that passed. */
    ci_status s = ci_buf_appendf(b, "%s'%s%s", b->len ? ", " : "", prefix, *prefix ? "/" : "");
    if (!s)
        s = ci_text_escape(b, name, strlen(name), false);
    if (!s)
        s = v == CI_TEXT_NOT_UTF8 ? ci_buf_appendf(b, "' (not UTF-8)")
                                  : ci_buf_appendf(b, "' (U+%04" PRIX32 ")", cp);
    if (s)
        w->s = CI_ERR_NOMEM;
}

static bool unchanged_input(const struct walk *w, const char *rel, const char *sha)
{
    for (size_t i = 0; i < w->run->n_inputs; i++)
        if (strcmp(w->run->inputs[i].name, rel) == 0)
            return strcmp(w->run->inputs[i].sha256, sha) == 0;
    return false;
}

static void consider_file(struct walk *w, int fd, const char *rel, const struct stat *st)
{
    static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    uint8_t head[8];
    ssize_t hn = pread(fd, head, sizeof(head), 0);
    bool png = hn == (ssize_t)sizeof(head) && memcmp(head, png_magic, sizeof(head)) == 0;
    bool csv = !png && ends_with_csv(rel);
    if (!png && !csv)
        return;
    uint64_t size = (uint64_t)st->st_size;
    if (size > w->limit - w->used) {
        note_skipped(w, rel);
        return;
    }
    uint8_t *data = malloc(size + 1);
    if (!data) {
        w->s = CI_ERR_NOMEM;
        return;
    }
    size_t got = 0;
    while (got <= size) { /* one byte more than expected: the file must not have grown */
        ssize_t n = pread(fd, data + got, size + 1 - got, (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (got != size || (csv && memchr(data, 0, size))) {
        free(data);
        return;
    }
    char sha[65];
    ci_sha256_hex(data, size, sha);
    if ((!strchr(rel, '/') && unchanged_input(w, rel, sha)) ||
        session_unchanged(w->run, rel, sha)) {
        free(data);
        return;
    }
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 8;
        struct ci_artifact *p = realloc(w->items, cap * sizeof(*p));
        if (!p) {
            free(data);
            w->s = CI_ERR_NOMEM;
            return;
        }
        w->items = p;
        w->cap = cap;
    }
    struct ci_artifact *a = &w->items[w->n];
    memset(a, 0, sizeof(*a));
    a->name = strdup(rel);
    a->mime_type = strdup(png ? "image/png" : "text/csv");
    if (!a->name || !a->mime_type) {
        free(a->name);
        free(a->mime_type);
        free(data);
        w->s = CI_ERR_NOMEM;
        return;
    }
    a->data = data;
    a->len = size;
    memcpy(a->sha256, sha, sizeof(sha));
    w->n++;
    w->used += size;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Lists dirfd's names (sorted) without following anything. */
static char **list_dir(int dirfd, size_t budget, size_t *ret_n, bool *truncated)
{
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return NULL;
    }
    char **names = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (n == budget) {
            *truncated = true;
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **p = realloc(names, cap * sizeof(*p));
            if (!p)
                break;
            names = p;
        }
        if (!(names[n] = strdup(e->d_name)))
            break;
        n++;
    }
    closedir(d);
    if (n)
        qsort(names, n, sizeof(*names), cmp_names);
    *ret_n = n;
    return names;
}

static void walk_dir(struct walk *w, int dirfd, const char *prefix, int depth)
{
    size_t n = 0;
    bool truncated = false;
    char **names = list_dir(dirfd, ARTIFACT_MAX_ENTRIES - w->entries, &n, &truncated);
    if (truncated)
        w->too_many = true;
    w->entries += (unsigned)n;
    for (size_t i = 0; i < n && !w->s; i++) {
        const char *name = names[i];
        if (!*prefix && (session_reserved_name(name) || outputs_reserved_name(name)))
            continue; /* a session's or the outputs' own files: never artifacts */
        uint32_t cp = 0;
        enum ci_text_verdict v = ci_text_name_check(name, strlen(name), &cp);
        if (v != CI_TEXT_OK) {
            note_refused(w, prefix, name, v, cp);
            continue;
        }
        char *rel = NULL;
        if (asprintf(&rel, "%s%s%s", prefix, *prefix ? "/" : "", name) < 0) {
            w->s = CI_ERR_NOMEM;
            break;
        }
        int fd = open_beneath(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY |
                                               O_CLOEXEC);
        struct stat st;
        if (fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == w->dev) {
            if (S_ISDIR(st.st_mode) && depth < ARTIFACT_MAX_DEPTH)
                walk_dir(w, fd, rel, depth + 1);
            else if (S_ISREG(st.st_mode) && st.st_nlink == 1)
                consider_file(w, fd, rel, &st);
        }
        if (fd >= 0)
            close(fd);
        free(rel);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

ci_status collect_artifacts(struct ci_sandbox_run *run, struct ci_sandbox_result *r)
{
    struct walk w = {.run = run, .limit = run->sb->cfg->limits.max_artifact_bytes,
                     .skipped = CI_BUF_INIT, .refused = CI_BUF_INIT};
    struct stat st;
    if (fstat(run->ws_fd, &st) != 0)
        return CI_OK;
    w.dev = st.st_dev;
    walk_dir(&w, run->ws_fd, "", 1);
    struct ci_buf note = CI_BUF_INIT;
    if (!w.s && w.n_skipped) {
        char cap[48];
        if (w.limit % (1024 * 1024) == 0)
            snprintf(cap, sizeof(cap), "%llu MiB", (unsigned long long)(w.limit >> 20));
        else
            snprintf(cap, sizeof(cap), "%llu bytes", (unsigned long long)w.limit);
        if (ci_buf_appendf(&note, "artifacts exceed %s in all; %s%s %s not kept", cap,
                           (const char *)w.skipped.data, w.n_skipped > 5 ? " and others" : "",
                           w.n_skipped > 1 ? "were" : "was") != CI_OK)
            w.s = CI_ERR_NOMEM;
    }
    if (!w.s && w.too_many &&
        ci_buf_appendf(&note, "%sthe workspace holds more than %d entries; only the first "
                       "%d were looked at for artifacts", note.len ? "; " : "",
                       ARTIFACT_MAX_ENTRIES, ARTIFACT_MAX_ENTRIES) != CI_OK)
        w.s = CI_ERR_NOMEM;
    if (!w.s && w.n_refused &&
        ci_buf_appendf(&note,
                       "%s%s%s %s skipped: artifact names must be UTF-8 without control or "
                       "format characters",
                       note.len ? "; " : "", (const char *)w.refused.data,
                       w.n_refused > 5 ? " and others" : "",
                       w.n_refused > 1 ? "were" : "was") != CI_OK)
        w.s = CI_ERR_NOMEM;
    ci_buf_release(&w.skipped);
    ci_buf_release(&w.refused);
    if (w.s) {
        for (size_t i = 0; i < w.n; i++)
            ci_artifact_release(&w.items[i]);
        free(w.items);
        ci_buf_release(&note);
        return w.s;
    }
    r->outcome.artifacts = w.items;
    r->outcome.n_artifacts = w.n;
    r->artifact_note = note.len ? (char *)ci_buf_steal(&note, NULL) : NULL;
    ci_buf_release(&note);
    return CI_OK;
}

/* One pass of remove_tree_at over dirfd's tree. Every directory is made
 * 0700 first (the task may have left one unreadable or read-only: it owns
 * them, and we are it or root). A directory deeper than 64 levels is moved
 * up to top instead of entered, so that the recursion stays bounded: the
 * next pass takes it. Returns whether a next pass has work (a directory
 * moved, or more entries than one listing holds). */
static bool remove_level(int top, int dirfd, int depth, unsigned *serial)
{
    size_t n = 0;
    bool again = false;
    fchmod(dirfd, 0700);
    char **names = list_dir(dirfd, 100000, &n, &again);
    for (size_t i = 0; i < n; i++) {
        if (unlinkat(dirfd, names[i], 0) == 0 || (errno != EISDIR && errno != EPERM)) {
            free(names[i]);
            continue;
        }
        if (depth >= 64) {
            /* The task may have taken some names at the top: try others. */
            for (int tries = 0; tries < 100; tries++) {
                char up[32];
                snprintf(up, sizeof(up), ".ci-deep-%u", (*serial)++);
                if (renameat(dirfd, names[i], top, up) == 0) {
                    again = true;
                    break;
                }
                if (errno != EEXIST && errno != ENOTEMPTY)
                    break;
            }
            free(names[i]);
            continue;
        }
        int fd = openat(dirfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        /* EACCES here means a directory (not a link: O_NOFOLLOW would say
         * ELOOP) without read or search permission. */
        if (fd < 0 && errno == EACCES && fchmodat(dirfd, names[i], 0700, 0) == 0)
            fd = openat(dirfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) {
            again |= remove_level(top, fd, depth + 1, serial);
            close(fd);
        }
        unlinkat(dirfd, names[i], AT_REMOVEDIR);
        free(names[i]);
    }
    free(names);
    return again;
}

/* Removes a bare-mode task directory's content, fd-relative, following
 * nothing, however deep or locked its tree. The task's process group is
 * dead by now; a process that left it is dead too only where the job's
 * bare_hooks swept it (ci-executor). Bounded passes: a tree that something
 * still alive keeps growing is left. */
void remove_tree_at(int dirfd, int depth)
{
    (void)depth;
    unsigned serial = 0;
    for (int pass = 0; pass < 1000 && remove_level(dirfd, dirfd, 0, &serial); pass++)
        continue;
}

