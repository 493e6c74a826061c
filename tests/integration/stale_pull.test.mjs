// No task runs twice because of a stale pull request. nats.c 3.4.1 gives
// every Fetch of a slot the same reply inbox, and a pull request can still be
// open on the server after its Fetch returned (a late 408 ends the next Fetch
// early, the slot sends another): a message then reaches the slot's queue
// while the slot runs a task, its ack timer running. If the slot stays busy
// past the ack wait, the server redelivers it to another worker, and the slot
// must not run its stale copy as well. On its last attempt (no redelivery
// will come) the stale copy is the only one: it must run.
//
// The race is made deterministic: the test itself sends a pull request with
// worker A's inbox as reply subject (found in the server's /connz) while A's
// only slot is busy, so the next task lands in A's queue.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startNatsServer } from "./lib/nats-server.mjs";
import { startWorker } from "./lib/worker.mjs";
import { connectClient, newTaskId, runTask, TERMINAL } from "./lib/client.mjs";
import { headers as natsHeaders } from "@nats-io/transport-node";
import { blockUntilReleased, releaseMarker, show, waitProcessWith } from "./lib/checks.mjs";
import { SERVER_CONFIG } from "./lib/stack.mjs";

const STREAM = "CI_TASKS";
const CONSUMER = "ci-workers";
const ACK_WAIT_S = 5; // the least config.c allows
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function waitFor(what, fn, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`not within ${timeoutMs} ms: ${what}`);
    await sleep(50);
  }
}

// The inbox of the worker's pull subscription: with nats.c 3.4.1 a plain
// _INBOX.<nuid> (every Fetch uses it as reply subject); the request/reply
// inbox is _INBOX.<nuid>.* and the cancel subscription is on ci.cancel.>.
async function pullInbox(monitorUrl, connName) {
  const res = await fetch(`${monitorUrl}/connz?subs=1`);
  const connz = await res.json();
  const conns = connz.connections.filter((c) => c.name === connName);
  assert.equal(conns.length, 1, `one connection named ${connName}: ${JSON.stringify(connz.connections.map((c) => c.name))}`);
  const inboxes = (conns[0].subscriptions_list ?? []).filter((s) => /^_INBOX\.[^.*>]+$/.test(s));
  assert.equal(inboxes.length, 1, `one pull inbox among ${JSON.stringify(conns[0].subscriptions_list)}`);
  return inboxes[0];
}

// A pull request on behalf of the worker, as a Fetch of its whose client
// side gave up would leave it on the server.
async function stalePullRequest(client, inbox, expiresMs = 60000) {
  client.nc.publish(`$JS.API.CONSUMER.MSG.NEXT.${STREAM}.${CONSUMER}`, JSON.stringify({ batch: 1, expires: expiresMs * 1_000_000 }), { reply: inbox });
  await client.nc.flush();
}

// Until the consumer has handed out every message and n are unacked: the
// long task and the one now in the worker's queue.
async function waitDelivered(client, n) {
  return waitFor(`${n} messages delivered, none pending`, async () => {
    const ci = await client.jsm.consumers.info(STREAM, CONSUMER);
    return ci.num_pending === 0 && ci.num_ack_pending === n ? ci : null;
  }, 10000);
}

// One stack per describe: a server with its monitor, worker A (one slot),
// the client. Worker B, where there is one, is started by the test.
function setup(workerOpts) {
  const ctx = { workers: [] };
  before(async () => {
    ctx.server = await startNatsServer({ config: SERVER_CONFIG, monitor: true });
    assert.ok(ctx.server.monitorUrl, "the server's monitor is open");
    ctx.a = await ctx.addWorker("stale-a");
    ctx.client = await connectClient(ctx.server.url);
  });
  ctx.addWorker = async (name) => {
    const w = await startWorker({ natsUrl: ctx.server.url, concurrency: 1, nats: { name }, ...workerOpts });
    ctx.workers.push(w);
    return w;
  };
  after(async () => {
    await ctx.client?.close();
    for (const w of ctx.workers) {
      const x = await w.stop("SIGTERM", 60000).catch((e) => ({ error: e }));
      const log = w.logText();
      if (x.error || x.code !== 0 || /ERROR: (Address|Leak)Sanitizer|runtime error: |SUMMARY: UndefinedBehaviorSanitizer/.test(log)) {
        process.stderr.write(`worker ${w.id}: ${x.error?.message ?? `exit ${x.code}`}; log:\n${log.slice(-20000)}\n`);
        process.exitCode = 1;
      }
      await w.cleanup().catch(() => {});
    }
    await ctx.server?.stop();
  });
  return ctx;
}

