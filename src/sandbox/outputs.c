/* outputs.c - a task's rich outputs at the sandbox's edge (docs/contract.md
 * section 17). The driver renders each value the code showed inside the
 * sandbox and writes them all to `.ci-outputs` (JSON) in the workspace.
 * After the run, once every process of it is dead and the artifacts are
 * walked, this reads that file through the workspace fd following nothing,
 * within a hard cap, and keeps what passes the checks: a fixed set of MIME
 * types, each value within its cap, valid UTF-8 without NUL, at most
 * OUTPUTS_MAX outputs and OUTPUTS_TOTAL bytes of data in all. Nothing here
 * renders or runs anything: the code may have written the file itself, and
 * then it only changes its own result. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/util.h"
#include "sandbox/sandbox_int.h"

#define OUTPUTS_FILE ".ci-outputs"
#define OUTPUTS_TMP ".ci-outputs.tmp"
#define OUTPUTS_FILE_MAX (8u << 20) /* JSON escaping on top of 2 MiB of data */
#define OUTPUTS_MAX 20
#define OUTPUTS_TOTAL (2u << 20)
#define OUTPUT_ROWS_MAX ((uint64_t)1 << 53)
/* Values a parse may build: the driver's file has a few per output. A file
 * of 8 MiB of "{}," would cost the worker ~75x its size as jansson values. */
#define OUTPUTS_JSON_TOKENS 4096

/* The MIME types an output may have, each with its cap in bytes. */
static const struct {
    const char *mime_type;
    size_t cap;
} mime_types[CI_OUTPUT_MIME_MAX] = {
    {"text/plain", 64 * 1024},
    {"text/html", 256 * 1024},
    {"application/json", 256 * 1024},
    {"image/png", (256 * 1024 + 2) / 3 * 4}, /* base64 of 256 KiB */
};

bool outputs_reserved_name(const char *name)
{
    return strcmp(name, OUTPUTS_FILE) == 0 || strcmp(name, OUTPUTS_TMP) == 0;
}


/* Whether text would make at most max JSON values: the structural
 * characters outside strings are counted before anything is built. */
static bool few_values(const char *text, size_t len, size_t max)
{
    size_t n = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (in_string) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if ((c == '{' || c == '[' || c == ',' || c == ':') && ++n > max) {
            return false;
        }
    }
    return true;
}

/* Base64 of a PNG: the first 12 characters decode to its 8-byte signature
 * (a model API refuses the whole result for an image it cannot decode). */
static bool png_base64(const char *s, size_t len)
{
    static const char sig[] = "iVBORw0KGgo";
    return len >= 12 && memcmp(s, sig, sizeof(sig) - 1) == 0;
}

static bool base64_text(const char *s, size_t len)
{
    if (len % 4)
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        bool pad = c == '=' && i + 2 >= len && (i + 1 == len || s[i + 1] == '=');
        if (!(pad || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
              (c >= '0' && c <= '9') || c == '+' || c == '/'))
            return false;
    }
    return true;
}

/* The artifact the run kept under name, if it is a PNG. */
static const struct ci_artifact *png_artifact(const struct ci_outcome *o, const char *name)
{
    for (size_t i = 0; i < o->n_artifacts; i++)
        if (strcmp(o->artifacts[i].name, name) == 0 &&
            strcmp(o->artifacts[i].mime_type, "image/png") == 0)
            return &o->artifacts[i];
    return NULL;
}

/* One entry of the file into *out, checked; *ret_size: its bytes of data.
 * An entry that is not an output leaves *out empty (n_data 0, no artifact). */
