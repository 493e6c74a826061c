/* zsetup.c - the SETUP plan, parsed by ci-zygote and again by each task's
 * small init (ci-zygote-init) from the same sealed memfd. See zsetup.h. */
#include "sandbox/zsetup.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int bad(char *why, size_t why_len, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int bad(char *why, size_t why_len, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
    errno = err;
    return -1;
}

/* The plan step a SETUP step names; 0 (refused by child_run_op() in the
 * task's init) for a kind we do not know. */
static enum op_kind op_kind_of(uint32_t kind)
{
    static const enum op_kind kinds[] = {[ZOP_TMPFS] = OP_TMPFS, [ZOP_DIR] = OP_DIR,
                                         [ZOP_FILE] = OP_FILE, [ZOP_PROC] = OP_PROC};
    return kind < sizeof(kinds) / sizeof(kinds[0]) ? kinds[kind] : 0;
}

static int parse(char *blob, size_t size, struct zsetup *z, char *why, size_t why_len)
{
    struct zsetup_head h;
    memcpy(&h, blob, sizeof(h));
    z->clone_flags = (unsigned long)h.clone_flags;
    z->cgroupns = (h.flags & ZSETUP_CGROUPNS) != 0;
    z->idle_warmup = (h.flags & ZSETUP_IDLE_WARMUP) != 0;
    z->idle_keeper = (h.flags & ZSETUP_IDLE_KEEPER) != 0;
    if (h.inotify_instances && h.inotify_watches) {
        snprintf(z->inotify[0], sizeof(z->inotify[0]), "%u", h.inotify_instances);
        snprintf(z->inotify[1], sizeof(z->inotify[1]), "%u", h.inotify_watches);
    }
    if (h.flags & ZSETUP_TASK_UIDS) {
        if (h.uid_block < 1 || h.uid_block > MAX_UID_BLOCK)
            return bad(why, why_len, EPROTO, "a block of %u task uids, 1 to %d", h.uid_block,
                       MAX_UID_BLOCK);
        z->uid_block = h.uid_block;
    }
    if (h.spares < 1 || h.spares > ZYGOTE_MAX_SPARES)
        return bad(why, why_len, EPROTO, "%u spares, 1 to %d", h.spares, ZYGOTE_MAX_SPARES);
    z->spares = h.spares;
    if (h.n_ops > ZYGOTE_MAX_OPS)
        return bad(why, why_len, EPROTO, "%u setup steps, at most %d", h.n_ops, ZYGOTE_MAX_OPS);
    size_t off = sizeof(h);
    for (uint32_t i = 0; i < h.n_ops; i++) {
        struct zop_head oh;
        if (size - off < sizeof(oh))
            return bad(why, why_len, EPROTO, "a truncated setup");
        memcpy(&oh, blob + off, sizeof(oh));
        off += sizeof(oh);
        if (oh.path_len == 0 || oh.data_len == 0 || oh.path_len > size - off ||
            oh.data_len > size - off - oh.path_len)
            return bad(why, why_len, EPROTO, "a truncated setup step");
        struct op *op = &z->ops[z->n_ops++];
        op->kind = op_kind_of(oh.kind);
        op->flags = (unsigned long)oh.flags;
        op->path = blob + off;
        op->data = blob + off + oh.path_len;
        op->data_len = oh.data_len - 1;
        if (op->path[oh.path_len - 1] || op->data[op->data_len] || op->path[0] != '/')
            return bad(why, why_len, EPROTO, "a malformed setup step");
        off += oh.path_len + oh.data_len;
    }
    size_t filter_bytes = (size_t)h.filter_len * sizeof(struct sock_filter);
    if (h.filter_len > BPF_MAXINSNS || filter_bytes > size - off)
        return bad(why, why_len, EPROTO, "a truncated seccomp filter");
    if (h.filter_len) {
        /* Aligned copy: the blob offsets are not. */
        struct sock_filter *prog = malloc(filter_bytes);
        if (!prog)
            return bad(why, why_len, ENOMEM, "out of memory");
        memcpy(prog, blob + off, filter_bytes);
        z->filter.filter = prog;
        z->filter.len = (unsigned short)h.filter_len;
    }
    off += filter_bytes;
    if (h.python_len == 0 || h.python_len > size - off || blob[off + h.python_len - 1] ||
        blob[off] != '/')
        return bad(why, why_len, EPROTO, "a malformed python path");
    z->python = blob + off;
    return 0;
}

int zsetup_read(int fd, uint64_t size, char **ret_blob, struct zsetup *s, char *why,
                size_t why_len)
{
    memset(s, 0, sizeof(*s));
    *ret_blob = NULL;
    if (size < sizeof(struct zsetup_head) || size > ZYGOTE_SETUP_MAX)
        return bad(why, why_len, EPROTO, "a setup of %llu bytes", (unsigned long long)size);
    char *blob = malloc(size + 1);
    if (!blob)
        return bad(why, why_len, ENOMEM, "out of memory");
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, blob + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EPROTO;
            free(blob);
            return bad(why, why_len, e, "cannot read the setup");
        }
        got += (size_t)r;
    }
    blob[size] = '\0';
    if (parse(blob, size, s, why, why_len) != 0) {
        int e = errno;
        free((void *)s->filter.filter);
        s->filter.filter = NULL;
        free(blob);
        errno = e;
        return -1;
    }
    *ret_blob = blob;
    return 0;
}
