/* fuzz_config.c - libFuzzer target for the config parser (ci_config_parse).
 *
 * Besides "no crash, no leak, no UB", it checks two promises on every input:
 * - a failure leaves ret alone and explains itself in one line of printable
 *   ASCII starting with the file name (user bytes never reach logs raw);
 * - a success dumps to YAML that loads back to the same dump (the dump is
 *   quoted well enough that no value can change the YAML's meaning); only a
 *   dump whose "<redacted>" made a value too long may fail to load.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -Isrc \
 *     tests/fuzz/fuzz_config.c src/core/config.c src/core/util.c src/core/status.c \
 *     -lyaml -lcrypto -o fuzz_config
 *   ./fuzz_config -max_total_time=30 tests/fuzz/corpus/config */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/config.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    unsetenv("CI_NATS_URL"); /* the parser alone, not the environment */
    return 0;
}

static char *dump(const struct ci_config *cfg, size_t *ret_len)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, ret_len);
    if (!f)
        abort();
    ci_config_dump(cfg, f);
    if (fclose(f) != 0)
        abort();
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char name[] = "fuzz.yaml";
    struct ci_config *sentinel = (struct ci_config *)&size, *cfg = sentinel;
    struct ci_error err;
    memset(&err, 0, sizeof(err));

    ci_status s = ci_config_parse(name, data, size, &cfg, &err);
    if (s != CI_OK) {
        if (cfg != sentinel)
            abort();
        if (s == CI_ERR_NOMEM)
            return 0;
        if (strncmp(err.msg, name, strlen(name)) != 0) {
            fprintf(stderr, "message without the file name: %s\n", err.msg);
            abort();
        }
        for (const char *c = err.msg; *c; c++)
            if (*c < 0x20 || *c >= 0x7f) {
                fprintf(stderr, "message with a non-printable byte: %s\n", err.msg);
                abort();
            }
        return 0;
    }

    size_t alen, blen;
    char *a = dump(cfg, &alen);
    struct ci_config *again = NULL;
    if (ci_config_parse("dump.yaml", (const uint8_t *)a, alen, &again, &err) != CI_OK) {
        /* "<redacted>" can make a long list of URLs with short user names
         * longer than the limit: that dump is for reading only. */
        if (strstr(a, "<redacted>")) {
            free(a);
            ci_config_free(cfg);
            return 0;
        }
        fprintf(stderr, "the dump does not load: %s\n%s", err.msg, a);
        abort();
    }
    char *b = dump(again, &blen);
    if (alen != blen || memcmp(a, b, alen) != 0) {
        fprintf(stderr, "the dump changed on reload:\n%s---\n%s", a, b);
        abort();
    }
    free(a);
    free(b);
    ci_config_free(again);
    ci_config_free(cfg);
    return 0;
}
