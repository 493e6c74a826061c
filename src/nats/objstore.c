/* objstore.c - a JetStream Object Store bucket (ADR-20) written by hand on
 * nats.c's plain JetStream API.
 *
 * Writes: chunks of CI_OBJ_CHUNK_SIZE bytes on $O.<bucket>.C.<nuid>, each
 * acked, then the meta JSON on $O.<bucket>.M.<padded base64url(name)> with
 * Nats-Rollup: sub, then the previous version's chunks are purged.
 * Reads: the last meta and then the chunks, both by direct get (the stream
 * has allow_direct), so a read creates no consumer and every step is one
 * request with a timeout. The struct is immutable after open and nats.c is
 * thread-safe, so any number of threads may share one ci_objstore. */
#include "nats/objstore_js.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "core/util.h"
#include "nats/natsutil.h"

#define META_MAX_LEN (64 * 1024) /* a meta document bigger than this is refused */
#define NAME_MAX_LEN 1024        /* bytes of an object name */
#define BUCKET_MAX_LEN 128
#define NUID_LEN 22
#define NUID_MAX_LEN 128          /* nuids written by other clients */
#define API_WAIT_MS 10000         /* every JetStream request and publish ack */
#define GET_DEADLINE_MS 120000    /* a whole get, however many chunks */
#define GET_ATTEMPTS 8 /* a get that finds chunks missing (replaced under it) re-reads the meta */
#define DIGEST_PREFIX "SHA-256="
#define SHOWN_MAX 200             /* bytes of a name quoted in a message */

struct ci_objstore {
    jsCtx *js;
    struct ci_objstore_opts opts; /* bucket points to our copy */
    bool create;                  /* may create the stream again when it is gone */
    char *bucket;
    char *stream;       /* OBJ_<bucket> */
    char *meta_prefix;  /* $O.<bucket>.M. */
    char *chunk_prefix; /* $O.<bucket>.C. */
};

/* ---- pure helpers ---------------------------------------------------- */

char *ci_objstore_encode_name(const char *name)
{
    if (!name)
        return NULL;
    return ci_base64_encode(name, strlen(name), CI_B64_URL, true, NULL);
}

char *ci_objstore_digest(const void *data, size_t len)
{
    static const uint8_t empty[1];
    uint8_t md[SHA256_DIGEST_LENGTH];
    SHA256(len ? data : empty, len, md);
    CI_AUTOFREE char *b64 = ci_base64_encode(md, sizeof(md), CI_B64_URL, true, NULL);
    if (!b64)
        return NULL;
    size_t n = strlen(DIGEST_PREFIX) + strlen(b64) + 1;
    char *out = malloc(n);
    if (!out)
        return NULL;
    snprintf(out, n, "%s%s", DIGEST_PREFIX, b64);
    return out;
}

static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decodes a digest as other clients write it: "SHA-256=" followed by the 32
 * bytes in base64 (URL or standard alphabet, padded or not) or in hex. */
static bool digest_decode(const char *digest, uint8_t out[SHA256_DIGEST_LENGTH])
{
    size_t plen = strlen(DIGEST_PREFIX);
    if (!digest || strncmp(digest, DIGEST_PREFIX, plen) != 0)
        return false;
    const char *v = digest + plen;
    size_t n = strlen(v);
    if (n == 2 * SHA256_DIGEST_LENGTH) {
        bool ok = true;
        for (size_t i = 0; i < SHA256_DIGEST_LENGTH && ok; i++) {
            int hi = hex_value(v[2 * i]), lo = hex_value(v[2 * i + 1]);
            ok = hi >= 0 && lo >= 0;
            if (ok)
                out[i] = (uint8_t)(hi << 4 | lo);
        }
        if (ok)
            return true;
    }
    /* 32 bytes are 43 base64 characters (plus one '=' of padding); a
     * longer string decodes to more than 32 bytes and is refused. */
    size_t got = 0;
    return ci_base64_decode_into(v, n, CI_B64_STD | CI_B64_URL, out, SHA256_DIGEST_LENGTH,
                                 &got) == CI_OK &&
           got == SHA256_DIGEST_LENGTH;
}

/* A fresh 22-character base62 token, like a NUID: unique per put. */
static ci_status make_nuid(char out[NUID_LEN + 1], struct ci_error *err)
{
    static const char alpha[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    uint8_t rnd[64];
    size_t have = 0, pos = 0, i = 0;
    while (i < NUID_LEN) {
        if (pos == have) {
            ssize_t r = getrandom(rnd, sizeof(rnd), 0);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                return ci_error_errno(err, CI_ERR_SYS, errno, "getrandom failed");
            have = (size_t)r;
            pos = 0;
        }
        uint8_t b = rnd[pos++];
        if (b >= 248) /* 248 = 4 * 62: keeps every character equally likely */
            continue;
        out[i++] = alpha[b % 62];
    }
    out[NUID_LEN] = '\0';
    return CI_OK;
}

/* The current time as RFC 3339 UTC with nanoseconds, as Go writes it. */
static void now_rfc3339(char out[40])
{
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(out, 40, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, 40 - n, ".%09ldZ", (long)ts.tv_nsec);
}

/* A nuid read from a meta becomes a subject token: no dots, wildcards or
 * white space. */
static bool nuid_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > NUID_MAX_LEN)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= ' ' || c >= 0x7f || c == '.' || c == '*' || c == '>')
            return false;
    }
    return true;
}

static bool bucket_valid(const char *b)
{
    size_t n = b ? strlen(b) : 0;
    if (n == 0 || n > BUCKET_MAX_LEN)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = b[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_'))
            return false;
    }
    return true;
}

