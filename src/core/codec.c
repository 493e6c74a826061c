/* codec.c - protobuf (protobuf-c) and the proto3 canonical JSON mapping
 * (jansson), both driven by the generated descriptors.
 *
 * The JSON decoder builds messages exactly as protobuf_c_message_unpack()
 * lays them out (every string, bytes buffer, array and sub-message malloc'd;
 * untouched strings left pointing at the descriptor's default), so that
 * protobuf_c_message_free_unpacked() frees either kind the same way.
 *
 * Strings: protobuf-c copies strings without checking them, and a C string
 * cannot show an embedded NUL. The protobuf decoder therefore scans the wire
 * bytes and refuses strings that are not UTF-8 or hold a NUL; jansson refuses
 * both in JSON. So every decoded char * is the whole, valid UTF-8 value.
 * The encoders replace invalid UTF-8 in strings with U+FFFD rather than fail:
 * a result must always be publishable, whatever bytes the user code printed. */
#include "core/codec.h"

#include <float.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/util.h"

/* Deep enough for every message of ci.proto (at most 3 levels) with room to
 * spare; stops hostile or buggy nesting long before the stack is at risk. */
#define CODEC_MAX_DEPTH 32
/* Longest field path quoted in an error ("files[3].content"). */
#define PATH_CAP 160
/* Longest piece of user text quoted in an error. */
#define QUOTE_CAP 48

/* ---- small helpers ---------------------------------------------------- */

struct path {
    char buf[PATH_CAP];
    size_t len;
};

/* Appends to the path; returns the old length for path_pop(). A path that
 * does not fit is cut with "...". */