// Makes worker A's only slot busy with a long task (cancelled by the test),
// then opens a pull request on A's inbox that outlives any Fetch of A's:
// what the next task is delivered to. Returns the busy task's id.
async function busyWithStaleRequest(ctx, prefix, expiresMs) {
  const busy = newTaskId(prefix);
  await ctx.client.submit({ taskId: busy, language: "python", code: "import time\ntime.sleep(60)" });
  await ctx.client.waitStatus(busy, "TASK_STATUS_RUNNING", 30000);
  await stalePullRequest(ctx.client, await pullInbox(ctx.server.monitorUrl, "stale-a"), expiresMs);
  return busy;
}

// Log lines of every worker about taskId (with event, only those).
const taskLines = (workers, taskId, event) =>
  workers.flatMap((w) => w.lines().filter((l) => l.task_id === taskId && (!event || l.event === event)).map((l) => ({ ...l, w: w.id })));

describe("a task delivered to a stale pull request of a busy slot", () => {
  const ctx = setup({ jetstream: { ack_wait_s: ACK_WAIT_S } });

  test("runs once, on the worker it was redelivered to; the busy slot leaves its stale copy alone", async () => {
    const c = ctx.client;
    const a = ctx.a;
    const busy = await busyWithStaleRequest(ctx, "stale-busy");
    const x = newTaskId("stale-x");
    const marker = `marker-${x}`;
    // Still running on B when A comes back: it runs until the test lets it
    // end, below.
    const hold = `ci-itest-stale-${process.pid}-${Date.now()}`;
    await c.submit({ taskId: x, language: "python", code: `print('${marker}', flush=True)\n${blockUntilReleased(hold)}` });
    await waitDelivered(c, 2); // X sits in A's queue, its ack timer running
    assert.deepEqual(taskLines([a], x), [], "A did not take X: its slot is busy");

    // B gets X once its ack wait ran out; A comes back while B runs it.
    const b = await ctx.addWorker("stale-b");
    const running = await c.waitStatus(x, "TASK_STATUS_RUNNING", 30000);
    assert.equal(running.result.worker, b.id, "X was redelivered to B");
    assert.equal(running.result.attempt, 2);
    await c.cancel(busy);
    const { result: busyResult } = await c.waitResult(busy, 20000);
    assert.equal(busyResult.status, "TASK_STATUS_CANCELLED", show(busyResult));
    // A takes X's stale copy from its queue, whatever it then does with it.
    await waitFor("A took X's stale copy", () => taskLines([a], x).length > 0, 10000);
    const startsOf = () => taskLines(ctx.workers, x, "task.start").map((l) => [l.w, l.attempt]);
    assert.deepEqual(startsOf(), [[b.id, 2]], "X started once, on B");
    await waitProcessWith(hold, 30000);
    assert.equal(releaseMarker(hold), 1, "X still ran on B");

    const { result } = await c.waitResult(x, 30000);
    assert.equal(result.status, "TASK_STATUS_SUCCEEDED", show(result));
    assert.equal(result.stdout.trim(), marker);
    assert.equal(result.worker, b.id);
    assert.deepEqual(startsOf(), [[b.id, 2]], "X started once, on B");
    const evs = await c.events(x, { timeoutMs: 10000, settleMs: 2000 });
    const statuses = evs.map((e) => e.event.status);
    assert.equal(statuses.filter((s) => TERMINAL.has(s)).length, 1, `one terminal event: ${statuses}`);
    assert.deepEqual(statuses, ["TASK_STATUS_RUNNING", "TASK_STATUS_SUCCEEDED"]);
    const stale = taskLines([a], x, "task.stale_delivery");
    assert.equal(stale.length, 1, `A logged its stale copy: ${JSON.stringify(taskLines([a], x))}`);
    assert.equal(stale[0].level, "warn");
    assert.equal(stale[0].attempt, 1);
    assert.equal(stale[0].action, "left_for_redelivery");
    assert.ok(stale[0].waited_ms >= ACK_WAIT_S * 1000, `waited at most ${stale[0].waited_ms} ms`);
    const metrics = await (await fetch(`${a.monitorUrl}/metrics`)).text();
    assert.match(metrics, /^ci_task_deliveries_total\{outcome="stale"\} 1$/m, "A counted it");
    const ci = await waitFor("the queue is empty", async () => {
      const i = await c.jsm.consumers.info(STREAM, CONSUMER);
      return i.num_pending === 0 && i.num_ack_pending === 0 ? i : null;
    }, 10000);
    assert.equal(ci.num_ack_pending, 0, "nothing lost");

    // A still works.
    const after = newTaskId("stale-after");
    await c.submit({ taskId: after, language: "python", code: "print(42)" });
    const { result: r2 } = await c.waitResult(after, 30000);
    assert.equal(r2.status, "TASK_STATUS_SUCCEEDED", show(r2));
  });

  test("a late 408 left in the queue of a busy slot does not make the next, fresh task stale", async () => {
    const c = ctx.client;
    const a = ctx.a;
    for (const w of ctx.workers) if (w !== a && !w.exited()) await w.stop(); // A alone
    // A request that expires at once: its 408 waits in A's queue.
    const busy = await busyWithStaleRequest(ctx, "late408-busy", 200);
    await waitFor("the request expired", async () => (await c.jsm.consumers.info(STREAM, CONSUMER)).num_waiting === 0, 5000);
    // More data than the 408 has bytes (about 81), as any real task has.
    const z = newTaskId("late408-z");
    await c.submit({ taskId: z, language: "python", code: `# ${"z".repeat(200)}\nprint('fresh')` });
    await sleep(ACK_WAIT_S * 500 + 500); // A busy past half the ack wait
    const ci = await c.jsm.consumers.info(STREAM, CONSUMER);
    assert.equal(ci.num_pending, 1, "Z waits in the stream, not in A's queue");
    await c.cancel(busy);

    const { result } = await c.waitResult(z, 30000);
    assert.equal(result.status, "TASK_STATUS_SUCCEEDED", show(result));
    assert.equal(result.worker, a.id);
    assert.equal(result.attempt, 1, "run on its first delivery, not left for a redelivery");
    assert.deepEqual(taskLines([a], z, "task.stale_delivery"), []);
    assert.equal(taskLines([a], z, "task.start").length, 1);
  });

  test("a late 408 that ends an idle slot's fetch early does not leave it with two pull requests open", async () => {
    const c = ctx.client;
    for (const w of ctx.workers) if (w !== ctx.a && !w.exited()) await w.stop(); // A alone
    const inbox = await pullInbox(ctx.server.monitorUrl, "stale-a");
    const waiting = async () => (await c.jsm.consumers.info(STREAM, CONSUMER)).num_waiting;
    // nats.c 3.4.1 takes any 408 on the slot's inbox for the end of its
    // Fetch, whose own request stays open on the server. A Fetch at once
    // would open a second one; then each expiry's 408 ends the next Fetch
    // early, which opens another: two for good, and one of them can take a
    // task while the slot is busy with one the other gave it.
    const seen = [];
    for (let i = 0; i < 5; i++) {
      await waitFor("A's pull request is open", async () => (await waiting()) >= 1, 5000);
      c.nc.publish(inbox, new Uint8Array(0), { headers: natsHeaders(408, "Request Timeout") });
      await c.nc.flush();
      await sleep(150);
      seen.push(await waiting());
      await sleep(1000 + i * 100); // another phase of A's one-second fetch cycle
    }
    // A few ms of overlap are possible (a request outlives its Fetch on the
    // server): the fewest seen over a second is what stays open.
    await sleep(1500);
    const after = [];
    for (let i = 0; i < 8; i++) {
      after.push(await waiting());
      await sleep(125);
    }
    assert.ok(Math.min(...after) <= 1, `pull requests open: ${after} (150 ms after each late 408: ${seen})`);
    // A still takes tasks at once.
    const { result } = await runTask(c, { code: "print(7)" }, { timeoutMs: 30000 });
    assert.equal(result.status, "TASK_STATUS_SUCCEEDED", show(result));
    assert.equal(result.attempt, 1);
  });
});

