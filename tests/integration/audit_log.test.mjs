// The worker's logs carry metadata only: a full run with a distinct canary
// in the code, stdout, stderr, an inline input, an object input, a label
// value, an artifact, the error text of a failed task, the error text of a
// refused request, and the NATS password must leave none of them in the
// log, at log level debug. Each canary is first shown to reach the result
// (so this test fails if the log had them). The task.done line has the
// metadata the issue lists, with the right values; task.stages (debug) the
// stages of a run, in order.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";

import { startNatsServer } from "./lib/nats-server.mjs";
import { startWorker, parseLogLines } from "./lib/worker.mjs";
import { connectClient, newTaskId } from "./lib/client.mjs";
import { sha256hex, show } from "./lib/checks.mjs";
import { SERVER_CONFIG } from "./lib/stack.mjs";

const rnd = () => randomBytes(6).toString("hex");
// Built at run time by the code from two halves, so that only the output
// (not the code) holds the whole canary.
const C = {
  code: `CODE${rnd()}`,
  stdoutTail: rnd(),
  stderrTail: rnd(),
  artifactTail: rnd(),
  inline: `INLINE${rnd()}`,
  object: `OBJECT${rnd()}`,
  label: `LABEL${rnd()}`,
  excTail: rnd(),
  refused: `REFUSED${rnd()}`,
  password: `PW${rnd()}`,
};
const STDOUT = `OUT${C.stdoutTail}`;
const STDERR = `ERR${C.stderrTail}`;
const ARTIFACT = `ART${C.artifactTail}`;
const EXC = `EXC${C.excTail}`;

