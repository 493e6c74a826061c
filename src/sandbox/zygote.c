/* zygote.c - the warm pool: starts, feeds, replaces and rotates zygotes.
 * See zygote.h for what it promises and src/zygote/main.c for a zygote. */
#include "sandbox/zygote.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sandbox/sandbox_proto.h"
#include "sandbox/sched.h"
#include "core/util.h"

#define BACKOFF_MIN_MS 200
#define BACKOFF_MAX_MS 30000
#define TICK_MS 1000

enum zstate { Z_STARTING, Z_READY, Z_RETIRING };

struct zygote {
    struct ci_zygote_proc proc;
    enum zstate state;
    uint64_t spawned;            /* tasks handed to it */
    int64_t started_at;          /* ci_mono_ms() of the launch */
    bool replaced;               /* a replacement was started for it */
    char failure[480];           /* its FAILED sentence, or "" */
    char err_tail[480];          /* the end of its stderr */
    size_t err_len;
    struct zygote *next;
};

struct ci_zygote_pool {
    unsigned size, rotate_after, replace_at;
    uint32_t start_timeout_ms;
    int setup_fd; /* a sealed memfd with the SETUP plan, shared by every zygote */
    uint64_t setup_len;
    ci_status (*launch)(void *ctx, struct ci_zygote_proc *ret, struct ci_error *err);
    void (*reaped)(void *ctx, const struct ci_zygote_proc *proc);
    void *launch_ctx;

    pthread_mutex_t mu;
    pthread_cond_t changed;       /* a zygote became ready or failed */
    struct zygote *list;          /* added and removed by the pool's thread only */
    int wake_fd;
    pthread_t thread;
    bool thread_started, stop;
    unsigned failures_in_a_row;
    int64_t retry_at;             /* no launch before this (backoff) */
    unsigned rr;                  /* round robin among the ready ones */
    struct ci_zygote_stats st;    /* counters; ready and pids are computed */
};

static int sys_pidfd_send_signal(int pidfd, int sig)
{
    return (int)syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0);
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void wake(struct ci_zygote_pool *p)
{
    uint64_t one = 1;
    ssize_t w = write(p->wake_fd, &one, sizeof(one));
    (void)w; /* a full counter still wakes the thread */
}

/* ---------------------------------------------------------------------- */
/* One zygote                                                              */
/* ---------------------------------------------------------------------- */

static void zygote_kill(struct zygote *z)
{
    if (z->proc.pidfd >= 0)
        sys_pidfd_send_signal(z->proc.pidfd, SIGKILL);
}

/* Reaps z (it has exited, or was just killed) and frees it; the launcher
 * hears of it (reaped) once every process the zygote started is gone. */
static void zygote_free(struct ci_zygote_pool *p, struct zygote *z, int *ret_status)
{
    int st = 0;
    if (z->proc.pid > 0) {
        while (waitpid(z->proc.pid, &st, __WALL) < 0 && errno == EINTR)
            ;
        if (p->reaped)
            p->reaped(p->launch_ctx, &z->proc);
    }
    if (ret_status)
        *ret_status = st;
    close_fd(&z->proc.pidfd);
    close_fd(&z->proc.sock);
    close_fd(&z->proc.err_fd);
    close_fd(&z->proc.init_fd);
    free(z);
}

static ci_status send_setup(struct ci_zygote_pool *p, struct zygote *z, struct ci_error *err)
{
    struct zmsg_setup m = {.type = ZMSG_SETUP, .version = ZYGOTE_PROTO_VERSION,
                           .size = p->setup_len};
    struct iovec iov = {.iov_base = &m, .iov_len = sizeof(m)};
    union {
        char buf[CMSG_SPACE(2 * sizeof(int))];
        struct cmsghdr align;
    } cm;
    memset(&cm, 0, sizeof(cm));
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                        .msg_controllen = sizeof(cm.buf)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    int fds[2] = {p->setup_fd, z->proc.init_fd};
    if (fds[1] < 0)
        return ci_error_set(err, CI_ERR_SYS, "the zygote has no program for its tasks' init");
    memcpy(CMSG_DATA(c), fds, sizeof(fds));
    if (sendmsg(z->proc.sock, &mh, MSG_NOSIGNAL) != (ssize_t)sizeof(m))
        return ci_error_errno(err, CI_ERR_SYS, errno, "cannot send the zygote its setup");
    close_fd(&z->proc.init_fd); /* the zygote has its own now */
    return CI_OK;
}

