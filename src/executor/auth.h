/* auth.h - who may call ci-executor: Google-signed ID tokens.
 *
 * With executor.auth: google-id-token every request but GET /healthz must
 * carry `Authorization: Bearer <JWT>` where the JWT
 *   - is signed RS256 (no other alg: not `none`, not HS256) by a key of the
 *     key set in executor.jwks_file, chosen by the token's `kid`;
 *   - has iss accounts.google.com or https://accounts.google.com;
 *   - has aud executor.audience (a string, or a list holding it);
 *   - has not expired (exp), was not issued in the future (iat) and is
 *     valid already (nbf, when present), each with executor.clock_skew_s
 *     of leeway;
 *   - names an `email` listed in executor.allowed_emails, with
 *     email_verified true.
 * The key set is read at start, again when the file changes (checked at
 * most once a second) and on ci_auth_reload() (SIGHUP); a key set that
 * does not load keeps the old keys. Signatures are checked by cjose (Cisco
 * JOSE, over OpenSSL); the claims here.
 *
 * Safe to use from several threads at once. Never logs: the caller logs
 * the verdict's detail, which never holds the token. */
#ifndef CI_AUTH_H
#define CI_AUTH_H

#include <stdint.h>

#include "core/config.h"
#include "core/status.h"

struct ci_auth;

/* What a refused token gets told, and what the log gets. */
struct ci_auth_verdict {
    const char *reason;   /* short, for the client: "missing", "expired", "invalid" */
    char detail[256];     /* which check failed, for the log; never the token */
    char email[128];      /* the caller's email once the signature held, else "" */
};

/* Reads executor.* of cfg (borrowed for the auth's life) and the key set.
 * CI_ERR_INVALID when a key is missing or the key set does not load; err
 * names the key to fix. */
ci_status ci_auth_new(const struct ci_config *cfg, struct ci_auth **ret, struct ci_error *err);
/* Accepts NULL. */
void ci_auth_free(struct ci_auth *a);

/* Reads the key set again. On failure the old keys stay and err says why;
 * ret_keys (may be NULL) is the number of keys in use afterwards. */
ci_status ci_auth_reload(struct ci_auth *a, unsigned *ret_keys, struct ci_error *err);

/* Checks an Authorization header value (NULL when the header is absent)
 * at now_s (seconds since the epoch). CI_OK when the caller may proceed;
 * CI_ERR_INVALID (refused; ret says why) or CI_ERR_NOMEM. ret is always
 * filled. */
ci_status ci_auth_check(struct ci_auth *a, const char *authorization, int64_t now_s,
                        struct ci_auth_verdict *ret);

#endif