describe("audit log", () => {
  let server, worker, client;
  before(async () => {
    // A password-protected server: the worker logs in with the password in
    // its URL; the test's client comes in as the no-auth user.
    server = await startNatsServer({
      config: `${SERVER_CONFIG}
authorization { users: [ {user: ciworker, password: "${C.password}"}, {user: anon, password: "${rnd()}"} ] }
no_auth_user: anon`,
    });
    const url = new URL(server.url);
    worker = await startWorker({
      natsUrl: `nats://ciworker:${C.password}@127.0.0.1:${url.port}`,
      concurrency: 2,
      worker: { log_level: "debug" },
    });
    client = await connectClient(server.url);
  });
  after(async () => {
    await client?.close();
    await worker?.cleanup();
    await server?.stop();
  });

  test("no code, output, input, label value, error text or password in the log; task.done has the metadata", async () => {
    const okId = newTaskId("audit-ok");
    const code = [
      `# ${C.code}`,
      "import sys",
      `print('OUT' + '${C.stdoutTail}')`,
      `sys.stderr.write('ERR' + '${C.stderrTail}' + '\\n')`,
      "a = open('inline.csv').read()",
      "b = open('object.csv').read()",
      "print(len(a), len(b))",
      `open('report.csv', 'w').write('x\\n' + 'ART' + '${C.artifactTail}' + '\\n')`,
    ].join("\n");
    const inline = Buffer.from(`v\n${C.inline}\n`);
    const objectData = Buffer.from(`w\n${C.object}\n`);
    const objectName = `inputs/${okId}/object.csv`;
    await client.putObject(objectName, objectData);
    await client.submit({
      taskId: okId,
      language: "python",
      code,
      files: [
        { name: "inline.csv", content: inline },
        { name: "object.csv", object: objectName },
      ],
      labels: { team: C.label, run: "r1" },
    });

    // The error text of a failed run holds the exception's message.
    const failId = newTaskId("audit-fail");
    await client.submit({ taskId: failId, language: "python", code: `raise ValueError('EXC' + '${C.excTail}')` });
    // The error text of a refused request quotes the request.
    const refusedId = newTaskId("audit-refused");
    await client.submit({ taskId: refusedId, language: "python", code: "print(1)", files: [{ name: `.${C.refused}`, content: Buffer.from("x") }] });

    const { result: ok } = await client.waitResult(okId, 60000);
    const { result: failed } = await client.waitResult(failId, 60000);
    const { result: refused } = await client.waitResult(refusedId, 60000);

    // Each canary reached the result: the log below had every chance to hold it.
    assert.equal(ok.status, "TASK_STATUS_SUCCEEDED", show(ok));
    assert.ok(ok.stdout.includes(STDOUT), show(ok));
    assert.ok(ok.stderr.includes(STDERR), show(ok));
    assert.equal(ok.labels.team, C.label);
    assert.equal(ok.artifacts.length, 1, show(ok));
    const art = await client.getObject(ok.artifacts[0].object);
    assert.ok(Buffer.from(art).toString().includes(ARTIFACT));
    assert.equal(failed.status, "TASK_STATUS_FAILED", show(failed));
    assert.ok(`${failed.error} ${failed.stderr}`.includes(EXC), show(failed));
    assert.ok(failed.error.includes(EXC), `the error text names the exception's message: ${show(failed)}`);
    assert.equal(refused.status, "TASK_STATUS_FAILED", show(refused));
    assert.ok(refused.error.includes(C.refused), show(refused));

    const stopped = await worker.stop("SIGTERM", 30000);
    assert.equal(stopped.code, 0);
    const text = worker.logText();
    const leaked = Object.entries({ ...C, stdout: STDOUT, stderr: STDERR, artifact: ARTIFACT, exception: EXC })
      .filter(([k]) => !k.endsWith("Tail"))
      .filter(([, v]) => text.includes(v));
    assert.deepEqual(leaked.map(([k]) => k), [], `canaries found in the worker's log:\n${text}`);
    assert.ok(text.includes("<redacted>"), "the NATS URL is logged with its password redacted");

    // One JSON object per line, nothing else.
    const lines = parseLogLines(text);
    const raw = lines.filter((l) => l.raw !== undefined);
    assert.deepEqual(raw, [], "every log line is JSON");
    for (const l of lines) {
      assert.equal(typeof l.ts, "number");
      assert.equal(typeof l.event, "string");
      assert.equal(l.worker, worker.id);
    }

    const done = (id) => lines.find((l) => l.event === "task.done" && l.task_id === id);
    const d = done(okId);
    assert.ok(d, `a task.done line for ${okId}`);
    assert.equal(d.status, "succeeded");
    assert.equal(d.exit_code, 0);
    assert.equal(d.attempt, 1);
    assert.equal(d.code_bytes, Buffer.byteLength(code));
    assert.equal(d.code_sha256, sha256hex(Buffer.from(code)));
    assert.equal(d.input_files, 2);
    assert.equal(d.input_bytes, inline.length + objectData.length);
    assert.equal(d.stdout_bytes, ok.stdoutTotalBytes);
    assert.equal(d.stderr_bytes, ok.stderrTotalBytes);
    assert.equal(d.artifacts, 1);
    assert.equal(d.artifact_bytes, ok.artifacts[0].size);
    assert.deepEqual([...d.label_keys].sort(), ["run", "team"]);
    assert.ok(d.queue_wait_ms >= 0 && d.queue_wait_ms < 60000, `queue_wait_ms ${d.queue_wait_ms}`);
    assert.ok(d.run_ms >= d.code_ms && d.run_ms < 60000, `run_ms ${d.run_ms} >= code_ms ${d.code_ms}`);
    assert.equal(typeof d.isolation, "string");
    const f = done(failId);
    assert.equal(f.status, "failed");
    assert.equal(f.exit_code, 1);
    assert.ok(f.error_bytes > 0);
    const r = done(refusedId);
    assert.equal(r.status, "failed");
    assert.equal(r.exit_code, undefined, "no exit code for code that never ran");
    const start = lines.find((l) => l.event === "task.start" && l.task_id === okId);
    assert.ok(start && start.attempt === 1 && start.queue_wait_ms >= 0, JSON.stringify(start));

    // The stages of a run (debug level): us since the worker took the
    // message, in the order they happen; -1 for one this run has not (a
    // cgroup, an init). A task that never ran has none.
    const stages = (id) => lines.find((l) => l.event === "task.stages" && l.task_id === id);
    const st = stages(okId);
    assert.ok(st, `a task.stages line for ${okId}`);
    const order = ["checked", "running", "inputs", "cgroup", "acquired", "ready", "go", "started", "end",
                   "collected", "waited", "artifacts", "stored", "event", "acked", "released"];
    for (const k of ["checked", "running", "inputs", "go", "started", "end", "collected", "waited",
                     "artifacts", "stored", "event", "acked", "released"])
      assert.ok(st[`${k}_us`] >= 0, `${k}_us: ${JSON.stringify(st)}`);
    const at = order.map((k) => st[`${k}_us`]).filter((v) => v >= 0);
    assert.deepEqual(at, [...at].sort((a, b) => a - b), `stages in order: ${JSON.stringify(st)}`);
    assert.ok(st.taken_at_us / 1000 <= d.ts && d.ts - st.taken_at_us / 1000 < 60000, `taken_at_us ${st.taken_at_us}, task.done at ${d.ts}`);
    assert.ok(stages(failId), "a run that failed has its stages too");
    assert.equal(stages(refusedId), undefined, "a refused task never ran");
  });
});