static char *concat(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s%s", a, b);
    return s;
}

/* A name as quoted in an error message: cut at SHOWN_MAX bytes, on a UTF-8
 * character boundary, so that the message stays valid UTF-8 and fits
 * struct ci_error. */
static const char *shown(const char *name, char *buf, size_t size)
{
    size_t n = name ? strlen(name) : 0;
    if (n <= SHOWN_MAX)
        return name ? name : "";
    size_t cut = SHOWN_MAX;
    while (cut > 0 && ((unsigned char)name[cut] & 0xC0) == 0x80)
        cut--;
    snprintf(buf, size, "%.*s...", (int)cut, name);
    return buf;
}
#define SHOW(name) shown((name), (char[SHOWN_MAX + 8]){0}, SHOWN_MAX + 8)

/* "3.2 MiB", "300.0 KiB" or "123 bytes", for messages about limits. */
static void human_size(uint64_t n, char out[32])
{
    if (n >= 1024 * 1024)
        snprintf(out, 32, "%.1f MiB", (double)n / (1024.0 * 1024.0));
    else if (n >= 10 * 1024)
        snprintf(out, 32, "%.1f KiB", (double)n / 1024.0);
    else
        snprintf(out, 32, "%" PRIu64 " bytes", n);
}

/* ---- meta JSON ------------------------------------------------------- */

void ci_objmeta_release(struct ci_objmeta *m)
{
    if (!m)
        return;
    free(m->name);
    free(m->bucket);
    free(m->nuid);
    free(m->mtime);
    free(m->digest);
    memset(m, 0, sizeof(*m));
}

ci_status ci_objmeta_to_json(const struct ci_objmeta *m, char **ret_json, struct ci_error *err)
{
    if (!m || !ret_json || !m->name || !m->name[0])
        return ci_error_set(err, CI_ERR_INVALID, "object metadata needs a name");
    if (m->size > INT64_MAX)
        return ci_error_set(err, CI_ERR_INVALID, "object '%s' is too large", SHOW(m->name));
    json_t *o = json_object();
    json_t *name = json_string(m->name);
    if (!o || !name) {
        json_decref(o);
        json_decref(name);
        return ci_error_set(err, name ? CI_ERR_NOMEM : CI_ERR_INVALID,
                            name ? "out of memory encoding object metadata"
                                 : "object name is not valid UTF-8");
    }
    /* Field names and types as nats.go's ObjectInfo; optional ones omitted
     * when empty, as its omitempty tags do. */
    int rc = json_object_set_new(o, "name", name);
    if (m->max_chunk_size) {
        json_t *opts = json_object();
        rc |= opts ? 0 : -1;
        rc |= json_object_set_new(opts, "max_chunk_size", json_integer(m->max_chunk_size));
        rc |= json_object_set_new(o, "options", opts);
    }
    rc |= json_object_set_new(o, "bucket", json_string(m->bucket ? m->bucket : ""));
    rc |= json_object_set_new(o, "nuid", json_string(m->nuid ? m->nuid : ""));
    rc |= json_object_set_new(o, "size", json_integer((json_int_t)m->size));
    rc |= json_object_set_new(o, "mtime", json_string(m->mtime ? m->mtime : ""));
    rc |= json_object_set_new(o, "chunks", json_integer(m->chunks));
    rc |= json_object_set_new(o, "digest", json_string(m->digest ? m->digest : ""));
    if (m->deleted)
        rc |= json_object_set_new(o, "deleted", json_true());
    char *s = rc == 0 ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s)
        return ci_error_set(err, CI_ERR_INVALID,
                            "cannot encode the metadata of object '%s' (strings must be "
                            "valid UTF-8)",
                            SHOW(m->name));
    *ret_json = s;
    return CI_OK;
}

/* Optional string field: absent or null leaves *out NULL. */
static ci_status get_str(json_t *o, const char *key, char **out, struct ci_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return CI_OK;
    if (!json_is_string(v))
        return ci_error_set(err, CI_ERR_INVALID, "object metadata field '%s' is not a string", key);
    *out = strdup(json_string_value(v));
    return *out ? CI_OK : ci_error_set(err, CI_ERR_NOMEM, "out of memory decoding object metadata");
}

/* Optional non-negative integer field no larger than max. */
static ci_status get_uint(json_t *o, const char *key, uint64_t max, uint64_t *out,
                          struct ci_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v))
        return CI_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        (uint64_t)json_integer_value(v) > max)
        return ci_error_set(err, CI_ERR_INVALID,
                            "object metadata field '%s' is not an integer from 0 to %" PRIu64, key,
                            max);
    *out = (uint64_t)json_integer_value(v);
    return CI_OK;
}

/* Decodes a meta document as any client writes it; ret_link tells whether it
 * is a link to another object (options.link), which has no data of its own. */
