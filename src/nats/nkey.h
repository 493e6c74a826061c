/* nkey.h - the public key of a NATS NKey seed. nats.c signs the server's
 * nonce with the seed file itself but wants the public key given; this
 * derives it (Ed25519 via libcrypto), so that a config needs only the seed. */
#ifndef CI_NKEY_H
#define CI_NKEY_H

#include <stddef.h>

#include "core/status.h"

/* Reads the first NKey seed ("S..." 58 characters) from seed_file and
 * writes its public key (56 characters and a NUL) to out. */
ci_status ci_nkey_public_from_seed_file(const char *seed_file, char out[57],
                                        struct ci_error *err);
/* Same, for a seed given as text. */
ci_status ci_nkey_public_from_seed(const char *seed, size_t len, char out[57],
                                   struct ci_error *err);

#endif
