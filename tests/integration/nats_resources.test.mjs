// Streams and buckets that an operator deletes while workers run come back:
// the worker finds one gone, creates it again with its configured settings
// (worker.nats_recreated), and the task in hand still ends with its result
// and its one terminal event. Before, deleting CI_STATUS burnt every task's
// deliveries ("started 5 times and never finished") and deleting the results
// bucket left tasks with no result at all.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startStack } from "./lib/stack.mjs";
import { newTaskId, runTask } from "./lib/client.mjs";
import { show } from "./lib/checks.mjs";

// Runs n tasks at once; each must succeed on its first attempt with one
// terminal event that matches it. The events of the tasks are read at the
// same time: each read waits 1 s past the terminal event for another one.
async function tasksEndWell(c, n, label) {
  const ids = [];
  for (let i = 0; i < n; i++) {
    const taskId = newTaskId(label);
    ids.push(taskId);
    await c.submit({ taskId, language: "python", code: `print(${i})` });
  }
  const results = [];
  for (let i = 0; i < n; i++) {
    const { result: r } = await c.waitResult(ids[i], 60000);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.stdout, `${i}\n`);
    assert.equal(r.attempt, 1, "not an infrastructure failure retried");
    results.push(r);
  }
  const events = await Promise.all(ids.map((id) => c.events(id)));
  for (let i = 0; i < n; i++) {
    const terminal = events[i].filter((e) => e.event.status !== "TASK_STATUS_RUNNING");
    assert.equal(terminal.length, 1);
    assert.equal(terminal[0].event.status, results[i].status);
  }
}

