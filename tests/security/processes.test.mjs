// Attack battery: processes. Orphans that detach and ignore signals, kill
// storms aimed at everything and at the sandbox's init, ptrace of the
// parent, setuid binaries, and the privilege state inside. Checked from
// outside: no process of the task outlives it (the host's /proc is
// scanned for a marker), the worker lives on.
import { describe } from "node:test";

import { assert, blockUntilReleased, newTaskId, processesWith, releaseMarker, show, sleep, startBattery, waitProcessWith } from "./lib/battery.mjs";

const b = await startBattery("processes");
const w = b.worker;

// Waits (bounded) for a host process carrying marker: the control that the
// scan would see a survivor.
async function seenOnHost(marker, ms = 5000) {
  const deadline = Date.now() + ms;
  while (Date.now() < deadline) {
    if (processesWith(marker).length) return true;
    await sleep(50);
  }
  return false;
}

async function assertNoneLeftAfter(marker) {
  let left = processesWith(marker);
  for (const deadline = Date.now() + 10000; left.length && Date.now() < deadline; ) {
    await sleep(100);
    left = processesWith(marker);
  }
  assert.deepEqual(left, [], `processes of the task outlive it: ${left.join(", ")}`);
}

// Python: start a detached, signal-ignoring orphan under marker (double
// fork + setsid), and print its pid.
const orphan = (marker) => `
import os, sys, time, signal
def start_orphan():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setsid()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        if os.fork() == 0:
            os.close(r)
            os.write(w, str(os.getpid()).encode())
            # w is not inherited across exec: its end tells that the exec happened
            for fd in (0, 1, 2):
                os.dup2(os.open("/dev/null", os.O_RDWR), fd)
            os.execv(sys.executable, [sys.executable, "-c",
                "import signal, time, os\\n"
                "for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGUSR1, signal.SIGPIPE):\\n"
                "    signal.signal(s, signal.SIG_IGN)\\n"
                "while True:\\n"
                "    time.sleep(1)\\n",
                ${JSON.stringify(marker)}])
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    got = b""
    while True:  # the orphan's pid, then EOF once it runs under the marker
        chunk = os.read(r, 32)
        if not chunk:
            break
        got += chunk
    os.close(r)
    return int(got)
ORPHAN = start_orphan()
os.kill(ORPHAN, 0)
print("ORPHAN", ORPHAN, flush=True)
`;

