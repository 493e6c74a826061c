// The latency and throughput benchmark of the service, against a baseline of
// the same run: bare `/usr/bin/python3 script.py`, no broker, no sandbox.
//
//   bench/run.sh [--n 30] [--modes cold,warm] [--fanout 1000] [--fanout-cold 100]
//                [--soak 0] [--gap 0] [--concurrency 0] [--spares 0] [--bursts 10]
//                [--sessions 10] [--mcp 30] [--live 30] [--batch 0] [--batch-rounds 2]
//                [--batch-progress] [--out FILE]
//
// For each scenario (print(1); a pandas groupby over an inline 1,000-row CSV;
// a matplotlib PNG) it also measures the floor of any fork-based warm start on
// this machine: a python3 that imported the runtime forks one child per run
// (no sandbox, no broker), and that floor's throughput for the pandas task
// with one forking python3 and with as many as the worker has slots (the
// most any fork-per-task design could reach here). Then it measures submit -> terminal status event through NATS,
// N times one after the other (--gap MS: with that pause before each, an
// agent's think time; 0: back to back), and reports p50/p95/p99 and their ratio to the
// baseline's; then a fan-out of pandas tasks published at once (throughput
// with the worker's default concurrency, one slot per CPU, or --concurrency N: --fanout in warm mode, --fanout-cold in cold
// mode, where each task costs ~1 s), the worker's RSS before and after, and in
// warm mode the memory of the zygote and of one warm child (PSS and USS from
// /proc/<pid>/smaps_rollup while the child runs a pandas task that then
// sleeps). --soak N then runs N more print(1) tasks in warm mode and reports
// the worker's RSS after them (flat RSS over 10,000 tasks: --soak 10000). Every service
// task runs with local.isolation required, in the mode named, and the bench
// checks that the mode really ran. Results go to stdout as a table and to
// bench/results/latest.json. --bursts R (warm mode) then measures R bursts,
// 1 s apart, of as many pandas tasks at once as the worker has slots: what
// agents calling in parallel see (--spares N: local.warm_spares, 0 = auto).
// --sessions S runs S five-step sessions (docs/contract.md §16) that keep a
// 1,000-row DataFrame between steps, and compares each step's latency with
// the one-shot pandas task's of the same run. --mcp N (warm mode) times N
// run_python calls through `ci mcp` (the official MCP SDK as the client)
// against N `ci run` of the same code. --live N (warm mode) measures live
// output (docs/contract.md §19): N tasks that print 1 MiB - in 16,384 flushed
// prints of 64 bytes, and in one write - on a worker that publishes it live,
// the same with a client subscribed to the task's chunks, and on a worker with
// jetstream.live_output false; the three run in turn, each on its own server,
// so that the machine's drift falls on all alike. --batch N (warm mode) runs
// N print(1) tasks as one batch on the batch lane (§20, §21), first publish
// to the batch's complete event, against N print(1) tasks on the interactive
// lane, first publish to the last terminal event, on one worker:
// --batch-rounds R (2) rounds of both, in alternating order.
// --batch-progress adds a batch with `ci batch status B --json` run every
// second meanwhile (as a person watching would).
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { cpus as osCpus, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";

import { execFile } from "node:child_process";
import { promisify } from "node:util";

import { startStack } from "../tests/integration/lib/stack.mjs";
import { mcpClient } from "../tests/integration/lib/mcp.mjs";
import { CLI_BIN } from "../tests/integration/lib/worker.mjs";
import { newTaskId, runTask } from "../tests/integration/lib/client.mjs";

const { values: args } = parseArgs({
  options: {
    n: { type: "string", default: "30" },
    fanout: { type: "string", default: "1000" },
    "fanout-cold": { type: "string", default: "100" },
    modes: { type: "string", default: "cold,warm" },
    soak: { type: "string", default: "0" },
    gap: { type: "string", default: "0" },
    concurrency: { type: "string", default: "0" },
    spares: { type: "string", default: "0" },
    bursts: { type: "string", default: "10" },
    sessions: { type: "string", default: "10" },
    mcp: { type: "string", default: "30" },
    live: { type: "string", default: "30" },
    batch: { type: "string", default: "0" },
    "batch-rounds": { type: "string", default: "2" },
    "batch-progress": { type: "boolean", default: false },
    out: { type: "string", default: join(new URL(".", import.meta.url).pathname, "results", "latest.json") },
  },
});
const N = Number(args.n);
const FANOUT = { warm: Number(args.fanout), cold: Number(args["fanout-cold"]) };
const SOAK = Number(args.soak);
const GAP_MS = Number(args.gap);
// The worker's worker.concurrency: 0 = its default, one slot per online CPU.
const CONCURRENCY = Number(args.concurrency);
const SLOTS = CONCURRENCY > 0 ? CONCURRENCY : osCpus().length;
const SPARES = Number(args.spares);
const BURSTS = Number(args.bursts);
const SESSIONS = Number(args.sessions);
const MCP_CALLS = Number(args.mcp);
const LIVE = Number(args.live);
const BATCH = Number(args.batch);
const BATCH_ROUNDS = Math.max(1, Number(args["batch-rounds"]));
const BATCH_PROGRESS = args["batch-progress"];
const FLOOR_FANOUT = 60; // pandas runs per forking process in the floor's throughput

const csv = ["day,region,units,price"];
for (let i = 0; i < 1000; i++) csv.push(`${i % 28},${["N", "S", "E", "W"][i % 4]},${(i * 7) % 13},${(i % 9) + 0.5}`);
const CSV = Buffer.from(csv.join("\n") + "\n");

const SCENARIOS = {
  print: { code: "print(1)\n", files: [] },
  pandas: {
    code:
      "import pandas as pd\n" +
      "df = pd.read_csv('data.csv')\n" +
      "df['revenue'] = df['units'] * df['price']\n" +
      "print(df.groupby('region')['revenue'].sum().to_string())\n",
    files: [{ name: "data.csv", content: CSV }],
  },
  matplotlib: {
    code:
      "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n" +
      "fig, ax = plt.subplots()\nax.plot([1, 3, 2, 4])\nfig.savefig('plot.png')\nplt.close(fig)\n",
    files: [],
  },
};

// A five-step analysis as an agent runs it in a session (docs/contract.md
// §16): the 1,000-row CSV is read once, later steps use the DataFrame.
const SESSION_STEPS = [
  { code: "import pandas as pd\ndf = pd.read_csv('data.csv')\nprint(len(df))\n", files: [{ name: "data.csv", content: CSV }] },
  { code: "df['revenue'] = df['units'] * df['price']\nprint(df['revenue'].sum())\n" },
  { code: "by = df.groupby('region')['revenue'].sum()\nprint(by.to_string())\n" },
  { code: "top = df.nlargest(5, 'revenue')\nprint(top.to_string())\n" },
  { code: "print(by.idxmax(), round(df['revenue'].mean(), 2))\n" },
];

function pct(sorted, p) {
  if (!sorted.length) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i];
}
function stats(ms) {
  const s = [...ms].sort((a, b) => a - b);
  return { n: s.length, p50: pct(s, 50), p95: pct(s, 95), p99: pct(s, 99), min: s[0], max: s[s.length - 1] };
}
const round = (x) => Math.round(x * 10) / 10;
const round2 = (x) => Math.round(x * 100) / 100;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function baseline(name) {
  const sc = SCENARIOS[name];
  const dir = mkdtempSync(join(tmpdir(), "ci-bench-"));
  writeFileSync(join(dir, "script.py"), sc.code);
  for (const f of sc.files) writeFileSync(join(dir, f.name), f.content);
  const env = { PATH: "/usr/bin:/bin", HOME: dir, MPLCONFIGDIR: join(dir, ".mpl"), MPLBACKEND: "Agg" };
  const ms = [];
  for (let i = 0; i < N + 1; i++) {
    const t0 = process.hrtime.bigint();
    const r = spawnSync("/usr/bin/python3", ["script.py"], { cwd: dir, env, stdio: "ignore" });
    const t = Number(process.hrtime.bigint() - t0) / 1e6;
    if (r.status !== 0) throw new Error(`baseline ${name} failed: ${r.status}`);
    if (i > 0) ms.push(t); // the first run warms the page cache
  }
  rmSync(dir, { recursive: true, force: true });
  return stats(ms);
}

