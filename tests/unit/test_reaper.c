/* test_reaper.c - the sandbox's reaper (src/sandbox/reaper.c) at its
 * edges, on the REAL warm sandbox: a queue that is full, a run too big to
 * queue, a stop with runs still queued, an init that will not exit; and a
 * killed run whose processes cannot exit (warm, and cold through the local
 * provider): its wait gives up on them, its free hands them to the reaper.
 *
 * An init that will not exit is made on demand: it is moved into a cgroup
 * v1 freezer and frozen before its run is released; a frozen task does not
 * die of SIGKILL until it is thawed (kernel 6.x, checked here first). It
 * looks into the sandbox (sandbox_int.h): the reaper's counters, a run's
 * init. Needs user namespaces, ci-zygote, per-task cgroups and the v1
 * freezer; without them it exits 77 loudly. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"
#include "provider/provider_local.h"
#include "sandbox/sandbox_int.h"
#include "sandbox_config.h"
#include "testutil.h"

#define FREEZER_ROOT "/sys/fs/cgroup/freezer"
/* One run's free when its init will not exit: run_kill_now waits 5 s for
 * it, then ci_cgroup_free 2 s (2 ms sleeps, counted) for each of cgroup
 * v1's three directories: 11 s and what the sleeps overrun (~12 s here). */
#define ONE_FREE_MS 11000

static struct ci_sandbox_probe probed;
static char freezer[256]; /* this program's freezer cgroup */
static char freezer_state[300]; /* its freezer.state, once it exists */
static bool syscall_readable;   /* another process's /proc/PID/syscall (keeper_of) */

static struct ci_config *make_config(unsigned slots)
{
    struct ci_config *c = calloc(1, sizeof(*c));
    sandbox_test_defaults(c, CI_ISOLATION_REQUIRED);
    c->worker.concurrency = slots; /* the reaper queues at most this many */
    c->local.mode = CI_MODE_WARM;
    c->local.warm_pool_size = 1;
    c->local.warm_spares = 1;
    c->local.warm_rotate_after = 200;
    c->local.zygote = CI_ZYGOTE_PATH;
    return c;
}

static int task_dirs(const struct ci_sandbox *sb);

static struct ci_sandbox *new_sandbox(struct ci_config *c)
{
    struct ci_sandbox *sb = NULL;
    struct ci_error err = {{0}};
    if (ci_sandbox_new(c, &probed, &sb, &err) != CI_OK) {
        fprintf(stderr, "sandbox: %s\n", err.msg);
        return NULL;
    }
    if (strcmp(ci_sandbox_mode(sb), "warm") != 0 || !sb->cgroups || !sb->reaper.running) {
        fprintf(stderr, "the sandbox runs %s, cgroups %s, reaper %s\n", ci_sandbox_mode(sb),
                sb->cgroups ? "yes" : "no", sb->reaper.running ? "yes" : "no");
        ci_sandbox_free(sb);
        return NULL;
    }
    /* The sandbox's own first run (the pool's try) may still be leaving
     * its cgroup: the cases count task cgroups from none. */
    int left = 0;
    for (int i = 0; i < 2000 && (left = task_dirs(sb)) != 0; i++)
        usleep(10 * 1000);
    if (left != 0)
        fprintf(stderr, "%d task cgroups left 20 s after the sandbox started\n", left);
    return sb;
}

static int write_file(const char *dir, const char *name, const char *text);
static bool read_file(const char *dir, const char *name, char *buf, size_t size);
static bool freeze(pid_t pid);
static int task_pids(pid_t init, pid_t *out, int max);
static int pids_in(const char *dir, pid_t *out, int max);

/* The code of a run whose init will not exit: it waits until another
 * process of its namespace (the keeper) is frozen, which the test does. */
static const char wait_frozen[] =
    "import os, time\n"
    "me = os.getpid()\n"
    "def frozen():\n"
    "    for p in os.listdir('/proc'):\n"
    "        if p.isdigit() and int(p) not in (1, me):\n"
    "            try:\n"
    "                if open('/proc/%s/stat' % p).read().rsplit(')', 1)[1].split()[0] == 'D':\n"
    "                    return True\n"
    "            except OSError:\n"
    "                pass\n"
    "    return False\n"
    "end = time.monotonic() + 30\n"
    "while not frozen() and time.monotonic() < end:\n"
    "    time.sleep(0.01)\n"
    "print('frozen' if frozen() else 'not frozen')\n";

/* The keeper of the run whose init is init, once it has settled: the
 * child of init, in its cgroup, that blocks SIGTERM while its sibling,
 * the task process, does not, and that sleeps in its last ppoll (it closed
 * its fds and woke the task process before). 0: none yet. Taken any
 * earlier, the frozen process could be the keeper still holding the task's
 * pipes (before its close_range: the run would never end) or not the
 * keeper at all (a spare's task process blocks every signal until it has
 * read init's first byte, which on a loaded machine may come after GO: the
 * code would never run). Either would hang the case as it hung twice under
 * load; neither was caught in the act (the watchdog below prints stacks). */
