// Warm mode with task uids and several slots, fanned out: every slot runs
// a task while the slot's last run may still be exiting on the sandbox's
// reaper (issue 16). Each zygote's uid block must hold room for both, and
// for the spares: with a block of slots + spares + 2 (before 9f26155) spares
// could not be made from 3 slots on, and tasks silently ran cold. Here every
// task must run warm (pandas imported before its code, and the worker's
// ci_warm_fallbacks_total stays 0) and no two tasks at once share a uid.
//
// Needs a root worker (task uids), the sandbox and warm mode; otherwise the
// file skips loudly (exit 77).
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

import { startStack } from "./lib/stack.mjs";
import { newTaskId, runTask } from "./lib/client.mjs";
import { blockUntilReleased, releaseMarker, show, waitProcessWith } from "./lib/checks.mjs";
import { skipTest } from "./lib/skip.mjs";

const SLOTS = 4;
const ROUNDS = 4;
const BURST = 24;
const FIRST = 2000000000, COUNT = 5000; // the defaults of local.task_uid_first, _count
const root = process.getuid?.() === 0;

function uidOf(pid) {
  return Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))[1]);
}

async function metric(w, name) {
  const text = await (await fetch(`${w.monitorUrl}/metrics`)).text();
  const m = new RegExp(`^${name} (\\d+)$`, "m").exec(text);
  assert.ok(m, `no ${name} in /metrics:\n${text}`);
  return Number(m[1]);
}

describe("warm fan-out with task uids", () => {
  let stack, w;
  let why = null; // why the file cannot check here
  const markers = [];
  before(async () => {
    if (!root) {
      why = "the worker is not root: no task uids";
      return;
    }
    stack = await startStack({ workers: 1, worker: { concurrency: SLOTS, local: { mode: "warm" } } });
    w = stack.workers[0];
    const { result: p } = await runTask(stack.client, { code: "import sys\nprint('warm', 'pandas' in sys.modules)" });
    assert.equal(p.status, "TASK_STATUS_SUCCEEDED", show(p));
    if (!p.isolation || p.isolation === "none") why = `the worker runs without a sandbox (isolation "${p.isolation}")`;
    else if ((await metric(w, "ci_warm_pool_size")) === 0 && p.stdout !== "warm True\n")
      why = `warm mode is unavailable here: ${show(p)}`;
    else assert.equal(p.stdout, "warm True\n", `the first task ran cold: ${show(p)}`);
  });
  after(async () => {
    for (const m of markers) releaseMarker(m);
    await stack?.stop();
  });

  test(`${ROUNDS} rounds of ${SLOTS} tasks at once: each warm, each round's uids distinct and in the range`, async (t) => {
    if (why) return skipTest(t, why);
    for (let round = 0; round < ROUNDS; round++) {
      const ms = Array.from({ length: SLOTS }, (_, i) => `ci-fanout-${process.pid}-${round}-${i}`);
      markers.push(...ms);
      const runs = ms.map((m) =>
        runTask(stack.client, { code: `import sys\nprint('warm', 'pandas' in sys.modules, flush=True)\n${blockUntilReleased(m)}` }, { timeoutMs: 120000 }));
      const uids = [];
      for (const m of ms) {
        const pids = await waitProcessWith(m, 60000);
        uids.push(uidOf(pids[0]));
      }
      for (const m of ms) releaseMarker(m);
      const results = await Promise.all(runs);
      for (const { result: r } of results) {
        assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
        assert.equal(r.stdout, "warm True\n", `round ${round}: a task ran cold: ${show(r)}`);
      }
      assert.equal(new Set(uids).size, SLOTS, `round ${round}: tasks at once shared a uid: ${uids}`);
      for (const u of uids) {
        assert.ok(u >= FIRST && u < FIRST + COUNT, `uid ${u} is not in the task range`);
        assert.notEqual(u, 65534, "the code ran as init's uid");
      }
    }
    assert.equal(await metric(w, "ci_warm_fallbacks_total"), 0, "tasks ran cold");
  });

  test(`${BURST} short tasks submitted at once: every one warm, no cold fallback`, async (t) => {
    if (why) return skipTest(t, why);
    const ids = [];
    for (let i = 0; i < BURST; i++) {
      const taskId = newTaskId(`fan${i}`);
      ids.push(taskId);
      await stack.client.submit({ taskId, language: "python", code: `import sys\nprint('warm', 'pandas' in sys.modules, ${i})` });
    }
    for (let i = 0; i < BURST; i++) {
      const { result: r } = await stack.client.waitResult(ids[i], 120000);
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(r.stdout, `warm True ${i}\n`, `task ${i} ran cold: ${show(r)}`);
    }
    assert.equal(await metric(w, "ci_warm_fallbacks_total"), 0, "tasks ran cold");
  });
});