// The fork floor: one python3 imports numpy, pandas, matplotlib (Agg) and
// openpyxl, freezes its heap, then forks a child per run of each scenario
// and waits for it; times fork to exit, in ms.
function forkFloor() {
  const dir = mkdtempSync(join(tmpdir(), "ci-bench-"));
  for (const sc of Object.values(SCENARIOS)) for (const f of sc.files) writeFileSync(join(dir, f.name), f.content);
  const script = `
import gc, json, os, sys, time
import numpy, pandas, matplotlib, matplotlib.pyplot, openpyxl
gc.collect(); gc.freeze()
codes = json.loads(sys.stdin.read())
out = {}
for name, code in codes.items():
    ms = []
    for i in range(${N + 1}):
        t0 = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1)
            exec(compile(code, "main.py", "exec"), {"__name__": "__main__"})
            sys.stdout.flush()
            os._exit(0)
        _, st = os.waitpid(pid, 0)
        if st:
            raise SystemExit("fork floor %s failed: %d" % (name, st))
        if i:
            ms.append((time.perf_counter() - t0) * 1000)
    out[name] = ms
# Throughput: P processes like this one (forks of it) each fork a child per
# pandas run, ${FLOOR_FANOUT} runs each, at the same time.
def drive(runs):
    for _ in range(runs):
        pid = os.fork()
        if pid == 0:
            fd = os.open(os.devnull, os.O_WRONLY)
            os.dup2(fd, 1)
            exec(compile(codes["pandas"], "main.py", "exec"), {"__name__": "__main__"})
            sys.stdout.flush()
            os._exit(0)
        if os.waitpid(pid, 0)[1]:
            os._exit(1)
tput = {}
for procs in sorted({1, ${SLOTS}}):
    t0 = time.perf_counter()
    kids = []
    for _ in range(procs):
        pid = os.fork()
        if pid == 0:
            drive(${FLOOR_FANOUT})
            os._exit(0)
        kids.append(pid)
    for pid in kids:
        if os.waitpid(pid, 0)[1]:
            raise SystemExit("fork floor throughput failed")
    tput[str(procs)] = procs * ${FLOOR_FANOUT} / (time.perf_counter() - t0)
print(json.dumps({"latency": out, "tasks_per_s": tput}))
`;
  const env = { PATH: "/usr/bin:/bin", HOME: dir, MPLCONFIGDIR: join(dir, ".mpl"), MPLBACKEND: "Agg", OPENBLAS_NUM_THREADS: "1" };
  const codes = Object.fromEntries(Object.entries(SCENARIOS).map(([k, sc]) => [k, sc.code]));
  const r = spawnSync("/usr/bin/python3", ["-c", script], { cwd: dir, env, input: JSON.stringify(codes), encoding: "utf8" });
  rmSync(dir, { recursive: true, force: true });
  if (r.status !== 0) throw new Error(`fork floor failed: ${r.stderr}`);
  const got = JSON.parse(r.stdout);
  const floor = Object.fromEntries(Object.entries(got.latency).map(([k, ms]) => [k, stats(ms)]));
  return { floor, throughput: Object.fromEntries(Object.entries(got.tasks_per_s).map(([k, v]) => [k, round(v)])) };
}

