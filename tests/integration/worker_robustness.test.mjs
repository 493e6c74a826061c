// The worker when something goes wrong around the code rather than in it:
// a refused request too large to echo, a hostile Nats-Msg-Id, an artifact the
// object store can never take, a terminal event that could not be published,
// an artifact upload that fails, and a NATS connection that closes for good.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startStack } from "./lib/stack.mjs";
import { startNatsServer } from "./lib/nats-server.mjs";
import { startWorker } from "./lib/worker.mjs";
import { connectClient, newTaskId, runTask } from "./lib/client.mjs";
import { blockUntilReleased, checkEvents, checkRefused, releaseMarker, show, waitProcessWith } from "./lib/checks.mjs";

// Resolves to what promise gives, or to null after ms.
function within(promise, ms) {
  let timer;
  const timeout = new Promise((resolve) => {
    timer = setTimeout(() => resolve(null), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

const SANITIZER = /ERROR: (Address|Leak)Sanitizer|runtime error: |SUMMARY: UndefinedBehaviorSanitizer/;

// The blocks run at the same time, each on its own server and workers: most
// of their time is spent waiting (a worker starting, retries and timeouts of
// NATS), not on the CPU.
describe("worker robustness, each block on its own server", { concurrency: true }, () => {
  describe("worker robustness", { concurrency: 1 }, () => {
    let stack;
    let worker;
    before(async () => {
      stack = await startStack({ workers: 1 });
      worker = stack.workers[0];
    });
    after(async () => {
      await stack?.stop();
    });

    const taskLines = (taskId, event) => worker.lines().filter((l) => l.task_id === taskId && (!event || l.event === event));

    // 120 labels of 69875 bytes: the request just fits in the server's 8 MB
    // max_payload, so a result echoing them cannot. Refused for the count of
    // labels, it must still end FAILED, its echo of the labels dropped.
    const hugeLabels = () => {
      const labels = {};
      for (let i = 0; i < 120; i++) labels[`k${i}`] = "x".repeat(69875);
      return labels;
    };

    for (const json of [false, true]) {
      const encoding = json ? "json" : "protobuf";
      test(`a request refused for megabytes of labels still ends FAILED (${encoding})`, async () => {
        const c = stack.client;
        const { taskId, result: r, encoding: got } = await runTask(c, { code: "print('must not run')", labels: hugeLabels() }, { json, timeoutMs: 20000 });
        assert.equal(got, encoding, "the result is in the encoding of the request");
        checkRefused(r, taskId, [/120 labels/, /limit is 64/]);
        assert.deepEqual(r.labels, {}, "the labels that made the result too large are not echoed");
        const evs = await c.events(taskId, { timeoutMs: 10000, settleMs: 500 });
        checkEvents(evs, { taskId, result: r, encoding, ran: false, worker: worker.id });
      });
    }

    test("a dropped message's log line carries at most 64 bytes of its Nats-Msg-Id, cut on a UTF-8 boundary", async () => {
      // 60 KB: an invalid task id, and no body to take one from.
      const msgId = "x" + "é".repeat(30000);
      await stack.client.submit(null, { body: "not json", msgId, contentType: "application/json" });
      const l = await worker.waitLog((x) => x.event === "task.dropped" && typeof x.nats_msg_id === "string" && x.nats_msg_id.startsWith("xé"), 10000);
      assert.ok(Buffer.byteLength(l.nats_msg_id) <= 64, `nats_msg_id is ${Buffer.byteLength(l.nats_msg_id)} bytes`);
      // 64 bytes would end inside the 32nd 'é': the cut goes back to 63.
      assert.equal(l.nats_msg_id, "x" + "é".repeat(31));
      assert.equal(l.level, "warn");
      assert.match(l.reason, /undecodable body/);
      const line = worker.logText().split("\n").find((t) => t.includes('"task.dropped"') && t.includes("xé"));
      assert.ok(line.length < 1024, `the log line is ${line.length} characters`);
    });

    test("an artifact path longer than an object name may be is dropped with a note; the others are kept and the code runs once", async () => {
      const c = stack.client;
      const code = [
        "import os",
        "d = '/'.join(['d' * 250] * 4)",
        "os.makedirs(d)",
        "open(d + '/x.csv', 'w').write('a\\n1\\n')",
        "open('ok.csv', 'w').write('b\\n2\\n')",
        "print('ran once')",
      ].join("\n");
      const { taskId, result: r } = await runTask(c, { code }, { timeoutMs: 30000 });
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(r.attempt, 1, show(r));
      assert.equal(r.stdout, "ran once\n");
      assert.deepEqual(r.artifacts.map((a) => a.name), ["ok.csv"]);
      assert.equal((await c.getObject(r.artifacts[0].object)).toString(), "b\n2\n");
      // The note names the culprit and the limit.
      assert.match(r.error, /artifact not kept/, show(r));
      assert.match(r.error, new RegExp(`object name '${taskId}/d{100}`), show(r));
      assert.match(r.error, /is \d+ bytes; the limit is 1024/, show(r));
      assert.equal(taskLines(taskId, "task.start").length, 1, "the code ran once");
      assert.deepEqual(taskLines(taskId, "task.infra_error"), []);
      const evs = await c.events(taskId, { timeoutMs: 10000, settleMs: 500 });
      checkEvents(evs, { taskId, result: r, encoding: "protobuf", worker: worker.id });
    });

    // Last in this block: it points the status stream elsewhere for a while.
    test("a terminal event that could not be published is published when the finished task is redelivered", async () => {
      const c = stack.client;
      const taskId = newTaskId("repair");
      const { config } = await c.jsm.streams.info("CI_STATUS");
      // The code waits until the test lets it end (below).
      const marker = `ci-itest-repair-${process.pid}-${Date.now()}`;
      await c.submit({ taskId, language: "python", code: `${blockUntilReleased(marker)}print('done')` });
      await c.waitStatus(taskId, "TASK_STATUS_RUNNING");
      // The RUNNING event follows the RUNNING record: wait until it is in.
      for (const deadline = Date.now() + 30000; !(await c.jsm.streams.getMessage("CI_STATUS", { last_by_subj: `ci.status.${taskId}` })); ) {
        assert.ok(Date.now() < deadline, "the RUNNING event is in CI_STATUS within 30 s");
        await new Promise((r) => setTimeout(r, 50));
      }
      await waitProcessWith(marker, 30000); // the code runs
      // RUNNING is out; from now on a publish on ci.status.<id> finds no stream.
      await c.jsm.streams.update("CI_STATUS", { ...config, subjects: ["ci.statusx.>"] });
      try {
        assert.equal(releaseMarker(marker), 1, "the code goes on, to its end");
        // The result is stored, its event fails (retried ~7 s), the task is nak'ed.
        await worker.waitLog((l) => l.task_id === taskId && l.event === "task.infra_error", 30000);
      } finally {
        await c.jsm.streams.update("CI_STATUS", { ...config, subjects: config.subjects });
      }
      const { result: r } = await c.waitResult(taskId, 10000);
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(r.stdout, "done\n");
      assert.equal(r.attempt, 1, "the result of the only run");
      const evs = await c.events(taskId, { timeoutMs: 15000, settleMs: 2000 });
      checkEvents(evs, { taskId, result: r, encoding: "protobuf", worker: worker.id });
      await worker.waitLog((l) => l.task_id === taskId && l.event === "task.event_repaired", 5000);
      assert.equal(taskLines(taskId, "task.start").length, 1, "the code was not run again");
      assert.equal(taskLines(taskId, "task.duplicate").length, 1, "the redelivery was acked as a finished task");
    });
  });

  describe("worker robustness: a failed artifact upload", { concurrency: 1 }, () => {
    let stack;
    before(async () => {
      // Two deliveries: the first fails to upload, the second ends it. Cold,
      // as the workers of the blocks below: what they check is around the
      // code, not how it starts, and a warm start first waits for a zygote's
      // imports (seconds of CPU on a loaded machine).
      stack = await startStack({ workers: 1, worker: { jetstream: { max_deliver: 2 }, local: { mode: "cold" } } });
    });
    after(async () => {
      await stack?.stop();
    });

    test("leaks nothing: the worker drains to exit 0 without a LeakSanitizer report", async () => {
      const c = stack.client;
      const w = stack.workers[0];
      const taskId = newTaskId("upfail");
      // Each run waits until the test lets it end (below).
      const marker = `ci-itest-upfail-${process.pid}-${Date.now()}`;
      await c.submit({
        taskId,
        language: "python",
        code: `open('a.csv', 'w').write('a\\n1\\n')\nopen('b.csv', 'w').write('b\\n1\\n')\n${blockUntilReleased(marker)}`,
      });
      await c.waitStatus(taskId, "TASK_STATUS_RUNNING");
      await waitProcessWith(marker, 30000); // the code runs, its artifacts written
      // The files bucket stops taking anything (its stream listens elsewhere;
      // a deleted one would be made again: nats_resources).
      const { config } = await c.jsm.streams.info("OBJ_ci-files");
      await c.jsm.streams.update("OBJ_ci-files", { ...config, subjects: ["$O.ci-filesx.>"] });
      // Both deliveries go on to their upload, which fails.
      const releasing = setInterval(() => releaseMarker(marker), 50);
      const { result: r } = await c.waitResult(taskId, 60000).finally(() => clearInterval(releasing));
      await c.jsm.streams.update("OBJ_ci-files", { ...config, subjects: config.subjects });
      assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
      assert.deepEqual(r.artifacts, []);
      const infra = w.lines().find((l) => l.task_id === taskId && l.event === "task.infra_error");
      assert.ok(infra, `the upload failed; log:\n${w.logText()}`);
      assert.match(infra.step, /artifacts/);
      const x = await w.stop("SIGTERM", 30000);
      const log = w.logText();
      assert.doesNotMatch(log, SANITIZER, `sanitizer report:\n${log.slice(-6000)}`);
      assert.deepEqual(x, { code: 0, signal: null });
    });
  });

  describe("worker robustness: the NATS connection closes for good", { concurrency: 1 }, () => {
    let srv;
    let w;
    let client;
    after(async () => {
      await client?.close();
      await w?.cleanup().catch(() => {});
      await srv?.stop().catch(() => {});
    });

    test("once nats.max_reconnects is used up the worker exits 1 and says why", async () => {
      srv = await startNatsServer({ config: "max_payload: 8MB" });
      w = await startWorker({ natsUrl: srv.url, nats: { max_reconnects: 1, reconnect_wait_ms: 50 }, local: { mode: "cold" } });
      // One task first: its slot is bound and pulling (a server gone before
      // the bind is another failure, slot.bind_failed).
      client = await connectClient(srv.url);
      const { result: r } = await runTask(client, { code: "print('up')" }, { timeoutMs: 30000 });
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      await client.close();
      await srv.stop();
      const x = await within(w.exitPromise, 15000);
      assert.ok(x, `the worker still runs 15 s after its server stopped; log:\n${w.logText()}`);
      assert.deepEqual({ code: x.code, signal: x.signal }, { code: 1, signal: null }, w.logText());
      const lines = w.lines();
      const closed = lines.find((l) => l.event === "slot.connection_closed");
      assert.ok(closed, `the log says the connection closed; log:\n${w.logText()}`);
      assert.equal(closed.level, "error");
      assert.ok(typeof closed.error === "string" && closed.error.length > 0, "with the error");
      assert.ok(lines.some((l) => l.event === "worker.stopped"), "it stopped in order");
      assert.doesNotMatch(w.logText(), SANITIZER);
    });
  });

  describe("worker robustness: JetStream not there yet at start", { concurrency: 1 }, () => {
    let early;
    let srv;
    let w;
    let client;
    after(async () => {
      await client?.close();
      await w?.stop("SIGTERM", 30000).catch(() => {});
      await w?.cleanup().catch(() => {});
      await early?.stop().catch(() => {});
      await srv?.stop().catch(() => {});
    });

    test("a worker started before JetStream answers tries its setup again and becomes ready once it does", async () => {
      // First a server without JetStream on some port; then, on that same
      // port, one with it (as a cluster electing its leaders would answer).
      early = await startNatsServer({ jetstream: false, monitor: true });
      let spawned = null;
      const starting = startWorker({ natsUrl: early.url, readyTimeoutMs: 90000, local: { mode: "cold" }, onSpawn: (h) => (spawned = h) });
      starting.catch(() => {}); // awaited below
      // The worker connects once its sandbox is up; then its setup fails.
      for (let i = 0; ; i++) {
        const connz = await (await fetch(`${early.monitorUrl}/connz`)).json();
        if (connz.num_connections > 0) break;
        assert.ok(i < 600, "the worker connected to the first server within 60 s");
        await new Promise((r) => setTimeout(r, 100));
      }
      await spawned.waitLog((l) => l.event === "worker.nats_setup_retry", 60000); // it failed, and will try again
      await early.stop();
      srv = await startNatsServer({ config: `max_payload: 8MB\nlisten: 127.0.0.1:${early.port}` });
      w = await starting;
      const retries = w.lines().filter((l) => l.event === "worker.nats_setup_retry");
      assert.ok(retries.length >= 1, `it said it tried again; log:\n${w.logText()}`);
      assert.equal(retries[0].level, "warn");
      assert.ok(typeof retries[0].error === "string" && retries[0].error.length > 0, "with the error");
      client = await connectClient(srv.url);
      const { result: r } = await runTask(client, { code: "print('up')" }, { timeoutMs: 30000 });
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(r.stdout, "up\n");
      assert.doesNotMatch(w.logText(), SANITIZER);
    });
  });

  describe("worker robustness: several workers on one machine", { concurrency: 1 }, () => {
    let srv;
    before(async () => {
      srv = await startNatsServer();
    });
    after(async () => {
      await srv?.stop().catch(() => {});
    });

    test("workers on one machine with the default metrics address each get a port; a chosen address that is taken stops the worker", async () => {
      // Hold the default port ourselves, as a first worker would (if
      // something else holds it already, it is taken all the same).
      const net = await import("node:net");
      const holder = net.createServer();
      await new Promise((resolve) => {
        holder.once("error", () => resolve());
        holder.listen(9464, "127.0.0.1", () => resolve());
      });
      const workers = [];
      // Cold: they run no task, and a warm start waits for a zygote's imports.
      const local = { mode: "cold" };
      try {
        for (let i = 0; i < 2; i++)
          workers.push(await startWorker({ natsUrl: srv.url, worker: { metrics_addr: undefined }, local }));
        const addrs = workers.map((w) => w.monitorUrl);
        assert.ok(addrs.every((a) => a && !a.endsWith(":9464")), `each worker took a free port: ${addrs}`);
        assert.notEqual(addrs[0], addrs[1]);
        for (const w of workers) {
          const taken = w.events("worker.metrics_port_taken");
          assert.equal(taken.length, 1, w.logText());
          assert.equal(taken[0].wanted, "127.0.0.1:9464");
          const res = await fetch(`${w.monitorUrl}/readyz`);
          assert.equal(res.status, 200);
        }
        // An address set in the config is kept: taken, the worker exits 1.
        const port = Number(new URL(addrs[0]).port);
        await assert.rejects(
          startWorker({ natsUrl: srv.url, worker: { metrics_addr: `127.0.0.1:${port}` }, local }),
          (e) => /exited before it was ready \(exit code 1/.test(e.message) && /cannot listen on metrics address 127\.0\.0\.1:\d+: Address already in use/.test(e.message),
        );
      } finally {
        for (const w of workers) await w.cleanup();
        holder.close();
      }
    });
  });

  describe("worker robustness: started before its server", { concurrency: 1 }, () => {
    let srv;
    let w;
    let client;
    after(async () => {
      await client?.close();
      await w?.stop("SIGTERM", 30000).catch(() => {});
      await w?.cleanup().catch(() => {});
      await srv?.stop().catch(() => {});
    });

    test("a worker started before nats-server keeps trying, /readyz 503 and /healthz 200 meanwhile, and works once the server is up", async () => {
      // A port nobody listens on yet: the server comes there later.
      const net = await import("node:net");
      const probe = net.createServer();
      await new Promise((resolve) => probe.listen(0, "127.0.0.1", resolve));
      const port = probe.address().port;
      await new Promise((resolve) => probe.close(resolve));

      let spawned = null;
      const starting = startWorker({ natsUrl: `nats://127.0.0.1:${port}`, readyTimeoutMs: 120000, local: { mode: "cold" }, onSpawn: (h) => (spawned = h) });
      starting.catch(() => {}); // awaited below
      const begun = await spawned.waitLog((l) => l.event === "worker.starting", 60000);
      const base = `http://${begun.metrics_addr}`;
      // Three tries fail (no server), each logged; the worker is still there.
      for (let i = 0; spawned.events("worker.nats_connect_retry").length < 3; i++) {
        assert.ok(!spawned.exited(), `the worker did not give up; log:\n${spawned.logText()}`);
        assert.ok(i < 600, "three tries within 60 s");
        await new Promise((r) => setTimeout(r, 100));
      }
      const retry = spawned.events("worker.nats_connect_retry")[0];
      assert.equal(retry.level, "warn");
      assert.match(retry.error, /cannot connect to NATS/);
      assert.equal((await fetch(`${base}/readyz`)).status, 503, "not ready while NATS is missing");
      assert.equal((await fetch(`${base}/healthz`)).status, 200, "but alive");

      srv = await startNatsServer({ config: `max_payload: 8MB\nlisten: 127.0.0.1:${port}` });
      w = await starting;
      assert.equal((await fetch(`${base}/readyz`)).status, 200);
      client = await connectClient(srv.url);
      const { result: r } = await runTask(client, { code: "print('late server')" }, { timeoutMs: 30000 });
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(r.stdout, "late server\n");
      assert.doesNotMatch(w.logText(), SANITIZER);
    });

    test("a NATS URL that can never work fails at once with a clear message", async () => {
      for (const [url, rx] of [["nats://127.0.0.1:99999", /port of 1 to 65535/], ["not a url", /expected one NATS URL/]]) {
        const t0 = Date.now();
        // Exit code 2: the configuration is wrong, as for any invalid key.
        await assert.rejects(startWorker({ natsUrl: url }), (e) => /exited before it was ready \(exit code 2/.test(e.message) && rx.test(e.message));
        assert.ok(Date.now() - t0 < 30000, "at once, not after retries");
      }
    });
  });
});