static pid_t keeper_of(pid_t init)
{
    pid_t pids[16], blocking = 0;
    bool open_child = false;
    int n = task_pids(init, pids, 16);
    for (int i = 0; i < n; i++) {
        char dir[64], buf[4096];
        snprintf(dir, sizeof(dir), "/proc/%d", (int)pids[i]);
        if (pids[i] == init || !read_file(dir, "status", buf, sizeof(buf)))
            continue;
        const char *pp = strstr(buf, "\nPPid:"), *blk = strstr(buf, "\nSigBlk:");
        if (!pp || !blk || strtol(pp + 7, NULL, 10) != init)
            continue;
        unsigned long long mask = strtoull(blk + 9, NULL, 16);
        if (!(mask & (1ULL << (SIGTERM - 1))))
            open_child = true;
        else if (blocking)
            return 0; /* two that block: not settled yet */
        else
            blocking = pids[i];
    }
    if (!open_child || !blocking)
        return 0;
    char dir[64], buf[256];
    snprintf(dir, sizeof(dir), "/proc/%d", (int)blocking);
    if (!read_file(dir, "syscall", buf, sizeof(buf)) || strtol(buf, NULL, 10) != SYS_ppoll)
        return 0;
    return blocking;
}

/* A warm run of code, waited for (ended), not freed. With frozen, one whose
 * init will not exit: its keeper frozen while the code runs (wait_frozen),
 * killed by init at the end but alive until thawed, init's exit waiting
 * for it. */
static struct ci_sandbox_run *run_ended_init(struct ci_sandbox *sb, const char *code,
                                             bool frozen, pid_t *init)
{
    if (frozen)
        code = wait_frozen;
    struct ci_job job = {.code = code, .code_len = strlen(code), .timeout_ms = 30000,
                         .memory_mb = 1024};
    struct ci_sandbox_run *run = NULL;
    struct ci_error err = {{0}};
    if (ci_sandbox_start(sb, &job, &run, &err) != CI_OK) {
        fprintf(stderr, "start: %s\n", err.msg);
        return NULL;
    }
    if (frozen) {
        pid_t keeper = 0;
        for (int i = 0; i < 1000 && !(keeper = keeper_of(run->pid)); i++)
            usleep(10 * 1000);
        if (!keeper || !freeze(keeper)) {
            fprintf(stderr, "cannot freeze the keeper of %d\n", (int)run->pid);
            ci_sandbox_run_free(run);
            return NULL;
        }
    }
    /* Init's pid, taken now: when init is gone before the worker has read
     * its report (a loaded machine), the wait reaps it and run->pid is 0. */
    if (init)
        *init = run->pid;
    struct ci_sandbox_result res;
    if (ci_sandbox_wait(run, &res) != CI_OK) {
        ci_sandbox_run_free(run);
        return NULL;
    }
    /* A frozen keeper holds init: it cannot be gone yet. An init already
     * gone (reaped by the wait on a loaded machine) took its cgroup with
     * it there; one still on its way out keeps it until the free. */
    bool ok = res.end == CI_SANDBOX_EXITED && run->warm && (run->pid > 0 || !frozen) &&
              (run->pid > 0) == (run->cg != NULL) &&
              (!frozen || (res.outcome.out && strcmp(res.outcome.out, "frozen\n") == 0));
    if (!ok)
        fprintf(stderr, "run: end %d warm %d pid %d out %.100s err %.300s\n", (int)res.end,
                run->warm, (int)run->pid, res.outcome.out ? res.outcome.out : "",
                res.outcome.err ? res.outcome.err : "");
    ci_sandbox_result_release(&res);
    if (!ok) {
        ci_sandbox_run_free(run);
        return NULL;
    }
    return run;
}

static struct ci_sandbox_run *run_ended(struct ci_sandbox *sb, const char *code, bool frozen)
{
    return run_ended_init(sb, code, frozen, NULL);
}

/* Task cgroups the ended runs still have (the count task_dirs should see). */
static int dirs_of(struct ci_sandbox_run *const *runs, int n)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        k += runs[i]->cg != NULL;
    return k;
}

static int write_file(const char *dir, const char *name, const char *text)
{
    char path[1280];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    int e = write(fd, text, strlen(text)) < 0 ? errno : 0;
    close(fd);
    return e;
}

static bool read_file(const char *dir, const char *name, char *buf, size_t size)
{
    char path[1280];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    return n >= 0;
}

static bool set_frozen(bool frozen)
{
    const char *want = frozen ? "FROZEN" : "THAWED";
    if (write_file(freezer, "freezer.state", want) != 0)
        return false;
    char buf[64];
    for (int i = 0; i < 1000; i++) {
        if (read_file(freezer, "freezer.state", buf, sizeof(buf)) && strncmp(buf, want, 6) == 0)
            return true;
        usleep(10 * 1000);
    }
    return false;
}

/* pid into the freezer, frozen (with whatever else is in there). */
static bool freeze(pid_t pid)
{
    char text[24];
    snprintf(text, sizeof(text), "%d", (int)pid);
    int e = write_file(freezer, "cgroup.procs", text);
    if (e)
        fprintf(stderr, "cannot move %d into %s: %s\n", (int)pid, freezer, strerror(e));
    return !e && set_frozen(true);
}

