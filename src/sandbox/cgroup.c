/* cgroup.c - per-task cgroups (v2, or v1 as root). See cgroup.h. */
#include "sandbox/cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"

#define PERIOD_US 100000       /* cpu.max period: 100 ms, the kernel's default */
#define EMPTY_WAIT_MS 2000     /* longest wait for a killed cgroup to empty */
#define PARENT_PREFIX "ci-worker-"

static const char *const controller_names[CI_CG_COUNT] = {"memory", "pids", "cpu"};

struct ci_cgroup_root {
    enum ci_cgroup_version version;
    char parent[CI_CG_COUNT][CI_CGROUP_PATH_MAX]; /* P, per hierarchy */
    bool own_dir[CI_CG_COUNT]; /* false: the same directory as an earlier controller's */
    atomic_uint next_task;
};

struct ci_cgroup {
    struct ci_cgroup_root *root;
    char dir[CI_CG_COUNT][CI_CGROUP_PATH_MAX];
    bool made[CI_CG_COUNT]; /* created by us (and to be removed) */
};

/* ---------------------------------------------------------------------- */
/* Files                                                                    */
/* ---------------------------------------------------------------------- */

static int join(char *out, size_t size, const char *dir, const char *name)
{
    int n = snprintf(out, size, "%s/%s", dir, name);
    return n < 0 || (size_t)n >= size ? ENAMETOOLONG : 0;
}

/* Writes text to dir/name in one write(); returns 0 or an errno (cgroup
 * files report a refused value as the write's error). */
static int cg_write(const char *dir, const char *name, const char *text)
{
    char path[CI_CGROUP_PATH_MAX + 64];
    int e = join(path, sizeof(path), dir, name);
    if (e)
        return e;
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    size_t len = strlen(text);
    ssize_t w;
    do
        w = write(fd, text, len);
    while (w < 0 && errno == EINTR);
    e = w < 0 ? errno : (size_t)w != len ? EIO : 0;
    close(fd);
    return e;
}

/* Reads dir/name (at most size - 1 bytes) as a string; returns 0 or an errno. */
static int cg_read(const char *dir, const char *name, char *buf, size_t size)
{
    char path[CI_CGROUP_PATH_MAX + 64];
    int e = join(path, sizeof(path), dir, name);
    if (e)
        return e;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    size_t got = 0;
    while (got + 1 < size) {
        ssize_t n = read(fd, buf + got, size - 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            e = errno;
            close(fd);
            return e;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    buf[got] = '\0';
    close(fd);
    return 0;
}

/* Is tok one of the words of list (separated by spaces, commas or newlines)? */
static bool has_word(const char *list, const char *tok)
{
    size_t len = strlen(tok);
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, " ,\n");
        if (n == len && strncmp(p, tok, len) == 0)
            return true;
        p += n;
        if (*p)
            p++;
    }
    return false;
}

/* The number after "key " on its own line of a flat-keyed file
 * ("oom_kill 3" in memory.events; not "oom_kill_disable 0"). */
static bool keyed_value(const char *text, const char *key, uint64_t *ret)
{
    size_t len = strlen(key);
    for (const char *line = text; *line;) {
        if (strncmp(line, key, len) == 0 && line[len] == ' ') {
            char *end = NULL;
            errno = 0;
            unsigned long long v = strtoull(line + len + 1, &end, 10);
            if (errno || end == line + len + 1)
                return false;
            *ret = v;
            return true;
        }
        const char *nl = strchr(line, '\n');
        if (!nl)
            break;
        line = nl + 1;
    }
    return false;
}

static bool parse_u64(const char *text, uint64_t *ret)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || end == text || (*end && *end != '\n'))
        return false;
    *ret = v;
    return true;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* ---------------------------------------------------------------------- */
/* Finding the hierarchies                                                  */
/* ---------------------------------------------------------------------- */

/* Undoes mountinfo's octal escapes (\040 for a space) in place. */
static void unescape(char *s)
{
    char *w = s;
    for (char *r = s; *r;) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
            r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
            r += 4;
        } else {
            *w++ = *r++;
        }
    }
    *w = '\0';
}