describe("processes", { concurrency: 3 }, () => {
  b.attack("a double-forked, setsid, SIGTERM/SIGHUP-ignoring orphan is killed when the task ends", async () => {
    const marker = b.marker();
    const hold = b.marker();
    // The task ends once the test lets it (below).
    const code = `${orphan(marker)}
${blockUntilReleased(hold)}
print("DONE", flush=True)
`;
    const running = b.run(code);
    // Control: while the task runs, the host scan does see the orphan.
    const seen = await seenOnHost(marker, 30000);
    await waitProcessWith(hold, 30000);
    assert.equal(releaseMarker(hold), 1, "the task still ran");
    const { result: r } = await running;
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.match(r.stdout, /^ORPHAN \d+$/m);
    assert.ok(seen, "the host scan saw the orphan while the task ran");
    await assertNoneLeftAfter(marker);
  });

  b.attack("an orphan of a task that times out is killed too, and so is a respawning one", async () => {
    const marker = b.marker();
    const respawner = `
import os, time, signal
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    try:
        if os.fork() == 0:
            os.setsid()
            continue
    except OSError:
        pass
    time.sleep(0.05)
`;
    const code = `${orphan(marker)}
import subprocess
subprocess.Popen([sys.executable, "-c", ${JSON.stringify(respawner)}, ${JSON.stringify(marker)}], start_new_session=True)
time.sleep(60)
`;
    // As below: time to start the orphans and be seen on a loaded machine.
    const running = b.run(code, { limits: { timeoutMs: 15000 } });
    const seen = await seenOnHost(marker, 30000);
    const { result: r } = await running;
    assert.equal(r.status, "TASK_STATUS_TIMED_OUT", show(r));
    assert.ok(seen, "the host scan saw the orphans while the task ran");
    await assertNoneLeftAfter(marker);
  });

  b.attack("an orphan of a cancelled task is killed too", async () => {
    const marker = b.marker();
    const taskId = newTaskId("cancel");
    const running = b.run(`${orphan(marker)}\ntime.sleep(60)\n`, { taskId, limits: { timeoutMs: 30000 } });
    const seen = await seenOnHost(marker, 25000);
    await b.client.cancel(taskId);
    const { result: r } = await running;
    assert.equal(r.status, "TASK_STATUS_CANCELLED", show(r));
    assert.ok(seen, "the host scan saw the orphan while the task ran");
    await assertNoneLeftAfter(marker);
  });

  b.attack("os.kill(-1, SIGKILL) kills only the task's own processes; the worker lives", async () => {
    const code = `
import os, signal, time
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
time.sleep(0.2)
os.kill(-1, signal.SIGKILL)
_, status = os.waitpid(child, 0)
report(child_signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, after=True)
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(rep.child_signal, 9, "kill(-1) did kill the task's own child");
    assert.equal(rep.after, true, "the caller itself lives");
    process.kill(w.pid, 0);
  });

  b.attack("SIGKILL, SIGSTOP, SIGTERM and SIGUSR1 sent to the parent (the sandbox's init) change nothing", async () => {
    const code = `
import os, signal, time
ppid = os.getppid()
for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
    attempt("kill_%d" % sig, lambda s=sig: os.kill(ppid, s))
time.sleep(0.5)
attempt("parent_alive", lambda: os.kill(ppid, 0))
report(ppid=ppid)
`;
    const t0 = Date.now();
    const { result: r, report: rep } = await b.run(code, { limits: { timeoutMs: 60000 } });
    // Init ignored all of it: the task ended by itself, normally, and was
    // reported (a stopped or killed init would give TIMED_OUT or an error).
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(rep.ppid, 1, "the parent is the sandbox's init");
    // A root worker gives init a uid the code has not (task uids): EPERM
    // then says it is there too.
    if (process.getuid?.() === 0) assert.equal(rep.parent_alive.errno, 1, `init: ${show(r)}`);
    else assert.equal(rep.parent_alive.ok, true, `init is gone: ${show(r)}`);
    assert.ok(Date.now() - t0 < 30000, "no wait for a timeout (60 s)");
    assert.ok(r.usage.cpuMs > 0, "init still did its accounting");
  });

  b.attack("the worker and the host's init cannot be signalled from inside", async () => {
    const code = `
import os, signal
attempt("worker", lambda: os.kill(${w.pid}, signal.SIGKILL))
attempt("worker_term", lambda: os.kill(${w.pid}, signal.SIGTERM))
report(pids=sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.ok(!rep.pids.includes(w.pid), `the worker's pid ${w.pid} is not in the task's pid namespace: ${rep.pids}`);
    assert.equal(rep.worker.ok, false);
    assert.equal(rep.worker.errno, 3, "ESRCH");
    assert.ok(rep.pids.length < 10, `the task sees only its own processes: ${rep.pids}`);
    process.kill(w.pid, 0);
  });

  b.attack("ptrace(PTRACE_ATTACH) of the parent and of a child, process_vm_readv and /proc/<pid>/mem fail", async () => {
    const code = `
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
libc.ptrace.restype = ctypes.c_long
def ptrace(req, pid):
    ctypes.set_errno(0)
    r = libc.ptrace(req, pid, None, None)
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r
PTRACE_ATTACH, PTRACE_SEIZE, PTRACE_TRACEME = 16, 0x4206, 0
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
attempt("attach_parent", lambda: ptrace(PTRACE_ATTACH, os.getppid()))
attempt("seize_parent", lambda: ptrace(PTRACE_SEIZE, os.getppid()))
attempt("attach_child", lambda: ptrace(PTRACE_ATTACH, child))
attempt("traceme", lambda: ptrace(PTRACE_TRACEME, 0))
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
buf = ctypes.create_string_buffer(64)
local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
remote = iovec(ctypes.c_void_p(0x400000), 64)
def vm_read(pid):
    ctypes.set_errno(0)
    n = libc.process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if n < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return n
attempt("vm_read_parent", lambda: vm_read(os.getppid()))
attempt("vm_read_child", lambda: vm_read(child))
attempt("mem_parent", lambda: open("/proc/%d/mem" % os.getppid(), "rb").read(1))
attempt("environ_parent", lambda: open("/proc/%d/environ" % os.getppid(), "rb").read())
attempt("tracer", lambda: [l for l in open("/proc/self/status") if l.startswith("TracerPid")][0].split()[1])
os.kill(child, 9)
report()
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    for (const k of ["attach_parent", "seize_parent", "attach_child", "traceme", "vm_read_parent", "vm_read_child"]) {
      assert.equal(rep[k].ok, false, `${k} must fail: ${JSON.stringify(rep[k])}`);
      assert.equal(rep[k].errno, 1, `${k}: EPERM: ${JSON.stringify(rep[k])}`);
    }
    for (const k of ["mem_parent", "environ_parent"]) {
      assert.equal(rep[k].ok, false, `${k} must fail: ${JSON.stringify(rep[k])}`);
    }
    assert.equal(rep.tracer.value, "'0'");
  });

  b.attack("setuid binaries (su, newgrp, passwd, chfn, mount) gain no privilege", async () => {
    const code = `
import os, subprocess, time
ran = {}
for argv in (["/usr/bin/su", "root", "-c", "id -u"], ["/usr/bin/newgrp", "root"], ["/usr/bin/passwd", "-S", "root"],
             ["/usr/bin/chfn", "-f", "x"], ["/usr/bin/mount", "-t", "tmpfs", "none", "/workspace"], ["/usr/bin/gpasswd", "-a", "sandbox", "root"]):
    if not os.path.exists(argv[0]):
        continue
    st = os.stat(argv[0])
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    ids = None
    for i in range(20):
        try:
            ids = [l.split()[1:] for l in open("/proc/%d/status" % p.pid) if l.startswith(("Uid:", "Gid:"))]
            if [x for l in ids for x in l] and p.poll() is None:
                break
        except OSError:
            break
        time.sleep(0.02)
    try:
        out, err = p.communicate(b"", timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    ran[argv[0]] = {"setuid": bool(st.st_mode & 0o4000), "ids": ids, "rc": p.returncode,
                    "out": out.decode(errors="replace")[:200], "err": err.decode(errors="replace")[:200]}
nosuid = bool(os.statvfs("/usr").f_flag & os.ST_NOSUID)
report(ran=ran, euid=os.geteuid(), uid=os.getuid(), usr_nosuid=nosuid)
`;
    const { result: r, report: rep } = await b.run(code, { limits: { timeoutMs: 30000 } });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    const ran = Object.entries(rep.ran);
    assert.ok(ran.some(([, x]) => x.setuid), `a setuid binary was tried: ${JSON.stringify(rep.ran)}`);
    let observed = 0;
    for (const [bin, x] of ran) {
      assert.notEqual(x.rc, 0, `${bin} must fail: ${JSON.stringify(x)}`);
      assert.doesNotMatch(x.out, /^0$/m, `${bin} ran as root: ${JSON.stringify(x)}`);
      if (x.ids && x.ids.length) {
        observed++;
        for (const ids of x.ids) assert.deepEqual(ids, ["1000", "1000", "1000", "1000"], `${bin} ran with ids ${JSON.stringify(x.ids)}`);
      }
    }
    assert.ok(observed > 0, `the ids of a running setuid binary were seen: ${JSON.stringify(rep.ran)}`);
    assert.equal(rep.euid, 1000);
    assert.equal(rep.uid, 1000);
    assert.equal(rep.usr_nosuid, true, "the runtime is mounted nosuid");
  });

  b.attack("NoNewPrivs 1, no capabilities, seccomp on, uid 1000: in the code and in a child it executes", async () => {
    const code = `
import subprocess
def fields(text):
    return {l.split(":")[0]: l.split(":", 1)[1].strip() for l in text.splitlines() if ":" in l}
me = fields(open("/proc/self/status").read())
child = fields(subprocess.run(["/bin/cat", "/proc/self/status"], capture_output=True, text=True).stdout)
keys = ("NoNewPrivs", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "Seccomp", "Uid", "Gid", "Groups")
report(me={k: me.get(k) for k in keys}, child={k: child.get(k) for k in keys})
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    for (const who of ["me", "child"]) {
      const s = rep[who];
      assert.equal(s.NoNewPrivs, "1", `${who}: ${JSON.stringify(s)}`);
      for (const k of ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]) assert.equal(s[k], "0000000000000000", `${who} ${k}: ${JSON.stringify(s)}`);
      assert.equal(s.Seccomp, "2", `${who}: seccomp filter mode`);
      assert.deepEqual(s.Uid.split(/\s+/), ["1000", "1000", "1000", "1000"]);
      assert.deepEqual(s.Gid.split(/\s+/), ["1000", "1000", "1000", "1000"]);
      assert.equal(s.Groups, "", `${who}: no supplementary groups`);
    }
  });
});

b.finish();
