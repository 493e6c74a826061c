/* tools.c - the tool definitions of `ci mcp` and `ci tools` (tools.h). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/tools.h"
#include "core/util.h"
#include "nats/broker.h"

/* A manifest is a KV value: bounded by max_payload, but be plain about it. */
#define MANIFEST_MAX (1024 * 1024)
/* Packages named in the description: a manifest could list thousands. */
#define MAX_PACKAGES 40

bool ci_tools_format_parse(const char *s, enum ci_tools_format *ret)
{
    static const struct {
        const char *name;
        enum ci_tools_format f;
    } names[] = {{"mcp", CI_TOOLS_MCP}, {"openai", CI_TOOLS_OPENAI}, {"anthropic", CI_TOOLS_ANTHROPIC}};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(s, names[i].name) == 0) {
            *ret = names[i].f;
            return true;
        }
    return false;
}

ci_status ci_tools_manifest(struct ci_broker *b, json_t **ret, struct ci_error *err)
{
    *ret = NULL;
    if (!b)
        return CI_OK;
    uint8_t *data = NULL;
    size_t len = 0;
    ci_status s = ci_broker_runtime_get(b, CI_TOOLS_RUNTIME, &data, &len, err);
    if (s == CI_ERR_NOT_FOUND)
        return CI_OK;
    if (s)
        return s;
    json_t *m = len <= MANIFEST_MAX ? json_loadb((const char *)data, len, 0, NULL) : NULL;
    free(data);
    if (!json_is_object(m)) {
        json_decref(m);
        return CI_OK; /* not a manifest we can read: describe from the config */
    }
    *ret = m;
    return CI_OK;
}

/* manifest[a][b] (b may be NULL) as a string; 64-bit numbers come as strings
 * (contract §18), but take a JSON integer too. NULL when absent. */
static const char *mstr(const json_t *m, const char *a, const char *b, char tmp[32])
{
    const json_t *v = json_object_get(m, a);
    if (b)
        v = json_object_get(v, b);
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_integer(v)) {
        snprintf(tmp, 32, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return tmp;
    }
    return NULL;
}

static uint64_t mnum(const json_t *m, const char *a, const char *b, uint64_t dflt)
{
    char tmp[32];
    const char *s = mstr(m, a, b, tmp);
    char *end;
    if (!s || !*s)
        return dflt;
    unsigned long long v = strtoull(s, &end, 10);
    return *end ? dflt : (uint64_t)v;
}

static void append_seconds(struct ci_buf *t, uint64_t ms)
{
    if (ms % 1000)
        ci_buf_appendf(t, "%.1f s", (double)ms / 1000);
    else
        ci_buf_appendf(t, "%" PRIu64 " s", ms / 1000);
}

static void append_size(struct ci_buf *t, uint64_t bytes)
{
    if (bytes >= 1024 * 1024 && bytes % (1024 * 1024) == 0)
        ci_buf_appendf(t, "%" PRIu64 " MiB", bytes / (1024 * 1024));
    else if (bytes >= 1024 * 1024)
        ci_buf_appendf(t, "%.1f MiB", (double)bytes / (1024 * 1024));
    else
        ci_buf_appendf(t, "%" PRIu64 " KiB", bytes / 1024);
}

/* Whether the manifest's list of artifact types holds mime. */
static bool artifact_type(const json_t *m, const char *mime)
{
    const json_t *a = json_object_get(m, "artifacts");
    if (!json_is_array(a))
        return strcmp(mime, "image/png") == 0 || strcmp(mime, "text/csv") == 0;
    size_t i;
    const json_t *v;
    json_array_foreach(a, i, v)
        if (json_is_string(v) && strcmp(json_string_value(v), mime) == 0)
            return true;
    return false;
}

/* A version or package name from the manifest as it may appear in a
 * description: the record is a KV value that anyone allowed to write the
 * bucket could have written, and the description goes to a model. */
static bool plain_token(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 40)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.+-_!",
                    s[i]))
            return false;
    return true;
}

/* run_python's description: everything in it is either read from the
 * manifest the workers published or true of every deployment of this
 * version (contract §12, §16); limits without a manifest are the client
 * config's, and it says so. */
