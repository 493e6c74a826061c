// Attack battery: what tasks share through the kernel's per-user counts,
// and init's reach. A worker that is root runs each task's code as a uid of
// its own outside (local.task_uid_first, local.task_uid_count) and the
// sandbox's init as local.sandbox_uid: one task cannot take another's
// inotify instances (128 per user), and the code cannot prlimit, renice or
// signal its init. Unprivileged, the worker can map one uid only: the file
// skips then, loudly.
import { describe } from "node:test";
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";

import { assert, blockUntilReleased, releaseMarker, show, startBattery, waitProcessWith } from "./lib/battery.mjs";
import { WORKER_BIN } from "../integration/lib/worker.mjs";

const root = process.getuid?.() === 0;
const FIRST = 2000000000, COUNT = 5000; // the defaults
const SLOTS = 2; // the battery's worker.concurrency
const b = await startBattery("task_uids", { concurrency: SLOTS });
const notRoot = root ? undefined : "the worker is not root: it can map one uid only, and every task shares it";

// The uid outside of a host process.
function uidOf(pid) {
  return Number(/^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))[1]);
}

describe("task_uids", { concurrency: 1 }, () => {
  b.attack("two tasks at once run as two uids of the range, neither of them init's", async () => {
    const m1 = b.marker(), m2 = b.marker();
    const r1 = b.run(blockUntilReleased(m1));
    const r2 = b.run(blockUntilReleased(m2));
    const [p1] = await waitProcessWith(m1, 60000);
    const [p2] = await waitProcessWith(m2, 60000);
    const u1 = uidOf(p1), u2 = uidOf(p2);
    releaseMarker(m1);
    releaseMarker(m2);
    const [{ result: a }, { result: c }] = await Promise.all([r1, r2]);
    assert.equal(a.status, "TASK_STATUS_SUCCEEDED", show(a));
    assert.equal(c.status, "TASK_STATUS_SUCCEEDED", show(c));
    assert.notEqual(u1, u2, "two tasks at once share a uid");
    for (const u of [u1, u2]) {
      assert.ok(u >= FIRST && u < FIRST + COUNT, `uid ${u} is not in the task range ${FIRST}-${FIRST + COUNT - 1}`);
      assert.notEqual(u, 65534, "the code runs as init's uid");
    }
  }, { skip: notRoot });

  b.attack("a task holding every inotify instance it may have does not take another task's", async () => {
    // The kernel allows fs.inotify.max_user_instances (128) per user, and
    // counts them for the owner of each sandbox's user namespace (the
    // worker) too: each sandbox gets half of it split between the slots.
    const host = Number(readFileSync("/proc/sys/user/max_inotify_instances", "utf8"));
    const share = Math.max(1, Math.floor(host / 2 / SLOTS));
    const hold = b.marker();
    const greedy = `
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
held = []
while len(held) < 100000:
    fd = libc.inotify_init1(0o2000000)
    if fd < 0:
        break
    held.append(fd)
print("HELD", len(held), ctypes.get_errno(), flush=True)
${blockUntilReleased(hold)}
`;
    const first = b.run(greedy);
    await waitProcessWith(hold, 60000);
    const probe = `
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0o2000000)
report(fd=fd, errno=ctypes.get_errno())
`;
    let second;
    try {
      second = await b.run(probe);
    } finally {
      releaseMarker(hold);
    }
    const { result: g } = await first;
    assert.equal(g.status, "TASK_STATUS_SUCCEEDED", show(g));
    const held = /HELD (\d+) (\d+)\n/.exec(g.stdout);
    assert.ok(held, show(g));
    assert.equal(Number(held[2]), 24, `the first task did not run into EMFILE: ${show(g)}`);
    assert.ok(Number(held[1]) <= share, `the first task held ${held[1]} instances, above its share of ${share}`);
    assert.ok(second.report.fd >= 0, `the second task's inotify_init1 failed with errno ${second.report.errno} while the first held its instances: ${show(second.result)}`);
  });

  b.attack("the code cannot prlimit, renice or signal its init", async () => {
    const code = `
import os, resource, signal
attempt("prlimit", lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (4, 4)))
attempt("renice", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19))
attempt("signal", lambda: os.kill(1, signal.SIGUSR1))
report(uid=os.getuid())
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(rep.uid, 1000);
    for (const k of ["prlimit", "renice", "signal"])
      assert.equal(rep[k].ok, false, `${k} of init succeeded: ${show(r)}`);
    assert.equal(rep.prlimit.errno, 1, "EPERM");
    assert.ok([1, 13].includes(rep.renice.errno), "EPERM or EACCES");
    assert.equal(rep.signal.errno, 1, "EPERM");
  }, { skip: notRoot });
  b.attack("uids come back: more tasks than the range has room for at once, one of them killed, and the last still runs as it should", async () => {
    // A cold run's uid returns when its processes are dead, a warm task's
    // when its init is reaped: a leak would end in "every task uid ... is
    // taken" (cold) or spares that cannot be made (warm: a cold fallback).
    const runs = 14; // above the cold slots (2) and a zygote's block (2 + 2 spares + 2)
    for (let i = 0; i < runs; i++) {
      const killed = i === 3;
      const { result: r } = await b.run(killed ? "import time\ntime.sleep(60)" : "print('ok')", { limits: killed ? { timeoutMs: 1000 } : {} });
      assert.equal(r.status, killed ? "TASK_STATUS_TIMED_OUT" : "TASK_STATUS_SUCCEEDED", `run ${i}: ${show(r)}`);
    }
    const { result: last } = await b.run("import sys\nprint('warm', 'pandas' in sys.modules)");
    assert.equal(last.status, "TASK_STATUS_SUCCEEDED", show(last));
    if (process.env.CI_SANDBOX_MODE === "warm")
      assert.match(last.stdout, /warm True/, `the last task ran cold: ${show(last)}`);
  }, { skip: notRoot });

  b.attack("a range this machine cannot map costs the task uids, never the sandbox", async () => {
    // As root of a user namespace that maps only 0..65535 (a pod with
    // hostUsers: false), the default range does not exist.
    const helper = join(import.meta.dirname, "../integration/lib/nouserns.py");
    const r = spawnSync("python3", [helper, "--ids-only", WORKER_BIN, "--probe"], { encoding: "utf8", timeout: 120000 });
    if (r.status === 77) {
      assert.fail(`the user namespace could not be made here: ${r.stderr}`);
    }
    const out = r.stdout + r.stderr;
    assert.match(out, /task uids: FAILED .* every task runs as local\.sandbox_uid/, out);
    assert.match(out, /^mode: sandbox \(/m, out);
  }, { skip: notRoot });
});

b.finish();