static size_t path_pushf(struct path *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static size_t path_pushf(struct path *p, const char *fmt, ...)
{
    size_t old = p->len;
    if (p->len >= sizeof(p->buf) - 1)
        return old;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(p->buf + p->len, sizeof(p->buf) - p->len, fmt, ap);
    va_end(ap);
    if (n < 0) {
        p->buf[p->len] = '\0';
        return old;
    }
    if ((size_t)n >= sizeof(p->buf) - p->len) {
        memcpy(p->buf + sizeof(p->buf) - 4, "...", 4);
        p->len = sizeof(p->buf) - 1;
    } else {
        p->len += (size_t)n;
    }
    return old;
}

static void path_pop(struct path *p, size_t old)
{
    p->len = old;
    p->buf[old] = '\0';
}

/* Copies user-controlled text into out as printable ASCII (others become
 * '?'), cut to fit out with "...", so that an error sentence is
 * always safe to log and to put in a UTF-8 string field. */
static void quote_text(char *out, size_t outsz, const char *s, size_t len)
{
    size_t o = 0;
    size_t cap = outsz - 1;
    for (size_t i = 0; i < len && o < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        out[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (o < len && o >= 3 && len > cap)
        memcpy(out + o - 3, "...", 3);
    out[o] = '\0';
}

/* protoc's ToJsonName: drop '_' and upper-case the letter after it. */
static void json_name(const char *name, char *out, size_t outsz)
{
    size_t o = 0;
    bool up = false;
    for (const char *c = name; *c && o + 1 < outsz; c++) {
        if (*c == '_') {
            up = true;
            continue;
        }
        out[o++] = (up && *c >= 'a' && *c <= 'z') ? (char)(*c - 'a' + 'A') : *c;
        up = false;
    }
    out[o] = '\0';
}

/* Length of the valid UTF-8 sequence at s, or 0 when it is invalid
 * (overlong forms, surrogates and values above U+10FFFF are invalid). */
static size_t utf8_seq(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    if (c < 0x80)
        return 1;
    uint8_t lo = 0x80, hi = 0xBF;
    size_t need;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (n < need + 1)
        return 0;
    if (s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i <= need; i++)
        if ((s[i] & 0xC0) != 0x80)
            return 0;
    return need + 1;
}

static bool utf8_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq(s + i, n - i);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

/* A malloc'd copy of s with each invalid byte replaced by U+FFFD. */
static char *utf8_fix(const char *s, size_t n)
{
    struct ci_buf b = CI_BUF_INIT;
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq((const uint8_t *)s + i, n - i);
        ci_status st = k ? ci_buf_append(&b, s + i, k) : ci_buf_append(&b, "\xEF\xBF\xBD", 3);
        if (st) {
            ci_buf_release(&b);
            return NULL;
        }
        i += k ? k : 1;
    }
    return (char *)ci_buf_steal(&b, NULL);
}

static size_t elt_size(ProtobufCType t)
{
    switch (t) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM:
        return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
        return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(ProtobufCMessage *);
    }
    return 0;
}

#define MEMBER(msg, off) ((void *)((char *)(msg) + (off)))

/* protoc-c has no map flag: a map<K,V> is a repeated <FieldName>Entry
 * message with exactly the fields key = 1 and value = 2. */
static bool is_map_field(const ProtobufCFieldDescriptor *f)
{
    if (f->label != PROTOBUF_C_LABEL_REPEATED || f->type != PROTOBUF_C_TYPE_MESSAGE)
        return false;
    const ProtobufCMessageDescriptor *md = f->descriptor;
    if (md->n_fields != 2 || md->fields[0].id != 1 || md->fields[1].id != 2 ||
        strcmp(md->fields[0].name, "key") != 0 || strcmp(md->fields[1].name, "value") != 0)
        return false;
    char want[128];
    size_t o = 0;
    bool up = true;
    for (const char *c = f->name; *c && o + 1 < sizeof(want); c++) {
        if (*c == '_') {
            up = true;
            continue;
        }
        want[o++] = (up && *c >= 'a' && *c <= 'z') ? (char)(*c - 'a' + 'A') : *c;
        up = false;
    }
    want[o] = '\0';
    size_t wl = strlen(want);
    return strncmp(md->short_name, want, wl) == 0 && strcmp(md->short_name + wl, "Entry") == 0;
}

static const ProtobufCFieldDescriptor *field_by_id(const ProtobufCMessageDescriptor *desc,
                                                   uint32_t id)
{
    for (unsigned i = 0; i < desc->n_fields; i++)
        if (desc->fields[i].id == id)
            return &desc->fields[i];
    return NULL;
}

/* ---- content types and statuses ---------------------------------------- */

ci_status ci_encoding_from_content_type(const char *content_type, enum ci_encoding *ret,
                                        struct ci_error *err)
{
    if (!content_type)
        content_type = "";
    const char *s = content_type;
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strcspn(s, ";");
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        n--;
    enum ci_encoding enc;
    if (n == 0 || (n == 20 && strncasecmp(s, "application/protobuf", n) == 0) ||
        (n == 22 && strncasecmp(s, "application/x-protobuf", n) == 0)) {
        enc = CI_ENC_PROTOBUF;
    } else if (n == 16 && strncasecmp(s, "application/json", n) == 0) {
        enc = CI_ENC_JSON;
    } else {
        char q[QUOTE_CAP + 1];
        quote_text(q, sizeof(q), s, n);
        return ci_error_set(err, CI_ERR_INVALID,
                            "unsupported Content-Type '%s': use application/protobuf or "
                            "application/json",
                            q);
    }
    *ret = enc;
    return CI_OK;
}

const char *ci_encoding_content_type(enum ci_encoding enc)
{
    return enc == CI_ENC_JSON ? "application/json" : "application/protobuf";
}

const char *ci_task_status_name(Ci__V1__TaskStatus s)
{
    switch (s) {
    case CI__V1__TASK_STATUS__TASK_STATUS_QUEUED: return "TASK_STATUS_QUEUED";
    case CI__V1__TASK_STATUS__TASK_STATUS_RUNNING: return "TASK_STATUS_RUNNING";
    case CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED: return "TASK_STATUS_SUCCEEDED";
    case CI__V1__TASK_STATUS__TASK_STATUS_FAILED: return "TASK_STATUS_FAILED";
    case CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT: return "TASK_STATUS_TIMED_OUT";
    case CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED: return "TASK_STATUS_CANCELLED";
    default: return "TASK_STATUS_UNSPECIFIED";
    }
}

const char *ci_task_status_short(Ci__V1__TaskStatus s)
{
    switch (s) {
    case CI__V1__TASK_STATUS__TASK_STATUS_QUEUED: return "queued";
    case CI__V1__TASK_STATUS__TASK_STATUS_RUNNING: return "running";
    case CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED: return "succeeded";
    case CI__V1__TASK_STATUS__TASK_STATUS_FAILED: return "failed";
    case CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT: return "timed_out";
    case CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED: return "cancelled";
    default: return "unspecified";
    }
}

bool ci_task_status_terminal(Ci__V1__TaskStatus s)
{
    return s == CI__V1__TASK_STATUS__TASK_STATUS_SUCCEEDED ||
           s == CI__V1__TASK_STATUS__TASK_STATUS_FAILED ||
           s == CI__V1__TASK_STATUS__TASK_STATUS_TIMED_OUT ||
           s == CI__V1__TASK_STATUS__TASK_STATUS_CANCELLED;
}

void ci_message_free(ProtobufCMessage *msg)
{
    if (msg)
        protobuf_c_message_free_unpacked(msg, NULL);
}

/* ---- JSON encoding ----------------------------------------------------- */

struct enc {
    struct ci_error *err;
    struct path path;
};

static ci_status enc_message(struct enc *e, const ProtobufCMessage *msg, int depth, json_t **ret);

static json_t *enc_string(const char *s)
{
    if (!s)
        s = "";
    size_t n = strlen(s);
    if (utf8_valid((const uint8_t *)s, n))
        return json_stringn(s, n);
    char *fixed = utf8_fix(s, n);
    if (!fixed)
        return NULL;
    json_t *j = json_string(fixed);
    free(fixed);
    return j;
}

static json_t *enc_float(double d)
{
    if (isnan(d))
        return json_string("NaN");
    if (isinf(d))
        return json_string(d > 0 ? "Infinity" : "-Infinity");
    return json_real(d);
}

/* One value of field f stored at member (an element, for repeated fields). */
static ci_status enc_value(struct enc *e, const ProtobufCFieldDescriptor *f, const void *member,
                           int depth, json_t **ret)
{
    json_t *j = NULL;
    char num[32];
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        j = json_integer(*(const int32_t *)member);
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        j = json_integer(*(const uint32_t *)member);
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        snprintf(num, sizeof(num), "%" PRId64, *(const int64_t *)member);
        j = json_string(num);
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        snprintf(num, sizeof(num), "%" PRIu64, *(const uint64_t *)member);
        j = json_string(num);
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        j = enc_float(*(const float *)member);
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        j = enc_float(*(const double *)member);
        break;
    case PROTOBUF_C_TYPE_BOOL:
        j = json_boolean(*(const protobuf_c_boolean *)member);
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        int32_t v = *(const int32_t *)member;
        const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(f->descriptor, v);
        j = ev ? json_string(ev->name) : json_integer(v);
        break;
    }
    case PROTOBUF_C_TYPE_STRING:
        j = enc_string(*(char *const *)member);
        break;
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *bd = member;
        if (bd->len > 0 && !bd->data)
            return ci_error_set(e->err, CI_ERR_INVALID, "field '%s': %zu bytes but no data",
                                e->path.buf, bd->len);
        size_t n;
        char *b64 = ci_base64_encode(bd->data, bd->len, CI_B64_STD, true, &n);
        if (b64)
            j = json_stringn(b64, n);
        free(b64);
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)member;
        if (!sub) {
            j = json_object();
            break;
        }
        return enc_message(e, sub, depth + 1, ret);
    }
    }
    if (!j)
        return ci_error_set(e->err, CI_ERR_NOMEM, "out of memory encoding field '%s'", e->path.buf);
    *ret = j;
    return CI_OK;
}

