/* manifest.c - the runtime manifest (manifest.h): the versions read from
 * the runtime's Python, and the JSON of contract §18. */
#include "worker/manifest.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/util.h"

#define OUT_MAX (64 * 1024) /* of the script's stdout, and of its stderr */
/* The script reads metadata: this is far more than it needs, and far less
 * than a runaway interpreter could take from the worker's machine. */
#define SCRIPT_MEMORY_MAX (2048L * 1024 * 1024)

/* Ours, fixed: never a task's code. The metadata is cheap to read; a
 * package whose metadata is missing is imported for its __version__. */
static const char VERSIONS_SCRIPT[] =
    "import json, sys\n"
    "out = {'python': '%d.%d.%d' % sys.version_info[:3], 'packages': {}}\n"
    "try:\n"
    "    import importlib.metadata as md\n"
    "except Exception:\n"
    "    md = None\n"
    "for name in ('numpy', 'pandas', 'matplotlib', 'openpyxl'):\n"
    "    v = None\n"
    "    try:\n"
    "        v = md.version(name)\n"
    "    except Exception:\n"
    "        try:\n"
    "            v = __import__(name).__version__\n"
    "        except Exception:\n"
    "            v = None\n"
    "    if isinstance(v, str):\n"
    "        out['packages'][name] = v\n"
    "try:\n"
    "    import importlib.util\n"
    "    out['pip'] = importlib.util.find_spec('pip') is not None\n"
    "except Exception:\n"
    "    out['pip'] = False\n"
    "sys.stdout.write(json.dumps(out))\n";

/* ---- parsing ---------------------------------------------------------- */

static bool version_ok(const char *v)
{
    size_t n = strlen(v);
    if (n == 0 || n >= CI_MANIFEST_VERSION_MAX)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = v[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '+' || c == '-' || c == '_' || c == '!'))
            return false;
    }
    return true;
}

ci_status ci_manifest_parse_versions(const char *json, size_t len,
                                     struct ci_manifest_versions *ret, struct ci_error *err)
{
    if (len > OUT_MAX)
        return ci_error_set(err, CI_ERR_INVALID, "the version script wrote %zu bytes", len);
    json_error_t je;
    json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return ci_error_set(err, CI_ERR_INVALID, "the version script wrote no JSON object");
    }
    struct ci_manifest_versions v;
    memset(&v, 0, sizeof(v));
    ci_status r = CI_OK;
    json_t *py = json_object_get(o, "python");
    json_t *pkgs = json_object_get(o, "packages");
    if (!json_is_string(py) || !version_ok(json_string_value(py))) {
        r = ci_error_set(err, CI_ERR_INVALID, "the version script gave no Python version");
        goto out;
    }
    snprintf(v.python, sizeof(v.python), "%s", json_string_value(py));
    if (!json_is_object(pkgs)) {
        r = ci_error_set(err, CI_ERR_INVALID, "the version script gave no packages");
        goto out;
    }
    const char *name;
    json_t *val;
    json_object_foreach(pkgs, name, val) {
        if (v.n_packages == CI_MANIFEST_MAX_PACKAGES)
            break;
        /* One odd entry is left out; the rest (and Python's version) stand. */
        if (!version_ok(name) || !json_is_string(val) || !version_ok(json_string_value(val)))
            continue;
        struct ci_manifest_package *p = &v.packages[v.n_packages++];
        snprintf(p->name, sizeof(p->name), "%s", name);
        snprintf(p->version, sizeof(p->version), "%s", json_string_value(val));
    }
    v.pip = json_is_true(json_object_get(o, "pip"));
    v.known = true;
    *ret = v;
out:
    json_decref(o);
    return r;
}

/* ---- running the runtime's Python --------------------------------------- */

