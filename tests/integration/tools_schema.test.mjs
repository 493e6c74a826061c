// `ci tools --format openai|anthropic|mcp` checked against each API's own
// definition instead of a shape written here: the OpenAI and Anthropic
// outputs are type-checked by the TypeScript compiler against the official
// SDKs' types (ChatCompletionTool, messages' Tool; object literals get
// excess-property checks, so a misspelt key fails), the MCP output is parsed
// with the MCP SDK's own zod schema (ListToolsResultSchema), and every input
// schema must be a valid JSON Schema (draft 2020-12, ajv in strict mode) that
// accepts and refuses sample arguments as it should. Each check is also shown
// a mutated copy that it must reject, so that none passes vacuously.
//
// Both descriptions are checked: without a manifest (no server, from the
// config) and from the manifest a real worker published.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { Kvm } from "@nats-io/kv";
import Ajv2020 from "ajv/dist/2020.js";
import { ListToolsResultSchema } from "@modelcontextprotocol/sdk/types.js";

import { startStack } from "./lib/stack.mjs";
import { CLI_BIN } from "./lib/worker.mjs";
import { RUNTIME } from "./lib/client.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const TSC = join(HERE, "node_modules", "typescript", "bin", "tsc");
const FORMATS = ["openai", "anthropic", "mcp"];
const NO_SERVER = "nats://127.0.0.1:1";

function ciTools(format, url) {
  const r = spawnSync(CLI_BIN, ["tools", "--format", format, "--url", url], { encoding: "utf8", timeout: 30000 });
  assert.equal(r.status, 0, `ci tools --format ${format}: ${r.stderr}`);
  return JSON.parse(r.stdout);
}

// A format's list of tools, a tool's name and its input schema.
const toolsOf = (format, out) => (format === "mcp" ? out.tools : out);
const nameOf = (format, t) => (format === "openai" ? t.function.name : t.name);
const descriptionOf = (format, t) => (format === "openai" ? t.function.description : t.description);
const schemaOf = (format, t) =>
  format === "openai" ? t.function.parameters : format === "anthropic" ? t.input_schema : t.inputSchema;

// A deep copy of out with f applied to run_python's tool.
function mutateRun(format, out, f) {
  const copy = structuredClone(out);
  f(toolsOf(format, copy).find((t) => nameOf(format, t) === "run_python"));
  return copy;
}

function renameKey(obj, from, to) {
  assert.ok(from in obj, `${from} is there to rename`);
  obj[to] = obj[from];
  delete obj[from];
}

// The SDKs' types, as a program that sends these tools would import them.
const TS_TYPES = {
  openai: { import: 'import type { ChatCompletionTool } from "openai/resources/chat/completions";', type: "ChatCompletionTool[]" },
  anthropic: { import: 'import type { Tool } from "@anthropic-ai/sdk/resources/messages";', type: "Tool[]" },
};

// A .ts module declaring each value with the type of its format: a JSON
// text is a TypeScript expression, so the literal is checked as written.
function tsModule(decls) {
  const imports = new Set(decls.map((d) => TS_TYPES[d.format].import));
  const body = decls.map((d) => `export const ${d.name}: ${TS_TYPES[d.format].type} = ${JSON.stringify(d.value, null, 2)};\n`);
  return [...imports, "", ...body].join("\n");
}