static char *describe_run(const json_t *m, const struct ci_config *cfg, bool mcp)
{
    CI_AUTOBUF struct ci_buf t = CI_BUF_INIT;
    char tmp[32];
    const json_t *iso = m ? json_object_get(m, "isolation") : NULL;
    const char *isolation = json_is_string(iso) ? json_string_value(iso) : "";
    if (strcmp(isolation, "none") == 0)
        ci_buf_appendf(&t, "Runs Python code on a worker machine (this deployment runs it WITHOUT "
                           "a sandbox) and returns its stdout, stderr, error (with a hint on what "
                           "to try next) and the files it wrote. ");
    else
        ci_buf_appendf(&t, "Runs Python code in %s and returns its stdout, stderr, error (with a "
                           "hint on what to try next) and the files it wrote. ",
                       *isolation ? "an isolated sandbox" : "a remote runtime");
    if (m) {
        const char *py = mstr(m, "python", NULL, tmp);
        ci_buf_appendf(&t, "Runtime %s: Python %s", CI_TOOLS_RUNTIME, plain_token(py) ? py : "3");
        const json_t *pk = json_object_get(m, "packages");
        size_t n = 0;
        if (json_is_object(pk) && json_object_size(pk)) {
            const char *k;
            const json_t *v;
            json_object_foreach((json_t *)pk, k, v) {
                const char *ver = json_is_string(v) ? json_string_value(v) : NULL;
                if (!plain_token(k) || (ver && !plain_token(ver)))
                    continue; /* not what a worker writes */
                if (n == MAX_PACKAGES) {
                    ci_buf_appendf(&t, " and more");
                    break;
                }
                ci_buf_appendf(&t, "%s%s%s%s", n ? ", " : " with ", k, ver ? " " : "",
                               ver ? ver : "");
                n++;
            }
        }
        ci_buf_appendf(&t, ". ");
        if (json_is_false(json_object_get(m, "pip")) && n)
            ci_buf_appendf(&t, "No pip: only these packages can be imported (and the standard "
                               "library). ");
        else if (!n)
            ci_buf_appendf(&t, "It ships numpy, pandas, matplotlib and openpyxl (versions not "
                               "known). ");
        const json_t *net = json_object_get(m, "network");
        if (json_is_false(net))
            ci_buf_appendf(&t, "No network access. ");
        else if (json_is_true(net))
            ci_buf_appendf(&t, "The network is reachable. ");
    } else {
        /* No worker said what it runs: only what the runtime's name
         * promises (contract §12), and no claim about this deployment. */
        ci_buf_appendf(&t, "Runtime %s, which ships Python 3 with numpy, pandas, matplotlib and "
                           "openpyxl (no worker has published its versions yet). ",
                       CI_TOOLS_RUNTIME);
    }

    uint64_t dto = m ? mnum(m, "limits", "defaultTimeoutMs", cfg->limits.default_timeout_ms)
                     : cfg->limits.default_timeout_ms;
    uint64_t mto = m ? mnum(m, "limits", "maxTimeoutMs", cfg->limits.max_timeout_ms)
                     : cfg->limits.max_timeout_ms;
    uint64_t dmem = m ? mnum(m, "limits", "defaultMemoryMb", cfg->limits.default_memory_mb)
                      : cfg->limits.default_memory_mb;
    uint64_t in = m ? mnum(m, "limits", "maxInputBytes", cfg->limits.max_input_bytes)
                    : cfg->limits.max_input_bytes;
    uint64_t out = m ? mnum(m, "limits", "maxOutputBytes", cfg->limits.max_output_bytes)
                     : cfg->limits.max_output_bytes;
    ci_buf_appendf(&t, "Limits per run%s: ", m ? "" : " (as configured for this client; the "
                                                      "workers' own may differ)");
    append_seconds(&t, dto);
    if (mto != dto) {
        ci_buf_appendf(&t, " of time by default, at most ");
        append_seconds(&t, mto);
        ci_buf_appendf(&t, " with timeout_ms");
    } else {
        ci_buf_appendf(&t, " of time");
    }
    ci_buf_appendf(&t, "; %" PRIu64 " MiB of memory; inputs ", dmem);
    append_size(&t, in);
    ci_buf_appendf(&t, " in all; stdout and stderr are kept up to ");
    append_size(&t, out);
    ci_buf_appendf(&t, " each%s. ", mcp ? " (this tool's result shows the start and the end of "
                                          "long output)" : "");

    if (mcp)
        ci_buf_appendf(&t, "Local files listed in `files` are uploaded and appear as ./NAME (their "
                           "base name) in the working directory. ");
    ci_buf_appendf(&t, "Each run without session_id starts from scratch. ");
    bool png = artifact_type(m, "image/png"), csv = artifact_type(m, "text/csv");
    if (png)
        ci_buf_appendf(&t, "Matplotlib figures left open and PNG files written to the working "
                           "directory are returned as images%s. ",
                       mcp ? "" : " (artifacts)");
    if (csv)
        ci_buf_appendf(&t, "CSV files written to the working directory are returned as %s. ",
                       mcp ? "files saved on the local machine, whose paths the result names"
                           : "artifacts");

    const json_t *ss = m ? json_object_get(m, "sessions") : NULL;
    if (ss && json_is_false(json_object_get(ss, "available"))) {
        ci_buf_appendf(&t, "Sessions are not available on this deployment: do not pass "
                           "session_id.");
    } else {
        /* The record's free texts are not passed on (see plain_token). */
        const char *keeps = NULL, *drops = NULL;
        uint64_t idle = ss ? mnum(ss, "idleS", NULL, cfg->sessions.idle_s) : cfg->sessions.idle_s;
        ci_buf_appendf(&t, "To keep state between runs, like cells of a notebook, pass the same "
                           "session_id (your own unguessable id) each time: the next run starts "
                           "with %s; %s are dropped and named in the result. A session expires "
                           "after %" PRIu64 " s without a run.",
                       keeps ? keeps
                             : "the variables that can be pickled, imported modules and the "
                               "files in the working directory",
                       drops ? drops : "open files, sockets, generators, threads and figures",
                       idle);
    }
    return (char *)ci_buf_steal(&t, NULL);
}

