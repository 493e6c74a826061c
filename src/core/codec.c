/* codec.c - the wire encodings: content types, status names, protobuf
 * (protobuf-c) with its string checks, and the entry points that hand JSON
 * to codec_json.c. Helpers both halves share are here too (codec_int.h).
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

#include "core/codec_int.h"
#include "core/text.h"
#include "core/util.h"


/* ---- small helpers ---------------------------------------------------- */


/* Appends to the path; returns the old length for ci__path_pop(). A path that
 * does not fit is cut with "...". */
size_t ci__path_pushf(struct path *p, const char *fmt, ...)
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

void ci__path_pop(struct path *p, size_t old)
{
    p->len = old;
    p->buf[old] = '\0';
}

/* Copies user-controlled text into out as printable ASCII (others become
 * '?'), cut to fit out with "...", so that an error sentence is
 * always safe to log and to put in a UTF-8 string field. */
void ci__quote_text(char *out, size_t outsz, const char *s, size_t len)
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
void ci__json_name(const char *name, char *out, size_t outsz)
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
size_t ci__utf8_seq(const uint8_t *s, size_t n)
{
    uint32_t cp;
    return ci_text_utf8_decode(s, n, &cp);
}

bool ci__utf8_valid(const uint8_t *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        size_t k = ci__utf8_seq(s + i, n - i);
        if (!k)
            return false;
        i += k;
    }
    return true;
}

/* A malloc'd copy of s with each invalid byte replaced by U+FFFD. */
char *ci__utf8_fix(const char *s, size_t n)
{
    struct ci_buf b = CI_BUF_INIT;
    for (size_t i = 0; i < n;) {
        size_t k = ci__utf8_seq((const uint8_t *)s + i, n - i);
        ci_status st = k ? ci_buf_append(&b, s + i, k) : ci_buf_append(&b, "\xEF\xBF\xBD", 3);
        if (st) {
            ci_buf_release(&b);
            return NULL;
        }
        i += k ? k : 1;
    }
    return (char *)ci_buf_steal(&b, NULL);
}

size_t ci__elt_size(ProtobufCType t)
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

/* protoc-c has no map flag: a map<K,V> is a repeated <FieldName>Entry
 * message with exactly the fields key = 1 and value = 2. */
bool ci__is_map_field(const ProtobufCFieldDescriptor *f)
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

const ProtobufCFieldDescriptor *ci__field_by_id(const ProtobufCMessageDescriptor *desc,
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
        ci__quote_text(q, sizeof(q), s, n);
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
                key >> 3 <= UINT32_MAX ? ci__field_by_id(desc, (uint32_t)(key >> 3)) : NULL;
            if (!f || (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE))
                break;
            unsigned idx = (unsigned)(f - desc->fields);
            char name[128];
            ci__json_name(f->name, name, sizeof(name));
            size_t old = ci__path_pushf(path, "%s%s", path->len ? "." : "", name);
            if (f->label == PROTOBUF_C_LABEL_REPEATED && idx < 64)
                ci__path_pushf(path, "[%zu]", counts[idx]++);
            ci_status s = CI_OK;
            const uint8_t *v = p + pre;
            if (f->type == PROTOBUF_C_TYPE_MESSAGE)
                s = pb_check_strings(f->descriptor, v, (size_t)l, path, depth + 1, root, err);
            else if (memchr(v, 0, (size_t)l))
                s = ci_error_set(err, CI_ERR_INVALID, "field '%s' contains a NUL byte", path->buf);
            else if (!ci__utf8_valid(v, (size_t)l))
                s = ci_error_set(err, CI_ERR_INVALID, "field '%s' is not valid UTF-8", path->buf);
            ci__path_pop(path, old);
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
            if (!*sp || ci__utf8_valid((const uint8_t *)*sp, strlen(*sp)))
                continue;
            char *fixed = ci__utf8_fix(*sp, strlen(*sp));
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
            if (str && !ci__utf8_valid((const uint8_t *)str, strlen(str)))
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

    return ci_json_encode(msg, ret, ret_len, err);
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

    return ci_json_decode(desc, data, len, ret, err);
}