/* Keeps the last bytes of what the zygote writes to stderr. */
static void drain_stderr(struct zygote *z)
{
    char buf[4096];
    ssize_t n = read(z->proc.err_fd, buf, sizeof(buf));
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        close_fd(&z->proc.err_fd);
        return;
    }
    size_t keep = sizeof(z->err_tail) - 1;
    size_t add = (size_t)n > keep ? keep : (size_t)n;
    const char *src = buf + ((size_t)n - add);
    if (z->err_len + add > keep) {
        size_t drop = z->err_len + add - keep;
        memmove(z->err_tail, z->err_tail + drop, z->err_len - drop);
        z->err_len -= drop;
    }
    memcpy(z->err_tail + z->err_len, src, add);
    z->err_len += add;
    z->err_tail[z->err_len] = '\0';
}

/* The zygote's READY or FAILED. */
static void read_status(struct ci_zygote_pool *p, struct zygote *z)
{
    struct zmsg_status s;
    ssize_t n = recv(z->proc.sock, &s, sizeof(s), MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n != (ssize_t)sizeof(s) || (s.type != ZMSG_READY && s.type != ZMSG_FAILED)) {
        if (!z->failure[0])
            snprintf(z->failure, sizeof(z->failure), "%s",
                     n == 0 ? "it closed its socket before it was ready"
                            : "it sent a malformed status");
        zygote_kill(z);
        return;
    }
    s.text[sizeof(s.text) - 1] = '\0';
    if (s.type == ZMSG_FAILED) {
        snprintf(z->failure, sizeof(z->failure), "%s", s.text[0] ? s.text : "it failed");
        zygote_kill(z);
        return;
    }
    z->state = Z_READY;
    p->st.became_ready++;
    p->st.rss_kb = s.rss_kb;
    p->st.huge_kb = s.huge_kb;
    p->st.collapsed_kb = s.collapsed_kb;
    p->st.collapse_err = s.collapse_err;
    p->failures_in_a_row = 0;
    pthread_cond_broadcast(&p->changed);
}

/* ---------------------------------------------------------------------- */
/* The pool's thread                                                       */
/* ---------------------------------------------------------------------- */

static void record_failure(struct ci_zygote_pool *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void record_failure(struct ci_zygote_pool *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->st.last_failure, sizeof(p->st.last_failure), fmt, ap);
    va_end(ap);
    p->st.failed++;
    p->failures_in_a_row++;
    unsigned shift = p->failures_in_a_row - 1 < 8 ? p->failures_in_a_row - 1 : 8;
    int64_t delay = (int64_t)BACKOFF_MIN_MS << shift;
    p->retry_at = ci_mono_ms() + (delay > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : delay);
    pthread_cond_broadcast(&p->changed);
}

/* Launches one zygote (the lock is released meanwhile: the launch builds a
 * whole sandbox root). */
static void launch_one(struct ci_zygote_pool *p)
{
    struct zygote *z = calloc(1, sizeof(*z));
    if (!z) {
        record_failure(p, "out of memory");
        return;
    }
    z->proc.pidfd = z->proc.sock = z->proc.err_fd = z->proc.init_fd = -1;
    z->state = Z_STARTING;
    z->started_at = ci_mono_ms();
    p->st.started++;
    pthread_mutex_unlock(&p->mu);
    struct ci_error err = {{0}};
    ci_status s = p->launch(p->launch_ctx, &z->proc, &err);
    if (!s)
        s = send_setup(p, z, &err);
    if (!s && z->proc.err_fd >= 0)
        fcntl(z->proc.err_fd, F_SETFL, O_NONBLOCK);
    pthread_mutex_lock(&p->mu);
    if (s) {
        zygote_kill(z);
        zygote_free(p, z, NULL);
        record_failure(p, "%s", err.msg);
        return;
    }
    z->next = p->list;
    p->list = z;
}

/* Zygotes that will keep taking tasks: starting, or ready and not replaced. */
static unsigned count_fresh(const struct ci_zygote_pool *p, bool ready_only)
{
    unsigned n = 0;
    for (const struct zygote *z = p->list; z; z = z->next)
        if ((z->state == Z_READY && !z->replaced) || (!ready_only && z->state == Z_STARTING))
            n++;
    return n;
}