/* Gone, or a zombie its zygote has yet to reap: nothing of it runs. */
static bool pid_gone(pid_t pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d", (int)pid);
    if (!read_file(path, "stat", buf, sizeof(buf)))
        return true;
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static bool gone_within(pid_t pid, int ms)
{
    for (int i = 0; i < ms / 10; i++) {
        if (pid_gone(pid))
            return true;
        usleep(10 * 1000);
    }
    return pid_gone(pid);
}

/* The task cgroups of sb that exist now (memory hierarchy). */
static int task_dirs(const struct ci_sandbox *sb)
{
    DIR *d = opendir(ci_cgroup_root_dir(sb->cgroups));
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strncmp(e->d_name, "task-", 5) == 0;
    closedir(d);
    return n;
}

/* The pids listed in dir/cgroup.procs, at most max. */
static int pids_in(const char *dir, pid_t *out, int max)
{
    char buf[4096];
    if (!read_file(dir, "cgroup.procs", buf, sizeof(buf)))
        return 0;
    int n = 0;
    for (char *p = buf, *end; *p && n < max; p = end) {
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        out[n++] = (pid_t)v;
        while (*end == '\n')
            end++;
    }
    return n;
}

/* Every pid in a task cgroup of sb now, at most max. */
static int sb_task_pids(const struct ci_sandbox *sb, pid_t *out, int max)
{
    const char *root = ci_cgroup_root_dir(sb->cgroups);
    DIR *d = opendir(root);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "task-", 5) != 0)
            continue;
        char dir[1024];
        snprintf(dir, sizeof(dir), "%s/%s", root, e->d_name);
        n += pids_in(dir, out + n, max - n);
    }
    closedir(d);
    return n;
}

/* Every pid in init's task cgroup (memory hierarchy), at most max; 0 once
 * init has exited (an exiting task's cgroup is the root). */
static int task_pids(pid_t init, pid_t *out, int max)
{
    char path[64], buf[4096], dir[1024];
    snprintf(path, sizeof(path), "/proc/%d", (int)init);
    if (!read_file(path, "cgroup", buf, sizeof(buf)))
        return 0;
    const char *m = strstr(buf, ":memory:");
    if (!m)
        return 0;
    m += 8;
    size_t len = strcspn(m, "\n");
    if (!memmem(m, len, "/task-", 6))
        return 0;
    snprintf(dir, sizeof(dir), "/sys/fs/cgroup/memory%.*s", (int)len, m);
    return pids_in(dir, out, max);
}

static unsigned pending(struct ci_sandbox *sb)
{
    pthread_mutex_lock(&sb->reaper.lock);
    unsigned n = sb->reaper.pending;
    pthread_mutex_unlock(&sb->reaper.lock);
    return n;
}

static bool pending_within(struct ci_sandbox *sb, unsigned want, int ms)
{
    for (int i = 0; i < ms / 10; i++) {
        if (pending(sb) == want)
            return true;
        usleep(10 * 1000);
    }
    return pending(sb) == want;
}

static bool dir_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static const char small[] = "print('ok')\n";

/* The queue full: a slot frees its run itself, before release returns. */
static void t_queue_full(void)
{
    struct ci_config *c = make_config(1);
    struct ci_sandbox *sb = new_sandbox(c);
    REQUIRE(sb);
    pid_t init2 = 0;
    struct ci_sandbox_run *r1 = run_ended(sb, NULL, true);
    struct ci_sandbox_run *r2 = run_ended_init(sb, small, false, &init2);
    REQUIRE(r1 && r2);
    pid_t init1 = r1->pid;
    CHECK(dirs_of((struct ci_sandbox_run *[]){r1, r2}, 2) >= 1); /* r1's init is held */
    CHECK(task_dirs(sb) == dirs_of((struct ci_sandbox_run *[]){r1, r2}, 2));
    ci_sandbox_run_release(r1); /* the reaper's one: it waits for an init that cannot exit */
    CHECK(pending(sb) == 1);
    ci_sandbox_run_release(r2); /* the queue is full: freed here */
    CHECK(pending(sb) == 1);
    CHECK(pid_gone(init2));
    CHECK(task_dirs(sb) == 1); /* r2's is gone already, r1's waits */
    CHECK(set_frozen(false));
    CHECK(gone_within(init1, 5000));
    CHECK(pending_within(sb, 0, 20000));
    CHECK(task_dirs(sb) == 0);
    ci_sandbox_free(sb);
    free(c);
}

/* A run whose peak was above 256 MiB is freed by its caller, even with
 * room in the queue; a small one beside it waits in the queue. */
