// The chaos scenario shared by tests/integration/chaos_cluster.test.mjs (sized
// for the test suite) and bench/chaos.mjs (full size): a 3-node JetStream
// cluster on loopback with R3 streams, KV and object store; three workers
// that know all three URLs; small print tasks submitted at a steady rate;
// and, while they run, three faults:
//
//   1. a worker is SIGKILLed while it runs tasks, and a new one started;
//   2. the nats-server leading CI_TASKS is SIGKILLed while workers hold
//      tasks, and restarted on the same store dir once another node leads
//      CI_TASKS (and 5 s have passed);
//   3. a worker is stopped with SIGTERM while it runs tasks (it drains them
//      and exits 0).
//
// Each fault is due at a fraction of the submit time, and then placed when
// the condition it needs holds, however loaded the machine: a worker is
// killed or stopped only while it has a task RUNNING. It is frozen (SIGSTOP)
// first, so that what the results bucket's stream leader says it runs is
// still true when the signal lands; when its tasks ended in between, it goes
// on (SIGCONT) until its next one.
//
// Then every task is checked: exactly one terminal status event on
// ci.status.<id>, a terminal result in KV that matches it (status, worker,
// exit code), the output of its own code, the tasks that were RUNNING on
// the killed worker were redelivered (attempt >= 2) to another, and those
// RUNNING on the stopped worker ended there. The report has the figures for
// the README: tasks, faults, tasks lost, latency.
//
//   const report = await runChaos({ tasks: 1000, rate: 8, log: console.log });
import { AckPolicy, DeliverPolicy } from "@nats-io/jetstream";

import { startCluster } from "./cluster.mjs";
import { startWorker } from "./worker.mjs";
import { connectClient, decodeMessage, proto, RESULTS_BUCKET, TERMINAL } from "./client.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const SANITIZER = /ERROR: (Address|Leak)Sanitizer|runtime error: |SUMMARY: UndefinedBehaviorSanitizer/;

export function percentile(values, p) {
  if (!values.length) return NaN;
  const s = [...values].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))];
}

// Runs fn until it resolves, retrying on errors for at most ms.
async function retrying(fn, ms, what) {
  const deadline = Date.now() + ms;
  for (let i = 0; ; i++) {
    try {
      return await fn();
    } catch (e) {
      if (Date.now() > deadline) throw new Error(`${what}: ${e.message}`);
      await sleep(Math.min(2000, 100 * (i + 1)));
    }
  }
}

