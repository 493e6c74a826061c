/* child.c - the helpers a sandbox process runs for itself before the
 * task's code: one copy for the cold init (init.c) and ci-zygote. See
 * child.h; nothing here allocates or locks. */
#include "sandbox/child.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "sandbox/sys.h"

void child_send(int sock, const struct msg *m)
{
    ssize_t r;
    do
        r = send(sock, m, sizeof(*m), MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
}

__attribute__((noreturn)) void child_fail(int sock, enum step step, int op, int err)
{
    struct msg m = {.type = MSG_FAILED, .step = step, .op = op, .err = err};
    child_send(sock, &m);
    _exit(127);
}

bool child_wait_byte(int sock)
{
    char c;
    ssize_t r;
    do
        r = recv(sock, &c, 1, 0);
    while (r < 0 && errno == EINTR);
    return r == 1;
}

int child_send_fds(int sock, const void *buf, size_t len, const int *fds, int n)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    union {
        char buf[CMSG_SPACE(FD_COUNT * sizeof(int))];
        struct cmsghdr align;
    } cm;
    memset(&cm, 0, sizeof(cm));
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                        .msg_controllen = CMSG_SPACE((size_t)n * sizeof(int))};
    struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
    memcpy(CMSG_DATA(c), fds, (size_t)n * sizeof(int));
    ssize_t r;
    do
        r = sendmsg(sock, &mh, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    return r == (ssize_t)len ? 0 : -1;
}

int child_send_with_fd(int sock, const struct msg *m, int fd)
{
    return child_send_fds(sock, m, sizeof(*m), &fd, 1);
}

int child_recv_fds(int sock, void *buf, size_t len, int *fds, int flags)
{
    union {
        char buf[CMSG_SPACE(FD_COUNT * sizeof(int))];
        struct cmsghdr align;
    } cm;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                        .msg_controllen = sizeof(cm.buf)};
    ssize_t n;
    do
        n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | flags);
    while (n < 0 && errno == EINTR && !(flags & MSG_DONTWAIT));
    if (n == 0)
        return 0;
    if (n < 0)
        return -1;
    int got = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (got < FD_COUNT)
                fds[got++] = fd;
            else
                close(fd);
        }
    }
    if (n != (ssize_t)len || got != FD_COUNT || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
        for (int i = 0; i < got; i++)
            close(fds[i]);
        return -1;
    }
    return 1;
}

int child_move_fds(const int *src, int keep)
{
    int base = FD_COUNT + 1;
    for (int i = 0; i < FD_COUNT; i++)
        if (src[i] >= base)
            base = src[i] + 1;
    if (keep >= base)
        base = keep + 1;
    int tmp[FD_COUNT + 1];
    for (int i = 0; i < FD_COUNT; i++)
        if ((tmp[i] = fcntl(src[i], F_DUPFD, base)) < 0)
            return -1;
    if (keep >= 0 && (tmp[FD_COUNT] = fcntl(keep, F_DUPFD, base)) < 0)
        return -1;
    for (int i = 0; i < FD_COUNT; i++)
        if (dup2(tmp[i], i) < 0)
            return -1;
    if (keep >= 0 && dup2(tmp[FD_COUNT], FD_COUNT) < 0)
        return -1;
    close_fds_from(keep >= 0 ? FD_COUNT + 1 : FD_COUNT);
    return 0;
}

/* The mount flags statfs() reports that a bind remount must keep: in a
 * user namespace the kernel refuses to clear locked ones. */
static unsigned long kept_mount_flags(const char *path)
{
    struct statfs st;
    if (statfs(path, &st) != 0)
        return 0;
    return (unsigned long)st.f_flags &
           (MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME | MS_NODIRATIME | MS_RELATIME);
}

static int remount_with(const char *path, uint64_t attrs, unsigned long ms_flags)
{
    if (sys_mount_setattr(path, attrs) == 0)
        return 0;
    if (errno != ENOSYS)
        return -1;
    return mount(NULL, path, NULL, MS_REMOUNT | MS_BIND | ms_flags | kept_mount_flags(path),
                 NULL);
}

/* Creates an empty file or directory to mount on. */
static int make_mountpoint(const char *path, bool dir)
{
    if (dir)
        return mkdir(path, 0755) == 0 || errno == EEXIST ? 0 : -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

int child_write_file(const char *path, const char *data, size_t len, int flags)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW | flags, 0644);
    if (fd < 0)
        return -1;
    while (len) {
        ssize_t w = write(fd, data, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        data += w;
        len -= (size_t)w;
    }
    return close(fd);
}