static void t_big_peak_inline(void)
{
    struct ci_config *c = make_config(3);
    struct ci_sandbox *sb = new_sandbox(c);
    REQUIRE(sb);
    struct ci_sandbox_run *r1 = run_ended(sb, NULL, true);
    pid_t init_big = 0;
    struct ci_sandbox_run *big = run_ended_init(sb, "b = bytearray(300 << 20)\n"
                                                    "for i in range(0, len(b), 4096):\n"
                                                    "    b[i] = 1\n"
                                                    "print('big')\n", false, &init_big);
    struct ci_sandbox_run *r3 = run_ended(sb, small, false);
    REQUIRE(r1 && big && r3);
    CHECK(big->peak_mb > 256);
    CHECK(r3->peak_mb <= 256);
    ci_sandbox_run_release(r1);
    CHECK(pending(sb) == 1);
    ci_sandbox_run_release(big); /* freed here */
    CHECK(pending(sb) == 1);
    CHECK(pid_gone(init_big));
    int left = dirs_of((struct ci_sandbox_run *[]){r3}, 1);
    CHECK(task_dirs(sb) == 1 + left); /* r1's, and r3's unless its init is gone */
    ci_sandbox_run_release(r3); /* queued behind r1 */
    CHECK(pending(sb) == 2);
    CHECK(task_dirs(sb) == 1 + left);
    CHECK(set_frozen(false));
    CHECK(pending_within(sb, 0, 20000));
    CHECK(task_dirs(sb) == 0);
    ci_sandbox_free(sb);
    free(c);
}

static void *thaw_later(void *arg)
{
    (void)arg;
    usleep(300 * 1000);
    set_frozen(false);
    return NULL;
}

/* A stop with runs still queued (the sandbox freed, as a worker's provider
 * is at its end): every one freed, every process of theirs gone, their
 * cgroups removed. */
static void t_stop_with_queued(void)
{
    struct ci_config *c = make_config(3);
    struct ci_sandbox *sb = new_sandbox(c);
    REQUIRE(sb);
    struct ci_sandbox_run *runs[3];
    for (int i = 0; i < 3; i++)
        REQUIRE((runs[i] = run_ended(sb, "import subprocess\n"
                                         "subprocess.Popen(['sleep', '600'])\n"
                                         "print('left one behind')\n", i == 0)));
    pid_t pids[64];
    int n = sb_task_pids(sb, pids, 64); /* what is left in their cgroups */
    CHECK(n >= 1); /* the first's frozen keeper at least */
    char root[CI_CGROUP_PATH_MAX];
    snprintf(root, sizeof(root), "%s", ci_cgroup_root_dir(sb->cgroups));
    int dirs = dirs_of(runs, 3);
    CHECK(dirs >= 1);
    for (int i = 0; i < 3; i++)
        ci_sandbox_run_release(runs[i]);
    CHECK(pending(sb) == 3);
    CHECK(task_dirs(sb) == dirs);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, thaw_later, NULL) == 0);
    ci_sandbox_free(sb); /* the stop: the queue still holds two */
    pthread_join(t, NULL);
    for (int i = 0; i < n; i++)
        CHECK(gone_within(pids[i], 1000));
    CHECK(!dir_exists(root));
    free(c);
}

/* An init that will not exit: its free gives up after a bounded wait
 * (ONE_FREE_MS), its cgroup stays (it cannot be removed while init is in
 * it) until the sandbox's root goes, and the reaper takes runs again. */
static void t_init_will_not_exit(void)
{
    struct ci_config *c = make_config(1);
    struct ci_sandbox *sb = new_sandbox(c);
    REQUIRE(sb);
    struct ci_sandbox_run *r1 = run_ended(sb, NULL, true);
    REQUIRE(r1);
    pid_t init1 = r1->pid;
    char root[CI_CGROUP_PATH_MAX];
    snprintf(root, sizeof(root), "%s", ci_cgroup_root_dir(sb->cgroups));
    int64_t t0 = ci_mono_ms();
    ci_sandbox_run_release(r1);
    CHECK(pending_within(sb, 0, ONE_FREE_MS + 10000));
    int64_t took = ci_mono_ms() - t0;
    fprintf(stderr, "the reaper gave up on a frozen init after %lld ms\n", (long long)took);
    CHECK(took >= 5000); /* it did wait for init */
    CHECK(!pid_gone(init1));
    CHECK(task_dirs(sb) == 1); /* left behind */
    pid_t init2 = 0;
    struct ci_sandbox_run *r2 = run_ended_init(sb, small, false, &init2);
    REQUIRE(r2);
    ci_sandbox_run_release(r2); /* queued again, and freed */
    CHECK(gone_within(init2, 5000));
    CHECK(set_frozen(false));
    CHECK(gone_within(init1, 5000));
    ci_sandbox_free(sb);
    CHECK(!dir_exists(root)); /* the left cgroup went with the root */
    free(c);
}

/* At stop, what is queued is freed in parallel: three runs whose inits
 * will not exit take about one free's time, not three (sequential before:
 * 3 x ONE_FREE_MS, less what the first had done: 35.8 s measured). */
