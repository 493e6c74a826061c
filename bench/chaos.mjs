// The full-size chaos run (the test suite runs 1,000 tasks): a 3-node
// JetStream cluster, three workers, --tasks small tasks at --rate per second
// while a worker is SIGKILLed and restarted, the CI_TASKS leader node is
// SIGKILLed and restarted, and a worker is stopped with SIGTERM. Prints the
// report and writes it to bench/results/chaos.json; exits 1 if any task was
// lost or wrong.
//
//   bench/ops.sh chaos [--tasks 2000] [--rate 6]
import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { parseArgs } from "node:util";

import { runChaos } from "../tests/integration/lib/chaos.mjs";

const { values: args } = parseArgs({
  options: {
    tasks: { type: "string", default: "2000" },
    rate: { type: "string", default: "6" },
    out: { type: "string", default: join(new URL(".", import.meta.url).pathname, "results", "chaos.json") },
  },
});
const report = await runChaos({ tasks: Number(args.tasks), rate: Number(args.rate), log: (s) => console.log(s) });
report.date = new Date().toISOString();
report.build = process.env.CI_BUILD_DIR;
mkdirSync(join(args.out, ".."), { recursive: true });
writeFileSync(args.out, JSON.stringify(report, null, 2) + "\n");
console.log(JSON.stringify(report, null, 2));
process.exit(report.problems.length || report.tasks_lost ? 1 : 0);