/* Retires a replaced zygote once enough fresh ones are ready: no more tasks,
 * EOF on its socket; it exits after its last child. */
static void retire_replaced(struct ci_zygote_pool *p)
{
    unsigned fresh_ready = count_fresh(p, true);
    for (struct zygote *z = p->list; z; z = z->next) {
        if (z->state != Z_READY || !z->replaced)
            continue;
        if (fresh_ready >= p->size || (fresh_ready >= 1 && z->spawned >= p->rotate_after)) {
            z->state = Z_RETIRING;
            shutdown(z->proc.sock, SHUT_WR);
            p->st.retired++;
        }
    }
}

/* A zygote's process ended: count it and forget it. */
static void zygote_gone(struct ci_zygote_pool *p, struct zygote **link)
{
    struct zygote *z = *link;
    *link = z->next;
    enum zstate was = z->state;
    char why[480];
    snprintf(why, sizeof(why), "%s", z->failure[0] ? z->failure : z->err_tail);
    int st = 0;
    zygote_free(p, z, &st);
    if (was == Z_STARTING) {
        char ws[64];
        if (WIFSIGNALED(st))
            snprintf(ws, sizeof(ws), "killed by signal %d", WTERMSIG(st));
        else
            snprintf(ws, sizeof(ws), "exit status %d", WEXITSTATUS(st));
        record_failure(p, "the zygote ended before it was ready (%s)%s%.400s", ws,
                       why[0] ? ": " : "", why);
    } else if (was == Z_READY) {
        p->st.crashed++;
    }
}