static void t_stop_in_parallel(void)
{
    struct ci_config *c = make_config(3);
    struct ci_sandbox *sb = new_sandbox(c);
    REQUIRE(sb);
    struct ci_sandbox_run *runs[3];
    pid_t inits[3];
    for (int i = 0; i < 3; i++) {
        REQUIRE((runs[i] = run_ended(sb, NULL, true)));
        inits[i] = runs[i]->pid;
    }
    for (int i = 0; i < 3; i++)
        ci_sandbox_run_release(runs[i]);
    CHECK(pending(sb) == 3);
    int64_t t0 = ci_mono_ms();
    reaper_stop(sb);
    int64_t took = ci_mono_ms() - t0;
    fprintf(stderr, "the stop with three frozen inits took %lld ms (one free: ~%d ms)\n",
            (long long)took, ONE_FREE_MS);
    CHECK(took < ONE_FREE_MS * 2); /* ~12 s; before ~31-36 s; slack for a loaded machine */
    CHECK(set_frozen(false));
    for (int i = 0; i < 3; i++)
        CHECK(gone_within(inits[i], 5000));
    char root[CI_CGROUP_PATH_MAX];
    snprintf(root, sizeof(root), "%s", ci_cgroup_root_dir(sb->cgroups));
    ci_sandbox_free(sb); /* reaper_stop again: does nothing */
    CHECK(!dir_exists(root));
    free(c);
}

/* ---- A killed run whose processes cannot exit ------------------------- */

/* ci_sandbox_wait's wait for init after SIGKILL (io.c KILL_WAIT_MS), and
 * what a call that must not wait for them may take at most, on a loaded
 * machine: a wait that gives up on them takes their 10 s and this. */
#define KILL_WAIT_MS 10000
#define SLACK_MS 15000

/* The pids in every task cgroup of this program's sandboxes (memory
 * hierarchy), at most max; *ret_dirs: how many task cgroups there are. */
static int task_cgroup_pids(pid_t *out, int max, int *ret_dirs)
{
    char buf[4096], base[1024], prefix[64];
    *ret_dirs = 0;
    if (!read_file("/proc/self", "cgroup", buf, sizeof(buf)))
        return 0;
    const char *m = strstr(buf, ":memory:");
    if (!m)
        return 0;
    m += 8;
    snprintf(base, sizeof(base), "/sys/fs/cgroup/memory%.*s", (int)strcspn(m, "\n"), m);
    snprintf(prefix, sizeof(prefix), "ci-worker-%d-", (int)getpid());
    DIR *d = opendir(base);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char root[1400];
        snprintf(root, sizeof(root), "%s/%s", base, e->d_name);
        DIR *r = opendir(root);
        if (!r)
            continue;
        struct dirent *t;
        while ((t = readdir(r)) != NULL) {
            if (strncmp(t->d_name, "task-", 5) != 0)
                continue;
            char dir[1800];
            snprintf(dir, sizeof(dir), "%s/%s", root, t->d_name);
            (*ret_dirs)++;
            n += pids_in(dir, out + n, max - n);
        }
        closedir(r);
    }
    closedir(d);
    return n;
}

static int task_cgroups_now(void)
{
    pid_t pids[64];
    int dirs;
    task_cgroup_pids(pids, 64, &dirs);
    return dirs;
}

static bool task_cgroups_within(int want, int ms)
{
    for (int i = 0; i < ms / 10 && task_cgroups_now() != want; i++)
        usleep(10 * 1000);
    return task_cgroups_now() == want;
}

/* Freezes every process of the running task's cgroup, once there are at
 * least want of them: as an operator who froze the cgroup, or a disk that
 * hung every one of them in the kernel. Their count (into pids), or 0. */
static int freeze_task(int want, pid_t *pids, int max)
{
    int n = 0, dirs = 0;
    for (int i = 0; i < 1000 && (n = task_cgroup_pids(pids, max, &dirs)) < want; i++)
        usleep(10 * 1000);
    if (n < want) {
        fprintf(stderr, "only %d processes in the task's cgroup, not %d\n", n, want);
        return 0;
    }
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < n; i++) {
            char text[24];
            snprintf(text, sizeof(text), "%d", (int)pids[i]);
            write_file(freezer, "cgroup.procs", text); /* one that is gone: ESRCH */
        }
        if (!set_frozen(true))
            return 0;
        /* One forked meanwhile is not in: again, until every one is. */
        pid_t in[64];
        int k = pids_in(freezer, in, 64);
        n = task_cgroup_pids(pids, max, &dirs);
        bool all = n >= want;
        for (int i = 0; i < n && all; i++) {
            bool found = false;
            for (int j = 0; j < k && !found; j++)
                found = in[j] == pids[i];
            all = found;
        }
        if (all)
            return n;
    }
    return 0;
}

/* A call on a thread of its own, waited for at most a bound: one that
 * does not return within it fails the case instead of hanging the test,
 * and the freezer is thawed so that it returns (what it waited for dies
 * of its SIGKILL). */
struct bg {
    void (*fn)(void *);
    void *arg;
    atomic_bool done;
};

static void *bg_main(void *p)
{
    struct bg *b = p;
    b->fn(b->arg);
    atomic_store(&b->done, true);
    return NULL;
}

