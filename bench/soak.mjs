// The long soak (the test suite runs 1,000 tasks): --tasks tasks of every
// kind through one worker, its RSS and open fds sampled from /proc. Prints
// the samples and writes the report to bench/results/soak.json; exits 1 if
// a task ended wrongly, RSS grew more than --max-growth-mb after warm-up, or
// fds grew.
//
//   bench/ops.sh soak [--tasks 10000] [--concurrency 2]
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";

import { runSoak } from "../tests/integration/lib/soak.mjs";

const { values: args } = parseArgs({
  options: {
    tasks: { type: "string", default: "10000" },
    concurrency: { type: "string", default: "2" },
    "max-growth-mb": { type: "string", default: "8" },
    out: { type: "string", default: join(new URL(".", import.meta.url).pathname, "results", "soak.json") },
  },
});
const tasks = Number(args.tasks);
const r = await runSoak({
  tasks,
  concurrency: Number(args.concurrency),
  warmup: Math.min(500, Math.floor(tasks / 10)),
  sampleEvery: Math.max(100, Math.floor(tasks / 20)),
  log: (s) => console.log(s),
});
r.date = new Date().toISOString();
r.build = process.env.CI_BUILD_DIR;
const growthKb = r.rss_kb.end - r.rss_kb.warm;
if (growthKb > Number(args["max-growth-mb"]) * 1024) r.problems.push(`RSS grew ${growthKb} kB after warm-up`);
if (r.fds.end > r.fds.warm) r.problems.push(`fds grew from ${r.fds.warm} to ${r.fds.end} (idle)`);
mkdirSync(join(args.out, ".."), { recursive: true });
writeFileSync(args.out, JSON.stringify(r, null, 2) + "\n");
const { samples, ...summary } = r;
console.log(samples.map((s) => `${s.done}\t${s.rss_kb} kB\t${s.fds} fds`).join("\n"));
console.log(JSON.stringify(summary, null, 2));
process.exit(r.problems.length ? 1 : 0);
