/* auth.c - Google-signed ID tokens for ci-executor (see auth.h).
 *
 * The order of the checks: the header's shape, the JWS's alg (RS256 and
 * nothing else, decided here before any key is touched: `none` and HS256
 * with the public key as the secret never reach a verifier), its kid, the
 * signature (cjose), then the claims. Text a caller controls (alg, kid) is
 * quoted in the log's detail only after it is reduced to a few safe
 * characters. */
#include "executor/auth.h"

#include <cjose/cjose.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"

#define JWKS_MAX_BYTES (1024 * 1024)
#define MAX_KEYS 64
#define MAX_EMAILS 64
#define EMAIL_MAX 254
#define TOKEN_MAX 8192        /* Google's ID tokens are ~1 KiB */
#define RECHECK_MS 1000       /* how often the key file is looked at for a change */

struct key {
    char kid[128];
    cjose_jwk_t *jwk;
};

struct keyset {
    struct key *keys;
    size_t n;
};

struct ci_auth {
    const struct ci_config *cfg;
    char **emails;
    size_t n_emails;

    pthread_mutex_t lock; /* keys, seen, checked_ms */
    struct keyset keys;
    struct stat seen;     /* of the file the keys came from */
    int64_t checked_ms;
};

static void keyset_release(struct keyset *ks)
{
    for (size_t i = 0; i < ks->n; i++)
        cjose_jwk_release(ks->keys[i].jwk);
    free(ks->keys);
    ks->keys = NULL;
    ks->n = 0;
}