/* The directory of cgroup `path` (as /proc/self/cgroup names it) under a
 * mount of the hierarchy at `point` whose root is `root`. */
static bool mount_dir(const char *point, const char *root, const char *path, char *out,
                      size_t size)
{
    size_t rlen = strcmp(root, "/") == 0 ? 0 : strlen(root);
    if (rlen && (strncmp(path, root, rlen) != 0 || (path[rlen] != '/' && path[rlen] != '\0')))
        return false; /* this mount does not show our cgroup */
    const char *rest = path + rlen;
    if (strcmp(rest, "/") == 0)
        rest = "";
    int n = snprintf(out, size, "%s%s", point, rest);
    return n > 0 && (size_t)n < size;
}

/* The cgroup path of this process in the hierarchy that /proc/self/cgroup
 * lists with `controller` (NULL: the v2 line "0::"). */
static bool own_path(const char *proc_cgroup, const char *controller, char *out, size_t size)
{
    for (const char *line = proc_cgroup; *line;) {
        const char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        const char *c1 = memchr(line, ':', len);
        const char *c2 = c1 ? memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - line)) : NULL;
        if (c2) {
            char list[256];
            size_t llen = (size_t)(c2 - c1 - 1);
            bool match;
            if (!controller) {
                match = llen == 0 && strncmp(line, "0:", 2) == 0;
            } else {
                match = llen < sizeof(list);
                if (match) {
                    memcpy(list, c1 + 1, llen);
                    list[llen] = '\0';
                    match = has_word(list, controller);
                }
            }
            size_t plen = len - (size_t)(c2 + 1 - line);
            if (match && plen > 0 && plen < size) {
                memcpy(out, c2 + 1, plen);
                out[plen] = '\0';
                return out[0] == '/';
            }
        }
        if (!nl)
            break;
        line = nl + 1;
    }
    return false;
}

/* The next line of /proc/self/mountinfo ("id parent major:minor root
 * mountpoint options... - fstype source superoptions"): *buf is cut at
 * " - ", so that it holds the fields before it. false at the end. */
struct mount_line {
    char fstype[32];
    char super[512];
};

static bool mountinfo_next(FILE *f, char **buf, size_t *cap, struct mount_line *m)
{
    while (getline(buf, cap, f) > 0) {
        char *sep = strstr(*buf, " - ");
        if (!sep)
            continue;
        *sep = '\0';
        char source[256];
        if (sscanf(sep + 3, "%31s %255s %511s", m->fstype, source, m->super) == 3)
            return true;
    }
    return false;
}

bool ci_cgroup_favor_dynmods(void)
{
    /* Before 6.0 (no such option) the rwsem was always in that mode. */
    char features[512] = "";
    int fd = open("/sys/kernel/cgroup/features", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = read(fd, features, sizeof(features) - 1);
        features[n > 0 ? n : 0] = '\0';
        close(fd);
    }
    if (!has_word(features, "favordynmods"))
        return true;
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return false;
    char *line = NULL;
    size_t cap = 0;
    struct mount_line m;
    bool on = false;
    while (!on && mountinfo_next(f, &line, &cap, &m))
        on = (strcmp(m.fstype, "cgroup2") == 0 || strcmp(m.fstype, "cgroup") == 0) &&
             has_word(m.super, "favordynmods");
    free(line);
    fclose(f);
    return on;
}

/* Finds the directory of our cgroup for `controller` (NULL: cgroup2) from
 * the mount table. */
static bool find_dir(const char *proc_cgroup, const char *controller, char *out, size_t size)
{
    char path[CI_CGROUP_PATH_MAX];
    if (!own_path(proc_cgroup, controller, path, sizeof(path)))
        return false;
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return false;
    char *line = NULL;
    size_t cap = 0;
    struct mount_line m;
    bool found = false;
    while (!found && mountinfo_next(f, &line, &cap, &m)) {
        bool want = controller ? strcmp(m.fstype, "cgroup") == 0 && has_word(m.super, controller)
                               : strcmp(m.fstype, "cgroup2") == 0;
        if (!want)
            continue;
        char root[CI_CGROUP_PATH_MAX], point[CI_CGROUP_PATH_MAX];
        if (sscanf(line, "%*s %*s %*s %511s %511s", root, point) != 2)
            continue;
        unescape(root);
        unescape(point);
        found = mount_dir(point, root, path, out, size);
    }
    free(line);
    fclose(f);
    return found;
}

