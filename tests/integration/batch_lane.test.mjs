// Batch jobs and lanes (docs/contract.md §20, §21) against real workers:
// a batch's counts are the message counts of its event subjects, exact and
// with one complete event; interactive tasks go before queued batch tasks;
// batch tasks are not starved by steady interactive load; the subject
// checks; a batch's cancel; and a worker SIGKILLed mid-task (the counts
// stay exact across the redelivery). Every wait is for a condition.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startStack } from "./lib/stack.mjs";
import { newTaskId } from "./lib/client.mjs";
import { show } from "./lib/checks.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const BATCH_STREAM = "CI_BATCH";
const EVENTS_STREAM = "CI_BATCHES";
// Every worker of this file: a killed worker's task comes back after 5 s.
const WORKER = { jetstream: { ack_wait_s: 5 } };
const EVENTS = ["taken", "succeeded", "failed", "timed_out", "cancelled", "sealed", "complete", "cancel"];

describe("batch lane", () => {
  let stack;
  let c;
  before(async () => {
    stack = await startStack({ workers: 1, worker: { ...WORKER, concurrency: 4 } });
    c = stack.client;
  });
  after(async () => {
    await stack?.stop();
  });

  // JetStream-publishes a batch task (JSON) on ci.batch.<batchId>.
  const submitBatch = (batchId, request, opts = {}) =>
    c.submit({ language: "python", ...request, batchId }, { json: true, subject: `ci.batch.${batchId}`, ...opts });

  // The counts of a batch: one stream info with subjects_filter, as the
  // contract says clients count.
  async function counts(batchId) {
    const si = await c.jsm.streams.info(EVENTS_STREAM, { subjects_filter: `ci.batches.${batchId}.*` });
    const out = Object.fromEntries(EVENTS.map((e) => [e, 0]));
    for (const [subject, n] of Object.entries(si.state.subjects ?? {})) {
      const ev = subject.slice(`ci.batches.${batchId}.`.length);
      assert.ok(EVENTS.includes(ev), `unexpected batch subject ${subject}`);
      out[ev] = n;
    }
    return out;
  }
  const ended = (n) => n.succeeded + n.failed + n.timed_out + n.cancelled;

  // Polls fn until pred(value) holds; at most timeoutMs, then throws with
  // the last value.
  async function waitFor(what, fn, pred, timeoutMs = 60000) {
    const deadline = Date.now() + timeoutMs;
    let last;
    for (;;) {
      last = await fn();
      if (pred(last)) return last;
      c.check();
      if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms; last: ${JSON.stringify(last)}`);
      await sleep(100);
    }
  }

  const seal = (batchId, total) =>
    c.js.publish(`ci.batches.${batchId}.sealed`, JSON.stringify({ total: String(total) }), { msgID: `${batchId}.sealed`, timeout: 10000 });

  async function lastEvent(batchId, ev) {
    const m = await c.jsm.streams.getMessage(EVENTS_STREAM, { last_by_subj: `ci.batches.${batchId}.${ev}` });
    return m ? JSON.parse(new TextDecoder().decode(m.data)) : null;
  }

  // Publishes many requests, a window of them at a time.
  async function publishAll(items, publish, window = 100) {
    for (let i = 0; i < items.length; i += window) await Promise.all(items.slice(i, i + window).map(publish));
  }

  const pending = async (stream, consumer) => (await c.jsm.consumers.info(stream, consumer)).num_pending;

  test("a batch of 200 tasks: the counts per subject, taken 200, and one complete event agree with every result", async () => {
    const b = newTaskId("b200");
    const tasks = [];
    for (let i = 1; i <= 200; i++) {
      const taskId = `${b}-${i}`;
      if (i % 25 === 0) tasks.push({ taskId, code: `raise ValueError('task ${i} fails on purpose')`, want: "TASK_STATUS_FAILED" });
      else if (i === 7 || i === 107) tasks.push({ taskId, code: "import time\ntime.sleep(30)", limits: { timeoutMs: 1000 }, want: "TASK_STATUS_TIMED_OUT" });
      else tasks.push({ taskId, code: "print(1)", want: "TASK_STATUS_SUCCEEDED" });
    }
    assert.equal(tasks.filter((t) => t.want === "TASK_STATUS_FAILED").length, 8);
    await publishAll(tasks, async ({ want, ...req }) => {
      const ack = await submitBatch(b, req);
      assert.equal(ack.stream, BATCH_STREAM);
      assert.equal(ack.duplicate, false);
    });
    // Submitting a task again is dropped within the window.
    const again = await submitBatch(b, { taskId: tasks[0].taskId, code: "print(1)" });
    assert.equal(again.duplicate, true);
    await seal(b, 200);

    const n = await waitFor(`batch ${b} complete`, () => counts(b), (x) => x.complete >= 1, 240000);
    assert.deepEqual(
      { taken: n.taken, succeeded: n.succeeded, failed: n.failed, timed_out: n.timed_out, cancelled: n.cancelled, sealed: n.sealed },
      { taken: 200, succeeded: 190, failed: 8, timed_out: 2, cancelled: 0, sealed: 1 },
    );
    const done = await lastEvent(b, "complete");
    assert.deepEqual(done, { batchId: b, total: "200", succeeded: "190", failed: "8", timedOut: "2", cancelled: "0" });

    // Every result agrees, and echoes the batch.
    for (const t of tasks) {
      const r = await c.getResult(t.taskId);
      assert.ok(r, `${t.taskId} has a result`);
      assert.equal(r.result.status, t.want, show(r.result));
      assert.equal(r.result.batchId, b);
      assert.equal(r.raw.batchId, b, "batchId is in the JSON result");
      assert.equal(r.result.attempt, 1);
    }
    // An end event: JSON with the task, its status and its error cut to 256 bytes.
    const failedEnd = await c.jsm.streams.getMessage(EVENTS_STREAM, { last_by_subj: `ci.batches.${b}.failed` });
    const body = JSON.parse(new TextDecoder().decode(failedEnd.data));
    assert.equal(body.status, "TASK_STATUS_FAILED");
    assert.match(body.taskId, new RegExp(`^${b}-\\d+$`));
    assert.ok(body.error && Buffer.byteLength(body.error) <= 256, JSON.stringify(body));
    assert.equal(failedEnd.header.get("Nats-Msg-Id"), `${body.taskId}.end`);
    // Exactly one complete event, also a moment later; the queue is empty.
    await sleep(1000);
    assert.equal((await counts(b)).complete, 1);
    assert.equal(await pending(BATCH_STREAM, "ci-workers-batch"), 0);
  });

  test("a seal that comes after the last task ended still brings one complete event (a worker looks at each seal)", async () => {
    const b = newTaskId("blate");
    for (let i = 1; i <= 2; i++) await submitBatch(b, { taskId: `${b}-${i}`, code: "print(1)" });
    await waitFor(`batch ${b}'s tasks ended`, () => counts(b), (x) => ended(x) === 2);
    assert.equal((await counts(b)).complete, 0, "no complete before the seal");
    await seal(b, 2);
    const n = await waitFor(`batch ${b} complete after a late seal`, () => counts(b), (x) => x.complete >= 1, 30000);
    assert.equal(n.complete, 1);
    assert.deepEqual(await lastEvent(b, "complete"), { batchId: b, total: "2", succeeded: "2", failed: "0", timedOut: "0", cancelled: "0" });
  });

  test("sealed before its tasks, beside a smaller batch: no complete while a task has not ended, then one, after every end event, stored once", async () => {
    // Workers remember a seal's total once read: b1's (12) must never be
    // mistaken for b2's (6), nor b1 counted complete at its first 6.
    const b1 = newTaskId("bearly");
    const b2 = newTaskId("bsmall");
    await seal(b1, 12);
    await seal(b2, 6);
    const first = [];
    for (let i = 1; i <= 6; i++) first.push(submitBatch(b1, { taskId: `${b1}-${i}`, code: "print(1)" }), submitBatch(b2, { taskId: `${b2}-${i}`, code: "print(2)" }));
    await Promise.all(first);
    const n2 = await waitFor(`batch ${b2} complete`, () => counts(b2), (x) => x.complete === 1);
    assert.equal(ended(n2), 6);
    await waitFor(`6 of batch ${b1} ended`, () => counts(b1), (x) => ended(x) === 6);
    await sleep(1000); // a complete published now would be early
    const half = await counts(b1);
    assert.equal(half.complete, 0, `no complete with 6 of 12 ended: ${JSON.stringify(half)}`);
    assert.equal(half.taken, 6);

    for (let i = 7; i <= 12; i++) await submitBatch(b1, { taskId: `${b1}-${i}`, code: "print(1)" });
    const n1 = await waitFor(`batch ${b1} complete`, () => counts(b1), (x) => x.complete >= 1);
    assert.equal(ended(n1), 12);
    assert.deepEqual(await lastEvent(b1, "complete"), { batchId: b1, total: "12", succeeded: "12", failed: "0", timedOut: "0", cancelled: "0" });
    assert.deepEqual(await lastEvent(b2, "complete"), { batchId: b2, total: "6", succeeded: "6", failed: "0", timedOut: "0", cancelled: "0" });
    // After every end event of its batch in the stream.
    for (const b of [b1, b2]) {
      const done = await c.jsm.streams.getMessage(EVENTS_STREAM, { last_by_subj: `ci.batches.${b}.complete` });
      const lastEnd = await c.jsm.streams.getMessage(EVENTS_STREAM, { last_by_subj: `ci.batches.${b}.succeeded` });
      assert.ok(done.seq > lastEnd.seq, `batch ${b}: complete at ${done.seq}, its last end at ${lastEnd.seq}`);
    }
    // Once: one message each, a moment later too, and one publish that
    // stored it (a second one, had there been one, is logged as a duplicate).
    await sleep(1000);
    assert.equal((await counts(b1)).complete, 1);
    assert.equal((await counts(b2)).complete, 1);
    for (const b of [b1, b2]) {
      const stored = stack.workers.flatMap((w) => w.events("batch.complete")).filter((l) => l.batch_id === b);
      assert.equal(stored.length, 1, `batch ${b}: ${JSON.stringify(stored)}`);
    }
  });

  test("tasks of a batch that end together on one worker's slots: every batch completes, once", async () => {
    // Of the slots that end a batch's tasks at the same moment only the one
    // that lets go last counts (contract §20): none may leave it to another.
    const batches = Array.from({ length: 5 }, () => newTaskId("btogether"));
    for (const b of batches) await seal(b, 4);
    const subs = [];
    for (const b of batches) for (let i = 1; i <= 4; i++) subs.push(submitBatch(b, { taskId: `${b}-${i}`, code: "import time\ntime.sleep(0.3)\nprint(1)" }));
    await Promise.all(subs);
    for (const b of batches) {
      const n = await waitFor(`batch ${b} complete`, () => counts(b), (x) => x.complete >= 1);
      assert.equal(ended(n), 4);
      assert.equal(n.complete, 1);
    }
  });

  test("an idle worker with 4 slots looks at the batch lane every 0.75-1.75 s, not once per slot and second, and still takes a batch task within about 1.75 s", async () => {
    // The pull requests themselves: a core subscription on each consumer's
    // next-message subject gets a copy of every one.
    const count = (consumerSubject) => {
      const box = { n: 0 };
      box.sub = c.nc.subscribe(consumerSubject, { callback: () => box.n++ });
      return box;
    };
    await sleep(1500); // the earlier tests' tasks are done: every slot idle
    const batch = count("$JS.API.CONSUMER.MSG.NEXT.CI_BATCH.ci-workers-batch");
    const interactive = count("$JS.API.CONSUMER.MSG.NEXT.CI_TASKS.ci-workers");
    await c.nc.flush();
    const seconds = 6;
    await sleep(seconds * 1000);
    batch.sub.unsubscribe();
    interactive.sub.unsubscribe();
    process.stderr.write(`# idle, ${seconds} s, 4 slots: ${interactive.n} pulls on the interactive lane, ${batch.n} on the batch lane\n`);
    // Each slot long-polls the interactive lane once a second...
    assert.ok(interactive.n >= 3 * seconds, `${interactive.n} interactive pulls in ${seconds} s`);
    // ... and the worker looks at the batch lane about once a second
    // between them (once per slot and second would be 24).
    assert.ok(batch.n >= seconds / 2 && batch.n <= Math.ceil(seconds / 0.75) + 2, `${batch.n} batch pulls in ${seconds} s`);

    const b = newTaskId("bidle");
    const t0 = Date.now();
    await submitBatch(b, { taskId: `${b}-1`, code: "print(1)" });
    await waitFor(`batch ${b}'s task taken`, () => counts(b), (x) => x.taken === 1, 30000);
    const took = Date.now() - t0;
    process.stderr.write(`# an idle worker took a batch task ${took} ms after it was published\n`);
    assert.ok(took < 4000, `the batch task was taken ${took} ms after it was published`);
    await waitFor(`batch ${b}'s task ended`, () => counts(b), (x) => ended(x) === 1);
  });

  test("subject checks: a batch task on ci.submit, and a task on ci.batch.x without batchId, end FAILED saying where to publish", async () => {
    const b = newTaskId("bsubj");
    const t1 = newTaskId("onsubmit");
    await c.submit({ taskId: t1, language: "python", code: "print(1)", batchId: b }, { json: true });
    const { result: r1 } = await c.waitResult(t1, 60000);
    assert.equal(r1.status, "TASK_STATUS_FAILED", show(r1));
    assert.equal(r1.error, `a task of batch '${b}' must be published on 'ci.batch.${b}' (it came on 'ci.submit'), the batch lane, where its batch counts it`);
    assert.equal(r1.batchId, b);
    assert.equal(r1.exitCode, undefined, "it never ran");

    const x = newTaskId("bx");
    const t2 = newTaskId("nobatchid");
    await c.submit({ taskId: t2, language: "python", code: "print(1)" }, { json: true, subject: `ci.batch.${x}` });
    const { result: r2 } = await c.waitResult(t2, 60000);
    assert.equal(r2.status, "TASK_STATUS_FAILED", show(r2));
    assert.equal(r2.error, `the task came on 'ci.batch.${x}', a batch's subject, without batch_id: set batch_id '${x}' or publish on 'ci.submit'`);
    assert.equal(r2.batchId, "");

    // Both count in their batches: taken and failed, so that a batch with
    // such a task still completes.
    const n1 = await waitFor("counts of the wrong-subject task", () => counts(b), (n) => n.failed === 1);
    assert.equal(n1.taken, 1);
    const n2 = await waitFor("counts of the task without batchId", () => counts(x), (n) => n.failed === 1);
    assert.equal(n2.taken, 1);
    // Both at once: refused by validation, under its own words.
    const t3 = newTaskId("both");
    await submitBatch(b, { taskId: t3, code: "print(1)", sessionId: "s1" });
    const { result: r3 } = await c.waitResult(t3, 60000);
    assert.equal(r3.status, "TASK_STATUS_FAILED");
    assert.match(r3.error, /not both/);
  });

  test("a cancel of the batch ends its running task at once and its queued tasks without running, all counted cancelled", async () => {
    const b = newTaskId("bcancel");
    // Seven tasks that would sleep 30 s: four run (4 slots), three wait.
    const ids = Array.from({ length: 7 }, (_, i) => `${b}-${i + 1}`);
    for (const taskId of ids)
      await submitBatch(b, { taskId, code: "import time\nprint('started', flush=True)\ntime.sleep(30)\nprint('finished')", limits: { timeoutMs: 60000 } });
    const running = await waitFor("a task of the batch running", async () => {
      for (const id of ids) {
        const r = await c.getResult(id);
        if (r?.result.status === "TASK_STATUS_RUNNING") return id;
      }
      return null;
    }, (id) => id !== null, 60000);
    await waitFor("4 tasks taken", () => counts(b), (n) => n.taken >= 4);
    const t0 = Date.now();
    const ack = await c.js.publish(`ci.batches.${b}.cancel`, new Uint8Array(0), { timeout: 10000 });
    assert.equal(ack.stream, EVENTS_STREAM);

    const { result: rr } = await c.waitResult(running, 20000);
    const took = Date.now() - t0;
    assert.equal(rr.status, "TASK_STATUS_CANCELLED", show(rr));
    assert.ok(took < 15000, `the running task ended ${took} ms after the cancel, well before its 30 s sleep`);
    assert.equal(rr.error, "the batch was cancelled while this task ran");
    assert.equal(rr.exitCode, 137);
    assert.ok(!rr.stdout.includes("finished"));
    let before = 0;
    for (const id of ids) {
      const { result: r } = await c.waitResult(id, 30000);
      assert.equal(r.status, "TASK_STATUS_CANCELLED", show(r));
      if (r.error === "the batch was cancelled before this task ran") {
        before++;
        assert.equal(r.exitCode, undefined, "it never ran");
      } else {
        assert.equal(r.error, "the batch was cancelled while this task ran");
      }
    }
    assert.ok(before >= 3, `${before} tasks ended without running (three at least were queued)`);
    const n = await waitFor("all 7 counted cancelled", () => counts(b), (x) => x.cancelled === 7);
    assert.equal(n.taken, 7);
    assert.equal(n.cancel, 1);
    assert.equal(ended(n), 7);
  });

  test("interactive before batch: with 1,500 batch tasks queued and both slots on them, an interactive task ends while most are still queued", async () => {
    // 1,500 tiny tasks: publishing them takes a few seconds, and the test
    // ends (purging what is left) as soon as the interactive task is done.
    for (const w of stack.workers) if (!w.exited()) await w.stop("SIGTERM", 90000);
    const b = newTaskId("bmany");
    const N = 1500;
    const ids = Array.from({ length: N }, (_, i) => `${b}-${i + 1}`);
    await publishAll(ids, (taskId) => submitBatch(b, { taskId, code: "print(1)" }), 200);
    assert.equal(await pending(BATCH_STREAM, "ci-workers-batch"), N);
    await stack.addWorker({ concurrency: 2 });
    await waitFor("the worker busy on the batch", () => counts(b), (n) => n.taken >= 10);

    const t = newTaskId("interactive");
    const t0 = Date.now();
    await c.submit({ taskId: t, language: "python", code: "print('me first')" });
    const { result: r } = await c.waitResult(t, 60000);
    const n = await counts(b);
    const queued = N - n.taken;
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    // Timing-independent: had it waited for the batch lane (first come,
    // first served), no batch task would be left queued now.
    assert.ok(queued >= N / 2, `${queued} batch tasks still queued when the interactive task ended (${Date.now() - t0} ms)`);
    process.stderr.write(`# interactive task ended ${Date.now() - t0} ms after submit, ${queued} batch tasks still queued\n`);
    await c.jsm.streams.purge(BATCH_STREAM, { filter: `ci.batch.${b}` });
  });

  test("no starvation: under steady interactive load that keeps the interactive lane non-empty, batch tasks still end", async () => {
    const b = newTaskId("bstarve");
    const interactive = [];
    const submitInteractive = async () => {
      const taskId = newTaskId("load");
      interactive.push(taskId);
      await c.submit({ taskId, language: "python", code: "import time\ntime.sleep(0.2)" });
    };
    // A backlog first, then the batch, then top up to keep 20 queued.
    await publishAll(Array.from({ length: 30 }), submitInteractive);
    for (let i = 1; i <= 10; i++) await submitBatch(b, { taskId: `${b}-${i}`, code: "print(1)" });
    let stop = false;
    const loader = (async () => {
      while (!stop) {
        const p = await pending("CI_TASKS", "ci-workers");
        if (p < 20) await publishAll(Array.from({ length: 20 - p }), submitInteractive);
        await sleep(100);
      }
    })();
    try {
      const n = await waitFor("3 batch tasks ended under interactive load", () => counts(b), (x) => ended(x) >= 3, 90000);
      const p = await pending("CI_TASKS", "ci-workers");
      assert.ok(p > 0, `the interactive lane still had ${p} queued when ${ended(n)} batch tasks had ended`);
      assert.equal(n.succeeded, ended(n));
    } finally {
      stop = true;
      await loader;
    }
    await c.jsm.streams.purge("CI_TASKS");
    await waitFor("the rest of the batch", () => counts(b), (x) => ended(x) === 10, 60000);
  });

  test("a worker SIGKILLed while it runs a batch task: the task is redelivered and the counts stay exact", async () => {
    for (const w of stack.workers) if (!w.exited()) await w.stop("SIGTERM", 90000);
    const w1 = await stack.addWorker({ concurrency: 1 });
    const b = newTaskId("bkill");
    const ids = [`${b}-1`, `${b}-2`, `${b}-3`];
    await submitBatch(b, { taskId: ids[0], code: "import time\ntime.sleep(4)\nprint('slow')", limits: { timeoutMs: 30000 } });
    await c.waitStatus(ids[0], "TASK_STATUS_RUNNING", 60000);
    for (const taskId of ids.slice(1)) await submitBatch(b, { taskId, code: "print(2)" });
    await waitFor("the first task taken", () => counts(b), (n) => n.taken === 1);
    await w1.kill();
    await seal(b, 3);
    const w2 = await stack.addWorker({ concurrency: 2 });
    const n = await waitFor(`batch ${b} complete`, () => counts(b), (x) => x.complete === 1, 120000);
    assert.deepEqual({ taken: n.taken, succeeded: n.succeeded, failed: n.failed, timed_out: n.timed_out, cancelled: n.cancelled }, { taken: 3, succeeded: 3, failed: 0, timed_out: 0, cancelled: 0 });
    const { result: r } = await c.waitResult(ids[0], 10000);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.attempt, 2, "run again after the kill");
    assert.equal(r.worker, w2.id);
    assert.equal(r.stdout, "slow\n");
    assert.deepEqual(await lastEvent(b, "complete"), { batchId: b, total: "3", succeeded: "3", failed: "0", timedOut: "0", cancelled: "0" });
  });

  test("a task ends while its worker's other slot holds one of the same batch, then that worker is SIGKILLed: the redelivered task counts, the batch completes", async () => {
    for (const w of stack.workers) if (!w.exited()) await w.stop("SIGTERM", 90000);
    const w1 = await stack.addWorker({ concurrency: 2 });
    const b = newTaskId("bheld");
    await seal(b, 2);
    const slow = `${b}-1`;
    await submitBatch(b, { taskId: slow, code: "import time\ntime.sleep(6)\nprint('slow')", limits: { timeoutMs: 30000 } });
    await c.waitStatus(slow, "TASK_STATUS_RUNNING", 60000);
    await submitBatch(b, { taskId: `${b}-2`, code: "print(2)" });
    // The quick one ends while the slow one is held: it leaves the count
    // to the slow one's end, which never comes on this worker.
    await waitFor("the quick task ended", () => counts(b), (n) => ended(n) === 1);
    await w1.kill();
    assert.equal((await counts(b)).complete, 0);
    await stack.addWorker({ concurrency: 2 });
    const n = await waitFor(`batch ${b} complete`, () => counts(b), (x) => x.complete === 1, 120000);
    assert.equal(n.succeeded, 2);
    assert.deepEqual(await lastEvent(b, "complete"), { batchId: b, total: "2", succeeded: "2", failed: "0", timedOut: "0", cancelled: "0" });
  });
});
