// Poison messages: a task that can never succeed ends FAILED with a clear
// error and never blocks the queue.
//   - code that always fails: FAILED on its first delivery, never retried;
//   - a task whose every run takes its worker down (as one that makes the
//     pod run out of memory would): after max_deliver deliveries it ends
//     FAILED without running again;
//   - a task that crashes nothing but fails on infrastructure every time
//     (here: the worker's NATS user may not read the files bucket, and the
//     task has an input object): retried, then FAILED after max_deliver.
// Meanwhile other tasks go through.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startStack, SERVER_CONFIG } from "./lib/stack.mjs";
import { startNatsServer } from "./lib/nats-server.mjs";
import { startWorker } from "./lib/worker.mjs";
import { connectClient, decodeMessage, newTaskId, proto, TERMINAL } from "./lib/client.mjs";
import { show } from "./lib/checks.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function submitMany(c, n, prefix) {
  const ids = [];
  for (let i = 0; i < n; i++) {
    const id = newTaskId(`${prefix}${i}`);
    ids.push(id);
    await c.submit({ taskId: id, language: "python", code: `print(${i})` });
  }
  return ids;
}

async function expectAllSucceeded(c, ids, timeoutMs = 60000) {
  for (let i = 0; i < ids.length; i++) {
    const { result } = await c.waitResult(ids[i], timeoutMs);
    assert.equal(result.status, "TASK_STATUS_SUCCEEDED", show(result));
    assert.equal(result.stdout, `${i}\n`);
  }
}

// The consumer once every delivery is acked or termed: a worker acks just
// after it stores the result, so a test that saw the result waits for it.
async function settledConsumer(c, timeoutMs = 30000) {
  let ci = await c.jsm.consumers.info("CI_TASKS", "ci-workers");
  for (const deadline = Date.now() + timeoutMs; (ci.num_ack_pending > 0 || ci.num_pending > 0) && Date.now() < deadline; ) {
    await sleep(100);
    ci = await c.jsm.consumers.info("CI_TASKS", "ci-workers");
  }
  return ci;
}

// Every record stored for the task, seen through a KV watch from the moment
// it is called (a record may stand for a moment only, e.g. between two
// attempts); done resolves at the first terminal record.
async function watchRecords(c, taskId) {
  const b = await c.kvBucket();
  const w = await b.watch({ key: taskId });
  const seen = [];
  const done = (async () => {
    for await (const e of w) {
      if (e.operation !== "PUT" || e.value.length === 0) continue;
      const r = decodeMessage(proto().ExecutionResult, e.value).value;
      seen.push(r);
      if (TERMINAL.has(r.status)) break;
    }
  })();
  return { seen, done, stop: () => w.stop() };
}

