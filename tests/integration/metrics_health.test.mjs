// What operators see of a running worker: /metrics counts what the worker
// did (tasks by status, run and queue-wait histograms, slots, object-store
// bytes), /healthz and /readyz answer as a kubelet expects (not ready while
// draining), and `ci stats` shows the queue and the workers' heartbeats.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";

import { createServer, connect as tcpConnect } from "node:net";

import { startStack } from "./lib/stack.mjs";
import { startWorker } from "./lib/worker.mjs";
import { newTaskId } from "./lib/client.mjs";
import { blockUntilReleased, releaseMarker, show, waitProcessWith } from "./lib/checks.mjs";
import { CLI_BIN } from "./lib/worker.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Parses the Prometheus text format: { "name{labels}": value }, checking
// that every line is a comment or a sample of a family announced by # TYPE.
function parseMetrics(text) {
  const out = {};
  const types = {};
  let family = null;
  for (const line of text.split("\n")) {
    if (!line) continue;
    const t = /^# TYPE (\S+) (counter|gauge|histogram)$/.exec(line);
    if (t) {
      family = t[1];
      types[family] = t[2];
      continue;
    }
    if (line.startsWith("# HELP ")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$/.exec(line);
    assert.ok(m, `not a sample line: ${JSON.stringify(line)}`);
    assert.ok(family && m[1].startsWith(family), `sample ${m[1]} outside its family ${family}`);
    const v = Number(m[2]);
    assert.ok(Number.isFinite(v), `value of ${m[1]}: ${m[2]}`);
    out[m[1]] = v;
  }
  return { samples: out, types };
}

async function getText(url) {
  const r = await fetch(url);
  return { status: r.status, type: r.headers.get("content-type"), text: await r.text() };
}

function ciStats(url, ...args) {
  const r = spawnSync(CLI_BIN, ["--url", url, "stats", ...args], { encoding: "utf8", timeout: 30000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe("metrics, health and ci stats", () => {
  let stack, w;
  before(async () => {
    stack = await startStack({ workers: 1, worker: { concurrency: 2, worker: { heartbeat_s: 1 } } });
    w = stack.workers[0];
  });
  after(async () => {
    await stack?.stop();
  });

  test("/metrics counts tasks by status, run and queue-wait times, slots and object-store bytes", async () => {
    const c = stack.client;
    assert.ok(w.monitorUrl, "the worker logged its metrics address");
    const before = parseMetrics((await getText(`${w.monitorUrl}/metrics`)).text).samples;
    assert.equal(before['ci_tasks_total{status="succeeded",provider="local"}'], 0);
    assert.equal(before.ci_slots_free, 2);
    assert.equal(before.ci_slots_active, 0);
    assert.equal(before.ci_nats_connected, 1);
    // Zygotes ready in warm mode (local.warm_pool_size, 1 by default), 0 cold.
    assert.ok(before.ci_warm_pool_size >= 0 && before.ci_warm_pool_size <= 16, `ci_warm_pool_size ${before.ci_warm_pool_size}`);

    const input = Buffer.alloc(3000, "a");
    const objName = `inputs/metrics/${newTaskId("in")}.csv`;
    await c.putObject(objName, input);
    const ids = {
      ok1: newTaskId("m-ok"),
      ok2: newTaskId("m-ok"),
      art: newTaskId("m-art"),
      fail: newTaskId("m-fail"),
      slow: newTaskId("m-slow"),
    };
    await c.submit({ taskId: ids.ok1, language: "python", code: "print(1)" });
    await c.submit({ taskId: ids.ok2, language: "python", code: "print(2)" });
    await c.submit({
      taskId: ids.art,
      language: "python",
      code: "d = open('in.csv').read()\nopen('out.csv', 'w').write('n\\n' + str(len(d)) + '\\n')",
      files: [{ name: "in.csv", object: objName }],
    });
    await c.submit({ taskId: ids.fail, language: "python", code: "raise SystemExit(3)" });
    await c.submit({ taskId: ids.slow, language: "python", code: "import time\ntime.sleep(5)", limits: { timeoutMs: 1000 } });
    const results = {};
    for (const [k, id] of Object.entries(ids)) results[k] = (await c.waitResult(id, 60000)).result;
    assert.equal(results.art.status, "TASK_STATUS_SUCCEEDED", show(results.art));
    assert.equal(results.fail.status, "TASK_STATUS_FAILED", show(results.fail));
    assert.equal(results.slow.status, "TASK_STATUS_TIMED_OUT", show(results.slow));

    // A running task shows as an active slot. It runs until the test lets
    // it go on, then 2 s more. First the slots of the tasks above must be
    // free: a slot is freed just after its result is stored (seen under
    // load: one still active when the next was counted).
    for (const deadline = Date.now() + 30000; ; await sleep(50)) {
      const m = parseMetrics((await getText(`${w.monitorUrl}/metrics`)).text).samples;
      if (m.ci_slots_active === 0) break;
      assert.ok(Date.now() < deadline, `slots still active after the results: ${m.ci_slots_active}`);
    }
    const busy = newTaskId("m-busy");
    const marker = `ci-itest-mbusy-${process.pid}-${Date.now()}`;
    await c.submit({ taskId: busy, language: "python", code: `${blockUntilReleased(marker)}import time\ntime.sleep(2)` });
    await c.waitStatus(busy, "TASK_STATUS_RUNNING", 30000);
    await waitProcessWith(marker, 30000);
    const during = parseMetrics((await getText(`${w.monitorUrl}/metrics`)).text).samples;
    assert.equal(releaseMarker(marker), 1);
    assert.equal(during.ci_slots_active, 1);
    assert.equal(during.ci_slots_free, 1);
    await c.waitResult(busy, 30000);
    // The slot is freed just after the result is stored, and the delivery
    // counted just after that (src/worker/main.c run_task).
    let r;
    for (const deadline = Date.now() + 30000; ; await sleep(50)) {
      r = await getText(`${w.monitorUrl}/metrics`);
      const m = parseMetrics(r.text).samples;
      if (m.ci_slots_active === 0 && m['ci_task_deliveries_total{outcome="done"}'] >= 6) break;
      assert.ok(Date.now() < deadline, `the slot is still active or the delivery not counted 30 s after the result: ${JSON.stringify(m)}`);
    }

    assert.equal(r.status, 200);
    assert.match(r.type, /^text\/plain; version=0\.0\.4/);
    const { samples: m, types } = parseMetrics(r.text);
    assert.equal(types.ci_tasks_total, "counter");
    assert.equal(types.ci_task_run_seconds, "histogram");
    assert.equal(types.ci_task_queue_wait_seconds, "histogram");
    assert.equal(types.ci_slots_active, "gauge");
    assert.equal(m['ci_tasks_total{status="succeeded",provider="local"}'], 4);
    assert.equal(m['ci_tasks_total{status="failed",provider="local"}'], 1);
    assert.equal(m['ci_tasks_total{status="timed_out",provider="local"}'], 1);
    assert.equal(m['ci_tasks_total{status="cancelled",provider="local"}'], 0);
    assert.equal(m['ci_task_deliveries_total{outcome="done"}'], 6);
    assert.equal(m.ci_task_run_seconds_count, 6);
    assert.equal(m['ci_task_run_seconds_bucket{le="+Inf"}'], 6);
    assert.ok(m.ci_task_run_seconds_sum >= 2.5, `the 1 s timeout and the 2 s task are in the sum: ${m.ci_task_run_seconds_sum}`);
    assert.ok(m['ci_task_run_seconds_bucket{le="0.5"}'] <= m['ci_task_run_seconds_bucket{le="1"}']);
    assert.equal(m.ci_task_queue_wait_seconds_count, 6);
    assert.ok(m['ci_task_queue_wait_seconds_bucket{le="60"}'] === 6, "no task waited a minute");
    assert.equal(m['ci_objstore_bytes_total{direction="download"}'], input.length);
    assert.equal(m['ci_objstore_bytes_total{direction="upload"}'], results.art.artifacts[0].size);
    assert.equal(m.ci_slots_active, 0);
    assert.equal(m.ci_slots_free, 2);
    assert.equal(m.ci_nats_reconnects_total, 0);
  });

  test("/healthz and /readyz: 200 while serving; unknown paths 404", async () => {
    const h = await getText(`${w.monitorUrl}/healthz`);
    assert.equal(h.status, 200);
    assert.equal(h.text, "ok\n");
    const r = await getText(`${w.monitorUrl}/readyz`);
    assert.equal(r.status, 200, r.text);
    assert.equal(r.text, "ready\n");
    assert.equal((await getText(`${w.monitorUrl}/x`)).status, 404);
    const post = await fetch(`${w.monitorUrl}/metrics`, { method: "POST", body: "x" });
    assert.equal(post.status, 405);
  });

  test("ci stats: the queue and the worker's heartbeat", async () => {
    const url = stack.server.url;
    // The heartbeat (every second here) catches up with the tasks above.
    let s, j;
    for (let i = 0; i < 30; i++) {
      s = ciStats(url, "--json");
      assert.equal(s.code, 0, s.stderr);
      j = JSON.parse(s.stdout);
      const hb = j.workers.find((x) => x.heartbeat.worker === w.id);
      if (hb && Number(hb.heartbeat.tasksDone) >= 6) break;
      await sleep(200);
    }
    assert.equal(j.queue.stream, "CI_TASKS");
    assert.equal(j.queue.pending, "0");
    assert.equal(j.queue.ackPending, "0");
    const mine = j.workers.find((x) => x.heartbeat.worker === w.id);
    assert.ok(mine, `the worker's heartbeat is listed: ${s.stdout}`);
    assert.equal(mine.heartbeat.provider, "local");
    assert.equal(mine.heartbeat.slots, 2);
    assert.equal(mine.heartbeat.ready, true);
    assert.equal(Number(mine.heartbeat.tasksDone), 6, s.stdout);
    assert.ok(Number(mine.seenMsAgo) < 5000, s.stdout);

    // Tasks waiting while the only worker is busy count as queue depth.
    const c = stack.client;
    const ids = [];
    // They run until cancelled below (within their 60 s time limit): none
    // ends while the queue is read.
    for (let i = 0; i < 5; i++) {
      const id = newTaskId("m-q");
      ids.push(id);
      await c.submit({ taskId: id, language: "python", code: "import time\ntime.sleep(120)" });
    }
    for (const deadline = Date.now() + 30000; ; await sleep(50)) {
      const ci = await c.jsm.consumers.info("CI_TASKS", "ci-workers");
      if (ci.num_ack_pending >= 2) break; // both slots took one
      assert.ok(Date.now() < deadline, `the two slots took no task within 30 s: ${JSON.stringify(ci)}`);
    }
    const q = JSON.parse(ciStats(url, "--json").stdout).queue;
    // Two slots are busy. nats.c 3.4.1 can leave a slot with a second pull
    // request open after a stale 408 (NATS-NOTES), so one more task may be
    // delivered and wait in that slot's queue: 2 or 3 in flight, never more.
    const inFlight = Number(q.ackPending);
    assert.ok(inFlight === 2 || inFlight === 3, `two slots busy: ${JSON.stringify(q)}`);
    assert.equal(Number(q.pending), 5 - inFlight, `the rest waiting: ${JSON.stringify(q)}`);
    const text = ciStats(url);
    assert.equal(text.code, 0, text.stderr);
    assert.match(text.stdout, new RegExp(`^queue: +${5 - inFlight} waiting for a worker`, "m"));
    assert.match(text.stdout, new RegExp(`^in flight: +${inFlight} `, "m"));
    assert.match(text.stdout, new RegExp(`^workers: +1 alive`, "m"));
    // The heartbeat (every second) catches up with the two busy slots.
    let hbText = text.stdout;
    for (let i = 0; i < 20 && !new RegExp(`^  ${w.id} +local +slots 2 +running 2 +ready`, "m").test(hbText); i++) {
      await sleep(100);
      hbText = ciStats(url).stdout;
    }
    assert.match(hbText, new RegExp(`^  ${w.id} +local +slots 2 +running 2 +ready`, "m"));
    for (const id of ids) await c.cancel(id);
    for (const id of ids) assert.equal((await c.waitResult(id, 60000)).result.status, "TASK_STATUS_CANCELLED");
    assert.equal(ciStats(url, "extra").code, 2, "stats takes no argument");
  });

  test("a lost NATS connection: /readyz 503 and ci_nats_connected 0 while it is down, then a reconnect is counted", async () => {
    // A TCP proxy in front of the server that the test can cut.
    const sockets = new Set();
    let refusing = false;
    const proxy = createServer((client) => {
      if (refusing) return client.destroy();
      const upstream = tcpConnect(stack.server.port, "127.0.0.1");
      for (const s of [client, upstream]) {
        sockets.add(s);
        s.on("close", () => sockets.delete(s));
        s.on("error", () => {});
      }
      client.pipe(upstream);
      upstream.pipe(client);
      client.on("close", () => upstream.destroy());
      upstream.on("close", () => client.destroy());
    });
    await new Promise((r) => proxy.listen(0, "127.0.0.1", r));
    // It runs no task: cold, without the zygote of a warm start.
    const w2 = await startWorker({ natsUrl: `nats://127.0.0.1:${proxy.address().port}`, nats: { reconnect_wait_ms: 100 }, worker: { heartbeat_s: 1 }, local: { mode: "cold" } });
    try {
      const metrics = async () => parseMetrics((await getText(`${w2.monitorUrl}/metrics`)).text).samples;
      assert.equal((await metrics()).ci_nats_reconnects_total, 0);
      assert.equal((await getText(`${w2.monitorUrl}/readyz`)).status, 200);
      refusing = true;
      for (const s of sockets) s.destroy();
      let r = null;
      for (let i = 0; i < 100; i++) {
        r = await getText(`${w2.monitorUrl}/readyz`);
        if (r.status === 503) break;
        await sleep(50);
      }
      assert.equal(r.status, 503);
      assert.equal(r.text, "not ready: not connected to NATS\n");
      assert.equal((await metrics()).ci_nats_connected, 0);
      assert.equal((await getText(`${w2.monitorUrl}/healthz`)).status, 200, "still live: nothing to restart");
      refusing = false;
      for (let i = 0; i < 100 && (await getText(`${w2.monitorUrl}/readyz`)).status !== 200; i++) await sleep(100);
      const m = await metrics();
      assert.equal(m.ci_nats_connected, 1);
      assert.equal(m.ci_nats_reconnects_total, 1);
      assert.equal((await getText(`${w2.monitorUrl}/readyz`)).status, 200);
      // The operator's log says both, once each.
      const gone = await w2.waitLog((l) => l.event === "worker.nats_disconnected");
      assert.equal(gone.level, "warn");
      assert.equal(gone.state, "reconnecting");
      const back = await w2.waitLog((l) => l.event === "worker.nats_reconnected");
      assert.equal(back.level, "info");
      assert.equal(back.reconnects, 1);
      assert.equal(w2.events("worker.nats_disconnected").length, 1);
      assert.equal(w2.events("worker.nats_reconnected").length, 1);
      assert.equal((await w2.stop("SIGTERM", 30000)).code, 0);
    } finally {
      await w2.cleanup();
      proxy.close();
      for (const s of sockets) s.destroy();
    }
  });

  test("SIGTERM: /readyz turns 503 while the worker drains, its heartbeat is removed at exit", async () => {
    const c = stack.client;
    const id = newTaskId("m-drain");
    // The task runs until the test lets it end: the worker drains meanwhile.
    const marker = `ci-itest-mdrain-${process.pid}-${Date.now()}`;
    await c.submit({ taskId: id, language: "python", code: `${blockUntilReleased(marker)}print('done')` });
    await c.waitStatus(id, "TASK_STATUS_RUNNING", 30000);
    await waitProcessWith(marker, 30000);
    const exitP = w.stop("SIGTERM", 60000);
    let r = null;
    for (const deadline = Date.now() + 30000; ; await sleep(50)) {
      r = await getText(`${w.monitorUrl}/readyz`);
      if (r.status === 503 || Date.now() > deadline) break;
    }
    assert.equal(r.status, 503);
    assert.match(r.text, /^not ready: draining/);
    assert.equal((await getText(`${w.monitorUrl}/healthz`)).status, 200, "a draining worker is still live");
    assert.equal(releaseMarker(marker), 1, "the task still ran");
    const { code } = await exitP;
    assert.equal(code, 0);
    assert.equal((await c.waitResult(id, 5000)).result.status, "TASK_STATUS_SUCCEEDED");
    const j = JSON.parse(ciStats(stack.server.url, "--json").stdout);
    assert.equal(j.workers.find((x) => x.heartbeat.worker === w.id), undefined, "a worker that stopped cleanly deletes its heartbeat");
  });
});