ci_status ci_cgroup_find(struct ci_cgroup_places *ret, struct ci_error *err)
{
    char proc_cgroup[8192];
    int e = cg_read("/proc/self", "cgroup", proc_cgroup, sizeof(proc_cgroup));
    if (e)
        return ci_error_errno(err, CI_ERR_UNSUPPORTED, e, "cannot read /proc/self/cgroup");
    struct ci_cgroup_places p;
    memset(&p, 0, sizeof(p));

    char v2_why[256] = "no cgroup2 hierarchy is mounted";
    if (find_dir(proc_cgroup, NULL, p.dir[0], sizeof(p.dir[0]))) {
        char have[256];
        e = cg_read(p.dir[0], "cgroup.controllers", have, sizeof(have));
        bool all = !e;
        for (int i = 0; i < CI_CG_COUNT && all; i++)
            all = has_word(have, controller_names[i]);
        if (all) {
            p.version = CI_CGROUP_V2;
            for (int i = 1; i < CI_CG_COUNT; i++)
                memcpy(p.dir[i], p.dir[0], sizeof(p.dir[0]));
            *ret = p;
            return CI_OK;
        }
        have[strcspn(have, "\n")] = '\0';
        snprintf(v2_why, sizeof(v2_why), "cgroup2 at %.120s offers only '%.60s'", p.dir[0],
                 e ? "?" : have);
    }
    for (int i = 0; i < CI_CG_COUNT; i++) {
        if (!find_dir(proc_cgroup, controller_names[i], p.dir[i], sizeof(p.dir[i])))
            return ci_error_set(err, CI_ERR_UNSUPPORTED,
                                "no cgroup hierarchy with memory, pids and cpu: %s, and no "
                                "cgroup v1 %s hierarchy is mounted", v2_why,
                                controller_names[i]);
    }
    p.version = CI_CGROUP_V1;
    *ret = p;
    return CI_OK;
}

/* ---------------------------------------------------------------------- */
/* The root                                                                 */
/* ---------------------------------------------------------------------- */

/* Removes the empty child cgroups of dir, then dir. */
static void remove_cgroup_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_type != DT_DIR || e->d_name[0] == '.')
                continue;
            char sub[CI_CGROUP_PATH_MAX + 256];
            if (!join(sub, sizeof(sub), dir, e->d_name))
                rmdir(sub); /* a task cgroup: no grandchildren */
        }
        closedir(d);
    }
    rmdir(dir);
}

/* Parents (and -self leaves) named after a worker whose pid is gone. A
 * cgroup that still holds processes refuses rmdir and stays: nothing is
 * killed on a guess. */
static void remove_stale(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_type != DT_DIR || strncmp(e->d_name, PARENT_PREFIX, strlen(PARENT_PREFIX)))
            continue;
        const char *digits = e->d_name + strlen(PARENT_PREFIX);
        char *end = NULL;
        long pid = strtol(digits, &end, 10);
        if (end == digits || (*end != '\0' && *end != '-') || pid <= 0 || pid == getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue; /* alive (or not ours to judge) */
        char sub[CI_CGROUP_PATH_MAX + 256];
        if (!join(sub, sizeof(sub), dir, e->d_name))
            remove_cgroup_tree(sub);
    }
    closedir(d);
}

static const char enable_all[] = "+memory +pids +cpu";

static bool subtree_has_all(const char *dir)
{
    char have[256];
    if (cg_read(dir, "cgroup.subtree_control", have, sizeof(have)))
        return false;
    for (int i = 0; i < CI_CG_COUNT; i++)
        if (!has_word(have, controller_names[i]))
            return false;
    return true;
}