/* Runs fn(arg) within ms; its time into *ret_ms. */
static bool call_within(void (*fn)(void *), void *arg, int ms, const char *what, int64_t *ret_ms)
{
    struct bg b = {.fn = fn, .arg = arg};
    atomic_init(&b.done, false);
    pthread_t t;
    int64_t t0 = ci_mono_ms();
    if (pthread_create(&t, NULL, bg_main, &b) != 0)
        return false;
    while (!atomic_load(&b.done) && ci_mono_ms() - t0 < ms)
        usleep(10 * 1000);
    bool in_time = atomic_load(&b.done);
    *ret_ms = ci_mono_ms() - t0;
    if (!in_time) {
        fprintf(stderr, "%s has not returned after %d ms: thawing the task\n", what, ms);
        set_frozen(false);
    }
    pthread_join(t, NULL);
    fprintf(stderr, "%s returned after %lld ms\n", what, (long long)(ci_mono_ms() - t0));
    return in_time;
}

/* After the thaw the frozen processes die of their SIGKILL; the reaper
 * then frees the run: init reaped, its cgroup removed. */
static void check_all_gone(const pid_t *pids, int n)
{
    CHECK(set_frozen(false));
    for (int i = 0; i < n; i++)
        CHECK(gone_within(pids[i], 10000));
    CHECK(task_cgroups_within(0, 10000)); /* the reaper looks every second */
}

static const char sleeper[] = "import time\n"
                              "print('sleeping', flush=True)\n"
                              "time.sleep(300)\n";

struct sb_wait {
    struct ci_sandbox_run *run;
    struct ci_sandbox_result res;
    ci_status s;
};

static void sb_wait_fn(void *p)
{
    struct sb_wait *w = p;
    w->s = ci_sandbox_wait(w->run, &w->res);
}

static void sb_release_fn(void *p)
{
    ci_sandbox_run_release(p);
}

/* Warm: a running task frozen whole (init, the task process, its keeper),
 * then cancelled. The wait gives up KILL_WAIT_MS after init's SIGKILL and
 * says so; the release returns at once, the processes still frozen; once
 * thawed, nothing is left. Before, the wait polled for init's exit for
 * ever. */
static void t_frozen_task_warm(void)
{
    struct ci_config *c = make_config(1);
    struct ci_sandbox *sb = new_sandbox(c);
    REQUIRE(sb);
    char root[CI_CGROUP_PATH_MAX];
    snprintf(root, sizeof(root), "%s", ci_cgroup_root_dir(sb->cgroups));
    struct ci_job job = {.code = sleeper, .code_len = strlen(sleeper), .timeout_ms = 60000,
                         .memory_mb = 1024};
    struct sb_wait w = {0};
    struct ci_error err = {{0}};
    REQUIRE(ci_sandbox_start(sb, &job, &w.run, &err) == CI_OK);
    CHECK(w.run->warm);
    pid_t pids[32];
    int n = freeze_task(3, pids, 32); /* init, the task process, the keeper */
    CHECK(n >= 3);
    ci_sandbox_cancel(w.run);
    int64_t took = 0;
    bool in_time = call_within(sb_wait_fn, &w, KILL_WAIT_MS + SLACK_MS, "ci_sandbox_wait", &took);
    CHECK(in_time);
    CHECK(w.s == CI_OK);
    if (in_time && w.s == CI_OK) {
        CHECK(took >= KILL_WAIT_MS); /* it did wait for them */
        CHECK(w.res.end == CI_SANDBOX_CANCELLED);
        CHECK(w.res.unreaped);
        CHECK_CONTAINS(w.res.outcome.error, "did not exit within 10 s of SIGKILL");
        for (int i = 0; i < n; i++)
            CHECK(!pid_gone(pids[i])); /* frozen: alive */
    }
    if (w.s == CI_OK)
        ci_sandbox_result_release(&w.res);
    CHECK(call_within(sb_release_fn, w.run, 2000, "ci_sandbox_run_release", &took));
    if (in_time) {
        CHECK(task_cgroups_now() == 1); /* still there, with them */
        for (int i = 0; i < n; i++)
            CHECK(!pid_gone(pids[i]));
    }
    check_all_gone(pids, n);
    /* The sandbox goes on: a task runs. */
    struct ci_sandbox_run *r2 = run_ended(sb, small, false);
    CHECK(r2 != NULL);
    ci_sandbox_run_free(r2);
    ci_sandbox_free(sb);
    CHECK(!dir_exists(root));
    free(c);
}

struct prov_call {
    struct ci_provider *p;
    struct ci_run *run;
    struct ci_outcome o;
    ci_status s;
};

static void prov_wait_fn(void *arg)
{
    struct prov_call *pc = arg;
    pc->s = ci_provider_wait(pc->p, pc->run, &pc->o);
}

static void prov_release_fn(void *arg)
{
    struct prov_call *pc = arg;
    ci_provider_release(pc->p, pc->run);
}

