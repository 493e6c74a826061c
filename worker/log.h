/* log.h - one JSON line per event on stderr. The only global of the project:
 * the minimum level and the worker id stamped on every line.
 *
 *   ci_log(CI_LOG_INFO, "task.done", "task_id", id, "status", "succeeded", NULL);
 *
 * Fields come as key/value string pairs ended by NULL; ci_log_kv() takes an
 * extra integer field. Task payloads (code, output, inputs) are never logged. */
#ifndef CI_LOG_H
#define CI_LOG_H

#include <stdint.h>

enum ci_log_level { CI_LOG_DEBUG, CI_LOG_INFO, CI_LOG_WARN, CI_LOG_ERROR };

void ci_log_init(enum ci_log_level min, const char *worker_id);
void ci_log(enum ci_log_level level, const char *event, ...) __attribute__((sentinel));
/* Like ci_log, with one numeric field first. */
void ci_log_num(enum ci_log_level level, const char *event, const char *num_key, int64_t num, ...)
    __attribute__((sentinel));

#endif