/* Reads what is there from fd into b (at most OUT_MAX); false at its end. */
static bool drain(int fd, struct ci_buf *b)
{
    char chunk[4096];
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0)
        return errno == EINTR || errno == EAGAIN;
    if (n == 0)
        return false;
    size_t room = b->len < OUT_MAX ? OUT_MAX - b->len : 0;
    /* Past the cap the rest is read and dropped (out of memory the same:
     * the parse then fails and says so). */
    ci_buf_append(b, chunk, (size_t)n < room ? (size_t)n : room);
    return true;
}

/* The last non-empty line of an error output, cut and made printable. */
static void last_line(const struct ci_buf *b, char *out, size_t n)
{
    size_t end = b->len;
    while (end > 0 && (b->data[end - 1] == '\n' || b->data[end - 1] == '\r'))
        end--;
    size_t start = end;
    while (start > 0 && b->data[start - 1] != '\n')
        start--;
    size_t k = 0;
    for (size_t i = start; i < end && k + 1 < n && k < 160; i++) {
        unsigned char c = (unsigned char)b->data[i];
        out[k++] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    out[k] = '\0';
}

void ci_manifest_read_versions(const char *python, int timeout_ms,
                               struct ci_manifest_versions *ret)
{
    memset(ret, 0, sizeof(*ret));
    CI_AUTOCLOSE int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    int out_p[2] = {-1, -1}, err_p[2] = {-1, -1};
    if (null_fd < 0 || pipe2(out_p, O_CLOEXEC) < 0 || pipe2(err_p, O_CLOEXEC) < 0) {
        snprintf(ret->unknown, sizeof(ret->unknown),
                 "the worker could not run %s to read the versions: %s", python,
                 strerror(errno));
        for (int i = 0; i < 2; i++) {
            if (out_p[i] >= 0)
                close(out_p[i]);
            if (err_p[i] >= 0)
                close(err_p[i]);
        }
        return;
    }
    /* Built before fork: the child of a threaded program only makes
     * system calls and execs. An environment of our own; -I ignores
     * PYTHON* anyway. Its own process group, so that whatever it starts
     * dies with it; limits on memory, CPU time, files and cores. */
    char *const argv[] = {(char *)python, "-I", "-B", "-c", (char *)VERSIONS_SCRIPT, NULL};
    char *const envp[] = {"PATH=/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/nonexistent",
                          "MPLBACKEND=Agg", "OPENBLAS_NUM_THREADS=1", NULL};
    rlim_t cpu_s = (rlim_t)(timeout_ms > 0 ? timeout_ms / 1000 + 1 : 1);
    const struct rlimit as = {SCRIPT_MEMORY_MAX, SCRIPT_MEMORY_MAX}, cpu = {cpu_s, cpu_s},
                        zero = {0, 0};
    pid_t pid = fork();
    if (pid == 0) {
        if (setpgid(0, 0) < 0 || setrlimit(RLIMIT_AS, &as) < 0 ||
            setrlimit(RLIMIT_CPU, &cpu) < 0 || setrlimit(RLIMIT_FSIZE, &zero) < 0 ||
            setrlimit(RLIMIT_CORE, &zero) < 0 || dup2(null_fd, 0) < 0 ||
            dup2(out_p[1], 1) < 0 || dup2(err_p[1], 2) < 0)
            _exit(127);
        execve(python, argv, envp);
        _exit(127);
    }
    if (pid > 0)
        setpgid(pid, pid); /* as the child does: no race with the kill below */
    int fork_errno = errno;
    close(out_p[1]);
    close(err_p[1]);
    CI_AUTOCLOSE int out_fd = out_p[0];
    CI_AUTOCLOSE int err_fd = err_p[0];
    if (pid < 0) {
        snprintf(ret->unknown, sizeof(ret->unknown),
                 "the worker could not run %s to read the versions: %s", python,
                 strerror(fork_errno));
        return;
    }
    CI_AUTOBUF struct ci_buf out = CI_BUF_INIT;
    CI_AUTOBUF struct ci_buf errs = CI_BUF_INIT;
    int64_t deadline = ci_mono_ms() + timeout_ms;
    bool out_open = true, err_open = true, timed_out = false, exited = false;
    bool lost = false; /* reaped by someone else (SIGCHLD ignored): no status */
    /* When it exits, whatever it left behind (a .pth that forks) is killed
     * with its group, so that the pipes end with what it wrote instead of
     * at the deadline. It is reaped only after that (WNOWAIT): its pid,
     * the group's id, cannot be reused meanwhile. */
    for (;;) {
        if (!exited) {
            siginfo_t si = {0};
            int w = waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT);
            lost = w < 0 && errno == ECHILD;
            exited = (w == 0 && si.si_pid == pid) || (w < 0 && errno != EINTR);
            if (exited && !lost)
                kill(-pid, SIGKILL);
        }
        if (!out_open && !err_open && exited)
            break;
        int64_t left = deadline - ci_mono_ms();
        if (left <= 0) {
            timed_out = !exited;
            break;
        }
        if (!out_open && !err_open) {
            struct timespec ts = {0, 10 * 1000000L};
            nanosleep(&ts, NULL);
            continue;
        }
        struct pollfd pf[2] = {{out_open ? out_fd : -1, POLLIN, 0},
                               {err_open ? err_fd : -1, POLLIN, 0}};
        int n = poll(pf, 2, (int)(left < 50 ? left : 50));
        if (n < 0 && errno != EINTR)
            break;
        if (n <= 0)
            continue;
        if (pf[0].revents && !drain(out_fd, &out))
            out_open = false;
        if (pf[1].revents && !drain(err_fd, &errs))
            err_open = false;
    }
    int st = 0;
    if (!lost) {
        /* The pid too: a child that left its group is ours until reaped. */
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
    }
    char why[200];
    last_line(&errs, why, sizeof(why));
    if (lost) {
        snprintf(ret->unknown, sizeof(ret->unknown),
                 "the exit status of %s could not be read (was SIGCHLD ignored?)", python);
        return;
    }
    if (timed_out) {
        snprintf(ret->unknown, sizeof(ret->unknown),
                 "%s did not say its versions within %d ms", python, timeout_ms);
        return;
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        snprintf(ret->unknown, sizeof(ret->unknown), "%s failed to say its versions (%s %d)%s%s",
                 python, WIFEXITED(st) ? "exit code" : "signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), why[0] ? ": " : "", why);
        return;
    }
    struct ci_error e = {{0}};
    if (ci_manifest_parse_versions(out.data ? (const char *)out.data : "", out.len, ret, &e)) {
        memset(ret, 0, sizeof(*ret));
        snprintf(ret->unknown, sizeof(ret->unknown), "%.200s", e.msg);
    }
}

/* ---- the JSON ----------------------------------------------------------- */

static json_t *num_str(uint64_t v)
{
    char s[32];
    snprintf(s, sizeof(s), "%" PRIu64, v);
    return json_string(s);
}

/* Whether the comma-separated isolation string names layer. */
static bool has_layer(const char *isolation, const char *layer)
{
    size_t n = strlen(layer);
    for (const char *p = isolation; p && *p;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == n && strncmp(p, layer, n) == 0)
            return true;
        p = comma ? comma + 1 : NULL;
    }
    return false;
}

