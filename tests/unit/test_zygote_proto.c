/* ci-zygote refuses a worker of another build: a SETUP whose protocol
 * version is not its own ends it with FAILED, before it imports anything
 * (src/zygote/main.c read_setup; ZYGOTE_PROTO_VERSION). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sandbox/sandbox_proto.h"
#include "testutil.h"

/* Starts ci-zygote with fd ZYGOTE_FD_REQ its end of a SOCK_SEQPACKET pair;
 * returns its pid, *ret_sock our end. */
static pid_t zygote_start(int *ret_sock)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        /* dup2() onto itself would keep close-on-exec: clear it then. */
        if (sv[1] == ZYGOTE_FD_REQ ? fcntl(sv[1], F_SETFD, 0) != 0
                                   : dup2(sv[1], ZYGOTE_FD_REQ) != ZYGOTE_FD_REQ)
            _exit(127);
        char *argv[] = {(char *)CI_ZYGOTE_PATH, NULL};
        char *envp[] = {(char *)"PATH=/usr/bin:/bin", NULL};
        execve(CI_ZYGOTE_PATH, argv, envp);
        _exit(127);
    }
    close(sv[1]);
    *ret_sock = sv[0];
    return pid;
}

/* Sends a SETUP of version with a memfd of size bytes and an fd of /bin/sh
 * (what a real one carries: the plan, ci-zygote-init). */
static int send_setup(int sock, uint32_t version)
{
    int fds[2] = {memfd_create("setup", MFD_CLOEXEC), open("/bin/sh", O_RDONLY | O_CLOEXEC)};
    if (fds[0] < 0 || fds[1] < 0)
        return -1;
    struct zmsg_setup m = {.type = ZMSG_SETUP, .version = version, .size = 0};
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
    memcpy(CMSG_DATA(c), fds, sizeof(fds));
    ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);
    close(fds[0]);
    close(fds[1]);
    return n == (ssize_t)sizeof(m) ? 0 : -1;
}

/* The status the zygote sends (30 s at most); its type, 0 if none. */
static uint32_t recv_status(int sock, struct zmsg_status *st)
{
    struct pollfd p = {.fd = sock, .events = POLLIN};
    memset(st, 0, sizeof(*st));
    if (poll(&p, 1, 30000) != 1 || recv(sock, st, sizeof(*st), 0) != (ssize_t)sizeof(*st))
        return 0;
    st->text[sizeof(st->text) - 1] = '\0';
    return st->type;
}

static void refused(uint32_t version)
{
    int sock = -1;
    pid_t pid = zygote_start(&sock);
    REQUIRE(pid > 0);
    CHECK(send_setup(sock, version) == 0);
    struct zmsg_status st;
    CHECK(recv_status(sock, &st) == ZMSG_FAILED);
    CHECK(st.err == EPROTO);
    char want[64];
    snprintf(want, sizeof(want), "setup version %u", version);
    CHECK_CONTAINS(st.text, want);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0);
    close(sock);
}

static void t_older_worker(void)
{
    refused(ZYGOTE_PROTO_VERSION - 1);
}

static void t_newer_worker(void)
{
    refused(ZYGOTE_PROTO_VERSION + 1);
}

/* Its own version passes the check: what fails then is the empty plan. */
static void t_own_version(void)
{
    int sock = -1;
    pid_t pid = zygote_start(&sock);
    REQUIRE(pid > 0);
    CHECK(send_setup(sock, ZYGOTE_PROTO_VERSION) == 0);
    struct zmsg_status st;
    CHECK(recv_status(sock, &st) == ZMSG_FAILED);
    CHECK(strstr(st.text, "setup version") == NULL);
    fprintf(stderr, "own version, empty plan: %s\n", st.text);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid);
    close(sock);
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (!CI_ZYGOTE_PATH[0]) {
        fprintf(stderr, "\n*** SKIPPED: no ci-zygote in this build (no Python headers)\n");
        return T_SKIP_RC;
    }
    static const struct t_case cases[] = {T(t_older_worker), T(t_newer_worker), T(t_own_version)};
    size_t n = sizeof(cases) / sizeof(cases[0]);
    struct t_case sel[sizeof(cases) / sizeof(cases[0])];
    int n_sel = t_select(argc, argv, cases, n, sel);
    if (n_sel < 0)
        return 1;
    return t_run(sel, (size_t)n_sel);
}
