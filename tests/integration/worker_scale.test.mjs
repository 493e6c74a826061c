// Several workers on one NATS: they share the work queue, and a worker told
// to stop finishes what it runs and exits 0.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";

import { startStack } from "./lib/stack.mjs";
import { newTaskId } from "./lib/client.mjs";
import { releaseMarker, show } from "./lib/checks.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Pids of processes whose command line contains marker.
function processesWith(marker) {
  const pids = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d) || Number(d) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${d}/cmdline`).toString().includes(marker)) pids.push(Number(d));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

describe("worker scale", () => {
  let stack;
  const markers = [];
  before(async () => {
    // A short ack wait (the smallest allowed) makes redelivery after a
    // worker's death quick, and makes the in-progress acks that keep a long
    // task alive necessary.
    stack = await startStack({ workers: 2, worker: { concurrency: 1, jetstream: { ack_wait_s: 5 } } });
  });
  after(async () => {
    for (const m of markers) for (const pid of processesWith(m)) try { process.kill(pid, "SIGKILL"); } catch { /* gone */ }
    await stack?.stop();
  });

  test("20 tasks over two workers: all SUCCEEDED, both workers took some, each ran once", async () => {
    const c = stack.client;
    const ids = [];
    for (let i = 0; i < 20; i++) {
      const taskId = newTaskId(`scale${i}`);
      ids.push(taskId);
      // A little work each, so that one worker cannot drain the queue alone.
      await c.submit({ taskId, language: "python", code: `import time\ntime.sleep(0.2)\nprint(${i} * ${i})` });
    }
    const seen = new Map();
    for (let i = 0; i < ids.length; i++) {
      const { result: r } = await c.waitResult(ids[i], 60000);
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(r.stdout, `${i * i}\n`);
      assert.equal(r.attempt, 1, "no task was redelivered");
      seen.set(r.worker, (seen.get(r.worker) ?? 0) + 1);
    }
    const workerIds = stack.workers.map((w) => w.id).sort();
    assert.deepEqual([...seen.keys()].sort(), workerIds, `tasks per worker: ${JSON.stringify([...seen])}`);
    // Exactly one RUNNING per task: no task ran on both workers.
    for (const id of ids.slice(0, 5)) {
      const evs = await c.events(id, { settleMs: 200 });
      assert.deepEqual(evs.map((e) => e.event.status), ["TASK_STATUS_RUNNING", "TASK_STATUS_SUCCEEDED"]);
    }
  });

  test("a task running longer than the ack wait is kept alive: never redelivered", async () => {
    const c = stack.client;
    const taskId = newTaskId("long");
    await c.submit({ taskId, language: "python", code: "import time\ntime.sleep(12)\nprint('long done')" });
    const { result: r } = await c.waitResult(taskId, 40000);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.attempt, 1);
    const evs = await c.events(taskId);
    assert.deepEqual(evs.map((e) => e.event.status), ["TASK_STATUS_RUNNING", "TASK_STATUS_SUCCEEDED"], "one run only, although it ran over twice the 5 s ack wait");
    const ci = await c.jsm.consumers.info("CI_TASKS", "ci-workers");
    assert.equal(ci.num_redelivered, 0, "the server redelivered nothing");
  });

  test("a worker killed (SIGKILL) mid-task: its task's processes die, another worker runs it again (attempt 2)", async () => {
    const c = stack.client;
    const marker = `ci-itest-killed-${process.pid}-${Date.now()}`;
    markers.push(marker);
    const taskId = newTaskId("killed");
    const code = [
      "import subprocess, sys, time",
      // A child with the marker in its command line, to find it from the
      // host; the run ends once that child does (the test kills it, below).
      `p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '${marker}'])`,
      "print('attempt running', flush=True)",
      "p.wait()",
      "print('finished')",
    ].join("\n");
    await c.submit({ taskId, language: "python", code });
    const running = await c.waitStatus(taskId, "TASK_STATUS_RUNNING", 30000);
    const victim = stack.workers.find((w) => w.id === running.result.worker);
    assert.ok(victim, `the RUNNING record names a worker of ours: ${running.result.worker}`);
    // Wait until the child exists, then kill the worker outright.
    const deadline = Date.now() + 10000;
    while (processesWith(marker).length === 0) {
      assert.ok(Date.now() < deadline, "the task's child process never appeared");
      await sleep(50);
    }
    // Those processes, not the redelivery's (same marker, after the 5 s
    // ack wait), must die with their worker.
    const pids = processesWith(marker);
    const alive = () => processesWith(marker).filter((pid) => pids.includes(pid));
    await victim.kill();
    let left = alive();
    for (const until = Date.now() + 15000; left.length && Date.now() < until; ) {
      await sleep(100);
      left = alive();
    }
    // The redelivery first (so that a failure below leaves no task behind):
    // its run ends when its child is killed.
    const releasing = setInterval(() => releaseMarker(marker), 50);
    const { result: r } = await c.waitResult(taskId, 40000).finally(() => clearInterval(releasing));
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.attempt, 2, "JetStream's delivery count");
    assert.notEqual(r.worker, victim.id);
    assert.equal(r.stdout, "attempt running\nfinished\n");
    assert.deepEqual(left, [], "the task's processes die with their worker (they were still there 15 s after its SIGKILL)");
  });

  test("SIGTERM while a task runs: the task finishes SUCCEEDED, the worker takes no new task and exits 0", async () => {
    const c = stack.client;
    const live = stack.workers.filter((w) => !w.exited());
    assert.ok(live.length >= 1);
    const a = live[live.length - 1];
    // Only worker a may take the task.
    for (const b of live.slice(0, -1)) assert.equal((await b.stop("SIGTERM", 30000)).code, 0, "an idle worker exits 0 on SIGTERM");

    const taskId = newTaskId("drain");
    await c.submit({ taskId, language: "python", code: "import time\nprint('start', flush=True)\ntime.sleep(3)\nprint('end')" });
    await c.waitStatus(taskId, "TASK_STATUS_RUNNING", 30000);
    const t0 = Date.now();
    const exitP = a.stop("SIGTERM", 30000);
    await a.waitLog((l) => l.event === "worker.draining", 30000);
    // Submitted once it drains: the draining worker must leave it queued.
    const later = newTaskId("later");
    await c.submit({ taskId: later, language: "python", code: "print('later')" });

    const { code, signal } = await exitP;
    const exitedAt = Date.now();
    assert.equal(signal, null);
    assert.equal(code, 0, `the worker exits 0 after draining; log:\n${a.logText()}`);
    const { result: r } = await c.waitResult(taskId, 5000);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.stdout, "start\nend\n");
    assert.equal(r.worker, a.id);
    assert.ok(r.finishedAtMs > t0, `the task was still running at the SIGTERM (it ended ${r.finishedAtMs - t0} ms after), and the worker waited for it (exit ${exitedAt - t0} ms after)`);
    assert.ok(r.finishedAtMs <= exitedAt + 100, "the result was written before the worker exited");

    assert.equal(await c.getResult(later), null, "the draining worker took no new task");
    const w3 = await stack.addWorker({ concurrency: 1 });
    const { result: rl } = await c.waitResult(later, 30000);
    assert.equal(rl.status, "TASK_STATUS_SUCCEEDED", show(rl));
    assert.equal(rl.worker, w3.id);
    assert.equal(rl.attempt, 1, "it was never delivered to the draining worker");
  });
});