static void *pool_thread(void *arg)
{
    struct ci_zygote_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        int64_t now = ci_mono_ms();
        retire_replaced(p);
        if (count_fresh(p, false) < p->size && now >= p->retry_at) {
            launch_one(p);
            continue; /* the lock was released: look again */
        }
        /* The replacement of a zygote halfway through its tasks. */
        bool want = false;
        for (struct zygote *z = p->list; z; z = z->next)
            if (z->state == Z_READY && !z->replaced && z->spawned >= p->replace_at) {
                z->replaced = true;
                want = true;
            }
        if (want)
            continue;

        size_t n = 0, cap = 1;
        for (struct zygote *z = p->list; z; z = z->next)
            cap += 3;
        struct pollfd *pf = calloc(cap, sizeof(*pf));
        struct zygote **who = calloc(cap, sizeof(*who));
        enum { W_PID, W_ERR, W_SOCK } *what = calloc(cap, sizeof(*what));
        if (!pf || !who || !what) {
            free(pf);
            free(who);
            free(what);
            pthread_mutex_unlock(&p->mu);
            usleep(100 * 1000);
            pthread_mutex_lock(&p->mu);
            continue;
        }
        pf[n++] = (struct pollfd){.fd = p->wake_fd, .events = POLLIN};
        int timeout = TICK_MS;
        for (struct zygote *z = p->list; z; z = z->next) {
            pf[n] = (struct pollfd){.fd = z->proc.pidfd, .events = POLLIN};
            what[n] = W_PID;
            who[n++] = z;
            if (z->proc.err_fd >= 0) {
                pf[n] = (struct pollfd){.fd = z->proc.err_fd, .events = POLLIN};
                what[n] = W_ERR;
                who[n++] = z;
            }
            if (z->state == Z_STARTING) {
                pf[n] = (struct pollfd){.fd = z->proc.sock, .events = POLLIN};
                what[n] = W_SOCK;
                who[n++] = z;
                int64_t left = z->started_at + p->start_timeout_ms - now;
                if (left <= 0) {
                    snprintf(z->failure, sizeof(z->failure),
                             "it did not become ready within %u s", p->start_timeout_ms / 1000);
                    zygote_kill(z);
                } else if (left < timeout) {
                    timeout = (int)left;
                }
            }
        }
        if (count_fresh(p, false) < p->size && p->retry_at > now && p->retry_at - now < timeout)
            timeout = (int)(p->retry_at - now);
        pthread_mutex_unlock(&p->mu);
        int r = poll(pf, (nfds_t)n, timeout);
        pthread_mutex_lock(&p->mu);
        if (r > 0) {
            if (pf[0].revents) {
                uint64_t v;
                ssize_t rd = read(p->wake_fd, &v, sizeof(v));
                (void)rd;
            }
            /* Only this thread removes zygotes: every pointer in who is
             * valid until the exits are handled, last. */
            for (size_t i = 1; i < n; i++) {
                struct zygote *z = who[i];
                if (!pf[i].revents)
                    continue;
                if (what[i] == W_ERR && z->proc.err_fd >= 0)
                    drain_stderr(z);
                else if (what[i] == W_SOCK && z->state == Z_STARTING)
                    read_status(p, z);
            }
            for (size_t i = 1; i < n; i++) {
                if (!pf[i].revents || what[i] != W_PID)
                    continue;
                for (struct zygote **link = &p->list; *link; link = &(*link)->next)
                    if (*link == who[i]) {
                        if (who[i]->proc.err_fd >= 0)
                            drain_stderr(who[i]); /* its last words */
                        zygote_gone(p, link);
                        break;
                    }
            }
        }
        free(pf);
        free(who);
        free(what);
    }
    /* Stopping: every zygote dies, and with it whatever it still runs. Its
     * exit waits for its spares and keepers, some at SCHED_IDLE: not for
     * long. */
    while (p->list) {
        struct zygote *z = p->list;
        p->list = z->next;
        zygote_kill(z);
        if (z->proc.pid > 0)
            sched_promote_idle(z->proc.pid, -1, 2);
        zygote_free(p, z, NULL);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* ---------------------------------------------------------------------- */
/* The interface                                                           */
/* ---------------------------------------------------------------------- */

static ci_status make_setup_fd(struct ci_zygote_pool *p, const void *data, size_t len,
                               struct ci_error *err)
{
    if (len < sizeof(struct zsetup_head) || len > ZYGOTE_SETUP_MAX)
        return ci_error_set(err, CI_ERR_INVALID, "the zygote setup is %zu bytes", len);
    p->setup_fd = memfd_create("ci-zygote-setup", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (p->setup_fd < 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "memfd_create");
    if (ci_write_all(p->setup_fd, data, len) != CI_OK ||
        fcntl(p->setup_fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK |
                                            F_SEAL_SEAL) != 0)
        return ci_error_errno(err, CI_ERR_SYS, errno, "cannot write the zygote setup");
    p->setup_len = len;
    return CI_OK;
}

void ci_zygote_pool_free(struct ci_zygote_pool *p)
{
    if (!p)
        return;
    if (p->thread_started) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_mutex_unlock(&p->mu);
        wake(p);
        pthread_join(p->thread, NULL);
    }
    close_fd(&p->wake_fd);
    close_fd(&p->setup_fd);
    pthread_cond_destroy(&p->changed);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

ci_status ci_zygote_pool_new(const struct ci_zygote_pool_config *cfg,
                             struct ci_zygote_pool **ret, struct ci_error *err)
{
    if (!cfg->launch || cfg->size < 1 || cfg->size > CI_ZYGOTE_MAX_POOL || cfg->rotate_after < 1)
        return ci_error_set(err, CI_ERR_INVALID, "a warm pool needs 1 to %d zygotes and "
                            "rotate_after >= 1", CI_ZYGOTE_MAX_POOL);
    struct ci_zygote_pool *p = calloc(1, sizeof(*p));
    if (!p)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    p->setup_fd = p->wake_fd = -1;
    p->size = cfg->size;
    p->rotate_after = cfg->rotate_after;
    p->replace_at = cfg->rotate_after * 3 / 4 > 0 ? cfg->rotate_after * 3 / 4 : 1;
    p->start_timeout_ms = cfg->start_timeout_ms ? cfg->start_timeout_ms : 60000;
    p->launch = cfg->launch;
    p->reaped = cfg->reaped;
    p->launch_ctx = cfg->launch_ctx;
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->changed, &ca);
    pthread_condattr_destroy(&ca);
    ci_status s = make_setup_fd(p, cfg->setup, cfg->setup_len, err);
    if (!s) {
        p->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (p->wake_fd < 0)
            s = ci_error_errno(err, CI_ERR_SYS, errno, "eventfd");
    }
    if (!s) {
        int e = pthread_create(&p->thread, NULL, pool_thread, p);
        if (e)
            s = ci_error_errno(err, CI_ERR_SYS, e, "cannot start the warm pool's thread");
        else
            p->thread_started = true;
    }
    if (s) {
        ci_zygote_pool_free(p);
        return s;
    }
    /* The first zygote, ready or failed. */
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += p->start_timeout_ms / 1000 + 5;
    pthread_mutex_lock(&p->mu);
    while (p->st.became_ready == 0 && p->st.failed == 0)
        if (pthread_cond_timedwait(&p->changed, &p->mu, &until) == ETIMEDOUT)
            break;
    bool ok = p->st.became_ready > 0;
    char why[480];
    snprintf(why, sizeof(why), "%s", p->st.last_failure[0] ? p->st.last_failure
                                                           : "it did not become ready in time");
    pthread_mutex_unlock(&p->mu);
    if (!ok) {
        ci_zygote_pool_free(p);
        return ci_error_set(err, CI_ERR_UNSUPPORTED, "the warm runtime did not start: %s", why);
    }
    *ret = p;
    return CI_OK;
}

/* The zygote for the next task, or NULL: fresh ones first, in turn; a
 * replaced one only while no fresh one is ready. */
static struct zygote *pick(struct ci_zygote_pool *p)
{
    struct zygote *fresh[CI_ZYGOTE_MAX_POOL + 1];
    size_t n = 0;
    struct zygote *old = NULL;
    for (struct zygote *z = p->list; z; z = z->next) {
        if (z->state != Z_READY)
            continue;
        if (!z->replaced && n < sizeof(fresh) / sizeof(fresh[0]))
            fresh[n++] = z;
        else if (z->replaced && (!old || z->spawned < old->spawned))
            old = z;
    }
    if (n)
        return fresh[p->rr++ % n];
    return old;
}

ci_status ci_zygote_pool_spawn(struct ci_zygote_pool *p, const void *req, size_t len,
                               const int *fds, size_t n_fds, struct ci_error *err)
{
    if (n_fds == 0 || n_fds > FD_COUNT)
        return ci_error_set(err, CI_ERR_INVALID, "a task has %d channel fds", FD_COUNT);
    struct iovec iov = {.iov_base = (void *)req, .iov_len = len};
    union {
        char buf[CMSG_SPACE(FD_COUNT * sizeof(int))];
        struct cmsghdr align;
    } cm;
    memset(&cm, 0, sizeof(cm));
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                        .msg_controllen = CMSG_SPACE(n_fds * sizeof(int))};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(n_fds * sizeof(int));
    memcpy(CMSG_DATA(c), fds, n_fds * sizeof(int));

    pthread_mutex_lock(&p->mu);
    struct zygote *z = pick(p);
    if (!z) {
        char why[480];
        snprintf(why, sizeof(why), "%s", p->st.last_failure);
        pthread_mutex_unlock(&p->mu);
        return ci_error_set(err, CI_ERR_UNSUPPORTED, "no warm runtime is ready%s%.400s",
                            why[0] ? ": " : "", why);
    }
    ssize_t w;
    do
        w = sendmsg(z->proc.sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (w < 0 && errno == EINTR);
    int e = errno;
    if (w != (ssize_t)len) {
        pthread_mutex_unlock(&p->mu);
        return ci_error_errno(err, CI_ERR_UNSUPPORTED, w < 0 ? e : EIO,
                              "the warm runtime did not take the task");
    }
    z->spawned++;
    p->st.spawned++;
    if (z->spawned > p->rotate_after)
        p->st.overdue++;
    bool poke = (!z->replaced && z->spawned >= p->replace_at) ||
                (z->replaced && z->spawned >= p->rotate_after);
    pthread_mutex_unlock(&p->mu);
    if (poke)
        wake(p);
    return CI_OK;
}

void ci_zygote_pool_stats(struct ci_zygote_pool *p, struct ci_zygote_stats *ret)
{
    pthread_mutex_lock(&p->mu);
    *ret = p->st;
    ret->ready = 0;
    memset(ret->pids, 0, sizeof(ret->pids));
    for (struct zygote *z = p->list; z; z = z->next)
        if (z->state == Z_READY && ret->ready < CI_ZYGOTE_MAX_POOL - 1)
            ret->pids[ret->ready++] = z->proc.pid;
    pthread_mutex_unlock(&p->mu);
}
