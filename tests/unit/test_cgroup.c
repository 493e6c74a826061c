/* test_cgroup.c - the cgroup module: its parsers and the v2 files on a fake
 * tree (this machine may have no usable v2: nothing else tests that code),
 * and, run on its own (unit.test_cgroup.t_real), a real task cgroup when
 * this machine grants one (else that case says skipped). cgroup.c is
 * included to reach its static helpers. */
#include "../../src/sandbox/cgroup.c"

#include <sys/mman.h>
#include <sys/wait.h>

#include "testutil.h"

static char tmpdir[64];

static void t_words(void)
{
    CHECK(has_word("cpuset cpu io memory pids", "cpu"));
    CHECK(has_word("cpuset cpu io memory pids\n", "pids"));
    CHECK(!has_word("cpuset cpuacct", "cpu"));
    CHECK(has_word("rw,cpu,cpuacct", "cpuacct"));
    CHECK(!has_word("", "memory"));
    uint64_t v = 7;
    CHECK(keyed_value("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n", "oom_kill", &v) && v == 3);
    CHECK(keyed_value("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n", "oom_kill",
                      &v) && v == 1);
    CHECK(!keyed_value("oom_kill_disable 0\n", "oom_kill", &v));
    CHECK(parse_u64("209715200\n", &v) && v == 209715200);
    CHECK(!parse_u64("max\n", &v));
    char s[] = "/sys/fs/cgroup/a\\040b";
    unescape(s);
    CHECK_STR(s, "/sys/fs/cgroup/a b");
}

static void t_paths(void)
{
    static const char hybrid[] = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/x\n"
                                 "1:cpu,cpuacct:/a\n0::/\n";
    static const char pure[] = "0::/kubepods/pod1/c1\n";
    char p[256];
    CHECK(own_path(hybrid, "memory", p, sizeof(p)));
    CHECK_STR(p, "/process_api/x");
    CHECK(own_path(hybrid, "cpuacct", p, sizeof(p)));
    CHECK_STR(p, "/a");
    CHECK(own_path(hybrid, NULL, p, sizeof(p)));
    CHECK_STR(p, "/");
    CHECK(!own_path(pure, "memory", p, sizeof(p)));
    CHECK(own_path(pure, NULL, p, sizeof(p)));
    CHECK_STR(p, "/kubepods/pod1/c1");

    char d[256];
    CHECK(mount_dir("/sys/fs/cgroup", "/", "/kubepods/pod1/c1", d, sizeof(d)));
    CHECK_STR(d, "/sys/fs/cgroup/kubepods/pod1/c1");
    CHECK(mount_dir("/sys/fs/cgroup", "/", "/", d, sizeof(d)));
    CHECK_STR(d, "/sys/fs/cgroup");
    /* A container's mount of its own subtree. */
    CHECK(mount_dir("/sys/fs/cgroup", "/kubepods/pod1", "/kubepods/pod1/c1", d, sizeof(d)));
    CHECK_STR(d, "/sys/fs/cgroup/c1");
    CHECK(!mount_dir("/sys/fs/cgroup", "/kubepods/pod1", "/kubepods/pod10", d, sizeof(d)));
    CHECK(!mount_dir("/sys/fs/cgroup", "/other", "/kubepods", d, sizeof(d)));
}

static void touch(const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "we");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void slurp(const char *dir, const char *name, char *buf, size_t size)
{
    buf[0] = '\0';
    cg_read(dir, name, buf, size);
}