static json_t *id_schema(const char *what)
{
    return json_pack("{s:s, s:s, s:s}", "type", "string", "pattern", "^[A-Za-z0-9_-]{1,64}$",
                     "description", what);
}

static json_t *run_schema(const struct ci_config *cfg, bool mcp)
{
    json_t *props = json_pack(
        "{s:{s:s, s:s, s:I}, s:o, s:{s:s, s:i, s:I, s:s}}", "code", "type", "string",
        "description", "The Python source to run (a script, not a notebook: print what you want "
                       "to see).",
        "maxLength", (json_int_t)cfg->limits.max_code_bytes, "session_id",
        id_schema("Optional: run as the next step of this session, keeping the variables and "
                  "files of its previous step. [A-Za-z0-9_-]{1,64}."),
        "timeout_ms", "type", "integer", "minimum", 1, "maximum",
        (json_int_t)cfg->limits.max_timeout_ms, "description",
        "Optional: the time limit of this run in milliseconds.");
    if (props && mcp)
        json_object_set_new(
            props, "files",
            json_pack("{s:s, s:{s:s}, s:i, s:s}", "type", "array", "items", "type", "string",
                      "maxItems", 64,
                      "description", "Optional: paths of local files (CSV, XLSX, ...) to upload; "
                                     "each appears as ./BASENAME in the working directory."));
    return json_pack("{s:s, s:o, s:[s], s:b}", "type", "object", "properties", props, "required",
                     "code", "additionalProperties", 0);
}

static json_t *task_schema(void)
{
    return json_pack("{s:s, s:{s:o}, s:[s], s:b}", "type", "object", "properties", "task_id",
                     id_schema("The task id that run_python returned."), "required", "task_id",
                     "additionalProperties", 0);
}

static json_t *tool(enum ci_tools_format f, const char *name, const char *description,
                    json_t *schema)
{
    if (!schema)
        return NULL;
    switch (f) {
    case CI_TOOLS_OPENAI:
        return json_pack("{s:s, s:{s:s, s:s, s:o}}", "type", "function", "function", "name", name,
                         "description", description, "parameters", schema);
    case CI_TOOLS_ANTHROPIC:
        return json_pack("{s:s, s:s, s:o}", "name", name, "description", description,
                         "input_schema", schema);
    default:
        return json_pack("{s:s, s:s, s:o}", "name", name, "description", description,
                         "inputSchema", schema);
    }
}

json_t *ci_tools_build(enum ci_tools_format f, const json_t *manifest,
                       const struct ci_config *cfg)
{
    bool mcp = f == CI_TOOLS_MCP;
    CI_AUTOFREE char *run = describe_run(manifest, cfg, mcp);
    if (!run)
        return NULL;
    json_t *list = json_pack(
        "[o, o, o]", tool(f, "run_python", run, run_schema(cfg, mcp)),
        tool(f, "get_result",
             "Gets the result of a run_python task that was still running when run_python "
             "returned (the same content as run_python); waits a while for it to end, then "
             "says if it is still running.",
             task_schema()),
        tool(f, "cancel",
             "Asks the workers to stop a run_python task that is still queued or running; "
             "get_result then shows it cancelled. A task that already ended is not affected.",
             task_schema()));
    if (!list || !mcp)
        return list;
    return json_pack("{s:o}", "tools", list);
}
