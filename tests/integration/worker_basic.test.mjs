// The full path of a task through a real nats-server and a real ci-worker,
// checked field by field against docs/contract.md, in both encodings.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startStack } from "./lib/stack.mjs";
import { newTaskId, RUNTIME, proto } from "./lib/client.mjs";
import { checkEvents, checkResultBasics, PNG_MAGIC, sha256hex, show } from "./lib/checks.mjs";

const CSV = "region,amount\nnorth,4\neast,20\nwest,7\nnorth,6\neast,15\n";
const EXPECTED_STDOUT = "east:35\nnorth:10\nwest:7\n";
const CODE = `
import pandas as pd
import matplotlib.pyplot as plt

df = pd.read_csv("sales.csv")
totals = df.groupby("region")["amount"].sum().sort_index()
for region, total in totals.items():
    print(f"{region}:{total}")

fig, ax = plt.subplots()
totals.plot.bar(ax=ax)
plt.savefig("chart.png")
plt.close(fig)

# Left open on purpose: the runtime saves it as figure-1.png.
plt.figure()
plt.plot([1, 2, 3], [3, 1, 2])
`;

describe("worker basic", () => {
  let stack;
  let worker;
  before(async () => {
    stack = await startStack({ workers: 1, worker: { concurrency: 2 } });
    worker = stack.workers[0];
  });
  after(async () => {
    await stack?.stop();
  });

  for (const json of [false, true]) {
    const encoding = json ? "json" : "protobuf";
    test(`pandas + matplotlib task, ${encoding} request -> ${encoding} result with artifacts`, async () => {
      const c = stack.client;
      const taskId = newTaskId(`basic-${encoding}`);
      const labels = { agent: "itest", "conversation.id": "c-42", empty: "" };
      const submittedAt = Date.now();
      const ack = await c.submit(
        {
          taskId,
          language: "python",
          code: CODE,
          files: [{ name: "sales.csv", content: Buffer.from(CSV) }],
          limits: { timeoutMs: 30000, memoryMb: 1024 },
          policy: { network: "disabled", packages: "base" },
          labels,
        },
        { json },
      );
      assert.equal(ack.stream, "CI_TASKS");
      assert.equal(ack.duplicate, false);

      const { result: r, encoding: enc, problems, raw } = await c.waitResult(taskId, 60000);
      assert.equal(enc, encoding, "the result is encoded like the request");
      checkResultBasics(r, { taskId, encodingProblems: problems });

      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(r.exitCode, 0, "exit_code 0 is present");
      if (json) assert.ok("exitCode" in raw && raw.exitCode === 0, "JSON result has exitCode: 0 (a set optional field is written even when 0)");
      assert.equal(r.stdout, EXPECTED_STDOUT);
      assert.doesNotMatch(r.stderr, /Traceback/);
      assert.equal(r.error, "");
      assert.equal(r.stdoutTruncated, false);
      assert.equal(r.stderrTruncated, false);
      assert.equal(r.stdoutTotalBytes, Buffer.byteLength(EXPECTED_STDOUT));
      assert.equal(r.stderrTotalBytes, Buffer.byteLength(r.stderr));
      assert.equal(r.worker, worker.id);
      assert.equal(r.attempt, 1);
      assert.deepEqual(r.labels, labels);
      assert.equal(r.runtime, RUNTIME);
      assert.ok(r.isolation.length > 0, "isolation names the layers that ran (or 'none')");
      assert.ok(r.startedAtMs >= submittedAt - 2000 && r.startedAtMs <= Date.now(), `started_at_ms ${r.startedAtMs} is around the submit time ${submittedAt}`);

      // Usage of the user code.
      assert.ok(r.usage, "usage is present");
      assert.ok(r.usage.durationMs > 0, `usage.duration_ms ${r.usage.durationMs}`);
      assert.ok(r.usage.durationMs <= r.finishedAtMs - r.startedAtMs + 1000, "duration fits between start and finish");
      assert.ok(r.usage.cpuMs > 0, `usage.cpu_ms ${r.usage.cpuMs}: pandas + a savefig take CPU`);
      assert.ok(r.usage.memoryMb > 0 && r.usage.memoryMb <= 1024, `usage.memory_mb ${r.usage.memoryMb}`);
      if (json) {
        assert.equal(typeof raw.startedAtMs, "string", "64-bit integers are strings in JSON");
        assert.equal(typeof raw.finishedAtMs, "string");
        assert.equal(typeof raw.usage.durationMs, "string");
        assert.equal(typeof raw.stdoutTotalBytes, "string");
        assert.equal(raw.status, "TASK_STATUS_SUCCEEDED", "enums are written as names");
        assert.equal(typeof raw.artifacts[0].size, "string");
        assert.equal(raw.attempt, 1, "uint32 stays a number");
      }

      // Artifacts: the saved chart and the figure left open; the input is not one.
      const names = r.artifacts.map((a) => a.name).sort();
      assert.deepEqual(names, ["chart.png", "figure-1.png"], show(r.artifacts));
      for (const a of r.artifacts) {
        assert.equal(a.mimeType, "image/png");
        assert.equal(a.object, `${taskId}/${a.name}`);
        assert.match(a.sha256, /^[0-9a-f]{64}$/);
        const bytes = await c.getObject(a.object);
        assert.ok(bytes, `object ${a.object} exists in bucket ci-files`);
        assert.equal(bytes.length, a.size, `size of ${a.name}`);
        assert.ok(a.size > 1000, `${a.name} is a real picture (${a.size} bytes)`);
        assert.equal(sha256hex(bytes), a.sha256, `sha256 of ${a.name}`);
        assert.deepEqual(Buffer.from(bytes.subarray(0, 8)), PNG_MAGIC, `${a.name} is a PNG`);
        // ADR-20 metadata as any object-store client sees it.
        const info = await c.objectInfo(a.object);
        assert.equal(info.size, a.size);
        assert.equal(info.digest, "SHA-256=" + Buffer.from(a.sha256, "hex").toString("base64url") + "=", "ADR-20 digest, padded base64url");
      }

      const evs = await c.events(taskId);
      checkEvents(evs, { taskId, result: r, encoding, worker: worker.id });
      if (json) {
        for (const e of evs) {
          assert.equal(typeof e.raw.atMs, "string", "StatusEvent.at_ms is a string in JSON");
          assert.match(e.raw.status, /^TASK_STATUS_/);
        }
      }
    });
  }

  test("the smallest JSON request of docs/contract.md, task id from Nats-Msg-Id", async () => {
    const c = stack.client;
    const taskId = newTaskId("example");
    const body = '{"language":"python","code":"print(1)","limits":{"timeoutMs":5000}}';
    await c.submit(null, { body, msgId: taskId, contentType: "application/json" });
    const { result: r, raw, encoding, problems } = await c.waitResult(taskId, 30000);
    assert.equal(encoding, "json");
    checkResultBasics(r, { taskId, encodingProblems: problems });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(raw.taskId, taskId);
    assert.equal(raw.status, "TASK_STATUS_SUCCEEDED");
    assert.equal(raw.stdout, "1\n");
    assert.equal(raw.exitCode, 0);
    assert.equal(raw.stdoutTotalBytes, "2");
    assert.equal(raw.runtime, RUNTIME);
    assert.deepEqual(r.artifacts, []);
    const evs = await c.events(taskId);
    checkEvents(evs, { taskId, result: r, encoding: "json", worker: worker.id });
  });

  test("a header name in another case (content-type) is still read: header names are case-insensitive", async () => {
    const c = stack.client;
    const taskId = newTaskId("lcct");
    const body = JSON.stringify({ taskId, language: "python", code: "print(2)" });
    await c.submit(null, { body, msgId: taskId, contentType: null, headers: { "content-type": "application/json" } });
    const { result: r, encoding } = await c.waitResult(taskId, 30000);
    assert.equal(encoding, "json", "the result follows the request's encoding");
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.stdout, "2\n");
  });

  test("JSON request with snake_case names is accepted", async () => {
    const c = stack.client;
    const taskId = newTaskId("snake");
    const body = JSON.stringify({
      task_id: taskId,
      language: "python",
      code: "import os\nprint(sorted(os.listdir('.')))\nprint(open('in put.csv').read(), end='')",
      files: [{ name: "in put.csv", content: Buffer.from("a,b\n1,2\n").toString("base64") }],
      limits: { timeout_ms: 20000, memory_mb: 512 },
    });
    await c.submit(null, { body, msgId: null, contentType: "application/json" });
    const { result: r, encoding } = await c.waitResult(taskId, 30000);
    assert.equal(encoding, "json");
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.match(r.stdout, /'in put\.csv'/);
    assert.ok(r.stdout.endsWith("a,b\n1,2\n"), show(r));
  });

  test("protobuf request without Content-Type is protobuf by default", async () => {
    const c = stack.client;
    const taskId = newTaskId("noct");
    await c.submit({ taskId, language: "python", code: "import sys\nprint('out')\nprint('err', file=sys.stderr)" }, { contentType: null });
    const { result: r, encoding, bytes } = await c.waitResult(taskId, 30000);
    assert.equal(encoding, "protobuf");
    // Really protobuf: it decodes with the schema and is not JSON.
    assert.notEqual(bytes[0], 0x7b);
    const decoded = proto().ExecutionResult.decode(bytes);
    assert.equal(decoded.taskId, taskId);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.stdout, "out\n");
    assert.equal(r.stderr, "err\n");
    assert.equal(r.stderrTotalBytes, 4);
    assert.equal(r.runtime, RUNTIME, "an empty runtime means the default one");
    assert.deepEqual(r.labels, {});
    const evs = await c.events(taskId);
    checkEvents(evs, { taskId, result: r, encoding: "protobuf", worker: worker.id });
  });

  test("CSV written by the code is an artifact with mime type text/csv; UTF-8 output survives", async () => {
    const c = stack.client;
    const taskId = newTaskId("csv");
    const code = [
      "import pandas as pd",
      "df = pd.DataFrame({'x': [1, 2, 3], 'y': ['a', 'b', 'c']})",
      "df.to_csv('out.csv', index=False)",
      "print('héllo wörld ✓')",
      "open('blob.bin', 'wb').write(bytes(range(256)) * 4)",
    ].join("\n");
    await c.submit({ taskId, language: "python", code, runtime: RUNTIME });
    const { result: r } = await c.waitResult(taskId, 30000);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.stdout, "héllo wörld ✓\n");
    assert.equal(r.stdoutTotalBytes, Buffer.byteLength("héllo wörld ✓\n"));
    assert.deepEqual(r.artifacts.map((a) => a.name), ["out.csv"], "only CSV and PNG files are artifacts");
    const a = r.artifacts[0];
    assert.equal(a.mimeType, "text/csv");
    const bytes = await c.getObject(a.object);
    assert.equal(Buffer.from(bytes).toString(), "x,y\n1,a\n2,b\n3,c\n");
    assert.equal(a.sha256, sha256hex(bytes));
    assert.equal(a.size, bytes.length);
  });

  test("artifacts in a subfolder of /workspace keep their relative name", async () => {
    const c = stack.client;
    const taskId = newTaskId("subdir");
    const code = [
      "import os",
      "import matplotlib.pyplot as plt",
      "os.makedirs('out/deep', exist_ok=True)",
      "plt.plot([1, 2], [2, 1])",
      "plt.savefig('out/deep/plot.png')",
      "plt.close('all')",
      "open('out/t.csv', 'w').write('a\\n1\\n')",
    ].join("\n");
    await c.submit({ taskId, language: "python", code });
    const { result: r } = await c.waitResult(taskId, 30000);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    const byName = Object.fromEntries(r.artifacts.map((a) => [a.name, a]));
    assert.deepEqual(Object.keys(byName).sort(), ["out/deep/plot.png", "out/t.csv"], show(r.artifacts));
    for (const a of r.artifacts) {
      assert.equal(a.object, `${taskId}/${a.name}`);
      const bytes = await c.getObject(a.object);
      assert.equal(sha256hex(bytes), a.sha256);
    }
    assert.equal(byName["out/t.csv"].mimeType, "text/csv");
    assert.equal(byName["out/deep/plot.png"].mimeType, "image/png");
  });

  test("the NATS resources are those of the contract table", async () => {
    const { jsm, nc } = stack.client;
    const H = 3600e9; // 1 h in ns
    const tasks = (await jsm.streams.info("CI_TASKS")).config;
    assert.deepEqual(tasks.subjects, ["ci.submit", "ci.submit.*"], "a session's tasks too (§16)");
    assert.equal(tasks.allow_direct, true);
    assert.equal(tasks.retention, "workqueue");
    assert.equal(tasks.storage, "file");
    assert.equal(tasks.max_age, H);
    assert.equal(tasks.duplicate_window, 120e9);
    assert.equal(tasks.max_msg_size, nc.info.max_payload, "max message size = the server's max_payload");
    const cons = (await jsm.consumers.info("CI_TASKS", "ci-workers")).config;
    assert.equal(cons.durable_name, "ci-workers");
    assert.ok(!cons.filter_subject, "no filter: it takes both subjects");
    assert.equal(cons.ack_policy, "explicit");
    assert.equal(cons.ack_wait, 30e9);
    assert.equal(cons.max_deliver, 5);
    const status = (await jsm.streams.info("CI_STATUS")).config;
    assert.deepEqual(status.subjects, ["ci.status.>"]);
    assert.equal(status.retention, "limits");
    assert.equal(status.max_age, H);
    const cancel = (await jsm.streams.info("CI_CANCEL")).config;
    assert.deepEqual(cancel.subjects, ["ci.cancel.>"]);
    assert.equal(cancel.retention, "limits");
    assert.equal(cancel.max_age, H);
    const kv = (await jsm.streams.info("KV_ci-results")).config;
    assert.equal(kv.max_msgs_per_subject, 1, "history 1");
    assert.equal(kv.max_age, H, "TTL 1 h");
    const sessions = (await jsm.streams.info("KV_ci-sessions")).config;
    assert.deepEqual(sessions.subjects, ["$KV.ci-sessions.>"]);
    assert.equal(sessions.max_msgs_per_subject, 1, "history 1");
    assert.equal(sessions.max_age, H, "TTL 1 h");
    assert.equal(sessions.storage, "file");
    assert.equal(sessions.allow_direct, true);
    const kvStatus = await (await stack.client.kvBucket()).status();
    assert.equal(kvStatus.history, 1);
    const obj = (await jsm.streams.info("OBJ_ci-files")).config;
    assert.deepEqual([...obj.subjects].sort(), ["$O.ci-files.C.>", "$O.ci-files.M.>"]);
    assert.equal(obj.max_age, H, "TTL 1 h");
    assert.equal(obj.allow_rollup_hdrs, true);
  });

  test("a QUEUED record written first by the client is taken over by the worker", async () => {
    const c = stack.client;
    const kv = await c.kvBucket();
    for (const json of [false, true]) {
      const taskId = newTaskId(`queued-${json ? "json" : "pb"}`);
      // The client's own record, in the other encoding than its request.
      const queued = { taskId, status: "TASK_STATUS_QUEUED" };
      const bytes = json ? proto().ExecutionResult.encode(proto().ExecutionResult.fromObject({ taskId, status: 1 })).finish() : Buffer.from(JSON.stringify(queued));
      await kv.create(taskId, bytes);
      await c.submit({ taskId, language: "python", code: "print('taken over')" }, { json });
      const { result: r, encoding } = await c.waitResult(taskId, 30000);
      assert.equal(encoding, json ? "json" : "protobuf");
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(r.stdout, "taken over\n");
    }
  });

  test("CI_NATS_URL in the environment overrides nats.url of the config", async () => {
    // nats.url points at a closed port; only the environment is right. Cold:
    // where it connects is the question, not how its task starts.
    const w = await stack.addWorker({ id: `env-url-${process.pid}`, nats: { url: "nats://127.0.0.1:1" }, env: { CI_NATS_URL: stack.server.url }, local: { mode: "cold" } });
    const { code } = await worker.stop("SIGTERM", 30000);
    assert.equal(code, 0);
    const c = stack.client;
    const taskId = newTaskId("envurl");
    await c.submit({ taskId, language: "python", code: "print('via env')" });
    const { result: r } = await c.waitResult(taskId, 30000);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.worker, w.id);
  });
});
