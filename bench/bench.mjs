// The latency and throughput benchmark of the service, against a baseline of
// the same run: bare `/usr/bin/python3 script.py`, no broker, no sandbox.
//
//   bench/run.sh [--n 30] [--modes cold,warm] [--fanout 1000] [--fanout-cold 100]
//                [--soak 0] [--gap 0] [--concurrency 0] [--spares 0] [--bursts 10]
//                [--sessions 10] [--mcp 30] [--live 30] [--batch 0] [--batch-rounds 2]
//                [--batch-progress] [--batch-lanes 1] [--out FILE]
//                [--fanout-scenario pandas] [--baseline 1] [--perf FILE]
//                [--compare BUILD_DIR [--rounds 2] [--b-rotate N]]
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
// --batch-progress adds, in each round, a batch with `ci batch status B
// --json` run every second meanwhile (as a person watching would), its order
// against the plain batch alternating too; --batch-lanes 0 leaves out the
// interactive lane's rounds (the progress view's cost alone, e.g. for
// --batch 10000).
//
// Where the time goes: for each scenario and the fan-out, the bench joins
// the worker's task.stages lines (it runs the worker at log level debug)
// with its own marks and prints each stage's p50, mean and share of the end
// to end time (STAGES below), and the CPU time per task of the worker, of
// the sandbox (zygotes and everything they start), of nats-server and of
// this client, with how busy the machine was (and with what else). The fork
// floor reports its CPU per pandas task too. --fanout-scenario picks the
// fan-out's task (pandas); --perf FILE records the fan-out with perf (call
// graphs) for bench/perf-roles.py; --baseline 0 skips the bare python3 and
// the fork floor.
//
// --compare DIR: this build (A) against the one in DIR (B: a build
// directory with its ci-worker and ci-zygote), warm mode, in the same run
// on one machine, so that a change is measured against the code before it
// under the same load: each on its own nats-server and worker; the N tasks
// of each scenario alternate between A and B (in a fresh random order each
// round); then --rounds rounds of the fan-out, A B B A...; then a warm
// child's memory on each. Reported: p50s, the task's own CPU (usage.cpuMs),
// the stages, tasks/s, CPU per task, and B/A. --b-rotate N gives B
// local.warm_rotate_after N (with DIR this build's own directory: what the
// zygotes' restarts cost). Not for a change that adds work between tasks
// (a spare's warm-up, a free): A's then runs during B's tasks and B's
// during A's, and the latencies of both are wrong; measure it on its own.
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
    "batch-lanes": { type: "string", default: "1" },
    "fanout-scenario": { type: "string", default: "pandas" },
    baseline: { type: "string", default: "1" },
    perf: { type: "string", default: "" },
    compare: { type: "string", default: "" },
    "b-rotate": { type: "string", default: "0" },
    rounds: { type: "string", default: "2" },
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
const B_ROTATE = Number(args["b-rotate"]);
const BURSTS = Number(args.bursts);
const SESSIONS = Number(args.sessions);
const MCP_CALLS = Number(args.mcp);
const LIVE = Number(args.live);
const BATCH = Number(args.batch);
const BATCH_ROUNDS = Math.max(1, Number(args["batch-rounds"]));
const BATCH_PROGRESS = args["batch-progress"];
const BATCH_LANES = args["batch-lanes"] !== "0";
const FLOOR_FANOUT = 60; // pandas runs per forking process in the floor's throughput
// The fan-out's task (--fanout-scenario print|pandas|matplotlib).
const FANOUT_SCENARIO = args["fanout-scenario"];

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
cpu = {}
for procs in sorted({1, ${SLOTS}}):
    c0 = os.times()
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
    c1 = os.times()
    cpu[str(procs)] = ((c1.children_user + c1.children_system) - (c0.children_user + c0.children_system)) * 1000 / (procs * ${FLOOR_FANOUT})