static json_t *limits_json(const struct ci_config *c)
{
    json_t *l = json_object();
    if (!l)
        return NULL;
    int bad = 0;
    bad |= json_object_set_new(l, "defaultTimeoutMs", num_str(c->limits.default_timeout_ms));
    bad |= json_object_set_new(l, "maxTimeoutMs", num_str(c->limits.max_timeout_ms));
    bad |= json_object_set_new(l, "defaultMemoryMb", num_str(c->limits.default_memory_mb));
    bad |= json_object_set_new(l, "maxMemoryMb", num_str(c->limits.max_memory_mb));
    bad |= json_object_set_new(l, "maxCodeBytes", num_str(c->limits.max_code_bytes));
    bad |= json_object_set_new(l, "maxInputBytes", num_str(c->limits.max_input_bytes));
    bad |= json_object_set_new(l, "maxArtifactBytes", num_str(c->limits.max_artifact_bytes));
    bad |= json_object_set_new(l, "maxOutputBytes", num_str(c->limits.max_output_bytes));
    if (bad) {
        json_decref(l);
        return NULL;
    }
    return l;
}

static json_t *sessions_json(const struct ci_manifest *m)
{
    json_t *s = json_object();
    if (!s)
        return NULL;
    int bad = json_object_set_new(s, "available", json_boolean(m->sessions));
    if (m->sessions) {
        bad |= json_object_set_new(s, "idleS", num_str(m->cfg->sessions.idle_s));
        bad |= json_object_set_new(s, "maxStateMb", num_str(m->cfg->sessions.max_state_mb));
        bad |= json_object_set_new(
            s, "keeps", json_string("variables that pickle, modules, files under /workspace"));
        bad |= json_object_set_new(
            s, "drops", json_string("open files, sockets, generators, threads, figures"));
    } else {
        bad |= json_object_set_new(
            s, "why", json_string("sessions need the local provider (contract section 16)"));
    }
    if (bad) {
        json_decref(s);
        return NULL;
    }
    return s;
}

