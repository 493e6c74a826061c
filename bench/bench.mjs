// The latency and throughput benchmark of the service, against a baseline of
// the same run: bare `/usr/bin/python3 script.py`, no broker, no sandbox.
//
//   bench/run.sh [--n 30] [--fanout 200] [--modes cold]
//
// For each scenario (print(1); a pandas groupby over an inline 1,000-row CSV;
// a matplotlib PNG) it measures submit -> terminal status event through NATS,
// N times one after the other, and reports p50/p95/p99 and their ratio to the
// baseline's; then a fan-out of --fanout pandas tasks published at once
// (throughput with the default concurrency), and the worker's RSS before and
// after. Results go to stdout as a table and to bench/results/latest.json.
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";

import { startStack } from "../tests/integration/lib/stack.mjs";
import { newTaskId } from "../tests/integration/lib/client.mjs";

const { values: args } = parseArgs({
  options: {
    n: { type: "string", default: "30" },
    fanout: { type: "string", default: "200" },
    modes: { type: "string", default: "cold" },
    out: { type: "string", default: join(new URL(".", import.meta.url).pathname, "results", "latest.json") },
  },
});
const N = Number(args.n);
const FANOUT = Number(args.fanout);

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

// Submits one task and resolves with the time to its terminal event.
async function once(client, name, terminal) {
  const sc = SCENARIOS[name];
  const taskId = newTaskId("b");
  const done = new Promise((resolve) => terminal.set(taskId, resolve));
  const t0 = process.hrtime.bigint();
  await client.submit({ taskId, language: "python", code: sc.code, files: sc.files });
  const status = await done;
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  if (status !== "succeeded") throw new Error(`task ${taskId} (${name}) ended ${status}`);
  return ms;
}

function rssKiB(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, "utf8"));
  return m ? Number(m[1]) : NaN;
}

async function service(mode, base) {
  const stack = await startStack({ workers: 1, worker: { local: { isolation: "auto" } } });
  const out = { mode, scenarios: {}, fanout: null, rss_kib: {} };
  try {
    const client = stack.client;
    const w = stack.workers[0];
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
      for (let i = 0; i < N; i++) ms.push(await once(client, name, terminal));
      const s = stats(ms);
      out.scenarios[name] = { ...s, ratio_p50: s.p50 / base[name].p50, ratio_p99: s.p99 / base[name].p99 };
    }
    const t0 = process.hrtime.bigint();
    await Promise.all(Array.from({ length: FANOUT }, () => once(client, "pandas", terminal)));
    const secs = Number(process.hrtime.bigint() - t0) / 1e9;
    out.fanout = { tasks: FANOUT, seconds: round(secs), tasks_per_s: round(FANOUT / secs) };
    out.rss_kib.end = rssKiB(w.pid);
    sub.unsubscribe();
  } finally {
    await stack.stop();
  }
  return out;
}

const base = {};
for (const name of Object.keys(SCENARIOS)) base[name] = baseline(name);
const results = { date: new Date().toISOString(), n: N, cpus: (await import("node:os")).cpus().length, baseline: base, modes: [] };
for (const mode of args.modes.split(",")) results.modes.push(await service(mode, base));

console.log(`\nbaseline: bare /usr/bin/python3 script.py (n=${N})`);
console.log("scenario     p50 ms   p95 ms   p99 ms");
for (const [k, s] of Object.entries(base)) console.log(`${k.padEnd(12)} ${String(round(s.p50)).padStart(6)} ${String(round(s.p95)).padStart(8)} ${String(round(s.p99)).padStart(8)}`);
for (const m of results.modes) {
  console.log(`\nservice, ${m.mode} mode: submit -> terminal event through NATS (n=${N})`);
  console.log("scenario     p50 ms   p95 ms   p99 ms   p50/baseline  p99/baseline");
  for (const [k, s] of Object.entries(m.scenarios))
    console.log(`${k.padEnd(12)} ${String(round(s.p50)).padStart(6)} ${String(round(s.p95)).padStart(8)} ${String(round(s.p99)).padStart(8)} ${String(round(s.ratio_p50 * 100) / 100).padStart(10)}x ${String(round(s.ratio_p99 * 100) / 100).padStart(12)}x`);
  console.log(`fan-out: ${m.fanout.tasks} pandas tasks in ${m.fanout.seconds} s = ${m.fanout.tasks_per_s} tasks/s`);
  console.log(`worker RSS: ${m.rss_kib.start} KiB at start, ${m.rss_kib.end} KiB after`);
}
mkdirSync(join(args.out, ".."), { recursive: true });
writeFileSync(args.out, JSON.stringify(results, null, 2) + "\n");
console.log(`\nwrote ${args.out}`);