/* A map entry's key as a JSON object key (always a string in JSON). */
static char *enc_map_key(const ProtobufCFieldDescriptor *kf, const void *member)
{
    char num[32];
    switch (kf->type) {
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)member;
        if (!s)
            s = "";
        return utf8_fix(s, strlen(s));
    }
    case PROTOBUF_C_TYPE_BOOL:
        return strdup(*(const protobuf_c_boolean *)member ? "true" : "false");
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        snprintf(num, sizeof(num), "%" PRId32, *(const int32_t *)member);
        return strdup(num);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        snprintf(num, sizeof(num), "%" PRIu32, *(const uint32_t *)member);
        return strdup(num);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        snprintf(num, sizeof(num), "%" PRId64, *(const int64_t *)member);
        return strdup(num);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        snprintf(num, sizeof(num), "%" PRIu64, *(const uint64_t *)member);
        return strdup(num);
    default:
        return NULL; /* protobuf allows no other key type */
    }
}

static ci_status enc_repeated(struct enc *e, const ProtobufCMessage *msg,
                              const ProtobufCFieldDescriptor *f, int depth, json_t **ret)
{
    size_t n = *(const size_t *)MEMBER(msg, f->quantifier_offset);
    const char *arr = *(char *const *)MEMBER(msg, f->offset);
    if (!arr)
        return ci_error_set(e->err, CI_ERR_INVALID, "field '%s': %zu elements but no array",
                            e->path.buf, n);
    size_t sz = elt_size(f->type);
    bool map = is_map_field(f);
    json_t *out = map ? json_object() : json_array();
    if (!out)
        return ci_error_set(e->err, CI_ERR_NOMEM, "out of memory encoding field '%s'", e->path.buf);
    for (size_t i = 0; i < n; i++) {
        const void *elem = arr + i * sz;
        size_t old = path_pushf(&e->path, "[%zu]", i);
        ci_status s;
        if (map) {
            const ProtobufCMessage *entry = *(ProtobufCMessage *const *)elem;
            const ProtobufCMessageDescriptor *md = f->descriptor;
            if (!entry) {
                s = ci_error_set(e->err, CI_ERR_INVALID, "field '%s': NULL map entry",
                                 e->path.buf);
            } else {
                char *key = enc_map_key(&md->fields[0], MEMBER(entry, md->fields[0].offset));
                json_t *v = NULL;
                if (!key)
                    s = ci_error_set(e->err, CI_ERR_NOMEM, "out of memory encoding '%s'",
                                     e->path.buf);
                else
                    s = enc_value(e, &md->fields[1], MEMBER(entry, md->fields[1].offset),
                                  depth, &v);
                if (!s && json_object_set_new(out, key, v) != 0)
                    s = ci_error_set(e->err, CI_ERR_NOMEM, "out of memory encoding '%s'",
                                     e->path.buf);
                free(key);
            }
        } else {
            json_t *v = NULL;
            s = enc_value(e, f, elem, depth, &v);
            if (!s && json_array_append_new(out, v) != 0)
                s = ci_error_set(e->err, CI_ERR_NOMEM, "out of memory encoding '%s'",
                                 e->path.buf);
        }
        path_pop(&e->path, old);
        if (s) {
            json_decref(out);
            return s;
        }
    }
    *ret = out;
    return CI_OK;
}

/* proto3: a singular field is written only when it differs from its
 * default; members of a oneof are written whenever they are the one set. */
static bool is_default(const ProtobufCFieldDescriptor *f, const void *member)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        return *(const uint32_t *)member == 0;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return *(const uint64_t *)member == 0;
    case PROTOBUF_C_TYPE_FLOAT: {
        float v;
        memcpy(&v, member, sizeof(v));
        return v == 0 && !signbit(v);
    }
    case PROTOBUF_C_TYPE_DOUBLE: {
        double v;
        memcpy(&v, member, sizeof(v));
        return v == 0 && !signbit(v);
    }
    case PROTOBUF_C_TYPE_BOOL:
        return !*(const protobuf_c_boolean *)member;
    case PROTOBUF_C_TYPE_STRING: {
        const char *s = *(char *const *)member;
        return !s || !*s;
    }
    case PROTOBUF_C_TYPE_BYTES:
        return ((const ProtobufCBinaryData *)member)->len == 0;
    case PROTOBUF_C_TYPE_MESSAGE:
        return *(ProtobufCMessage *const *)member == NULL;
    }
    return true;
}

static ci_status enc_message(struct enc *e, const ProtobufCMessage *msg, int depth, json_t **ret)
{
    if (depth > CODEC_MAX_DEPTH)
        return ci_error_set(e->err, CI_ERR_INVALID, "message nested deeper than %d levels at '%s'",
                            CODEC_MAX_DEPTH, e->path.buf);
    const ProtobufCMessageDescriptor *desc = msg->descriptor;
    json_t *obj = json_object();
    if (!obj)
        return ci_error_set(e->err, CI_ERR_NOMEM, "out of memory encoding JSON");
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        const void *member = MEMBER(msg, f->offset);
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (*(const uint32_t *)MEMBER(msg, f->quantifier_offset) != f->id)
                continue;
        } else if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            if (*(const size_t *)MEMBER(msg, f->quantifier_offset) == 0)
                continue;
        } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset &&
                   f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE) {
            if (!*(const protobuf_c_boolean *)MEMBER(msg, f->quantifier_offset))
                continue; /* proto2 has_ flag */
        } else if (is_default(f, member)) {
            continue;
        }
        char name[128];
        json_name(f->name, name, sizeof(name));
        size_t old = path_pushf(&e->path, "%s%s", e->path.len ? "." : "", name);
        json_t *v = NULL;
        ci_status s = f->label == PROTOBUF_C_LABEL_REPEATED ? enc_repeated(e, msg, f, depth, &v)
                                                            : enc_value(e, f, member, depth, &v);
        if (!s && json_object_set_new(obj, name, v) != 0)
            s = ci_error_set(e->err, CI_ERR_NOMEM, "out of memory encoding JSON");
        path_pop(&e->path, old);
        if (s) {
            json_decref(obj);
            return s;
        }
    }
    *ret = obj;
    return CI_OK;
}