// Runs tsc once over files ({base name: source}) in a fresh directory whose
// node_modules is this directory's; resolves to {code, errors: {file: [line]},
// other: [line]}.
async function typecheck(files) {
  const dir = mkdtempSync(join(tmpdir(), "ci-tools-tsc-"));
  try {
    symlinkSync(join(HERE, "node_modules"), join(dir, "node_modules"), "dir");
    writeFileSync(join(dir, "package.json"), JSON.stringify({ private: true, type: "module" }));
    writeFileSync(
      join(dir, "tsconfig.json"),
      JSON.stringify({
        compilerOptions: { strict: true, noEmit: true, module: "nodenext", moduleResolution: "nodenext", skipLibCheck: true, types: [] },
        files: Object.keys(files),
      }),
    );
    for (const [name, text] of Object.entries(files)) writeFileSync(join(dir, name), text);
    const r = await promisify(execFile)(process.execPath, [TSC, "-p", dir, "--pretty", "false"], { timeout: 120000 }).then(
      (x) => ({ code: 0, ...x }),
      (e) => ({ code: e.code, stdout: e.stdout ?? "", stderr: e.stderr ?? String(e) }),
    );
    const errors = Object.fromEntries(Object.keys(files).map((f) => [f, []]));
    const other = [];
    for (const line of `${r.stdout}\n${r.stderr}`.split("\n").filter(Boolean)) {
      const m = /^(?:.*\/)?([^/(]+\.ts)\(\d+,\d+\): error TS\d+: /.exec(line);
      if (m && m[1] in errors) errors[m[1]].push(line);
      else if (!/^\s/.test(line)) other.push(line); // a message's continuation lines are indented
    }
    return { code: r.code, errors, other };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

// The MCP check: the SDK's ListToolsResultSchema parses it, and nothing is
// stripped (zod drops keys it does not know, which the protocol would
// ignore: a misspelt optional key would pass unseen). A reason, or null.
function mcpProblem(out) {
  const r = ListToolsResultSchema.safeParse(out);
  if (!r.success) return `ListToolsResultSchema: ${r.error.message}`;
  try {
    assert.deepEqual(r.data, out);
  } catch (e) {
    return `keys the SDK does not know were dropped: ${e.message}`;
  }
  return null;
}

const strictAjv = () => new Ajv2020({ strict: true, allErrors: true });

// Validates schema against the 2020-12 meta-schema and compiles it with ajv
// in strict mode (unknown keywords, a type that contradicts a keyword, a
// required property not in properties all throw); the validate function.
function compileSchema(ajv, schema) {
  assert.ok(ajv.validateSchema(schema), `meta-schema: ${ajv.errorsText(ajv.errors)}\n${JSON.stringify(schema)}`);
  return ajv.compile(schema);
}

// Sample arguments for each tool: [arguments, accepted?, why].
const SAMPLES = {
  run_python: (format) => [
    [{ code: "print(1)" }, true, "code only"],
    [{ code: "print(1)", session_id: "s-1_a", timeout_ms: 1000 }, true, "every optional argument"],
    [{}, false, "code is required"],
    [{ code: 5 }, false, "code is a string"],
    [{ code: "print(1)", timeout_ms: 0 }, false, "timeout_ms is at least 1"],
    [{ code: "print(1)", timeout_ms: 1.5 }, false, "timeout_ms is an integer"],
    [{ code: "print(1)", session_id: "../x" }, false, "session_id's pattern"],
    [{ code: "print(1)", bogus: 1 }, false, "no other argument"],
    // files: paths on the machine that runs `ci mcp`; the remote APIs have none.
    [{ code: "print(1)", files: ["a.csv"] }, format === "mcp", "files only for MCP"],
  ],
  get_result: () => [
    [{ task_id: "t-1_A" }, true, "a task id"],
    [{}, false, "task_id is required"],
    [{ task_id: 5 }, false, "task_id is a string"],
    [{ task_id: "a/b" }, false, "task_id's pattern"],
    [{ task_id: "x".repeat(65) }, false, "task_id at most 64"],
    [{ task_id: "t-1", code: "x" }, false, "no other argument"],
  ],
};
SAMPLES.cancel = SAMPLES.get_result;

describe("ci tools output against each API's schema", () => {
  let stack;
  let manifest;
  // outputs[source][format]: source "config" (no server, no manifest) or
  // "manifest" (a worker's).
  const outputs = { config: {}, manifest: {} };
  let tsc;

  before(async () => {
    assert.ok(existsSync(CLI_BIN), `${CLI_BIN} is built`);
    for (const f of FORMATS) outputs.config[f] = ciTools(f, NO_SERVER);
    // The worker only publishes its manifest (no task runs here): cold, as
    // a warm start first waits for a zygote's imports (seconds of CPU).
    stack = await startStack({ workers: 1, worker: { local: { mode: "cold" } } });
    const kv = await new Kvm(stack.client.js).open("ci-runtimes");
    const e = await kv.get(RUNTIME);
    assert.ok(e && e.value.length, "the worker wrote the manifest");
    manifest = JSON.parse(new TextDecoder().decode(e.value));
    for (const f of FORMATS) outputs.manifest[f] = ciTools(f, stack.server.url);

    // One tsc run: the real outputs, which must pass, and mutated copies,
    // each in its own file, each of which must fail.
    const real = (format) => ["config", "manifest"].map((s) => ({ name: s, format, value: outputs[s][format] }));
    const o = outputs.config.openai;
    const a = outputs.config.anthropic;
    tsc = await typecheck({
      "openai.ts": tsModule(real("openai")),
      "anthropic.ts": tsModule(real("anthropic")),
      "bad_anthropic_input_schema.ts": tsModule([
        { name: "t", format: "anthropic", value: mutateRun("anthropic", a, (t) => renameKey(t, "input_schema", "inputSchema")) },
      ]),
      "bad_anthropic_schema_type.ts": tsModule([
        { name: "t", format: "anthropic", value: mutateRun("anthropic", a, (t) => (t.input_schema.type = "array")) },
      ]),
      "bad_anthropic_as_openai.ts": tsModule([{ name: "t", format: "openai", value: a }]),
      "bad_openai_parameters.ts": tsModule([
        { name: "t", format: "openai", value: mutateRun("openai", o, (t) => renameKey(t.function, "parameters", "parameter")) },
      ]),
      "bad_openai_type.ts": tsModule([{ name: "t", format: "openai", value: mutateRun("openai", o, (t) => (t.type = "tool")) }]),
      "bad_openai_as_anthropic.ts": tsModule([{ name: "t", format: "anthropic", value: o }]),
    });
  });
  after(async () => {
    await stack?.stop();
  });

  test("the manifest's description is the one checked: versions from the worker, not the config's wording", () => {
    for (const f of FORMATS) {
      const run = (s) => descriptionOf(f, toolsOf(f, outputs[s][f]).find((t) => nameOf(f, t) === "run_python"));
      const d = run("manifest");
      assert.ok(d.includes(`Python ${manifest.python}`), d);
      assert.ok(Object.keys(manifest.packages ?? {}).length > 0, JSON.stringify(manifest));
      for (const [name, v] of Object.entries(manifest.packages)) assert.ok(d.includes(`${name} ${v}`), d);
      assert.doesNotMatch(d, /no worker has published/);
      assert.match(run("config"), /no worker has published/);
    }
  });

  test("tsc ran, found the SDKs and reported only in the files it was given", () => {
    assert.deepEqual(tsc.other, [], tsc.other.join("\n"));
    for (const [file, errs] of Object.entries(tsc.errors))
      for (const e of errs) assert.doesNotMatch(e, /error TS2307/, `${file}: a module not found`);
  });

  for (const f of ["openai", "anthropic"])
    test(`${f}: both outputs type-check against the SDK's ${TS_TYPES[f].type}`, () => {
      assert.deepEqual(tsc.errors[`${f}.ts`], [], tsc.errors[`${f}.ts`].join("\n"));
    });

  test("tsc rejects mutated copies (the check is not vacuous)", () => {
    const expect = {
      "bad_anthropic_input_schema.ts": /inputSchema/,
      "bad_anthropic_schema_type.ts": /"array"/,
      "bad_anthropic_as_openai.ts": /'"name"' does not exist/,
      "bad_openai_parameters.ts": /parameter/,
      "bad_openai_type.ts": /"tool"/,
      "bad_openai_as_anthropic.ts": /'"function"' is not assignable/,
    };
    assert.notEqual(tsc.code, 0);
    for (const [file, re] of Object.entries(expect)) {
      assert.ok(tsc.errors[file].length > 0, `${file} was accepted`);
      assert.ok(tsc.errors[file].some((e) => re.test(e)), `${file}: ${tsc.errors[file].join("\n")}`);
    }
  });

  test("mcp: both outputs parse with the SDK's ListToolsResultSchema, nothing dropped", () => {
    for (const s of ["config", "manifest"]) assert.equal(mcpProblem(outputs[s].mcp), null, s);
  });

  test("mcp: the check rejects mutated copies", () => {
    const m = outputs.config.mcp;
    const bad = {
      "input_schema for inputSchema": mutateRun("mcp", m, (t) => renameKey(t, "inputSchema", "input_schema")),
      "inputSchema of type array": mutateRun("mcp", m, (t) => (t.inputSchema.type = "array")),
      "a name that is not a string": mutateRun("mcp", m, (t) => (t.name = 5)),
      "a key MCP does not define": mutateRun("mcp", m, (t) => (t.parameters = t.inputSchema)),
      "a bare list": m.tools,
    };
    for (const [why, x] of Object.entries(bad)) assert.notEqual(mcpProblem(x), null, `${why} was accepted`);
  });

  for (const s of ["config", "manifest"])
    for (const f of FORMATS)
      test(`${f} (${s}): every input schema is valid JSON Schema 2020-12 (ajv strict) and judges sample arguments`, () => {
        const ajv = strictAjv();
        const tools = toolsOf(f, outputs[s][f]);
        assert.deepEqual(tools.map((t) => nameOf(f, t)).sort(), ["cancel", "get_result", "run_python"]);
        for (const t of tools) {
          const name = nameOf(f, t);
          // What the SDK documents of a function's name (openai's
          // FunctionDefinition.name); Anthropic allows the same and more.
          assert.match(name, /^[A-Za-z0-9_-]{1,64}$/);
          const validate = compileSchema(ajv, schemaOf(f, t));
          for (const [args, ok, why] of SAMPLES[name](f))
            assert.equal(validate(args), ok, `${name} ${JSON.stringify(args)} (${why}): ${ajv.errorsText(validate.errors)}`);
        }
      });

  test("ajv's checks can fail: a misspelt keyword, a wrong type, a required property not defined", () => {
    const schema = schemaOf("mcp", outputs.config.mcp.tools[0]);
    const misspelt = structuredClone(schema);
    renameKey(misspelt, "required", "requried");
    assert.throws(() => compileSchema(strictAjv(), misspelt), /unknown keyword/);
    const wrongType = { ...structuredClone(schema), type: "dict" };
    assert.throws(() => compileSchema(strictAjv(), wrongType), /meta-schema/);
    const undefinedRequired = { ...structuredClone(schema), required: ["code", "kode"] };
    assert.throws(() => compileSchema(strictAjv(), undefinedRequired), /strictRequired/);
  });
});
