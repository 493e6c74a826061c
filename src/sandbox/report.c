/* report.c - reading the driver's report (sandbox.h): NUL-terminated key
 * and value strings, written by code the user controls. The one parser:
 * the provider reads its keys here, the sandbox its session keys. */
#include <string.h>

#include "sandbox/sandbox.h"

bool ci_report_next(const char *data, size_t len, size_t *pos, const char **ret_key,
                    const char **ret_val, size_t *ret_vlen)
{
    size_t i = *pos;
    if (!data || i >= len)
        return false;
    const char *key = data + i;
    const char *key_end = memchr(key, '\0', len - i);
    if (!key_end)
        return false;
    i = (size_t)(key_end - data) + 1;
    if (i >= len)
        return false;
    const char *val = data + i;
    const char *val_end = memchr(val, '\0', len - i);
    if (!val_end)
        return false; /* cut by the capture's cap: the pair is incomplete */
    *pos = (size_t)(val_end - data) + 1;
    *ret_key = key;
    *ret_val = val;
    *ret_vlen = (size_t)(val_end - val);
    return true;
}

const char *ci_report_get(const char *data, size_t len, const char *key, size_t *ret_len)
{
    const char *found = NULL, *k, *v;
    size_t pos = 0, vlen, found_len = 0;
    while (ci_report_next(data, len, &pos, &k, &v, &vlen))
        if (strcmp(k, key) == 0) {
            found = v; /* the last one counts, as for every key */
            found_len = vlen;
        }
    if (found && ret_len)
        *ret_len = found_len;
    return found;
}
