// Assertions on the contract shared by the integration test files.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { SHORT_STATUS, TERMINAL } from "./client.mjs";

export const sha256hex = (bytes) => createHash("sha256").update(bytes).digest("hex");
export const PNG_MAGIC = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

// A short, readable dump of a result for assertion messages.
export function show(result) {
  const r = { ...result };
  for (const k of ["stdout", "stderr"]) if (typeof r[k] === "string" && r[k].length > 2000) r[k] = r[k].slice(0, 2000) + `...(${r[k].length} chars)`;
  return JSON.stringify(r, (k, v) => (Buffer.isBuffer(v) ? `<${v.length} bytes>` : v), 1);
}

// The events of a task are RUNNING (when ran is true; none when false)
// followed by exactly one terminal event equal to the result's status, each
// with the contract's headers and the encoding of the request.
export function checkEvents(evs, { taskId, result, encoding, ran = true, worker }) {
  const statuses = evs.map((e) => e.event.status);
  const expected = ran ? ["TASK_STATUS_RUNNING", result.status] : [result.status];
  assert.deepEqual(statuses, expected, `events of ${taskId}`);
  const contentType = encoding === "json" ? "application/json" : "application/protobuf";
  let prevAt = 0;
  for (const e of evs) {
    assert.equal(e.subject, `ci.status.${taskId}`);
    assert.equal(e.headers["Ci-Task-Id"], taskId, `Ci-Task-Id header: ${JSON.stringify(e.headers)}`);
    assert.equal(e.headers["Ci-Status"], SHORT_STATUS[e.event.status], `Ci-Status header: ${JSON.stringify(e.headers)}`);
    assert.equal(e.headers["Content-Type"], contentType, `Content-Type header: ${JSON.stringify(e.headers)}`);
    assert.equal(e.encoding, encoding);
    assert.deepEqual(e.problems, [], `event is not canonical proto3 JSON: ${e.problems.join("; ")}`);
    assert.equal(e.event.taskId, taskId);
    if (worker) assert.equal(e.event.worker, worker);
    assert.ok(e.event.atMs > 1.6e12 && e.event.atMs < Date.now() + 60000, `event at_ms ${e.event.atMs} is Unix ms`);
    assert.ok(e.event.atMs >= prevAt, "events are in time order");
    prevAt = e.event.atMs;
  }
  const last = evs[evs.length - 1].event;
  assert.ok(TERMINAL.has(last.status));
  if (last.exitCode !== undefined || result.exitCode !== undefined) {
    assert.equal(last.exitCode, result.exitCode, "the terminal event's exit_code is the result's");
  }
}

// The common shape of every terminal result.
export function checkResultBasics(result, { taskId, encodingProblems = [] } = {}) {
  assert.deepEqual(encodingProblems, [], `result is not canonical proto3 JSON: ${encodingProblems.join("; ")}`);
  assert.equal(result.taskId, taskId);
  assert.ok(TERMINAL.has(result.status), `terminal status, got ${result.status}`);
  assert.ok(result.finishedAtMs >= result.startedAtMs, `finished_at_ms ${result.finishedAtMs} >= started_at_ms ${result.startedAtMs}`);
  assert.ok(result.startedAtMs > 1.6e12, `started_at_ms ${result.startedAtMs} is Unix ms`);
  assert.ok(result.finishedAtMs <= Date.now() + 5000, "finished_at_ms is not in the future");
  assert.ok(result.worker.length > 0, "worker id is set");
  assert.ok(result.attempt >= 1, "attempt counts deliveries from 1");
}

// A result that failed before the code ran: FAILED, an error matching
// every regexp of errorRes, no exit code, no output, no artifacts.
export function checkRefused(result, taskId, errorRes) {
  assert.equal(result.status, "TASK_STATUS_FAILED", show(result));
  assert.equal(result.taskId, taskId);
  for (const re of errorRes) assert.match(result.error, re, show(result));
  assert.equal(result.exitCode, undefined, `exit_code must be absent when the code never ran: ${show(result)}`);
  assert.equal(result.stdout, "");
  assert.deepEqual(result.artifacts, []);
}

// Pids of host processes whose command line contains marker (not us): a
// task's code can start `python -c ... <marker>` to show the host that it
// got that far.
export function processesWith(marker) {
  const pids = [];
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d) || Number(d) === process.pid) continue;
    try {
      const cmd = readFileSync(`/proc/${d}/cmdline`).toString().replace(/\0/g, " ");
      if (cmd.includes(marker)) pids.push(Number(d));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

// Waits until a host process carries marker (see processesWith), at most
// timeoutMs; returns their pids.
export async function waitProcessWith(marker, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const pids = processesWith(marker);
    if (pids.length) return pids;
    if (Date.now() > deadline) throw new Error(`no process with marker ${marker} within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

// Code that waits until the test lets it go on: it blocks in a child whose
// command line carries marker, until the host kills that child
// (releaseMarker). Put it where the code must wait.
export const blockUntilReleased = (marker) =>
  `import subprocess as _sp, sys as _sys\n_sp.run([_sys.executable, '-c', 'import time; time.sleep(600)', '${marker}'])\n`;

// Lets code blocked by blockUntilReleased(marker) go on: kills the marker's
// processes; how many there were.
export function releaseMarker(marker) {
  const pids = processesWith(marker);
  for (const pid of pids) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone meanwhile
    }
  }
  return pids.length;
}
