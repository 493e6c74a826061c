/* log.c - one JSON object per line on stderr (log.h): time, level, event,
 * worker id, then the caller's fields; each line is written whole under a
 * lock. */
#include "core/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/util.h"

static struct {
    enum ci_log_level min;
    char worker[128];
    pthread_mutex_t lock;
} g_log = {CI_LOG_INFO, "", PTHREAD_MUTEX_INITIALIZER};

void ci_log_init(enum ci_log_level min, const char *worker_id)
{
    g_log.min = min;
    snprintf(g_log.worker, sizeof(g_log.worker), "%s", worker_id ? worker_id : "");
}

const char *const ci_log_level_names[] = {
    [CI_LOG_DEBUG] = "debug", [CI_LOG_INFO] = "info",    [CI_LOG_WARN] = "warn",
    [CI_LOG_ERROR] = "error", [CI_LOG_ERROR + 1] = NULL,
};

enum ci_log_level ci_log_level_from_name(const char *name)
{
    for (int l = CI_LOG_DEBUG; name && l <= CI_LOG_ERROR; l++)
        if (strcmp(name, ci_log_level_names[l]) == 0)
            return (enum ci_log_level)l;
    return CI_LOG_INFO;
}

static const char *level_name(enum ci_log_level l)
{
    return (unsigned)l <= CI_LOG_ERROR ? ci_log_level_names[l] : "info";
}

static void json_str(struct ci_buf *b, const char *s)
{
    ci_buf_append(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': ci_buf_append(b, "\\\"", 2); break;
        case '\\': ci_buf_append(b, "\\\\", 2); break;
        case '\n': ci_buf_append(b, "\\n", 2); break;
        case '\r': ci_buf_append(b, "\\r", 2); break;
        case '\t': ci_buf_append(b, "\\t", 2); break;
        default:
            if (*p < 0x20)
                ci_buf_appendf(b, "\\u%04x", *p);
            else
                ci_buf_append(b, p, 1);
        }
    }
    ci_buf_append(b, "\"", 1);
}

/* The start of a line: time, level, event, worker. */
static void line_start(struct ci_buf *b, enum ci_log_level level, const char *event)
{
    ci_buf_appendf(b, "{\"ts\":%lld,\"level\":\"%s\",\"event\":", (long long)ci_now_ms(),
                   level_name(level));
    json_str(b, event);
    if (g_log.worker[0]) {
        ci_buf_append(b, ",\"worker\":", 10);
        json_str(b, g_log.worker);
    }
}

/* Ends the line and writes it whole, under the lock. */
static void line_write(struct ci_buf *b)
{
    ci_buf_append(b, "}\n", 2);
    if (b->data) {
        pthread_mutex_lock(&g_log.lock);
        fwrite(b->data, 1, b->len, stderr);
        fflush(stderr);
        pthread_mutex_unlock(&g_log.lock);
    }
    ci_buf_release(b);
}

void ci_log_fields(enum ci_log_level level, const char *event, const struct ci_log_field *f,
                   size_t n)
{
    if (level < g_log.min)
        return;
    struct ci_buf b = CI_BUF_INIT;
    line_start(&b, level, event);
    for (size_t i = 0; i < n; i++) {
        if (!f[i].key)
            continue;
        ci_buf_append(&b, ",", 1);
        json_str(&b, f[i].key);
        ci_buf_append(&b, ":", 1);
        switch (f[i].type) {
        case CI_LOG_STR: json_str(&b, f[i].str ? f[i].str : ""); break;
        case CI_LOG_NUM: ci_buf_appendf(&b, "%lld", (long long)f[i].num); break;
        case CI_LOG_BOOL: ci_buf_appendf(&b, "%s", f[i].num ? "true" : "false"); break;
        case CI_LOG_STRV:
            ci_buf_append(&b, "[", 1);
            for (size_t j = 0; j < f[i].n_strv; j++) {
                if (j)
                    ci_buf_append(&b, ",", 1);
                json_str(&b, f[i].strv[j] ? f[i].strv[j] : "");
            }
            ci_buf_append(&b, "]", 1);
            break;
        }
    }
    line_write(&b);
}

static void vlog(enum ci_log_level level, const char *event, const char *num_key, int64_t num,
                 va_list ap)
{
    if (level < g_log.min)
        return;
    struct ci_buf b = CI_BUF_INIT;
    line_start(&b, level, event);
    if (num_key) {
        ci_buf_append(&b, ",", 1);
        json_str(&b, num_key);
        ci_buf_appendf(&b, ":%lld", (long long)num);
    }
    for (;;) {
        const char *k = va_arg(ap, const char *);
        if (!k)
            break;
        const char *v = va_arg(ap, const char *);
        ci_buf_append(&b, ",", 1);
        json_str(&b, k);
        ci_buf_append(&b, ":", 1);
        json_str(&b, v ? v : "");
    }
    line_write(&b);
}

void ci_log(enum ci_log_level level, const char *event, ...)
{
    va_list ap;
    va_start(ap, event);
    vlog(level, event, NULL, 0, ap);
    va_end(ap);
}

void ci_log_num(enum ci_log_level level, const char *event, const char *num_key, int64_t num, ...)
{
    va_list ap;
    va_start(ap, num);
    vlog(level, event, num_key, num, ap);
    va_end(ap);
}
