/* plan.c - the plan of a sandbox, built once in ci_sandbox_new(): the root
 * filesystem as a list of typed setup operations (bubblewrap style) that
 * init runs in order (child_run_op()), the environment built from nothing,
 * and every string they point to, owned by the sandbox. The child only
 * reads it: nothing is allocated after the clone. */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sandbox/sandbox_int.h"

#ifndef MS_NOSYMFOLLOW
#define MS_NOSYMFOLLOW 256
#endif

char *plan_str(struct ci_sandbox *sb, const char *fmt, ...)
{
    if (sb->n_strs == sb->cap_strs) {
        size_t cap = sb->cap_strs ? sb->cap_strs * 2 : 64;
        char **p = realloc(sb->strs, cap * sizeof(*p));
        if (!p)
            return NULL;
        sb->strs = p;
        sb->cap_strs = cap;
    }
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    int n = vasprintf(&s, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    sb->strs[sb->n_strs++] = s;
    return s;
}

struct op *plan_op(struct ci_sandbox *sb, enum op_kind kind, const char *rel,
                   const char *what)
{
    if (sb->n_ops == MAX_OPS)
        return NULL;
    char *path = plan_str(sb, NEWROOT "%s", rel);
    if (!path)
        return NULL;
    struct op *op = &sb->ops[sb->n_ops++];
    memset(op, 0, sizeof(*op));
    op->kind = kind;
    op->path = path;
    op->what = what;
    return op;
}

#define PLAN(expr)                                                                  \
    do {                                                                            \
        if (!(expr))                                                                \
            return CI_ERR_NOMEM;                                                    \
    } while (0)

static ci_status plan_tmpfs(struct ci_sandbox *sb, const char *rel, unsigned long flags,
                            const char *data, const char *what)
{
    struct op *op = plan_op(sb, OP_TMPFS, rel, what);
    PLAN(op);
    op->flags = flags;
    op->data = data;
    return CI_OK;
}

static ci_status plan_simple(struct ci_sandbox *sb, enum op_kind kind, const char *rel,
                             const char *src, const char *what)
{
    struct op *op = plan_op(sb, kind, rel, what);
    PLAN(op);
    op->src = src;
    return CI_OK;
}

static ci_status plan_file(struct ci_sandbox *sb, const char *rel, const char *content)
{
    struct op *op = plan_op(sb, OP_FILE, rel, NULL);
    PLAN(op);
    PLAN(op->what = plan_str(sb, "create %s", rel));
    op->data = content;
    op->data_len = strlen(content);
    return CI_OK;
}

/* Binds the host path rel read-only at the same place, if it exists. A
 * symlink is recreated as a symlink (e.g. /lib -> usr/lib on merged /usr). */
static ci_status plan_host_path(struct ci_sandbox *sb, const char *rel)
{
    struct stat st;
    if (lstat(rel, &st) != 0)
        return CI_OK; /* not on this host: nothing to bind */
    if (S_ISLNK(st.st_mode)) {
        char target[4096];
        ssize_t n = readlink(rel, target, sizeof(target) - 1);
        if (n <= 0)
            return CI_OK;
        target[n] = '\0';
        char *src = plan_str(sb, "%s", target);
        char *what = plan_str(sb, "create the symlink %s", rel);
        PLAN(src && what);
        return plan_simple(sb, OP_SYMLINK, rel, src, what);
    }
    if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
        return CI_OK;
    char *what = plan_str(sb, "bind-mount %s read-only", rel);
    PLAN(what);
    struct op *op = plan_op(sb, OP_BIND_RO, rel, what);
    PLAN(op);
    op->src = op->path + strlen(NEWROOT); /* == rel, owned by the plan */
    op->dir = S_ISDIR(st.st_mode);
    return CI_OK;
}

static const char passwd_text[] =
    "root:x:0:0:root:/root:/usr/sbin/nologin\n"
    "sandbox:x:1000:1000:sandbox:/workspace:/usr/sbin/nologin\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
static const char group_text[] = "root:x:0:\nsandbox:x:1000:\nnogroup:x:65534:\n";
static const char hosts_text[] = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n"
                                 "127.0.1.1\tsandbox\n";
static const char nsswitch_text[] = "passwd: files\ngroup: files\nhosts: files\n";

/* The root filesystem of a sandbox, in the order init builds it. */
ci_status plan_root(struct ci_sandbox *sb)
{
    const struct ci_config *cfg = sb->cfg;
    ci_status s;
    const char *root_opts = "mode=0755,size=16m,nr_inodes=4096";
    if ((s = plan_tmpfs(sb, "", MS_NOSUID | MS_NODEV, root_opts, "mount the root tmpfs")))
        return s;
    static const char *dirs[] = {"/etc", "/dev", "/proc", "/var", "/var/cache", "/workspace",
                                 "/tmp"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        char *what = plan_str(sb, "create %s", dirs[i]);
        PLAN(what);
        if ((s = plan_simple(sb, OP_DIR, dirs[i], NULL, what)))
            return s;
    }

    /* The runtime: /usr, and the top-level links of a merged /usr. */
    static const char *runtime[] = {"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64",
                                    "/libx32"};
    for (size_t i = 0; i < sizeof(runtime) / sizeof(runtime[0]); i++)
        if ((s = plan_host_path(sb, runtime[i])))
            return s;

    /* /etc: our own identity files, and what Python, matplotlib and
     * fontconfig read from the host (nothing secret). Debian reaches BLAS
     * through /etc/alternatives (libblas.so.3 is a link into it). */
    if ((s = plan_file(sb, "/etc/passwd", passwd_text)) ||
        (s = plan_file(sb, "/etc/group", group_text)) ||
        (s = plan_file(sb, "/etc/hosts", hosts_text)) ||
        (s = plan_file(sb, "/etc/hostname", "sandbox\n")) ||
        (s = plan_file(sb, "/etc/nsswitch.conf", nsswitch_text)))
        return s;
    static const char *etc[] = {"/etc/alternatives", "/etc/ld.so.cache", "/etc/localtime",
                                "/etc/matplotlibrc",
                                "/etc/fonts", "/etc/mime.types", "/var/cache/fontconfig"};
    for (size_t i = 0; i < sizeof(etc) / sizeof(etc[0]); i++)
        if ((s = plan_host_path(sb, etc[i])))
            return s;
    /* /etc/python3.X holds Debian's sitecustomize.py, which
     * /usr/lib/python3.X/sitecustomize.py links to. */
    DIR *d = opendir("/etc");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strncmp(e->d_name, "python3", 7) != 0)
                continue;
            char *rel = plan_str(sb, "/etc/%s", e->d_name);
            if (!rel || (s = plan_host_path(sb, rel))) {
                closedir(d);
                return rel ? s : CI_ERR_NOMEM;
            }
        }
        closedir(d);
    }

    /* /dev: the five harmless devices, links, and a private /dev/shm. */
    static const char *devs[] = {"null", "zero", "full", "random", "urandom"};
    for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); i++) {
        char *rel = plan_str(sb, "/dev/%s", devs[i]);
        char *what = plan_str(sb, "bind-mount /dev/%s", devs[i]);
        PLAN(rel && what);
        if ((s = plan_simple(sb, OP_BIND_DEV, rel, rel, what)))
            return s;
    }
    static const char *links[][2] = {{"/dev/fd", "/proc/self/fd"},
                                     {"/dev/stdin", "/proc/self/fd/0"},
                                     {"/dev/stdout", "/proc/self/fd/1"},
                                     {"/dev/stderr", "/proc/self/fd/2"}};
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++)
        if ((s = plan_simple(sb, OP_SYMLINK, links[i][0], links[i][1], "create a /dev link")))
            return s;
    char *shm = plan_str(sb, "mode=1777,size=%um,nr_inodes=1024", cfg->local.tmp_mb);
    PLAN(shm);
    if ((s = plan_tmpfs(sb, "/dev/shm", MS_NOSUID | MS_NODEV | MS_NOEXEC, shm,
                        "mount a tmpfs on /dev/shm")))
        return s;

    if (sb->with_proc && (s = plan_simple(sb, OP_PROC, "/proc", NULL, "mount /proc")))
        return s;

    /* The per-task filesystems: the only writable places. */
    char *ws = plan_str(sb, "mode=0755,uid=%d,gid=%d,size=%um,nr_inodes=%u", SANDBOX_ID,
                        SANDBOX_ID, cfg->local.workspace_mb, 4 * ARTIFACT_MAX_ENTRIES);
    char *tmp = plan_str(sb, "mode=1777,size=%um,nr_inodes=%u", cfg->local.tmp_mb,
                         4 * ARTIFACT_MAX_ENTRIES);
    PLAN(ws && tmp);
    if ((s = plan_tmpfs(sb, "/workspace", MS_NOSUID | MS_NODEV | MS_NOSYMFOLLOW, ws,
                        "mount a tmpfs on /workspace")) ||
        (s = plan_tmpfs(sb, "/tmp", MS_NOSUID | MS_NODEV, tmp, "mount a tmpfs on /tmp")))
        return s;
    return CI_OK;
}

