// The attack battery's harness: a real nats-server, a real ci-worker and the
// real sandbox, reached only through the normal path (ci.submit, the KV
// result, the object store), with the integration fixtures of
// tests/integration/lib. Their npm packages live in tests/integration/
// node_modules; Node resolves a bare import from the importing file's own
// folder, so this file imports only those fixtures (never a package itself),
// which works from a clean clone after `npm ci` in tests/integration.
//
//   const b = await startBattery("network", { worker: {...} });
//   b.attack("a case", async () => { const r = await b.run(code); ... });
//   b.finish();           // registers the last test and the cleanup
//
// When the worker runs without a sandbox (result isolation "none"), the
// file SKIPS loudly: it prints why and exits 77 before any test is
// registered, so the battery never passes without a sandbox.
// CI_SEC_ISOLATION=none|auto|required runs the worker with that
// local.isolation (none: to see the skip path). CI_SANDBOX_MODE=cold|warm
// runs it with that local.mode; the probe task checks that the mode really
// ran (a warm task finds pandas imported already), so a warm battery never
// passes on a silent cold fallback.
import { after, test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";

import { startStack } from "../../integration/lib/stack.mjs";
import { newTaskId, runTask } from "../../integration/lib/client.mjs";
import { blockUntilReleased, releaseMarker, show, waitProcessWith } from "../../integration/lib/checks.mjs";
import { skipTest } from "../../integration/lib/skip.mjs";

export { assert, show, newTaskId, blockUntilReleased, releaseMarker, waitProcessWith };

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const rand = (n = 8) => randomBytes(n).toString("hex");

// Pids of host processes whose command line contains marker (not us).
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

// Python run before every case's body: a sentinel proves the code ran, and
// attempt() records what each try gave, printed by report() as one JSON line.
function prelude(sentinel) {
  return `import json as _json, os as _os, sys as _sys
print("SENTINEL ${sentinel}", flush=True)
_results = {}
def attempt(key, fn):
    try:
        v = fn()
        _results[key] = {"ok": True, "value": repr(v)[:300]}
    except BaseException as e:
        _results[key] = {"ok": False, "exc": type(e).__name__, "errno": getattr(e, "errno", None), "msg": str(e)[:300]}
    return _results[key]
def report(**extra):
    _results.update(extra)
    print("RESULT " + _json.dumps(_results), flush=True)
`;
}

// What a case's code printed with report(), or null.
export function parseReport(stdout) {
  const line = stdout.split("\n").find((l) => l.startsWith("RESULT "));
  return line ? JSON.parse(line.slice(7)) : null;
}

export async function startBattery(group, { worker = {}, concurrency = 2 } = {}) {
  const local = { ...(worker.local ?? {}) };
  if (process.env.CI_SEC_ISOLATION) local.isolation = process.env.CI_SEC_ISOLATION;
  const mode = process.env.CI_SANDBOX_MODE;
  if (mode) local.mode = mode;
  const stack = await startStack({ workers: 1, worker: { concurrency, ...worker, local } });
  const w = stack.workers[0];
  const client = stack.client;

  // The probe: what does a task say about its isolation?
  let probe;
  try {
    probe = (await runTask(client, { code: "import sys\nprint('probe', 'pandas' in sys.modules)" })).result;
    assert.equal(probe.status, "TASK_STATUS_SUCCEEDED", show(probe));
    if (mode && probe.isolation !== "none")
      assert.equal(probe.stdout, `probe ${mode === "warm" ? "True" : "False"}\n`, `the worker runs tasks in ${mode} mode: ${show(probe)}; log:\n${w.logText().slice(-3000)}`);
  } catch (e) {
    await stack.stop();
    throw e;
  }
  const isolation = probe.isolation;
  if (!isolation || isolation === "none") {
    const warnings = w.lines().filter((l) => l.level === "warn" || l.level === "error");
    process.stderr.write(
      `#\n# SKIPPED: security battery "${group}": the worker runs tasks WITHOUT a sandbox ` +
        `(result isolation "${isolation}"). The battery needs one and never passes without it.\n` +
        `# worker warnings: ${JSON.stringify(warnings)}\n#\n`,
    );
    await stack.stop();
    if (!process.exitCode) process.exitCode = 77;
    process.exit(process.exitCode);
  }

  const markers = [];
  const b = {
    group,
    stack,
    worker: w,
    client,
    isolation,
    layers: new Set(isolation.split(",")),
    markers,

    // Runs code (with the prelude) as a task; returns { result, report,
    // sentinel, taskId, raw, bytes }. opts: request fields (limits, files,
    // taskId...), plus json (submit as JSON), waitMs, ran (default true:
    // assert the sentinel is in stdout).
    async run(code, opts = {}) {
      const { json = false, waitMs = 90000, ran = true, prelude: withPrelude = true, ...req } = opts;
      const sentinel = `ci-sec-${rand()}`;
      const full = withPrelude ? prelude(sentinel) + code : code;
      const r = await runTask(client, { ...req, code: full }, { json, timeoutMs: waitMs });
      if (ran) {
        assert.ok(r.result.stdout.includes(`SENTINEL ${sentinel}`), `the code did not run (no sentinel in stdout): ${show(r.result)}`);
      }
      return { ...r, sentinel, report: parseReport(r.result.stdout) };
    },

    // The safe outcome is only half: the worker must still run a plain task.
    async followUp() {
      client.check();
      const token = rand();
      const { result } = await runTask(client, { code: `print("follow-up ${token}")` });
      assert.equal(result.status, "TASK_STATUS_SUCCEEDED", `the follow-up task failed: ${show(result)}`);
      assert.equal(result.stdout, `follow-up ${token}\n`);
      assert.equal(w.exited(), null, "the worker is still running");
      process.kill(w.pid, 0);
    },

    // One case: its body, then a follow-up task that must succeed. With
    // skip (why it cannot check here), the case is skipped and the file
    // says skipped to ctest (exit 77, lib/skip.mjs) unless another failed.
    attack(name, fn, { skip } = {}) {
      test(name, async (t) => {
        if (skip) {
          skipTest(t, `${group}: ${skip}`);
          return;
        }
        await fn(t);
        await b.followUp();
      });
    },

    // A marker to put in the command line of processes the code starts;
    // anything still carrying one is killed when the file ends.
    marker() {
      const m = `ci-sec-marker-${rand()}`;
      markers.push(m);
      return m;
    },

    // A marker that is also a number (for `sleep 120 <marker>`, which sums
    // its arguments): exec'ing sleep is far cheaper than exec'ing python.
    numericMarker() {
      const m = `0.000${BigInt("0x" + rand(6)).toString().padStart(15, "0")}`;
      markers.push(m);
      return m;
    },

    // Whether tasks run in a memory cgroup (v2 "cgroup" or v1 "cgroup1").
    get cgroups() {
      return b.layers.has("cgroup") || b.layers.has("cgroup1");
    },

    // The last test: the worker lived through every case, and stack.stop()
    // (in after) checks that it drains to exit 0 with no sanitizer report.
    finish() {
      test(`${group}: the worker survived the battery`, async () => {
        await b.followUp();
        const crashes = w.lines().filter((l) => l.level === "error" && /crash|signal|abort/i.test(JSON.stringify(l)));
        assert.deepEqual(crashes, [], "no crash was logged");
        const x = await w.stop("SIGTERM", 90000);
        assert.equal(x.code, 0, `the worker drains to exit 0 (got ${JSON.stringify(x)}); log:\n${w.logText().slice(-8000)}`);
        assert.doesNotMatch(w.logText(), /ERROR: (Address|Leak)Sanitizer|runtime error: |SUMMARY: UndefinedBehaviorSanitizer/, "no sanitizer report");
      });
      after(async () => {
        for (const m of markers) for (const pid of processesWith(m)) try { process.kill(pid, "SIGKILL"); } catch { /* gone */ }
        await stack.stop();
      });
    },
  };
  process.stderr.write(`# ${group}: tasks run with isolation "${isolation}"${mode ? ` in ${mode} mode` : ""}\n`);
  return b;
}
