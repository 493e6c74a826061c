// The sandbox seen through the full path: what user code can reach from
// inside a task run by a real worker.
//
// When the worker fell back to running without a sandbox (result isolation
// "none"), the tests that need it SKIP loudly; run directly (as ctest does)
// the file then exits 77. They never pass without a sandbox.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";

import { startStack } from "./lib/stack.mjs";
import { newTaskId, runTask } from "./lib/client.mjs";
import { show } from "./lib/checks.mjs";
import { skipTest, skippedCount } from "./lib/skip.mjs";

const SECRET_ENV = `itest-secret-${process.pid}-${Date.now()}`;

let sandboxed = null; // null until the probe ran
let isolation = "";

// A test that needs the sandbox skips without one (and the file then exits
// 77 unless a test failed: lib/skip.mjs).
function tt(name, fn, { needsSandbox = true } = {}) {
  test(name, async (t) => {
    if (needsSandbox && sandboxed !== true) {
      skipTest(t, `the worker runs without a sandbox here (isolation "${isolation}"); this test needs one`);
      return;
    }
    await fn(t);
  });
}

// Pids of processes whose command line contains marker.
function processesWith(marker) {
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

describe("worker sandbox", () => {
  let stack;
  let worker;
  const markers = [];
  before(async () => {
    // CI_ITEST_ISOLATION=none|auto|required runs the worker with that
    // local.isolation (none: to see the skip path and the ungated tests).
    const local = process.env.CI_ITEST_ISOLATION ? { isolation: process.env.CI_ITEST_ISOLATION } : {};
    stack = await startStack({ workers: 1, worker: { concurrency: 2, local, env: { CI_ITEST_SECRET: SECRET_ENV, CI_NATS_TOKEN: SECRET_ENV } } });
    worker = stack.workers[0];
    const { result: r } = await runTask(stack.client, { code: "print('probe')" });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    isolation = r.isolation;
    assert.ok(isolation.length > 0, "the result names its isolation");
    sandboxed = isolation !== "none";
    if (!sandboxed) {
      const fellBack = worker.lines().filter((l) => l.level === "warn" || l.level === "error");
      process.stderr.write(`#\n# WARNING: the worker ran the code WITHOUT a sandbox (isolation "none"); sandbox tests are SKIPPED.\n# worker warnings: ${JSON.stringify(fellBack)}\n#\n`);
    }
  });
  after(async () => {
    // Whatever escaped, it does not outlive the test.
    for (const m of markers) for (const pid of processesWith(m)) try { process.kill(pid, "SIGKILL"); } catch { /* gone */ }
    await stack?.stop();
    if (skippedCount() > 0) process.stderr.write(`# ${skippedCount()} sandbox tests skipped\n`);
  });

  tt("the isolation string names real layers", async () => {
    const layers = isolation.split(",");
    for (const l of ["user", "pid", "net", "mnt"]) assert.ok(layers.includes(l), `isolation "${isolation}" includes ${l}`);
  });

  tt("the network is unreachable, even the worker's own NATS server on loopback", async () => {
    const port = stack.server.port;
    const code = `
import socket
for host in ("127.0.0.1", "localhost"):
    try:
        s = socket.create_connection((host, ${port}), timeout=3)
        print(host, "CONNECTED", s.recv(4))
    except Exception as e:
        print(host, "refused:", type(e).__name__)
try:
    socket.getaddrinfo("example.com", 443)
    print("dns RESOLVED")
except Exception as e:
    print("dns failed:", type(e).__name__)
`;
    const { result: r } = await runTask(stack.client, { code });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.doesNotMatch(r.stdout, /CONNECTED|RESOLVED/, r.stdout);
    assert.match(r.stdout, /^127\.0\.0\.1 refused: \w+Error$/m, r.stdout);
    assert.match(r.stdout, /^dns failed: \w+/m, r.stdout);
  });

  tt("host files: the worker's config, /etc/shadow and a host /tmp file are out of reach; nothing is writable", async () => {
    const canary = `/tmp/ci-itest-canary-${process.pid}-${Date.now()}`;
    writeFileSync(canary, "canary content\n", { mode: 0o644 });
    try {
      const code = `
import json, os
out = {}
def attempt(key, fn):
    try:
        v = fn()
        out[key] = "OK " + repr(v)[:80]
    except Exception as e:
        out[key] = type(e).__name__
attempt("config", lambda: open(${JSON.stringify(worker.configPath)}).read())
attempt("config_dir", lambda: os.listdir(${JSON.stringify(worker.dir)}))
attempt("shadow", lambda: open("/etc/shadow").read())
attempt("canary", lambda: open(${JSON.stringify(canary)}).read())
attempt("write_usr", lambda: open("/usr/ci-itest-was-here", "w").write("x"))
attempt("write_etc", lambda: open("/etc/ci-itest-was-here", "w").write("x"))
attempt("write_root", lambda: open("/ci-itest-was-here", "w").write("x"))
attempt("write_workspace", lambda: open("scratch.txt", "w").write("x"))
attempt("write_tmp", lambda: open("/tmp/scratch.txt", "w").write("x"))
print(json.dumps(out))
`;
      const { result: r } = await runTask(stack.client, { code });
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      const out = JSON.parse(r.stdout);
      for (const k of ["config", "config_dir", "shadow", "canary", "write_usr", "write_etc", "write_root"]) {
        assert.doesNotMatch(out[k], /^OK/, `${k} must fail inside the sandbox: ${JSON.stringify(out)}`);
      }
      assert.match(out.write_workspace, /^OK/, "the workspace is writable");
      assert.match(out.write_tmp, /^OK/, "the private /tmp is writable");
      assert.doesNotMatch(r.stdout, /canary content|nats:\/\//);
    } finally {
      rmSync(canary, { force: true });
    }
    for (const p of ["/usr/ci-itest-was-here", "/etc/ci-itest-was-here", "/ci-itest-was-here"]) {
      assert.throws(() => readFileSync(p), `${p} must not exist on the host`);
    }
  });

  tt(
    "the environment holds nothing of the worker's",
    async () => {
      const code = "import os, json\nprint(json.dumps(dict(os.environ)))";
      const { result: r } = await runTask(stack.client, { code });
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      const env = JSON.parse(r.stdout);
      const text = JSON.stringify(env);
      assert.ok(!text.includes(SECRET_ENV), `a variable of the worker leaked: ${text}`);
      assert.ok(!text.includes(String(stack.server.port)), `the NATS port leaked: ${text}`);
      assert.ok(!text.includes(worker.dir), `the worker's paths leaked: ${text}`);
      for (const k of Object.keys(env)) assert.doesNotMatch(k, /NATS|TOKEN|SECRET|PASSWORD|CREDS/i, `variable ${k}`);
      if (sandboxed) assert.equal(env.HOME, "/workspace");
    },
    { needsSandbox: false },
  );

  tt("the code runs in /workspace with its inputs, and /tmp is private", async () => {
    const code = "import os\nprint(os.getcwd())\nprint(sorted(os.listdir('.')))\nprint(sorted(os.listdir('/tmp')))";
    const { result: r } = await runTask(stack.client, { code, files: [{ name: "in.csv", content: Buffer.from("a\n1\n") }] });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    const [cwd, ws, tmp] = r.stdout.trim().split("\n");
    assert.equal(cwd, "/workspace");
    assert.match(ws, /'in\.csv'/);
    // The host's /tmp holds this test's server and worker dirs right now.
    assert.doesNotMatch(tmp, /ci-nats-|ci-worker-/, `the host's /tmp is visible: ${tmp}`);
  });

  tt("an orphan left by the code (double fork + setsid) is killed when the task ends", async () => {
    const marker = `ci-itest-orphan-${process.pid}-${Date.now()}`;
    markers.push(marker);
    const code = `
import os, sys, time
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.setsid()
    if os.fork() == 0:
        os.close(r)
        os.write(w, str(os.getpid()).encode())
        # w is not inherited across exec: its end tells that the exec happened
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", ${JSON.stringify(marker)}])
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
got = b""
while True:  # the orphan's pid, then EOF once it runs under the marker
    chunk = os.read(r, 32)
    if not chunk:
        break
    got += chunk
grandchild = int(got)
os.kill(grandchild, 0)
print("orphan alive", grandchild, flush=True)
`;
    const { result: r } = await runTask(stack.client, { code });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.match(r.stdout, /^orphan alive \d+$/m, "the orphan was really started");
    let left = processesWith(marker);
    if (left.length) {
      await new Promise((res) => setTimeout(res, 500));
      left = processesWith(marker);
    }
    assert.deepEqual(left, [], `processes with the marker survive the task: ${left.join(", ")}`);
  });

  tt(
    "a symlink or hard link to a host file is never returned as an artifact",
    async () => {
      const code = `
import os
for src, dst in (("/etc/passwd", "passwd.csv"), ("/etc/hostname", "link.png")):
    try:
        os.symlink(src, dst)
    except Exception as e:
        print("symlink", dst, type(e).__name__)
try:
    os.link("/etc/passwd", "hard.csv")
except Exception as e:
    print("hardlink", type(e).__name__)
with open("real.csv", "w") as f:
    f.write("a,b\\n1,2\\n")
try:
    os.mkfifo("fifo.csv")
except Exception as e:
    print("fifo", type(e).__name__)
print("done")
`;
      const { result: r } = await runTask(stack.client, { code });
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.match(r.stdout, /done/);
      assert.deepEqual(r.artifacts.map((a) => a.name), ["real.csv"], show(r.artifacts));
      const bytes = await stack.client.getObject(r.artifacts[0].object);
      assert.equal(Buffer.from(bytes).toString(), "a,b\n1,2\n");
      for (const name of ["passwd.csv", "link.png", "hard.csv", "fifo.csv"]) {
        assert.equal(await stack.client.getObject(`${r.taskId}/${name}`), null, `no object for ${name}`);
      }
    },
    { needsSandbox: false },
  );

  tt(
    "an input named ../x.csv is refused",
    async () => {
      const { result: r } = await runTask(stack.client, {
        code: "print(open('../x.csv').read())",
        files: [{ name: "../x.csv", content: Buffer.from("evil\n") }],
      });
      assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
      assert.equal(r.exitCode, undefined);
      assert.match(r.error, /x\.csv/);
    },
    { needsSandbox: false },
  );

  tt("privilege: the code runs as an unprivileged user with no capabilities", async () => {
    const code = `
import os
print(os.getuid(), os.geteuid())
status = open("/proc/self/status").read()
print([l for l in status.splitlines() if l.startswith(("CapEff", "NoNewPrivs"))])
try:
    os.setuid(0); print("setuid OK")
except Exception as e:
    print("setuid", type(e).__name__)
`;
    const { result: r } = await runTask(stack.client, { code });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.match(r.stdout, /CapEff:\\t0000000000000000/, r.stdout);
    assert.match(r.stdout, /NoNewPrivs:\\t1/, r.stdout);
    assert.doesNotMatch(r.stdout, /setuid OK/);
  });

  tt("a warm runtime that dies is logged, counted in /metrics and replaced; tasks go on", async (t) => {
    // The worker's ci-zygote children (local.mode warm, the default).
    const zygotes = () =>
      readdirSync("/proc")
        .filter((d) => /^\d+$/.test(d))
        .filter((d) => {
          try {
            const stat = readFileSync(`/proc/${d}/stat`, "utf8");
            const ppid = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1]);
            return ppid === worker.pid && readFileSync(`/proc/${d}/comm`, "utf8").trim() === "ci-zygote";
          } catch {
            return false;
          }
        })
        .map(Number);
    const before = zygotes();
    if (before.length === 0) return skipTest(t, "the worker runs no zygote here (warm mode unavailable)");
    process.kill(before[0], "SIGKILL");
    const died = await worker.waitLog((l) => l.event === "worker.zygote_died", 30000);
    assert.equal(died.level, "warn");
    assert.ok(died.died >= 1);
    const replaced = await worker.waitLog((l) => l.event === "worker.zygote_replaced", 120000);
    assert.ok(replaced.ready >= 1, JSON.stringify(replaced));
    const metrics = await (await fetch(`${worker.monitorUrl}/metrics`)).text();
    assert.match(metrics, /^ci_warm_deaths_total [1-9]\d*$/m);
    const { result: r } = await runTask(stack.client, { code: "print('after')" });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
  });
});
