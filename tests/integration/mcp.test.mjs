// `ci mcp` (an MCP server on stdio) against a real worker, driven by the
// official MCP SDK's Client and StdioClientTransport, and `ci tools
// --format X` checked for the shape each agent API expects.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { startStack } from "./lib/stack.mjs";
import { CLI_BIN } from "./lib/worker.mjs";
import { mcpClient } from "./lib/mcp.mjs";
import { PNG_MAGIC } from "./lib/checks.mjs";

const CALL = { timeout: 120000 };

// The text of a tool result's first block.
const textOf = (r) => r.content.find((c) => c.type === "text")?.text ?? "";

describe("ci mcp", () => {
  let stack;
  let dir;
  let url;
  let client;
  let problems;
  before(async () => {
    assert.ok(existsSync(CLI_BIN), `${CLI_BIN} is built`);
    stack = await startStack({ workers: 1, worker: { concurrency: 2 } });
    url = stack.server.url;
    dir = mkdtempSync(join(tmpdir(), "ci-mcp-"));
    ({ client, problems } = await mcpClient(url, dir, ["--save-dir", join(dir, "saved"), "--wait-ms", "60000"]));
  });
  after(async () => {
    await client?.close().catch(() => {});
    await stack?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test("initialize negotiates the version; tools/list gives run_python with its schema and an honest description", async () => {
    assert.equal(client.getServerVersion().name, "ci");
    assert.ok(client.getServerCapabilities().tools);
    const { tools } = await client.listTools();
    assert.deepEqual(tools.map((t) => t.name).sort(), ["cancel", "get_result", "run_python"]);
    const run = tools.find((t) => t.name === "run_python");
    assert.equal(run.inputSchema.type, "object");
    assert.deepEqual(run.inputSchema.required, ["code"]);
    for (const k of ["code", "session_id", "files", "timeout_ms"]) assert.ok(run.inputSchema.properties[k], k);
    assert.match(run.description, /no network/i);
    assert.match(run.description, /60 s/);
    assert.match(run.description, /1024 MiB/);
    assert.match(run.description, /session_id/);
    // Described from the manifest the worker published (contract §18): the
    // runtime's own versions, read from its Python, not written by hand.
    const versions = JSON.parse(
      execFileSync("/usr/bin/python3", ["-c", "import json, sys, pandas, numpy; print(json.dumps({'py': '%d.%d.%d' % sys.version_info[:3], 'pandas': pandas.__version__, 'numpy': numpy.__version__}))"], { encoding: "utf8" }),
    );
    assert.ok(run.description.includes(`Python ${versions.py}`), run.description);
    assert.ok(run.description.includes(`pandas ${versions.pandas}`), run.description);
    assert.ok(run.description.includes(`numpy ${versions.numpy}`), run.description);
  });

  test("run_python print(1): the output, not an error", async () => {
    const r = await client.callTool({ name: "run_python", arguments: { code: "print(1)" } }, undefined, CALL);
    assert.notEqual(r.isError, true, textOf(r));
    assert.match(textOf(r), /succeeded/);
    assert.match(textOf(r), /--- stdout ---\n1\n/);
  });

  test("a matplotlib figure comes back as an image block holding a PNG", async () => {
    const code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nprint('plotted')";
    const r = await client.callTool({ name: "run_python", arguments: { code } }, undefined, CALL);
    assert.notEqual(r.isError, true, textOf(r));
    const img = r.content.find((c) => c.type === "image");
    assert.ok(img, JSON.stringify(r.content.map((c) => c.type)));
    assert.equal(img.mimeType, "image/png");
    const png = Buffer.from(img.data, "base64");
    assert.deepEqual(png.subarray(0, 8), PNG_MAGIC);
  });

  test("outputs: the last expression's text, a displayed figure as an image block", async () => {
    const code = "import matplotlib.pyplot as plt\nfig = plt.figure()\nplt.plot([1, 2])\ndisplay(fig)\n6 * 7";
    const r = await client.callTool({ name: "run_python", arguments: { code } }, undefined, CALL);
    assert.notEqual(r.isError, true, textOf(r));
    assert.match(textOf(r), /--- output 1 \(display\) ---\n<Figure size[^\n]*\n\[output 1 \(display\) is shown as an image\]\n/);
    assert.match(textOf(r), /--- output 2 \(the last expression's value\) ---\n42\n/);
    const imgs = r.content.filter((c) => c.type === "image");
    assert.equal(imgs.length, 1, "the figure shown is not saved again as figure-1.png");
    assert.deepEqual(Buffer.from(imgs[0].data, "base64").subarray(0, 8), PNG_MAGIC);
  });

  test("an exception is isError with the error and the hint", async () => {
    const r = await client.callTool({ name: "run_python", arguments: { code: "df = pd.DataFrame()" } }, undefined, CALL);
    assert.equal(r.isError, true);
    assert.match(textOf(r), /failed/);
    assert.match(textOf(r), /error: NameError: name 'pd' is not defined/);
    assert.match(textOf(r), /hint: .*import pandas as pd/);
  });

  test("a session keeps a variable across two calls and says so", async () => {
    const session_id = `s${Date.now()}x${Math.floor(Math.random() * 1e9)}`;
    const a = await client.callTool({ name: "run_python", arguments: { code: "x = 41", session_id } }, undefined, CALL);
    assert.notEqual(a.isError, true, textOf(a));
    assert.match(textOf(a), new RegExp(`session: ${session_id}, step 1`));
    const b = await client.callTool({ name: "run_python", arguments: { code: "print(x + 1)", session_id } }, undefined, CALL);
    assert.notEqual(b.isError, true, textOf(b));
    assert.match(textOf(b), /step 2; restored the state of step 1/);
    assert.match(textOf(b), /--- stdout ---\n42\n/);
  });

  test("a local CSV passed by path is ./NAME; a CSV written is saved locally and named", async () => {
    const csv = join(dir, "sales.csv");
    writeFileSync(csv, "city,amount\nOslo,3\nRome,18\nOslo,5\n");
    const code = "import pandas as pd\ndf = pd.read_csv('sales.csv')\nt = df.groupby('city').sum()\nprint(t['amount'].to_dict())\nt.to_csv('totals.csv')";
    const r = await client.callTool({ name: "run_python", arguments: { code, files: [csv] } }, undefined, CALL);
    assert.notEqual(r.isError, true, textOf(r));
    assert.match(textOf(r), /\{'Oslo': 8, 'Rome': 18\}/);
    const m = textOf(r).match(/totals\.csv \(text\/csv, \d+ bytes\) saved to (\S+)/);
    assert.ok(m, textOf(r));
    assert.ok(m[1].startsWith(join(dir, "saved")), m[1]);
    assert.match(readFileSync(m[1], "utf8"), /Oslo,8/);
  });

  test("a file that does not exist is isError with a clear message, and nothing runs", async () => {
    const r = await client.callTool({ name: "run_python", arguments: { code: "print(1)", files: ["nope/missing.csv"] } }, undefined, CALL);
    assert.equal(r.isError, true);
    assert.match(textOf(r), /input file 'nope\/missing\.csv' cannot be used: No such file or directory/);
  });

  test("bad arguments are tool errors; an unknown tool is a JSON-RPC error", async () => {
    const r = await client.callTool({ name: "run_python", arguments: { code: "print(1)", session_id: "no spaces" } }, undefined, CALL);
    assert.equal(r.isError, true);
    assert.match(textOf(r), /session_id/);
    await assert.rejects(client.callTool({ name: "nope", arguments: {} }), /unknown tool/);
  });

  test("get_result of a finished task; a slow task returns its id, cancel stops it", async () => {
    const slow = await mcpClient(url, dir, ["--wait-ms", "1500", "--save-dir", join(dir, "saved")]);
    try {
      const r = await slow.client.callTool({ name: "run_python", arguments: { code: "import time\nprint('start', flush=True)\ntime.sleep(30)" } }, undefined, CALL);
      assert.notEqual(r.isError, true, textOf(r));
      const m = textOf(r).match(/^task ([A-Za-z0-9_-]+) is still (running|waiting for a worker)/);
      assert.ok(m, textOf(r));
      const id = m[1];
      // get_result of a task still going waits (--wait-ms) before it says so.
      const t0 = Date.now();
      const waiting = await slow.client.callTool({ name: "get_result", arguments: { task_id: id } }, undefined, CALL);
      assert.match(textOf(waiting), new RegExp(`^task ${id} is still (running|waiting for a worker) after 1 s`));
      assert.ok(Date.now() - t0 >= 1400, `get_result returned after ${Date.now() - t0} ms`);
      const c = await slow.client.callTool({ name: "cancel", arguments: { task_id: id } }, undefined, CALL);
      assert.notEqual(c.isError, true, textOf(c));
      let g;
      for (let i = 0; i < 60; i++) {
        g = await slow.client.callTool({ name: "get_result", arguments: { task_id: id } }, undefined, CALL);
        if (!/is still/.test(textOf(g))) break;
        await new Promise((res) => setTimeout(res, 500));
      }
      assert.match(textOf(g), new RegExp(`task ${id}: cancelled`));
      assert.equal(g.isError, true);

      // A finished task, through get_result: the same content as run_python.
      const done = await slow.client.callTool({ name: "run_python", arguments: { code: "print('hello')" } }, undefined, CALL);
      const id2 = textOf(done).match(/^task ([A-Za-z0-9_-]+)/)[1];
      // On a slow machine it may not be done within --wait-ms twice: ask again.
      let again;
      for (let i = 0; i < 60; i++) {
        again = await slow.client.callTool({ name: "get_result", arguments: { task_id: id2 } }, undefined, CALL);
        if (!/is still/.test(textOf(again))) break;
        await new Promise((res) => setTimeout(res, 500));
      }
      assert.match(textOf(again), /succeeded/);
      assert.match(textOf(again), /--- stdout ---\nhello\n/);
      const none = await slow.client.callTool({ name: "get_result", arguments: { task_id: "never-submitted-x" } }, undefined, CALL);
      assert.equal(none.isError, true);
      assert.match(textOf(none), /no task 'never-submitted-x'/);
    } finally {
      await slow.client.close().catch(() => {});
    }
    assert.deepEqual(slow.problems, []);
  });

  test("a call with a progress token hears the task start and, every 5 s, that it still runs", async () => {
    const seen = [];
    const r = await client.callTool({ name: "run_python", arguments: { code: "import time\ntime.sleep(9)\nprint('slept')" } }, undefined,
      { ...CALL, onprogress: (p) => seen.push(p), resetTimeoutOnProgress: true });
    assert.notEqual(r.isError, true, textOf(r));
    assert.match(textOf(r), /slept/);
    assert.ok(seen.some((p) => /^running on worker /.test(p.message)), JSON.stringify(seen));
    assert.ok(seen.some((p) => /^still running after \d+ s$/.test(p.message)), JSON.stringify(seen));
    for (let i = 1; i < seen.length; i++) assert.ok(seen[i].progress > seen[i - 1].progress, JSON.stringify(seen));
  });

  test("the SDK client saw nothing on stdout that was not protocol", () => {
    assert.deepEqual(problems, []);
  });

  test("raw stdio: every stdout line is JSON-RPC; parse errors, unknown methods and an over-long line are errors, not crashes", async () => {
    const child = spawn(CLI_BIN, ["mcp", "--url", url], { cwd: dir, stdio: ["pipe", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.resume();
    const send = (s) => child.stdin.write(s + "\n");
    send(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "1999-01-01", capabilities: {}, clientInfo: { name: "raw", version: "1" } } }));
    send(JSON.stringify({ jsonrpc: "2.0", method: "notifications/initialized" }));
    send("{not json");
    send(JSON.stringify({ jsonrpc: "2.0", id: 2, method: "resources/list" }));
    send(JSON.stringify({ jsonrpc: "2.0", id: 3, method: "tools/call", params: "x" }));
    child.stdin.write(Buffer.alloc(33 * 1024 * 1024, 0x61));
    send("");
    send(JSON.stringify({ jsonrpc: "2.0", id: 4, method: "ping" }));
    send(JSON.stringify({ jsonrpc: "2.0", id: 6, method: "initialize", params: { protocolVersion: "2024-11-05", capabilities: {}, clientInfo: { name: "raw", version: "1" } } }));
    send(JSON.stringify({ jsonrpc: "2.0", id: 5, method: "tools/call", params: { name: "run_python", arguments: { code: "print('x' * 50000)" } } }));
    // A batch (2025-03-26): one array of the replies, none for a notification.
    send(JSON.stringify([{ jsonrpc: "2.0", id: 7, method: "ping" }, { jsonrpc: "2.0", method: "notifications/initialized" },
      { jsonrpc: "2.0", id: 8, method: "tools/list" }, 42]));
    send("[]");
    send(JSON.stringify([{ jsonrpc: "2.0", method: "notifications/initialized" }]));
    // Too many: each request gets its error; initialize has no place in one.
    send(JSON.stringify(Array.from({ length: 65 }, (_, i) => ({ jsonrpc: "2.0", id: 100 + i, method: "ping" }))));
    send(JSON.stringify([{ jsonrpc: "2.0", id: 9, method: "initialize", params: { protocolVersion: "2025-03-26", capabilities: {}, clientInfo: { name: "raw", version: "1" } } }]));
    child.stdin.end();
    const code = await new Promise((res) => child.on("close", res));
    assert.equal(code, 0);
    const lines = out.split("\n").filter((l) => l);
    const batches = lines.map((l) => JSON.parse(l)).filter((m) => Array.isArray(m));
    assert.equal(batches.length, 3);
    assert.deepEqual(batches[1].map((m) => m.id), Array.from({ length: 65 }, (_, i) => 100 + i));
    for (const m of batches[1]) assert.equal(m.error.code, -32600);
    assert.deepEqual(batches[2].map((m) => [m.id, m.error?.code]), [[9, -32600]]);
    assert.deepEqual(batches[0].map((m) => m.id), [7, 8, null]);
    assert.deepEqual(batches[0][0].result, {});
    assert.ok(batches[0][1].result.tools.some((t) => t.name === "run_python"));
    assert.equal(batches[0][2].error.code, -32600);
    const msgs = lines.map((l) => JSON.parse(l)).filter((m) => !Array.isArray(m));
    for (const m of msgs) assert.equal(m.jsonrpc, "2.0");
    const byId = Object.fromEntries(msgs.filter((m) => m.id !== null).map((m) => [m.id, m]));
    assert.equal(byId[1].result.protocolVersion, "2025-11-25");
    assert.equal(byId[2].error.code, -32601);
    assert.equal(byId[3].error.code, -32602);
    assert.deepEqual(byId[4].result, {});
    assert.equal(byId[6].result.protocolVersion, "2024-11-05");
    const nulls = msgs.filter((m) => m.id === null).map((m) => m.error.code);
    assert.deepEqual(nulls, [-32700, -32700, -32600]);
    const text = byId[5].result.content[0].text;
    assert.match(text, /bytes cut here/);
    assert.ok(text.length < 20000, `${text.length} characters`);
    assert.equal(msgs.length, 9);
  });
});

describe("ci tools --format", () => {
  // No server: the definitions come from the config.
  const tools = (f) => {
    const r = spawnSync(CLI_BIN, ["tools", "--format", f, "--url", "nats://127.0.0.1:1"], { encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    return JSON.parse(r.stdout);
  };
  const checkSchema = (s, files) => {
    assert.equal(s.type, "object");
    assert.equal(typeof s.properties, "object");
    assert.deepEqual(s.required, ["code"]);
    assert.equal(s.properties.code.type, "string");
    assert.equal(Boolean(s.properties.files), files);
  };

  test("openai: function tools", () => {
    const t = tools("openai");
    assert.ok(Array.isArray(t));
    for (const x of t) {
      assert.equal(x.type, "function");
      assert.deepEqual(Object.keys(x.function).sort(), ["description", "name", "parameters"]);
    }
    const run = t.find((x) => x.function.name === "run_python").function;
    checkSchema(run.parameters, false);
    // No worker published a manifest: nothing is claimed of this deployment
    // (not even "no network": a worker may run without a sandbox).
    assert.match(run.description, /no worker has published/);
    assert.doesNotMatch(run.description, /no network|sandbox/i);
  });

  test("anthropic: name, description, input_schema", () => {
    const t = tools("anthropic");
    assert.ok(Array.isArray(t));
    for (const x of t) assert.deepEqual(Object.keys(x).sort(), ["description", "input_schema", "name"]);
    checkSchema(t.find((x) => x.name === "run_python").input_schema, false);
  });

  test("mcp: {tools:[{name, description, inputSchema}]}, with files", () => {
    const t = tools("mcp");
    assert.ok(Array.isArray(t.tools));
    for (const x of t.tools) assert.deepEqual(Object.keys(x).sort(), ["description", "inputSchema", "name"]);
    checkSchema(t.tools.find((x) => x.name === "run_python").inputSchema, true);
  });

  test("an unknown format is a usage error", () => {
    const r = spawnSync(CLI_BIN, ["tools", "--format", "xml", "--url", "nats://127.0.0.1:1"], { encoding: "utf8" });
    assert.equal(r.status, 2);
    assert.match(r.stderr, /use openai, anthropic or mcp/);
  });
});