// Submits one task; resolves with the time to its terminal event.
async function once(client, name, terminal, extra = {}) {
  const sc = SCENARIOS[name] ?? { code: name, files: [] };
  const taskId = extra.taskId ?? newTaskId("b");
  const done = new Promise((resolve) => terminal.set(taskId, resolve));
  const t0 = process.hrtime.bigint();
  await client.submit({ taskId, language: "python", code: sc.code, files: sc.files, ...extra });
  const status = await done;
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  if (status !== "succeeded") throw new Error(`task ${taskId} (${String(name).slice(0, 40)}) ended ${status}`);
  return ms;
}

function rssKiB(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) : NaN;
}

// Rss, Pss and Uss (private clean + dirty) of a process, in KiB.
function memoryOf(pid) {
  const text = readFileSync(`/proc/${pid}/smaps_rollup`, "utf8");
  const field = (k) => Number((new RegExp(`^${k}:\\s+(\\d+) kB`, "m").exec(text) ?? [0, NaN])[1]);
  return { rss_kib: field("Rss"), pss_kib: field("Pss"), uss_kib: field("Private_Clean") + field("Private_Dirty") };
}

// pid -> [child pids], from /proc/*/stat.
function processTree() {
  const kids = new Map();
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, "utf8");
      const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
      if (!kids.has(ppid)) kids.set(ppid, []);
      kids.get(ppid).push(Number(d));
    } catch {
      // gone meanwhile
    }
  }
  return kids;
}

// Session id of a process (our namespace's pid), or -1.
function sessionOf(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[3]);
  } catch {
    return -1;
  }
}

// While a warm task runs (pandas, then a sleep): the worker's zygotes are
// its children running ci-zygote, a task's init is a zygote's child and the
// task is that init's child, in a session of its own (beside it, its keeper,
// which shares its memory); a zygote's spare is an init with one child, its
// task process (warm, waiting) still in the zygote's session.
async function warmMemory(client, workerPid, terminal) {
  const code = SCENARIOS.pandas.code + "import time\ntime.sleep(4)\n";
  const running = once(client, code, terminal, { files: SCENARIOS.pandas.files, limits: { timeoutMs: 30000 } });
  let found = null;
  for (let i = 0; i < 100 && !found; i++) {
    await sleep(100);
    const tree = processTree();
    for (const z of tree.get(workerPid) ?? []) {
      let cmd = "";
      try {
        cmd = readFileSync(`/proc/${z}/cmdline`, "utf8");
      } catch {
        continue;
      }
      if (!cmd.startsWith("ci-zygote")) continue;
      let spare = null;
      for (const init of tree.get(z) ?? []) {
        // A running task's init has the task (a session leader) and its
        // keeper (same memory, same session); a spare's, one child.
        const kids = tree.get(init) ?? [];
        const task = kids.find((k) => sessionOf(k) === k);
        if (task) found = { zygote: z, init, task };
        else if (kids.length === 1) spare = kids[0];
      }
      if (found) found.spare = spare;
    }
  }
  if (!found) throw new Error("no warm child found under the worker");
  await sleep(1500); // the pandas part is done, the task sleeps
  const out = { zygote: memoryOf(found.zygote), init: memoryOf(found.init), child: memoryOf(found.task) };
  if (found.spare) {
    try {
      out.spare = memoryOf(found.spare);
    } catch {
      // taken meanwhile
    }
  }
  await running;
  return out;
}