static ci_status meta_decode(const char *json, size_t len, struct ci_objmeta *ret, bool *ret_link,
                             struct ci_error *err)
{
    if (!json || !ret)
        return ci_error_set(err, CI_ERR_INVALID, "no object metadata");
    if (len > META_MAX_LEN)
        return ci_error_set(err, CI_ERR_LIMIT, "object metadata is %zu bytes; the limit is %d", len,
                            META_MAX_LEN);
    json_error_t jerr;
    json_t *o = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o)
        return ci_error_set(err, CI_ERR_INVALID, "object metadata is not valid JSON: %s", jerr.text);
    struct ci_objmeta m = {0};
    bool link = false;
    uint64_t size = 0, chunks = 0, mcs = 0;
    ci_status s = CI_OK;
    if (!json_is_object(o)) {
        s = ci_error_set(err, CI_ERR_INVALID, "object metadata is not a JSON object");
        goto out;
    }
    if ((s = get_str(o, "name", &m.name, err)))
        goto out;
    if (!m.name || !m.name[0]) {
        s = ci_error_set(err, CI_ERR_INVALID, "object metadata has no name");
        goto out;
    }
    if ((s = get_str(o, "bucket", &m.bucket, err)) || (s = get_str(o, "nuid", &m.nuid, err)) ||
        (s = get_str(o, "mtime", &m.mtime, err)) || (s = get_str(o, "digest", &m.digest, err)) ||
        (s = get_uint(o, "size", INT64_MAX, &size, err)) ||
        (s = get_uint(o, "chunks", UINT32_MAX, &chunks, err)))
        goto out;
    json_t *del = json_object_get(o, "deleted");
    if (del && !json_is_null(del)) {
        if (!json_is_boolean(del)) {
            s = ci_error_set(err, CI_ERR_INVALID, "object metadata field 'deleted' is not a boolean");
            goto out;
        }
        m.deleted = json_is_true(del);
    }
    json_t *opts = json_object_get(o, "options");
    if (opts && !json_is_null(opts)) {
        if (!json_is_object(opts)) {
            s = ci_error_set(err, CI_ERR_INVALID, "object metadata field 'options' is not an object");
            goto out;
        }
        if ((s = get_uint(opts, "max_chunk_size", UINT32_MAX, &mcs, err)))
            goto out;
        json_t *l = json_object_get(opts, "link");
        link = l && !json_is_null(l);
    }
    m.size = size;
    m.chunks = (uint32_t)chunks;
    m.max_chunk_size = (uint32_t)mcs;
out:
    json_decref(o);
    if (s) {
        ci_objmeta_release(&m);
        return s;
    }
    *ret = m;
    if (ret_link)
        *ret_link = link;
    return CI_OK;
}

ci_status ci_objmeta_from_json(const char *json, size_t len, struct ci_objmeta *ret,
                               struct ci_error *err)
{
    return meta_decode(json, len, ret, NULL, err);
}

/* ---- NATS plumbing --------------------------------------------------- */

static void api_opts(jsOptions *o)
{
    jsOptions_Init(o);
    o->Wait = API_WAIT_MS;
}

static natsStatus purge_subject(struct ci_objstore *os, const char *subject, jsErrCode *jerr)
{
    jsOptions o;
    api_opts(&o);
    o.Stream.Purge.Subject = subject;
    return js_PurgeStream(os->js, os->stream, &o, jerr);
}

/* Publishes one message to the bucket's stream and waits for its ack. */
/* Publishes one message; *ret_seq (if not NULL) gets its stream sequence. */
static natsStatus publish(struct ci_objstore *os, const char *subject, const void *data, int len,
                          bool rollup, uint64_t *ret_seq, jsErrCode *jerr)
{
    jsPubOptions po;
    jsPubOptions_Init(&po);
    po.MaxWait = API_WAIT_MS;
    po.ExpectStream = os->stream;
    CI_CLEANUP(jsPubAck_Destroy) jsPubAck *pa = NULL;
    natsStatus ns;
    if (!rollup) {
        ns = js_Publish(&pa, os->js, subject, data, len, &po, jerr);
    } else {
        CI_CLEANUP(natsMsg_Destroy) natsMsg *msg = NULL;
        ns = natsMsg_Create(&msg, subject, NULL, data, len);
        if (ns == NATS_OK)
            ns = natsMsgHeader_Set(msg, "Nats-Rollup", "sub");
        if (ns == NATS_OK)
            ns = js_PublishMsg(&pa, os->js, msg, &po, jerr);
    }
    if (ns == NATS_OK && ret_seq)
        *ret_seq = pa ? pa->Sequence : 0;
    return ns;
}

void ci_objstore_undo_release(struct ci_objstore_undo *u)
{
    if (!u)
        return;
    free(u->seqs);
    memset(u, 0, sizeof(*u));
}

static ci_status undo_add(struct ci_objstore_undo *u, uint64_t seq)
{
    if (!seq)
        return CI_OK;
    if (u->n == u->cap) {
        size_t cap = u->cap ? u->cap * 2 : 16;
        uint64_t *p = realloc(u->seqs, cap * sizeof(*p));
        if (!p)
            return CI_ERR_NOMEM;
        u->seqs = p;
        u->cap = cap;
    }
    u->seqs[u->n++] = seq;
    return CI_OK;
}

/* Deletes the messages of u, newest first (the meta before its chunks:
 * never an object whose chunks are gone). Those already gone count as
 * deleted. */
static ci_status delete_seqs(struct ci_objstore *os, struct ci_objstore_undo *u,
                             struct ci_error *err)
{
    jsOptions o;
    api_opts(&o);
    while (u->n) {
        jsErrCode jerr = 0;
        natsStatus ns = js_DeleteMsg(os->js, os->stream, u->seqs[u->n - 1], &o, &jerr);
        /* Gone already (expired, or a delete whose answer was lost): 10057
         * is what nats-server 2.9 says of a sequence it no longer has. */
        if (ns != NATS_OK && ns != NATS_NOT_FOUND && jerr != JSSequenceNotFoundErr &&
            jerr != JSNoMessageFoundErr && jerr != JSStreamMsgDeleteFailed)
            return ci_nats_fail(err, ns, jerr, "taking back what was stored in bucket '%s' "
                                "failed", os->bucket);
        u->n--;
    }
    return CI_OK;
}