static int dump_cb(const char *buffer, size_t size, void *data)
{
    return ci_buf_append(data, buffer, size) == CI_OK ? 0 : -1;
}

/* ---- JSON decoding ----------------------------------------------------- */

struct dec {
    struct ci_error *err;
    struct path path;
    const char *root; /* short name of the top-level message */
};

static ci_status dec_message(struct dec *d, const ProtobufCMessageDescriptor *desc, json_t *obj,
                             int depth, ProtobufCMessage **ret);

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

static ci_status dec_expected(struct dec *d, const char *what, const json_t *v)
{
    return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': expected %s, got %s", d->path.buf,
                        what, json_kind(v));
}

/* Parses a decimal integer string exactly: an optional '-' (for unsigned
 * only "-0"), digits, nothing else. *range tells "an integer, but too big"
 * from "not an integer". */
static bool parse_dec_str(const char *s, size_t n, bool *neg, uint64_t *mag, bool *range)
{
    *range = false;
    *neg = n > 0 && s[0] == '-';
    size_t i = *neg ? 1 : 0;
    if (i == n)
        return false;
    for (size_t k = i; k < n; k++)
        if (s[k] < '0' || s[k] > '9')
            return false;
    uint64_t v = 0;
    for (size_t k = i; k < n; k++) {
        uint64_t dgt = (uint64_t)(s[k] - '0');
        if (v > (UINT64_MAX - dgt) / 10) {
            *range = true;
            return false;
        }
        v = v * 10 + dgt;
    }
    *mag = v;
    return true;
}

static bool parse_i64_str(const char *s, size_t n, int64_t *ret, bool *range)
{
    bool neg;
    uint64_t v;
    if (!parse_dec_str(s, n, &neg, &v, range))
        return false;
    if (v > (uint64_t)INT64_MAX + (neg ? 1 : 0)) {
        *range = true;
        return false;
    }
    *ret = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
    return true;
}

static bool parse_u64_str(const char *s, size_t n, uint64_t *ret, bool *range)
{
    bool neg;
    uint64_t v;
    if (!parse_dec_str(s, n, &neg, &v, range))
        return false;
    if (neg && v != 0) {
        *range = true;
        return false;
    }
    *ret = v;
    return true;
}

static ci_status dec_bad_int_str(struct dec *d, const json_t *v, bool range, const char *tname)
{
    char q[QUOTE_CAP + 1];
    quote_text(q, sizeof(q), json_string_value(v), json_string_length(v));
    if (range)
        return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': '%s' is out of range for %s",
                            d->path.buf, q, tname);
    return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': '%s' is not an integer",
                        d->path.buf, q);
}

/* A JSON number, or a string holding one, as an integer in [min, max]. */
static ci_status dec_int(struct dec *d, const json_t *v, int64_t min, int64_t max,
                         const char *tname, int64_t *ret)
{
    int64_t x;
    if (json_is_integer(v)) {
        x = json_integer_value(v);
    } else if (json_is_real(v)) {
        double r = json_real_value(v);
        if (!(r >= -9223372036854775808.0 && r < 9223372036854775808.0))
            return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': %g is out of range for %s",
                                d->path.buf, r, tname);
        x = (int64_t)r;
        if ((double)x != r)
            return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': %g is not an integer",
                                d->path.buf, r);
    } else if (json_is_string(v)) {
        bool range;
        if (!parse_i64_str(json_string_value(v), json_string_length(v), &x, &range))
            return dec_bad_int_str(d, v, range, tname);
    } else {
        return dec_expected(d, "a number", v);
    }
    if (x < min || x > max)
        return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': %" PRId64 " is out of range for %s",
                            d->path.buf, x, tname);
    *ret = x;
    return CI_OK;
}

static ci_status dec_uint(struct dec *d, const json_t *v, uint64_t max, const char *tname,
                          uint64_t *ret)
{
    uint64_t x;
    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        if (i < 0)
            return ci_error_set(d->err, CI_ERR_INVALID,
                                "field '%s': %" JSON_INTEGER_FORMAT " is out of range for %s",
                                d->path.buf, i, tname);
        x = (uint64_t)i;
    } else if (json_is_real(v)) {
        double r = json_real_value(v);
        if (!(r > -1.0 && r < 18446744073709551616.0))
            return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': %g is out of range for %s",
                                d->path.buf, r, tname);
        x = r <= 0 ? 0 : (uint64_t)r;
        if ((double)x != r)
            return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': %g is not an integer",
                                d->path.buf, r);
    } else if (json_is_string(v)) {
        bool range;
        if (!parse_u64_str(json_string_value(v), json_string_length(v), &x, &range))
            return dec_bad_int_str(d, v, range, tname);
    } else {
        return dec_expected(d, "a number", v);
    }
    if (x > max)
        return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': %" PRIu64 " is out of range for %s",
                            d->path.buf, x, tname);
    *ret = x;
    return CI_OK;
}

static ci_status dec_double(struct dec *d, const json_t *v, bool is_float, double *ret)
{
    double r;
    if (json_is_number(v)) {
        r = json_number_value(v);
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        if (strcmp(s, "NaN") == 0) {
            r = NAN;
        } else if (strcmp(s, "Infinity") == 0) {
            r = INFINITY;
        } else if (strcmp(s, "-Infinity") == 0) {
            r = -INFINITY;
        } else {
            char *end = NULL;
            bool ok = n > 0 && n < 64 && strspn(s, "0123456789+-.eE") == n;
            if (ok) {
                r = strtod(s, &end);
                ok = end == s + n && isfinite(r);
            }
            if (!ok) {
                char q[QUOTE_CAP + 1];
                quote_text(q, sizeof(q), s, n);
                return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': '%s' is not a number",
                                    d->path.buf, q);
            }
        }
    } else {
        return dec_expected(d, "a number", v);
    }
    if (is_float && isfinite(r) && (r > FLT_MAX || r < -FLT_MAX))
        return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': %g is out of range for float",
                            d->path.buf, r);
    *ret = r;
    return CI_OK;
}

