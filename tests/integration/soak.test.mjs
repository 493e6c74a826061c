// A soak of CI_SOAK_TASKS (default 1,000) tasks of every kind through one
// worker (the ASan build; LeakSanitizer checks for leaks when it exits):
// resident memory and open fds, read from /proc, stay flat once it is warm,
// and the worker exits 0 with no sanitizer report. bench/soak.mjs runs
// 10,000 on the Release build.
import { test } from "node:test";
import assert from "node:assert/strict";

import { runSoak } from "./lib/soak.mjs";

const TASKS = Number(process.env.CI_SOAK_TASKS ?? 1000);
// ASan keeps freed memory in a quarantine (256 MiB by default) so that a
// use after free is caught: that alone would look like growth. A small
// quarantine keeps the check, and leaves RSS to say what the worker holds.
const ASAN = `${process.env.ASAN_OPTIONS ? process.env.ASAN_OPTIONS + ":" : ""}quarantine_size_mb=16`;
// Allowed growth of RSS between the warm sample and the end.
const MAX_GROWTH_KB = 16 * 1024;

test(`soak: ${TASKS} tasks through one worker, RSS and fds flat, no leak`, { timeout: 900000 }, async () => {
  const r = await runSoak({ tasks: TASKS, env: { ASAN_OPTIONS: ASAN }, log: (s) => console.log(`# ${s}`) });
  const { samples, ...summary } = r;
  console.log(`# soak report: ${JSON.stringify(summary)}`);
  console.log(`# samples (done, rss kB, fds): ${samples.map((s) => `${s.done}:${s.rss_kb}:${s.fds}`).join(" ")}`);
  assert.deepEqual(r.problems, []);
  assert.equal(Object.values(r.statuses).reduce((a, b) => a + b, 0), TASKS);
  assert.ok(r.rss_kb.end - r.rss_kb.warm <= MAX_GROWTH_KB, `RSS grew from ${r.rss_kb.warm} kB (warm) to ${r.rss_kb.end} kB`);
  // Idle after the warm-up and idle at the end: the same fds (a leak of one
  // per task would show as hundreds).
  assert.ok(r.fds.end <= r.fds.warm, `open fds grew from ${r.fds.warm} (idle, warm) to ${r.fds.end} (idle, end)`);
  // A running task holds about eight (the zygote's socket, output pipes,
  // cgroup and pidfds, the result's files); a sample can catch one slot
  // between two tasks holding both, hence twelve.
  assert.ok(r.fds.max <= r.fds.warm + 12 * r.concurrency, `open fds peaked at ${r.fds.max} (idle: ${r.fds.warm})`);
});