ci_status ci_objstore_undo(struct ci_objstore *os, struct ci_objstore_undo *undo,
                           struct ci_error *err)
{
    if (!os || !undo)
        return ci_error_set(err, CI_ERR_INVALID, "object store: missing argument");
    return delete_seqs(os, undo, err);
}

static ci_status check_name(const char *name, struct ci_error *err)
{
    if (!name || !name[0])
        return ci_error_set(err, CI_ERR_INVALID, "an object name must not be empty");
    size_t n = strlen(name);
    if (n > NAME_MAX_LEN)
        return ci_error_set(err, CI_ERR_INVALID,
                            "object name '%s' is %zu bytes; the limit is %d", SHOW(name), n,
                            NAME_MAX_LEN);
    return CI_OK;
}

/* Reads the last meta of name. CI_ERR_NOT_FOUND when there is none (a
 * deleted object is returned, with deleted set). ret_raw, when given,
 * receives the JSON text. */
static ci_status fetch_meta(struct ci_objstore *os, const char *name, struct ci_objmeta *ret,
                            bool *ret_link, char **ret_raw, struct ci_error *err)
{
    CI_AUTOFREE char *enc = ci_objstore_encode_name(name);
    CI_AUTOFREE char *subject = enc ? concat(os->meta_prefix, enc) : NULL;
    if (!subject)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    jsOptions o;
    api_opts(&o);
    jsDirectGetMsgOptions dg;
    jsDirectGetMsgOptions_Init(&dg);
    dg.LastBySubject = subject;
    CI_CLEANUP(natsMsg_Destroy) natsMsg *msg = NULL;
    natsStatus ns = js_DirectGetMsg(&msg, os->js, os->stream, &o, &dg);
    if (ns == NATS_NOT_FOUND)
        return ci_error_set(err, CI_ERR_NOT_FOUND, "object '%s' not found in bucket '%s'",
                            SHOW(name), os->bucket);
    if (ns != NATS_OK)
        return ci_nats_fail(err, ns, 0, "reading object '%s' in bucket '%s' failed", SHOW(name),
                         os->bucket);
    const char *data = natsMsg_GetData(msg);
    size_t len = (size_t)natsMsg_GetDataLength(msg);
    struct ci_error derr = {{0}};
    struct ci_objmeta m;
    bool link = false;
    ci_status s = meta_decode(data ? data : "", len, &m, &link, &derr);
    if (s)
        return ci_error_set(err, s, "object '%s' in bucket '%s' has unreadable metadata: %s",
                            SHOW(name), os->bucket, derr.msg);
    if (ret_raw) {
        char *raw = malloc(len + 1);
        if (!raw) {
            ci_objmeta_release(&m);
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        }
        memcpy(raw, data, len);
        raw[len] = '\0';
        *ret_raw = raw;
    }
    *ret = m;
    if (ret_link)
        *ret_link = link;
    return CI_OK;
}

/* ---- open ------------------------------------------------------------ */

static bool has_subject(const jsStreamConfig *c, const char *subject)
{
    for (int i = 0; i < c->SubjectsLen; i++)
        if (c->Subjects[i] && strcmp(c->Subjects[i], subject) == 0)
            return true;
    return false;
}

/* Brings an existing stream's config in line with the fields this module
 * owns; updates only when one differs. Storage cannot change on a live
 * stream, so a different storage type is accepted as it is. */
static ci_status reconcile(struct ci_objstore *os, jsStreamConfig *cur, const jsStreamConfig *want,
                           struct ci_error *err)
{
    bool subj_ok = has_subject(cur, want->Subjects[0]) && has_subject(cur, want->Subjects[1]);
    if (subj_ok && cur->Discard == want->Discard && cur->AllowRollup && cur->AllowDirect &&
        cur->MaxAge == want->MaxAge && cur->Replicas == want->Replicas &&
        cur->MaxBytes == want->MaxBytes)
        return CI_OK;
    /* Keep every other setting: update the config the server gave us. */
    CI_AUTOFREE const char **subjects = NULL;
    const char **old_subjects = cur->Subjects;
    int old_len = cur->SubjectsLen;
    if (!subj_ok) {
        subjects = calloc((size_t)old_len + 2, sizeof(*subjects));
        if (!subjects)
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        int n = 0;
        for (int i = 0; i < old_len; i++)
            subjects[n++] = old_subjects[i];
        for (int i = 0; i < 2; i++)
            if (!has_subject(cur, want->Subjects[i]))
                subjects[n++] = want->Subjects[i];
        cur->Subjects = subjects;
        cur->SubjectsLen = n;
    }
    cur->Discard = want->Discard;
    cur->AllowRollup = true;
    cur->AllowDirect = true;
    cur->MaxAge = want->MaxAge;
    cur->Replicas = want->Replicas;
    cur->MaxBytes = want->MaxBytes;
    jsOptions o;
    api_opts(&o);
    jsErrCode jerr = 0;
    CI_CLEANUP(jsStreamInfo_Destroy) jsStreamInfo *si = NULL;
    natsStatus ns = js_UpdateStream(&si, os->js, cur, &o, &jerr);
    /* The config belongs to the caller's stream info: give back its own array. */
    cur->Subjects = old_subjects;
    cur->SubjectsLen = old_len;
    if (ns != NATS_OK)
        return ci_nats_fail(err, ns, jerr, "updating stream %s of bucket '%s' failed", os->stream,
                         os->bucket);
    return CI_OK;
}