async function service(mode, base) {
  const stack = await startStack({
    workers: 1,
    worker: { concurrency: CONCURRENCY, local: { isolation: "required", mode, warm_spares: SPARES } },
  });
  const out = { mode, scenarios: {}, session: null, mcp: null, burst: null, fanout: null, rss_kib: {}, memory: null, soak: null };
  try {
    const client = stack.client;
    const w = stack.workers[0];
    // The mode really ran: a warm task finds pandas imported.
    const { result: probe } = await runTask(client, { code: "import sys\nprint('pandas' in sys.modules)\n" });
    if (probe.stdout !== (mode === "warm" ? "True\n" : "False\n") || probe.isolation === "none")
      throw new Error(`the worker does not run tasks ${mode} in the sandbox: ${JSON.stringify(probe)}\n${w.logText().slice(-3000)}`);
    out.isolation = probe.isolation;
    const terminal = new Map();
    const sub = client.nc.subscribe("ci.status.>");
    (async () => {
      for await (const m of sub) {
        const st = m.headers?.get("Ci-Status");
        const id = m.headers?.get("Ci-Task-Id");
        if (st && st !== "running" && terminal.has(id)) {
          terminal.get(id)(st);
          terminal.delete(id);
        }
      }
    })();
    out.rss_kib.start = rssKiB(w.pid);
    for (const name of Object.keys(SCENARIOS)) {
      await once(client, name, terminal); // warm-up
      const ms = [];
      for (let i = 0; i < N; i++) {
        if (GAP_MS > 0) await sleep(GAP_MS);
        ms.push(await once(client, name, terminal));
      }
      const s = stats(ms);
      out.scenarios[name] = { ...s, ratio_p50: s.p50 / base[name].p50, ratio_p99: s.p99 / base[name].p99 };
    }
    if (SESSIONS > 0) {
      // Each step's end-to-end latency, against a one-shot pandas task (read
      // the CSV, compute, print) of the same run and mode.
      const ms = [];
      const first = [];
      for (let i = 0; i <= SESSIONS; i++) {
        const sessionId = newTaskId("bs");
        for (const [k, st] of SESSION_STEPS.entries()) {
          if (GAP_MS > 0) await sleep(GAP_MS);
          const t = await once(client, st.code, terminal, { sessionId, files: st.files ?? [] });
          if (i === 0) continue; // warm-up
          ms.push(t);
          if (k === 0) first.push(t);
        }
      }
      const s = stats(ms);
      const oneShot = out.scenarios.pandas;
      out.session = { sessions: SESSIONS, steps: SESSION_STEPS.length, ...s, first_step_p50: stats(first).p50,
                      one_shot_p50: oneShot.p50, one_shot_p99: oneShot.p99,
                      ratio_p50: s.p50 / oneShot.p50, ratio_p99: s.p99 / oneShot.p99 };
    }
    if (mode === "warm" && MCP_CALLS > 0) {
      // What an agent's call costs through `ci mcp` (one process, one NATS
      // connection, the SDK's JSON-RPC) against `ci run` (a process per call),
      // print(1), one after the other, each measured by its caller.
      const dir = mkdtempSync(join(tmpdir(), "ci-bench-mcp-"));
      writeFileSync(join(dir, "p.py"), "print(1)\n");
      const runOnce = promisify(execFile);
      const cli = [];
      for (let i = 0; i <= MCP_CALLS; i++) {
        const t0 = process.hrtime.bigint();
        await runOnce(CLI_BIN, ["run", "--no-save", "--url", stack.server.url, "p.py"], { cwd: dir });
        if (i) cli.push(Number(process.hrtime.bigint() - t0) / 1e6);
      }
      const { client: mc } = await mcpClient(stack.server.url, dir);
      const viaMcp = [];
      for (let i = 0; i <= MCP_CALLS; i++) {
        const t0 = process.hrtime.bigint();
        const r = await mc.callTool({ name: "run_python", arguments: { code: "print(1)" } });
        if (r.isError) throw new Error(`ci mcp: ${JSON.stringify(r.content)}`);
        if (i) viaMcp.push(Number(process.hrtime.bigint() - t0) / 1e6);
      }
      await mc.close();
      rmSync(dir, { recursive: true, force: true });
      const a = stats(cli), m = stats(viaMcp);
      out.mcp = { calls: MCP_CALLS, ci_run: a, ci_mcp: m, overhead_p50_ms: m.p50 - a.p50, ratio_p50: m.p50 / a.p50 };
    }
    if (mode === "warm" && BURSTS > 0) {
      const ms = [];
      for (let i = 0; i < BURSTS; i++) {
        await sleep(1000);
        ms.push(...(await Promise.all(Array.from({ length: SLOTS }, () => once(client, "pandas", terminal)))));
      }
      const s = stats(ms);
      out.burst = { tasks: SLOTS, rounds: BURSTS, ...s, ratio_p50: s.p50 / base.pandas.p50 };
    }
    const fan = FANOUT[mode] ?? FANOUT.warm;
    if (fan > 0) {
      const t0 = process.hrtime.bigint();
      await Promise.all(Array.from({ length: fan }, () => once(client, "pandas", terminal)));
      const secs = Number(process.hrtime.bigint() - t0) / 1e9;
      out.fanout = { tasks: fan, seconds: round(secs), tasks_per_s: round(fan / secs) };
    }
    out.rss_kib.end = rssKiB(w.pid);
    if (mode === "warm") out.memory = await warmMemory(client, w.pid, terminal);
    if (SOAK > 0 && mode === "warm") {
      const before = rssKiB(w.pid);
      const t0 = process.hrtime.bigint();
      for (let done = 0; done < SOAK; done += 50)
        await Promise.all(Array.from({ length: Math.min(50, SOAK - done) }, () => once(client, "print", terminal)));
      const secs = Number(process.hrtime.bigint() - t0) / 1e9;
      out.soak = { tasks: SOAK, seconds: round(secs), rss_kib_before: before, rss_kib_after: rssKiB(w.pid) };
    }
    sub.unsubscribe();
  } finally {
    await stack.stop();
  }
  return out;
}

