/* io.c - a run from GO to its end (ci_sandbox_wait): one poll() loop over
 * stdout, stderr, the report pipe, the code socket, init's pidfd, the
 * cancel eventfd and the control socket; the deadline and cancel (SIG_STOP
 * to init, SIGKILL after STOP_GRACE_MS, and no more than KILL_WAIT_MS for
 * its exit after that), the reaping, the captures (kept up
 * to their cap, counted in full, never cut inside a UTF-8 character; what
 * is kept also goes to the job's output sink as it is read), and
 * the result with init's DONE, the cgroup's counters and the artifacts. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/util.h"
#include "sandbox/sandbox_int.h"

#define DRAIN_MS 1000          /* after the task is gone, longest wait for pipes to close */
#define STOP_GRACE_MS 300      /* init's time to kill and reap everything before SIGKILL */
/* After SIGKILL, longest wait for init to exit. It does at once unless a
 * process of its namespace cannot die (frozen by the cgroup v1 freezer, stuck
 * in uninterruptible sleep on a hung disk): then waiting longer would hold
 * the slot, maybe for ever. The run ends as the kill's end, saying so, and
 * its free hands what is left to the sandbox's thread (reaper.c). */
#define KILL_WAIT_MS 10000
#define REPORT_CAP (256 * 1024) /* a session step's report names its restored files */

struct capture {
    struct ci_buf buf;
    size_t cap;
    uint64_t total;
};

/* Reads what fd has; keeps at most c->cap bytes and counts all of them.
 * What it keeps goes to the run's sink too, for the stream that has one.
 * Returns false at EOF or error (the caller stops polling fd). */
static bool drain(int fd, struct capture *c, uint8_t *scratch, size_t size, ci_status *s,
                  const struct ci_output_sink *sink, enum ci_output_stream stream)
{
    ssize_t n = read(fd, scratch, size);
    if (n < 0)
        return errno == EINTR || errno == EAGAIN;
    if (n == 0)
        return false;
    c->total += (uint64_t)n;
    if (c->buf.len < c->cap) {
        size_t keep = (size_t)n < c->cap - c->buf.len ? (size_t)n : c->cap - c->buf.len;
        if (ci_buf_append(&c->buf, scratch, keep) != CI_OK)
            *s = CI_ERR_NOMEM;
        else if (sink && sink->write)
            sink->write(sink->ctx, stream, scratch, keep);
    }
    return true;
}

/* The code's end, the first time it is seen (mono: ci_mono_ms() then). */
static void mark_end(struct ci_sandbox_run *run, int64_t mono)
{
    if (run->t_end)
        return;
    run->t_end = mono;
    run->marks.end_us = ci_now_us();
}

static void kill_run(struct ci_sandbox_run *run, enum ci_sandbox_end why,
                     enum ci_sandbox_end *end)
{
    if (run->pid <= 0 || *end != CI_SANDBOX_EXITED)
        return;
    *end = why;
    run->t_end = 0; /* the end is the kill's */
    mark_end(run, ci_mono_ms());
    if (run->sb->ns) {
        /* Init kills and reaps everything and reports; if it has not within
         * the grace time, SIGKILL on init kills the whole pid namespace. */
        signal_init(run, SIG_STOP);
        run->kill_at = run->t_end + STOP_GRACE_MS;
    } else {
        /* The process group is the best we have (and the leader itself, in
         * case it has not called setsid() yet). */
        kill(run->pid, SIGKILL);
        kill(-run->pid, SIGKILL);
    }
}

/* The grace time is over and init is still there: kill it. */
static void kill_hard(struct ci_sandbox_run *run, int64_t now)
{
    if (run->pid > 0 && run->kill_at && now >= run->kill_at) {
        signal_init(run, SIGKILL);
        promote_keeper(run); /* without init's report we wait for its exit */
        run->kill_at = 0;
        run->killed_at = now;
    }
}

/* Reaps init (or the bare task, after killing its group) and returns its
 * rusage: everything it reaped is included. Bare mode: then the job's hook
 * kills what left the group, if the caller can (bare_hooks), so that
 * nothing of the task runs while its output is drained, its artifacts read
 * and its directory removed - as init's death does in namespace mode. */
static void reap(struct ci_sandbox_run *run, int *ret_status, struct rusage *ru)
{
    if (!run->sb->ns)
        kill(-run->pid, SIGKILL); /* the leader is a zombie: the group id is still ours */
    int st = 0;
    memset(ru, 0, sizeof(*ru));
    /* A zygote's child is reaped by its zygote: its DONE has the rusage. */
    while (!run->warm && wait4(run->pid, &st, __WALL, ru) < 0 && errno == EINTR)
        ;
    *ret_status = st;
    run->pid = 0;
    close_fd(&run->pidfd);
    if (!run->sb->ns)
        bare_task_reaped(run);
}

