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

describe("deleted streams and buckets come back", () => {
  let stack;
  let worker;
  before(async () => {
    stack = await startStack({ workers: 1, worker: { worker: { concurrency: 2 } } });
    worker = stack.workers[0];
  });
  after(async () => {
    await stack?.stop();
  });

  // Runs n tasks at once; each must succeed on its first attempt with one
  // terminal event that matches it.
  async function tasksEndWell(n, label) {
    const c = stack.client;
    const ids = [];
    for (let i = 0; i < n; i++) {
      const taskId = newTaskId(label);
      ids.push(taskId);
      await c.submit({ taskId, language: "python", code: `print(${i})` });
    }
    for (let i = 0; i < n; i++) {
      const { result: r } = await c.waitResult(ids[i], 60000);
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(r.stdout, `${i}\n`);
      assert.equal(r.attempt, 1, "not an infrastructure failure retried");
      const evs = await c.events(ids[i]);
      const terminal = evs.filter((e) => e.event.status !== "TASK_STATUS_RUNNING");
      assert.equal(terminal.length, 1);
      assert.equal(terminal[0].event.status, r.status);
    }
  }

  test("CI_STATUS deleted: it is created again and every task ends with its event", async () => {
    await stack.client.jsm.streams.delete("CI_STATUS");
    await tasksEndWell(4, "nostatus");
    const si = await stack.client.jsm.streams.info("CI_STATUS");
    assert.deepEqual(si.config.subjects, ["ci.status.>"]);
    assert.equal(si.config.max_age, 3600 * 1e9, "with the configured settings");
    await worker.waitLog((l) => l.event === "worker.nats_recreated");
  });

  test("the results bucket deleted: it is created again and every task has its result", async () => {
    await stack.client.jsm.streams.delete("KV_ci-results");
    await tasksEndWell(4, "nokv");
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