/* The pid among pids whose parent we are (a cold run's init), or 0. */
static pid_t our_child(const pid_t *pids, int n)
{
    for (int i = 0; i < n; i++) {
        char dir[64], buf[4096];
        snprintf(dir, sizeof(dir), "/proc/%d", (int)pids[i]);
        const char *pp = read_file(dir, "status", buf, sizeof(buf)) ? strstr(buf, "\nPPid:")
                                                                     : NULL;
        if (pp && strtol(pp + 7, NULL, 10) == getpid())
            return pids[i];
    }
    return 0;
}

/* Cold, through the local provider, as a worker runs it: a running task
 * frozen whole (init, the task process), then timed out. The outcome is
 * TIMED_OUT, its error says both; the release returns at once (before:
 * waitpid on init, for ever); once thawed the reaper reaps init, removes
 * its cgroup and gives its task uid back: the next task runs (one slot:
 * one cold uid, with task uids). */
static void t_frozen_task_cold(void)
{
    struct ci_config *c = make_config(1);
    c->local.mode = CI_MODE_COLD;
    c->local.task_uid_first = 2000000000u; /* the defaults: task uids as root */
    c->local.task_uid_count = 5000;
    struct prov_call pc = {0};
    struct ci_error err = {{0}};
    REQUIRE(ci_provider_local_new_probed(c, &probed, &pc.p, &err) == CI_OK);
    struct ci_job job = {.code = sleeper, .code_len = strlen(sleeper), .timeout_ms = 2000,
                         .memory_mb = 1024};
    REQUIRE(ci_provider_start(pc.p, &job, &pc.run, &err) == CI_OK);
    pid_t pids[32];
    int n = freeze_task(2, pids, 32); /* init, the task process */
    CHECK(n >= 2);
    pid_t init = our_child(pids, n);
    CHECK(init > 0);
    int64_t took = 0;
    bool in_time = call_within(prov_wait_fn, &pc, (int)job.timeout_ms + KILL_WAIT_MS + SLACK_MS,
                               "ci_provider_wait", &took);
    CHECK(in_time);
    CHECK(pc.s == CI_OK);
    if (in_time && pc.s == CI_OK) {
        CHECK(took >= KILL_WAIT_MS);
        CHECK(pc.o.kind == CI_OUTCOME_TIMED_OUT);
        CHECK(pc.o.unreaped);
        CHECK_CONTAINS(pc.o.error, "did not finish within the time limit of 2000 ms; its "
                                   "processes did not exit within 10 s of SIGKILL");
        for (int i = 0; i < n; i++)
            CHECK(!pid_gone(pids[i]));
    }
    ci_outcome_release(&pc.o);
    CHECK(call_within(prov_release_fn, &pc, 2000, "ci_provider_release", &took));
    if (in_time) {
        CHECK(task_cgroups_now() == 1);
        for (int i = 0; i < n; i++)
            CHECK(!pid_gone(pids[i]));
        /* Meanwhile the slot's next task finds the one cold uid held: not
         * a failure of the task, but no room now (the worker gives the
         * task back to be tried again). */
        struct ci_job next = {.code = small, .code_len = strlen(small), .timeout_ms = 30000,
                              .memory_mb = 1024};
        struct ci_run *held = NULL;
        struct ci_error full = {{0}};
        ci_status s = ci_provider_start(pc.p, &next, &held, &full);
        if (geteuid() == 0) { /* else no task uids: nothing is held */
            CHECK(s == CI_ERR_FULL);
            CHECK_CONTAINS(full.msg, "a killed run whose processes have not exited holds one");
        }
        if (s == CI_OK) {
            struct ci_outcome o;
            CHECK(ci_provider_wait(pc.p, held, &o) == CI_OK);
            ci_outcome_release(&o);
            ci_provider_release(pc.p, held);
        }
    }
    check_all_gone(pids, n);
    /* Init reaped (by the reaper), not only exited. */
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    int wr = init > 0 ? waitid(P_PID, (id_t)init, &si, WEXITED | WNOHANG | WNOWAIT | __WALL) : -1;
    CHECK(init <= 0 || (wr != 0 && errno == ECHILD));
    /* The slot's next task runs: the run's task uid is free again. */
    struct ci_job next = {.code = small, .code_len = strlen(small), .timeout_ms = 30000,
                          .memory_mb = 1024};
    struct prov_call pc2 = {.p = pc.p};
    ci_status s = ci_provider_start(pc.p, &next, &pc2.run, &err);
    CHECK(s == CI_OK);
    if (s != CI_OK)
        fprintf(stderr, "the next task: %s\n", err.msg);
    if (s == CI_OK) {
        CHECK(ci_provider_wait(pc.p, pc2.run, &pc2.o) == CI_OK);
        CHECK(pc2.o.kind == CI_OUTCOME_EXITED && pc2.o.exit_code == 0);
        ci_outcome_release(&pc2.o);
        ci_provider_release(pc.p, pc2.run);
    }
    ci_provider_free(pc.p);
    CHECK(task_cgroups_now() == 0);
    free(c);
}

