/* fake_zygote - a stand-in for ci-zygote (src/zygote/main.c) that speaks
 * just enough of the protocol (src/sandbox/sandbox_proto.h) to become READY
 * and then never starts a task: it reads SETUP, answers READY, and closes
 * the channel fds of every SPAWN it receives, so that the task's control
 * socket ends without a word. EOF on its request socket ends it.
 *
 * For tests/unit/test_sandbox.c (t_warm_deferred): a pool whose first
 * zygote is ready but whose first try fails. Exit status: 0 at EOF, 1 when
 * SETUP was not what it expected, 2 when READY could not be sent. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sandbox/sandbox_proto.h"

/* Room for one message and the fds it may carry (SETUP: 1, SPAWN: FD_COUNT). */
union control {
    char buf[CMSG_SPACE(FD_COUNT * sizeof(int))];
    struct cmsghdr align;
};

/* Closes every fd that came with mh; returns how many. */
static int close_fds(struct msghdr *mh)
{
    int n = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(mh); c; c = CMSG_NXTHDR(mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
            close(fd);
            n++;
        }
    }
    return n;
}

/* One message from the request socket into buf; its fds closed. Returns
 * its length, 0 at EOF, -1 on an error. */
static ssize_t receive(void *buf, size_t size)
{
    union control cm;
    struct iovec iov = {.iov_base = buf, .iov_len = size};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.buf,
                        .msg_controllen = sizeof(cm.buf)};
    ssize_t n;
    do
        n = recvmsg(ZYGOTE_FD_REQ, &mh, MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n > 0)
        close_fds(&mh);
    return n;
}

int main(void)
{
    /* Big enough for any message the pool sends (SPAWN is the largest). */
    static union {
        uint32_t type;
        struct zmsg_setup setup;
        struct zmsg_spawn spawn;
    } m;
    ssize_t n = receive(&m, sizeof(m));
    if (n != (ssize_t)sizeof(m.setup) || m.type != ZMSG_SETUP ||
        m.setup.version != ZYGOTE_PROTO_VERSION)
        return 1;
    struct zmsg_status st;
    memset(&st, 0, sizeof(st));
    st.type = ZMSG_READY;
    if (send(ZYGOTE_FD_REQ, &st, sizeof(st), MSG_NOSIGNAL) != (ssize_t)sizeof(st))
        return 2;
    while ((n = receive(&m, sizeof(m))) > 0)
        ; /* a SPAWN: its fds are closed, its task never starts */
    return 0;
}