/* A v2 task cgroup on a fake tree (plain files stand for the kernel's). */
static void t_fake_v2(void)
{
    char task[256];
    snprintf(task, sizeof(task), "%s/task-1", tmpdir);
    REQUIRE(mkdir(task, 0755) == 0);
    touch(task, "memory.max", ""); /* a plain file is not truncated by a write */
    touch(task, "pids.max", "");
    touch(task, "cpu.max", "");
    /* no memory.swap.max: a kernel without swap accounting */
    struct ci_cgroup_root root = {.version = CI_CGROUP_V2};
    struct ci_cgroup cg = {.root = &root};
    for (int i = 0; i < CI_CG_COUNT; i++)
        snprintf(cg.dir[i], sizeof(cg.dir[i]), "%s", task);
    struct ci_cgroup_limits lim = {.memory_bytes = 256u << 20, .pids = 32, .cpus = 2};
    struct ci_error err = {{0}};
    CHECK(write_limits(&cg, &lim, &err) == CI_OK);
    char buf[256];
    slurp(task, "memory.max", buf, sizeof(buf));
    CHECK_STR(buf, "268435456");
    slurp(task, "pids.max", buf, sizeof(buf));
    CHECK_STR(buf, "32");
    slurp(task, "cpu.max", buf, sizeof(buf));
    CHECK_STR(buf, "200000 100000");
    /* A file that must exist and does not: the error names it. */
    char task2[256];
    snprintf(task2, sizeof(task2), "%s/task-2", tmpdir);
    REQUIRE(mkdir(task2, 0755) == 0);
    struct ci_cgroup cg2 = {.root = &root};
    for (int i = 0; i < CI_CG_COUNT; i++)
        snprintf(cg2.dir[i], sizeof(cg2.dir[i]), "%s", task2);
    CHECK(write_limits(&cg2, &lim, &err) == CI_ERR_SYS);
    CHECK_CONTAINS(err.msg, "task-2/memory.max");

    touch(task, "memory.events", "low 0\nhigh 0\nmax 40\noom 1\noom_kill 1\noom_group_kill 0\n");
    touch(task, "memory.peak", "268431360\n");
    struct ci_cgroup_stats st;
    ci_cgroup_stats(&cg, &st);
    CHECK(st.oom_kills == 1);
    CHECK(st.has_peak && st.peak_bytes == 268431360);
    /* A kernel before 5.19: no memory.peak, so no peak. */
    touch(task2, "memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n");
    ci_cgroup_stats(&cg2, &st);
    CHECK(st.oom_kills == 0 && !st.has_peak);
}

/* Stale parents: a dead worker's go, a live one's and strangers stay. */
static void t_stale(void)
{
    char x[600], path[800];
    snprintf(x, sizeof(x), "%s/x", tmpdir);
    REQUIRE(mkdir(x, 0755) == 0);
    pid_t dead = fork(); /* a pid that surely is gone */
    if (dead == 0)
        _exit(0);
    REQUIRE(dead > 0);
    waitpid(dead, NULL, 0);
    snprintf(path, sizeof(path), "%s/ci-worker-%d-1", x, (int)dead);
    CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof(path), "%s/ci-worker-%d-1/task-3", x, (int)dead);
    CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof(path), "%s/ci-worker-%d-self", x, (int)dead);
    CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof(path), "%s/ci-worker-%d-1", x, (int)getppid());
    CHECK(mkdir(path, 0755) == 0);
    snprintf(path, sizeof(path), "%s/ci-workers", x);
    CHECK(mkdir(path, 0755) == 0);
    remove_stale(x);
    struct stat st;
    snprintf(path, sizeof(path), "%s/ci-worker-%d-1", x, (int)dead);
    CHECK(stat(path, &st) != 0);
    snprintf(path, sizeof(path), "%s/ci-worker-%d-self", x, (int)dead);
    CHECK(stat(path, &st) != 0);
    snprintf(path, sizeof(path), "%s/ci-worker-%d-1", x, (int)getppid());
    CHECK(stat(path, &st) == 0);
    rmdir(path);
    snprintf(path, sizeof(path), "%s/ci-workers", x);
    CHECK(stat(path, &st) == 0);
    rmdir(path);
    rmdir(x);
}