/* Reads the whole file (at most JWKS_MAX_BYTES) and its identity. */
static ci_status read_file(const char *path, char **ret, size_t *ret_len, struct stat *ret_st,
                           struct ci_error *err)
{
    CI_AUTOCLOSE int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return ci_error_errno(err, CI_ERR_IO, errno, "executor.jwks_file: cannot open '%s'", path);
    struct stat st;
    if (fstat(fd, &st) != 0)
        return ci_error_errno(err, CI_ERR_IO, errno, "executor.jwks_file: cannot stat '%s'", path);
    if (!S_ISREG(st.st_mode))
        return ci_error_set(err, CI_ERR_INVALID, "executor.jwks_file: '%s' is not a regular file",
                            path);
    if (st.st_size > JWKS_MAX_BYTES)
        return ci_error_set(err, CI_ERR_LIMIT,
                            "executor.jwks_file: '%s' is larger than %d bytes: not a key set",
                            path, JWKS_MAX_BYTES);
    size_t cap = (size_t)st.st_size;
    CI_AUTOFREE char *buf = malloc(cap + 1);
    if (!buf)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    size_t len = 0;
    while (len < cap) {
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return ci_error_errno(err, CI_ERR_IO, errno, "executor.jwks_file: cannot read '%s'",
                                  path);
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    *ret = CI_STEAL(&buf);
    *ret_len = len;
    *ret_st = st;
    return CI_OK;
}

/* The RSA signing keys of a JWK set ({"keys": [...]}). Keys of another
 * type or use are skipped; every usable key must have a kid of its own. */
static ci_status parse_keyset(const char *path, const char *text, size_t len,
                              struct keyset *ret, struct ci_error *err)
{
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    json_t *arr = root ? json_object_get(root, "keys") : NULL;
    if (!json_is_array(arr)) {
        json_decref(root);
        return ci_error_set(err, CI_ERR_INVALID,
                            "executor.jwks_file: '%s' is not a JWK set (a JSON object with a "
                            "\"keys\" list)%s%s",
                            path, root ? "" : ": ", root ? "" : je.text);
    }
    struct keyset ks = {0};
    ci_status s = CI_OK;
    size_t n = json_array_size(arr);
    ks.keys = calloc(n ? n : 1, sizeof(*ks.keys));
    if (!ks.keys)
        s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    for (size_t i = 0; !s && i < n; i++) {
        json_t *k = json_array_get(arr, i);
        const char *kty = json_string_value(json_object_get(k, "kty"));
        const char *use = json_string_value(json_object_get(k, "use"));
        const char *alg = json_string_value(json_object_get(k, "alg"));
        const char *kid = json_string_value(json_object_get(k, "kid"));
        if (!kty || strcmp(kty, "RSA") != 0 || (use && strcmp(use, "sig") != 0) ||
            (alg && strcmp(alg, "RS256") != 0))
            continue;
        if (!kid || !kid[0] || strlen(kid) >= sizeof(ks.keys[0].kid)) {
            s = ci_error_set(err, CI_ERR_INVALID,
                             "executor.jwks_file: key %zu of '%s' has no usable \"kid\" (1 to "
                             "127 characters): tokens name their key by it",
                             i + 1, path);
            break;
        }
        /* A token names its key by kid: two keys of one kid would make
         * which one checks it a matter of order in the file. */
        bool dup = false;
        for (size_t j = 0; j < ks.n && !dup; j++)
            dup = strcmp(ks.keys[j].kid, kid) == 0;
        if (dup) {
            s = ci_error_set(err, CI_ERR_INVALID,
                             "executor.jwks_file: '%s' has two keys with kid '%.127s'", path, kid);
            break;
        }
        if (ks.n >= MAX_KEYS) {
            s = ci_error_set(err, CI_ERR_LIMIT, "executor.jwks_file: '%s' has more than %d keys",
                             path, MAX_KEYS);
            break;
        }
        char *one = json_dumps(k, JSON_COMPACT);
        cjose_err ce = {0};
        cjose_jwk_t *jwk = one ? cjose_jwk_import(one, strlen(one), &ce) : NULL;
        free(one);
        if (!jwk) {
            s = ci_error_set(err, CI_ERR_INVALID,
                             "executor.jwks_file: key '%s' of '%s' is not a valid RSA public "
                             "key: %s",
                             kid, path, ce.message ? ce.message : "out of memory");
            break;
        }
        snprintf(ks.keys[ks.n].kid, sizeof(ks.keys[ks.n].kid), "%s", kid);
        ks.keys[ks.n++].jwk = jwk;
    }
    json_decref(root);
    if (!s && ks.n == 0)
        s = ci_error_set(err, CI_ERR_INVALID,
                         "executor.jwks_file: '%s' holds no RSA signing key (kty RSA, use sig, "
                         "alg RS256 or none given)",
                         path);
    if (s) {
        keyset_release(&ks);
        return s;
    }
    *ret = ks;
    return CI_OK;
}

/* Loads the key file into a->keys; the caller holds the lock (or is the
 * only user). On failure the old keys stay. */
static ci_status load_keys(struct ci_auth *a, struct ci_error *err)
{
    const char *path = a->cfg->executor.jwks_file;
    CI_AUTOFREE char *text = NULL;
    size_t len = 0;
    struct stat st;
    ci_status s = read_file(path, &text, &len, &st, err);
    if (s)
        return s;
    struct keyset ks;
    if ((s = parse_keyset(path, text, len, &ks, err)))
        return s;
    keyset_release(&a->keys);
    a->keys = ks;
    a->seen = st;
    return CI_OK;
}

static bool same_file(const struct stat *x, const struct stat *y)
{
    return x->st_dev == y->st_dev && x->st_ino == y->st_ino && x->st_size == y->st_size &&
           x->st_mtim.tv_sec == y->st_mtim.tv_sec && x->st_mtim.tv_nsec == y->st_mtim.tv_nsec &&
           x->st_ctim.tv_sec == y->st_ctim.tv_sec && x->st_ctim.tv_nsec == y->st_ctim.tv_nsec;
}

/* Re-reads the key file when it changed (a new inode after a rename, or
 * new content); quietly keeps the old keys when the new file is bad (a
 * SIGHUP reload reports that). Caller holds the lock. */
static void refresh_keys(struct ci_auth *a)
{
    int64_t now = ci_mono_ms();
    if (now - a->checked_ms < RECHECK_MS)
        return;
    a->checked_ms = now;
    struct stat st;
    if (stat(a->cfg->executor.jwks_file, &st) != 0 || same_file(&st, &a->seen))
        return;
    struct ci_error e = {{0}};
    if (load_keys(a, &e))
        a->seen = st; /* do not try the same bad file every second */
}

static ci_status parse_emails(struct ci_auth *a, const char *list, struct ci_error *err)
{
    const char *p = list;
    while (*p) {
        while (*p == ',' || *p == ' ')
            p++;
        size_t len = strcspn(p, ", ");
        if (len == 0)
            break;
        if (len > EMAIL_MAX || !memchr(p, '@', len))
            return ci_error_set(err, CI_ERR_INVALID,
                                "executor.allowed_emails: '%.*s' is not an email address",
                                (int)(len > 64 ? 64 : len), p);
        if (a->n_emails >= MAX_EMAILS)
            return ci_error_set(err, CI_ERR_LIMIT,
                                "executor.allowed_emails lists more than %d emails", MAX_EMAILS);
        char *e = strndup(p, len);
        if (!e)
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        a->emails[a->n_emails++] = e;
        p += len;
    }
    if (a->n_emails == 0)
        return ci_error_set(err, CI_ERR_INVALID,
                            "executor.allowed_emails is empty: list the service-account emails "
                            "of the workers (comma-separated) that may call this executor");
    return CI_OK;
}

ci_status ci_auth_new(const struct ci_config *cfg, struct ci_auth **ret, struct ci_error *err)
{
    if (cfg->executor.auth != CI_AUTH_GOOGLE_ID_TOKEN)
        return ci_error_set(err, CI_ERR_INVALID, "executor.auth is not google-id-token");
    if (!cfg->executor.audience[0])
        return ci_error_set(err, CI_ERR_INVALID,
                            "executor.audience is empty: set it to the audience the workers ask "
                            "their tokens for (their cloudrun.audience, by default the "
                            "executor's URL)");
    if (!cfg->executor.jwks_file[0])
        return ci_error_set(err, CI_ERR_INVALID,
                            "executor.jwks_file is empty: set it to a local copy of Google's "
                            "signing keys (https://www.googleapis.com/oauth2/v3/certs)");
    struct ci_auth *a = calloc(1, sizeof(*a));
    if (!a)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    a->cfg = cfg;
    pthread_mutex_init(&a->lock, NULL);
    a->checked_ms = ci_mono_ms();
    a->emails = calloc(MAX_EMAILS, sizeof(*a->emails));
    ci_status s = a->emails ? parse_emails(a, cfg->executor.allowed_emails, err)
                            : ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    if (!s)
        s = load_keys(a, err);
    if (s) {
        ci_auth_free(a);
        return s == CI_ERR_NOMEM ? s : CI_ERR_INVALID;
    }
    *ret = a;
    return CI_OK;
}

void ci_auth_free(struct ci_auth *a)
{
    if (!a)
        return;
    keyset_release(&a->keys);
    for (size_t i = 0; i < a->n_emails; i++)
        free(a->emails[i]);
    free(a->emails);
    pthread_mutex_destroy(&a->lock);
    free(a);
}

ci_status ci_auth_reload(struct ci_auth *a, unsigned *ret_keys, struct ci_error *err)
{
    pthread_mutex_lock(&a->lock);
    ci_status s = load_keys(a, err);
    a->checked_ms = ci_mono_ms();
    if (ret_keys)
        *ret_keys = (unsigned)a->keys.n;
    pthread_mutex_unlock(&a->lock);
    return s;
}

/* ---- one token ------------------------------------------------------------ */

static ci_status refuse(struct ci_auth_verdict *v, const char *reason, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static ci_status refuse(struct ci_auth_verdict *v, const char *reason, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->detail, sizeof(v->detail), fmt, ap);
    va_end(ap);
    v->reason = reason;
    return CI_ERR_INVALID;
}

/* A caller's text made fit for a log line: at most 40 characters of
 * [A-Za-z0-9._@-], anything else as '?'. */
static const char *quote_safe(const char *s, char *out, size_t n)
{
    size_t i = 0;
    for (; s && s[i] && i + 1 < n && i < 40; i++) {
        unsigned char c = (unsigned char)s[i];
        out[i] = isalnum(c) || c == '.' || c == '_' || c == '-' || c == '@' ? (char)c : '?';
    }
    out[i] = '\0';
    return out;
}

static bool token_chars(const char *t, size_t len)
{
    size_t dots = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)t[i];
        if (c == '.')
            dots++;
        else if (!isalnum(c) && c != '-' && c != '_')
            return false;
    }
    return dots == 2;
}

