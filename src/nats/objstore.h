/* objstore.h - a JetStream Object Store bucket (ADR-20 layout) on top of the
 * plain JetStream API of nats.c, which has no object store of its own.
 *
 * Layout: stream OBJ_<bucket>, chunks on $O.<bucket>.C.<nuid>, meta JSON on
 * $O.<bucket>.M.<padded base64url(name)> with Nats-Rollup: sub. Objects
 * written here are read by the standard clients (nats.js @nats-io/obj,
 * nats.go, the nats CLI) and the other way round. */
#ifndef CI_OBJSTORE_H
#define CI_OBJSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define CI_OBJ_CHUNK_SIZE (128 * 1024)

struct ci_objstore_opts {
    const char *bucket;
    int64_t max_age_s; /* TTL of every object; 0 = forever */
    int64_t max_bytes; /* the bucket's size limit; 0 = none (the server's store is the limit) */
    int replicas;      /* 1 */
    bool file_storage; /* true: file, false: memory */
};

/* Object metadata, the JSON document on the meta subject. */
struct ci_objmeta {
    char *name;
    char *bucket;
    char *nuid;
    char *mtime;  /* RFC 3339 UTC */
    char *digest; /* "SHA-256=" + padded base64url, "" when deleted */
    uint64_t size;
    uint32_t chunks;
    uint32_t max_chunk_size;
    bool deleted;
};

struct ci_objstore;

/* Opening a bucket needs a JetStream context: see objstore_js.h (the
 * broker opens the service's bucket, ci_broker_objstore()). */
void ci_objstore_free(struct ci_objstore *os);

/* Stores data under name, replacing any older object of that name. */
ci_status ci_objstore_put(struct ci_objstore *os, const char *name, const void *data,
                          size_t len, struct ci_error *err);

/* What puts stored (the stream sequences of their messages), to take back
 * with ci_objstore_undo(). */
struct ci_objstore_undo {
    uint64_t *seqs;
    size_t n, cap;
};
void ci_objstore_undo_release(struct ci_objstore_undo *u);

/* As ci_objstore_put(), adding what it stored to *undo. */
ci_status ci_objstore_put_undoable(struct ci_objstore *os, const char *name, const void *data,
                                   size_t len, struct ci_objstore_undo *undo,
                                   struct ci_error *err);

/* Deletes every message in *undo, one by one: the objects they made are
 * gone (the previous version, if any, was already replaced) and their
 * room is the store's again at once - unlike a purge of their subject,
 * whose bytes nats-server 2.9 goes on counting against a full store. */
ci_status ci_objstore_undo(struct ci_objstore *os, struct ci_objstore_undo *undo,
                           struct ci_error *err);

/* Reads the object into a malloc'd buffer. CI_ERR_NOT_FOUND when absent or
 * deleted, CI_ERR_LIMIT when larger than max_len (nothing is read then),
 * CI_ERR_INTEGRITY when the chunks do not match the size or digest. */
ci_status ci_objstore_get(struct ci_objstore *os, const char *name, size_t max_len,
                          uint8_t **ret_data, size_t *ret_len, struct ci_error *err);

/* Reads only the metadata. CI_ERR_NOT_FOUND when absent or deleted. */
ci_status ci_objstore_info(struct ci_objstore *os, const char *name, struct ci_objmeta *ret,
                           struct ci_error *err);

/* Marks the object deleted and purges its chunks. */
ci_status ci_objstore_delete(struct ci_objstore *os, const char *name, struct ci_error *err);

/* Pure helpers, unit-tested without a server. */
ci_status ci_objmeta_to_json(const struct ci_objmeta *m, char **ret_json, struct ci_error *err);
ci_status ci_objmeta_from_json(const char *json, size_t len, struct ci_objmeta *ret,
                               struct ci_error *err);
void ci_objmeta_release(struct ci_objmeta *m);
/* Padded base64url of name, as used in the meta subject; malloc'd. */
char *ci_objstore_encode_name(const char *name);
/* "SHA-256=" + padded base64url of the SHA-256 of data; malloc'd. */
char *ci_objstore_digest(const void *data, size_t len);

#endif