describe("a stale copy on its last attempt", () => {
  const ctx = setup({ jetstream: { ack_wait_s: ACK_WAIT_S, max_deliver: 1 } });

  test("still runs, once: no redelivery would ever come", async () => {
    const c = ctx.client;
    const a = ctx.a;
    const busy = await busyWithStaleRequest(ctx, "last-busy");
    const y = newTaskId("last-y");
    await c.submit({ taskId: y, language: "python", code: "print('once')" });
    await waitDelivered(c, 2);
    // Past its ack wait: the server would redeliver it, but max_deliver is 1.
    await sleep(ACK_WAIT_S * 1000 + 1500);
    const ci = await c.jsm.consumers.info(STREAM, CONSUMER);
    assert.equal(ci.num_redelivered, 0, "nothing was redelivered");
    await c.cancel(busy);

    const { result } = await c.waitResult(y, 30000);
    assert.equal(result.status, "TASK_STATUS_SUCCEEDED", show(result));
    assert.equal(result.stdout.trim(), "once");
    assert.equal(result.worker, a.id);
    assert.equal(result.attempt, 1);
    const starts = taskLines(ctx.workers, y, "task.start");
    assert.equal(starts.length, 1, `Y started once: ${JSON.stringify(starts)}`);
    const stale = taskLines([a], y, "task.stale_delivery");
    assert.equal(stale.length, 1, `A logged its stale copy: ${JSON.stringify(taskLines([a], y))}`);
    assert.equal(stale[0].action, "run_last_attempt");
    const evs = await c.events(y, { timeoutMs: 10000, settleMs: 1000 });
    assert.deepEqual(evs.map((e) => e.event.status), ["TASK_STATUS_RUNNING", "TASK_STATUS_SUCCEEDED"]);
    await waitFor("the queue is empty", async () => {
      const i = await c.jsm.consumers.info(STREAM, CONSUMER);
      return i.num_pending === 0 && i.num_ack_pending === 0;
    }, 10000);
  });
});
