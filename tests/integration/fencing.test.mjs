// A stale worker never overwrites a newer attempt: worker w1 runs a task,
// is SIGSTOPped past the ack wait, the task is redelivered to w2; whether w1
// comes back after w2 finished or while w2 still runs, the stored result and
// the one terminal event are the newer attempt's, and w1 says it was
// superseded (task.superseded, ci_task_deliveries_total{outcome="superseded"}).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startStack } from "./lib/stack.mjs";
import { newTaskId } from "./lib/client.mjs";
import { checkResultBasics, show } from "./lib/checks.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const ACK_WAIT_S = 5;

describe("fencing: a superseded attempt never overwrites a newer one", () => {
  let stack;
  let w1;
  before(async () => {
    stack = await startStack({ workers: 0, worker: { worker: { concurrency: 1 }, jetstream: { ack_wait_s: ACK_WAIT_S } } });
    w1 = await stack.addWorker();
  });
  after(async () => {
    if (w1 && !w1.exited()) w1.signal("SIGCONT");
    await stack?.stop();
  });

  // Polls the KV record until pred holds; returns it.
  async function waitRecord(taskId, pred, what, timeoutMs = 120000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const got = await stack.client.getResult(taskId).catch(() => null);
      if (got && pred(got.result)) return got.result;
      if (Date.now() > deadline) throw new Error(`task ${taskId}: ${what} not seen within ${timeoutMs} ms (last: ${got ? show(got.result) : "none"})`);
      await sleep(100);
    }
  }

  // The result in KV and the terminal event agree, and both are attempt 2's on w2.
  async function checkNewerWon(taskId, w2) {
    const r = await waitRecord(taskId, (x) => x.status === "TASK_STATUS_SUCCEEDED", "the terminal result");
    checkResultBasics(r, { taskId });
    assert.equal(r.attempt, 2, `the stored result is the newer attempt's: ${show(r)}`);
    assert.equal(r.worker, w2.id);
    const evs = await stack.client.events(taskId, { settleMs: 2000 });
    const terminal = evs.filter((e) => e.event.status !== "TASK_STATUS_RUNNING");
    assert.equal(terminal.length, 1, `one terminal event: ${evs.map((e) => `${e.event.status}@${e.event.worker}`)}`);
    assert.equal(terminal[0].event.worker, w2.id, "the terminal event is the newer attempt's");
    assert.equal(terminal[0].event.status, r.status);
    // The record did not change after the event: the stale attempt wrote nothing.
    const again = (await stack.client.getResult(taskId)).result;
    assert.equal(again.attempt, 2);
    assert.equal(again.stdout, r.stdout);
    return r;
  }

  async function superseded(w, taskId) {
    const line = await w.waitLog((l) => l.event === "task.superseded" && l.task_id === taskId, 120000);
    assert.equal(line.level, "warn");
    assert.equal(line.attempt, 1);
    // Counted once the slot is back from the task, just after the log line.
    const counted = /^ci_task_deliveries_total\{outcome="superseded"\} [1-9]/m;
    let m = "";
    for (const deadline = Date.now() + 30000; !counted.test(m); ) {
      assert.ok(Date.now() < deadline, `superseded counted in /metrics:\n${m}`);
      m = await (await fetch(`${w.monitorUrl}/metrics`)).text();
      if (!counted.test(m)) await sleep(100);
    }
  }

  for (const late of [false, true]) {
    test(late ? "w1 comes back after w2 stored its result: w1's result is dropped" : "w1 comes back while w2 still runs the task: w1's result is dropped, w2's stands", async () => {
      const taskId = newTaskId(late ? "fence-late" : "fence-mid");
      // Each attempt prints its own token; attempt 2 runs long enough in the
      // second case for w1 to come back meanwhile.
      const code = `import time, uuid\nprint(uuid.uuid4(), flush=True)\ntime.sleep(${late ? 2 : 12})`;
      await stack.client.submit({ taskId, language: "python", code, limits: { timeoutMs: 60000 } });
      await waitRecord(taskId, (x) => x.status === "TASK_STATUS_RUNNING" && x.attempt === 1 && x.worker === w1.id, "attempt 1 RUNNING on w1");
      assert.ok(w1.signal("SIGSTOP"));
      const w2 = await stack.addWorker();
      try {
        await waitRecord(taskId, (x) => x.status === "TASK_STATUS_RUNNING" && x.attempt === 2 && x.worker === w2.id, "attempt 2 RUNNING on w2");
        if (late) await waitRecord(taskId, (x) => x.status === "TASK_STATUS_SUCCEEDED", "attempt 2's result");
        assert.ok(w1.signal("SIGCONT"));
        await superseded(w1, taskId);
        await checkNewerWon(taskId, w2);
      } finally {
        w1.signal("SIGCONT");
        await w2.stop("SIGTERM", 60000);
      }
    });
  }
});
