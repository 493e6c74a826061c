// The runtime manifest (docs/contract.md §18) from a real worker: the
// ci-runtimes record (versions as /usr/bin/python3 reports them, limits as
// the worker's config), `ci runtimes` and `--json`, and the hint of a
// package the runtime does not ship.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { Kvm } from "@nats-io/kv";

import { startStack } from "./lib/stack.mjs";
import { CLI_BIN } from "./lib/worker.mjs";
import { RUNTIME, newTaskId, runTask } from "./lib/client.mjs";
import { show } from "./lib/checks.mjs";

const PYTHON = "/usr/bin/python3";
const PACKAGES = ["numpy", "pandas", "matplotlib", "openpyxl"];
const LIMITS = { default_timeout_ms: 30000, max_timeout_ms: 45000, default_memory_mb: 512, max_memory_mb: 1536 };

// What the runtime's Python itself says, asked here independently.
function pythonVersions() {
  const out = execFileSync(PYTHON, ["-I", "-B", "-c", `
import json, sys, importlib.metadata as md
v = {}
for n in ${JSON.stringify(PACKAGES)}:
    try: v[n] = md.version(n)
    except Exception: pass
print(json.dumps({"python": "%d.%d.%d" % sys.version_info[:3], "packages": v}))
`], { encoding: "utf8" });
  return JSON.parse(out);
}

function ci(args, url, timeoutMs = 30000) {
  return new Promise((resolve, reject) => {
    const child = spawn(CLI_BIN, args, { env: { ...process.env, CI_NATS_URL: url }, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

describe("runtime manifest", () => {
  let stack;
  let kv;
  const expected = existsSync(PYTHON) ? pythonVersions() : null;
  before(async () => {
    stack = await startStack({
      workers: 1,
      worker: { limits: LIMITS, sessions: { idle_s: 600 }, worker: { heartbeat_s: 1 } },
    });
    kv = await new Kvm(stack.client.js).open("ci-runtimes");
  });
  after(async () => {
    await stack?.stop();
  });

  const record = async () => {
    const e = await kv.get(RUNTIME);
    assert.ok(e && e.value.length, "the worker wrote the manifest");
    return JSON.parse(new TextDecoder().decode(e.value));
  };

  test("ci-runtimes holds the manifest: versions from the runtime's Python, the worker's limits", async () => {
    const m = await record();
    const w = stack.workers[0];
    assert.equal(m.runtime, RUNTIME);
    assert.equal(m.python, expected.python, show(m));
    assert.deepEqual(m.packages, expected.packages, show(m));
    assert.equal(m.versionsUnknown, undefined);
    assert.deepEqual(m.limits, {
      defaultTimeoutMs: "30000", maxTimeoutMs: "45000", defaultMemoryMb: "512", maxMemoryMb: "1536",
      maxCodeBytes: "1048576", maxInputBytes: "20971520", maxArtifactBytes: "20971520", maxOutputBytes: "1048576",
    });
    assert.deepEqual(m.artifacts, ["image/png", "text/csv"]);
    assert.equal(m.provider, "local");
    assert.equal(m.worker, w.id);
    assert.equal(m.version, "0.1.0");
    assert.equal(m.sessions.available, true);
    assert.equal(m.sessions.idleS, "600");
    assert.equal(m.sessions.maxStateMb, "64");
    // The isolation is what a task's result says; the network follows from it.
    const { result } = await runTask(stack.client, { taskId: newTaskId("iso"), code: "print(1)" });
    assert.equal(m.isolation, result.isolation, show(m));
    const sandboxed = result.isolation.split(",").includes("net");
    assert.equal(m.network, !sandboxed);
    if (sandboxed) assert.equal(m.pip, false);
    assert.match(m.atMs, /^\d+$/);
  });

  test("the bucket: history 1, TTL jetstream.max_age_s, file storage, as ci-sessions", async () => {
    const c = (await stack.client.jsm.streams.info("KV_ci-runtimes")).config;
    assert.deepEqual(c.subjects, ["$KV.ci-runtimes.>"]);
    assert.equal(c.max_msgs_per_subject, 1, "history 1");
    assert.equal(c.max_age, 3600e9, "TTL 1 h");
    assert.equal(c.storage, "file");
    assert.equal(c.num_replicas, 1);
  });

  test("the manifest is written again with the heartbeat", async () => {
    const first = await record();
    let later = first;
    for (const deadline = Date.now() + 15000; BigInt(later.atMs) <= BigInt(first.atMs) && Date.now() < deadline; ) {
      await new Promise((r) => setTimeout(r, 200));
      later = await record();
    }
    assert.ok(BigInt(later.atMs) > BigInt(first.atMs), `${first.atMs} then ${later.atMs} (15 s later)`);
  });

  test("ci runtimes prints it for a person; --json as stored", async () => {
    const url = stack.server.url;
    const h = await ci(["runtimes"], url);
    assert.equal(h.code, 0, h.stderr);
    assert.match(h.stdout, new RegExp(`^${RUNTIME} \\(worker ${stack.workers[0].id}, version 0\\.1\\.0, written \\d+ s ago\\)`));
    assert.match(h.stdout, new RegExp(`python: +${expected.python.replace(/\./g, "\\.")}\n`));
    for (const [name, v] of Object.entries(expected.packages)) assert.ok(h.stdout.includes(`${name} ${v}`), h.stdout);
    assert.match(h.stdout, /timeout 30000 ms \(max 45000\), memory 512 MiB \(max 1536\)/);
    assert.match(h.stdout, /sessions: +yes \(idle 600 s/);
    assert.match(h.stdout, /isolation: +\S+/);
    const j = await ci(["runtimes", "--json"], url);
    assert.equal(j.code, 0, j.stderr);
    const list = JSON.parse(j.stdout);
    assert.equal(list.length, 1);
    assert.equal(list[0].runtime, RUNTIME);
    assert.deepEqual(list[0].packages, expected.packages);
  });

  test("import sklearn: the hint lists the shipped packages with their versions", async () => {
    const { result } = await runTask(stack.client, { taskId: newTaskId("skl"), code: "import sklearn\n" });
    assert.match(result.error, /sklearn/);
    assert.match(result.hint, /'sklearn' is not available in this runtime and packages cannot be installed/);
    const listed = Object.entries(expected.packages).map(([n, v]) => `${n} ${v}`).join(", ");
    const [maj, min] = expected.python.split(".");
    assert.ok(result.hint.includes(`available: ${listed} and the Python ${maj}.${min} standard library`), result.hint);
  });

  test("ci runtimes says so when no manifest is there: exit 2, as for anything named that is not there (1 is 'a task failed')", async () => {
    await kv.purge(RUNTIME);
    // The worker writes it again within a second: stop it first.
    await stack.workers[0].stop("SIGTERM", 90000);
    await kv.purge(RUNTIME);
    const h = await ci(["runtimes"], stack.server.url);
    assert.equal(h.code, 2, h.stdout);
    assert.match(h.stderr, /no runtime manifest in ci-runtimes/);
    const j = await ci(["runtimes", "--json"], stack.server.url);
    assert.equal(j.code, 0);
    assert.deepEqual(JSON.parse(j.stdout), []);
  });
});