// Two blocks at a time, each on its own server and workers (their own tests
// one after the other): much of a block's time is waiting (a worker
// starting, a stream made again, a check round), which the other can use.
describe("nats_resources: each block on its own server", { concurrency: 2 }, () => {
  // A write that fails tells the worker at once that what it writes to is
  // gone: these tests delete streams and buckets that a worker writes to. Its
  // look for its streams now and then (jetstream.check_s) is put off here, so
  // that it cannot make one again before the write that must find it gone.
  describe("deleted streams and buckets come back", { concurrency: 1 }, () => {
    let stack;
    let worker;
    before(async () => {
      stack = await startStack({ workers: 1, worker: { worker: { concurrency: 2 }, jetstream: { check_s: 3600 } } });
      worker = stack.workers[0];
    });
    after(async () => {
      await stack?.stop();
    });

    test("CI_STATUS deleted: it is created again and every task ends with its event", async () => {
      await stack.client.jsm.streams.delete("CI_STATUS");
      await tasksEndWell(stack.client, 4, "nostatus");
      const si = await stack.client.jsm.streams.info("CI_STATUS");
      assert.deepEqual(si.config.subjects, ["ci.status.>"]);
      assert.equal(si.config.max_age, 3600 * 1e9, "with the configured settings");
      await worker.waitLog((l) => l.event === "worker.nats_recreated");
    });

    test("the results bucket deleted: it is created again and every task has its result", async () => {
      await stack.client.jsm.streams.delete("KV_ci-results");
      await tasksEndWell(stack.client, 4, "nokv");
      const si = await stack.client.jsm.streams.info("KV_ci-results");
      assert.equal(si.config.max_msgs_per_subject, 1);
    });

    test("the files bucket deleted: artifacts are stored again; an input that was in it is reported missing", async () => {
      const c = stack.client;
      // An input object, then the bucket goes.
      const inputObj = `inputs/${newTaskId("in")}/d.csv`;
      await c.putObject(inputObj, Buffer.from("a\n1\n"));
      await c.jsm.streams.delete("OBJ_ci-files");
      const { result: r, taskId } = await runTask(c, { code: "open('out.csv', 'w').write('x,y\\n1,2\\n')" });
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(r.attempt, 1);
      assert.equal(r.artifacts.length, 1);
      const bytes = await c.getObject(`${taskId}/out.csv`);
      assert.equal(Buffer.from(bytes).toString(), "x,y\n1,2\n");
      const { result: m } = await runTask(c, { code: "print(open('d.csv').read())", files: [{ name: "d.csv", object: inputObj }] });
      assert.equal(m.status, "TASK_STATUS_FAILED", show(m));
      assert.match(m.error, /not in bucket 'ci-files'|not found/);
      assert.equal(m.attempt, 1, "a missing input is the request's problem, said at once");
    });
  });

  // What no write tells (idle fetches only time out on a deleted CI_TASKS;
  // chunks are core publishes): the worker looks for its streams every
  // jetstream.check_s, 1 s here rather than 15 s. A cold worker: these few
  // print tasks do not need the warm runtime, whose start (a zygote's
  // imports) takes longer than they do.
  describe("deleted streams a worker only looks for come back", { concurrency: 1 }, () => {
    let stack;
    before(async () => {
      stack = await startStack({ workers: 1, worker: { worker: { concurrency: 2 }, jetstream: { check_s: 1 }, local: { mode: "cold" } } });
    });
    after(async () => {
      await stack?.stop();
    });

    test("CI_TASKS deleted with its consumer: the worker makes both again, and takes tasks again", async () => {
      const c = stack.client;
      await c.jsm.streams.delete("CI_TASKS");
      // Idle fetches only time out: the worker looks for its streams now and then.
      for (const deadline = Date.now() + 60000; ; ) {
        const si = await c.jsm.streams.info("CI_TASKS").catch(() => null);
        if (si) {
          assert.equal(si.config.retention, "workqueue");
          assert.deepEqual(si.config.subjects, ["ci.submit", "ci.submit.*"], "sessions' subjects too");
          assert.equal(si.config.allow_direct, true);
          break;
        }
        assert.ok(Date.now() < deadline, "CI_TASKS made again within 60 s");
        await new Promise((r) => setTimeout(r, 200));
      }
      await c.jsm.consumers.info("CI_TASKS", "ci-workers");
      await tasksEndWell(c, 3, "notasks");
    });

    test("CI_OUTPUT deleted: tasks end as always, the worker makes it again, and later tasks stream into it", async () => {
      const c = stack.client;
      await c.jsm.streams.delete("CI_OUTPUT");
      // Chunks are core publishes: none fails, none is kept meanwhile.
      const { result: r0 } = await runTask(c, { code: "print('meanwhile')" });
      assert.equal(r0.status, "TASK_STATUS_SUCCEEDED", show(r0));
      assert.equal(r0.stdout, "meanwhile\n");
      for (const deadline = Date.now() + 60000; ; ) {
        const si = await c.jsm.streams.info("CI_OUTPUT").catch(() => null);
        if (si) {
          assert.deepEqual(si.config.subjects, ["ci.out.>"]);
          assert.equal(si.config.max_bytes, 1024 * 1024 * 1024, "with the configured settings");
          assert.equal(si.config.discard, "old");
          assert.equal(si.config.max_age, 3600 * 1e9);
          break;
        }
        assert.ok(Date.now() < deadline, "CI_OUTPUT made again within 60 s");
        await new Promise((r) => setTimeout(r, 200));
      }
      const { result: r, taskId } = await runTask(c, { code: "print('again')" });
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      const chunks = await c.outputChunks(taskId, { stdout: 6, stderr: 0 });
      assert.equal(Buffer.concat(chunks.map((x) => x.data)).toString(), "again\n");
    });
  });

  // The files bucket full (jetstream.files_max_mb below the server's store, as
  // the config advises): before, such a task was retried five times and stayed
  // RUNNING until its record expired.
  describe("a full files bucket: a terminal result all the same", { concurrency: 1 }, () => {
    let stack;
    before(async () => {
      stack = await startStack({ workers: 1, worker: { jetstream: { files_max_mb: 8 } }, jetstreamConfig: "max_file_store: 64MB" });
    });
    after(async () => {
      await stack?.stop();
    });

    test("artifacts the store cannot take: FAILED at once, saying what was not kept and why; the next task runs", async () => {
      const code = "import os\nopen('big.csv', 'wb').write(b'a,b\\n' + os.urandom(16 << 20).hex().encode()[: 16 << 20] + b'\\n')\nprint('made')";
      const { result: r, taskId } = await runTask(stack.client, { code }, { timeoutMs: 120000 });
      assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
      assert.equal(r.attempt, 1, "not retried: the store stays full");
      assert.match(r.error, /the object store is full: 1 artifact of 16\.0 MiB not kept/);
      assert.match(r.error, /JetStream store is full|insufficient/);
      assert.equal(r.stdout, "made\n");
      assert.equal(r.artifacts.length, 0);
      const evs = await stack.client.events(taskId);
      assert.equal(evs.filter((e) => e.event.status === "TASK_STATUS_FAILED").length, 1, "and its terminal event");
      const { result: next } = await runTask(stack.client, { code: "print('next')" });
      assert.equal(next.status, "TASK_STATUS_SUCCEEDED", show(next));
    });
  });

  // The server's own JetStream store full, with no bucket limit below it (the
  // shipped config): before, the task whose artifacts filled it stayed
  // RUNNING, retried five times, while the room of its failed upload stayed
  // counted as used. A failed upload, or a result that does not fit, now
  // gives the room of what this attempt stored back (by sequence): every
  // task ends, FAILED saying what was not kept.
  describe("the server's store full: every task still ends", { concurrency: 1 }, () => {
    let stack;
    before(async () => {
      stack = await startStack({ workers: 1, jetstreamConfig: "max_file_store: 64MB" });
    });
    after(async () => {
      await stack?.stop();
    });

    test("tasks of 16 MiB of artifacts each, past the store's size: each ends, none is left RUNNING", async () => {
      const code = "import os\nopen('big.csv', 'wb').write(b'a,b\\n' + os.urandom(8 << 20).hex().encode()[: 16 << 20] + b'\\n')\nprint('made')";
      const ends = [];
      for (let i = 0; i < 6; i++) {
        const { result: r } = await runTask(stack.client, { code }, { timeoutMs: 120000 });
        ends.push(r.status);
        if (r.status === "TASK_STATUS_FAILED") {
          assert.equal(r.attempt, 1, "not retried: the store stays full");
          assert.match(r.error, /full/, show(r));
          assert.equal(r.stdout, "made\n");
          const evs = await stack.client.events(r.taskId);
          assert.equal(evs.filter((e) => e.event.status === "TASK_STATUS_FAILED").length, 1, "and its terminal event");
        } else {
          assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
        }
      }
      assert.ok(ends.includes("TASK_STATUS_FAILED"), `the store never filled: ${ends}`);
      const { result: next } = await runTask(stack.client, { code: "print('next')" });
      assert.equal(next.status, "TASK_STATUS_SUCCEEDED", show(next));
    });
  });
});
