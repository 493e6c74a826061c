// Attack battery: sessions (docs/contract.md §16). A step's state is made
// and read inside the sandbox only, and named by the worker from the session
// id: what a step plants in its saved state can reach only later steps of
// its own session, inside their sandboxes - never the worker, the machine
// or another session. Forged ids and records, huge, linked and malicious
// states end as clear results, and the worker lives on.
import { describe } from "node:test";
import { existsSync } from "node:fs";

import { assert, show, startBattery, rand } from "./lib/battery.mjs";

const b = await startBattery("sessions", { worker: { sessions: { max_state_mb: 1 } } });
const session = (p = "sess") => `${p}-${rand()}`;

// Plants content as the step's saved state and leaves before the driver
// could save its own: the worker takes what the sandbox left.
function plant(python) {
  return `
import os
with open(".ci-state-out", "wb") as f:
    f.write(${python})
report()
os._exit(0)
`;
}

describe("sessions", { concurrency: 1 }, () => {
  b.attack("a pickle planted as the state runs only inside the next step's sandbox", async () => {
    const s = session();
    const mark = `/tmp/ci-sec-pwned-${rand()}`;
    // On load: write a file in /tmp and try the worker's own /proc and files.
    const payload = `__import__("pickle").dumps(type("P", (), {"__reduce__": lambda self: (exec, (${JSON.stringify(
      `open(${JSON.stringify(mark)}, "w").write("x"); import os; print("LOADED", os.getuid(), os.path.exists("/proc/1/environ") and open("/proc/1/environ","rb").read()[:0], flush=True)`,
    )},))})())`;
    const r1 = await b.run(plant(payload), { sessionId: s });
    assert.equal(r1.result.status, "TASK_STATUS_SUCCEEDED", show(r1.result));
    const r2 = await b.run(`print("step2", "${mark}" and __import__("os").path.exists(${JSON.stringify(mark)}))\nreport()\n`, { sessionId: s });
    // Whatever the pickle did, it did in step 2's sandbox: the machine's /tmp has no trace.
    assert.equal(existsSync(mark), false, `the planted pickle wrote ${mark} on the worker's machine: ${show(r2.result)}`);
    assert.match(r2.result.stdout, /step2/);
    // It is no state the driver made: the step says it could not be restored.
    assert.equal(r2.result.session.restoredFromStep, 0, show(r2.result));
    assert.match(r2.result.error, /could not be restored/);
  });

  b.attack("another session's state cannot be reached: not by a forged record, not by a planted name", async () => {
    const victim = session("victim");
    const attacker = session("attacker");
    const secret = `secret-${rand()}`;
    const v = await b.run(`token = "${secret}"\nopen("secret.txt", "w").write(token)\nreport()\n`, { sessionId: victim });
    assert.equal(v.result.session.stateKept, true, show(v.result));
    const a1 = await b.run(`x = 1\nreport()\n`, { sessionId: attacker });
    assert.equal(a1.result.session.stateKept, true);
    // A client may write a session's record (a close does): point the
    // attacker's record at the victim's state object.
    const kv = await b.client.sessionsBucket();
    const rec = JSON.parse(new TextDecoder().decode((await kv.get(attacker)).value));
    rec.state = `.sessions/${victim}/1-1`;
    await kv.put(attacker, JSON.stringify(rec));
    const a2 = await b.run(`import os\nprint("token" in globals(), os.path.exists("secret.txt"))\nreport()\n`, { sessionId: attacker });
    assert.doesNotMatch(a2.result.stdout, new RegExp(secret));
    assert.match(a2.result.stdout, /False False/, `the attacker's step saw the victim's state: ${show(a2.result)}`);
    // A record naming a state the session cannot have: its state is gone, and the step says so.
    assert.equal(a2.result.session.previousStateGone, true, show(a2.result));
    assert.equal(a2.result.session.restoredFromStep, 0, show(a2.result));
    // Nor as an input object, nor by artifacts named like its state: task
    // ids cannot start with '.', and no input may name '.sessions/'.
    const asInput = await b.run("print('must not run')\n", { ran: false, files: [{ name: "s.bin", object: `.sessions/${victim}/1-1` }] });
    assert.equal(asInput.result.status, "TASK_STATUS_FAILED", show(asInput.result));
    assert.match(asInput.result.error, /under '\.sessions\/'/);
    // The victim's state is untouched.
    const v2 = await b.run(`print(token, open("secret.txt").read())\nreport()\n`, { sessionId: victim });
    assert.match(v2.result.stdout, new RegExp(`${secret} ${secret}`));
  });

  b.attack("forged session ids never become subjects or object names", async () => {
    for (const id of ["../victim", "a.b", "*", ">", "s.>", "x/../../y", "a b", "a".repeat(65), "é"]) {
      const r = await b.run("print('must not run')\n", { sessionId: id, ran: false });
      assert.equal(r.result.status, "TASK_STATUS_FAILED", `${id}: ${show(r.result)}`);
      assert.match(r.result.error, /is not a session id/, id);
      assert.doesNotMatch(r.result.stdout, /must not run/);
    }
  });

  b.attack("a huge, linked or special state file is never read by the worker", async () => {
    for (const [what, code] of [
      ["a 200 MiB sparse file", `f = open(".ci-state-out", "wb"); f.truncate(200 << 20); f.close()`],
      ["a symlink to /etc/passwd", `os.symlink("/etc/passwd", ".ci-state-out")`],
      ["a hard link", `open("h", "w").write("x"); os.link("h", ".ci-state-out")`],
      ["a FIFO", `os.mkfifo(".ci-state-out")`],
      ["a directory", `os.mkdir(".ci-state-out")`],
    ]) {
      const s = session();
      const r = await b.run(`import os\n${code}\nreport()\nos._exit(0)\n`, { sessionId: s, waitMs: 60000 });
      assert.equal(r.result.status, "TASK_STATUS_SUCCEEDED", `${what}: ${show(r.result)}`);
      assert.equal(r.result.session.stateKept, false, `${what}: taken as the state: ${show(r.result)}`);
      assert.doesNotMatch(r.result.error, /root:/, what);
    }
  });

  b.attack("a pickle bomb planted as the state fails inside the next step's sandbox", async () => {
    const s = session();
    // A few bytes of pickle that ask for a 1 TiB buffer on load.
    const payload = `__import__("pickle").dumps(type("B", (), {"__reduce__": lambda self: (bytearray, (1 << 40,))})())`;
    const r1 = await b.run(plant(payload), { sessionId: s });
    assert.equal(r1.result.status, "TASK_STATUS_SUCCEEDED", show(r1.result));
    const r2 = await b.run("print('after')\nreport()\n", { sessionId: s, ran: false, limits: { memoryMb: 256, timeoutMs: 20000 } });
    // The load hits the step's memory limit (a MemoryError the driver
    // reports as a failed restore, or the OOM killer): the step, never the worker.
    assert.ok(r2.result.session, show(r2.result));
    assert.notEqual(r2.result.session.restoredFromStep, 1, show(r2.result));
    assert.ok(/could not be restored/.test(r2.result.error) || r2.result.status === "TASK_STATUS_FAILED", show(r2.result));
  });
});

b.finish();