static ci_status ensure_stream(struct ci_objstore *os, const struct ci_objstore_opts *opts,
                               bool create, struct ci_error *err)
{
    CI_AUTOFREE char *subj_c = concat(os->chunk_prefix, ">");
    CI_AUTOFREE char *subj_m = concat(os->meta_prefix, ">");
    if (!subj_c || !subj_m)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    const char *subjects[2] = {subj_c, subj_m};
    jsStreamConfig want;
    jsStreamConfig_Init(&want);
    want.Name = os->stream;
    want.Subjects = subjects;
    want.SubjectsLen = 2;
    want.Discard = js_DiscardNew;
    want.AllowRollup = true;
    want.AllowDirect = true;
    want.MaxAge = opts->max_age_s * 1000000000LL;
    want.MaxBytes = opts->max_bytes > 0 ? opts->max_bytes : -1;
    want.Replicas = opts->replicas > 0 ? opts->replicas : 1;
    want.Storage = opts->file_storage ? js_FileStorage : js_MemoryStorage;

    jsOptions o;
    api_opts(&o);
    /* Many workers may start at once: whoever loses the race to create the
     * stream finds it on the next turn. */
    for (int attempt = 0; attempt < 4; attempt++) {
        CI_CLEANUP(jsStreamInfo_Destroy) jsStreamInfo *si = NULL;
        jsErrCode jerr = 0;
        natsStatus ns = js_GetStreamInfo(&si, os->js, os->stream, &o, &jerr);
        if (ns == NATS_OK) {
            ci_status s = CI_OK;
            if (create)
                s = reconcile(os, si->Config, &want, err);
            else if (!si->Config->AllowDirect)
                s = ci_error_set(err, CI_ERR_UNSUPPORTED,
                                 "bucket '%s' (stream %s) does not allow direct gets; open it "
                                 "with create to update it",
                                 os->bucket, os->stream);
            return s;
        }
        if (ns != NATS_NOT_FOUND)
            return ci_nats_fail(err, ns, jerr, "looking up bucket '%s' (stream %s) failed", os->bucket,
                             os->stream);
        if (!create)
            return ci_error_set(err, CI_ERR_NOT_FOUND, "bucket '%s' does not exist (no stream %s)",
                                os->bucket, os->stream);
        jerr = 0;
        ns = js_AddStream(&si, os->js, &want, &o, &jerr);
        if (ns == NATS_OK)
            return CI_OK;
        if (jerr != JSStreamNameExistErr)
            return ci_nats_fail(err, ns, jerr, "creating bucket '%s' (stream %s) failed", os->bucket,
                             os->stream);
        nats_Sleep(10 + attempt * 20);
    }
    return ci_error_set(err, CI_ERR_NATS,
                        "creating bucket '%s' (stream %s) failed: it exists but cannot be read",
                        os->bucket, os->stream);
}

void ci_objstore_free(struct ci_objstore *os)
{
    if (!os)
        return;
    free(os->bucket);
    free(os->stream);
    free(os->meta_prefix);
    free(os->chunk_prefix);
    free(os);
}
CI_DEFINE_CLEANUP(struct ci_objstore, ci_objstore_free)

ci_status ci_objstore_open(jsCtx *js, const struct ci_objstore_opts *opts, bool create,
                           struct ci_objstore **ret, struct ci_error *err)
{
    if (!js || !opts || !ret)
        return ci_error_set(err, CI_ERR_INVALID, "object store: missing argument");
    if (!bucket_valid(opts->bucket))
        return ci_error_set(err, CI_ERR_INVALID,
                            "bucket name '%s' is invalid: use 1 to %d of A-Z a-z 0-9 _ -",
                            SHOW(opts->bucket), BUCKET_MAX_LEN);
    if (opts->max_age_s < 0 || opts->max_age_s > INT64_MAX / 1000000000LL)
        return ci_error_set(err, CI_ERR_INVALID, "bucket '%s': max age %" PRId64 " s is invalid",
                            opts->bucket, opts->max_age_s);
    if (opts->replicas < 0 || opts->replicas > 5)
        return ci_error_set(err, CI_ERR_INVALID, "bucket '%s': replicas must be 1 to 5, not %d",
                            opts->bucket, opts->replicas);
    CI_CLEANUP(ci_objstore_free) struct ci_objstore *os = calloc(1, sizeof(*os));
    if (!os)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    os->js = js;
    os->bucket = strdup(opts->bucket);
    os->stream = concat("OBJ_", opts->bucket);
    CI_AUTOFREE char *base = concat("$O.", opts->bucket);
    os->meta_prefix = base ? concat(base, ".M.") : NULL;
    os->chunk_prefix = base ? concat(base, ".C.") : NULL;
    if (!os->bucket || !os->stream || !os->meta_prefix || !os->chunk_prefix)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    os->opts = *opts;
    os->opts.bucket = os->bucket;
    os->create = create;
    ci_status s = ensure_stream(os, opts, create, err);
    if (s)
        return s;
    *ret = CI_STEAL(&os);
    return CI_OK;
}

/* After a failure of NATS: whether to try once more. Yes when the bucket's
 * stream is gone (an operator deleted it; a direct get then just times out,
 * so the stream itself is asked) and this store may create it again, and
 * when it is there (another thread may just have made it again). */
static bool recreate(struct ci_objstore *os, ci_status failed)
{
    if ((failed != CI_ERR_NATS && failed != CI_ERR_TIMEOUT) || !os->create)
        return false;
    jsOptions o;
    api_opts(&o);
    CI_CLEANUP(jsStreamInfo_Destroy) jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus ns = js_GetStreamInfo(&si, os->js, os->stream, &o, &jerr);
    if (ns == NATS_OK) /* there: made again by another thread a moment ago, maybe */
        return true;
    if (ns != NATS_NOT_FOUND && jerr != JSStreamNotFoundErr)
        return false; /* unknown: the failure was something else */
    return ensure_stream(os, &os->opts, true, NULL) == CI_OK;
}