static ci_status dec_enum(struct dec *d, const ProtobufCEnumDescriptor *ed, const json_t *v,
                          int32_t *ret)
{
    if (json_is_string(v)) {
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value_by_name(ed, json_string_value(v));
        if (!ev) {
            char q[QUOTE_CAP + 1], names[256];
            size_t o = 0;
            names[0] = '\0';
            for (unsigned i = 0; i < ed->n_values && o < sizeof(names); i++) {
                int n = snprintf(names + o, sizeof(names) - o, "%s%s", i ? ", " : "",
                                 ed->values[i].name);
                if (n < 0)
                    break;
                o += (size_t)n;
            }
            quote_text(q, sizeof(q), json_string_value(v), json_string_length(v));
            return ci_error_set(d->err, CI_ERR_INVALID,
                                "field '%s': unknown %s value '%s' (expected one of %s)",
                                d->path.buf, ed->short_name, q, names);
        }
        *ret = ev->value;
        return CI_OK;
    }
    if (json_is_number(v)) {
        int64_t x;
        ci_status s = dec_int(d, v, INT32_MIN, INT32_MAX, ed->short_name, &x);
        if (s)
            return s;
        *ret = (int32_t)x;
        return CI_OK;
    }
    return dec_expected(d, "an enum name", v);
}

/* Decodes v (not null) as one value of field f into member. Writes member
 * only on success; everything it points to is malloc'd. */
static ci_status dec_value(struct dec *d, const ProtobufCFieldDescriptor *f, json_t *v,
                           void *member, int depth)
{
    ci_status s;
    int64_t i;
    uint64_t u;
    double r;
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        if ((s = dec_int(d, v, INT32_MIN, INT32_MAX, "int32", &i)))
            return s;
        *(int32_t *)member = (int32_t)i;
        return CI_OK;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        if ((s = dec_uint(d, v, UINT32_MAX, "uint32", &u)))
            return s;
        *(uint32_t *)member = (uint32_t)u;
        return CI_OK;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        if ((s = dec_int(d, v, INT64_MIN, INT64_MAX, "int64", &i)))
            return s;
        *(int64_t *)member = i;
        return CI_OK;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        if ((s = dec_uint(d, v, UINT64_MAX, "uint64", &u)))
            return s;
        *(uint64_t *)member = u;
        return CI_OK;
    case PROTOBUF_C_TYPE_FLOAT:
        if ((s = dec_double(d, v, true, &r)))
            return s;
        *(float *)member = (float)r;
        return CI_OK;
    case PROTOBUF_C_TYPE_DOUBLE:
        if ((s = dec_double(d, v, false, &r)))
            return s;
        *(double *)member = r;
        return CI_OK;
    case PROTOBUF_C_TYPE_BOOL:
        if (!json_is_boolean(v))
            return dec_expected(d, "true or false", v);
        *(protobuf_c_boolean *)member = json_is_true(v);
        return CI_OK;
    case PROTOBUF_C_TYPE_ENUM: {
        int32_t e = 0;
        if ((s = dec_enum(d, f->descriptor, v, &e)))
            return s;
        *(int32_t *)member = e;
        return CI_OK;
    }
    case PROTOBUF_C_TYPE_STRING: {
        if (!json_is_string(v))
            return dec_expected(d, "a string", v);
        size_t n = json_string_length(v);
        char *str = malloc(n + 1);
        if (!str)
            return ci_error_set(d->err, CI_ERR_NOMEM, "out of memory decoding '%s'", d->path.buf);
        memcpy(str, json_string_value(v), n + 1);
        *(char **)member = str;
        return CI_OK;
    }
    case PROTOBUF_C_TYPE_BYTES: {
        if (!json_is_string(v))
            return dec_expected(d, "a base64 string", v);
        ProtobufCBinaryData bd;
        /* Either alphabet, padded or not, as proto3 JSON parsers accept. */
        if (ci_base64_decode(json_string_value(v), json_string_length(v),
                             CI_B64_STD | CI_B64_URL, &bd.data, &bd.len))
            return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': not valid base64",
                                d->path.buf);
        *(ProtobufCBinaryData *)member = bd;
        return CI_OK;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        if (!json_is_object(v))
            return dec_expected(d, "an object", v);
        ProtobufCMessage *sub;
        if ((s = dec_message(d, f->descriptor, v, depth + 1, &sub)))
            return s;
        *(ProtobufCMessage **)member = sub;
        return CI_OK;
    }
    }
    return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': unsupported type", d->path.buf);
}

static ci_status dec_map_key(struct dec *d, const ProtobufCFieldDescriptor *kf, const char *key,
                             void *member)
{
    json_t *k = json_string(key);
    if (!k)
        return ci_error_set(d->err, CI_ERR_NOMEM, "out of memory decoding '%s'", d->path.buf);
    ci_status s;
    if (kf->type == PROTOBUF_C_TYPE_BOOL) {
        bool t = strcmp(key, "true") == 0;
        if (t || strcmp(key, "false") == 0) {
            *(protobuf_c_boolean *)member = t;
            s = CI_OK;
        } else {
            s = ci_error_set(d->err, CI_ERR_INVALID, "field '%s': map key must be true or false",
                             d->path.buf);
        }
    } else {
        s = dec_value(d, kf, k, member, 0);
    }
    json_decref(k);
    return s;
}

