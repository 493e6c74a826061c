// The soak shared by tests/integration/soak.test.mjs (1,000 tasks, ASan
// build, LeakSanitizer at exit) and bench/soak.mjs (10,000, Release): one
// worker takes a long stream of tasks of every kind (print, an inline input
// and a CSV artifact, a failure, a timeout), and its resident memory and
// open file descriptors are sampled from /proc as it goes. Both must stay
// flat once it is warm; the worker must exit 0 on SIGTERM with no sanitizer
// report. RSS and fds are compared idle to idle: after the warm-up tasks and
// after the last one.
//
//   const r = await runSoak({ tasks: 1000, log: console.log });
//   r.rss_kb.{start,warm,end,max}, r.fds.{start,warm,end,max}, r.samples, r.problems
import { readFileSync, readdirSync } from "node:fs";

import { startStack } from "./stack.mjs";
import { TERMINAL } from "./client.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function rssKb(pid) {
  const m = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) : NaN;
}
export function fdCount(pid) {
  return readdirSync(`/proc/${pid}/fd`).length;
}

// What task i is: mostly prints, and every path that allocates (inputs,
// artifacts, tracebacks, kills) regularly.
function request(i, taskId) {
  if (i % 100 === 99)
    return { kind: "timeout", req: { taskId, language: "python", code: "import time\ntime.sleep(5)", limits: { timeoutMs: 300 } } };
  if (i % 25 === 7) return { kind: "fail", req: { taskId, language: "python", code: `raise ValueError('soak ${i}')` } };
  if (i % 10 === 3)
    return {
      kind: "artifact",
      req: {
        taskId,
        language: "python",
        code: "d = open('in.csv').read()\nopen('out.csv', 'w').write(d + 'x,' + str(len(d)) + '\\n')\nprint(len(d))",
        files: [{ name: "in.csv", content: Buffer.from(`a,b\n${i},${i * 2}\n`) }],
      },
    };
  return { kind: "print", req: { taskId, language: "python", code: `print(${i})` } };
}

const EXPECTED = { print: "TASK_STATUS_SUCCEEDED", artifact: "TASK_STATUS_SUCCEEDED", fail: "TASK_STATUS_FAILED", timeout: "TASK_STATUS_TIMED_OUT" };