/* v2: memory, pids and cpu enabled for X's children. */
static ci_status enable_in_own(const char *x, struct ci_error *err)
{
    if (subtree_has_all(x))
        return CI_OK;
    int e = cg_write(x, "cgroup.subtree_control", enable_all);
    if (e == EBUSY) {
        /* X holds processes (us): move into a leaf of our own, then retry. */
        char leaf[CI_CGROUP_PATH_MAX];
        int n = snprintf(leaf, sizeof(leaf), "%s/" PARENT_PREFIX "%d-self", x, (int)getpid());
        if (n < 0 || (size_t)n >= sizeof(leaf))
            return ci_error_set(err, CI_ERR_UNSUPPORTED, "the cgroup path %s is too long", x);
        if (mkdir(leaf, 0755) != 0 && errno != EEXIST)
            return ci_error_errno(err, CI_ERR_UNSUPPORTED, errno, "mkdir %s", leaf);
        if ((e = cg_write(leaf, "cgroup.procs", "0")) != 0) {
            rmdir(leaf);
            return ci_error_errno(err, CI_ERR_UNSUPPORTED, e,
                                  "cannot move the worker into %s (needed to enable "
                                  "controllers in %s)", leaf, x);
        }
        e = cg_write(x, "cgroup.subtree_control", enable_all);
    }
    if (e)
        return ci_error_errno(err, CI_ERR_UNSUPPORTED, e,
                              "cannot enable memory, pids and cpu in %s/cgroup.subtree_control%s",
                              x, e == EBUSY ? " (other processes share the worker's cgroup)" : "");
    return CI_OK;
}

ci_status ci_cgroup_root_new(const struct ci_cgroup_places *places,
                             struct ci_cgroup_root **ret, struct ci_error *err)
{
    static atomic_uint next_root;
    if (places->version != CI_CGROUP_V1 && places->version != CI_CGROUP_V2)
        return ci_error_set(err, CI_ERR_UNSUPPORTED, "no cgroup hierarchy was found");
    struct ci_cgroup_root *root = calloc(1, sizeof(*root));
    if (!root)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    root->version = places->version;
    atomic_init(&root->next_task, 1);
    unsigned n_root = atomic_fetch_add(&next_root, 1) + 1;
    int n_dirs = places->version == CI_CGROUP_V2 ? 1 : CI_CG_COUNT;
    ci_status s = CI_OK;
    for (int i = 0; i < n_dirs && !s; i++) {
        const char *x = places->dir[i];
        root->own_dir[i] = true;
        for (int j = 0; j < i; j++)
            if (strcmp(places->dir[j], x) == 0)
                root->own_dir[i] = false; /* co-mounted with an earlier controller */
        int n = snprintf(root->parent[i], sizeof(root->parent[i]), "%s/" PARENT_PREFIX "%d-%u",
                         x, (int)getpid(), n_root);
        if (n < 0 || (size_t)n >= sizeof(root->parent[i])) {
            s = ci_error_set(err, CI_ERR_UNSUPPORTED, "the cgroup path %s is too long", x);
            break;
        }
        if (!root->own_dir[i])
            continue;
        remove_stale(x);
        if (places->version == CI_CGROUP_V2 && (s = enable_in_own(x, err)))
            break;
        if (mkdir(root->parent[i], 0755) != 0) {
            root->own_dir[i] = false; /* not ours to remove */
            s = ci_error_errno(err, CI_ERR_UNSUPPORTED, errno, "mkdir %s", root->parent[i]);
            break;
        }
        if (places->version == CI_CGROUP_V2) {
            int e = cg_write(root->parent[i], "cgroup.subtree_control", enable_all);
            if (e)
                s = ci_error_errno(err, CI_ERR_UNSUPPORTED, e,
                                   "cannot enable memory, pids and cpu in "
                                   "%s/cgroup.subtree_control", root->parent[i]);
        }
    }
    if (places->version == CI_CGROUP_V2)
        for (int i = 1; i < CI_CG_COUNT; i++)
            memcpy(root->parent[i], root->parent[0], sizeof(root->parent[0]));
    if (s) {
        ci_cgroup_root_free(root);
        return s;
    }
    *ret = root;
    return CI_OK;
}