// Tasks that print 1 MiB (contract §19 measures them): many small flushed
// writes, each a write(2) the worker reads and coalesces, and one big write.
const LIVE_SCENARIOS = {
  "1 MiB in 16,384 flushed prints of 64 bytes": "for _ in range(16384):\n    print('y' * 63, flush=True)\n",
  "1 MiB in one write": "import sys\nsys.stdout.write('x' * (1 << 20))\n",
};

// Watches one stack's terminal events; returns a map task id -> resolve.
function terminalWatch(client) {
  const terminal = new Map();
  const sub = client.nc.subscribe("ci.status.>");
  (async () => {
    for await (const m of sub) {
      const st = m.headers?.get("Ci-Status");
      const id = m.headers?.get("Ci-Task-Id");
      if (st && st !== "running" && terminal.has(id)) {
        terminal.get(id)(st);
        terminal.delete(id);
      }
    }
  })();
  return { terminal, stop: () => sub.unsubscribe() };
}

// Submit -> terminal event of a task printing 1 MiB with live output on, on
// with a subscriber to its chunks (a client showing them, as `ci run` will),
// and off; LIVE times each (after one warm-up round), in a fresh random
// order every round. Each runs on a server and worker of its own ("on" and
// "subscribed" share one); a second worker with live output off ("off 2")
// measures what two identical setups differ by on this machine: a ratio
// within that is no cost at all.
async function liveOutput() {
  const local = { isolation: "required", mode: "warm", warm_spares: SPARES };
  const stacks = {
    on: await startStack({ workers: 1, worker: { concurrency: 1, local } }),
    off: await startStack({ workers: 1, worker: { concurrency: 1, local, jetstream: { live_output: false } } }),
    off2: await startStack({ workers: 1, worker: { concurrency: 1, local, jetstream: { live_output: false } } }),
  };
  const VARIANTS = { on: "on", subscribed: "on", off: "off", off2: "off2" }; // variant -> stack
  const out = { n: LIVE, scenarios: {} };
  const watches = Object.fromEntries(Object.entries(stacks).map(([k, st]) => [k, terminalWatch(st.client)]));
  try {
    // The code's own wall time (the result's usage.durationMs), read after
    // the clock stopped: whether live output slows the task itself.
    const codeMs = async (client, taskId) => Number((await client.getResult(taskId)).result.usage.durationMs);
    const run = async (variant, code, name) => {
      const st = stacks[VARIANTS[variant]];
      const taskId = newTaskId("bl");
      let sub = null, bytes = 0;
      if (variant === "subscribed") {
        // The terminal event comes after every chunk (§19): by then the
        // subscriber has all of them.
        sub = st.client.nc.subscribe(`ci.out.${taskId}.>`, { callback: (err, m) => { if (!err) bytes += m.data.length; } });
        await st.client.nc.flush();
      }
      const ms = await once(st.client, code, watches[VARIANTS[variant]].terminal, { taskId });
      if (sub) {
        sub.unsubscribe();
        if (bytes !== 1 << 20) throw new Error(`the subscriber got ${bytes} bytes of ${name}, not 1 MiB`);
      }
      return { ms, code: await codeMs(st.client, taskId) };
    };
    for (const [name, code] of Object.entries(LIVE_SCENARIOS)) {
      const ms = Object.fromEntries(Object.keys(VARIANTS).map((v) => [v, []]));
      const code_ms = Object.fromEntries(Object.keys(VARIANTS).map((v) => [v, []]));
      for (let i = 0; i <= LIVE; i++) {
        const order = Object.keys(VARIANTS).sort(() => Math.random() - 0.5);
        for (const v of order) {
          const r = await run(v, code, name);
          if (i === 0) continue; // warm-up
          ms[v].push(r.ms);
          code_ms[v].push(r.code);
        }
      }
      const st = Object.fromEntries(Object.entries(ms).map(([v, x]) => [v, stats(x)]));
      const cs = Object.fromEntries(Object.entries(code_ms).map(([v, x]) => [v, stats(x)]));
      const ratios = (s) => Object.fromEntries(["on", "subscribed", "off2"].map((v) => [v, s[v].p50 / s.off.p50]));
      out.scenarios[name] = { ...st, code: cs, ratio_p50: ratios(st), code_ratio_p50: ratios(cs) };
    }
  } finally {
    for (const w of Object.values(watches)) w.stop();
    for (const st of Object.values(stacks)) await st.stop();
  }
  return out;
}