static ci_status dec_map(struct dec *d, ProtobufCMessage *msg, const ProtobufCFieldDescriptor *f,
                         json_t *v, int depth)
{
    if (!json_is_object(v))
        return dec_expected(d, "an object", v);
    size_t n = json_object_size(v);
    if (n == 0)
        return CI_OK;
    ProtobufCMessage **arr = calloc(n, sizeof(*arr));
    if (!arr)
        return ci_error_set(d->err, CI_ERR_NOMEM, "out of memory decoding '%s'", d->path.buf);
    size_t *np = MEMBER(msg, f->quantifier_offset);
    *(ProtobufCMessage ***)MEMBER(msg, f->offset) = arr;
    *np = 0;
    const ProtobufCMessageDescriptor *md = f->descriptor;
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val)
    {
        char q[QUOTE_CAP + 1];
        quote_text(q, sizeof(q), key, strlen(key));
        size_t old = path_pushf(&d->path, "[\"%s\"]", q);
        ci_status s = CI_OK;
        ProtobufCMessage *entry = malloc(md->sizeof_message);
        if (!entry) {
            s = ci_error_set(d->err, CI_ERR_NOMEM, "out of memory decoding '%s'", d->path.buf);
        } else {
            protobuf_c_message_init(md, entry);
            if (json_is_null(val))
                s = ci_error_set(d->err, CI_ERR_INVALID, "field '%s': a map value cannot be null",
                                 d->path.buf);
            if (!s)
                s = dec_map_key(d, &md->fields[0], key, MEMBER(entry, md->fields[0].offset));
            if (!s)
                s = dec_value(d, &md->fields[1], val, MEMBER(entry, md->fields[1].offset), depth);
            if (s)
                protobuf_c_message_free_unpacked(entry, NULL);
            else
                arr[(*np)++] = entry;
        }
        path_pop(&d->path, old);
        if (s)
            return s;
    }
    return CI_OK;
}

static ci_status dec_repeated(struct dec *d, ProtobufCMessage *msg,
                              const ProtobufCFieldDescriptor *f, json_t *v, int depth)
{
    if (is_map_field(f))
        return dec_map(d, msg, f, v, depth);
    if (!json_is_array(v))
        return dec_expected(d, "an array", v);
    size_t n = json_array_size(v);
    if (n == 0)
        return CI_OK;
    size_t sz = elt_size(f->type);
    char *arr = calloc(n, sz);
    if (!arr)
        return ci_error_set(d->err, CI_ERR_NOMEM, "out of memory decoding '%s'", d->path.buf);
    /* the count grows with each element decoded, so that a failure half-way
     * leaves a message that free_unpacked releases exactly */
    size_t *np = MEMBER(msg, f->quantifier_offset);
    *(char **)MEMBER(msg, f->offset) = arr;
    *np = 0;
    for (size_t i = 0; i < n; i++) {
        size_t old = path_pushf(&d->path, "[%zu]", i);
        json_t *e = json_array_get(v, i);
        ci_status s = json_is_null(e) ? ci_error_set(d->err, CI_ERR_INVALID,
                                                     "field '%s': null is not allowed in a list",
                                                     d->path.buf)
                                      : dec_value(d, f, e, arr + i * sz, depth);
        path_pop(&d->path, old);
        if (s)
            return s;
        (*np)++;
    }
    return CI_OK;
}

static const ProtobufCFieldDescriptor *find_field(const ProtobufCMessageDescriptor *desc,
                                                  const char *key)
{
    for (unsigned i = 0; i < desc->n_fields; i++) {
        char name[128];
        json_name(desc->fields[i].name, name, sizeof(name));
        if (strcmp(key, name) == 0 || strcmp(key, desc->fields[i].name) == 0)
            return &desc->fields[i];
    }
    return NULL;
}

static ci_status dec_unknown(struct dec *d, const ProtobufCMessageDescriptor *desc,
                             const char *key)
{
    char q[QUOTE_CAP + 1], names[256];
    size_t o = 0;
    names[0] = '\0';
    for (unsigned i = 0; i < desc->n_fields && o < sizeof(names); i++) {
        char name[128];
        json_name(desc->fields[i].name, name, sizeof(name));
        int n = snprintf(names + o, sizeof(names) - o, "%s%s", i ? ", " : "", name);
        if (n < 0)
            break;
        o += (size_t)n;
    }
    quote_text(q, sizeof(q), key, strlen(key));
    if (d->path.len == 0)
        return ci_error_set(d->err, CI_ERR_INVALID, "unknown field '%s' in %s (known fields: %s)",
                            q, d->root, names);
    return ci_error_set(d->err, CI_ERR_INVALID,
                        "unknown field '%s.%s' in %s (%s has fields: %s)", d->path.buf, q,
                        d->root, desc->short_name, names);
}

static ci_status dec_message(struct dec *d, const ProtobufCMessageDescriptor *desc, json_t *obj,
                             int depth, ProtobufCMessage **ret)
{
    if (depth > CODEC_MAX_DEPTH)
        return ci_error_set(d->err, CI_ERR_INVALID, "field '%s': nested deeper than %d levels",
                            d->path.buf, CODEC_MAX_DEPTH);
    ProtobufCMessage *msg = malloc(desc->sizeof_message);
    uint8_t *seen = calloc(desc->n_fields ? desc->n_fields : 1, 1);
    if (!msg || !seen) {
        free(msg);
        free(seen);
        return ci_error_set(d->err, CI_ERR_NOMEM, "out of memory decoding JSON");
    }
    protobuf_c_message_init(desc, msg);
    ci_status s = CI_OK;
    const char *key;
    json_t *val;
    json_object_foreach(obj, key, val)
    {
        const ProtobufCFieldDescriptor *f = find_field(desc, key);
        if (!f) {
            s = dec_unknown(d, desc, key);
            break;
        }
        char name[128];
        json_name(f->name, name, sizeof(name));
        size_t old = path_pushf(&d->path, "%s%s", d->path.len ? "." : "", name);
        unsigned idx = (unsigned)(f - desc->fields);
        bool twice = seen[idx];
        seen[idx] = 1;
        if (twice) {
            s = ci_error_set(d->err, CI_ERR_INVALID,
                             "field '%s' is given twice (as '%s' and '%s')", d->path.buf, name,
                             f->name);
        } else if (json_is_null(val)) {
            /* null means the default: leave the field as init set it */
        } else if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            s = dec_repeated(d, msg, f, val, depth);
        } else if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            uint32_t *casep = MEMBER(msg, f->quantifier_offset);
            if (*casep != 0) {
                const ProtobufCFieldDescriptor *other = field_by_id(desc, *casep);
                char oname[128];
                json_name(other ? other->name : "?", oname, sizeof(oname));
                s = ci_error_set(d->err, CI_ERR_INVALID,
                                 "field '%s': '%s' and '%s' cannot both be set; they are "
                                 "alternatives",
                                 d->path.buf, oname, name);
            } else if (!(s = dec_value(d, f, val, MEMBER(msg, f->offset), depth))) {
                *casep = f->id;
            }
        } else {
            s = dec_value(d, f, val, MEMBER(msg, f->offset), depth);
            if (!s && f->label == PROTOBUF_C_LABEL_OPTIONAL && f->quantifier_offset &&
                f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
                *(protobuf_c_boolean *)MEMBER(msg, f->quantifier_offset) = 1;
        }
        path_pop(&d->path, old);
        if (s)
            break;
    }
    free(seen);
    if (s) {
        protobuf_c_message_free_unpacked(msg, NULL);
        return s;
    }
    *ret = msg;
    return CI_OK;
}

