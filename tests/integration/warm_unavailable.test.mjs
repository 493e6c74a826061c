// Warm mode that cannot start (local.zygote names a missing file) leaves the
// namespace sandbox whole: the executor and the worker say so under its own
// event name and go on serving, every task cold (a fresh python3 each). Only
// a machine without namespaces makes the executor refuse (cloudrun.test.mjs).
// On loopback: a real ci-executor called over HTTP, a real ci-worker on a
// real nats-server. Without a namespace sandbox here the tests skip loudly.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { EXECUTOR_BIN, startExecutor } from "./lib/executor.mjs";
import { startStack } from "./lib/stack.mjs";
import { runTask } from "./lib/client.mjs";
import { show } from "./lib/checks.mjs";
import { skipTest } from "./lib/skip.mjs";

const MISSING = "/nonexistent/ci-zygote";

// "" when the executor's probe finds the namespace sandbox here (cold: no
// zygote is started for it), else why not.
function noSandboxHere() {
  const dir = mkdtempSync(join(tmpdir(), "ci-probe-"));
  try {
    const cfg = join(dir, "probe.yaml");
    writeFileSync(cfg, "executor:\n  auth: none\nlocal:\n  mode: cold\n");
    const r = spawnSync(EXECUTOR_BIN, ["--config", cfg, "--probe"], { encoding: "utf8", timeout: 60000 });
    const mode = /^mode: (.*)$/m.exec(r.stdout ?? "")?.[1] ?? "";
    return mode.startsWith("sandbox") ? "" : `ci-executor --probe says "${mode || r.stderr || r.error?.message}"`;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe("warm mode unavailable: tasks run cold, in the sandbox", () => {
  let why = null;
  before(() => {
    why = noSandboxHere();
  });

  for (const isolation of ["auto", "required"]) {
    test(`an executor with local.zygote missing (isolation ${isolation}) starts, warns, and runs a task cold over HTTP`, async (t) => {
      if (why) return skipTest(t, why);
      const ex = await startExecutor({ local: { isolation, mode: "warm", zygote: MISSING } });
      try {
        const lines = ex.lines();
        assert.ok(!lines.some((l) => l.event === "executor.refused"), ex.logText());
        const warn = lines.find((l) => l.event === "executor.warm_unavailable");
        assert.ok(warn, `no executor.warm_unavailable:\n${ex.logText()}`);
        assert.equal(warn.level, "warn");
        assert.match(warn.warning, /^warm mode is unavailable, tasks run cold: the zygote program \/nonexistent\/ci-zygote is missing/);
        assert.ok(!lines.some((l) => l.event === "executor.no_isolation"), "the sandbox is whole");

        const r = await fetch(`${ex.url}/execute`, {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ taskId: `warm-off-${isolation}`, language: "python", code: "import sys\nprint('cold', 6 * 7, 'pandas' in sys.modules)" }),
        });
        const text = await r.text();
        assert.equal(r.status, 200, text);
        const res = JSON.parse(text).result;
        assert.equal(res.status, "TASK_STATUS_SUCCEEDED", text);
        // Cold: a fresh interpreter, not a fork of a zygote that imported pandas.
        assert.equal(res.stdout, "cold 42 False\n", text);
        assert.match(res.isolation, /^user,pid,net,mnt/, "in the namespace sandbox");
        assert.equal((await ex.healthz()).status, "ok");
      } finally {
        await ex.cleanup();
      }
    });
  }

  describe("a worker", () => {
    let stack = null;
    before(async () => {
      if (why) return;
      stack = await startStack({ workers: 1, worker: { local: { mode: "warm", zygote: MISSING } } });
    });
    after(async () => {
      if (stack) await stack.stop();
    });

    test("with local.zygote missing logs worker.warm_unavailable (not worker.no_isolation) and runs a task cold in the sandbox", async (t) => {
      if (!stack) return skipTest(t, why);
      const w = stack.workers[0];
      const warn = w.lines().find((l) => l.event === "worker.warm_unavailable");
      assert.ok(warn, `no worker.warm_unavailable:\n${w.logText()}`);
      assert.match(warn.warning, /^warm mode is unavailable, tasks run cold: the zygote program \/nonexistent\/ci-zygote is missing/);
      assert.ok(!w.lines().some((l) => l.event === "worker.no_isolation"), `a sandboxed worker says no_isolation:\n${w.logText()}`);
      const { result } = await runTask(stack.client, { code: "import sys\nprint('cold', 'pandas' in sys.modules)" });
      assert.equal(result.status, "TASK_STATUS_SUCCEEDED", show(result));
      assert.equal(result.stdout, "cold False\n", show(result));
      assert.match(result.isolation, /^user,pid,net,mnt/, show(result));
    });
  });
});