/* ---- put ------------------------------------------------------------- */

/* The chunks of a put that failed: by sequence, else (a delete refused)
 * by their subject. */
static void take_back(struct ci_objstore *os, struct ci_objstore_undo *mine, const char *subject)
{
    if (delete_seqs(os, mine, NULL) != CI_OK)
        purge_subject(os, subject, NULL);
}

static ci_status put_once(struct ci_objstore *os, const char *name, const void *data, size_t len,
                          struct ci_objstore_undo *undo, struct ci_error *err)
{
    if (!os || (!data && len))
        return ci_error_set(err, CI_ERR_INVALID, "object store: missing argument");
    ci_status s = check_name(name, err);
    if (s)
        return s;
    json_t *probe = json_string(name); /* the meta holds the name as JSON text */
    if (!probe)
        return ci_error_set(err, CI_ERR_INVALID, "object name '%s' is not valid UTF-8",
                            SHOW(name));
    json_decref(probe);
    uint64_t nchunks = len / CI_OBJ_CHUNK_SIZE + (len % CI_OBJ_CHUNK_SIZE != 0);
    if (nchunks > UINT32_MAX || (uint64_t)len > INT64_MAX)
        return ci_error_set(err, CI_ERR_LIMIT, "object '%s' is too large", SHOW(name));

    /* The previous version, whose chunks go once the new meta is in. */
    struct ci_objmeta old = {0};
    bool have_old = false;
    struct ci_error ferr = {{0}};
    s = fetch_meta(os, name, &old, NULL, NULL, &ferr);
    if (s == CI_OK) {
        have_old = !old.deleted && nuid_valid(old.nuid);
    } else if (s != CI_ERR_NOT_FOUND && s != CI_ERR_INVALID && s != CI_ERR_LIMIT) {
        /* (An unreadable old meta is overwritten; its chunks cannot be found.) */
        if (err)
            *err = ferr;
        return s;
    }

    char nuid[NUID_LEN + 1];
    char mtime[40];
    if ((s = make_nuid(nuid, err))) {
        ci_objmeta_release(&old);
        return s;
    }
    CI_AUTOFREE char *digest = ci_objstore_digest(data, len);
    CI_AUTOFREE char *chunk_subj = concat(os->chunk_prefix, nuid);
    CI_AUTOFREE char *enc = ci_objstore_encode_name(name);
    CI_AUTOFREE char *meta_subj = enc ? concat(os->meta_prefix, enc) : NULL;
    CI_AUTOFREE char *json = NULL;
    if (!digest || !chunk_subj || !meta_subj) {
        s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        goto out;
    }

    /* This put's messages: a failed one's chunks go by sequence, which
     * gives their room back to a full store at once (a purge of their
     * subject does not, in nats-server 2.9). */
    struct ci_objstore_undo mine = {0};
    jsErrCode jerr = 0;
    natsStatus ns = NATS_OK;
    for (size_t off = 0; off < len; off += CI_OBJ_CHUNK_SIZE) {
        size_t n = len - off < CI_OBJ_CHUNK_SIZE ? len - off : CI_OBJ_CHUNK_SIZE;
        uint64_t seq = 0;
        ns = publish(os, chunk_subj, (const uint8_t *)data + off, (int)n, false, &seq, &jerr);
        if (ns == NATS_OK && undo_add(&mine, seq) != CI_OK)
            ns = NATS_NO_MEMORY;
        if (ns != NATS_OK) {
            s = ci_nats_fail(err, ns, jerr, "storing object '%s' in bucket '%s' failed", SHOW(name),
                          os->bucket);
            take_back(os, &mine, chunk_subj);
            goto out;
        }
    }

    now_rfc3339(mtime);
    struct ci_objmeta m = {
        .name = (char *)name,
        .bucket = os->bucket,
        .nuid = nuid,
        .mtime = mtime,
        .digest = digest,
        .size = len,
        .chunks = (uint32_t)nchunks,
        .max_chunk_size = CI_OBJ_CHUNK_SIZE,
    };
    if ((s = ci_objmeta_to_json(&m, &json, err))) {
        take_back(os, &mine, chunk_subj);
        goto out;
    }
    jerr = 0;
    uint64_t meta_seq = 0;
    ns = publish(os, meta_subj, json, (int)strlen(json), true, &meta_seq, &jerr);
    if (ns != NATS_OK) {
        s = ci_nats_fail(err, ns, jerr, "storing object '%s' in bucket '%s' failed", SHOW(name),
                      os->bucket);
        take_back(os, &mine, chunk_subj);
        goto out;
    }
    if (undo) {
        /* The caller may take it all back: chunks first, meta last. */
        for (size_t i = 0; i < mine.n && s == CI_OK; i++)
            s = undo_add(undo, mine.seqs[i]);
        if (s == CI_OK)
            s = undo_add(undo, meta_seq);
        if (s) {
            s = ci_error_set(err, CI_ERR_NOMEM, "out of memory");
            goto out;
        }
    }
    /* The new version is live. Failing to purge the old chunks leaves only
     * garbage that max_age removes, so it does not fail the put. */
    if (have_old && strcmp(old.nuid, nuid) != 0) {
        CI_AUTOFREE char *old_subj = concat(os->chunk_prefix, old.nuid);
        if (old_subj)
            purge_subject(os, old_subj, NULL);
    }
    s = CI_OK;
out:
    ci_objstore_undo_release(&mine);
    ci_objmeta_release(&old);
    return s;
}