export async function runSoak({ tasks = 1000, concurrency = 2, warmup = 100, window = 50, sampleEvery = 100, env = {}, log = () => {} } = {}) {
  const problems = [];
  const stack = await startStack({ workers: 0 });
  try {
    const w = await stack.addWorker({ concurrency, env });
    const c = stack.client;
    const run = Date.now().toString(36);
    const ids = Array.from({ length: tasks }, (_, i) => `soak-${run}-${i}`);
    const kinds = ids.map((id, i) => request(i, id));
    const samples = [];
    const t0 = Date.now();
    const sample = (done) => {
      const s = { done, rss_kb: rssKb(w.pid), fds: fdCount(w.pid), at_ms: Date.now() - t0 };
      samples.push(s);
      return s;
    };
    // The warm pool's size from /metrics: a zygote being replaced (rotation
    // every local.warm_rotate_after tasks) holds its fds until it is ready.
    const poolSize = async () => {
      const r = await fetch(`${w.monitorUrl}/metrics`);
      const m = /^ci_warm_pool_size (\d+)$/m.exec(await r.text());
      return m ? Number(m[1]) : 0;
    };
    let poolWanted = null; // found at the first idle reading: 0 when cold
    const poolFull = async () => {
      const deadline = Date.now() + 30000;
      let n = await poolSize();
      while (n < (poolWanted ?? 1) && Date.now() < deadline) {
        await sleep(100);
        n = await poolSize();
      }
      if (poolWanted === null) poolWanted = n;
      else if (n < poolWanted) problems.push(`the warm pool stayed at ${n} of ${poolWanted} for 30 s`);
    };
    // Idle: no task queued or running, the warm pool full. The lowest of a
    // few readings, so that a sandbox still being torn down does not count;
    // with a reading to compare with (fdsWanted), readings go on until the
    // fds are down to it, for at most 30 s: on a loaded machine a teardown
    // or a spare in the making holds its fds for a while, a leak for good.
    const idleSample = async (done, fdsWanted = null) => {
      await poolFull();
      await sleep(500);
      let best = null;
      const deadline = Date.now() + 30000;
      for (let k = 0; k < 5 || (fdsWanted !== null && best.fds > fdsWanted && Date.now() < deadline); k++) {
        const s = { done, rss_kb: rssKb(w.pid), fds: fdCount(w.pid), at_ms: Date.now() - t0 };
        if (!best || s.fds < best.fds || (s.fds === best.fds && s.rss_kb < best.rss_kb)) best = s;
        await sleep(200);
      }
      samples.push(best);
      return best;
    };
    const start = await idleSample(0);
    let done = 0;
    const statuses = {};
    const wrong = [];
    const finish = async (i) => {
      const { result } = await c.waitResult(ids[i], 120000);
      statuses[result.status] = (statuses[result.status] ?? 0) + 1;
      if (result.status !== EXPECTED[kinds[i].kind]) wrong.push(`${ids[i]} (${kinds[i].kind}): ${result.status} ${result.error}`);
      done++;
    };
    // Runs tasks [from, to) with at most `window` queued at a time: the
    // worker is never idle, and the measure is of it, not of a backlog.
    const phase = async (from, to) => {
      let next = from;
      const inflight = new Set();
      while (next < to || inflight.size) {
        while (next < to && inflight.size < window) {
          const i = next++;
          await c.submit(kinds[i].req);
          const p = finish(i).finally(() => inflight.delete(p));
          inflight.add(p);
        }
        await Promise.race(inflight);
        if (done % sampleEvery === 0 && samples[samples.length - 1].done !== done) sample(done);
        if (w.crashed()) throw new Error(`the worker died:\n${w.logText().slice(-8000)}`);
      }
    };
    await phase(0, Math.min(warmup, tasks));
    const warm = await idleSample(done);
    log(`warm (idle after ${done} tasks): RSS ${warm.rss_kb} kB, ${warm.fds} fds`);
    await phase(done, tasks);
    const end = await idleSample(tasks, warm.fds);
    const elapsed = Date.now() - t0;
    log(`end (idle after ${tasks} tasks): RSS ${end.rss_kb} kB, ${end.fds} fds (${Math.round((tasks / elapsed) * 10000) / 10} tasks/s)`);
    if (wrong.length) problems.push(`${wrong.length} tasks ended unexpectedly: ${wrong.slice(0, 5).join("; ")}`);
    const x = await w.stop("SIGTERM", 60000);
    if (x.code !== 0) problems.push(`the worker exited ${x.code} (signal ${x.signal}) on SIGTERM`);
    if (/ERROR: (Address|Leak)Sanitizer|runtime error: |SUMMARY: UndefinedBehaviorSanitizer/.test(w.logText()))
      problems.push(`a sanitizer report in the worker's log:\n${w.logText().slice(-8000)}`);
    const after = samples.filter((s) => s.done >= warm.done);
    return {
      tasks,
      concurrency,
      duration_ms: elapsed,
      throughput_per_s: Math.round((tasks / (elapsed / 1000)) * 10) / 10,
      statuses,
      // start, warm and end are idle readings; max is over the busy ones too.
      rss_kb: { start: start.rss_kb, warm: warm.rss_kb, end: end.rss_kb, max: Math.max(...after.map((s) => s.rss_kb)) },
      fds: { start: start.fds, warm: warm.fds, end: end.fds, max: Math.max(...after.map((s) => s.fds)) },
      samples,
      problems,
      terminal: Object.keys(statuses).every((s) => TERMINAL.has(s)),
    };
  } finally {
    await stack.stop();
  }
}
