/* codec_json.c - the proto3 canonical JSON mapping (jansson), driven by the
 * generated descriptors: lowerCamelCase names written, snake_case also
 * read, enums by name, bytes as base64, 64-bit integers as strings.
 *
 * The decoder builds messages exactly as protobuf_c_message_unpack() lays
 * them out (every string, bytes buffer, array and sub-message malloc'd;
 * untouched strings left pointing at the descriptor's default), so that
 * protobuf_c_message_free_unpacked() frees either kind the same way. */
#include <float.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/codec.h"
#include "core/codec_int.h"
#include "core/util.h"

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
    if (ci__utf8_valid((const uint8_t *)s, n))
        return json_stringn(s, n);
    char *fixed = ci__utf8_fix(s, n);
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
        return ci__utf8_fix(s, strlen(s));
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
    size_t sz = ci__elt_size(f->type);
    bool map = ci__is_map_field(f);
    json_t *out = map ? json_object() : json_array();
    if (!out)
        return ci_error_set(e->err, CI_ERR_NOMEM, "out of memory encoding field '%s'", e->path.buf);
    for (size_t i = 0; i < n; i++) {
        const void *elem = arr + i * sz;
        size_t old = ci__path_pushf(&e->path, "[%zu]", i);
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
        ci__path_pop(&e->path, old);
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
        ci__json_name(f->name, name, sizeof(name));
        size_t old = ci__path_pushf(&e->path, "%s%s", e->path.len ? "." : "", name);
        json_t *v = NULL;
        ci_status s = f->label == PROTOBUF_C_LABEL_REPEATED ? enc_repeated(e, msg, f, depth, &v)
                                                            : enc_value(e, f, member, depth, &v);
        if (!s && json_object_set_new(obj, name, v) != 0)
            s = ci_error_set(e->err, CI_ERR_NOMEM, "out of memory encoding JSON");
        ci__path_pop(&e->path, old);
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
    ci__quote_text(q, sizeof(q), json_string_value(v), json_string_length(v));
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
                ci__quote_text(q, sizeof(q), s, n);
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
            ci__quote_text(q, sizeof(q), json_string_value(v), json_string_length(v));
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
        ci__quote_text(q, sizeof(q), key, strlen(key));
        size_t old = ci__path_pushf(&d->path, "[\"%s\"]", q);
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
        ci__path_pop(&d->path, old);
        if (s)
            return s;
    }
    return CI_OK;
}

static ci_status dec_repeated(struct dec *d, ProtobufCMessage *msg,
                              const ProtobufCFieldDescriptor *f, json_t *v, int depth)
{
    if (ci__is_map_field(f))
        return dec_map(d, msg, f, v, depth);
    if (!json_is_array(v))
        return dec_expected(d, "an array", v);
    size_t n = json_array_size(v);
    if (n == 0)
        return CI_OK;
    size_t sz = ci__elt_size(f->type);
    char *arr = calloc(n, sz);
    if (!arr)
        return ci_error_set(d->err, CI_ERR_NOMEM, "out of memory decoding '%s'", d->path.buf);
    /* the count grows with each element decoded, so that a failure half-way
     * leaves a message that free_unpacked releases exactly */
    size_t *np = MEMBER(msg, f->quantifier_offset);
    *(char **)MEMBER(msg, f->offset) = arr;
    *np = 0;
    for (size_t i = 0; i < n; i++) {
        size_t old = ci__path_pushf(&d->path, "[%zu]", i);
        json_t *e = json_array_get(v, i);
        ci_status s = json_is_null(e) ? ci_error_set(d->err, CI_ERR_INVALID,
                                                     "field '%s': null is not allowed in a list",
                                                     d->path.buf)
                                      : dec_value(d, f, e, arr + i * sz, depth);
        ci__path_pop(&d->path, old);
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
        ci__json_name(desc->fields[i].name, name, sizeof(name));
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
        ci__json_name(desc->fields[i].name, name, sizeof(name));
        int n = snprintf(names + o, sizeof(names) - o, "%s%s", i ? ", " : "", name);
        if (n < 0)
            break;
        o += (size_t)n;
    }
    ci__quote_text(q, sizeof(q), key, strlen(key));
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
        ci__json_name(f->name, name, sizeof(name));
        size_t old = ci__path_pushf(&d->path, "%s%s", d->path.len ? "." : "", name);
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
                const ProtobufCFieldDescriptor *other = ci__field_by_id(desc, *casep);
                char oname[128];
                ci__json_name(other ? other->name : "?", oname, sizeof(oname));
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
        ci__path_pop(&d->path, old);
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

ci_status ci_json_encode(const ProtobufCMessage *msg, uint8_t **ret, size_t *ret_len,
                         struct ci_error *err)
{
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

ci_status ci_json_decode(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                         size_t len, ProtobufCMessage **ret, struct ci_error *err)
{
    json_error_t jerr;
    json_t *root = json_loadb((const char *)(data ? data : (const uint8_t *)""), len,
                              JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        char q[sizeof(jerr.text)];
        ci__quote_text(q, sizeof(q), jerr.text, strnlen(jerr.text, sizeof(jerr.text)));
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