/* A NumericDate claim (seconds; JSON integer or real). */
static bool claim_time(json_t *claims, const char *name, double *ret)
{
    json_t *v = json_object_get(claims, name);
    if (!json_is_number(v))
        return false;
    *ret = json_number_value(v);
    return true;
}

static bool audience_matches(json_t *aud, const char *want)
{
    if (json_is_string(aud))
        return strcmp(json_string_value(aud), want) == 0;
    if (!json_is_array(aud))
        return false;
    size_t i;
    json_t *x;
    json_array_foreach(aud, i, x)
        if (json_is_string(x) && strcmp(json_string_value(x), want) == 0)
            return true;
    return false;
}

/* The claims of a token whose signature held. */
static ci_status check_claims(struct ci_auth *a, json_t *c, int64_t now_s,
                              struct ci_auth_verdict *v)
{
    const struct ci_config *cfg = a->cfg;
    double skew = cfg->executor.clock_skew_s, now = (double)now_s, exp, iat, nbf;
    const char *iss = json_string_value(json_object_get(c, "iss"));
    if (!iss || (strcmp(iss, "accounts.google.com") != 0 &&
                 strcmp(iss, "https://accounts.google.com") != 0))
        return refuse(v, "invalid", "iss is not accounts.google.com");
    if (!audience_matches(json_object_get(c, "aud"), cfg->executor.audience))
        return refuse(v, "invalid", "aud is not executor.audience");
    if (!claim_time(c, "exp", &exp))
        return refuse(v, "invalid", "no exp claim");
    if (now > exp + skew)
        return refuse(v, "expired", "the token expired %.0f s ago", now - exp);
    if (!claim_time(c, "iat", &iat))
        return refuse(v, "invalid", "no iat claim");
    if (iat > now + skew)
        return refuse(v, "invalid", "iat is %.0f s in the future", iat - now);
    if (claim_time(c, "nbf", &nbf) && nbf > now + skew)
        return refuse(v, "invalid", "nbf is %.0f s in the future", nbf - now);
    const char *email = json_string_value(json_object_get(c, "email"));
    if (!email || !email[0])
        return refuse(v, "invalid", "no email claim (the token must be asked for with "
                                    "format=full)");
    char q[48];
    snprintf(v->email, sizeof(v->email), "%s", quote_safe(email, q, sizeof(q)));
    if (!json_is_true(json_object_get(c, "email_verified")))
        return refuse(v, "invalid", "email_verified is not true");
    for (size_t i = 0; i < a->n_emails; i++)
        if (strcmp(a->emails[i], email) == 0)
            return CI_OK;
    return refuse(v, "invalid", "email %s is not in executor.allowed_emails", v->email);
}