/* The environment, built from nothing. `home`, `tmp` are the workspace and
 * the private temp dir as the task sees them. */
ci_status plan_env(struct ci_sandbox *sb, char **envp, const char *home, const char *tmp)
{
    size_t n = 0;
    envp[n++] = plan_str(sb, "PATH=/usr/bin:/bin");
    envp[n++] = plan_str(sb, "HOME=%s", home);
    envp[n++] = plan_str(sb, "LANG=C.UTF-8");
    envp[n++] = plan_str(sb, "TMPDIR=%s", tmp);
    /* Not in the workspace: it would be mistaken for the code's output. */
    envp[n++] = plan_str(sb, "MPLCONFIGDIR=%s/matplotlib", tmp);
    envp[n++] = plan_str(sb, "XDG_CACHE_HOME=%s/.cache", tmp); /* fontconfig's cache */
    envp[n++] = plan_str(sb, "MPLBACKEND=Agg");
    envp[n++] = plan_str(sb, "OPENBLAS_NUM_THREADS=1");
    envp[n++] = plan_str(sb, "OMP_NUM_THREADS=1");
    envp[n++] = plan_str(sb, "MKL_NUM_THREADS=1");
    envp[n++] = plan_str(sb, "NUMEXPR_MAX_THREADS=1");
    envp[n++] = plan_str(sb, "PYTHONDONTWRITEBYTECODE=1");
    /* PYTHONHASHSEED stays unset: hash() is randomized per process. */
    envp[n] = NULL;
    for (size_t i = 0; i < n; i++)
        PLAN(envp[i]);
    return CI_OK;
}