/* Does SIGKILL leave a frozen process alive here? */
static bool freezer_holds(void)
{
    pid_t p = fork();
    if (p == 0) {
        pause();
        _exit(0);
    }
    if (p < 0 || !freeze(p)) {
        if (p > 0) {
            kill(p, SIGKILL);
            waitpid(p, NULL, 0);
        }
        return false;
    }
    char dir[64], buf[256];
    snprintf(dir, sizeof(dir), "/proc/%d", (int)p);
    syscall_readable = read_file(dir, "syscall", buf, sizeof(buf));
    kill(p, SIGKILL);
    usleep(200 * 1000);
    bool held = waitpid(p, NULL, WNOHANG) == 0;
    set_frozen(false);
    waitpid(p, NULL, 0);
    return held;
}

/* A case that hangs must not leave a frozen process behind, nor wait for
 * ctest's timeout (600 s) to be seen: far past what the cases take (about
 * a minute, two on a loaded machine), thaw and abort. SIGTERM and SIGINT
 * thaw too (a write is async-signal-safe). */
#define WATCHDOG_S 420

static void thaw_now(void)
{
    if (!freezer_state[0])
        return;
    int fd = open(freezer_state, O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t w = write(fd, "THAWED", 6);
        (void)w;
        close(fd);
    }
}

static void on_signal(int sig)
{
    thaw_now();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* What a hang looks like, for the log: every thread's stack (gdb, when
 * the machine has it) and the processes of the sandbox's tree. */
static void show_hang(void)
{
    char pid[16], cmd[768];
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    snprintf(cmd, sizeof(cmd),
             "(sleep 90; echo THAWED > %s) >/dev/null 2>&1 & "
             "timeout 60 gdb -batch -p %s -ex 'thread apply all bt' 2>&1 | grep -v '^\\[New LWP'; "
             "ps -eo pid,ppid,stat,wchan:32,comm --forest 2>&1 | grep -B2 -A8 ci-zygote",
             freezer_state, pid);
    pid_t p = fork();
    if (p == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    if (p > 0)
        while (waitpid(p, NULL, 0) < 0 && errno == EINTR)
            ;
}

static void *watchdog(void *arg)
{
    (void)arg;
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += WATCHDOG_S;
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR)
        ;
    fprintf(stderr, "\ntest_reaper: still running after %d s: a case hangs; its stacks, then "
                    "the freezer is thawed and the test aborts\n", WATCHDOG_S);
    show_hang(); /* while it still hangs; a timer thaws should this hang too */
    thaw_now();
    for (int i = 0; i < 500 && rmdir(freezer) != 0 && errno == EBUSY; i++)
        usleep(10 * 1000); /* its thawed processes die of their SIGKILL */
    abort();
}

int main(int argc, char **argv)
{
    static const struct t_case cases[] = {
        T(t_queue_full), T(t_big_peak_inline), T(t_stop_with_queued), T(t_init_will_not_exit),
        T(t_stop_in_parallel), T(t_frozen_task_warm), T(t_frozen_task_cold),
    };
    struct t_case sel[sizeof(cases) / sizeof(cases[0])];
    int k = t_select(argc, argv, cases, sizeof(cases) / sizeof(cases[0]), sel);
    if (k < 0)
        return 1;
    if (!CI_ZYGOTE_PATH[0]) {
        fprintf(stderr, "\n*** SKIPPED: built without ci-zygote: no warm mode, no reaper\n");
        return T_SKIP_RC;
    }
    snprintf(freezer, sizeof(freezer), FREEZER_ROOT "/ci-test-reaper-%d", (int)getpid());
    if (mkdir(freezer, 0755) != 0) {
        fprintf(stderr, "\n*** SKIPPED: no cgroup v1 freezer (%s: %s): an init that will not "
                        "exit cannot be made\n", freezer, strerror(errno));
        return T_SKIP_RC;
    }
    snprintf(freezer_state, sizeof(freezer_state), "%s/freezer.state", freezer);
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    pthread_t dog;
    if (pthread_create(&dog, NULL, watchdog, NULL) == 0)
        pthread_detach(dog);
    int rc = T_SKIP_RC;
    if (!freezer_holds()) {
        fprintf(stderr, "\n*** SKIPPED: SIGKILL ends a frozen process here\n");
        goto out;
    }
    if (!syscall_readable) {
        fprintf(stderr, "\n*** SKIPPED: /proc/PID/syscall of a child is not readable here "
                        "(ptrace restricted): a run's keeper cannot be told settled\n");
        goto out;
    }
    struct ci_config *c = make_config(1);
    ci_status ps = ci_sandbox_probe(c, &probed);
    free(c);
    if (ps != CI_OK || !probed.sandboxed || !probed.warm_ok || probed.cgroup_version == 0) {
        fprintf(stderr, "\n*** SKIPPED: sandbox %d, warm %d (%s), cgroups %d (%s)\n",
                probed.sandboxed, probed.warm_ok, probed.warm_failure, probed.cgroup_version,
                probed.cgroup_failure);
        goto out;
    }
    rc = t_run(sel, (size_t)k);
out:
    set_frozen(false);
    for (int i = 0; i < 500 && rmdir(freezer) != 0 && errno == EBUSY; i++)
        usleep(10 * 1000);
    return rc;
}