print(json.dumps({"latency": out, "tasks_per_s": tput, "cpu_ms_per_task": cpu}))
`;
  const env = { PATH: "/usr/bin:/bin", HOME: dir, MPLCONFIGDIR: join(dir, ".mpl"), MPLBACKEND: "Agg", OPENBLAS_NUM_THREADS: "1" };
  const codes = Object.fromEntries(Object.entries(SCENARIOS).map(([k, sc]) => [k, sc.code]));
  const r = spawnSync("/usr/bin/python3", ["-c", script], { cwd: dir, env, input: JSON.stringify(codes), encoding: "utf8" });
  rmSync(dir, { recursive: true, force: true });
  if (r.status !== 0) throw new Error(`fork floor failed: ${r.stderr}`);
  const got = JSON.parse(r.stdout);
  const floor = Object.fromEntries(Object.entries(got.latency).map(([k, ms]) => [k, stats(ms)]));
  return { floor, throughput: Object.fromEntries(Object.entries(got.tasks_per_s).map(([k, v]) => [k, round(v)])),
           cpu: Object.fromEntries(Object.entries(got.cpu_ms_per_task).map(([k, v]) => [k, round(v)])) };
}

// The wall clock in us, as the worker's stage marks have it (same machine):
// the monotonic clock plus an anchor taken on an edge of Date.now(), taken
// again every few seconds, outside any timing. performance.timeOrigin alone
// drifts from the wall clock when that is stepped or slewed after node
// started (seen: 224 ms on a VM just forked from a snapshot).
let wallAnchorUs = (performance.timeOrigin) * 1000;
let anchoredAt = -Infinity;
function reanchorWallClock() {
  if (performance.now() - anchoredAt < 2000) return;
  const t = Date.now();
  let n;
  while ((n = Date.now()) === t); // at most 1 ms
  const p = performance.now();
  wallAnchorUs = n * 1000 - p * 1000;
  anchoredAt = p;
}
reanchorWallClock();
const nowUs = () => Math.round(wallAnchorUs + performance.now() * 1000);
// Task id -> the client's marks (wall clock, us): submit started, the
// publish acked by JetStream, the terminal event seen.
const clientMarks = new Map();

// Submits one task; resolves with the time to its terminal event.
async function once(client, name, terminal, extra = {}) {
  const sc = SCENARIOS[name] ?? { code: name, files: [] };
  const taskId = extra.taskId ?? newTaskId("b");
  const done = new Promise((resolve) => terminal.set(taskId, resolve));
  const t0 = process.hrtime.bigint();
  const marks = { submit: nowUs() };
  await client.submit({ taskId, language: "python", code: sc.code, files: sc.files, ...extra });
  marks.published = nowUs();
  const status = await done;
  marks.seen = nowUs();
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  clientMarks.set(taskId, marks);
  reanchorWallClock();
  if (status !== "succeeded") throw new Error(`task ${taskId} (${String(name).slice(0, 40)}) ended ${status}`);
  return ms;
}

// Where a task's time goes, stage by stage: the worker's task.stages log
// lines (debug level; us since it took the message) joined with the
// client's marks. The stages on the path to the terminal event add up to
// the end-to-end time; after it, the slot is still busy until "released".
const STAGES = [
  // [name, from mark, to mark, what it is]
  ["queue", "submit", "taken", "client publish (JetStream ack) and delivery to a slot"],
  ["checks", "taken", "checked", "decode; result record and cancel stream read"],
  ["running", "checked", "running", "RUNNING record written, running event published"],
  ["inputs", "running", "inputs", "inputs fetched"],
  ["cgroup", "inputs", "cgroup", "the task's cgroup made"],
  ["acquire", "cgroup", "acquired", "zygote hands the task to a spare init (HELLO)"],
  ["setup", "acquired", "ready", "cgroup attach, init's mounts (READY)"],
  ["go", "ready", "go", "inputs written, GO"],
  ["code", "go", "end", "the task process: driver and code, init's report"],
  ["collect", "end", "collected", "output drained, artifacts and outputs read"],
  ["interpret", "collected", "waited", "outcome interpreted"],
  ["artifacts", "waited", "artifacts", "artifacts stored, record re-read when artifacts, a session or live chunks follow"],
  ["store", "artifacts", "stored", "result written to KV"],
  ["event", "stored", "event", "terminal event published (JetStream ack)"],
  ["deliver", "event", "seen", "the client sees the terminal event"],
];
const AFTER_STAGES = [
  ["ack", "event", "acked", "message acked"],
  ["release", "acked", "released", "run freed: init gone, cgroup removed"],
];

function stageBreakdown(w, ids) {
  const want = new Set(ids);
  const rows = [];
  for (const l of w.events("task.stages")) {
    if (!want.has(l.task_id) || !clientMarks.has(l.task_id)) continue;
    const c = clientMarks.get(l.task_id);
    const at = { taken: 0, submit: c.submit - l.taken_at_us, seen: c.seen - l.taken_at_us };
    for (const k of ["checked", "running", "inputs", "cgroup", "acquired", "ready", "go", "end",
                     "collected", "waited", "artifacts", "stored", "event", "acked", "released"])
      at[k] = l[`${k}_us`] >= 0 ? l[`${k}_us`] : NaN;
    rows.push(at);
  }
  const e2e = rows.map((r) => (r.seen - r.submit) / 1000);
  const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const total = mean(e2e);
  const one = ([name, from, to, what]) => {
    const ms = rows.map((r) => (r[to] - r[from]) / 1000).filter((x) => Number.isFinite(x));
    const s = stats(ms);
    return { stage: name, what, n: ms.length, p50_ms: s.p50, mean_ms: ms.length ? mean(ms) : NaN,
             share: ms.length ? mean(ms) / total : NaN };
  };
  return { tasks: rows.length, e2e_p50_ms: stats(e2e).p50, e2e_mean_ms: total,
           path: STAGES.map(one), after: AFTER_STAGES.map(one) };
}

function printBreakdown(title, b) {
  console.log(`${title}: ${b.tasks} tasks, end to end p50 ${round(b.e2e_p50_ms)} ms, mean ${round(b.e2e_mean_ms)} ms`);
  console.log("  stage        p50 ms  mean ms  share  what");
  for (const r of [...b.path, ...b.after]) {
    const share = b.path.includes(r) ? `${(r.share * 100).toFixed(1)}%`.padStart(6) : "     -";
    console.log(`  ${r.stage.padEnd(11)} ${String(round(r.p50_ms)).padStart(7)} ${String(round(r.mean_ms)).padStart(8)} ${share}  ${r.what}`);
  }
}

// CPU time so far (ms) of the worker's own threads, of everything of the
// sandbox (live zygotes with what they reaped: inits, task processes,
// keepers; and what the worker reaped: retired zygotes, cold inits),
// nats-server, this client, and the whole machine (busy and total).
function procTimes(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ").map(Number);
  const hz = 100; // USER_HZ
  return { self: ((f[11] + f[12]) * 1000) / hz, children: ((f[13] + f[14]) * 1000) / hz };
}
function cpuSnapshot(workerPid, natsPid) {
  const w = procTimes(workerPid);
  let sandbox = w.children;
  for (const z of processTree().get(workerPid) ?? []) {
    try {
      if (!readFileSync(`/proc/${z}/cmdline`, "utf8").startsWith("ci-zygote")) continue;
      const t = procTimes(z);
      sandbox += t.self + t.children;
    } catch {
      // gone meanwhile (then in the worker's children)
    }
  }
  const u = process.cpuUsage();
  const cpu = readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
  const ticks = cpu.reduce((a, b) => a + b, 0), idle = cpu[3] + cpu[4];
  return { worker: w.self, sandbox, nats: natsPid ? procTimes(natsPid).self : NaN, client: (u.user + u.system) / 1000,
           machine_busy: ((ticks - idle) * 1000) / 100, machine_total: (ticks * 1000) / 100, at: performance.now() };
}
function cpuPerTask(a, b, tasks) {
  const d = (k) => (b[k] - a[k]) / tasks;
  const wall = (b.at - a.at) / 1000;
  const ours = d("worker") + d("sandbox") + d("nats") + d("client");
  return { tasks, worker_ms: d("worker"), sandbox_ms: d("sandbox"), nats_ms: d("nats"), client_ms: d("client"),
           ours_ms: ours, machine_busy_ms: d("machine_busy"),
           // what else ran on the machine meanwhile (other processes), as CPUs busy
           others_cpus: ((b.machine_busy - a.machine_busy) - ours * tasks) / 1000 / wall,
           cpus_busy: (b.machine_busy - a.machine_busy) / 1000 / wall };
}
// perf record of the whole machine (a recording of the worker's processes
// alone misses their exits: the kernel stops a task's events before it
// tears its memory down); FILE.pids names the worker, nats-server and the
// zygotes, from which bench/perf-roles.py finds every process they started.
async function perfStart(file, workerPid, natsPid) {
  const zygotes = (processTree().get(workerPid) ?? []).filter((z) => {
    try {
      return readFileSync(`/proc/${z}/cmdline`, "utf8").startsWith("ci-zygote");
    } catch {
      return false;
    }
  });
  writeFileSync(`${file}.pids`, JSON.stringify({ worker: workerPid, nats: natsPid, zygotes }));
  const { spawn } = await import("node:child_process");
  const p = spawn("perf", ["record", "-g", "-F", "499", "-o", file, "-a"], { stdio: ["ignore", "ignore", "inherit"] });
  await sleep(500); // attached
  return {
    stop: () => new Promise((resolve) => {
      p.on("exit", resolve);
      p.kill("SIGINT");
    }),
  };
}

function printCpu(title, c) {
  console.log(`${title}: CPU per task: worker ${round(c.worker_ms)} ms, sandbox (zygote, init, task) ${round(c.sandbox_ms)} ms, ` +
              `nats-server ${round(c.nats_ms)} ms, client ${round(c.client_ms)} ms = ${round(c.ours_ms)} ms; ` +
              `machine ${c.cpus_busy.toFixed(2)} CPUs busy, of which others ${c.others_cpus.toFixed(2)}`);
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
      let spare = null, here = null;
      for (const init of tree.get(z) ?? []) {
        // A running task's init has the task (a session leader) and its
        // keeper (same memory, same session); a spare's, one child.
        const kids = tree.get(init) ?? [];
        const task = kids.find((k) => sessionOf(k) === k);
        if (task) here = { zygote: z, init, task };
        else if (kids.length === 1) spare = kids[0];
      }
      // The spare of the task's own zygote (another one may be retiring).
      if (here) found = { ...here, spare };
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
    // debug: the task.stages lines (stageBreakdown)
    worker: { concurrency: CONCURRENCY, worker: { log_level: "debug" }, local: { isolation: "required", mode, warm_spares: SPARES } },
  });
  const out = { mode, scenarios: {}, stages: {}, cpu: {}, session: null, mcp: null, burst: null, fanout: null, rss_kib: {}, memory: null, soak: null };
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
    const natsPid = stack.server.pid;
    for (const name of Object.keys(SCENARIOS)) {
      await once(client, name, terminal); // warm-up
      const ms = [], ids = [];
      const c0 = cpuSnapshot(w.pid, natsPid);
      for (let i = 0; i < N; i++) {
        if (GAP_MS > 0) await sleep(GAP_MS);
        const taskId = newTaskId("b");
        ids.push(taskId);
        ms.push(await once(client, name, terminal, { taskId }));
      }
      await sleep(300); // the last run's release (its stages line comes after it)
      out.cpu[name] = cpuPerTask(c0, cpuSnapshot(w.pid, natsPid), N);
      const s = stats(ms);
      out.scenarios[name] = { ...s, ratio_p50: s.p50 / base[name].p50, ratio_p99: s.p99 / base[name].p99 };
      out.stages[name] = stageBreakdown(w, ids);
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
      const ids = Array.from({ length: fan }, () => newTaskId("bf"));
      // --perf FILE: perf record (call graphs) of the worker, its zygotes
      // and everything they start, and nats-server, during the fan-out.
      const perf = args.perf ? await perfStart(args.perf, w.pid, natsPid) : null;
      const c0 = cpuSnapshot(w.pid, natsPid);
      const t0 = process.hrtime.bigint();
      await Promise.all(ids.map((taskId) => once(client, FANOUT_SCENARIO, terminal, { taskId })));
      const secs = Number(process.hrtime.bigint() - t0) / 1e9;
      await sleep(300);
      if (perf) await perf.stop();
      out.fanout = { scenario: FANOUT_SCENARIO, tasks: fan, seconds: round(secs), tasks_per_s: round(fan / secs),
                     cpu: cpuPerTask(c0, cpuSnapshot(w.pid, natsPid), fan), stages: stageBreakdown(w, ids) };
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

// --compare: A (this build) and B (DIR), warm mode, the same tasks
// interleaved; see the header.
async function compareBuilds(dirB) {
  const local = { isolation: "required", mode: "warm", warm_spares: SPARES };
  // --b-rotate N: B's local.warm_rotate_after (B may be this build: what a zygote's restarts cost).
  const localB = B_ROTATE > 0 ? { ...local, warm_rotate_after: B_ROTATE } : local;
  const opts = (bin, loc) => ({ workers: 1, worker: { concurrency: CONCURRENCY, worker: { log_level: "debug" }, local: loc, ...(bin ? { bin } : {}) } });
  const sides = { A: await startStack(opts(null, local)), B: await startStack(opts(join(dirB, "ci-worker"), localB)) };
  const watch = Object.fromEntries(Object.entries(sides).map(([k, st]) => [k, terminalWatch(st.client)]));
  const out = { b_dir: dirB, b_rotate: B_ROTATE || null, n: N, rounds: Number(args.rounds), scenarios: {}, fanout: {}, memory: {} };
  // usage.cpuMs and usage.durationMs of the task, from the worker's task.done line.
  const usageOf = (side, ids) => {
    const want = new Set(ids);
    const done = sides[side].workers[0].events("task.done").filter((l) => want.has(l.task_id));
    return { cpu: stats(done.map((l) => l.cpu_ms)), code: stats(done.map((l) => l.code_ms)) };
  };
  try {
    for (const [k, st] of Object.entries(sides)) {
      const { result: probe } = await runTask(st.client, { code: "import sys\nprint('pandas' in sys.modules)\n" });
      if (probe.stdout !== "True\n") throw new Error(`side ${k} does not run warm: ${JSON.stringify(probe)}`);
    }
    for (const name of Object.keys(SCENARIOS)) {
      const ms = { A: [], B: [] }, ids = { A: [], B: [] };
      for (const k of ["A", "B"]) await once(sides[k].client, name, watch[k].terminal); // warm-up
      for (let i = 0; i < N; i++) {
        for (const k of Math.random() < 0.5 ? ["A", "B"] : ["B", "A"]) {
          if (GAP_MS > 0) await sleep(GAP_MS);
          const taskId = newTaskId("bc");
          ids[k].push(taskId);
          ms[k].push(await once(sides[k].client, name, watch[k].terminal, { taskId }));
        }
      }
      await sleep(300);
      const r = {};
      for (const k of ["A", "B"]) r[k] = { ...stats(ms[k]), usage: usageOf(k, ids[k]), stages: stageBreakdown(sides[k].workers[0], ids[k]) };
      r.ratio_p50 = r.B.p50 / r.A.p50;
      out.scenarios[name] = r;
    }
    const order = [];
    for (let i = 0; i < out.rounds; i++) order.push(...(i % 2 ? ["B", "A"] : ["A", "B"]));
    const fan = FANOUT.warm;
    const tput = { A: [], B: [] }, cpu = { A: [], B: [] }, slot = { A: [], B: [] };
    for (const k of fan > 0 ? order : []) {
      const st = sides[k], w = st.workers[0];
      const ids = Array.from({ length: fan }, () => newTaskId("bcf"));
      const c0 = cpuSnapshot(w.pid, st.server.pid);
      const t0 = process.hrtime.bigint();
      await Promise.all(ids.map((taskId) => once(st.client, FANOUT_SCENARIO, watch[k].terminal, { taskId })));
      const secs = Number(process.hrtime.bigint() - t0) / 1e9;
      await sleep(300);
      tput[k].push(fan / secs);
      cpu[k].push(cpuPerTask(c0, cpuSnapshot(w.pid, st.server.pid), fan));
      // How long a slot was busy with each task: taken -> run freed.
      const want = new Set(ids);
      slot[k].push(...w.events("task.stages").filter((l) => want.has(l.task_id) && l.released_us >= 0).map((l) => l.released_us / 1000));
    }
    if (fan > 0) {
      const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;
      for (const k of ["A", "B"])
        out.fanout[k] = { tasks_per_s: tput[k].map(round), mean_tasks_per_s: round(mean(tput[k])), slot_ms: stats(slot[k]),
                          cpu_ms: { worker: mean(cpu[k].map((c) => c.worker_ms)), sandbox: mean(cpu[k].map((c) => c.sandbox_ms)),
                                    nats: mean(cpu[k].map((c) => c.nats_ms)), client: mean(cpu[k].map((c) => c.client_ms)),
                                    ours: mean(cpu[k].map((c) => c.ours_ms)), others_cpus: mean(cpu[k].map((c) => c.others_cpus)) } };
      out.fanout.ratio = out.fanout.B.mean_tasks_per_s / out.fanout.A.mean_tasks_per_s;
    }
    for (const k of ["A", "B"]) out.memory[k] = await warmMemory(sides[k].client, sides[k].workers[0].pid, watch[k].terminal);
  } finally {
    for (const wt of Object.values(watch)) wt.stop();
    for (const st of Object.values(sides)) await st.stop();
  }
  return out;
}

function printCompare(c) {
  console.log(`\ncompare (warm mode, n=${c.n}, interleaved): A = this build, B = ${c.b_dir}` +
              (c.b_rotate ? ` with local.warm_rotate_after ${c.b_rotate}` : ""));
  console.log("scenario     A p50 ms  B p50 ms   B/A   A cpu p50  B cpu p50  (the task's own usage.cpuMs)");
  for (const [k, r] of Object.entries(c.scenarios))
    console.log(`${k.padEnd(12)} ${String(round(r.A.p50)).padStart(8)} ${String(round(r.B.p50)).padStart(9)} ${r.ratio_p50.toFixed(3).padStart(6)} ` +
                `${String(round(r.A.usage.cpu.p50)).padStart(10)} ${String(round(r.B.usage.cpu.p50)).padStart(10)}`);
  for (const [k, r] of Object.entries(c.scenarios)) {
    const line = (side) => r[side].stages.path.map((x) => `${x.stage} ${round(x.p50_ms)}`).join(", ") +
      `; after: ${r[side].stages.after.map((x) => `${x.stage} ${round(x.p50_ms)}`).join(", ")}`;
    console.log(`  stages p50 ms, ${k}, A: ${line("A")}`);
    console.log(`  stages p50 ms, ${k}, B: ${line("B")}`);
  }
  if (c.fanout.A) {
    for (const k of ["A", "B"]) {
      const f = c.fanout[k];
      console.log(`fan-out ${k}: ${f.tasks_per_s.join(", ")} tasks/s (mean ${f.mean_tasks_per_s}); a slot busy per task p50 ${round(f.slot_ms.p50)} ms; CPU per task: worker ${round(f.cpu_ms.worker)} ms, ` +
                  `sandbox ${round(f.cpu_ms.sandbox)} ms, nats-server ${round(f.cpu_ms.nats)} ms, client ${round(f.cpu_ms.client)} ms = ${round(f.cpu_ms.ours)} ms; others ${f.cpu_ms.others_cpus.toFixed(2)} CPUs`);
    }
    console.log(`fan-out B/A: ${c.fanout.ratio.toFixed(3)}`);
  }
  const kib = (k) => `${round(k / 1024)} MiB`;
  for (const k of ["A", "B"]) {
    const m = c.memory[k];
    console.log(`memory ${k}: zygote RSS ${kib(m.zygote.rss_kib)}; warm child USS ${kib(m.child.uss_kib)}, PSS ${kib(m.child.pss_kib)}` +
                (m.spare ? `; a spare USS ${kib(m.spare.uss_kib)}` : ""));
  }
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
// machine's drift falls on both lanes alike. With --batch-progress, each round
// has one more batch with `ci batch status B --json` run every second
// meanwhile (which must say the batch's true counts at the end).
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
    const runs = { batch: [], interactive: [], with_progress: [] };
    // Each round runs its kinds in turn, the order reversed every other
    // round (A B, B A, ...), so that the machine's drift falls on all alike.
    const kinds = [["batch", () => measured(BATCH, () => one(false))]];
    if (BATCH_LANES) kinds.push(["interactive", () => measured(BATCH, () => interactive())]);
    if (BATCH_PROGRESS) kinds.push(["with_progress", () => measured(BATCH, () => one(true))]);
    for (let i = 0; i < BATCH_ROUNDS; i++) {
      const order = i % 2 === 0 ? kinds : [...kinds].reverse();
      for (const [kind, run] of order) runs[kind].push(await run());
    }
    const mean = (xs) => xs.reduce((a, x) => a + x.tasks_per_s, 0) / xs.length;
    const out = { n: BATCH, slots: SLOTS, rounds: BATCH_ROUNDS, batch: runs.batch };
    if (BATCH_LANES) {
      out.interactive = runs.interactive;
      out.ratio = mean(runs.batch) / mean(runs.interactive);
    }
    if (BATCH_PROGRESS) {
      out.with_progress = runs.with_progress;
      out.progress_ratio = mean(runs.with_progress) / mean(runs.batch);
    }
    return out;
  } finally {
    for (const sub of counters) sub.unsubscribe();
    watch.stop();
    await st.stop();
  }
}

// --baseline 0: no bare python3 and no fork floor (ratios are then NaN), for
// a quick look at the service alone.
const NaNStats = { n: 0, p50: NaN, p95: NaN, p99: NaN };
const base = {};
for (const name of Object.keys(SCENARIOS)) base[name] = args.baseline !== "0" ? baseline(name) : NaNStats;
const { floor, throughput: floorTput, cpu: floorCpu } = args.baseline !== "0" ? forkFloor()
  : { floor: Object.fromEntries(Object.keys(SCENARIOS).map((k) => [k, NaNStats])), throughput: {}, cpu: {} };
const results = {
  date: new Date().toISOString(),
  n: N,
  cpus: osCpus().length,
  gap_ms: GAP_MS,
  loadavg_start: loadavg(),
  baseline: base,
  fork_floor: floor,
  fork_floor_tasks_per_s: floorTput,
  fork_floor_cpu_ms_per_task: floorCpu,
  concurrency: SLOTS,
  modes: [],
};
for (const mode of args.compare ? [] : args.modes.split(",")) results.modes.push(await service(mode, base));
if (args.compare) results.compare = await compareBuilds(args.compare);
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
console.log(`its CPU per pandas task: ${Object.entries(floorCpu).map(([p, v]) => `${v} ms with ${p} forking process${p === "1" ? "" : "es"}`).join(", ")}`);
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
  for (const [k, b] of Object.entries(m.stages)) {
    printBreakdown(`stages, ${k}, one after the other`, b);
    printCpu(`  ${k}`, m.cpu[k]);
  }
  if (m.fanout) {
    console.log(`fan-out: ${m.fanout.tasks} ${m.fanout.scenario} tasks in ${m.fanout.seconds} s = ${m.fanout.tasks_per_s} tasks/s (${SLOTS} slot${SLOTS === 1 ? "" : "s"})`);
    printBreakdown(`stages, fan-out`, m.fanout.stages);
    printCpu(`  fan-out`, m.fanout.cpu);
  }
  console.log(`worker RSS: ${m.rss_kib.start} KiB at start, ${m.rss_kib.end} KiB after`);
  if (m.memory)
    console.log(`memory: zygote RSS ${kib(m.memory.zygote.rss_kib)} (PSS ${kib(m.memory.zygote.pss_kib)}); ` +
                `warm child RSS ${kib(m.memory.child.rss_kib)}, PSS ${kib(m.memory.child.pss_kib)}, USS ${kib(m.memory.child.uss_kib)}; ` +
                `its init USS ${m.memory.init.uss_kib} KiB` +
                (m.memory.spare ? `; a spare (warm, waiting) USS ${kib(m.memory.spare.uss_kib)}` : ""));
  if (m.soak) console.log(`soak: ${m.soak.tasks} print(1) tasks in ${m.soak.seconds} s; worker RSS ${m.soak.rss_kib_before} -> ${m.soak.rss_kib_after} KiB`);
}
if (results.compare) printCompare(results.compare);
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
  if (x.interactive) {
    console.log(`interactive lane: ${x.interactive.map(r).join("; ")}`);
    console.log(`batch/interactive ${x.ratio.toFixed(3)}x`);
    console.log(`sent to NATS per task, batch lane: ${sentLine(x.batch[0])}; interactive lane: ${sentLine(x.interactive[0])}`);
  }
  if (x.with_progress) {
    console.log(`batch with ci batch status every second: ${x.with_progress.map((v) => `${r(v)}, ${v.polls} polls`).join("; ")}`);
    console.log(`with the progress view / without: ${x.progress_ratio.toFixed(3)}x`);
  }
}
console.log(`\nload average: ${results.loadavg_start.map(round).join(" ")} at start, ${results.loadavg_end.map(round).join(" ")} at the end`);
mkdirSync(join(args.out, ".."), { recursive: true });
writeFileSync(args.out, JSON.stringify(results, null, 2) + "\n");
console.log(`wrote ${args.out}`);