void ci_cgroup_root_free(struct ci_cgroup_root *root)
{
    if (!root)
        return;
    for (int i = 0; i < CI_CG_COUNT; i++)
        if (root->own_dir[i])
            remove_cgroup_tree(root->parent[i]);
    free(root);
}

enum ci_cgroup_version ci_cgroup_root_version(const struct ci_cgroup_root *root)
{
    return root ? root->version : CI_CGROUP_NONE;
}

const char *ci_cgroup_root_dir(const struct ci_cgroup_root *root)
{
    return root->parent[CI_CG_MEMORY];
}

/* ---------------------------------------------------------------------- */
/* Task cgroups                                                             */
/* ---------------------------------------------------------------------- */

/* Writes one limit; a file the kernel does not offer is fine when optional
 * (memory.swap.max without swap accounting, memsw without swapaccount=1). */
static ci_status set_limit(const char *dir, const char *name, const char *value, bool optional,
                           struct ci_error *err)
{
    int e = cg_write(dir, name, value);
    if (!e || (optional && e == ENOENT))
        return CI_OK;
    return ci_error_errno(err, CI_ERR_SYS, e, "cannot set %s/%s to %s", dir, name, value);
}

static ci_status write_limits(struct ci_cgroup *cg, const struct ci_cgroup_limits *lim,
                              struct ci_error *err)
{
    char mem[32], pids[32], quota[32], cpu_max[48];
    snprintf(mem, sizeof(mem), "%llu", (unsigned long long)lim->memory_bytes);
    snprintf(pids, sizeof(pids), "%u", lim->pids);
    if (lim->cpus) {
        snprintf(quota, sizeof(quota), "%llu", (unsigned long long)lim->cpus * PERIOD_US);
        snprintf(cpu_max, sizeof(cpu_max), "%s %d", quota, PERIOD_US);
    } else { /* no CPU limit */
        snprintf(quota, sizeof(quota), "-1");
        snprintf(cpu_max, sizeof(cpu_max), "max %d", PERIOD_US);
    }
    const char *m = cg->dir[CI_CG_MEMORY], *p = cg->dir[CI_CG_PIDS], *c = cg->dir[CI_CG_CPU];
    ci_status s;
    if (cg->root->version == CI_CGROUP_V2) {
        if ((s = set_limit(m, "memory.max", mem, false, err)) ||
            (s = set_limit(m, "memory.swap.max", "0", true, err)) ||
            (s = set_limit(p, "pids.max", pids, false, err)) ||
            (s = set_limit(c, "cpu.max", cpu_max, false, err)))
            return s;
        return CI_OK;
    }
    /* v1: memsw (memory + swap) may not be below the memory limit: set after. */
    if ((s = set_limit(m, "memory.limit_in_bytes", mem, false, err)) ||
        (s = set_limit(m, "memory.memsw.limit_in_bytes", mem, true, err)) ||
        (s = set_limit(p, "pids.max", pids, false, err)) ||
        (s = set_limit(c, "cpu.cfs_period_us", "100000", false, err)) ||
        (s = set_limit(c, "cpu.cfs_quota_us", quota, false, err)))
        return s;
    return CI_OK;
}