ci_status ci_manifest_encode(const struct ci_manifest *m, char **ret_json, size_t *ret_len,
                             struct ci_error *err)
{
    const struct ci_manifest_versions *v = m->versions;
    const char *iso = m->isolation ? m->isolation : "";
    json_t *o = json_object();
    if (!o)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    int bad = 0;
    bad |= json_object_set_new(o, "runtime", json_string(m->runtime ? m->runtime : ""));
    if (v && v->known) {
        json_t *p = json_object();
        for (size_t i = 0; p && i < v->n_packages; i++)
            bad |= json_object_set_new(p, v->packages[i].name,
                                       json_string(v->packages[i].version));
        bad |= json_object_set_new(o, "python", json_string(v->python));
        bad |= json_object_set_new(o, "packages", p);
    } else {
        /* Never guessed: clients must not promise what was not read. */
        bad |= json_object_set_new(
            o, "versionsUnknown",
            json_string(v && v->unknown[0] ? v->unknown : "the versions were not read"));
    }
    /* The network follows from the isolation: an empty network namespace
     * ("net") has none, no sandbox ("none") has the host's. Unknown until
     * the isolation is. Packages can be installed only with both. */
    if (iso[0]) {
        bool network = !has_layer(iso, "net");
        bad |= json_object_set_new(o, "network", json_boolean(network));
        bad |= json_object_set_new(o, "pip", json_boolean(network && v && v->known && v->pip));
        bad |= json_object_set_new(
            o, "inputs",
            json_string(network ? "./NAME in the working directory (a private temporary "
                                  "directory of the worker's machine)"
                                : "./NAME in the working directory /workspace"));
    } else {
        bad |= json_object_set_new(o, "inputs",
                                   json_string("./NAME in the working directory"));
    }
    bad |= json_object_set_new(o, "limits", limits_json(m->cfg));
    json_t *arts = json_array();
    bad |= json_array_append_new(arts, json_string("image/png"));
    bad |= json_array_append_new(arts, json_string("text/csv"));
    bad |= json_object_set_new(o, "artifacts", arts);
    bad |= json_object_set_new(o, "sessions", sessions_json(m));
    bad |= json_object_set_new(o, "isolation", json_string(iso));
    bad |= json_object_set_new(o, "provider", json_string(m->provider ? m->provider : ""));
    bad |= json_object_set_new(o, "worker", json_string(m->worker ? m->worker : ""));
    bad |= json_object_set_new(o, "version", json_string(m->version ? m->version : ""));
    bad |= json_object_set_new(o, "atMs", num_str((uint64_t)(m->at_ms > 0 ? m->at_ms : 0)));
    char *text = bad ? NULL : json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!text) /* json_string refuses what is not UTF-8; all ours is ASCII */
        return ci_error_set(err, CI_ERR_INVALID, "cannot encode the runtime manifest");
    *ret_len = strlen(text);
    *ret_json = text;
    return CI_OK;
}