// The two scenarios run at the same time, each on its own server and
// workers: the second spends most of its time waiting for NATS requests to
// time out (its tasks' reads, 20 s a delivery), which is time the first's
// tasks and worker kills can use.
describe("poison", { concurrency: true }, () => {
  describe("poison messages", { concurrency: 1 }, () => {
    let stack;
    before(async () => {
      stack = await startStack({ workers: 2, worker: { concurrency: 1, jetstream: { ack_wait_s: 5, max_deliver: 3 } } });
    });
    after(async () => {
      await stack?.stop();
    });

    test("code that always fails ends FAILED on its first delivery and is never retried", async () => {
      const c = stack.client;
      const before = await c.jsm.consumers.info("CI_TASKS", "ci-workers");
      const poison = newTaskId("poison-code");
      await c.submit({ taskId: poison, language: "python", code: "import os\nos._exit(7)" });
      const others = await submitMany(c, 8, "after-code");
      const { result } = await c.waitResult(poison, 30000);
      assert.equal(result.status, "TASK_STATUS_FAILED", show(result));
      assert.equal(result.attempt, 1);
      assert.equal(result.exitCode, 7);
      assert.match(result.error, /exited with code 7/);
      await expectAllSucceeded(c, others);
      // A worker acks just after it stores the result: wait for the acks.
      let after = await c.jsm.consumers.info("CI_TASKS", "ci-workers");
      for (const deadline = Date.now() + 30000; after.num_ack_pending > 0 && Date.now() < deadline; ) {
        await new Promise((r) => setTimeout(r, 100));
        after = await c.jsm.consumers.info("CI_TASKS", "ci-workers");
      }
      assert.equal(after.num_redelivered, before.num_redelivered, "nothing was redelivered");
      assert.equal(after.num_ack_pending, 0);
    });

    test("a task that takes its worker down every time ends FAILED after max_deliver (3), and the queue flows", async () => {
      const c = stack.client;
      const poison = newTaskId("poison-killer");
      await c.submit({ taskId: poison, language: "python", code: "import time\ntime.sleep(60)" });
      const kills = [];
      const flow = [];
      const deadline = Date.now() + 90000;
      for (;;) {
        assert.ok(Date.now() < deadline, `no end for the poison task; kills: ${JSON.stringify(kills)}`);
        const r = await c.getResult(poison);
        if (r && TERMINAL.has(r.result.status)) break;
        if (r && r.result.status === "TASK_STATUS_RUNNING" && !kills.some((k) => k.attempt === r.result.attempt)) {
          // The task "crashes" whichever worker runs it: kill that worker,
          // start a fresh one, and keep other tasks coming.
          const victim = stack.workers.find((w) => w.id === r.result.worker && !w.exited());
          assert.ok(victim, `the worker running it is one of ours: ${r.result.worker}`);
          await victim.kill();
          kills.push({ attempt: r.result.attempt, worker: victim.id });
          await stack.addWorker();
          flow.push(...(await submitMany(c, 4, `flow${kills.length}-`)));
        }
        await sleep(50);
      }
      const { result } = await c.waitResult(poison, 1000);
      assert.deepEqual(kills.map((k) => k.attempt), [1, 2], "its first two deliveries each took a worker down");
      assert.equal(result.status, "TASK_STATUS_FAILED", show(result));
      assert.equal(result.attempt, 3, "the third and last delivery ended it");
      assert.match(result.error, /started 2 times and never finished/);
      assert.equal(result.exitCode, undefined, "it did not run a third time");
      const evs = await c.events(poison);
      assert.deepEqual(evs.map((e) => e.event.status), ["TASK_STATUS_RUNNING", "TASK_STATUS_RUNNING", "TASK_STATUS_FAILED"]);
      // Tasks submitted while it was being retried were not held up by it.
      for (let k = 0; k < flow.length; k += 4) await expectAllSucceeded(c, flow.slice(k, k + 4));
      const ci = await settledConsumer(c);
      assert.equal(ci.num_ack_pending, 0);
      assert.equal(ci.num_pending, 0);
    });
  });

  describe("a poison that crashes nothing but always fails", { concurrency: 1 }, () => {
    let server, worker, client;
    before(async () => {
      // The worker's user may not read objects of ci-files (direct gets on
      // OBJ_ci-files): a task with an input object fails every time on
      // infrastructure, never on its code.
      server = await startNatsServer({
        config: `${SERVER_CONFIG}
  authorization { users: [
    {user: ciworker, password: "w0rker", permissions: {
       publish: { allow: [">"], deny: ["$JS.API.DIRECT.GET.OBJ_ci-files", "$JS.API.DIRECT.GET.OBJ_ci-files.>"] },
       subscribe: { allow: [">"] } }},
    {user: anon, password: "anon-unused"} ] }
  no_auth_user: anon`,
      });
      const port = new URL(server.url).port;
      worker = await startWorker({
        natsUrl: `nats://ciworker:w0rker@127.0.0.1:${port}`,
        concurrency: 2,
        jetstream: { max_deliver: 2, ack_wait_s: 5 },
        // Cold: what it checks is before the code (the inputs), and a warm
        // start's zygote imports would take CPU from the scenario beside it.
        local: { mode: "cold" },
      });
      client = await connectClient(server.url);
    });
    after(async () => {
      await client?.close();
      if (worker && !worker.exited()) {
        const x = await worker.stop("SIGTERM", 60000).catch((e) => ({ code: e.message }));
        if (x.code !== 0) process.exitCode = 1;
      }
      await worker?.cleanup();
      await server?.stop();
    });

    test("it is retried, ends FAILED after max_deliver (2) with the reason, and other tasks go through", async () => {
      const c = client;
      const obj = `inputs/poison/${newTaskId("o")}.csv`;
      await c.putObject(obj, Buffer.from("a\n1\n"));
      const poison = newTaskId("poison-infra");
      const t0 = Date.now();
      // Watched from before the submit: the RUNNING record of the retry
      // stands for about 2 s only (the nak's delay), maybe while the other
      // tasks are still being waited for.
      const records = await watchRecords(c, poison);
      await c.submit({ taskId: poison, language: "python", code: "print(open('d.csv').read())", files: [{ name: "d.csv", object: obj }] });
      const others = await submitMany(c, 6, "beside-infra");
      await expectAllSucceeded(c, others, 30000);
      const { result } = await c.waitResult(poison, 90000);
      assert.equal(result.status, "TASK_STATUS_FAILED", show(result));
      assert.equal(result.attempt, 2);
      assert.match(result.error, /^the worker could not read the inputs after 2 attempts: /);
      assert.match(result.error, /ci-files/);
      assert.equal(result.exitCode, undefined);
      // Between the tries a client saw why it is being retried.
      let timer;
      const watched = await Promise.race([records.done.then(() => true), new Promise((r) => (timer = setTimeout(() => r(false), 30000)))]);
      clearTimeout(timer);
      records.stop();
      assert.ok(watched, `the watch saw the terminal record; seen: ${records.seen.map((r) => r.status).join(", ")}`);
      const note = records.seen.find((r) => r.status === "TASK_STATUS_RUNNING" && r.error);
      assert.ok(note, `the RUNNING record says why attempt 1 gave up; seen: ${JSON.stringify(records.seen.map((r) => [r.status, r.attempt, r.error]))}`);
      assert.match(note.error, /^attempt 1: the worker could not read the inputs \(.*ci-files.*\); it will be tried again$/);
      const retries = worker.events("task.infra_error").filter((l) => l.task_id === poison);
      assert.equal(retries.length, 2, "one infrastructure failure per delivery, both logged");
      // task.done is logged after the result is stored and the message termed.
      await worker.waitLog((l) => l.event === "task.done" && l.task_id === poison, 30000);
      const done = worker.events("task.done").filter((l) => l.task_id === poison);
      assert.equal(done.length, 1);
      assert.equal(done[0].attempt, 2);
      const ci = await settledConsumer(c);
      assert.equal(ci.num_ack_pending, 0);
      assert.equal(ci.num_pending, 0);
      console.log(`# infra poison ended after ${Date.now() - t0} ms`);
    });
  });
});