export async function runChaos({
  tasks = 1000,
  rate = 8, // tasks submitted per second
  concurrency = 2, // slots per worker
  faults = { killWorkerAt: 0.12, killLeaderAt: 0.35, stopWorkerAt: 0.6 }, // fractions of the submit time
  leaderDownMs = 5000,
  log = () => {},
} = {}) {
  const report = { tasks, rate, faults: [], problems: [] };
  const started = Date.now();
  const cluster = await startCluster({ nodes: 3 });
  const workers = [];
  let client = null;
  const workerOpts = (id) => ({
    natsUrl: cluster.url,
    id,
    concurrency,
    // Its connections carry its id: /connz tells when a killed one is gone.
    nats: { name: id },
    // The smallest ack wait: a killed worker's tasks come back in 5 s.
    jetstream: { replicas: 3, ack_wait_s: 5, max_deliver: 5 },
    worker: { heartbeat_s: 2 },
  });
  try {
    for (const id of ["chaos-a", "chaos-b", "chaos-c"]) workers.push(await startWorker(workerOpts(id)));
    client = await connectClient(cluster.urls);
    log(`cluster and 3 workers up in ${Date.now() - started} ms`);

    const run = Date.now().toString(36);
    const ids = Array.from({ length: tasks }, (_, i) => `chaos-${run}-${i}`);
    const submitAt = new Array(tasks).fill(0);
    const terminalSeen = new Map(); // id -> ms, from a core subscription (progress only)
    // The last event of each task, and how many RUNNING events each worker
    // published: what the faults wait for (hints only, the bucket decides).
    const lastEvent = new Map(); // id -> { status, worker }
    const runningEvents = new Map(); // worker id -> count
    const listeners = new Set();
    const sub = client.nc.subscribe("ci.status.>", {
      callback: (err, m) => {
        if (err || !m.headers) return;
        const st = m.headers.get("Ci-Status");
        const id = m.subject.slice("ci.status.".length);
        if (st && st !== "running") {
          if (!terminalSeen.has(id)) terminalSeen.set(id, Date.now());
          lastEvent.set(id, { status: st });
        } else if (st === "running") {
          let worker = "";
          try {
            worker = decodeMessage(proto().StatusEvent, m.data).value.worker;
          } catch {
            // not ours to judge here: the checks below read every event
          }
          if (!TERMINAL.has(lastEvent.get(id)?.status)) lastEvent.set(id, { status: st, worker });
          runningEvents.set(worker, (runningEvents.get(worker) ?? 0) + 1);
        }
        for (const l of listeners) l();
      },
    });
    // Resolves when pred() holds, checked at each status event; rejects
    // after ms.
    const untilEvent = (pred, ms, what) =>
      new Promise((resolve, reject) => {
        if (pred()) return resolve();
        const done = () => {
          clearTimeout(timer);
          listeners.delete(check);
        };
        const check = () => {
          if (pred()) {
            done();
            resolve();
          }
        };
        const timer = setTimeout(() => {
          done();
          reject(new Error(`${what} within ${ms} ms`));
        }, Math.max(0, ms));
        listeners.add(check);
      });
    // Polls fn (async) until it returns a truthy value, at most ms.
    const until = async (fn, ms, what) => {
      const deadline = Date.now() + ms;
      for (;;) {
        const v = await fn().catch(() => null);
        if (v) return v;
        if (Date.now() > deadline) throw new Error(`${what} within ${ms} ms`);
        await sleep(50);
      }
    };
    // A task's result as the results bucket's stream leader has it (a
    // direct get may be answered by a replica that lags): null when none.
    const leaderResult = async (id) => {
      const m = await client.jsm.streams.getMessage(`KV_${RESULTS_BUCKET}`, { last_by_subj: `$KV.${RESULTS_BUCKET}.${id}` });
      const op = m?.header?.get("KV-Operation");
      if (!m || op === "DEL" || op === "PURGE" || !m.data.length) return null;
      return decodeMessage(proto().ExecutionResult, m.data).value;
    };
    // Waits until worker w has a task RUNNING and freezes it (SIGSTOP): a
    // frozen worker can neither end a task nor start one. Returns, with w
    // still frozen, the tasks the bucket's leader then has RUNNING on w
    // ({ id, attempt }, at least one) and how many tries it took. When its
    // tasks ended between the event and the freeze, lets w go on (SIGCONT)
    // and waits for its next one; at most ms in all.
    const freezeWhileRunning = async (w, ms, what) => {
      const deadline = Date.now() + ms;
      let seen = 0;
      for (let tries = 1; ; tries++) {
        await untilEvent(() => (runningEvents.get(w.id) ?? 0) > seen, deadline - Date.now(), `${what}: no task RUNNING on ${w.id} (${tries - 1} tries)`);
        seen = runningEvents.get(w.id);
        const hinted = [...lastEvent].filter(([, e]) => e.status === "running" && e.worker === w.id).map(([id]) => id);
        if (!w.signal("SIGSTOP")) throw new Error(`${what}: ${w.id} has exited`);
        const held = [];
        try {
          for (const id of hinted) {
            const r = await retrying(() => leaderResult(id), 10000, `get ${id}`);
            if (r && r.status === "TASK_STATUS_RUNNING" && r.worker === w.id) held.push({ id, attempt: r.attempt });
          }
        } catch (e) {
          w.signal("SIGCONT");
          throw e;
        }
        if (held.length) return { held, tries };
        w.signal("SIGCONT");
      }
    };

    // --- submit at a steady rate, retrying through leader elections ---
    const submitMs = (tasks / rate) * 1000;
    const pubs = [];
    const t0 = Date.now();
    let submitting = true;
    const submitter = (async () => {
      for (let i = 0; i < tasks; i++) {
        const due = t0 + (i / rate) * 1000;
        const wait = due - Date.now();
        if (wait > 0) await sleep(wait);
        submitAt[i] = Date.now();
        const req = { taskId: ids[i], language: "python", code: `print(${i})` };
        // Same Nats-Msg-Id on every retry: the stream keeps one copy.
        pubs.push(retrying(() => client.submit(req), 120000, `submit ${ids[i]}`));
      }
      submitting = false;
      await Promise.all(pubs);
    })();

    // --- the faults ---
    const at = (frac) => sleep(Math.max(0, t0 + frac * submitMs - Date.now()));
    const faultScript = (async () => {
      // 1. SIGKILL a worker while it runs tasks; start another.
      await at(faults.killWorkerAt);
      const victim = workers[0];
      const frozen = await freezeWhileRunning(victim, 120000, "fault 1");
      const killAt = Date.now();
      await victim.kill();
      // Anything it sent before it froze (a result on its way) is in once
      // no node has its connection any more: then the tasks it had RUNNING
      // are those still RUNNING there at the same attempt (or taken again
      // since, by another attempt). Those are the tasks killed mid-run.
      await until(
        async () => {
          for (let i = 0; i < cluster.nodes.length; i++) {
            const c = await cluster.connz(i, "?limit=4096");
            if (!c || c.connections?.some((x) => x.name === victim.id)) return false;
          }
          return true;
        },
        30000,
        `fault 1: the connections of ${victim.id} are not gone`,
      );
      const killedMidRun = [];
      const endedFirst = [];
      for (const h of frozen.held) {
        const r = await retrying(() => leaderResult(h.id), 30000, `get ${h.id}`);
        if (r && r.worker === victim.id && r.attempt === h.attempt && TERMINAL.has(r.status)) endedFirst.push(h.id);
        else killedMidRun.push(h.id);
      }
      report.faults.push({ kind: "SIGKILL worker", worker: victim.id, at_ms: killAt - t0, tasks_running: killedMidRun.length, tries: frozen.tries });
      log(`fault 1: SIGKILLed ${victim.id} at ${killAt - t0} ms (try ${frozen.tries}) with ${killedMidRun.length} tasks RUNNING (${killedMidRun.join(", ")})` +
        (endedFirst.length ? `; ${endedFirst.join(", ")} had ended just before` : ""));
      report.killedMidRun = killedMidRun;
      report.killedWorker = victim.id;
      await sleep(1000);
      workers.push(await startWorker(workerOpts("chaos-a2")));

      // 2. SIGKILL the node that leads CI_TASKS while workers hold tasks
      // and tasks are still being submitted; restart it on its store once
      // another node leads CI_TASKS, and not before leaderDownMs.
      await at(faults.killLeaderAt);
      const held = await until(
        async () => {
          const c = await client.jsm.consumers.info("CI_TASKS", "ci-workers");
          return c.num_ack_pending > 0 ? c.num_ack_pending : 0;
        },
        60000,
        "fault 2: no task was held by a worker",
      );
      if (!submitting) report.problems.push("fault 2 came after the last task was submitted: no submit went through the election");
      const si = await retrying(() => client.jsm.streams.info("CI_TASKS"), 30000, "stream info");
      const leader = si.cluster?.leader;
      const node = cluster.node(leader);
      if (!node) throw new Error(`no leader for CI_TASKS: ${JSON.stringify(si.cluster)}`);
      const leaderAt = Date.now();
      await node.kill("SIGKILL");
      log(`fault 2: SIGKILLed nats-server ${leader} (leader of CI_TASKS) at ${leaderAt - t0} ms, ${held} tasks held by workers`);
      const failover = await until(
        async () => {
          const i = await client.jsm.streams.info("CI_TASKS");
          return i.cluster?.leader && i.cluster.leader !== leader ? i.cluster.leader : null;
        },
        60000,
        `fault 2: no node but ${leader} came to lead CI_TASKS`,
      );
      const failoverMs = Date.now() - leaderAt;
      await sleep(Math.max(0, leaderAt + leaderDownMs - Date.now())); // how long the node stays down
      node.start();
      await node.waitHealthy(60000);
      const si2 = await retrying(() => client.jsm.streams.info("CI_TASKS"), 30000, "stream info");
      report.faults.push({ kind: "SIGKILL stream leader", node: leader, at_ms: leaderAt - t0, tasks_held: held, failover_leader: failover, failover_ms: failoverMs, down_ms: Date.now() - leaderAt, new_leader: si2.cluster?.leader });
      log(`         ${failover} led CI_TASKS after ${failoverMs} ms; ${leader} back after ${Date.now() - leaderAt} ms; CI_TASKS leader now ${si2.cluster?.leader}`);

      // 3. SIGTERM a worker while it runs tasks: it drains them (they end
      // there) and exits 0. The signal waits in the frozen worker until
      // SIGCONT.
      await at(faults.stopWorkerAt);
      const w = workers[2];
      const running = await freezeWhileRunning(w, 120000, "fault 3");
      const stopAt = Date.now();
      const stopping = w.stop("SIGTERM", 90000);
      w.signal("SIGCONT");
      const x = await stopping;
      report.faults.push({ kind: "SIGTERM worker", worker: w.id, at_ms: stopAt - t0, tasks_running: running.held.length, tries: running.tries, exit_code: x.code, drain_ms: Date.now() - stopAt });
      log(`fault 3: SIGTERM to ${w.id} at ${stopAt - t0} ms (try ${running.tries}) with ${running.held.length} tasks RUNNING (${running.held.map((h) => h.id).join(", ")}): exit ${x.code} after ${Date.now() - stopAt} ms`);
      if (x.code !== 0) report.problems.push(`${w.id} exited ${x.code} (signal ${x.signal}) after SIGTERM`);
      report.drained = running.held;
      report.drainedWorker = w.id;
    })();

    await Promise.all([submitter, faultScript]);
    log(`submitted ${tasks} tasks in ${Date.now() - t0} ms`);

    // --- wait for every task to end (bounded) ---
    const deadline = Date.now() + 180000;
    while (terminalSeen.size < tasks && Date.now() < deadline) {
      for (const w of workers) if (w.crashed()) throw new Error(`worker ${w.id} died:\n${w.logText().slice(-8000)}`);
      await sleep(500);
    }
    sub.unsubscribe();
    // The core subscription may have missed events while the test's own
    // connection moved off the killed node: KV and the stream decide.
    const kv = await client.kvBucket();
    const results = new Map();
    const readAll = async () => {
      const missing = ids.filter((id) => !results.has(id) || !TERMINAL.has(results.get(id).status));
      for (let i = 0; i < missing.length; i += 50) {
        await Promise.all(
          missing.slice(i, i + 50).map(async (id) => {
            const e = await retrying(() => kv.get(id), 30000, `kv get ${id}`);
            if (e && e.operation === "PUT" && e.value.length) results.set(id, decodeMessage(proto().ExecutionResult, e.value).value);
          }),
        );
      }
      return missing.length;
    };
    await readAll();
    while (ids.some((id) => !TERMINAL.has(results.get(id)?.status)) && Date.now() < deadline) {
      await sleep(1000);
      await readAll();
    }
    const endAt = Date.now();

    // --- every status event of the run, from the stream ---
    const events = new Map(ids.map((id) => [id, []]));
    const ci = await client.jsm.consumers.add("CI_STATUS", {
      ack_policy: AckPolicy.None,
      deliver_policy: DeliverPolicy.All,
      filter_subject: "ci.status.>", // this run's cluster holds only this run's tasks
      inactive_threshold: 120_000_000_000,
      mem_storage: true,
      num_replicas: 1,
    });
    const consumer = await client.js.consumers.get("CI_STATUS", ci.name);
    for (;;) {
      const { num_pending: pending } = await consumer.info();
      if (pending === 0) break;
      const batch = await consumer.fetch({ max_messages: 500, expires: 5000 });
      for await (const m of batch) {
        const id = m.subject.slice("ci.status.".length);
        const ev = decodeMessage(proto().StatusEvent, m.data).value;
        events.get(id)?.push({ status: ev.status, worker: ev.worker, exitCode: ev.exitCode, header: m.headers?.get("Ci-Status"), seq: m.seq });
      }
    }
    await client.jsm.consumers.delete("CI_STATUS", ci.name).catch(() => {});

    // --- checks ---
    const lost = [];
    const wrong = [];
    const terminalCounts = new Map();
    const latencies = [];
    for (let i = 0; i < tasks; i++) {
      const id = ids[i];
      const r = results.get(id);
      const evs = events.get(id);
      const terminal = evs.filter((e) => TERMINAL.has(e.status));
      terminalCounts.set(terminal.length, (terminalCounts.get(terminal.length) ?? 0) + 1);
      if (!r || !TERMINAL.has(r.status)) {
        lost.push(`${id}: result ${r ? r.status : "none"}, events ${evs.map((e) => e.status).join(",") || "none"}`);
        continue;
      }
      if (terminal.length !== 1) wrong.push(`${id}: ${terminal.length} terminal events (${evs.map((e) => e.status).join(",")})`);
      else if (terminal[0].status !== r.status || terminal[0].worker !== r.worker || terminal[0].exitCode !== r.exitCode)
        wrong.push(`${id}: the terminal event (${terminal[0].status}, ${terminal[0].worker}) does not match the result (${r.status}, ${r.worker})`);
      if (r.status !== "TASK_STATUS_SUCCEEDED" || r.stdout !== `${i}\n`)
        wrong.push(`${id}: ${r.status} attempt ${r.attempt} stdout ${JSON.stringify(r.stdout)} error ${JSON.stringify(r.error)}`);
      latencies.push({ i, submitted: submitAt[i], ms: r.finishedAtMs - submitAt[i], attempt: r.attempt });
    }
    const redelivered = [...results.values()].filter((r) => r.attempt >= 2).length;
    const notRedelivered = (report.killedMidRun ?? []).filter((id) => {
      const r = results.get(id);
      return !r || r.attempt < 2 || r.worker === report.killedWorker;
    });
    if (lost.length) report.problems.push(`${lost.length} tasks without a terminal result: ${lost.slice(0, 10).join("; ")}`);
    if (wrong.length) report.problems.push(`${wrong.length} tasks wrong: ${wrong.slice(0, 10).join("; ")}`);
    if (!report.killedMidRun?.length) report.problems.push("no task was RUNNING on the killed worker: fault 1 proved nothing");
    if (notRedelivered.length) report.problems.push(`tasks killed mid-run but not redelivered to another worker: ${notRedelivered.join(", ")}`);
    // The draining worker ended what it ran when SIGTERM came.
    const notDrained = (report.drained ?? []).filter((h) => {
      const r = results.get(h.id);
      return !r || r.worker !== report.drainedWorker || r.attempt !== h.attempt;
    });
    if (!report.drained?.length) report.problems.push("no task was RUNNING on the worker stopped with SIGTERM: fault 3 proved nothing");
    if (notDrained.length) report.problems.push(`tasks RUNNING at SIGTERM that the draining worker did not end: ${notDrained.map((h) => `${h.id} (${results.get(h.id)?.worker} attempt ${results.get(h.id)?.attempt})`).join(", ")}`);
    const ci2 = await client.jsm.consumers.info("CI_TASKS", "ci-workers");
    if (ci2.num_ack_pending !== 0 || ci2.num_pending !== 0) report.problems.push(`the queue is not empty: ${ci2.num_pending} pending, ${ci2.num_ack_pending} unacked`);

    // Latency of all tasks, and of those submitted in the 20 s after each fault.
    const ms = latencies.map((l) => l.ms);
    const windows = report.faults.map((f) => [t0 + f.at_ms, t0 + f.at_ms + 20000]);
    const during = latencies.filter((l) => windows.some(([a, b]) => l.submitted >= a && l.submitted < b)).map((l) => l.ms);
    const duplicates = workers.reduce((n, w) => n + w.events("task.duplicate").length, 0);
    Object.assign(report, {
      duration_ms: endAt - t0,
      tasks_lost: lost.length,
      tasks_wrong: wrong.length,
      terminal_events_per_task: Object.fromEntries(terminalCounts),
      redelivered_tasks: redelivered,
      duplicate_deliveries: duplicates,
      latency_ms: { p50: percentile(ms, 50), p99: percentile(ms, 99), max: Math.max(...ms) },
      latency_during_faults_ms: { n: during.length, p50: percentile(during, 50), p99: percentile(during, 99), max: Math.max(...during) },
      throughput_per_s: Math.round((tasks / ((endAt - t0) / 1000)) * 10) / 10,
    });
    // What the live workers' /metrics say of the run (reconnects after the
    // leader's node went away, tasks by status).
    report.metrics = {};
    for (const w of workers.filter((x) => !x.exited() && x.monitorUrl)) {
      const text = await fetch(`${w.monitorUrl}/metrics`).then((r) => r.text()).catch(() => "");
      const val = (name) => Number((new RegExp(`^${name.replace(/[{}"]/g, "\\$&")} (\\S+)$`, "m").exec(text) ?? [])[1] ?? NaN);
      report.metrics[w.id] = {
        reconnects: val("ci_nats_reconnects_total"),
        succeeded: val('ci_tasks_total{status="succeeded",provider="local"}'),
        retries: val('ci_task_deliveries_total{outcome="retry"}'),
        duplicates: val('ci_task_deliveries_total{outcome="duplicate"}'),
      };
    }
    for (const w of workers) {
      if (SANITIZER.test(w.logText())) report.problems.push(`worker ${w.id}: a sanitizer report in its log`);
    }
    return report;
  } finally {
    if (client) await client.close();
    for (const w of workers) {
      if (!w.exited()) {
        const x = await w.stop("SIGTERM", 90000).catch((e) => ({ error: e }));
        if (x.error || x.code !== 0) report.problems.push(`worker ${w.id} did not exit 0 on SIGTERM at the end: ${x.error?.message ?? `code ${x.code}`}`);
        if (SANITIZER.test(w.logText())) report.problems.push(`worker ${w.id}: a sanitizer report in its log`);
      }
      await w.cleanup().catch(() => {});
    }
    await cluster.stop();
  }
}