ci_status ci_objstore_put_undoable(struct ci_objstore *os, const char *name, const void *data,
                                   size_t len, struct ci_objstore_undo *undo,
                                   struct ci_error *err)
{
    ci_status s = put_once(os, name, data, len, undo, err);
    if (s && recreate(os, s))
        s = put_once(os, name, data, len, undo, err);
    return s;
}

ci_status ci_objstore_put(struct ci_objstore *os, const char *name, const void *data, size_t len,
                          struct ci_error *err)
{
    return ci_objstore_put_undoable(os, name, data, len, NULL, err);
}

/* ---- get ------------------------------------------------------------- */

/* Reads the chunks of m into out (m->size bytes). Sets *ret_missing when a
 * chunk was not there, which happens when the object was replaced while we
 * read it or a replica lags: the caller reads the meta again. */
static ci_status read_chunks(struct ci_objstore *os, const char *name, const struct ci_objmeta *m,
                             uint8_t *out, int64_t deadline, bool *ret_missing,
                             struct ci_error *err)
{
    *ret_missing = false;
    CI_AUTOFREE char *subject = concat(os->chunk_prefix, m->nuid);
    if (!subject)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
    jsOptions o;
    api_opts(&o);
    uint64_t seq = 1, off = 0;
    /* One get past the last chunk proves there is no surplus chunk. */
    for (uint64_t i = 0; i <= m->chunks; i++) {
        if (ci_mono_ms() > deadline)
            return ci_error_set(err, CI_ERR_TIMEOUT,
                                "reading object '%s' in bucket '%s' took too long", SHOW(name),
                                os->bucket);
        jsDirectGetMsgOptions dg;
        jsDirectGetMsgOptions_Init(&dg);
        dg.Sequence = seq;
        dg.NextBySubject = subject;
        CI_CLEANUP(natsMsg_Destroy) natsMsg *msg = NULL;
        natsStatus ns = js_DirectGetMsg(&msg, os->js, os->stream, &o, &dg);
        if (ns == NATS_NOT_FOUND) {
            if (i == m->chunks)
                break;
            *ret_missing = true;
            return ci_error_set(err, CI_ERR_INTEGRITY,
                                "object '%s' in bucket '%s' is missing chunks: found %" PRIu64
                                " of %" PRIu32,
                                SHOW(name), os->bucket, i, m->chunks);
        }
        if (ns != NATS_OK)
            return ci_nats_fail(err, ns, 0, "reading object '%s' in bucket '%s' failed", SHOW(name),
                             os->bucket);
        uint64_t n = (uint64_t)natsMsg_GetDataLength(msg);
        const char *subj = natsMsg_GetSubject(msg);
        uint64_t got_seq = natsMsg_GetSequence(msg);
        ci_status s = CI_OK;
        if (!subj || strcmp(subj, subject) != 0 || got_seq < seq)
            s = ci_error_set(err, CI_ERR_NATS,
                             "reading object '%s' in bucket '%s' failed: the server "
                             "returned a message of another subject",
                             SHOW(name), os->bucket);
        else if (i == m->chunks)
            s = ci_error_set(err, CI_ERR_INTEGRITY,
                             "object '%s' in bucket '%s' has more chunks than its "
                             "metadata says (%" PRIu32 ")",
                             SHOW(name), os->bucket, m->chunks);
        else if (n > m->size - off)
            s = ci_error_set(err, CI_ERR_INTEGRITY,
                             "object '%s' in bucket '%s' holds more bytes than its "
                             "metadata says (%" PRIu64 ")",
                             SHOW(name), os->bucket, m->size);
        if (s)
            return s;
        if (n)
            memcpy(out + off, natsMsg_GetData(msg), n);
        off += n;
        seq = got_seq + 1;
    }
    if (off != m->size)
        return ci_error_set(err, CI_ERR_INTEGRITY,
                            "object '%s' in bucket '%s' holds %" PRIu64
                            " bytes; its metadata says %" PRIu64,
                            SHOW(name), os->bucket, off, m->size);
    return CI_OK;
}

/* Reads the meta of a live object with data of its own. */
static ci_status live_meta(struct ci_objstore *os, const char *name, struct ci_objmeta *ret,
                           struct ci_error *err)
{
    struct ci_objmeta m;
    bool link = false;
    ci_status s = fetch_meta(os, name, &m, &link, NULL, err);
    if (s && recreate(os, s)) /* a bucket made again is empty: not found, then */
        s = fetch_meta(os, name, &m, &link, NULL, err);
    if (s)
        return s;
    if (m.deleted) {
        ci_objmeta_release(&m);
        return ci_error_set(err, CI_ERR_NOT_FOUND, "object '%s' not found in bucket '%s'",
                            SHOW(name), os->bucket);
    }
    if (link) {
        ci_objmeta_release(&m);
        return ci_error_set(err, CI_ERR_UNSUPPORTED,
                            "object '%s' in bucket '%s' is a link, which is not supported",
                            SHOW(name), os->bucket);
    }
    *ret = m;
    return CI_OK;
}

