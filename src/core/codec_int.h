/* codec_int.h - private to the codec (codec.c, codec_json.c): the helpers
 * both encodings share, and the JSON half that codec.c calls. */
#ifndef CI_CODEC_INT_H
#define CI_CODEC_INT_H

#include <protobuf-c/protobuf-c.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

/* Deep enough for every message of ci.proto (at most 3 levels) with room to
 * spare; stops hostile or buggy nesting long before the stack is at risk. */
#define CODEC_MAX_DEPTH 32
/* Longest field path quoted in an error ("files[3].content"). */
#define PATH_CAP 160
/* Longest piece of user text quoted in an error. */
#define QUOTE_CAP 48

/* The field at byte offset off of a message. */
#define MEMBER(msg, off) ((void *)((char *)(msg) + (off)))

/* The path of the field being read, for errors: "files[3].content". */
struct path {
    char buf[PATH_CAP];
    size_t len;
};

/* Appends to the path; returns the old length for ci__path_pop(). A path
 * that does not fit is cut with "...". */
size_t ci__path_pushf(struct path *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ci__path_pop(struct path *p, size_t old);
/* User text quoted for an error: printable ASCII, cut at QUOTE_CAP. */
void ci__quote_text(char *out, size_t outsz, const char *s, size_t len);
/* The JSON name of a proto field (lowerCamelCase). */
void ci__json_name(const char *name, char *out, size_t outsz);
/* Length of the valid UTF-8 sequence at s, 0 when invalid. */
size_t ci__utf8_seq(const uint8_t *s, size_t n);
bool ci__utf8_valid(const uint8_t *s, size_t n);
/* A copy of s with invalid UTF-8 replaced by U+FFFD; NULL without memory. */
char *ci__utf8_fix(const char *s, size_t n);
/* Size of one element of a repeated field of type t. */
size_t ci__elt_size(ProtobufCType t);
bool ci__is_map_field(const ProtobufCFieldDescriptor *f);
const ProtobufCFieldDescriptor *ci__field_by_id(const ProtobufCMessageDescriptor *desc,
                                                uint32_t id);

/* The JSON half of ci_message_encode() and ci_message_decode() (codec_json.c). */
ci_status ci_json_encode(const ProtobufCMessage *msg, uint8_t **ret, size_t *ret_len,
                         struct ci_error *err);
ci_status ci_json_decode(const ProtobufCMessageDescriptor *desc, const uint8_t *data,
                         size_t len, ProtobufCMessage **ret, struct ci_error *err);

#endif
