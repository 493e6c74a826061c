// Attack battery: the sandbox's own processes, as a second red team reached
// them. Init (pid 1 of the task's namespace) stops the task when the worker
// says so, reaps everything and reports; the report fd carries the driver's
// sentences; in warm mode a keeper process shares the code's memory. Code
// that forges the worker's stop signal, writes a false report, gets init
// OOM-killed in its place or drives the keeper must not change what the
// result says happened.
import { describe } from "node:test";
import { execFileSync } from "node:child_process";
import { arch } from "node:os";

import { assert, show, startBattery } from "./lib/battery.mjs";

const b = await startBattery("init_reach");
const warm = process.env.CI_SANDBOX_MODE === "warm";
const root = process.getuid?.() === 0; // the worker gives the code a uid of its own
// This machine's number for rt_sigqueueinfo (glibc has no wrapper).
const NR_rt_sigqueueinfo = Number(
  /^#define __NR_rt_sigqueueinfo (\d+)$/m.exec(
    execFileSync("cc", ["-dM", "-E", "-"], { input: "#include <sys/syscall.h>\n", encoding: "utf8" }),
  )[1],
);

describe("init_reach", { concurrency: 1 }, () => {
  b.attack("a SIGUSR1 queued to init with si_pid 0 (rt_sigqueueinfo) does not stop the task", async () => {
    // init took SIGUSR1 with si_pid 0 as the worker's stop request; only
    // si_code SI_USER, which rt_sigqueueinfo refuses, can tell them apart.
    const code = `
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
info = (ctypes.c_int * 32)()   # siginfo_t: 128 bytes
info[0] = signal.SIGUSR1       # si_signo
info[2] = -1                   # si_code SI_QUEUE (a process may send it)
info[4] = 0                    # si_pid: as if from outside the namespace
info[5] = 0                    # si_uid
def forge():
    libc.syscall.restype = ctypes.c_long
    if libc.syscall(ctypes.c_long(${NR_rt_sigqueueinfo}), ctypes.c_long(1), ctypes.c_long(signal.SIGUSR1), info) != 0:
        raise OSError(ctypes.get_errno(), "rt_sigqueueinfo")
    return "queued"
attempt("forge", forge)
time.sleep(1)
print("still here", flush=True)
report()
`;
    const { result: r, report: rep } = await b.run(code, { limits: { timeoutMs: 20000 } });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", `init took the forged signal for the worker's: ${show(r)}`);
    assert.match(r.stdout, /still here/);
    // With task uids (a root worker) init has a uid the code has not, and
    // the signal does not even reach it (task_uids.test.mjs); else it must
    // reach init, and init must ignore it.
    if (root) assert.equal(rep.forge.errno, 1, `init took a signal from the code: ${show(r)}`);
    else assert.equal(rep.forge.ok, true, `the forged signal must reach init for this case to mean anything: ${show(r)}`);
  });

  b.attack("a 'memory' report written on the report fd does not turn a clean exit into a failure", async () => {
    // The driver keeps the report channel at the first fd >= 100.
    const code = `
import os
def forge():
    fd = min(int(f) for f in os.listdir("/proc/self/fd") if int(f) >= 100)
    return os.write(fd, b"kind\\0memory\\0error\\0forged\\0")
attempt("forge", forge)
report()
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(rep.forge.ok, true, show(r));
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.exitCode, 0);
    assert.ok(!r.error, show(r));
  });

  b.attack("code that lowers its OOM score and keeps its memory in tmpfs ends as a memory failure, never as a broken sandbox", async () => {
    // Its own RSS stays small while /dev/shm and /tmp fill the memory
    // cgroup: the OOM killer then prefers a bigger process of the cgroup,
    // init, unless the code cannot lower its score.
    const code = `
import os
def lower():
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("0")
attempt("lower", lower)
attempt("score", lambda: open("/proc/self/oom_score_adj").read().strip())
report()
chunk = b"x" * (1 << 20)
for d in ("/dev/shm", "/tmp"):
    try:
        with open(d + "/fill", "wb", buffering=0) as f:
            while True:
                f.write(chunk)
    except OSError:
        pass
print("not killed", flush=True)
`;
    const { result: r, report: rep } = await b.run(code, { limits: { memoryMb: 48, timeoutMs: 30000 } });
    if (r.status === "TASK_STATUS_SUCCEEDED" && /not killed/.test(r.stdout))
      assert.fail(`the tmpfs mounts held less than the memory limit: nothing to test (${show(r)})`);
    assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
    assert.match(r.error, /exceeded the memory limit of 48 MiB/, show(r));
    assert.doesNotMatch(r.error, /sandbox failed|init ended/, show(r));
    assert.ok(rep, show(r));
  });

  b.attack("init's command line shows nothing of the worker; the warm runtime's own /workspace, /dev/shm and /tmp are not beneath the task's", async () => {
    const code = `
cmd = open("/proc/1/cmdline", "rb").read().replace(b"\\0", b" ").decode("utf-8", "replace").strip()
points = [line.split()[4] for line in open("/proc/self/mountinfo")]
report(cmd=cmd, mounts={p: points.count(p) for p in ("/workspace", "/dev/shm", "/tmp", "/proc")})
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.doesNotMatch(rep.cmd, /ci-worker|\.ya?ml|--config|build/, `init's command line: ${JSON.stringify(rep.cmd)}`);
    for (const p of ["/workspace", "/dev/shm", "/tmp"])
      assert.equal(rep.mounts[p], 1, `mounts at ${p}: ${show(r)}`);
    // A warm task's /proc covers its zygote's: the kernel mounts a fresh
    // proc in a user namespace only where a whole one is visible.
    assert.equal(rep.mounts["/proc"], warm ? 2 : 1, `mounts at /proc: ${show(r)}`);
  });

  b.attack("a keeper that shares the code's memory, patched and woken, has its CPU time counted", async () => {
    // Warm mode: a keeper process shares the task's memory and sleeps in
    // ppoll() (through libc's syscall()). Turning that syscall instruction
    // into "jmp ." and restarting the call with SIGSTOP/SIGCONT makes it spin.
    const code = `
import ctypes, mmap, os, signal, time
me = os.getpid()
others = []
for d in os.listdir("/proc"):
    if d.isdigit() and int(d) not in (1, me):
        try:
            others.append((int(d), os.readlink("/proc/%s/exe" % d), open("/proc/%s/stat" % d).read()))
        except OSError:
            pass
# The keeper shares our memory: its maps are ours.
mine = open("/proc/self/maps").read()
keeper = None
for pid, exe, stat in others:
    try:
        if open("/proc/%d/maps" % pid).read() == mine:
            keeper = pid
    except OSError:
        pass
def ticks(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])
spun_ms = 0
if keeper:
    libc = ctypes.CDLL(None, use_errno=True)
    addr = ctypes.cast(libc.syscall, ctypes.c_void_p).value
    code = ctypes.string_at(addr, 64)
    at = code.find(b"\\x0f\\x05")
    assert at >= 0, code.hex()
    page = (addr + at) & ~(mmap.PAGESIZE - 1)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(page, 2 * mmap.PAGESIZE, 7) == 0, ctypes.get_errno()
    ctypes.memmove(addr + at, b"\\xeb\\xfe", 2)
    os.kill(keeper, signal.SIGSTOP)
    os.kill(keeper, signal.SIGCONT)
    hz = os.sysconf("SC_CLK_TCK")
    start = ticks(keeper)
    t0 = time.monotonic()
    while ticks(keeper) - start < 1.5 * hz and time.monotonic() - t0 < 20:
        time.sleep(0.05)
    spun_ms = (ticks(keeper) - start) * 1000 // hz
report(keeper=keeper, spun_ms=spun_ms, own_ms=int(time.process_time() * 1000))
`;
    const { result: r, report: rep } = await b.run(code, { limits: { timeoutMs: 40000 } });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    if (!warm) {
      assert.equal(rep.keeper, null, "a cold task has no process that shares its memory");
      return;
    }
    assert.ok(rep.keeper, `warm mode: the keeper was not found: ${show(r)}`);
    assert.ok(rep.spun_ms >= 1000, `the patched keeper did not spin: ${show(r)}`);
    assert.ok(r.usage.cpuMs >= rep.spun_ms + rep.own_ms - 50,
      `the keeper's ${rep.spun_ms} ms of CPU are not in usage.cpu_ms (${r.usage.cpuMs} ms; the code's own ${rep.own_ms} ms): ${show(r)}`);
  }, { skip: arch() === "x64" ? undefined : "the patch is x86-64 machine code" });

});

b.finish();