ci_status ci_objstore_get(struct ci_objstore *os, const char *name, size_t max_len,
                          uint8_t **ret_data, size_t *ret_len, struct ci_error *err)
{
    if (!os || !ret_data || !ret_len)
        return ci_error_set(err, CI_ERR_INVALID, "object store: missing argument");
    ci_status s = check_name(name, err);
    if (s)
        return s;
    int64_t deadline = ci_mono_ms() + GET_DEADLINE_MS;
    for (int attempt = 0; attempt < GET_ATTEMPTS; attempt++) {
        struct ci_objmeta m;
        if ((s = live_meta(os, name, &m, err)))
            return s;
        uint8_t want[SHA256_DIGEST_LENGTH];
        char have[32], limit[32];
        if (m.size > max_len || m.size >= SIZE_MAX) {
            human_size(m.size, have);
            human_size(max_len, limit);
            s = ci_error_set(err, CI_ERR_LIMIT,
                             "object '%s' in bucket '%s' is %s; the limit is %s", SHOW(name),
                             os->bucket, have, limit);
        } else if (!digest_decode(m.digest, want)) {
            s = ci_error_set(err, CI_ERR_INTEGRITY,
                             "object '%s' in bucket '%s' has an unreadable digest '%s'",
                             SHOW(name), os->bucket, SHOW(m.digest));
        } else if ((m.size == 0) != (m.chunks == 0) || m.chunks > m.size ||
                   (m.size && !nuid_valid(m.nuid))) {
            s = ci_error_set(err, CI_ERR_INTEGRITY,
                             "object '%s' in bucket '%s' has inconsistent metadata (%" PRIu64
                             " bytes in %" PRIu32 " chunks)",
                             SHOW(name), os->bucket, m.size, m.chunks);
        }
        if (s) {
            ci_objmeta_release(&m);
            return s;
        }
        uint8_t *buf = malloc((size_t)m.size + 1);
        if (!buf) {
            ci_objmeta_release(&m);
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory reading object '%s'",
                                SHOW(name));
        }
        bool missing = false;
        if (m.size)
            s = read_chunks(os, name, &m, buf, deadline, &missing, err);
        if (s == CI_OK) {
            uint8_t md[SHA256_DIGEST_LENGTH];
            SHA256(buf, (size_t)m.size, md);
            if (memcmp(md, want, sizeof(md)) != 0)
                s = ci_error_set(err, CI_ERR_INTEGRITY,
                                 "object '%s' in bucket '%s' does not match its SHA-256 "
                                 "digest",
                                 SHOW(name), os->bucket);
        }
        size_t size = (size_t)m.size;
        ci_objmeta_release(&m);
        if (s == CI_OK) {
            buf[size] = 0;
            *ret_data = buf;
            *ret_len = size;
            return CI_OK;
        }
        free(buf);
        /* Replaced while we read (its old chunks purged), or a replica
         * behind: take the newest meta again, a little later each time. */
        if (!missing || ci_mono_ms() > deadline)
            return s;
        nats_Sleep(25 * (attempt + 1));
    }
    return s;
}

ci_status ci_objstore_info(struct ci_objstore *os, const char *name, struct ci_objmeta *ret,
                           struct ci_error *err)
{
    if (!os || !ret)
        return ci_error_set(err, CI_ERR_INVALID, "object store: missing argument");
    ci_status s = check_name(name, err);
    if (s)
        return s;
    struct ci_objmeta m;
    bool link = false;
    if ((s = fetch_meta(os, name, &m, &link, NULL, err)))
        return s;
    if (m.deleted) {
        ci_objmeta_release(&m);
        return ci_error_set(err, CI_ERR_NOT_FOUND, "object '%s' not found in bucket '%s'",
                            SHOW(name), os->bucket);
    }
    *ret = m;
    return CI_OK;
}

/* ---- delete ---------------------------------------------------------- */

ci_status ci_objstore_delete(struct ci_objstore *os, const char *name, struct ci_error *err)
{
    if (!os)
        return ci_error_set(err, CI_ERR_INVALID, "object store: missing argument");
    ci_status s = check_name(name, err);
    if (s)
        return s;
    struct ci_objmeta m;
    CI_AUTOFREE char *raw = NULL;
    if ((s = fetch_meta(os, name, &m, NULL, &raw, err)))
        return s;
    CI_AUTOFREE char *nuid = m.nuid ? strdup(m.nuid) : NULL;
    bool deleted = m.deleted;
    ci_objmeta_release(&m);
    if (deleted)
        return ci_error_set(err, CI_ERR_NOT_FOUND, "object '%s' not found in bucket '%s'",
                            SHOW(name), os->bucket);
    /* Keep the fields other clients wrote (description, headers, ...), as
     * they do when they delete. */
    json_t *o = json_loads(raw, 0, NULL);
    char mtime[40];
    now_rfc3339(mtime);
    int rc = o ? 0 : -1;
    if (o) {
        rc |= json_object_set_new(o, "deleted", json_true());
        rc |= json_object_set_new(o, "size", json_integer(0));
        rc |= json_object_set_new(o, "chunks", json_integer(0));
        rc |= json_object_set_new(o, "digest", json_string(""));
        rc |= json_object_set_new(o, "mtime", json_string(mtime));
    }
    CI_AUTOFREE char *json = rc == 0 ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    CI_AUTOFREE char *enc = ci_objstore_encode_name(name);
    CI_AUTOFREE char *subject = enc ? concat(os->meta_prefix, enc) : NULL;
    if (!json || !subject)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory deleting object '%s'", SHOW(name));
    jsErrCode jerr = 0;
    natsStatus ns = publish(os, subject, json, (int)strlen(json), true, NULL, &jerr);
    if (ns != NATS_OK)
        return ci_nats_fail(err, ns, jerr, "deleting object '%s' in bucket '%s' failed", SHOW(name),
                         os->bucket);
    if (nuid_valid(nuid)) {
        CI_AUTOFREE char *chunks = concat(os->chunk_prefix, nuid);
        if (!chunks)
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory");
        jerr = 0;
        ns = purge_subject(os, chunks, &jerr);
        if (ns != NATS_OK)
            return ci_nats_fail(err, ns, jerr,
                             "object '%s' was deleted from bucket '%s' but purging its "
                             "chunks failed",
                             SHOW(name), os->bucket);
    }
    return CI_OK;
}