/* ---- protobuf string checks -------------------------------------------- */

static size_t read_varint(const uint8_t *p, size_t len, uint64_t *ret)
{
    uint64_t v = 0;
    for (size_t i = 0; i < len && i < 10; i++) {
        v |= (uint64_t)(p[i] & 0x7f) << (7 * i);
        if (!(p[i] & 0x80)) {
            *ret = v;
            return i + 1;
        }
    }
    return 0;
}

/* Walks the wire bytes of a message that protobuf-c already accepted and
 * refuses string fields that are not UTF-8 or hold a NUL byte (which the
 * unpacked char * would silently cut). */
static ci_status pb_check_strings(const ProtobufCMessageDescriptor *desc, const uint8_t *p,
                                  size_t len, struct path *path, int depth, const char *root,
                                  struct ci_error *err)
{
    if (depth > CODEC_MAX_DEPTH)
        return ci_error_set(err, CI_ERR_INVALID, "the body nests messages deeper than %d levels",
                            CODEC_MAX_DEPTH);
    size_t counts[64] = {0};
    while (len > 0) {
        uint64_t key, l;
        size_t used = read_varint(p, len, &key);
        if (!used)
            goto bad;
        p += used;
        len -= used;
        /* protobuf-c takes field number 0 when spelled as a long varint, and
         * then writes a message that it cannot read back */
        if (key >> 3 == 0 || key >> 3 > 0x1fffffff)
            goto bad;
        switch (key & 7) {
        case 0:
            if (!(used = read_varint(p, len, &l)))
                goto bad;
            break;
        case 1:
            used = 8;
            break;
        case 5:
            used = 4;
            break;
        case 2: {
            size_t pre = read_varint(p, len, &l);
            if (!pre || l > len - pre)
                goto bad;
            used = pre + (size_t)l;
            const ProtobufCFieldDescriptor *f =
                key >> 3 <= UINT32_MAX ? field_by_id(desc, (uint32_t)(key >> 3)) : NULL;
            if (!f || (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE))
                break;
            unsigned idx = (unsigned)(f - desc->fields);
            char name[128];
            json_name(f->name, name, sizeof(name));
            size_t old = path_pushf(path, "%s%s", path->len ? "." : "", name);
            if (f->label == PROTOBUF_C_LABEL_REPEATED && idx < 64)
                path_pushf(path, "[%zu]", counts[idx]++);
            ci_status s = CI_OK;
            const uint8_t *v = p + pre;
            if (f->type == PROTOBUF_C_TYPE_MESSAGE)
                s = pb_check_strings(f->descriptor, v, (size_t)l, path, depth + 1, root, err);
            else if (memchr(v, 0, (size_t)l))
                s = ci_error_set(err, CI_ERR_INVALID, "field '%s' contains a NUL byte", path->buf);
            else if (!utf8_valid(v, (size_t)l))
                s = ci_error_set(err, CI_ERR_INVALID, "field '%s' is not valid UTF-8", path->buf);
            path_pop(path, old);
            if (s)
                return s;
            break;
        }
        default:
            goto bad;
        }
        if (used > len)
            goto bad;
        p += used;
        len -= used;
    }
    return CI_OK;
bad:
    return ci_error_set(err, CI_ERR_INVALID, "the body is not a valid protobuf %s", root);
}

/* ---- public encode / decode -------------------------------------------- */

/* Replaces, in a message we own, every string that is not valid UTF-8. */
static ci_status fix_strings(ProtobufCMessage *msg, int depth)
{
    if (depth > CODEC_MAX_DEPTH)
        return CI_ERR_INVALID;
    const ProtobufCMessageDescriptor *desc = msg->descriptor;
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(uint32_t *)MEMBER(msg, f->quantifier_offset) != f->id)
            continue;
        size_t n = 1;
        void *base = MEMBER(msg, f->offset);
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            n = *(size_t *)MEMBER(msg, f->quantifier_offset);
            base = *(void **)base;
            if (!base)
                continue;
        }
        for (size_t k = 0; k < n; k++) {
            if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                ProtobufCMessage *sub = ((ProtobufCMessage **)base)[k];
                ci_status s = sub ? fix_strings(sub, depth + 1) : CI_OK;
                if (s)
                    return s;
                continue;
            }
            char **sp = &((char **)base)[k];
            if (!*sp || utf8_valid((const uint8_t *)*sp, strlen(*sp)))
                continue;
            char *fixed = utf8_fix(*sp, strlen(*sp));
            if (!fixed)
                return CI_ERR_NOMEM;
            if (*sp != f->default_value) /* unpacked strings are malloc'd */
                free(*sp);
            *sp = fixed;
        }
    }
    return CI_OK;
}

