// ci.cancel.<id>: a queued task never runs, a running one is killed within
// about a second, a finished one stays as it was.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startStack } from "./lib/stack.mjs";
import { newTaskId } from "./lib/client.mjs";
import { checkEvents, checkResultBasics, show, waitProcessWith } from "./lib/checks.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

describe("worker cancel", () => {
  let stack;
  before(async () => {
    stack = await startStack({ workers: 1, worker: { concurrency: 1 } });
  });
  after(async () => {
    await stack?.stop();
  });

  test("a task cancelled while queued (no worker running) ends CANCELLED and never runs", async () => {
    const c = stack.client;
    // The first worker created the streams; stop it so the task stays queued.
    const first = stack.workers[0];
    const { code } = await first.stop("SIGTERM", 30000);
    assert.equal(code, 0, "an idle worker exits 0 on SIGTERM");

    const taskId = newTaskId("qcancel");
    await c.submit({ taskId, language: "python", code: "print('this must never run')" });
    const ack = await c.cancel(taskId);
    assert.equal(ack.stream, "CI_CANCEL", "the cancel lands in stream CI_CANCEL");
    await sleep(300);
    assert.equal(await c.getResult(taskId), null, "no worker: no result yet");

    const w = await stack.addWorker({ concurrency: 1 });
    const { result: r, encoding } = await c.waitResult(taskId, 30000);
    assert.equal(encoding, "protobuf");
    checkResultBasics(r, { taskId });
    assert.equal(r.status, "TASK_STATUS_CANCELLED", show(r));
    assert.equal(r.exitCode, undefined, "the code never ran");
    assert.equal(r.stdout, "");
    assert.equal(r.worker, w.id);
    const evs = await c.events(taskId);
    checkEvents(evs, { taskId, result: r, encoding: "protobuf", ran: false, worker: w.id });
    assert.equal(evs[0].headers["Ci-Status"], "cancelled");
  });

  test("a running task is killed within about a second of the cancel, output kept", async () => {
    const c = stack.client;
    const taskId = newTaskId("rcancel");
    // It prints, then waits in a child whose command line carries a marker:
    // once the host sees that child, the line is printed.
    const marker = `ci-itest-rcancel-${process.pid}-${Date.now()}`;
    const code = `import subprocess, sys\nprint('started', flush=True)\nsubprocess.run([sys.executable, '-c', 'import time; time.sleep(30)', '${marker}'])\nprint('finished')`;
    await c.submit({ taskId, language: "python", code, limits: { timeoutMs: 60000 } });
    await c.waitStatus(taskId, "TASK_STATUS_RUNNING", 30000);
    await waitProcessWith(marker, 30000);
    const t0 = Date.now();
    await c.cancel(taskId);
    const { result: r } = await c.waitResult(taskId, 15000);
    const elapsed = Date.now() - t0;
    checkResultBasics(r, { taskId });
    assert.equal(r.status, "TASK_STATUS_CANCELLED", show(r));
    // Contract: killed within 1 s. Bounds with room for a loaded machine,
    // still well under the 30 s the code would sleep without the cancel.
    assert.ok(elapsed < 10000, `CANCELLED ${elapsed} ms after the cancel (contract: killed within 1 s)`);
    assert.ok(r.finishedAtMs - t0 < 10000, `finished_at_ms is ${r.finishedAtMs - t0} ms after the cancel`);
    assert.equal(r.stdout, "started\n", "what the code printed before the cancel is kept");
    assert.ok(r.usage && r.usage.durationMs < 25000, "the code did not sleep its 30 s");
    const evs = await c.events(taskId);
    checkEvents(evs, { taskId, result: r, encoding: "protobuf" });
    assert.equal(evs[1].headers["Ci-Status"], "cancelled");
  });

  test("a task cancelled while queued behind a busy worker never runs", async () => {
    const c = stack.client;
    const busy = newTaskId("busy");
    const queued = newTaskId("queued");
    await c.submit({ taskId: busy, language: "python", code: "import time\ntime.sleep(30)" });
    await c.waitStatus(busy, "TASK_STATUS_RUNNING", 30000);
    await c.submit({ taskId: queued, language: "python", code: "print('must not run')" });
    await c.cancel(queued); // stored in CI_CANCEL once this returns
    await c.cancel(busy);
    const { result: rb } = await c.waitResult(busy, 15000);
    assert.equal(rb.status, "TASK_STATUS_CANCELLED", show(rb));
    const { result: rq } = await c.waitResult(queued, 15000);
    assert.equal(rq.status, "TASK_STATUS_CANCELLED", show(rq));
    assert.equal(rq.exitCode, undefined);
    assert.equal(rq.stdout, "");
    const evs = await c.events(queued);
    checkEvents(evs, { taskId: queued, result: rq, encoding: "protobuf", ran: false });
  });

  test("a finished task stays as it was after a cancel", async () => {
    const c = stack.client;
    const taskId = newTaskId("fcancel");
    await c.submit({ taskId, language: "python", code: "print('done')" });
    const before = await c.waitResult(taskId, 30000);
    assert.equal(before.result.status, "TASK_STATUS_SUCCEEDED", show(before.result));
    // The worker handles cancels in the order they were published (one
    // subscription): once the cancel of a task running after this one has
    // ended it, the worker has handled this cancel too.
    const later = newTaskId("fcancel-later");
    await c.submit({ taskId: later, language: "python", code: "import time\ntime.sleep(30)", limits: { timeoutMs: 60000 } });
    await c.waitStatus(later, "TASK_STATUS_RUNNING", 30000);
    await c.cancel(taskId);
    await c.cancel(later);
    const { result: rl } = await c.waitResult(later, 15000);
    assert.equal(rl.status, "TASK_STATUS_CANCELLED", show(rl));
    const now = await c.getResult(taskId);
    assert.equal(now.result.status, "TASK_STATUS_SUCCEEDED");
    assert.equal(now.revision, before.revision, "the result was not rewritten");
    assert.deepEqual(now.result, before.result);
    const evs = await c.events(taskId);
    checkEvents(evs, { taskId, result: now.result, encoding: "protobuf" });
  });

  test("a cancel for an unknown task harms nobody", async () => {
    const c = stack.client;
    await c.cancel(newTaskId("nobody"));
    const taskId = newTaskId("after");
    await c.submit({ taskId, language: "python", code: "print('ok')" });
    const { result: r } = await c.waitResult(taskId, 30000);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    for (const w of stack.workers.slice(1)) assert.equal(w.exited(), null);
  });
});
