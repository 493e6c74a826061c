/* nats_test_server.h - a real nats-server for the broker's unit tests: one
 * per case, on a free port with a store directory of its own
 * (nats-server -js). A case without one skips (START). Also a raw nats.c
 * connection for what the broker does not offer. Static functions: include
 * it in one test program. */
#ifndef CI_NATS_TEST_SERVER_H
#define CI_NATS_TEST_SERVER_H

#include <errno.h>
#include <fcntl.h>
#include <nats/nats.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/config.h"
#include "nats/broker.h"
#include "testutil.h"

struct server {
    pid_t pid;
    int port;
    char dir[64];
    char url[64];
};

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof(a);
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &n) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Starts nats-server on s's port and store directory (again, after a case
 * killed it); false when it cannot fork. */
static bool server_spawn(struct server *s)
{
    const char *bin = getenv("NATS_SERVER") ? getenv("NATS_SERVER") : "nats-server";
    char port[16];
    snprintf(port, sizeof(port), "%d", s->port);
    s->pid = fork();
    if (s->pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(null, 2);
        execlp(bin, bin, "-js", "-a", "127.0.0.1", "-p", port, "-sd", s->dir, (char *)NULL);
        _exit(127);
    }
    return s->pid > 0;
}

/* false (the case skips) when no nats-server can be started here. */
static bool server_start(struct server *s)
{
    snprintf(s->dir, sizeof(s->dir), "/tmp/ci-test-nats-XXXXXX");
    if (!mkdtemp(s->dir))
        return false;
    s->port = free_port();
    snprintf(s->url, sizeof(s->url), "nats://127.0.0.1:%d", s->port);
    if (!server_spawn(s))
        return false;
    for (int i = 0; i < 100; i++) { /* up to 5 s */
        natsConnection *nc = NULL;
        if (natsConnection_ConnectTo(&nc, s->url) == NATS_OK) {
            natsConnection_Destroy(nc);
            return true;
        }
        int st;
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            s->pid = 0;
            return false;
        }
        sleep_ms(50);
    }
    return false;
}

static void server_stop(struct server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGTERM);
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
    if (!s->dir[0] || strncmp(s->dir, "/tmp/ci-test-nats-", 18) != 0)
        return;
    if (fork() == 0) { /* the case's own store directory */
        execlp("rm", "rm", "-rf", "--", s->dir, (char *)NULL);
        _exit(127);
    }
    wait(NULL);
}

static struct ci_config *config_for(const struct server *s)
{
    setenv("CI_NATS_URL", s->url, 1);
    struct ci_config *cfg = NULL;
    struct ci_error e = {{0}};
    if (ci_config_defaults(&cfg, &e) != CI_OK)
        fprintf(stderr, "config: %s\n", e.msg);
    return cfg;
}

#define START(srv)                                                                   \
    struct server srv = {0};                                                         \
    if (!server_start(&srv)) {                                                       \
        server_stop(&srv);                                                           \
        SKIP("no nats-server could be started");                                    \
    }

/* A raw nats.c connection and JetStream context, for what the broker does
 * not offer: an old stream, stream info, deleting a bucket. */
struct raw {
    natsConnection *nc;
    jsCtx *js;
};

static bool raw_open(struct raw *r, const char *url)
{
    return natsConnection_ConnectTo(&r->nc, url) == NATS_OK &&
           natsConnection_JetStream(&r->js, r->nc, NULL) == NATS_OK;
}

static void raw_close(struct raw *r)
{
    jsCtx_Destroy(r->js);
    natsConnection_Destroy(r->nc);
}

/* A worker's broker on cfg's server: connected, streams and consumers made;
 * NULL (said on stderr) when it cannot be. Inline: not every case file
 * uses it. */
static inline struct ci_broker *worker_broker(const struct ci_config *cfg)
{
    struct ci_broker *b = NULL;
    struct ci_error e = {{0}};
    if (ci_broker_connect(cfg, &b, &e) != CI_OK || ci_broker_setup(b, true, &e) != CI_OK) {
        fprintf(stderr, "broker: %s\n", e.msg);
        ci_broker_free(b);
        return NULL;
    }
    return b;
}

#endif