/* matplotlib builds a list of the system's fonts on its first import into
 * MPLCONFIGDIR (~0.15 s, with an fc-list subprocess), and every task has a
 * fresh /tmp. Build the list once, in a sandbox, and have init write it into
 * each task's /tmp/matplotlib. Best effort: without it matplotlib builds it. */
void plan_font_cache(struct ci_sandbox *sb)
{
    static const char code[] =
        "import os, sys, matplotlib, matplotlib.font_manager as fm\n"
        "name = 'fontlist-v%s.json' % fm.FontManager.__version__\n"
        "path = os.path.join(matplotlib.get_cachedir(), name)\n"
        "sys.stdout.write(name + '\\n' + open(path).read())\n";
    struct ci_job job = {.code = code, .code_len = sizeof(code) - 1,
                                 .timeout_ms = 30000, .memory_mb = 1024};
    struct ci_sandbox_run *run;
    struct ci_sandbox_result r;
    if (ci_sandbox_start(sb, &job, &run, NULL) != CI_OK)
        return;
    ci_status s = ci_sandbox_wait(run, &r);
    ci_sandbox_run_free(run);
    if (s)
        return;
    const char *out = r.outcome.out;
    const char *nl = out ? memchr(out, '\n', r.outcome.out_len) : NULL;
    char name[64];
    bool ok = r.end == CI_SANDBOX_EXITED && r.has_status && r.status == 0 && nl &&
              r.outcome.out_total == r.outcome.out_len && r.outcome.out_len < 512 * 1024 &&
              (size_t)(nl - out) < sizeof(name) && nl[1] == '{';
    if (ok) {
        memcpy(name, out, (size_t)(nl - out));
        name[nl - out] = '\0';
        unsigned version;
        char tail[8];
        ok = sscanf(name, "fontlist-v%u.%5s", &version, tail) == 2 && strcmp(tail, "json") == 0 &&
             plain_name(name);
    }
    if (ok) {
        char *rel = plan_str(sb, "/tmp/matplotlib/%s", name);
        char *content = plan_str(sb, "%s", nl + 1);
        struct op *dir = rel && content && sb->n_ops + 2 <= MAX_OPS
                             ? plan_op(sb, OP_DIR, "/tmp/matplotlib", "create /tmp/matplotlib")
                             : NULL;
        struct op *file = dir ? plan_op(sb, OP_FILE, rel, "write matplotlib's font list") : NULL;
        if (file) {
            file->data = content;
            file->data_len = strlen(content);
        } else if (dir) {
            sb->n_ops--; /* all or nothing */
        }
    }
    ci_sandbox_result_release(&r);
}