static bool real_available(struct ci_cgroup_places *pl, char *why, size_t size)
{
    struct ci_error err = {{0}};
    if (ci_cgroup_find(pl, &err) != CI_OK) {
        snprintf(why, size, "%s", err.msg);
        return false;
    }
    struct ci_cgroup_root *root = NULL;
    if (ci_cgroup_root_new(pl, &root, &err) != CI_OK) {
        snprintf(why, size, "%s", err.msg);
        return false;
    }
    ci_cgroup_root_free(root);
    return true;
}

/* A real task cgroup: a child that outgrows 32 MiB is OOM-killed, the
 * counters say so, and nothing is left afterwards. */
static void t_real(void)
{
    struct ci_cgroup_places pl;
    char why[512];
    if (!real_available(&pl, why, sizeof(why)))
        SKIP("no real task cgroup on this machine (%s)", why);
    struct ci_error err = {{0}};
    struct ci_cgroup_root *root = NULL;
    REQUIRE(ci_cgroup_root_new(&pl, &root, &err) == CI_OK);
    struct ci_cgroup *cg = NULL;
    struct ci_cgroup_limits lim = {.memory_bytes = 32u << 20, .pids = 8, .cpus = 1};
    ci_status s = ci_cgroup_new(root, &lim, &cg, &err);
    if (s)
        fprintf(stderr, "%s\n", err.msg);
    REQUIRE(s == CI_OK);
    int go[2];
    REQUIRE(pipe2(go, O_CLOEXEC) == 0);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        char c;
        close(go[1]);
        if (read(go[0], &c, 1) != 1)
            _exit(2);
        /* 64 MiB, written page by page. */
        size_t len = 64u << 20;
        char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            _exit(3);
        for (size_t i = 0; i < len; i += 4096)
            p[i] = 1;
        _exit(0);
    }
    close(go[0]);
    CHECK(ci_cgroup_attach(cg, pid, &err) == CI_OK);
    char buf[256];
    snprintf(buf, sizeof(buf), "%d\n", (int)pid);
    char procs[256];
    slurp(cg->dir[CI_CG_MEMORY], "cgroup.procs", procs, sizeof(procs));
    CHECK_STR(procs, buf);
    CHECK(write(go[1], "x", 1) == 1);
    close(go[1]);
    int st = 0;
    waitpid(pid, &st, 0);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    struct ci_cgroup_stats cs;
    ci_cgroup_stats(cg, &cs);
    CHECK(cs.oom_kills >= 1);
    CHECK(cs.has_peak && cs.peak_bytes > (16u << 20) && cs.peak_bytes <= (32u << 20));
    char dir[CI_CGROUP_PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", cg->dir[CI_CG_MEMORY]);
    ci_cgroup_free(cg);
    struct stat sb;
    CHECK(stat(dir, &sb) != 0);
    char parent[CI_CGROUP_PATH_MAX];
    snprintf(parent, sizeof(parent), "%s", ci_cgroup_root_dir(root));
    CHECK(stat(parent, &sb) == 0);
    ci_cgroup_root_free(root);
    CHECK(stat(parent, &sb) != 0);
}

int main(int argc, char **argv)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/test_cgroup.XXXXXX");
    if (!mkdtemp(tmpdir))
        return 1;
    static const struct t_case cases[] = {T(t_words), T(t_paths), T(t_fake_v2), T(t_stale),
                                          T_OWN(t_real)};
    int rc = t_main(argc, argv, cases, sizeof(cases) / sizeof(cases[0]));
    char cmd[128];
    const char *files[] = {"memory.max", "pids.max", "cpu.max", "memory.events", "memory.peak"};
    for (int t = 1; t <= 2; t++) { /* clean the fake tree */
        snprintf(cmd, sizeof(cmd), "%s/task-%d", tmpdir, t);
        for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
            char f[256];
            snprintf(f, sizeof(f), "%s/%s", cmd, files[i]);
            unlink(f);
        }
        rmdir(cmd);
    }
    rmdir(tmpdir);
    return rc;
}