/* The signature and claims of a compact JWS; the caller holds the lock. */
static ci_status verify_locked(struct ci_auth *a, const char *token, size_t len, int64_t now_s,
                               struct ci_auth_verdict *v)
{
    cjose_err ce = {0};
    cjose_jws_t *jws = cjose_jws_import(token, len, &ce);
    if (!jws)
        return ce.code == CJOSE_ERR_NO_MEMORY ? CI_ERR_NOMEM
                                              : refuse(v, "invalid", "not a signed JWT");
    ci_status s = CI_OK;
    char q[48];
    cjose_header_t *h = cjose_jws_get_protected(jws);
    const char *alg = h ? cjose_header_get(h, "alg", &ce) : NULL;
    const char *kid = h ? cjose_header_get(h, "kid", &ce) : NULL;
    char *crit = h ? cjose_header_get_raw(h, "crit", &ce) : NULL;
    const struct key *key = NULL;
    for (size_t i = 0; kid && i < a->keys.n; i++)
        if (strcmp(a->keys.keys[i].kid, kid) == 0)
            key = &a->keys.keys[i];
    uint8_t *payload = NULL;
    size_t payload_len = 0;
    if (!alg || strcmp(alg, "RS256") != 0)
        s = refuse(v, "invalid", "alg is '%s'; only RS256 is accepted",
                   quote_safe(alg ? alg : "(none)", q, sizeof(q)));
    else if (crit)
        s = refuse(v, "invalid", "the token names critical header extensions");
    else if (!key)
        s = refuse(v, "invalid", "no key with kid '%s' in executor.jwks_file",
                   quote_safe(kid ? kid : "(none)", q, sizeof(q)));
    else if (!cjose_jws_verify(jws, key->jwk, &ce))
        s = refuse(v, "invalid", "the signature does not verify with key '%s'", key->kid);
    else if (!cjose_jws_get_plaintext(jws, &payload, &payload_len, &ce))
        s = refuse(v, "invalid", "no payload");
    if (!s) {
        json_t *claims = json_loadb((const char *)payload, payload_len, JSON_REJECT_DUPLICATES,
                                    NULL);
        s = json_is_object(claims) ? check_claims(a, claims, now_s, v)
                                   : refuse(v, "invalid", "the payload is not a JSON object");
        json_decref(claims);
    }
    if (crit)
        cjose_get_dealloc()(crit);
    cjose_jws_release(jws);
    return s;
}

ci_status ci_auth_check(struct ci_auth *a, const char *authorization, int64_t now_s,
                        struct ci_auth_verdict *ret)
{
    memset(ret, 0, sizeof(*ret));
    ret->reason = "invalid";
    if (!authorization)
        return refuse(ret, "missing", "no Authorization header");
    if (strncasecmp(authorization, "Bearer ", 7) != 0)
        return refuse(ret, "invalid", "the Authorization header is not a Bearer token");
    const char *token = authorization + 7;
    while (*token == ' ')
        token++;
    size_t len = strlen(token);
    while (len > 0 && token[len - 1] == ' ')
        len--;
    if (len == 0)
        return refuse(ret, "missing", "an empty Bearer token");
    if (len > TOKEN_MAX || !token_chars(token, len))
        return refuse(ret, "invalid", "the Bearer token is not a JWT");
    pthread_mutex_lock(&a->lock);
    refresh_keys(a);
    ci_status s = verify_locked(a, token, len, now_s, ret);
    pthread_mutex_unlock(&a->lock);
    if (!s)
        ret->reason = "";
    return s;
}