ci_status ci_cgroup_new(struct ci_cgroup_root *root, const struct ci_cgroup_limits *lim,
                        struct ci_cgroup **ret, struct ci_error *err)
{
    struct ci_cgroup *cg = calloc(1, sizeof(*cg));
    if (!cg)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    cg->root = root;
    unsigned k = atomic_fetch_add(&root->next_task, 1);
    ci_status s = CI_OK;
    for (int i = 0; i < CI_CG_COUNT && !s; i++) {
        int n = snprintf(cg->dir[i], sizeof(cg->dir[i]), "%s/task-%u", root->parent[i], k);
        if (n < 0 || (size_t)n >= sizeof(cg->dir[i])) {
            s = ci_error_set(err, CI_ERR_SYS, "the cgroup path %s is too long", root->parent[i]);
            break;
        }
        bool shared = false;
        for (int j = 0; j < i; j++)
            shared = shared || strcmp(cg->dir[j], cg->dir[i]) == 0;
        if (shared)
            continue;
        if (mkdir(cg->dir[i], 0755) != 0)
            s = ci_error_errno(err, CI_ERR_SYS, errno, "cannot create the task's cgroup %s",
                               cg->dir[i]);
        else
            cg->made[i] = true;
    }
    if (!s)
        s = write_limits(cg, lim, err);
    if (s) {
        ci_cgroup_free(cg);
        return s;
    }
    *ret = cg;
    return CI_OK;
}

ci_status ci_cgroup_attach(struct ci_cgroup *cg, pid_t pid, struct ci_error *err)
{
    char text[24];
    snprintf(text, sizeof(text), "%d", (int)pid);
    for (int i = 0; i < CI_CG_COUNT; i++) {
        if (!cg->made[i])
            continue;
        int e = cg_write(cg->dir[i], "cgroup.procs", text);
        if (e)
            return ci_error_errno(err, CI_ERR_SYS, e, "cannot move the sandbox into %s",
                                  cg->dir[i]);
    }
    return CI_OK;
}

void ci_cgroup_stats(const struct ci_cgroup *cg, struct ci_cgroup_stats *ret)
{
    struct ci_cgroup_stats st = {0};
    const char *m = cg->dir[CI_CG_MEMORY];
    char buf[2048];
    bool v2 = cg->root->version == CI_CGROUP_V2;
    if (!cg_read(m, v2 ? "memory.events" : "memory.oom_control", buf, sizeof(buf)))
        keyed_value(buf, "oom_kill", &st.oom_kills);
    if (!cg_read(m, v2 ? "memory.peak" : "memory.max_usage_in_bytes", buf, sizeof(buf)))
        st.has_peak = parse_u64(buf, &st.peak_bytes);
    if (v2) {
        if (!cg_read(m, "cpu.stat", buf, sizeof(buf)))
            st.has_cpu = keyed_value(buf, "usage_usec", &st.cpu_usec);
    } else if (cg->made[CI_CG_CPU] &&
               !cg_read(cg->dir[CI_CG_CPU], "cpuacct.usage", buf, sizeof(buf)) &&
               parse_u64(buf, &st.cpu_usec)) {
        st.has_cpu = true;
        st.cpu_usec /= 1000; /* nanoseconds */
    }
    *ret = st;
}

/* SIGKILL to every pid listed in dir/cgroup.procs (pids of our namespace;
 * 0 stands for a process we cannot see and is never signalled). */
static void kill_listed(const char *dir)
{
    char buf[16384];
    if (cg_read(dir, "cgroup.procs", buf, sizeof(buf)))
        return;
    for (char *p = buf; *p;) {
        char *end = NULL;
        long pid = strtol(p, &end, 10);
        if (end == p)
            break;
        if (pid > 0)
            kill((pid_t)pid, SIGKILL);
        p = end;
        while (*p == '\n')
            p++;
    }
}

/* Kills, waits until empty and removes one directory of a task cgroup. */
static void kill_and_remove(const char *dir, bool v2)
{
    if (!v2 || cg_write(dir, "cgroup.kill", "1") != 0)
        kill_listed(dir);
    for (long waited = 0; waited < EMPTY_WAIT_MS; waited += 2) {
        if (rmdir(dir) == 0 || errno != EBUSY)
            return;
        if (waited % 100 == 98) /* a process forked during the kill */
            kill_listed(dir);
        sleep_ms(2);
    }
}

void ci_cgroup_free(struct ci_cgroup *cg)
{
    if (!cg)
        return;
    for (int i = 0; i < CI_CG_COUNT; i++)
        if (cg->made[i])
            kill_and_remove(cg->dir[i], cg->root->version == CI_CGROUP_V2);
    free(cg);
}