static bool has_bad_strings(const ProtobufCMessage *msg, int depth)
{
    if (depth > CODEC_MAX_DEPTH)
        return false;
    const ProtobufCMessageDescriptor *desc = msg->descriptor;
    for (unsigned i = 0; i < desc->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &desc->fields[i];
        if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
            continue;
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)MEMBER(msg, f->quantifier_offset) != f->id)
            continue;
        size_t n = 1;
        const void *base = MEMBER(msg, f->offset);
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            n = *(const size_t *)MEMBER(msg, f->quantifier_offset);
            base = *(void *const *)base;
            if (!base)
                continue;
        }
        for (size_t k = 0; k < n; k++) {
            if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
                const ProtobufCMessage *sub = ((ProtobufCMessage *const *)base)[k];
                if (sub && has_bad_strings(sub, depth + 1))
                    return true;
                continue;
            }
            const char *str = ((char *const *)base)[k];
            if (str && !utf8_valid((const uint8_t *)str, strlen(str)))
                return true;
        }
    }
    return false;
}

static ci_status pb_pack(const ProtobufCMessage *msg, uint8_t **ret, size_t *ret_len,
                         struct ci_error *err)
{
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(n ? n : 1);
    if (!buf)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory encoding %s",
                            msg->descriptor->short_name);
    if (protobuf_c_message_pack(msg, buf) != n) {
        free(buf);
        return ci_error_set(err, CI_ERR_INVALID, "protobuf-c could not pack %s",
                            msg->descriptor->short_name);
    }
    *ret = buf;
    *ret_len = n;
    return CI_OK;
}

ci_status ci_message_encode(enum ci_encoding enc, const ProtobufCMessage *msg, uint8_t **ret,
                            size_t *ret_len, struct ci_error *err)
{
    if (enc == CI_ENC_PROTOBUF) {
        if (!has_bad_strings(msg, 0))
            return pb_pack(msg, ret, ret_len, err);
        /* Round-trip through a copy we own and mend its strings: a protobuf
         * reader in another language refuses a string that is not UTF-8. */
        uint8_t *raw = NULL;
        size_t raw_len = 0;
        ci_status s = pb_pack(msg, &raw, &raw_len, err);
        if (s)
            return s;
        ProtobufCMessage *copy = protobuf_c_message_unpack(msg->descriptor, NULL, raw_len, raw);
        free(raw);
        if (!copy)
            return ci_error_set(err, CI_ERR_NOMEM, "out of memory encoding %s",
                                msg->descriptor->short_name);
        s = fix_strings(copy, 0);
        if (!s)
            s = pb_pack(copy, ret, ret_len, err);
        else
            ci_error_set(err, s, "out of memory encoding %s", msg->descriptor->short_name);
        ci_message_free(copy);
        return s;
    }

    struct enc e = {.err = err};
    json_t *root = NULL;
    ci_status s = enc_message(&e, msg, 0, &root);
    if (s)
        return s;
    struct ci_buf b = CI_BUF_INIT;
    int rc = json_dump_callback(root, dump_cb, &b, JSON_COMPACT | JSON_REAL_PRECISION(17));
    json_decref(root);
    if (rc != 0) {
        ci_buf_release(&b);
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory encoding %s as JSON",
                            msg->descriptor->short_name);
    }
    size_t n;
    uint8_t *out = ci_buf_steal(&b, &n);
    if (!out)
        return ci_error_set(err, CI_ERR_NOMEM, "out of memory encoding %s as JSON",
                            msg->descriptor->short_name);
    *ret = out;
    *ret_len = n;
    return CI_OK;
}

static bool looks_like_json(const uint8_t *data, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (data[i] == ' ' || data[i] == '\t' || data[i] == '\r' || data[i] == '\n')
            continue;
        return data[i] == '{';
    }
    return false;
}

ci_status ci_message_decode(enum ci_encoding enc, const ProtobufCMessageDescriptor *desc,
                            const uint8_t *data, size_t len, ProtobufCMessage **ret,
                            struct ci_error *err)
{
    if (!data)
        len = 0;
    if (enc == CI_ENC_PROTOBUF) {
        static const uint8_t empty[1];
        ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, len, data ? data : empty);
        if (!msg) {
            if (looks_like_json(data, len))
                return ci_error_set(err, CI_ERR_INVALID,
                                    "the body is not a valid protobuf %s; it looks like JSON: "
                                    "send it with Content-Type: application/json",
                                    desc->short_name);
            return ci_error_set(err, CI_ERR_INVALID, "the body is not a valid protobuf %s",
                                desc->short_name);
        }
        struct path path = {.len = 0};
        path.buf[0] = '\0';
        ci_status s = pb_check_strings(desc, data, len, &path, 0, desc->short_name, err);
        if (s) {
            ci_message_free(msg);
            return s;
        }
        *ret = msg;
        return CI_OK;
    }

    json_error_t jerr;
    json_t *root = json_loadb((const char *)(data ? data : (const uint8_t *)""), len,
                              JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char q[sizeof(jerr.text)];
        quote_text(q, sizeof(q), jerr.text, strnlen(jerr.text, sizeof(jerr.text)));
        return ci_error_set(err, CI_ERR_INVALID,
                            "the body is not valid JSON: %s (line %d, column %d)", q, jerr.line,
                            jerr.column);
    }
    if (!json_is_object(root)) {
        ci_status s = ci_error_set(err, CI_ERR_INVALID, "the body must be a JSON object (%s), not %s",
                                   desc->short_name, json_kind(root));
        json_decref(root);
        return s;
    }
    struct dec d = {.err = err, .root = desc->short_name};
    ProtobufCMessage *msg;
    ci_status s = dec_message(&d, desc, root, 0, &msg);
    json_decref(root);
    if (s)
        return s;
    *ret = msg;
    return CI_OK;
}