// A batch of BATCH print(1) tasks, from the first publish to its complete
// event, against as many print(1) tasks on the interactive lane (ci.submit),
// from the first publish to the last one's terminal event, on the same
// worker: BATCH_ROUNDS rounds of both, their order alternating, so that the
// machine's drift falls on both lanes alike. With --batch-progress, one more
// batch with `ci batch status B --json` run every second meanwhile (which
// must say the batch's true counts at the end).
async function batchThroughput() {
  const local = { isolation: "required", mode: "warm", warm_spares: SPARES };
  // concurrency 0: the worker's default, one slot per CPU, as in service()
  // (left out, the test harness's default of one slot would apply).
  const st = await startStack({ workers: 1, worker: { concurrency: CONCURRENCY, local } });
  const c = st.client;
  const execP = promisify(execFile);
  const env = { ...process.env, CI_NATS_URL: st.server.url };
  const watch = terminalWatch(c);
  // CPU seconds of the nats-server and of the worker process itself (not
  // the sandboxes: the same code runs on both lanes), from /proc.
  const cpuS = (pid) => {
    const f = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1].split(" ");
    return (Number(f[11]) + Number(f[12])) / 100; // utime + stime, clock ticks
  };
  const cpu = () => ({ server: cpuS(st.server.pid), worker: cpuS(st.workers[0].pid) });
  // What the worker sends NATS, counted by kind from copies (a core
  // subscription gets every message on these subjects): pull requests,
  // other JetStream API requests (infos, gets, direct gets), KV writes,
  // status and batch events, acks. Noise-free, unlike the clock.
  const sent = { pulls: 0, api: 0, kv: 0, events: 0, acks: 0 };
  const kinds = [["$JS.API.CONSUMER.MSG.NEXT.>", "pulls"], ["$JS.API.>", "api"], ["$KV.>", "kv"], ["ci.status.>", "events"], ["ci.batches.>", "events"], ["$JS.ACK.>", "acks"]];
  const counters = kinds.map(([subj, kind]) => c.nc.subscribe(subj, { callback: (err, m) => {
    if (err) return;
    if (kind === "api" && m.subject.startsWith("$JS.API.CONSUMER.MSG.NEXT.")) return; // counted as a pull
    sent[kind]++;
  } }));
  const measured = async (n, fn) => {
    await c.nc.flush();
    const c0 = cpu();
    const s0 = { ...sent };
    const x = await fn();
    const c1 = cpu();
    const per = Object.fromEntries(Object.keys(sent).map((k) => [k, round2((sent[k] - s0[k]) / n)]));
    return { ...x, server_cpu_ms_per_task: round2(((c1.server - c0.server) * 1000) / n), worker_cpu_ms_per_task: round2(((c1.worker - c0.worker) * 1000) / n), sent_per_task: per };
  };
  const publishAll = async (n, publish) => {
    for (let i = 0; i < n; i += 200)
      await Promise.all(Array.from({ length: Math.min(200, n - i) }, (_, k) => publish(i + k + 1)));
  };
  const one = async (poll, n = BATCH) => {
    const b = newTaskId(poll ? "bbp" : "bbn");
    const complete = c.nc.subscribe(`ci.batches.${b}.complete`, { max: 1 });
    await c.nc.flush();
    const t0 = performance.now();
    let polls = 0, stop = false, last = null;
    const poller = poll ? (async () => {
      while (!stop) {
        const next = performance.now() + 1000;
        const r = await execP(CLI_BIN, ["batch", "status", b, "--json"], { env }).catch((e) => e);
        if (r.stdout) last = JSON.parse(r.stdout);
        polls++;
        const wait = next - performance.now();
        if (wait > 0) await new Promise((res) => setTimeout(res, wait));
      }
    })() : null;
    await publishAll(n, (k) => c.submit({ language: "python", code: "print(1)", taskId: `${b}-${k}`, batchId: b }, { json: true, subject: `ci.batch.${b}` }));
    await c.js.publish(`ci.batches.${b}.sealed`, JSON.stringify({ total: String(n) }), { msgID: `${b}.sealed`, timeout: 10000 });
    for await (const m of complete) break;
    const seconds = (performance.now() - t0) / 1000;
    stop = true;
    await poller;
    const r = await execP(CLI_BIN, ["batch", "status", b, "--json"], { env });
    last = JSON.parse(r.stdout);
    if (last.succeeded !== n || last.total !== n || last.running !== 0) throw new Error(`batch ${b}: ${r.stdout}`);
    return { seconds: round(seconds), tasks_per_s: round(n / seconds), polls };
  };
  const interactive = async (n = BATCH) => {
    const tag = newTaskId("bbi");
    const done = [];
    const t0 = performance.now();
    await publishAll(n, (k) => {
      const taskId = `${tag}-${k}`;
      done.push(new Promise((resolve) => watch.terminal.set(taskId, resolve)));
      return c.submit({ language: "python", code: "print(1)", taskId }, { json: true });
    });
    const ends = await Promise.all(done);
    const seconds = (performance.now() - t0) / 1000;
    const bad = ends.filter((s) => s !== "succeeded").length;
    if (bad) throw new Error(`${bad} interactive tasks did not succeed`);
    return { seconds: round(seconds), tasks_per_s: round(n / seconds) };
  };
  try {
    await one(false, Math.min(BATCH, 200)); // warm-up: the spares, the streams
    await interactive(Math.min(BATCH, 200));
    const runs = { batch: [], interactive: [] };
    for (let i = 0; i < BATCH_ROUNDS; i++) {
      const b = () => measured(BATCH, () => one(false));
      const it = () => measured(BATCH, () => interactive());
      if (i % 2 === 0) {
        runs.batch.push(await b());
        runs.interactive.push(await it());
      } else {
        runs.interactive.push(await it());
        runs.batch.push(await b());
      }
    }
    const mean = (xs) => xs.reduce((a, x) => a + x.tasks_per_s, 0) / xs.length;
    const out = { n: BATCH, slots: SLOTS, ...runs, ratio: mean(runs.batch) / mean(runs.interactive) };
    if (BATCH_PROGRESS) {
      out.with_progress = await one(true);
      out.progress_ratio = out.with_progress.tasks_per_s / mean(runs.batch);
    }
    return out;
  } finally {
    for (const sub of counters) sub.unsubscribe();
    watch.stop();
    await st.stop();
  }
}

