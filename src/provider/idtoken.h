/* idtoken.h - OIDC ID tokens for calling a private Cloud Run service.
 *
 * A token comes from the metadata server of the machine the worker runs on
 * (GET <metadata_url>?audience=<aud>&format=full, Metadata-Flavor: Google),
 * or from a file that something else keeps fresh (other platforms). Tokens
 * from the metadata server are cached until shortly before their `exp`
 * claim; a file is re-read when it changes. Any number of threads may ask
 * at once: one of them fetches, the others wait for its answer.
 *
 * A token is a secret: it is never put in an error message, and its memory
 * is wiped when it is dropped. */
#ifndef CI_IDTOKEN_H
#define CI_IDTOKEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "provider/http.h"
#include "core/status.h"

struct ci_idtoken;

struct ci_idtoken_options {
    const char *metadata_url;   /* the identity endpoint */
    const char *audience;       /* the service URL */
    const char *token_file;     /* NULL or "" = use the metadata server */
    uint32_t refresh_margin_s;  /* refresh this long before exp (at most half the lifetime) */
};

/* http is borrowed for the life of the source. */
ci_status ci_idtoken_new(struct ci_http *http, const struct ci_idtoken_options *o,
                         struct ci_idtoken **ret, struct ci_error *err);
void ci_idtoken_free(struct ci_idtoken *t);

/* A malloc'd "Authorization: Bearer <token>" header line with a token that
 * is not about to expire, fetched if needed within timeout_ms. should_abort
 * (may be NULL) stops a fetch or a wait for another thread's fetch with
 * CI_ERR_CANCELLED. Errors: CI_ERR_HTTP / CI_ERR_TIMEOUT (the metadata
 * server could not be reached, or answered 5xx or 429: worth another try),
 * CI_ERR_INVALID (it answered another status, e.g. 403 or 404, or
 * something that is not a JWT, or an expired one: asking again would give
 * the same), CI_ERR_IO (the token file cannot be read), CI_ERR_CANCELLED,
 * CI_ERR_NOMEM. The caller
 * wipes and frees the line (ci_idtoken_header_free). */
ci_status ci_idtoken_header(struct ci_idtoken *t, uint32_t timeout_ms,
                            bool (*should_abort)(void *arg), void *abort_arg, char **ret,
                            struct ci_error *err);
void ci_idtoken_header_free(char *header);

/* Forgets the cached token (after the service refused it with 401), so the
 * next call fetches a new one. */
void ci_idtoken_invalidate(struct ci_idtoken *t);

/* The `exp` claim (Unix seconds) of a JWT: the payload, its middle part, is
 * base64url JSON. CI_ERR_INVALID when token is not three dot-separated
 * base64url parts, or the payload is not a JSON object with an integer exp. */
ci_status ci_jwt_exp(const char *token, size_t len, int64_t *ret_exp);

/* Whether s (len bytes) may be sent as a bearer token: 1 to 16384 of
 * [A-Za-z0-9-._~+/=] (no space, CR or LF that could end the header). */
bool ci_token_chars_valid(const char *s, size_t len);

#endif
