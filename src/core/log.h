/* log.h - one JSON line per event on stderr. The only global of the project:
 * the minimum level and the worker id stamped on every line.
 *
 *   ci_log(CI_LOG_INFO, "task.done", "task_id", id, "status", "succeeded", NULL);
 *
 * Fields come as key/value string pairs ended by NULL; ci_log_kv() takes an
 * extra integer field. Task payloads (code, output, inputs) are never logged. */
#ifndef CI_LOG_H
#define CI_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum ci_log_level { CI_LOG_DEBUG, CI_LOG_INFO, CI_LOG_WARN, CI_LOG_ERROR };

/* One field of ci_log_fields: a string, a number, a boolean or a list of
 * strings (a JSON array). A field whose key is NULL is skipped, so that a
 * caller can leave out what does not apply. */
enum ci_log_type { CI_LOG_STR, CI_LOG_NUM, CI_LOG_BOOL, CI_LOG_STRV };
struct ci_log_field {
    const char *key;
    enum ci_log_type type;
    const char *str;
    int64_t num; /* CI_LOG_NUM; CI_LOG_BOOL: 0 or 1 */
    const char *const *strv;
    size_t n_strv;
};
#define CI_LOG_S(k, v) {.key = (k), .type = CI_LOG_STR, .str = (v)}
#define CI_LOG_N(k, v) {.key = (k), .type = CI_LOG_NUM, .num = (int64_t)(v)}
#define CI_LOG_B(k, v) {.key = (k), .type = CI_LOG_BOOL, .num = (v) ? 1 : 0}
#define CI_LOG_SV(k, v, n) {.key = (k), .type = CI_LOG_STRV, .strv = (v), .n_strv = (n)}

/* The levels' names, indexed by the enum and NULL-terminated: also the
 * config's allowed values of worker.log_level. */
extern const char *const ci_log_level_names[];
/* The level of a name in ci_log_level_names; CI_LOG_INFO for any other. */
enum ci_log_level ci_log_level_from_name(const char *name);

void ci_log_init(enum ci_log_level min, const char *worker_id);
void ci_log(enum ci_log_level level, const char *event, ...) __attribute__((sentinel));
/* Like ci_log, with one numeric field first. */
void ci_log_num(enum ci_log_level level, const char *event, const char *num_key, int64_t num, ...)
    __attribute__((sentinel));
/* One line with typed fields, in their order. */
void ci_log_fields(enum ci_log_level level, const char *event, const struct ci_log_field *fields,
                   size_t n);

#endif