const base = {};
for (const name of Object.keys(SCENARIOS)) base[name] = baseline(name);
const { floor, throughput: floorTput } = forkFloor();
const results = {
  date: new Date().toISOString(),
  n: N,
  cpus: osCpus().length,
  gap_ms: GAP_MS,
  loadavg_start: loadavg(),
  baseline: base,
  fork_floor: floor,
  fork_floor_tasks_per_s: floorTput,
  concurrency: SLOTS,
  modes: [],
};
for (const mode of args.modes.split(",")) results.modes.push(await service(mode, base));
if (LIVE > 0 && args.modes.split(",").includes("warm")) results.live_output = await liveOutput();
if (BATCH > 0 && args.modes.split(",").includes("warm")) results.batch = await batchThroughput();
results.loadavg_end = loadavg();

const kib = (k) => `${round(k / 1024)} MiB`;
console.log(`\nbaseline: bare /usr/bin/python3 script.py (n=${N})`);
console.log("scenario     p50 ms   p95 ms   p99 ms");
const row = (k, s) => `${k.padEnd(12)} ${String(round(s.p50)).padStart(6)} ${String(round(s.p95)).padStart(8)} ${String(round(s.p99)).padStart(8)}`;
for (const [k, s] of Object.entries(base)) console.log(row(k, s));
console.log(`\nfork floor: a python3 with the runtime imported forks a child per run (no sandbox, no NATS)`);
console.log("scenario     p50 ms   p95 ms   p99 ms");
for (const [k, s] of Object.entries(floor)) console.log(row(k, s));
console.log(`its throughput, pandas: ${Object.entries(floorTput).map(([p, v]) => `${v} tasks/s with ${p} forking process${p === "1" ? "" : "es"}`).join(", ")}`);
for (const m of results.modes) {
  console.log(`\nservice, ${m.mode} mode: submit -> terminal event through NATS (n=${N}${GAP_MS ? `, ${GAP_MS} ms apart` : ", back to back"}, isolation ${m.isolation})`);
  console.log("scenario     p50 ms   p95 ms   p99 ms   p50/baseline  p99/baseline");
  for (const [k, s] of Object.entries(m.scenarios))
    console.log(`${row(k, s)} ${s.ratio_p50.toFixed(3).padStart(12)}x ${s.ratio_p99.toFixed(3).padStart(12)}x`);
  if (m.session)
    console.log(`session steps: ${m.session.sessions} sessions x ${m.session.steps} steps (a 1,000-row DataFrame kept between steps): ` +
                `p50 ${round(m.session.p50)} ms, p99 ${round(m.session.p99)} ms; one-shot pandas task p50 ${round(m.session.one_shot_p50)} ms, ` +
                `p99 ${round(m.session.one_shot_p99)} ms: ${m.session.ratio_p50.toFixed(3)}x (p50), ${m.session.ratio_p99.toFixed(3)}x (p99); first step p50 ${round(m.session.first_step_p50)} ms`);
  if (m.mcp)
    console.log(`ci mcp: ${m.mcp.calls} run_python print(1) calls: p50 ${round(m.mcp.ci_mcp.p50)} ms, p99 ${round(m.mcp.ci_mcp.p99)} ms; ` +
                `ci run (a process per call): p50 ${round(m.mcp.ci_run.p50)} ms, p99 ${round(m.mcp.ci_run.p99)} ms; ` +
                `overhead per call ${round(m.mcp.overhead_p50_ms)} ms (p50, ${m.mcp.ratio_p50.toFixed(3)}x)`);
  if (m.burst)
    console.log(`bursts: ${m.burst.rounds} x ${m.burst.tasks} pandas tasks at once, 1 s apart: p50 ${round(m.burst.p50)} ms, p95 ${round(m.burst.p95)} ms, p99 ${round(m.burst.p99)} ms (${m.burst.ratio_p50.toFixed(3)}x)`);
  if (m.fanout) console.log(`fan-out: ${m.fanout.tasks} pandas tasks in ${m.fanout.seconds} s = ${m.fanout.tasks_per_s} tasks/s (${SLOTS} slot${SLOTS === 1 ? "" : "s"})`);
  console.log(`worker RSS: ${m.rss_kib.start} KiB at start, ${m.rss_kib.end} KiB after`);
  if (m.memory)
    console.log(`memory: zygote RSS ${kib(m.memory.zygote.rss_kib)} (PSS ${kib(m.memory.zygote.pss_kib)}); ` +
                `warm child RSS ${kib(m.memory.child.rss_kib)}, PSS ${kib(m.memory.child.pss_kib)}, USS ${kib(m.memory.child.uss_kib)}; ` +
                `its init USS ${m.memory.init.uss_kib} KiB` +
                (m.memory.spare ? `; a spare (warm, waiting) USS ${kib(m.memory.spare.uss_kib)}` : ""));
  if (m.soak) console.log(`soak: ${m.soak.tasks} print(1) tasks in ${m.soak.seconds} s; worker RSS ${m.soak.rss_kib_before} -> ${m.soak.rss_kib_after} KiB`);
}
if (results.live_output) {
  console.log(`\nlive output (warm mode, n=${LIVE}, one after the other, in random order): submit -> terminal event of a task printing 1 MiB, p50`);
  console.log("scenario                                     on ms  +subscriber  off ms  off 2 ms   on/off  subscribed/off  off 2/off");
  const line = (k, s, r) => `${k.padEnd(43)} ${String(round(s.on.p50)).padStart(6)} ${String(round(s.subscribed.p50)).padStart(12)} ${String(round(s.off.p50)).padStart(7)} ${String(round(s.off2.p50)).padStart(9)} ${r.on.toFixed(3).padStart(7)}x ${r.subscribed.toFixed(3).padStart(14)}x ${r.off2.toFixed(3).padStart(9)}x`;
  for (const [k, s] of Object.entries(results.live_output.scenarios)) {
    console.log(line(k, s, s.ratio_p50));
    console.log(line("  the code's own time (usage.durationMs)", s.code, s.code_ratio_p50));
  }
}
if (results.batch) {
  const x = results.batch;
  const r = (v) => `${v.seconds} s = ${v.tasks_per_s} tasks/s` + (v.server_cpu_ms_per_task !== undefined ? ` (CPU per task: nats-server ${v.server_cpu_ms_per_task} ms, worker ${v.worker_cpu_ms_per_task} ms)` : "");
  const sentLine = (v) => `${Object.entries(v.sent_per_task).map(([k, n]) => `${k} ${n}`).join(", ")} (${round2(Object.values(v.sent_per_task).reduce((a, b) => a + b, 0))} in all)`;
  console.log(`\nbatch (warm mode): ${x.n} print(1) tasks, first publish -> the batch's complete event / the last terminal event (${x.slots} slot${x.slots === 1 ? "" : "s"}), rounds in alternating order:`);
  console.log(`batch lane:       ${x.batch.map(r).join("; ")}`);
  console.log(`interactive lane: ${x.interactive.map(r).join("; ")}`);
  console.log(`batch/interactive ${x.ratio.toFixed(3)}x`);
  console.log(`sent to NATS per task, batch lane: ${sentLine(x.batch[0])}; interactive lane: ${sentLine(x.interactive[0])}`);
  if (x.with_progress)
    console.log(`batch with ci batch status every second ${r(x.with_progress)} (${x.with_progress.polls} polls): ${x.progress_ratio.toFixed(3)}x the batch lane without`);
}
console.log(`\nload average: ${results.loadavg_start.map(round).join(" ")} at start, ${results.loadavg_end.map(round).join(" ")} at the end`);
mkdirSync(join(args.out, ".."), { recursive: true });
writeFileSync(args.out, JSON.stringify(results, null, 2) + "\n");
console.log(`wrote ${args.out}`);
