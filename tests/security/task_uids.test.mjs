// Attack battery: what tasks share through the kernel's per-user counts,
// and init's reach. A worker that is root runs each task's code as a uid of
// its own outside (local.task_uid_first, local.task_uid_count) and the
// sandbox's init as local.sandbox_uid: one task cannot take another's
// inotify instances (128 per user), and the code cannot prlimit, renice or
// signal its init. Unprivileged, the worker can map one uid only: the file
// skips then, loudly.
import { describe } from "node:test";
import { readFileSync } from "node:fs";

import { assert, blockUntilReleased, releaseMarker, show, startBattery, waitProcessWith } from "./lib/battery.mjs";

const root = process.getuid?.() === 0;
const FIRST = 60000, COUNT = 5000; // the defaults
const b = await startBattery("task_uids");
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
    // The kernel allows fs.inotify.max_user_instances (128) per user.
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
    assert.match(g.stdout, /HELD \d+ 24\n/, `the first task did not run into EMFILE: ${show(g)}`);
    assert.ok(second.report.fd >= 0, `the second task's inotify_init1 failed with errno ${second.report.errno} while the first held its instances: ${show(second.result)}`);
  }, { skip: notRoot });

  b.attack("the code cannot prlimit, renice or signal its init", async () => {
    const code = `
import os, resource, signal
attempt("prlimit", lambda: resource.prlimit(1, resource.RLIMIT_NOFILE, (4, 4)))
attempt("renice", lambda: os.setpriority(os.PRIO_PROCESS, 1, 19))
attempt("signal", lambda: os.kill(1, signal.SIGUSR1))
attempt("init_uid", lambda: os.stat("/proc/1").st_uid)
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
});

b.finish();
