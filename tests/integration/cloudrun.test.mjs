// The `cloudrun` provider end to end, on loopback: a real nats-server, a
// real ci-worker with worker.provider = cloudrun, a real ci-executor, a
// stand-in metadata server that issues JWT-shaped ID tokens with an expiry,
// and, where a test needs one, a proxy in front of the executor that counts
// requests or injects failures. Nothing of ours is mocked.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { createHmac, createSign, generateKeyPairSync } from "node:crypto";
import { Agent, request as httpRequest } from "node:http";
import { connect } from "node:net";
import { chownSync, chmodSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { startStack } from "./lib/stack.mjs";
import { WORKER_BIN } from "./lib/worker.mjs";
import { newTaskId } from "./lib/client.mjs";
import {
  blockUntilReleased,
  checkEvents,
  checkResultBasics,
  PNG_MAGIC,
  processesWith,
  releaseMarker,
  sha256hex,
  show,
  waitProcessWith,
} from "./lib/checks.mjs";
import {
  closedPort,
  cloudrunYaml,
  nousernsUnavailable,
  runExecutorToExit,
  selfSignedCert,
  signJwt,
  startExecutor,
  startMetadataServer,
  startProxy,
} from "./lib/executor.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Waits until the executor runs a task (its /healthz says so), at most ms.
async function untilRunning(ex, ms = 30000) {
  for (const deadline = Date.now() + ms; ; await sleep(50)) {
    const h = await ex.healthz();
    if (h.running > 0) return h;
    if (Date.now() > deadline) throw new Error(`the executor ran no task within ${ms} ms: ${JSON.stringify(h)}`);
  }
}
const MiB = 1024 * 1024;

// A raw TCP connection to base's host and port: st.data (what came back,
// latin1), st.closedAt (Date.now() when it closed, 0 while open), st.sock.
// Python lines that try to read /proc/<pid>/<f> for each f, printing
// "<f> denied" or "<f> READ" (mem at offset 0 gives EIO, but it opened).
function readProcLines(pid, files) {
  return [
    `pid = ${pid}`,
    `for f in (${files.map((f) => `'${f}'`).join(", ")},):`,
    "    try:",
    "        fh = open(f'/proc/{pid}/{f}', 'rb')",
    "    except PermissionError:",
    "        print(f, 'denied')",
    "        continue",
    "    try:",
    "        fh.read(4096)",
    "    except OSError:",
    "        pass",
    "    print(f, 'READ')",
  ];
}

function rawConn(base) {
  const u = new URL(base);
  const st = { data: "", closedAt: 0, openedAt: Date.now() };
  st.sock = connect(Number(u.port), u.hostname);
  st.sock.on("data", (d) => (st.data += d.toString("latin1")));
  st.sock.on("close", () => (st.closedAt = Date.now()));
  st.sock.on("error", () => {});
  st.connected = new Promise((resolve) => st.sock.once("connect", resolve));
  return st;
}

// Requests to base over one kept-alive connection (node:http, one socket):
// a connection the executor accepted before it began to stop stays usable.
function keptAlive(base) {
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  const request = (path, body) =>
    new Promise((resolve, reject) => {
      const headers = body ? { "Content-Type": "application/json" } : {};
      const rq = httpRequest(`${base}${path}`, { agent, method: body ? "POST" : "GET", headers }, (res) => {
        let text = "";
        res.on("data", (c) => (text += c));
        res.on("end", () => resolve({ status: res.statusCode, headers: res.headers, text, json: () => JSON.parse(text) }));
      });
      rq.on("error", reject);
      rq.end(body);
    });
  return { request, close: () => agent.destroy() };
}

const CSV = "region,amount\nnorth,4\neast,20\nwest,7\nnorth,6\neast,15\n";
const MORE = "region,amount\nsouth,9\n";
const CODE = `
import pandas as pd
import matplotlib.pyplot as plt

df = pd.concat([pd.read_csv("sales.csv"), pd.read_csv("more.csv")])
totals = df.groupby("region")["amount"].sum().sort_index()
for region, total in totals.items():
    print(f"{region}:{total}")
totals.to_csv("totals.csv")

fig, ax = plt.subplots()
totals.plot.bar(ax=ax)
plt.savefig("chart.png")
plt.close(fig)

# Left open on purpose: the runtime saves it as figure-1.png.
plt.figure()
plt.plot([1, 2, 3], [3, 1, 2])
`;

// The executor's limits are smaller than the worker's, so that a request the
// worker accepts can be refused at the executor's edge (413).
const EXECUTOR_LIMITS = { max_input_bytes: MiB };
// An executor of a test that is not about its sandbox starts cold: a warm
// one first starts two zygotes (the probe's and the pool's, ~5 s on a loaded
// machine). The shared executor, which runs most tasks here, and the one
// stopped with a task running through a worker stay warm, the default.
const COLD = { mode: "cold" };

describe("cloudrun provider", () => {
  let stack, executor, md;
  const taskIds = []; // every task run here: their results and events must hold no token
  const workers = []; // every cloudrun worker: their logs must hold no token
  const others = []; // proxies and metadata servers to close

  // A worker with the cloudrun provider; keys override the cloudrun section.
  async function cloudrunWorker(keys = {}, opts = {}) {
    // One worker at a time: a test that failed must not leave one behind
    // that takes the next test's tasks.
    for (const x of stack.workers) if (!x.exited()) await x.stop().catch(() => {});
    const w = await stack.addWorker({
      concurrency: opts.concurrency ?? 2,
      worker: { provider: "cloudrun" },
      extraYaml: cloudrunYaml({
        service_url: executor.url,
        metadata_url: md.url,
        timeout_margin_ms: 10000,
        backoff_initial_ms: 100,
        backoff_max_ms: 1000,
        ...keys,
      }),
    });
    workers.push(w);
    return w;
  }

  async function run(req, opts = {}) {
    const taskId = req.taskId ?? newTaskId(opts.prefix ?? "cr");
    taskIds.push(taskId);
    await stack.client.submit({ language: "python", ...req, taskId }, opts);
    return { taskId, ...(await stack.client.waitResult(taskId, opts.timeoutMs ?? 60000)) };
  }

  before(async () => {
    stack = await startStack({ workers: 0 });
    executor = await startExecutor({ limits: EXECUTOR_LIMITS, worker: { concurrency: 4 } });
    md = await startMetadataServer({ lifetimeS: 3600 });
    others.push(md);
  });
  after(async () => {
    if (process.env.CI_SHOW_WORKER_LOG && executor) process.stderr.write(`--- executor log ---\n${executor.logText()}\n`);
    await stack?.stop();
    for (const o of others) await o.close().catch(() => {});
    await executor?.cleanup().catch(() => {});
    if (authKeys.dir) rmSync(authKeys.dir, { recursive: true, force: true });
  });

  test("pandas + PNG: same artifacts (names, sizes, sha256) as the local provider, stored in the object store", async () => {
    const c = stack.client;
    const request = (taskId) => ({
      taskId,
      code: CODE,
      files: [
        { name: "sales.csv", content: Buffer.from(CSV) },
        { name: "more.csv", object: "inputs/more-cloudrun.csv" },
      ],
      limits: { timeoutMs: 30000 },
      labels: { agent: "itest" },
    });

    // The local provider first, for reference.
    const local = await stack.addWorker({ concurrency: 1 });
    await c.putObject("inputs/more-cloudrun.csv", Buffer.from(MORE)); // the worker made the bucket
    const lr = await run(request(newTaskId("ref-local")));
    await local.stop();
    assert.equal(lr.result.status, "TASK_STATUS_SUCCEEDED", show(lr.result));

    const px = await startProxy(executor.url);
    others.push(px);
    const w = await cloudrunWorker({ service_url: px.url });
    for (const json of [false, true]) {
      const r = await run(request(newTaskId(`cr-${json ? "json" : "pb"}`)), { json });
      const res = r.result;
      checkResultBasics(res, { taskId: r.taskId, encodingProblems: r.problems });
      assert.equal(r.encoding, json ? "json" : "protobuf");
      assert.equal(res.status, "TASK_STATUS_SUCCEEDED", show(res));
      assert.equal(res.stdout, "east:35\nnorth:10\nsouth:9\nwest:7\n");
      assert.equal(res.exitCode, 0);
      assert.equal(res.worker, w.id, "the result names the worker that handled the task");
      assert.deepEqual(res.labels, { agent: "itest" });
      assert.equal(res.isolation, lr.result.isolation, "isolation comes from the executor (same sandbox as local here)");
      assert.ok(res.isolation.length > 0);
      assert.ok(res.usage.durationMs > 0 && res.usage.memoryMb > 0, show(res));

      const names = (x) => x.artifacts.map((a) => [a.name, a.mimeType, a.size, a.sha256]).sort();
      assert.deepEqual(names(res), names(lr.result), "same artifacts as the local provider");
      assert.deepEqual(res.artifacts.map((a) => a.name).sort(), ["chart.png", "figure-1.png", "totals.csv"]);
      for (const a of res.artifacts) {
        assert.equal(a.object, `${r.taskId}/${a.name}`);
        const bytes = await c.getObject(a.object);
        assert.ok(bytes, `object ${a.object} exists`);
        assert.equal(bytes.length, a.size);
        assert.equal(sha256hex(bytes), a.sha256, `object ${a.object} holds the artifact`);
        if (a.mimeType === "image/png") assert.deepEqual(Buffer.from(bytes.subarray(0, 8)), PNG_MAGIC);
      }
      const evs = await c.events(r.taskId);
      checkEvents(evs, { taskId: r.taskId, result: res, encoding: r.encoding, worker: w.id });
      // Live output (contract §19): the executor's output comes with its
      // response, and the worker publishes all of it then.
      const chunks = await c.outputChunks(r.taskId, { stdout: Buffer.byteLength(res.stdout), stderr: Buffer.byteLength(res.stderr) });
      for (const stream of ["stdout", "stderr"]) {
        const mine = chunks.filter((x) => x.stream === stream);
        assert.deepEqual(mine.map((x) => [x.seq, x.attempt]), mine.map((_, i) => [String(i + 1), "1"]));
        assert.equal(Buffer.concat(mine.map((x) => x.data)).toString(), res[stream], `${stream} chunks vs the result`);
      }
      assert.ok(chunks.length >= 1);
    }
    assert.equal(px.count("/execute"), 2, "one /execute per task");
    assert.ok(px.auths.every((a) => a === `Bearer ${md.tokens[md.tokens.length - 1]}`), "each /execute carries the metadata server's ID token");
    assert.deepEqual(md.audiences[0], { audience: px.url, format: "full" }, "the token's audience is the service URL");
    const done = executor.lines().filter((l) => l.event === "execute.done");
    assert.ok(done.length >= 2 && done.every((l) => l.auth === "present"), "the executor saw an Authorization header");
    await w.stop();
  });

  test("ID tokens: one fetch for many tasks, a fresh one before the old expires", async () => {
    const mdc = await startMetadataServer({ lifetimeS: 3600 });
    others.push(mdc);
    const px = await startProxy(executor.url);
    others.push(px);
    const w = await cloudrunWorker({ service_url: px.url, metadata_url: mdc.url }, { concurrency: 2 });
    const rs = await Promise.all([1, 2, 3, 4].map((i) => run({ code: `print(${i})` })));
    for (const r of rs) assert.equal(r.result.status, "TASK_STATUS_SUCCEEDED", show(r.result));
    assert.equal(mdc.hits, 1, "4 tasks on 2 slots cost one token request (cached)");
    assert.equal(px.auths.length, 4);
    assert.ok(px.auths.every((a) => a === `Bearer ${mdc.tokens[0]}`));
    await w.stop();

    // Tokens that live 20 s (exp in whole seconds: 19 to 20 s), refreshed
    // 8 s before they expire: from 11 to 12 s after they were issued, which
    // leaves a slow machine time for two tasks before.
    const mds = await startMetadataServer({ lifetimeS: 20 });
    others.push(mds);
    const px2 = await startProxy(executor.url);
    others.push(px2);
    const w2 = await cloudrunWorker({ service_url: px2.url, metadata_url: mds.url, token_refresh_margin_s: 8 }, { concurrency: 1 });
    const a = await run({ code: "print('a')" });
    const b = await run({ code: "print('b')" });
    assert.equal(a.result.status, "TASK_STATUS_SUCCEEDED", show(a.result));
    assert.equal(b.result.status, "TASK_STATUS_SUCCEEDED", show(b.result));
    assert.equal(mds.hits, 1, "the second task reuses the cached token");
    assert.ok(Date.now() - mds.issuedAt[0] < 11000, "the second task came before the refresh time (else this test proves nothing)");
    await sleep(mds.issuedAt[0] + 12500 - Date.now()); // past exp - margin
    const c2 = await run({ code: "print('c')" });
    assert.equal(c2.result.status, "TASK_STATUS_SUCCEEDED", show(c2.result));
    assert.equal(mds.hits, 2, "a token about to expire is fetched again");
    assert.equal(px2.auths[2], `Bearer ${mds.tokens[1]}`, "the third task used the new token");
    assert.notEqual(mds.tokens[0], mds.tokens[1]);
    assert.equal(mds.refused, 0, "every token request carried Metadata-Flavor: Google");
    await w2.stop();
  });

  test("the executor stopped: retries, then a clear FAILED within the task's deadline", async () => {
    const gone = await startExecutor({ limits: EXECUTOR_LIMITS, local: COLD });
    const url = gone.url;
    await gone.cleanup();
    const w = await cloudrunWorker({ service_url: url, timeout_margin_ms: 3000, max_attempts: 4, backoff_initial_ms: 100, backoff_max_ms: 400 });
    const t0 = Date.now();
    const r = await run({ code: "print('never runs')", limits: { timeoutMs: 2000 } }, { timeoutMs: 30000 });
    const elapsed = Date.now() - t0;
    const res = r.result;
    checkResultBasics(res, { taskId: r.taskId });
    assert.equal(res.status, "TASK_STATUS_FAILED", show(res));
    assert.match(res.error, /executor service at http:\/\/127\.0\.0\.1:\d+ could not be reached after 4 attempts/, show(res));
    assert.match(res.error, /(Couldn't connect|Connection refused|Failed to connect)/i, show(res));
    assert.equal(res.exitCode, undefined, "the code never ran");
    assert.ok(elapsed < 2000 + 3000 + 10000, `FAILED after ${elapsed} ms: within the deadline (limit + margin) plus NATS overhead`);
    const evs = await stack.client.events(r.taskId);
    checkEvents(evs, { taskId: r.taskId, result: res, encoding: "protobuf" });
    await w.stop();

    // Nothing listens at all: the deadline, not the attempts, ends it.
    const port = await closedPort();
    const w2 = await cloudrunWorker({ service_url: `http://127.0.0.1:${port}`, timeout_margin_ms: 1000, max_attempts: 100, backoff_initial_ms: 200, backoff_max_ms: 400 });
    const t1 = Date.now();
    const r2 = await run({ code: "print(1)", limits: { timeoutMs: 1000 } }, { timeoutMs: 30000 });
    assert.equal(r2.result.status, "TASK_STATUS_FAILED", show(r2.result));
    assert.match(r2.result.error, /could not be reached within the task's deadline/, show(r2.result));
    // 100 tries with their backoff would take some 40 s: well over this.
    assert.ok(Date.now() - t1 < 1000 + 1000 + 10000, `ended ${Date.now() - t1} ms after submit`);
    await w2.stop();
  });

  test("503 then 502, then 200: the task succeeds on the third request", async () => {
    const px = await startProxy(executor.url, {
      fault: (n, req) =>
        req.path === "/execute" && n <= 2 ? { status: n === 1 ? 503 : 502, body: '{"error":"injected failure"}' } : null,
    });
    others.push(px);
    const before = await executor.healthz();
    const w = await cloudrunWorker({ service_url: px.url });
    const r = await run({ code: "print('third time lucky')" });
    assert.equal(r.result.status, "TASK_STATUS_SUCCEEDED", show(r.result));
    assert.equal(r.result.stdout, "third time lucky\n");
    assert.equal(px.count("/execute"), 3, "a 503, a 502 and a 200");
    const after = await executor.healthz();
    assert.equal(after.started - before.started, 1, "the code ran once");
    await w.stop();

    // 429 and 503 are retried too; 400 is not.
    const px2 = await startProxy(executor.url, {
      fault: (n, req) => (req.path === "/execute" ? (n === 1 ? { status: 429, body: "{}" } : n === 2 ? { status: 503, body: "" } : { status: 400, body: '{"error":"injected: bad request"}' }) : null),
    });
    others.push(px2);
    const w2 = await cloudrunWorker({ service_url: px2.url });
    const r2 = await run({ code: "print(1)" });
    assert.equal(r2.result.status, "TASK_STATUS_FAILED", show(r2.result));
    assert.equal(r2.result.error, "the executor refused the task (HTTP 400): injected: bad request");
    assert.equal(px2.count("/execute"), 3);
    await w2.stop();
  });

  // ci-executor does not recognise a task it has already run (a second
  // /execute of the same task id runs the code again), so a request that
  // may have reached it is never sent twice.
  test("a request that may have run is not sent again: 500, 504, a connection broken after sending", async () => {
    for (const status of [500, 504]) {
      const px = await startProxy(executor.url, {
        fault: (n, req) => (req.path === "/execute" ? { status, body: '{"error":"injected: crashed while running"}' } : null),
      });
      others.push(px);
      const w = await cloudrunWorker({ service_url: px.url });
      const r = await run({ code: "print(1)" });
      assert.equal(r.result.status, "TASK_STATUS_FAILED", show(r.result));
      assert.match(
        r.result.error,
        new RegExp(`^the executor service at http://127\\.0\\.0\\.1:\\d+ answered HTTP ${status} \\(injected: crashed while running\\); the code may have run, so the task is not sent again$`),
        show(r.result),
      );
      assert.equal(px.count("/execute"), 1, `HTTP ${status}: one request, not retried`);
      await w.stop();
    }

    // The proxy reads the whole request, then closes the connection.
    const px = await startProxy(executor.url, { fault: (n, req) => (req.path === "/execute" ? { destroy: true } : null) });
    others.push(px);
    const w = await cloudrunWorker({ service_url: px.url });
    const r = await run({ code: "print(2)" });
    assert.equal(r.result.status, "TASK_STATUS_FAILED", show(r.result));
    assert.match(r.result.error, /^the connection to the executor service at http:\/\/127\.0\.0\.1:\d+ broke after the task was sent \(.+\); the code may have run/, show(r.result));
    assert.match(r.result.error, /submit the task again if running it twice is safe$/);
    assert.equal(r.result.exitCode, undefined);
    assert.equal(px.count("/execute"), 1, "sent once: neither the worker nor libcurl sent it again");
    await w.stop();
  });

  test("waiting to be admitted does not shorten the run: a task admitted late still has its whole time limit", async () => {
    // 429 for 6 s from the first try on, then forwarded; the deadline for
    // tries is 7 s + 3 s. The code sleeps 4.5 s of its 7 s limit: a try
    // admitted at ~6-7 s must still wait ~5 s for the answer.
    let first = 0;
    const px = await startProxy(executor.url, {
      fault: (n, req) => {
        if (req.path !== "/execute") return null;
        first ||= Date.now();
        return Date.now() - first < 6000 ? { status: 429, body: '{"error":"injected: busy"}', headers: { "Retry-After": "1" } } : null;
      },
    });
    others.push(px);
    const before = await executor.healthz();
    const w = await cloudrunWorker({ service_url: px.url, timeout_margin_ms: 3000, backoff_initial_ms: 100, backoff_max_ms: 1000 });
    const r = await run({ code: "import time\ntime.sleep(4.5)\nprint('admitted late, ran in full')", limits: { timeoutMs: 7000 } }, { timeoutMs: 60000 });
    assert.equal(r.result.status, "TASK_STATUS_SUCCEEDED", show(r.result));
    assert.equal(r.result.stdout, "admitted late, ran in full\n");
    assert.ok(px.count("/execute") >= 3, `it waited through 429s (${px.count("/execute")} requests)`);
    const after = await executor.healthz();
    assert.equal(after.started - before.started, 1, "the code ran once");
    await w.stop();
  });

  test("an executor that restarts while a task waits: tried until the task's deadline, then the task succeeds", async () => {
    const ex = await startExecutor({ limits: EXECUTOR_LIMITS, local: COLD });
    const port = ex.port;
    // Default tries (no cap), short backoff; deadline = 15 s + 10 s.
    const w = await cloudrunWorker({ service_url: ex.url, backoff_initial_ms: 100, backoff_max_ms: 1000 });
    assert.deepEqual(await ex.stop(), { code: 0, signal: null });
    let ex2 = null;
    try {
      const c = stack.client;
      const taskId = newTaskId("cr-restart");
      taskIds.push(taskId);
      await c.submit({ taskId, language: "python", code: "print('after the restart')", limits: { timeoutMs: 15000 } });
      await c.waitStatus(taskId, "TASK_STATUS_RUNNING", 30000);
      // A restarted executor takes ~6 s to come back (a chosen duration, not
      // a wait for something): the worker must still be trying by then.
      await sleep(6000);
      const mid = await c.getResult(taskId);
      assert.ok(!mid || mid.result.status === "TASK_STATUS_RUNNING", `still running while the executor was down: ${show(mid?.result)}`);
      ex2 = await startExecutor({ limits: EXECUTOR_LIMITS, local: COLD, port });
      assert.equal(ex2.port, port, "the executor came back where it was");
      const { result: res } = await c.waitResult(taskId, 30000);
      checkResultBasics(res, { taskId });
      assert.equal(res.status, "TASK_STATUS_SUCCEEDED", show(res));
      assert.equal(res.stdout, "after the restart\n");
      assert.equal((await ex2.healthz()).started, 1, "the code ran once, on the restarted executor");
      await w.stop();
    } finally {
      await ex2?.cleanup();
      await ex.cleanup();
    }
  });

  test("a metadata server that answers 500: retried, then FAILED naming the token source, not the executor", async () => {
    const mdf = await startMetadataServer({ failStatus: 500 });
    others.push(mdf);
    const px = await startProxy(executor.url);
    others.push(px);
    const w = await cloudrunWorker({ service_url: px.url, metadata_url: mdf.url, timeout_margin_ms: 2000, backoff_initial_ms: 100, backoff_max_ms: 400 });
    const t0 = Date.now();
    const r = await run({ code: "print('never runs')", limits: { timeoutMs: 1000 } }, { timeoutMs: 30000 });
    const res = r.result;
    assert.equal(res.status, "TASK_STATUS_FAILED", show(res));
    assert.match(
      res.error,
      /^could not get an ID token from the metadata server at http:\/\/127\.0\.0\.1:\d+\/computeMetadata\/v1\/instance\/service-accounts\/default\/identity: it answered HTTP 500 \(\d+ tries in [\d.]+ s, until the task's deadline; the executor service was not called\)$/,
      show(res),
    );
    assert.doesNotMatch(res.error, /could not be reached/, "the executor is not blamed");
    assert.ok(mdf.failed >= 2, `the token request was tried again (${mdf.failed} requests)`);
    assert.equal(px.count("/execute"), 0, "no request without a token");
    assert.ok(Date.now() - t0 < 1000 + 2000 + 10000, `FAILED ${Date.now() - t0} ms after submit: within the deadline`);
    await w.stop();
  });

  test("a token error that asking again cannot fix (metadata server 404, a missing token file): FAILED at once, the executor not called", async () => {
    const md404 = await startMetadataServer({ failStatus: 404 });
    others.push(md404);
    const px = await startProxy(executor.url);
    others.push(px);
    const w = await cloudrunWorker({ service_url: px.url, metadata_url: md404.url });
    let t0 = Date.now();
    const r = await run({ code: "print('never runs')", limits: { timeoutMs: 5000 } }, { timeoutMs: 30000 });
    assert.equal(r.result.status, "TASK_STATUS_FAILED", show(r.result));
    assert.equal(
      r.result.error,
      `could not get an ID token from the metadata server at ${md404.url}: it answered HTTP 404 (is a service account attached to this machine?) (the executor service was not called)`,
    );
    assert.equal(md404.failed, 1, "asked once: a 404 does not go away by asking again");
    // The task's deadline is 15 s after it started (limit + timeout_margin_ms).
    assert.ok(Date.now() - t0 < 12000, `FAILED ${Date.now() - t0} ms after submit: at once, not at the task's deadline`);
    await w.stop();

    // A token file that is a directory cannot become a token: at once.
    const notFile = mkdtempSync(join(tmpdir(), "ci-token-dir-"));
    const w2 = await cloudrunWorker({ service_url: px.url, token_file: notFile });
    t0 = Date.now();
    const r2 = await run({ code: "print('never runs')", limits: { timeoutMs: 5000 } }, { timeoutMs: 30000 });
    assert.equal(r2.result.status, "TASK_STATUS_FAILED", show(r2.result));
    assert.equal(r2.result.error, `the token file ${notFile} is not a regular file (the executor service was not called)`);
    assert.ok(Date.now() - t0 < 12000, `FAILED ${Date.now() - t0} ms after submit: at once (the deadline is 15 s after the start)`);
    assert.equal(px.count("/execute"), 0, "no request without a token");
    await w2.stop();
    rmSync(notFile, { recursive: true, force: true });
  });

  test("a token file not written yet (a sidecar's) is waited for: the task runs once it appears", async () => {
    const late = join(tmpdir(), `ci-late-token-${process.pid}`);
    rmSync(late, { force: true });
    const px = await startProxy(executor.url);
    others.push(px);
    const w = await cloudrunWorker({ service_url: px.url, token_file: late });
    const pending = run({ code: "print('ran')", limits: { timeoutMs: 5000 } }, { timeoutMs: 60000 });
    // The sidecar writes it a moment later: the delay is the scenario.
    await sleep(1500);
    writeFileSync(late, "late-token\n");
    const r = await pending;
    assert.equal(r.result.status, "TASK_STATUS_SUCCEEDED", show(r.result));
    assert.equal(r.result.stdout, "ran\n");
    assert.equal(px.count("/execute"), 1, "sent once, with the token");
    assert.equal(px.auths[0], "Bearer late-token");
    await w.stop();
    rmSync(late, { force: true });
  });

  test("TLS: cloudrun.ca_file vouches for the service; a certificate it does not vouch for fails at once, not retried", async () => {
    const dir = mkdtempSync(join(tmpdir(), "ci-crtls-"));
    try {
      const mk = (name) => {
        const d = join(dir, name);
        mkdirSync(d);
        return selfSignedCert(d);
      };
      const service = mk("service");
      const other = mk("other");
      const px = await startProxy(executor.url, { tls: service });
      others.push(px);
      const w = await cloudrunWorker({ service_url: px.url, ca_file: service.certPath });
      const r = await run({ code: "print('over TLS')" });
      assert.equal(r.result.status, "TASK_STATUS_SUCCEEDED", show(r.result));
      assert.equal(r.result.stdout, "over TLS\n");
      assert.equal(px.count("/execute"), 1);
      await w.stop();

      // A CA that does not vouch for it: no retry can fix that.
      const w2 = await cloudrunWorker({ service_url: px.url, ca_file: other.certPath, backoff_initial_ms: 1000, backoff_max_ms: 1000 });
      const t0 = Date.now();
      const r2 = await run({ code: "print('never runs')", limits: { timeoutMs: 5000 } });
      assert.equal(r2.result.status, "TASK_STATUS_FAILED", show(r2.result));
      assert.match(r2.result.error, /^the executor service at https:\/\/127\.0\.0\.1:\d+ failed: POST https:\/\/127\.0\.0\.1:\d+\/execute cannot be sent: .*certificate/i, show(r2.result));
      // Retries (1 s apart) would go on until the deadline, 15 s after the start.
      assert.ok(Date.now() - t0 < 12000, `FAILED ${Date.now() - t0} ms after submit: at once, not after retries`);
      assert.equal(px.count("/execute"), 1, "nothing reached the service");
      await w2.stop();
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("ci-worker --check-config refuses a clear-text service URL off loopback and a CA bundle that cannot be used", () => {
    const dir = mkdtempSync(join(tmpdir(), "ci-crcheck-"));
    try {
      const check = (cloudrun) => {
        const path = join(dir, "worker.yaml");
        writeFileSync(path, `worker:\n  provider: cloudrun\ncloudrun:\n${Object.entries(cloudrun).map(([k, v]) => `  ${k}: "${v}"\n`).join("")}`);
        const env = { ...process.env };
        delete env.CI_NATS_URL;
        return spawnSync(WORKER_BIN, ["--check-config", "--config", path], { encoding: "utf8", env });
      };
      let r = check({ service_url: "http://10.1.2.3:8080" });
      assert.equal(r.status, 2, r.stdout + r.stderr);
      assert.match(r.stderr, /^worker\.yaml:4: key 'cloudrun\.service_url': http:\/\/ would send the worker's ID token unencrypted; it is allowed only to a loopback host/);
      r = check({ service_url: "https://x.a.run.app", ca_file: join(dir, "nope.pem") });
      assert.equal(r.status, 2, r.stdout + r.stderr);
      assert.match(r.stderr, /^worker\.yaml:5: key 'cloudrun\.ca_file': cannot read the CA bundle '.*nope\.pem': No such file or directory/);
      writeFileSync(join(dir, "ca.pem"), "not a certificate\n");
      r = check({ service_url: "https://x.a.run.app", ca_file: join(dir, "ca.pem") });
      assert.equal(r.status, 2, r.stdout + r.stderr);
      assert.match(r.stderr, /ca\.pem' holds no PEM certificate/);
      r = check({ service_url: "http://127.0.0.1:8080" });
      assert.equal(r.status, 0, r.stderr);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("401 once: the worker drops its token, fetches a fresh one and tries again", async () => {
    const mdx = await startMetadataServer({ lifetimeS: 3600 });
    others.push(mdx);
    const px = await startProxy(executor.url, {
      fault: (n, req) => (req.path === "/execute" && n === 1 ? { status: 401, body: '{"error":"token expired"}' } : null),
    });
    others.push(px);
    const w = await cloudrunWorker({ service_url: px.url, metadata_url: mdx.url });
    const r = await run({ code: "print('ok')" });
    assert.equal(r.result.status, "TASK_STATUS_SUCCEEDED", show(r.result));
    assert.equal(mdx.hits, 2, "a second token after the 401");
    assert.deepEqual(px.auths, [`Bearer ${mdx.tokens[0]}`, `Bearer ${mdx.tokens[1]}`]);
    await w.stop();

    // Refused every time: FAILED, saying what to fix, after one fresh try.
    const px2 = await startProxy(executor.url, { fault: (n, req) => (req.path === "/execute" ? { status: 403, body: "<html>Forbidden</html>" } : null) });
    others.push(px2);
    const w2 = await cloudrunWorker({ service_url: px2.url, metadata_url: mdx.url });
    const r2 = await run({ code: "print('no')" });
    assert.equal(r2.result.status, "TASK_STATUS_FAILED", show(r2.result));
    assert.match(r2.result.error, /refused the worker's ID token \(HTTP 403\).*roles\/run\.invoker/, show(r2.result));
    assert.equal(px2.count("/execute"), 2);
    await w2.stop();
  });

  test("a cloudrun worker without service_url refuses to start, saying why", async () => {
    await assert.rejects(
      stack.addWorker({ worker: { provider: "cloudrun" }, extraYaml: cloudrunYaml({ metadata_url: md.url }) }),
      /cloudrun\.service_url must be the executor service's URL/,
    );
  });

  test("a body over the executor's limit: 413, FAILED with the executor's reason, not retried", async () => {
    const w = await cloudrunWorker();
    const before = await executor.healthz();
    const big = Buffer.alloc(4 * MiB, 0x61);
    const r = await run({ code: "print(len(open('big.txt').read()))", files: [{ name: "big.txt", content: big }] });
    const res = r.result;
    assert.equal(res.status, "TASK_STATUS_FAILED", show(res));
    assert.match(res.error, /^the executor refused the task \(HTTP 413\): the request body is 4\.0 MiB; the limit is 3\.0 MiB/, show(res));
    assert.equal(res.exitCode, undefined);
    const after = await executor.healthz();
    assert.equal(after.rejected - before.rejected, 1, "one request, not retried");
    assert.equal(after.started - before.started, 0, "nothing ran");

    // Within the body limit but over the executor's input limit: 413 too,
    // with the contract's sentence.
    const r2 = await run({ code: "print(1)", files: [{ name: "mid.txt", content: Buffer.alloc(1.5 * MiB, 0x62) }] });
    assert.equal(r2.result.status, "TASK_STATUS_FAILED", show(r2.result));
    assert.match(r2.result.error, /HTTP 413\): input files total 1\.5 MiB; the limit is 1 MiB/, show(r2.result));
    await w.stop();
  });

  test("cancel of a running task kills it on the executor, output kept", async () => {
    const w = await cloudrunWorker();
    const c = stack.client;
    const before = await executor.healthz();
    const taskId = newTaskId("cr-cancel");
    taskIds.push(taskId);
    // It prints, then waits in a child whose command line carries a marker:
    // once the host sees that child, the line is printed.
    const marker = `ci-itest-crcancel-${process.pid}-${Date.now()}`;
    const code = `import subprocess, sys\nprint('started', flush=True)\nsubprocess.run([sys.executable, '-c', 'import time; time.sleep(30)', '${marker}'])\nprint('finished')`;
    await c.submit({ taskId, language: "python", code, limits: { timeoutMs: 60000 } });
    await c.waitStatus(taskId, "TASK_STATUS_RUNNING", 30000);
    // Running on the executor, and the code printed.
    await untilRunning(executor);
    await waitProcessWith(marker, 30000);
    assert.equal((await executor.healthz()).running, 1, "the task runs on the executor");
    const t0 = Date.now();
    await c.cancel(taskId);
    const { result: res } = await c.waitResult(taskId, 15000);
    const elapsed = Date.now() - t0;
    checkResultBasics(res, { taskId });
    assert.equal(res.status, "TASK_STATUS_CANCELLED", show(res));
    assert.ok(elapsed < 10000, `CANCELLED ${elapsed} ms after the cancel (the code sleeps 30 s)`);
    assert.equal(res.stdout, "started\n", "what the code printed before the cancel is kept");
    assert.ok(res.usage.durationMs < 25000, "the code did not sleep its 30 s");
    const after = await executor.healthz();
    assert.equal(after.running, 0, "nothing runs on the executor any more");
    assert.equal(after.cancelHits - before.cancelHits, 1, "POST /cancel/{taskId} found the run");
    assert.equal(after.cancelled - before.cancelled, 1, "the executor ended it CANCELLED");
    const evs = await c.events(taskId);
    checkEvents(evs, { taskId, result: res, encoding: "protobuf" });
    await w.stop();
  });

  test("a cancel the executor never hears of: the worker drops the connection and the executor kills the orphan", async () => {
    // /cancel is swallowed by the proxy: only the dropped connection tells.
    const px = await startProxy(executor.url, { fault: (n, req) => (req.path.startsWith("/cancel/") ? { status: 503, body: "" } : null) });
    others.push(px);
    const w = await cloudrunWorker({ service_url: px.url });
    const c = stack.client;
    const before = await executor.healthz();
    const taskId = newTaskId("cr-orphan");
    taskIds.push(taskId);
    await c.submit({ taskId, language: "python", code: "import time\ntime.sleep(30)", limits: { timeoutMs: 60000 } });
    await c.waitStatus(taskId, "TASK_STATUS_RUNNING", 30000);
    await untilRunning(executor);
    const t0 = Date.now();
    await c.cancel(taskId);
    const { result: res } = await c.waitResult(taskId, 15000);
    assert.equal(res.status, "TASK_STATUS_CANCELLED", show(res));
    assert.ok(Date.now() - t0 < 10000, `CANCELLED ${Date.now() - t0} ms after the cancel (the code sleeps 30 s)`);
    // The executor's kill of the orphan, well before the code's 30 s end.
    let h = await executor.healthz();
    for (const deadline = t0 + 20000; h.running > 0 && Date.now() < deadline; ) {
      await sleep(100);
      h = await executor.healthz();
    }
    assert.equal(h.running, 0, "the executor stopped the run whose client went away");
    assert.equal(h.clientGone - before.clientGone, 1);
    assert.equal(px.count(`/cancel/${taskId}`), 1, "the worker did call /cancel");
    await w.stop();
  });

  test("the time limit: TIMED_OUT, as with the local provider", async () => {
    const w = await cloudrunWorker();
    const r = await run({ code: "import time\nprint('tick', flush=True)\ntime.sleep(20)", limits: { timeoutMs: 2000 } });
    const res = r.result;
    assert.equal(res.status, "TASK_STATUS_TIMED_OUT", show(res));
    assert.equal(res.exitCode, 137);
    assert.equal(res.stdout, "tick\n");
    assert.match(res.error, /time limit of 2000 ms/);
    assert.ok(res.usage.durationMs >= 1900 && res.usage.durationMs < 6000, show(res));
    await w.stop();
  });

  test("failures of the code come back as they would locally: exit code, error, hint", async () => {
    const w = await cloudrunWorker();
    const r = await run({ code: "df = pd.DataFrame({'a': [1]})" });
    const res = r.result;
    assert.equal(res.status, "TASK_STATUS_FAILED", show(res));
    assert.equal(res.exitCode, 1);
    assert.match(res.error, /NameError/);
    assert.match(res.hint, /import pandas as pd/);
    assert.match(res.stderr, /Traceback/);
    await w.stop();
  });

  test("the executor answers bad requests with a 4xx and a JSON error, and lives on", async () => {
    const u = executor.url;
    const post = (path, body, ct) => fetch(`${u}${path}`, { method: "POST", body, headers: ct ? { "Content-Type": ct } : {} });
    const cases = [
      [() => post("/execute", Buffer.from([0xff, 0xff, 0xff, 0x0f]), "application/protobuf"), 400, /not a valid ExecutionRequest/],
      [() => post("/execute", '{"taskId": 5, "code": "print(1)"}', "application/json"), 400, /not a valid ExecutionRequest/],
      [() => post("/execute", "{", "application/json"), 400, /not a valid ExecutionRequest/],
      [() => post("/execute", '{"language":"python","code":"print(1)"}', "application/json"), 400, /task_id is required/],
      [() => post("/execute", '{"taskId":"x1","language":"cobol","code":"x"}', "application/json"), 400, /unsupported language/],
      [() => post("/execute", '{"taskId":"x2","language":"python","code":"print(1)","files":[{"name":"a.csv","object":"o/a.csv"}]}', "application/json"), 400, /inputs inline only/],
      [() => post("/execute", "print(1)", "text/x-python"), 415, /Content-Type/],
      [() => post("/execute", Buffer.alloc(40 * MiB, 0x20), "application/json"), 413, /request body is 40\.0 MiB/],
      [() => fetch(`${u}/execute`), 405, /use POST/],
      [() => post("/cancel/a%20b", ""), 400, /task id/],
      [() => fetch(`${u}/nowhere`), 404, /no such endpoint/],
    ];
    for (const [send, status, re] of cases) {
      const r = await send();
      assert.equal(r.status, status, `${re}`);
      assert.match(r.headers.get("content-type") ?? "", /^application\/json/);
      const body = await r.json();
      assert.match(body.error, re);
    }
    const h = await executor.healthz();
    assert.equal(h.status, "ok");
    assert.equal(executor.exited(), null, "still running");
  });

  test("an executor told to stop: a task it had to stop ran, so 500 (no Ci-Not-Run); one that comes during the drain is 503 with Ci-Not-Run; exit 0", async () => {
    const ex2 = await startExecutor({ worker: { drain_timeout_s: 2 }, local: COLD });
    try {
      const pending = fetch(`${ex2.url}/execute`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ taskId: "drain-1", language: "python", code: "import time\ntime.sleep(30)" }),
      });
      await untilRunning(ex2);
      // A connection the executor accepted before its drain, idle (keep-alive).
      const conn = keptAlive(ex2.url);
      assert.equal((await conn.request("/healthz")).status, 200);
      const t0 = Date.now();
      const exit = ex2.stop("SIGTERM");
      for (const deadline = Date.now() + 10000; !ex2.lines().some((l) => l.event === "executor.draining"); await sleep(20))
        if (Date.now() > deadline) assert.fail(`no executor.draining after SIGTERM:\n${ex2.logText()}`);
      // A request during the drain (on a connection accepted before): not run.
      const late = await conn.request("/execute", JSON.stringify({ taskId: "drain-2", language: "python", code: "print(1)" }));
      conn.close();
      assert.equal(late.status, 503);
      assert.equal(late.headers["ci-not-run"], "1", "the draining 503 says the code did not start");
      assert.match(JSON.parse(late.text).error, /shutting down; run the task again/);
      // A new connection is refused at once (a worker tries again: nothing
      // sent), not left in the listen backlog to be reset at exit.
      const fresh = rawConn(ex2.url);
      const refused = await new Promise((resolve) => {
        fresh.sock.once("error", (e) => resolve(e.code));
        fresh.sock.once("connect", () => resolve("connected"));
      });
      assert.equal(refused, "ECONNREFUSED");
      const r = await pending;
      assert.equal(r.status, 500, "the stopped task's code ran: not a 503 that a worker would send again");
      assert.equal(r.headers.get("ci-not-run"), null);
      assert.match((await r.json()).error, /shut down while the task ran and stopped it .*the code may have run in part/);
      assert.deepEqual(await exit, { code: 0, signal: null }, ex2.logText().slice(-4000));
      // The drain (2 s) cut the task short: it would have run 30 s. Not a
      // tighter bound: a loaded machine takes seconds to tear a sandbox down.
      assert.ok(Date.now() - t0 < 25000, `stopped the task at its drain time, not its end (${Date.now() - t0} ms)`);
    } finally {
      await ex2.cleanup();
    }
  });

  test("a task the executor stopped at its shutdown is not sent again: FAILED, the code may have run", async () => {
    const ex2 = await startExecutor({ limits: EXECUTOR_LIMITS, worker: { drain_timeout_s: 1 } });
    try {
      const px = await startProxy(ex2.url);
      others.push(px);
      const w = await cloudrunWorker({ service_url: px.url });
      const taskId = newTaskId("cr-stopped");
      taskIds.push(taskId);
      await stack.client.submit({ taskId, language: "python", code: "import time\nprint('started', flush=True)\ntime.sleep(30)", limits: { timeoutMs: 8000 } });
      await untilRunning(ex2);
      const exit = ex2.stop("SIGTERM");
      const { result: res } = await stack.client.waitResult(taskId, 60000);
      assert.equal(res.status, "TASK_STATUS_FAILED", show(res));
      assert.match(
        res.error,
        /^the executor service at http:\/\/127\.0\.0\.1:\d+ answered HTTP 500 \(this executor instance was shut down while the task ran and stopped it .*\); the code may have run, so the task is not sent again$/,
        show(res),
      );
      assert.equal(px.count("/execute"), 1, "sent once: the stopped run is not sent again (to the next instance)");
      assert.deepEqual(await exit, { code: 0, signal: null });
      await w.stop();
    } finally {
      await ex2.cleanup();
    }
  });

  test("409: another copy of the task runs on the executor: FAILED at once, not sent again (once that copy ends it would run again)", async () => {
    const before = await executor.healthz();
    const taskId = newTaskId("cr-dup");
    // The first copy, straight to the executor, runs until the test lets it
    // go on, once the second copy got its answer.
    const marker = `ci-itest-crdup-${process.pid}-${Date.now()}`;
    const first = postJson(executor.url, { taskId, code: `${blockUntilReleased(marker)}print('first copy')` });
    let w;
    try {
      await untilRunning(executor);
      await waitProcessWith(marker, 30000);
      const px = await startProxy(executor.url);
      others.push(px);
      w = await cloudrunWorker({ service_url: px.url });
      const t0 = Date.now();
      const r = await run({ taskId, code: "print('second copy')" });
      assert.equal(r.result.status, "TASK_STATUS_FAILED", show(r.result));
      assert.match(
        r.result.error,
        /^the executor service at http:\/\/127\.0\.0\.1:\d+ is already running another copy of this task \(HTTP 409: task cr-dup-\S+ is already running on this executor instance\), e\.g\. one sent for an earlier delivery; it is not sent again, so that the code does not run twice$/,
        show(r.result),
      );
      assert.equal(px.count("/execute"), 1, "one request: a 409 is not tried again");
      // The other copy ends only once released below: a worker that waited
      // for it would not be done by now.
      assert.ok(Date.now() - t0 < 12000, `FAILED ${Date.now() - t0} ms after submit: at once, not once the other copy ended`);
    } finally {
      releaseMarker(marker);
    }
    const f = await (await first).json();
    assert.equal(f.result.stdout, "first copy\n");
    const after = await executor.healthz();
    assert.equal(after.started - before.started, 1, "the code ran once");
    await w.stop();
  });

  // ---- without user namespaces (executor's local.isolation) -------------

  // lib/nouserns.py takes user namespaces away for real (Cloud Run gen1 /
  // gVisor grant none); where it cannot, these tests skip, loudly.
  let noUsernsWhy = null;
  function needNoUserns(t) {
    noUsernsWhy ??= nousernsUnavailable();
    if (!noUsernsWhy) return true;
    process.stderr.write(`#\n# WARNING: cannot take user namespaces away here (${noUsernsWhy}): executor no-sandbox tests SKIPPED\n#\n`);
    t.skip(`no way to run without user namespaces here: ${noUsernsWhy}`);
    return false;
  }
  const postJson = (url, body, headers = {}) =>
    fetch(`${url}/execute`, { method: "POST", headers: { "Content-Type": "application/json", ...headers }, body: JSON.stringify({ language: "python", ...body }) });
  // A private TMPDIR for a bare executor (its tasks' directories go there).
  function bareTmp(uid) {
    const d = mkdtempSync(join(tmpdir(), "ci-bare-"));
    if (uid) chownSync(d, uid, uid);
    else chmodSync(d, 0o711); // the sandbox uid passes through to its own directory
    return d;
  }

  test("no user namespaces and isolation auto: the executor refuses to start (exit 2), saying how to go on", async (t) => {
    if (!needNoUserns(t)) return;
    const r = await runExecutorToExit({ noUserns: { uid: 0 }, local: { isolation: "auto" }, timeoutMs: 20000 });
    assert.equal(r.code, 2, r.text);
    assert.ok(!r.lines.some((l) => l.event === "executor.ready"), "it never served");
    const refused = r.lines.find((l) => l.event === "executor.refused");
    assert.ok(refused, r.text);
    assert.match(refused.error, /no namespace sandbox on this machine \(user namespaces are not available: clone\(CLONE_NEWUSER\): No space left on device/);
    assert.match(refused.error, /set local\.isolation: none in the executor's config/);
    assert.match(refused.error, /one at a time/);

    // isolation none with more than one task at once is refused too.
    const r2 = await runExecutorToExit({ noUserns: { uid: 0 }, local: { isolation: "none" }, worker: { concurrency: 2 }, timeoutMs: 20000 });
    assert.equal(r2.code, 2, r2.text);
    assert.match(r2.lines.find((l) => l.event === "executor.refused")?.error ?? r2.text, /runs one task at a time; set worker\.concurrency to 1/);
  });

  // A bare executor (local.isolation none) without user namespaces, as uid,
  // with a private TMPDIR, for the length of fn(ex, tmp).
  async function withBareExecutor(uid, env, fn) {
    const tmp = bareTmp(uid);
    const ex = await startExecutor({ noUserns: { uid }, local: { isolation: "none" }, env: { TMPDIR: tmp, ...env } });
    try {
      return await fn(ex, tmp);
    } finally {
      await ex.cleanup();
      rmSync(tmp, { recursive: true, force: true });
    }
  }

  test("isolation none: one task at a time; a second gets 429, which the worker retries; tasks never overlap", async (t) => {
    if (!needNoUserns(t)) return;
    await withBareExecutor(10001, {}, async (ex) => {
      const h0 = await ex.healthz();
      assert.equal(h0.maxRunning, 1, "one task at a time, whatever the CPUs (worker.concurrency is 0 here)");
      assert.equal(h0.isolation, "none");

      // A second task while one runs: 429, the busy sentence, Retry-After.
      const first = postJson(ex.url, { taskId: "bare-long", code: "import time\nprint('long', flush=True)\ntime.sleep(60)" });
      await untilRunning(ex);
      const busy = await postJson(ex.url, { taskId: "bare-second", code: "print('second')" });
      assert.equal(busy.status, 429, "a second task while one runs is refused");
      assert.equal(busy.headers.get("retry-after"), "1");
      assert.equal(busy.headers.get("ci-not-run"), "1", "the 429 says the code did not start");
      assert.match((await busy.json()).error, /runs one task at a time \(no namespace sandbox, local\.isolation: none\) and is busy/);
      const cancel = await fetch(`${ex.url}/cancel/bare-long`, { method: "POST" });
      assert.equal(cancel.status, 200);
      const long = await (await first).json();
      assert.equal(long.result.status, "TASK_STATUS_CANCELLED", show(long.result));

      // Through a worker with two slots: both tasks run (the second after a
      // retried 429), never at the same time.
      const w = await cloudrunWorker({ service_url: ex.url, max_attempts: 40, backoff_initial_ms: 100, backoff_max_ms: 300, timeout_margin_ms: 20000 }, { concurrency: 2 });
      const span = "import time\nt0 = time.time()\ntime.sleep(1)\nprint(t0, time.time())";
      const rs = await Promise.all([run({ code: span }), run({ code: span })]);
      await w.stop();
      const spans = rs.map((r) => {
        assert.equal(r.result.status, "TASK_STATUS_SUCCEEDED", show(r.result));
        assert.equal(r.result.isolation, "none", "the result says it ran without a sandbox");
        return r.result.stdout.trim().split(" ").map(Number);
      });
      spans.sort((a, b) => a[0] - b[0]);
      assert.ok(spans[0][1] <= spans[1][0], `the tasks overlapped: ${JSON.stringify(spans)}`);
    });
  });

  test("isolation none, unprivileged executor: a task of its uid cannot read /proc/<executor>/environ, mem or maps; every rlimit is set", async (t) => {
    if (!needNoUserns(t)) return;
    const UID = 10001;
    const SECRET = `executor-secret-${process.pid}-${Date.now()}`;
    await withBareExecutor(UID, { CI_ITEST_EXECUTOR_SECRET: SECRET }, async (ex) => {
      const probe = await postJson(ex.url, {
        taskId: "bare-proc",
        code: [
          "import os, resource",
          ...readProcLines(ex.pid, ["environ", "mem", "maps"]),
          "print('uid', os.getuid())",
          "for n in ('NPROC', 'NICE', 'RTTIME', 'SIGPENDING', 'CORE'):",
          "    print(n, *resource.getrlimit(getattr(resource, 'RLIMIT_' + n)))",
        ].join("\n"),
      });
      assert.equal(probe.status, 200);
      const pr = (await probe.json()).result;
      assert.equal(pr.status, "TASK_STATUS_SUCCEEDED", show(pr));
      assert.equal(pr.isolation, "none");
      assert.ok(!pr.stdout.includes(SECRET), "the executor's environment leaked");
      assert.match(pr.stdout, /^environ denied$/m, pr.stdout);
      assert.match(pr.stdout, /^mem denied$/m, pr.stdout);
      assert.match(pr.stdout, /^maps denied$/m, pr.stdout);
      assert.match(pr.stdout, new RegExp(`^uid ${UID}$`, "m"), "unprivileged, the task shares the executor's uid (documented)");
      const nproc = pr.stdout.match(/^NPROC (\d+) (\d+)$/m);
      assert.ok(nproc, `RLIMIT_NPROC is set: ${pr.stdout}`);
      assert.ok(Number(nproc[1]) >= 64 && Number(nproc[1]) <= 64 + 64, `RLIMIT_NPROC is max_processes plus the executor's threads: ${nproc[0]}`);
      for (const n of ["NICE 0 0", "RTTIME 0 0", "SIGPENDING 256 256", "CORE 0 0"]) assert.match(pr.stdout, new RegExp(`^${n}$`, "m"));
    });
  });

  test("isolation none: nothing of a task is left for the next - no process (not even one in its own session), no file", async (t) => {
    if (!needNoUserns(t)) return;
    const marker = `ci-itest-bare-leftover-${process.pid}-${Date.now()}`;
    try {
      await withBareExecutor(10001, {}, async (ex, tmp) => {
        const before = await ex.healthz();
        // A process in its own session (out of the task's process group), and
        // a tree deeper than 64 levels that the task locked (mode 0, 0500).
        const left = await postJson(ex.url, {
          taskId: "bare-leftover",
          code: [
            "import os, subprocess, sys",
            `subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '${marker}'], start_new_session=True)`,
            "p = '/'.join(['d'] * 100)",
            "os.makedirs(p)",
            "open(p + '/data.csv', 'w').write('secret,1\\n')",
            "os.chmod('/'.join(['d'] * 50), 0)",
            "os.chmod('d', 0o500)",
            "print('left')",
          ].join("\n"),
        });
        assert.equal(left.status, 200);
        assert.equal((await left.json()).result.stdout, "left\n");
        // Both are gone before the answer: the next task cannot meet them.
        assert.deepEqual(processesWith(marker), [], "a process of the task outlived it");
        assert.deepEqual(readdirSync(tmp), [], "the task's directory is gone");
        const after = await ex.healthz();
        assert.ok(after.leftoversKilled - before.leftoversKilled >= 1, JSON.stringify(after));
        assert.ok(ex.lines().some((l) => l.event === "execute.leftovers_killed" && l.task_id === "bare-leftover"));
      });
    } finally {
      for (const pid of processesWith(marker)) try { process.kill(pid, "SIGKILL"); } catch { /* gone */ }
    }
  });

  test("isolation none: a process that left the task's group is killed when the task ends, before its files are read and removed", async (t) => {
    if (!needNoUserns(t)) return;
    const marker = `ci-itest-bare-late-${process.pid}-${Date.now()}`;
    try {
      await withBareExecutor(10001, {}, async (ex, tmp) => {
        // In a session of its own, holding stdout open: it waits for the
        // task's process to end, then writes an artifact half a second later.
        const late = [
          "import os, sys, time",
          "parent = int(sys.argv[1])",
          "while os.getppid() == parent:",
          "    time.sleep(0.01)",
          "time.sleep(0.5)",
          "open('late.csv', 'w').write('written,late\\n1,2\\n')",
          "time.sleep(120)",
        ].join("\n");
        const r = await postJson(ex.url, {
          taskId: "bare-late",
          code: ["import os, subprocess, sys", `subprocess.Popen([sys.executable, '-c', ${JSON.stringify(late)}, str(os.getpid()), '${marker}'], start_new_session=True)`, "print('main done')"].join("\n"),
        });
        assert.equal(r.status, 200);
        const res = (await r.json()).result;
        assert.equal(res.status, "TASK_STATUS_SUCCEEDED", show(res));
        assert.equal(res.stdout, "main done\n");
        assert.deepEqual(res.artifacts ?? [], [], "a process of the task wrote while its artifacts were read: it was still alive");
        assert.deepEqual(processesWith(marker), [], "a process of the task outlived it");
        assert.deepEqual(readdirSync(tmp), [], "the task's directory is gone");
      });
    } finally {
      for (const pid of processesWith(marker)) try { process.kill(pid, "SIGKILL"); } catch { /* gone */ }
    }
  });

  test("isolation none: a leftover whose first thread exited alone (a zombie with live threads) is killed too", async (t) => {
    if (!needNoUserns(t)) return;
    // The processes whose parent is pid, from /proc/*/stat.
    const childrenOf = (pid) =>
      readdirSync("/proc").filter((d) => {
        if (!/^\d+$/.test(d)) return false;
        try {
          const st = readFileSync(`/proc/${d}/stat`, "utf8");
          return Number(st.slice(st.lastIndexOf(")") + 2).split(" ")[1]) === pid;
        } catch {
          return false;
        }
      });
    await withBareExecutor(10001, {}, async (ex) => {
      const half = ["import ctypes, threading, time", "threading.Thread(target=time.sleep, args=(120,)).start()", "ctypes.CDLL(None).syscall(60, 0)"].join("\n");
      const r = await postJson(ex.url, {
        taskId: "bare-half-exited",
        code: [
          "import subprocess, sys, time",
          `p = subprocess.Popen([sys.executable, '-c', ${JSON.stringify(half)}], start_new_session=True)`,
          "while open(f'/proc/{p.pid}/stat').read().rsplit(')', 1)[1].split()[0] != 'Z':",
          "    time.sleep(0.01)",
          "print('its first thread is gone, another runs')",
        ].join("\n"),
      });
      assert.equal(r.status, 200);
      const res = (await r.json()).result;
      assert.equal(res.status, "TASK_STATUS_SUCCEEDED", show(res));
      assert.deepEqual(childrenOf(ex.pid), [], "a process of the task is still the executor's child after the answer");
      const killed = ex.lines().find((l) => l.event === "execute.leftovers_killed" && l.task_id === "bare-half-exited");
      assert.equal(killed?.still_alive, "false", ex.logText());
      assert.ok(killed.processes >= 1);
    });
  });

  test("isolation none: orphans that exit during the task are reaped at once, not left as zombies against its process limit", async (t) => {
    if (!needNoUserns(t)) return;
    await withBareExecutor(10001, {}, async (ex) => {
      // Each `sh -c 'sleep 0 &'` leaves an orphan that exits at once: 150 of
      // them, twice local.max_processes (64), in 1.5 s or more.
      const r = await postJson(ex.url, {
        taskId: "bare-orphans",
        code: ["import subprocess, time", "for i in range(150):", "    subprocess.run(['sh', '-c', 'sleep 0 &'], check=True)", "    time.sleep(0.01)", "print('150 orphans')"].join("\n"),
        limits: { timeoutMs: 30000 },
      });
      assert.equal(r.status, 200);
      const res = (await r.json()).result;
      assert.equal(res.status, "TASK_STATUS_SUCCEEDED", show(res));
      assert.equal(res.stdout, "150 orphans\n");
    });
  });

  test("isolation none: a process the sweep cannot remove makes the executor refuse every task (503, Ci-Not-Run), /healthz 503, and exit 1", async (t) => {
    if (!needNoUserns(t)) return;
    const marker = `ci-itest-bare-held-${process.pid}-${Date.now()}`;
    // Something the executor cannot end: a leftover traced from outside,
    // which once killed stays a zombie only its tracer may release.
    const TRACER = [
      "import ctypes, sys, time",
      "libc = ctypes.CDLL(None, use_errno=True)",
      "if libc.ptrace(ctypes.c_long(0x4206), ctypes.c_long(int(sys.argv[1])), None, None) != 0:",
      "    sys.exit(f'PTRACE_SEIZE: errno {ctypes.get_errno()}')",
      "time.sleep(600)",
    ].join("\n");
    let tracer = null;
    try {
      await withBareExecutor(10001, {}, async (ex) => {
        const conn = keptAlive(ex.url);
        const answer = conn.request("/execute", JSON.stringify({
          taskId: "bare-held",
          language: "python",
          code: [
            "import subprocess, sys, time",
            `p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '${marker}'], start_new_session=True)`,
            "while 'TracerPid:\\t0\\n' in open(f'/proc/{p.pid}/status').read():",
            "    time.sleep(0.05)",
            "print('held')",
          ].join("\n"),
        }));
        const [pid] = await waitProcessWith(marker, 30000);
        tracer = spawn("python3", ["-c", TRACER, String(pid)], { stdio: ["ignore", "ignore", "inherit"] });
        const r = await answer;
        assert.equal(r.status, 200, r.text);
        assert.equal(r.json().result.stdout, "held\n");
        const killed = ex.lines().find((l) => l.event === "execute.leftovers_killed" && l.task_id === "bare-held");
        assert.equal(killed?.still_alive, "true", ex.logText());
        assert.ok(ex.lines().some((l) => l.event === "executor.unhealthy"), ex.logText());
        // The next task is not let in beside what is left.
        const next = await conn.request("/execute", JSON.stringify({ taskId: "bare-after", language: "python", code: "print('must not run')" }));
        assert.equal(next.status, 503, next.text);
        assert.equal(next.headers["ci-not-run"], "1");
        assert.match(next.json().error, /could not end every process an earlier task left .* takes no more tasks; run the task again/);
        const h = await conn.request("/healthz");
        assert.equal(h.status, 503, "a liveness probe sees it");
        assert.equal(h.json().status, "unhealthy");
        assert.equal(h.json().started, 1, "nothing ran after");
        conn.close();
        // It stops by itself, so that the platform starts a fresh instance.
        for (const deadline = Date.now() + 20000; !ex.exited(); await sleep(50))
          if (Date.now() > deadline) assert.fail(`the unhealthy executor did not exit:\n${ex.logText()}`);
        assert.deepEqual(ex.exited(), { code: 1, signal: null }, ex.logText().slice(-3000));
      });
    } finally {
      tracer?.kill("SIGKILL");
      for (const pid of processesWith(marker)) try { process.kill(pid, "SIGKILL"); } catch { /* gone */ }
    }
  });

  test("isolation none, executor as root: the task runs as local.sandbox_uid and can neither read nor signal the executor", async (t) => {
    if (!needNoUserns(t)) return;
    const tmp = bareTmp(0);
    const ex = await startExecutor({ noUserns: { uid: 0 }, local: { isolation: "none" }, env: { TMPDIR: tmp } });
    try {
      const r = await postJson(ex.url, {
        taskId: "bare-root",
        code: [
          "import os",
          ...readProcLines(ex.pid, ["environ", "mem"]),
          "try:",
          "    os.kill(pid, 0)",
          "    print('signal SENT')",
          "except PermissionError:",
          "    print('signal denied')",
          "print('uid', os.getuid(), os.getgid())",
        ].join("\n"),
      });
      assert.equal(r.status, 200);
      const res = (await r.json()).result;
      assert.equal(res.status, "TASK_STATUS_SUCCEEDED", show(res));
      assert.equal(res.isolation, "none");
      assert.equal(res.stdout, "environ denied\nmem denied\nsignal denied\nuid 65534 65534\n");
      assert.deepEqual(readdirSync(tmp), [], "the task's directory is gone");
    } finally {
      await ex.cleanup();
      rmSync(tmp, { recursive: true, force: true });
    }
  });

  // ---- executor.auth: google-id-token --------------------------------------

  const AUD = "https://ci-executor-itest.a.run.app";
  const EMAIL = "ci-worker@itest-project.iam.gserviceaccount.com";
  const authKeys = {};
  function authSetup() {
    if (authKeys.dir) return authKeys;
    const k1 = generateKeyPairSync("rsa", { modulusLength: 2048 });
    const k2 = generateKeyPairSync("rsa", { modulusLength: 2048 });
    const other = generateKeyPairSync("rsa", { modulusLength: 2048 });
    const jwk = (k, kid) => ({ ...k.publicKey.export({ format: "jwk" }), kid, alg: "RS256", use: "sig" });
    authKeys.dir = mkdtempSync(join(tmpdir(), "ci-jwks-"));
    chmodSync(authKeys.dir, 0o755);
    authKeys.file = join(authKeys.dir, "certs.json");
    authKeys.k1 = k1;
    authKeys.k2 = k2;
    authKeys.other = other;
    // An EC key too, as a key set may hold: skipped (RS256 only), so a
    // token that names it finds no key.
    const ec = generateKeyPairSync("ec", { namedCurve: "P-256" });
    authKeys.ec = ec;
    authKeys.jwks1 = JSON.stringify({ keys: [jwk(other, "itest-0"), { ...ec.publicKey.export({ format: "jwk" }), kid: "itest-ec", alg: "ES256", use: "sig" }, jwk(k1, "itest-1")] });
    authKeys.jwksDup = JSON.stringify({ keys: [jwk(k1, "itest-1"), jwk(k2, "itest-1")] });
    authKeys.jwks2 = JSON.stringify({ keys: [jwk(k2, "itest-2")] });
    writeFileSync(authKeys.file, authKeys.jwks1);
    return authKeys;
  }
  const authConfig = (over = {}) => ({ auth: "google-id-token", audience: AUD, jwks_file: authKeys.file, allowed_emails: `someone-else@itest-project.iam.gserviceaccount.com, ${EMAIL}`, ...over });
  function claims(over = {}) {
    const now = Math.floor(Date.now() / 1000);
    return { iss: "https://accounts.google.com", aud: AUD, azp: "1", sub: "1", email: EMAIL, email_verified: true, iat: now, exp: now + 3600, ...over };
  }

  test("executor.auth google-id-token: a good ID token runs the task; every bad one is 401 with WWW-Authenticate and runs nothing", async () => {
    const k = authSetup();
    const ex = await startExecutor({ executor: authConfig(), local: COLD });
    const issued = [];
    const tok = (payload, opts = {}) => {
      const t = signJwt(payload, { privateKey: k.k1.privateKey, kid: "itest-1", ...opts });
      issued.push(t);
      return t;
    };
    try {
      const good = tok(claims());
      const ok = await postJson(ex.url, { taskId: "auth-good", code: "print('authorized')" }, { Authorization: `Bearer ${good}` });
      assert.equal(ok.status, 200);
      assert.equal((await ok.json()).result.stdout, "authorized\n");
      for (const [name, c] of [["iss without https://", claims({ iss: "accounts.google.com" })], ["aud as a list", claims({ aud: ["other", AUD] })]]) {
        const r = await postJson(ex.url, { taskId: `auth-good-${name.length}`, code: "print(1)" }, { Authorization: `Bearer ${tok(c)}` });
        assert.equal(r.status, 200, name);
        await r.arrayBuffer();
      }

      const now = Math.floor(Date.now() / 1000);
      const input = (h, p) => `${Buffer.from(JSON.stringify(h)).toString("base64url")}.${Buffer.from(JSON.stringify(p)).toString("base64url")}`;
      const pem = k.k1.publicKey.export({ format: "pem", type: "spki" });
      const hs = input({ alg: "HS256", kid: "itest-1", typ: "JWT" }, claims());
      const [gh, , gs] = good.split(".");
      const bad = [
        ["missing", null, /ID token is required/, 'Bearer realm="ci-executor"', /no Authorization header/],
        ["not Bearer", "Basic dXNlcjpwYXNz", /refused \(invalid\)/, null, /not a Bearer token/],
        ["not a JWT", "Bearer abc", /refused \(invalid\)/, null, /not a JWT/],
        ["wrong audience", `Bearer ${tok(claims({ aud: "https://elsewhere.a.run.app" }))}`, /refused \(invalid\)/, null, /aud is not executor\.audience/],
        ["expired", `Bearer ${tok(claims({ iat: now - 7200, exp: now - 3600 }))}`, /refused \(expired\)/, null, /expired 3\d\d\d s ago/],
        ["wrong issuer", `Bearer ${tok(claims({ iss: "https://evil.example.com" }))}`, /refused \(invalid\)/, null, /iss is not accounts\.google\.com/],
        ["unlisted email", `Bearer ${tok(claims({ email: "intruder@evil.iam.gserviceaccount.com" }))}`, /refused \(invalid\)/, null, /email intruder@evil\.iam\.gserviceaccount\.com is not in executor\.allowed_emails/],
        ["email not verified", `Bearer ${tok(claims({ email_verified: false }))}`, /refused \(invalid\)/, null, /email_verified is not true/],
        ["issued in the future", `Bearer ${tok(claims({ iat: now + 3600, exp: now + 7200 }))}`, /refused \(invalid\)/, null, /iat is \d+ s in the future/],
        ["not valid yet", `Bearer ${tok(claims({ nbf: now + 3600 }))}`, /refused \(invalid\)/, null, /nbf is \d+ s in the future/],
        ["bad signature (another key, our kid)", `Bearer ${tok(claims(), { privateKey: k.other.privateKey })}`, /refused \(invalid\)/, null, /signature does not verify with key 'itest-1'/],
        ["payload changed after signing", `Bearer ${gh}.${Buffer.from(JSON.stringify(claims({ email: EMAIL, exp: now + 999999 }))).toString("base64url")}.${gs}`, /refused \(invalid\)/, null, /signature does not verify/],
        ["unknown kid", `Bearer ${tok(claims(), { kid: "nope" })}`, /refused \(invalid\)/, null, /no key with kid 'nope'/],
        ["alg none", `Bearer ${input({ alg: "none", typ: "JWT" }, claims())}.`, /refused \(invalid\)/, null, /(alg is 'none'|not a signed JWT)/],
        ["HS256 with the public key as the secret", `Bearer ${hs}.${createHmac("sha256", pem).update(hs).digest("base64url")}`, /refused \(invalid\)/, null, /alg is 'HS256'; only RS256/],
        ["crit header", `Bearer ${tok(claims(), { header: { crit: ["exp"] } })}`, /refused \(invalid\)/, null, /critical header/],
        ["no exp", `Bearer ${tok(claims({ exp: undefined }))}`, /refused \(invalid\)/, null, /no exp claim/],
        ["no iat", `Bearer ${tok(claims({ iat: undefined }))}`, /refused \(invalid\)/, null, /no iat claim/],
        ["signed by the key set's EC key (ES256)", `Bearer ${signJwt(claims(), { kid: "itest-ec", header: { alg: "ES256" }, signature: createSign("sha256").update("x").sign({ key: k.ec.privateKey, dsaEncoding: "ieee-p1363" }) })}`, /refused \(invalid\)/, null, /alg is 'ES256'; only RS256/],
        ["RS256 naming the EC key's kid", `Bearer ${tok(claims(), { kid: "itest-ec" })}`, /refused \(invalid\)/, null, /no key with kid 'itest-ec'/],
      ];
      const h0 = await ex.healthz();
      for (const [name, authz, body, wwwExact, logRe] of bad) {
        const headers = authz ? { Authorization: authz } : {};
        const r = await postJson(ex.url, { taskId: "auth-bad", code: "print('must not run')" }, headers);
        assert.equal(r.status, 401, name);
        const www = r.headers.get("www-authenticate");
        if (wwwExact) assert.equal(www, wwwExact, name);
        else assert.equal(www, 'Bearer realm="ci-executor", error="invalid_token"', name);
        const e = (await r.json()).error;
        assert.match(e, body, name);
        assert.doesNotMatch(e, /aud|iss|email|signature|kid|alg|nbf|iat/, `${name}: the client is not told which check failed`);
        const refusals = ex.lines().filter((l) => l.event === "auth.refused");
        assert.match(refusals[refusals.length - 1].reason, logRe, `${name}: the log says why`);
        // /cancel needs the same token.
        const c = await fetch(`${ex.url}/cancel/auth-bad`, { method: "POST", headers });
        assert.equal(c.status, 401, `${name}: /cancel`);
        await c.arrayBuffer();
      }
      // A big body without a token: 401, not 413, not a body read into memory.
      const big = await fetch(`${ex.url}/execute`, { method: "POST", headers: { "Content-Type": "application/json" }, body: Buffer.alloc(8 * 1024 * 1024, 0x20) });
      assert.equal(big.status, 401);
      await big.arrayBuffer();

      const h1 = await ex.healthz(); // no token needed for the counters
      assert.equal(h1.auth, "google-id-token");
      assert.equal(h1.started - h0.started, 0, "no refused request ran anything");
      assert.equal(h1.unauthorized - h0.unauthorized, bad.length * 2 + 1);
      const c = await fetch(`${ex.url}/cancel/nothing-here`, { method: "POST", headers: { Authorization: `Bearer ${good}` } });
      assert.equal(c.status, 404, "a good token reaches /cancel");
      await c.arrayBuffer();

      const log = ex.logText();
      for (const t of issued) assert.ok(!log.includes(t) && !log.includes(t.split(".")[2]), "a token appears in the executor's log");
    } finally {
      await ex.cleanup();
    }
  });

  test("executor.auth end to end: the worker's ID token from the metadata server passes; another service account's does not", async () => {
    const k = authSetup();
    const ex = await startExecutor({ executor: authConfig(), local: COLD });
    try {
      const mdg = await startMetadataServer({ signer: { privateKey: k.k1.privateKey, kid: "itest-1" }, claims: { email: EMAIL, email_verified: true } });
      others.push(mdg);
      const w = await cloudrunWorker({ service_url: ex.url, metadata_url: mdg.url, audience: AUD });
      const r = await run({ code: "print('through auth')" });
      assert.equal(r.result.status, "TASK_STATUS_SUCCEEDED", show(r.result));
      assert.equal(r.result.stdout, "through auth\n");
      assert.equal(mdg.audiences[0].audience, AUD);
      await w.stop();

      const mdx = await startMetadataServer({ signer: { privateKey: k.k1.privateKey, kid: "itest-1" }, claims: { email: "intruder@itest-project.iam.gserviceaccount.com", email_verified: true } });
      others.push(mdx);
      const w2 = await cloudrunWorker({ service_url: ex.url, metadata_url: mdx.url, audience: AUD });
      const r2 = await run({ code: "print('must not run')" });
      assert.equal(r2.result.status, "TASK_STATUS_FAILED", show(r2.result));
      assert.match(r2.result.error, /refused the worker's ID token \(HTTP 401\)/, show(r2.result));
      assert.equal(mdx.hits, 2, "a fresh token was tried once");
      await w2.stop();
      assert.ok(ex.lines().some((l) => l.event === "auth.refused" && /intruder@/.test(l.reason)));
      for (const t of [...mdg.tokens, ...mdx.tokens]) assert.ok(!ex.logText().includes(t.split(".")[2]), "a token appears in the executor's log");
    } finally {
      await ex.cleanup();
    }
  });

  test("callers without a token cannot hold connections: a trickled request is cut after 10 s, a 401 or /healthz answer closes the connection, a refused body is read 1 MiB at most, one address holds max_connections_per_ip", async () => {
    const k = authSetup();
    const ex = await startExecutor({ executor: authConfig({ max_connections_per_ip: 3 }), local: COLD });
    const opened = [];
    try {
      // One address: 3 connections; the 4th and 5th are closed at once.
      for (let i = 0; i < 5; i++) opened.push(rawConn(ex.url));
      await Promise.all(opened.map((c) => c.connected));
      for (const deadline = Date.now() + 5000; opened.filter((c) => c.closedAt).length < 2 && Date.now() < deadline; ) await sleep(50);
      await sleep(300); // a third close would come now, if it came
      assert.equal(opened.filter((c) => c.closedAt).length, 2, "two connections over the per-address limit of 3 were closed");
      for (const c of opened) c.sock.destroy();
      // Until the executor has seen those closes: a probe that gets an
      // answer was under the limit (one over it is closed unanswered); the
      // probe and the slow connection below then fit in it too.
      for (const deadline = Date.now() + 10000; ; await sleep(50)) {
        const probe = rawConn(ex.url);
        await probe.connected;
        probe.sock.write("GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
        for (const d2 = Date.now() + 2000; !probe.closedAt && !probe.data && Date.now() < d2; ) await sleep(20);
        const answered = probe.data.startsWith("HTTP/1.1 ");
        probe.sock.destroy();
        if (answered) break;
        assert.ok(Date.now() < deadline, "the executor never freed the closed connections' places");
      }

      // A request trickled a byte a second (the idle timer restarts on each).
      const slow = rawConn(ex.url);
      await slow.connected;
      slow.sock.write("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ");
      for (let i = 0; !slow.closedAt && i < 20; i++) {
        await sleep(1000);
        if (!slow.closedAt) slow.sock.write("a");
      }
      assert.ok(slow.closedAt, "a connection that never finished its request is still open after 20 s");
      const lived = slow.closedAt - slow.openedAt;
      assert.ok(lived >= 9000 && lived < 14000, `cut after ${lived} ms: about 10 s after it opened`);

      // A 401 closes the connection (no keep-alive for a caller without a
      // token), and so does the answer of /healthz, open to anyone.
      for (const req of ["POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"]) {
        const c = rawConn(ex.url);
        await c.connected;
        c.sock.write(req);
        for (const deadline = Date.now() + 5000; !c.closedAt && Date.now() < deadline; ) await sleep(20);
        assert.ok(c.closedAt, `the connection stayed open after: ${c.data.slice(0, 200)}`);
        assert.match(c.data, /^HTTP\/1\.1 (401|200) /);
        assert.match(c.data, /\r\nconnection: close\r\n/i);
      }

      // A refused request announcing 32 MiB, sent without waiting for an
      // answer: the executor answers 401 at once and stops reading after
      // 1 MiB of the body, closing the connection (it read up to 64 MiB,
      // then answered and kept the connection). The client sends only as
      // fast as the executor (and the socket buffers) take it. The 401 may
      // be lost to the reset a close with unread data causes: a client that
      // sends a large body without "Expect: 100-continue" (libcurl asks for
      // one, so the worker does) has to live with that.
      const big = rawConn(ex.url);
      await big.connected;
      big.sock.write("POST /execute HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 33554432\r\n\r\n");
      const chunk = Buffer.alloc(64 * 1024, 0x20);
      let sent = 0;
      for (const deadline = Date.now() + 30000; sent < 32 * MiB && !big.closedAt && Date.now() < deadline; ) {
        const more = big.sock.write(chunk);
        sent += chunk.length;
        if (!more) await Promise.race([new Promise((r) => big.sock.once("drain", r)), new Promise((r) => big.sock.once("close", r)), sleep(5000)]);
      }
      for (const deadline = Date.now() + 5000; !big.closedAt && Date.now() < deadline; ) await sleep(20);
      assert.ok(big.closedAt, `the connection was not closed: the executor read all ${sent} bytes`);
      assert.ok(sent < 24 * MiB, `the executor took ${sent} bytes of a refused body before it closed the connection`);
      if (big.data) assert.match(big.data, /^HTTP\/1\.1 401 /);
      big.sock.destroy();
      assert.equal(ex.exited(), null, "the executor lives on");
    } finally {
      for (const c of opened) c.sock.destroy();
      await ex.cleanup();
    }
  });

  test("executor.auth: the key set is read again when its file changes, and on SIGHUP", async () => {
    const k = authSetup();
    const dir = mkdtempSync(join(tmpdir(), "ci-jwks-rot-"));
    const file = join(dir, "certs.json");
    writeFileSync(file, k.jwks1);
    const ex = await startExecutor({ executor: authConfig({ jwks_file: file }), local: COLD });
    const call = async (key, kid) => {
      const r = await postJson(ex.url, { taskId: `rot-${Date.now()}`, code: "print(1)" }, { Authorization: `Bearer ${signJwt(claims(), { privateKey: key.privateKey, kid })}` });
      await r.arrayBuffer();
      return r.status;
    };
    try {
      assert.equal(await call(k.k1, "itest-1"), 200);
      assert.equal(await call(k.k2, "itest-2"), 401, "a key not in the set yet");
      writeFileSync(file, k.jwks2);
      let status = 0;
      for (const deadline = Date.now() + 10000; status !== 200 && Date.now() < deadline; await sleep(100)) status = await call(k.k2, "itest-2");
      assert.equal(status, 200, "the rotated key is accepted once the file changed");
      assert.equal(await call(k.k1, "itest-1"), 401, "the key that left the set is refused");

      // SIGHUP: a bad file is reported and the keys in use stay.
      writeFileSync(file, "{not json");
      ex.signal("SIGHUP");
      for (const deadline = Date.now() + 10000; !ex.lines().some((l) => l.event === "auth.reload_failed"); await sleep(50))
        if (Date.now() > deadline) assert.fail(`no auth.reload_failed after SIGHUP:\n${ex.logText()}`);
      assert.equal(await call(k.k2, "itest-2"), 200, "the old keys stay after a bad reload");
      writeFileSync(file, k.jwks1);
      ex.signal("SIGHUP");
      for (const deadline = Date.now() + 10000; !ex.lines().some((l) => l.event === "auth.reloaded"); await sleep(50))
        if (Date.now() > deadline) assert.fail(`no auth.reloaded after SIGHUP:\n${ex.logText()}`);
      assert.equal(ex.lines().find((l) => l.event === "auth.reloaded").keys, 2);
      assert.equal(await call(k.k1, "itest-1"), 200);
      assert.equal(ex.exited(), null, "SIGHUP does not stop it");
    } finally {
      await ex.cleanup();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("executor.auth must be chosen: without it, or without what google-id-token needs, the executor refuses to start", async () => {
    const k = authSetup();
    const cases = [
      [{}, /executor\.auth is not set: choose google-id-token .* or none/],
      [authConfig({ audience: "" }), /executor\.audience is empty/],
      [authConfig({ jwks_file: join(k.dir, "missing.json") }), /executor\.jwks_file: cannot open/],
      [authConfig({ allowed_emails: "" }), /executor\.allowed_emails is empty/],
      [authConfig({ allowed_emails: "not-an-email" }), /'not-an-email' is not an email address/],
      [authConfig({ jwks_file: join(k.dir, "dup.json") }), /executor\.jwks_file: '.*dup\.json' has two keys with kid 'itest-1'/],
    ];
    writeFileSync(join(k.dir, "dup.json"), k.jwksDup);
    for (const [executor, re] of cases) {
      const r = await runExecutorToExit({ executor, timeoutMs: 20000 });
      assert.equal(r.code, 2, r.text);
      assert.match(r.lines.find((l) => l.event === "executor.refused")?.error ?? r.text, re);
    }
  });

  test("the token never appears in a log, a result or an event", async () => {
    const tokens = others.filter((o) => Array.isArray(o.tokens)).flatMap((o) => o.tokens);
    assert.ok(tokens.length >= 3, "tokens were issued");
    const secrets = tokens.flatMap((t) => [t, t.split(".")[2]]);
    const texts = [["executor log", executor.logText()], ...workers.map((w) => [`log of ${w.id}`, w.logText()])];
    for (const id of taskIds) {
      const r = await stack.client.getResult(id);
      if (r) texts.push([`result of ${id}`, Buffer.from(r.bytes).toString("latin1")]);
      const evs = await stack.client.events(id, { untilTerminal: false, settleMs: 0, timeoutMs: 2000 });
      for (const e of evs) texts.push([`event of ${id}`, Buffer.from(e.bytes).toString("latin1")]);
    }
    assert.ok(texts.length > taskIds.length, "results and events were read");
    for (const [what, text] of texts) for (const s of secrets) assert.ok(!text.includes(s), `a token appears in the ${what}`);
    assert.ok(executor.logText().includes('"auth":"present"'), "the executor logs only that a token came");
  });

  test("every worker and the executor exit 0 (no sanitizer report) on SIGTERM", async () => {
    for (const w of stack.workers) if (!w.exited()) await w.stop();
    for (const w of workers) assert.deepEqual(w.exited(), { code: 0, signal: null }, `worker ${w.id}:\n${w.logText().slice(-4000)}`);
    const x = await executor.stop();
    assert.deepEqual(x, { code: 0, signal: null }, executor.logText().slice(-4000));
    assert.ok(executor.lines().some((l) => l.event === "executor.stopped"));
  });
});