/* A cut output must not end inside a UTF-8 character: the result carries it
 * as a proto3 string, where the broken tail would turn into U+FFFD and grow
 * past the cap. Returns len without an incomplete last sequence (bytes that
 * are not UTF-8 at all are left as they are). */
static size_t trim_partial_utf8(const uint8_t *p, size_t len)
{
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        uint8_t c = p[len - back];
        if ((c & 0xc0) == 0x80)
            continue; /* a continuation byte: the lead is further back */
        size_t need = c >= 0xc2 && c <= 0xdf   ? 2
                      : c >= 0xe0 && c <= 0xef ? 3
                      : c >= 0xf0 && c <= 0xf4 ? 4
                                               : 1;
        return need > back ? len - back : len;
    }
    return len;
}

static void take_capture(struct capture *c, char **data, size_t *len, uint64_t *total,
                         ci_status *s)
{
    if (!c->buf.data && ci_buf_reserve(&c->buf, 0) != CI_OK) {
        *s = CI_ERR_NOMEM;
        return;
    }
    if (c->total > c->buf.len) {
        c->buf.len = trim_partial_utf8(c->buf.data, c->buf.len);
        c->buf.data[c->buf.len] = '\0';
    }
    *total = c->total;
    *data = (char *)ci_buf_steal(&c->buf, len);
}

/* Adds fd (if open) to the poll set; returns its index or -1. */
static int watch(struct pollfd *p, int *n, int fd, short events)
{
    if (fd < 0)
        return -1;
    p[*n] = (struct pollfd){.fd = fd, .events = events};
    return (*n)++;
}

/* What the control socket told the parent during a run. */
struct run_news {
    bool have_done;
    struct msg done;
    bool exec_failed; /* python3 could not be executed */
    bool broken;      /* another step failed after start */
    char why[256];
};

/* Reads one message from the control socket; closes it at EOF. */
static void read_news(struct ci_sandbox_run *run, struct run_news *news)
{
    struct msg m;
    ci_status s = recv_msg(run, 0, &m, NULL);
    if (s == CI_ERR_TIMEOUT)
        return;
    if (s != CI_OK) {
        close_fd(&run->sock); /* EOF: init is gone (or the bare task exec'd) */
        if (!news->have_done)
            promote_keeper(run); /* gone without a report: we wait for its exit */
        return;
    }
    if (m.type == MSG_DONE) {
        news->done = m;
        news->have_done = true;
        mark_end(run, ci_mono_ms());
    } else if (m.type == MSG_FAILED) {
        describe_failure(run->sb, &m, news->why, sizeof(news->why));
        if (m.step == STEP_EXEC)
            news->exec_failed = true;
        else
            news->broken = true;
    }
}