static ci_status take_one(const struct ci_outcome *o, json_t *j, struct ci_output *out,
                          size_t *ret_size)
{
    *ret_size = 0;
    if (!json_is_object(j))
        return CI_OK;
    const char *kind = json_string_value(json_object_get(j, "kind"));
    if (!kind || (strcmp(kind, "result") != 0 && strcmp(kind, "display") != 0))
        return CI_OK;
    out->kind = strcmp(kind, "result") == 0 ? "result" : "display";
    out->truncated = json_is_true(json_object_get(j, "truncated"));
    json_t *rows = json_object_get(j, "total_rows");
    if (json_is_integer(rows) && json_integer_value(rows) > 0 &&
        (uint64_t)json_integer_value(rows) < OUTPUT_ROWS_MAX)
        out->total_rows = (uint64_t)json_integer_value(rows);
    json_t *data = json_object_get(j, "data");
    for (size_t m = 0; m < CI_OUTPUT_MIME_MAX && json_is_object(data); m++) {
        json_t *v = json_object_get(data, mime_types[m].mime_type);
        if (!json_is_string(v))
            continue;
        const char *text = json_string_value(v);
        size_t len = json_string_length(v);
        bool png = strcmp(mime_types[m].mime_type, "image/png") == 0;
        if (len > mime_types[m].cap || memchr(text, '\0', len) || (png && (!base64_text(text, len) || !png_base64(text, len)))) {
            out->truncated = true; /* left out rather than cut: a cut table is no table */
            continue;
        }
        size_t n = 0;
        char *copy = ci_utf8_sanitize((const uint8_t *)text, len, &n);
        if (!copy)
            return CI_ERR_NOMEM;
        if (n > mime_types[m].cap) { /* replacement characters made it longer */
            free(copy);
            out->truncated = true;
            continue;
        }
        out->data[out->n_data].mime_type = mime_types[m].mime_type;
        out->data[out->n_data].value = copy;
        out->n_data++;
        *ret_size += n;
    }
    const char *artifact = json_string_value(json_object_get(j, "artifact"));
    if (artifact && *artifact && png_artifact(o, artifact) &&
        !(out->artifact = strdup(artifact)))
        return CI_ERR_NOMEM;
    return CI_OK;
}

ci_status outputs_collect(struct ci_sandbox_run *run, struct ci_sandbox_result *r)
{
    struct ci_outcome *o = &r->outcome;
    uint8_t *data = NULL;
    size_t len = 0;
    uint64_t file_size = 0;
    ci_status s = read_beneath(run->ws_fd, OUTPUTS_FILE, OUTPUTS_FILE_MAX, &data, &len, &file_size);
    if (s)
        return s;
    if (file_size > OUTPUTS_FILE_MAX)
        o->outputs_truncated = true;
    char *text = (char *)data;
    if (!text)
        return CI_OK;
    json_error_t jerr;
    json_t *root = NULL;
    if (few_values(text, len, OUTPUTS_JSON_TOKENS))
        root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    else
        o->outputs_truncated = true; /* not the driver's: no outputs */
    free(text);
    if (!root)
        return CI_OK; /* not the driver's: the code wrote it, and has no outputs */
    json_t *list = json_object_get(root, "outputs");
    if (json_is_true(json_object_get(root, "truncated")))
        o->outputs_truncated = true;
    size_t n = json_is_array(list) ? json_array_size(list) : 0;
    if (n > OUTPUTS_MAX) {
        n = OUTPUTS_MAX;
        o->outputs_truncated = true;
    }
    if (n && !(o->outputs = calloc(n, sizeof(*o->outputs)))) {
        json_decref(root);
        return CI_ERR_NOMEM;
    }
    size_t total = 0;
    for (size_t i = 0; i < n && !s; i++) {
        struct ci_output *out = &o->outputs[o->n_outputs];
        size_t size = 0;
        s = take_one(o, json_array_get(list, i), out, &size);
        if (!s && total + size > OUTPUTS_TOTAL) {
            o->outputs_truncated = true;
            ci_output_release(out);
            break;
        }
        if (s || (out->n_data == 0 && !out->artifact)) {
            ci_output_release(out);
            continue;
        }
        total += size;
        o->n_outputs++;
    }
    json_decref(root);
    return s;
}