int child_run_op(const struct op *op)
{
    switch (op->kind) {
    case OP_TMPFS:
        if (make_mountpoint(op->path, true) != 0)
            return -1;
        return mount("tmpfs", op->path, "tmpfs", op->flags, op->data);
    case OP_DIR:
        return make_mountpoint(op->path, true);
    case OP_SYMLINK:
        return symlink(op->src, op->path);
    case OP_FILE:
        return child_write_file(op->path, op->data, op->data_len, O_CREAT | O_EXCL);
    case OP_BIND_RO:
        if (make_mountpoint(op->path, op->dir) != 0 ||
            mount(op->src, op->path, NULL, MS_BIND | MS_REC, NULL) != 0)
            return -1;
        return remount_with(op->path, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                            MS_RDONLY | MS_NOSUID | MS_NODEV);
    case OP_BIND_DEV:
        if (make_mountpoint(op->path, false) != 0 ||
            mount(op->src, op->path, NULL, MS_BIND, NULL) != 0)
            return -1;
        return remount_with(op->path, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
                            MS_NOSUID | MS_NOEXEC);
    case OP_PROC:
        if (make_mountpoint(op->path, true) != 0)
            return -1;
        return mount("proc", op->path, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    }
    errno = EINVAL;
    return -1;
}

enum step child_drop_privileges(uint64_t keep)
{
    for (int cap = 0; cap < 64; cap++)
        if (!((keep >> cap) & 1) && prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
            return STEP_DROP_CAPS;
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    if ((keep ? sys_capset_keep(keep) : sys_capset_zero()) != 0)
        return STEP_DROP_CAPS;
    for (int cap = 0; cap < 64; cap++)
        if (((keep >> cap) & 1) && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) != 0)
            return STEP_DROP_CAPS;
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return STEP_NO_NEW_PRIVS;
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    return STEP_NONE;
}

void child_add_rusage(struct msg *m, const struct rusage *ru)
{
    m->utime_us += (int64_t)ru->ru_utime.tv_sec * 1000000 + ru->ru_utime.tv_usec;
    m->stime_us += (int64_t)ru->ru_stime.tv_sec * 1000000 + ru->ru_stime.tv_usec;
    if (ru->ru_maxrss > m->maxrss_kb)
        m->maxrss_kb = ru->ru_maxrss;
}

void child_ready_then_go(int sock, int task_pidfd, uint64_t keep)
{
    int fds[2] = {open("/workspace", O_RDONLY | O_DIRECTORY | O_CLOEXEC), task_pidfd};
    if (fds[0] < 0)
        child_fail(sock, STEP_WORKSPACE, 0, errno);
    struct msg ready = {.type = MSG_READY};
    if (child_send_fds(sock, &ready, sizeof(ready), fds, task_pidfd >= 0 ? 2 : 1) != 0)
        _exit(1);
    close(fds[0]);
    enum step failed = child_drop_privileges(keep);
    if (failed)
        child_fail(sock, failed, 0, errno);
    if (!child_wait_byte(sock)) /* GO: the inputs are in place */
        _exit(1);
}

int child_limit_inotify(const char *instances, const char *watches)
{
    if (child_write_file("/proc/sys/user/max_inotify_instances", instances, strlen(instances),
                         0) != 0)
        return -1;
    return child_write_file("/proc/sys/user/max_inotify_watches", watches, strlen(watches), 0);
}

int child_read_small(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t len = read(fd, buf, size - 1);
    close(fd);
    if (len <= 0)
        return -1;
    buf[len] = '\0';
    return 0;
}

int child_stat_fields(const char *path, int first, int n, unsigned long long *ret)
{
    char buf[1024];
    if (child_read_small(path, buf, sizeof(buf)) != 0)
        return -1;
    char *p = strrchr(buf, ')'); /* the end of field 2: the name may hold any ')' */
    if (!p || first < 3)
        return -1;
    for (int field = 3; field < first + n; field++) { /* from field - 1 to field */
        while (*p && *p != ' ')
            p++;
        while (*p == ' ')
            p++;
        if (!*p)
            return -1;
        if (field >= first)
            ret[field - first] = strtoull(p, NULL, 10);
    }
    return 0;
}