ci_status ci_sandbox_wait(struct ci_sandbox_run *run, struct ci_sandbox_result *ret)
{
    const struct ci_sandbox *sb = run->sb;
    const size_t scratch_size = 64 * 1024;
    uint8_t *scratch = malloc(scratch_size);
    if (!scratch) {
        run_kill_now(run);
        run_close(run);
        return CI_ERR_NOMEM;
    }
    struct capture out = {CI_BUF_INIT, sb->cfg->limits.max_output_bytes, 0};
    struct capture errc = {CI_BUF_INIT, sb->cfg->limits.max_output_bytes, 0};
    struct capture rep = {CI_BUF_INIT, REPORT_CAP, 0};
    enum ci_sandbox_end end = CI_SANDBOX_EXITED;
    struct run_news news = {0};
    int init_status = 0;
    struct rusage ru = {0};
    int64_t drain_until = 0;
    ci_status s = CI_OK;

    for (;;) {
        int64_t now = ci_mono_ms();
        if (run->pid > 0) {
            if (atomic_load(&run->cancel_requested) || s != CI_OK)
                kill_run(run, CI_SANDBOX_CANCELLED, &end);
            else if (now >= run->deadline)
                kill_run(run, CI_SANDBOX_TIMED_OUT, &end);
            kill_hard(run, now);
        }
        /* Without a pidfd, and after a kill, look for the exit directly. */
        if (run->pid > 0 && (run->pidfd < 0 || end != CI_SANDBOX_EXITED) && run_exited(run)) {
            mark_end(run, now);
            reap(run, &init_status, &ru);
            drain_until = ci_mono_ms() + DRAIN_MS; /* after reap(), which may sweep (bare) */
        }
        /* Init still there KILL_WAIT_MS after its SIGKILL: give up on it
         * (see KILL_WAIT_MS), with what was read until now. */
        if (run->pid > 0 && run->killed_at && now - run->killed_at >= KILL_WAIT_MS) {
            run->stuck = true;
            break;
        }
        bool pipes_open = run->out_fd >= 0 || run->err_fd >= 0 || run->rep_fd >= 0;
        if (run->pid == 0 && (!pipes_open || now >= drain_until))
            break;
        /* A warm init reports once it has reaped everything but the task's
         * keeper, before the task's memory is gone (src/zygote/main.c):
         * with its report and every pipe drained, the run has all it will
         * say. Its exit, and the cgroup's removal, wait for
         * ci_sandbox_run_free(). */
        if (run->warm && news.have_done && !pipes_open) {
            mark_end(run, now);
            break;
        }

        struct pollfd p[7];
        int n = 0;
        int i_out = watch(p, &n, run->out_fd, POLLIN);
        int i_err = watch(p, &n, run->err_fd, POLLIN);
        int i_rep = watch(p, &n, run->rep_fd, POLLIN);
        int i_code = watch(p, &n, run->code_fd, POLLOUT);
        int i_pid = watch(p, &n, run->pid > 0 ? run->pidfd : -1, POLLIN);
        int i_wake = watch(p, &n, run->wake_fd, POLLIN);
        int i_sock = watch(p, &n, run->sock, POLLIN);
        int64_t wait_ms = run->pid > 0 ? run->deadline - now : drain_until - now;
        if (run->pid > 0 && run->pidfd < 0 && wait_ms > 50)
            wait_ms = 50;
        if (run->pid > 0 && end != CI_SANDBOX_EXITED && wait_ms > 20)
            wait_ms = 20; /* killed: it is gone in a moment */
        if (run->sink.tick) {
            /* Output the sink holds back must go out on time: a line the
             * code flushed before it sleeps is not kept until it wakes. */
            int64_t due = run->sink.tick(run->sink.ctx);
            if (due >= 0 && due < wait_ms)
                wait_ms = due;
        }
        wait_ms = wait_ms < 0 ? 0 : wait_ms > 1000 ? 1000 : wait_ms;
        int r = poll(p, (nfds_t)n, (int)wait_ms);
        if (r < 0 && errno != EINTR) {
            news.broken = true;
            snprintf(news.why, sizeof(news.why), "poll failed: %s", strerror(errno));
            kill_run(run, CI_SANDBOX_CANCELLED, &end);
            continue;
        }
        if (r <= 0)
            continue;
        if (i_out >= 0 && p[i_out].revents &&
            !drain(run->out_fd, &out, scratch, scratch_size, &s, &run->sink, CI_OUTPUT_STDOUT))
            close_fd(&run->out_fd);
        if (i_err >= 0 && p[i_err].revents &&
            !drain(run->err_fd, &errc, scratch, scratch_size, &s, &run->sink, CI_OUTPUT_STDERR))
            close_fd(&run->err_fd);
        if (i_rep >= 0 && p[i_rep].revents &&
            !drain(run->rep_fd, &rep, scratch, scratch_size, &s, NULL, CI_OUTPUT_STDOUT))
            close_fd(&run->rep_fd);
        if (i_code >= 0 && p[i_code].revents)
            send_code(run);
        if (i_wake >= 0 && p[i_wake].revents) {
            uint64_t v;
            ssize_t rd = read(run->wake_fd, &v, sizeof(v));
            (void)rd; /* the flag is what counts */
        }
        if (i_sock >= 0 && p[i_sock].revents)
            read_news(run, &news);
        if (i_pid >= 0 && p[i_pid].revents && run->pid > 0) {
            mark_end(run, ci_mono_ms());
            reap(run, &init_status, &ru);
            drain_until = ci_mono_ms() + DRAIN_MS;
        }
    }
    /* Every process of the sandbox is gone (bare mode: its process group,
     * and what left it only when the job's bare_hooks swept it). A last
     * message may still sit in the socket. */
    while (run->sock >= 0 && !news.have_done) {
        int before = run->sock;
        bool had = news.have_done;
        read_news(run, &news);
        if (run->sock == before && news.have_done == had)
            break;
    }
    close_fd(&run->code_fd);
    free(scratch);
    /* The last output goes out now, not after the artifact walk. */
    if (run->sink.end)
        run->sink.end(run->sink.ctx);

    struct ci_sandbox_result r;
    memset(&r, 0, sizeof(r));
    r.end = end;
    r.exec_failed = news.exec_failed;
    if (sb->ns && news.have_done) {
        /* init's own accounting of what it reaped: exact for the task. */
        r.has_status = true;
        r.status = news.done.status;
        r.outcome.cpu_ms = (uint64_t)(news.done.utime_us + news.done.stime_us) / 1000;
        r.outcome.memory_mb = (uint32_t)((news.done.maxrss_kb + 1023) / 1024);
    } else {
        if (!sb->ns && end == CI_SANDBOX_EXITED) {
            r.has_status = true;
            r.status = init_status;
        }
        r.outcome.cpu_ms = (uint64_t)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000 +
                           (uint64_t)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000;
        r.outcome.memory_mb = (uint32_t)((ru.ru_maxrss + 1023) / 1024);
    }
    if (run->cg) {
        /* Everything in it is dead (or, stuck, cannot run): its counters
         * are final. */
        struct ci_cgroup_stats cs;
        ci_cgroup_stats(run->cg, &cs);
        r.cgroup = true;
        r.oom_killed = cs.oom_kills > 0;
        /* No report from init (it did not finish reaping within the grace
         * time on a busy machine, and was killed): the cgroup counted the
         * task's CPU time all the same. Without it a warm run would say 0. */
        if (!news.have_done && cs.has_cpu)
            r.outcome.cpu_ms = cs.cpu_usec / 1000;
        if (cs.has_peak) {
            r.cgroup_peak = true;
            r.outcome.memory_mb = (uint32_t)((cs.peak_bytes + (1 << 20) - 1) >> 20);
        }
        /* The cgroup's OOM killer took init (code that lowered its own OOM
         * score and kept its memory out of its own RSS, in a tmpfs): the
         * report is lost with it, but what happened is known - the task
         * went over its memory limit - and so is its CPU time. */
        if (end == CI_SANDBOX_EXITED && !r.has_status && !news.broken && cs.oom_kills > 0) {
            r.has_status = true;
            r.status = SIGKILL; /* a wait status: killed by SIGKILL */
            if (cs.has_cpu)
                r.outcome.cpu_ms = cs.cpu_usec / 1000;
        }
    }
    if (end == CI_SANDBOX_EXITED && !r.has_status && !news.broken) {
        news.broken = true;
        if (run->warm)
            snprintf(news.why, sizeof(news.why), "the sandbox's init ended without a report "
                     "(the warm runtime it came from may have died)");
        else
            snprintf(news.why, sizeof(news.why),
                     "the sandbox's init ended without a report (wait status 0x%x)",
                     (unsigned)init_status);
    }
    if (news.broken)
        r.end = CI_SANDBOX_BROKEN;
    if (run->stuck) {
        size_t n = strlen(news.why);
        snprintf(news.why + n, sizeof(news.why) - n,
                 "%sits processes did not exit within %d s of SIGKILL (frozen, or stuck in the "
                 "kernel); the worker stopped waiting for them", n ? "; " : "",
                 KILL_WAIT_MS / 1000);
        r.unreaped = true;
    }
    int64_t t_end = run->t_end ? run->t_end : ci_mono_ms();
    r.outcome.duration_ms = t_end > run->t_go ? (uint64_t)(t_end - run->t_go) : 0;
    snprintf(r.outcome.isolation, sizeof(r.outcome.isolation), "%s", sb->isolation);
    uint64_t rep_total = 0;
    take_capture(&out, &r.outcome.out, &r.outcome.out_len, &r.outcome.out_total, &s);
    take_capture(&errc, &r.outcome.err, &r.outcome.err_len, &r.outcome.err_total, &s);
    take_capture(&rep, &r.report, &r.report_len, &rep_total, &s);
    if (!s && (news.broken || news.exec_failed || r.unreaped) &&
        !(r.outcome.error = strdup(news.why)))
        s = CI_ERR_NOMEM;
    if (!s && run->ws_fd >= 0)
        s = session_collect(run, &r); /* first: the walk skips the restored files */
    if (!s && run->ws_fd >= 0)
        s = collect_artifacts(run, &r);
    if (!s && run->ws_fd >= 0)
        s = outputs_collect(run, &r); /* after: an image's artifact must be one */
    ci_buf_release(&out.buf);
    ci_buf_release(&errc.buf);
    ci_buf_release(&rep.buf);
    if (run->pid > 0)
        run_close_io(run); /* a warm init still on its way out, or stuck: see above */
    else
        run_close(run);
    if (s) {
        ci_sandbox_result_release(&r);
        return s;
    }
    run->marks.collected_us = ci_now_us();
    r.outcome.marks = run->marks;
    run->waited = true;
    run->peak_mb = r.outcome.memory_mb;
    *ret = r;
    return CI_OK;
}

void ci_sandbox_result_release(struct ci_sandbox_result *r)
{
    if (!r)
        return;
    ci_outcome_release(&r->outcome);
    free(r->report);
    free(r->artifact_note);
    memset(r, 0, sizeof(*r));
}

