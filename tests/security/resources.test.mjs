// Attack battery: resources. Fork, thread and memory bombs, CPU spinning,
// sleeping past the limit, filling every writable file system, a sparse
// 1 TiB file, 30 MiB of output, binary and escape-laden output, a flooded
// report channel: each must fail or be harmless, within its limit, and the
// worker must run the next task.
import { describe } from "node:test";

import { assert, processesWith, show, startBattery } from "./lib/battery.mjs";

const MiB = 1024 * 1024;
const b = await startBattery("resources");
const limits = { max_processes: 64, workspace_mb: 256, tmp_mb: 64 }; // the worker's defaults (config.h)

// Every task of this file leaves no process behind.
function assertNoneLeft(marker) {
  const left = processesWith(marker);
  assert.deepEqual(left, [], `processes of the task survive it: ${left.join(", ")}`);
}

// proto3 field 3 (stdout) and 4 (stderr) of an ExecutionResult, as raw bytes.
function rawStringFields(bytes) {
  const out = {};
  const buf = Buffer.from(bytes);
  let i = 0;
  const varint = () => {
    let v = 0n;
    let shift = 0n;
    for (;;) {
      const c = buf[i++];
      v |= BigInt(c & 0x7f) << shift;
      if (!(c & 0x80)) return v;
      shift += 7n;
    }
  };
  while (i < buf.length) {
    const key = Number(varint());
    const field = key >> 3;
    const type = key & 7;
    if (type === 0) varint();
    else if (type === 1) i += 8;
    else if (type === 5) i += 4;
    else if (type === 2) {
      const len = Number(varint());
      if (field === 3 || field === 4) out[field] = buf.subarray(i, i + len);
      i += len;
    } else throw new Error(`wire type ${type}`);
  }
  return out;
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

describe("resources", { concurrency: 2 }, () => {
  b.attack("fork bomb: bounded by the process limit, and nothing survives the task", async () => {
    const marker = b.numericMarker();
    const code = `
import os, sys, time
# Count how far a plain loop gets first (children sleep under the marker).
n = 0
try:
    while True:
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", "120", "${marker}"])
        n += 1
except OSError as e:
    print("FORKS", n, e.errno, flush=True)
# Then the real thing: everyone forks, forever.
while True:
    try:
        os.fork()
    except OSError:
        pass
`;
    const t0 = Date.now();
    // ~1 s to reach the limit alone; more next to the other cases. A warm
    // task is a fork of a zygote that holds the imported runtime (~100 MB
    // mapped), and each of its forks copies that: ~30 ms a fork on our
    // 2-vCPU VMs, so it gets more time to reach the limit.
    const timeoutMs = process.env.CI_SANDBOX_MODE === "warm" ? 12000 : 6000;
    const { result: r } = await b.run(code, { limits: { timeoutMs } });
    assert.equal(r.status, "TASK_STATUS_TIMED_OUT", show(r));
    const m = r.stdout.match(/^FORKS (\d+) (\d+)$/m);
    assert.ok(m, `the bomb ran: ${r.stdout}`);
    assert.ok(Number(m[1]) < limits.max_processes, `forks are bounded by ${limits.max_processes}: ${m[1]}`);
    assert.equal(Number(m[2]), 11, "fork fails with EAGAIN");
    assert.ok(Date.now() - t0 < timeoutMs + 9000, "bounded by the wall limit");
    assertNoneLeft(marker);
  });

  b.attack("thread bomb: bounded, ends by the wall limit at the latest", async () => {
    const code = `
import threading, time
n = 0
try:
    while True:
        threading.Thread(target=time.sleep, args=(120,), daemon=True).start()
        n += 1
        print("THREADS", n, flush=True)
except BaseException as e:
    print("STOPPED", n, type(e).__name__, flush=True)
`;
    const t0 = Date.now();
    // 5 s: time for the bomb to start and print on a loaded machine.
    const { result: r } = await b.run(code, { limits: { timeoutMs: 5000 } });
    // Either thread creation fails (RuntimeError, MemoryError) or a thread
    // that cannot start hangs Thread.start() until the wall limit.
    assert.ok(["TASK_STATUS_SUCCEEDED", "TASK_STATUS_TIMED_OUT", "TASK_STATUS_FAILED"].includes(r.status), show(r));
    const counts = [...r.stdout.matchAll(/^THREADS (\d+)$/gm)].map((x) => Number(x[1]));
    assert.ok(counts.length > 0, `the bomb ran: ${r.stdout}`);
    assert.ok(Math.max(...counts) < limits.max_processes, `threads are bounded by ${limits.max_processes}: ${Math.max(...counts)}`);
    // The limit, and room for a loaded machine (the threads sleep 120 s).
    assert.ok(r.usage.durationMs <= 5000 + 10000, `duration ${r.usage.durationMs}`);
    assert.ok(Date.now() - t0 < 5000 + 15000, "bounded by the wall limit");
  });

  for (const [label, body] of [
    ["bytes", "data = bytearray(3 * 1024 ** 3)"],
    ["a growing list", "data = []\nwhile True:\n    data.append(bytes(16 << 20))"],
    ["numpy", "import numpy as np\ndata = np.ones((1 << 31,), dtype=np.uint8)\ndata += 1"],
  ]) {
    b.attack(`memory bomb (${label}): FAILED with the memory limit named`, async () => {
      const { result: r } = await b.run(body, { limits: { memoryMb: 512, timeoutMs: 20000 } });
      assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
      assert.match(r.error, /memory limit/i, show(r));
      assert.ok(r.usage.memoryMb <= 512, `peak ${r.usage.memoryMb} MiB`);
    });
  }

  // Several processes, each under the per-process limit, together over it.
  b.attack(
    "memory across processes: the task's total stays under its limit",
    async () => {
      const code = `
import os, time
r, w = os.pipe()
for i in range(6):
    if os.fork() == 0:
        os.close(r)
        try:
            data = bytearray(300 << 20)
            data[::4096] = b"\\1" * len(data[::4096])
            os.write(w, b"1")
            time.sleep(4)
        finally:
            os._exit(0)
os.close(w)
held = 0
os.set_blocking(r, False)
deadline = time.time() + 3
while time.time() < deadline:
    try:
        held += len(os.read(r, 16))
    except BlockingIOError:
        time.sleep(0.05)
report(held=held)
`;
      const { result: r, report: rep } = await b.run(code, { limits: { memoryMb: 512, timeoutMs: 20000 } });
      if (rep) {
        assert.ok(rep.held * 300 <= 512 + 300, `${rep.held} processes held 300 MiB each at once under a 512 MiB limit`);
      } else {
        assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
        assert.match(r.error, /memory/i, show(r));
      }
    },
    {
      skip: b.cgroups
        ? undefined
        : `GAP: no cgroup memory limit in this sandbox (isolation "${b.isolation}"): RLIMIT_AS bounds each process, not the task, so 64 processes may hold 64 x memory_mb`,
    },
  );

  b.attack(
    "memory outside the address space (memfd, SysV shared memory) is bounded too",
    async () => {
      const code = `
import os, ctypes
fds = []
held_memfd = 0
def memfd():
    global held_memfd
    for i in range(16):
        fd = os.memfd_create("m%d" % i)
        fds.append(fd)
        for j in range(64):
            os.write(fd, b"x" * (1 << 20))
        held_memfd += 64
attempt("memfd", memfd)
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
held_sysv = 0
def sysv():
    global held_sysv
    for i in range(8):
        sid = libc.shmget(0, 128 << 20, 0o1600)
        if sid < 0:
            raise OSError(ctypes.get_errno(), "shmget")
        addr = libc.shmat(sid, None, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "shmat")
        ctypes.memset(addr, 1, 128 << 20)
        libc.shmdt(addr)
        held_sysv += 128
attempt("sysv", sysv)
report(held_memfd=held_memfd, held_sysv=held_sysv)
`;
      const { result: r, report: rep } = await b.run(code, { limits: { memoryMb: 256, timeoutMs: 20000 } });
      if (rep) {
        assert.ok(rep.held_memfd <= 256, `memfds held ${rep.held_memfd} MiB under a 256 MiB limit: ${JSON.stringify(rep.memfd)}`);
        assert.ok(rep.held_sysv <= 256, `SysV shared memory held ${rep.held_sysv} MiB under a 256 MiB limit: ${JSON.stringify(rep.sysv)}`);
      } else {
        assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
        assert.match(r.error, /memory/i, show(r));
      }
    },
  );

  b.attack("CPU spin in several threads and processes: TIMED_OUT at the wall limit", async () => {
    const marker = b.marker();
    const code = `
import os, sys, threading, subprocess
for i in range(2):
    subprocess.Popen([sys.executable, "-c", "while True: pass", ${JSON.stringify(marker)}])
def spin():
    while True:
        pass
for i in range(4):
    threading.Thread(target=spin, daemon=True).start()
print("SPINNING", flush=True)
spin()
`;
    const t0 = Date.now();
    // 5 s: time for the code to start and print on a loaded machine.
    const { result: r } = await b.run(code, { limits: { timeoutMs: 5000 } });
    const took = Date.now() - t0;
    assert.equal(r.status, "TASK_STATUS_TIMED_OUT", show(r));
    assert.match(r.stdout, /SPINNING/);
    // The limit, and room for a loaded machine; the spin never ends itself.
    assert.ok(r.usage.durationMs >= 4900 && r.usage.durationMs <= 5000 + 10000, `duration ${r.usage.durationMs} ms`);
    // Up to 5000 ms at 1 CPU; a loaded CI machine gives the sandbox less
    // (826 ms seen with both test lanes running), and none would be a bug.
    assert.ok(r.usage.cpuMs > 300, `the spinning used CPU: ${r.usage.cpuMs} ms`);
    assert.ok(took < 5000 + 15000, `the result came ${took} ms after submission`);
    assertNoneLeft(marker);
  });

  b.attack("sleeping past the wall limit is TIMED_OUT, and what was printed before is kept", async () => {
    const code = `
import time
print("BEFORE", flush=True)
time.sleep(60)
print("AFTER", flush=True)
`;
    // 5 s: time for the code to start and print on a loaded machine.
    const { result: r } = await b.run(code, { limits: { timeoutMs: 5000 } });
    assert.equal(r.status, "TASK_STATUS_TIMED_OUT", show(r));
    assert.match(r.stdout, /BEFORE/);
    assert.doesNotMatch(r.stdout, /AFTER/);
    assert.match(r.error, /time limit/i);
    // The limit, and room for a loaded machine: far under the 60 s sleep.
    assert.ok(r.usage.durationMs >= 4900 && r.usage.durationMs < 5000 + 10000, `duration ${r.usage.durationMs}`);
  });

  b.attack("filling /workspace, /tmp and /dev/shm ends in ENOSPC/EFBIG within their sizes; inodes too", async () => {
    const code = `
import os
sizes = {}
for d, name in (("/workspace", "fill.csv"), ("/tmp", "fill"), ("/dev/shm", "fill")):
    n = 0
    try:
        with open(os.path.join(d, name), "wb") as f:
            while True:
                f.write(b"x" * (1 << 20))
                n += 1
    except OSError as e:
        sizes[d] = [n, e.errno]
os.makedirs("/tmp/inodes")
n = 0
try:
    while True:
        open("/tmp/inodes/%d" % n, "w").close()
        n += 1
except OSError as e:
    sizes["inodes"] = [n, e.errno]
report(sizes=sizes)
`;
    const { result: r, report: rep } = await b.run(code, { limits: { timeoutMs: 30000 } });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    const s = rep.sizes;
    assert.ok([28, 27].includes(s["/workspace"][1]) && s["/workspace"][0] <= limits.workspace_mb, `workspace: ${JSON.stringify(s)}`);
    assert.ok([28, 27].includes(s["/tmp"][1]) && s["/tmp"][0] <= limits.tmp_mb, `tmp: ${JSON.stringify(s)}`);
    assert.ok([28, 27].includes(s["/dev/shm"][1]) && s["/dev/shm"][0] <= limits.tmp_mb, `dev/shm: ${JSON.stringify(s)}`);
    assert.ok(s["/workspace"][0] > 10, "the workspace took data first");
    assert.equal(s.inodes[1], 28, `inodes: ${JSON.stringify(s)}`);
    assert.ok(s.inodes[0] < 100000, `inodes are bounded: ${JSON.stringify(s)}`);
    // The 256 MiB file is over the artifact cap: skipped with a note.
    assert.deepEqual(r.artifacts, []);
    assert.match(r.error, /artifacts exceed/i, show(r));
  });

  b.attack("a sparse 1 TiB file fails or is harmless: no huge artifact", async () => {
    const code = `
import os
def trunc(name, size):
    with open(name, "wb") as f:
        f.truncate(size)
    return os.stat(name).st_size
attempt("truncate_1tib", lambda: trunc("huge.csv", 1 << 40))
def seek_write():
    with open("seek.csv", "wb") as f:
        f.seek((1 << 40) - 1)
        f.write(b"x")
attempt("seek_write_1tib", seek_write)
attempt("fallocate_1tib", lambda: os.posix_fallocate(os.open("falloc.csv", os.O_CREAT | os.O_WRONLY), 0, 1 << 40))
attempt("sparse_100mib", lambda: trunc("sparse.csv", 100 << 20))
attempt("sparse_png", lambda: (open("sparse.png", "wb").write(b"\\x89PNG\\r\\n\\x1a\\n"), trunc("sparse.png", 50 << 20)))
with open("real.csv", "w") as f:
    f.write("a,b\\n")
report()
`;
    const { result: r, report: rep } = await b.run(code, { limits: { timeoutMs: 30000 } });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    for (const k of ["truncate_1tib", "seek_write_1tib", "fallocate_1tib"]) {
      assert.equal(rep[k].ok, false, `${k} must fail: ${JSON.stringify(rep[k])}`);
      assert.ok([27, 28].includes(rep[k].errno), `${k}: EFBIG or ENOSPC: ${JSON.stringify(rep[k])}`);
    }
    const total = r.artifacts.reduce((n, a) => n + a.size, 0);
    assert.ok(total <= 20 * MiB, `artifacts total ${total} bytes`);
    assert.ok(r.artifacts.every((a) => a.size <= 20 * MiB), show(r.artifacts));
    assert.ok(r.artifacts.some((a) => a.name === "real.csv"), show(r.artifacts));
  });

  b.attack("30 MiB of stdout and 5 MiB of stderr: cut at 1 MiB each, totals right", async () => {
    const code = `
import os, sys
sys.stdout.flush()
chunk = b"0123456789abcdef" * 4096
for i in range(30 * 16):
    os.write(1, chunk)
for i in range(5 * 16):
    os.write(2, chunk)
`;
    const { result: r, bytes, report: _ } = await b.run(code, { limits: { timeoutMs: 30000 } });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    const sentinelLine = r.stdout.split("\n")[0] + "\n";
    assert.equal(r.stdoutTotalBytes, Buffer.byteLength(sentinelLine) + 30 * MiB);
    assert.equal(r.stderrTotalBytes, 5 * MiB);
    assert.equal(r.stdoutTruncated, true);
    assert.equal(r.stderrTruncated, true);
    assert.ok(Buffer.byteLength(r.stdout) <= MiB && Buffer.byteLength(r.stdout) > MiB - 64, `stdout kept ${Buffer.byteLength(r.stdout)} bytes`);
    assert.ok(Buffer.byteLength(r.stderr) <= MiB && Buffer.byteLength(r.stderr) > MiB - 64, `stderr kept ${Buffer.byteLength(r.stderr)} bytes`);
    assert.ok(bytes.length < 3 * MiB, `the KV value is ${bytes.length} bytes`);
  });

  for (const json of [false, true]) {
    b.attack(`binary bytes, broken UTF-8 and ANSI escapes: stdout stays valid UTF-8 (${json ? "JSON" : "protobuf"})`, async () => {
      const code = `
import os
junk = bytes(range(256)) * 64 + b"\\x1b[31mRED\\x1b[0m\\x1b]0;title\\x07\\x1b[2J" + b"\\xed\\xa0\\x80\\xc0\\xaf\\xf4\\x90\\x80\\x80\\xff\\xfe" + "héllo ✓".encode() + b"\\n"
os.write(1, junk)
os.write(2, junk[::-1])
print(len(junk))
`;
      const { result: r, bytes } = await b.run(code, { json });
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      const n = Number(r.stdout.trim().split("\n").pop());
      assert.ok(n > 16000, "the junk was written");
      const sentinelLine = r.stdout.split("\n")[0] + "\n";
      assert.equal(r.stdoutTotalBytes, Buffer.byteLength(sentinelLine) + n + String(n).length + 1, "the total counts the raw bytes");
      if (json) {
        const text = utf8.decode(bytes); // throws on invalid UTF-8
        JSON.parse(text);
      } else {
        const f = rawStringFields(bytes);
        utf8.decode(f[3]);
        utf8.decode(f[4]);
      }
      // Nothing after a NUL byte (the junk starts with one) is lost.
      assert.match(r.stdout, /RED/);
      assert.match(r.stdout, /héllo ✓/);
      assert.match(r.stderr, /DER/, "stderr after its NUL bytes is kept");
      assert.ok(!r.stdout.includes("\0"), "a NUL is shown as U+FFFD");
    });
  }

  b.attack("a flooded report channel (1 MiB of broken UTF-8) gives a short, valid error", async () => {
    const code = `
import os
# The driver's report pipe is the fd it moved fd 3 to.
junk = (b"error\\0" + b"\\xff\\xfe\\x1b[31m" * 100000 + b"\\0") * 4
for fd in range(3, 200):
    try:
        os.fstat(fd)
    except OSError:
        continue
    try:
        os.write(fd, junk)
    except OSError:
        pass
raise SystemExit(3)
`;
    const { result: r } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
    assert.equal(r.exitCode, 3);
    assert.ok(Buffer.byteLength(r.error) <= 2048, `error is ${Buffer.byteLength(r.error)} bytes`);
    utf8.decode(Buffer.from(r.error));
  });

  b.attack("exhausting file descriptors is harmless", async () => {
    const code = `
import os
fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as e:
    print("FDS", len(fds), e.errno)
`;
    const { result: r } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    const m = r.stdout.match(/^FDS (\d+) 24$/m);
    assert.ok(m && Number(m[1]) < 1024, `bounded by RLIMIT_NOFILE: ${r.stdout}`);
  });

  // A warm task's process is forked before its init is put in the task's
  // cgroup (moving init does not move its children): the worker must move
  // it too, or the memory, pids and cpu limits would not apply to the code.
  b.attack(
    "the code runs in the task's cgroup, with its init",
    async () => {
      const code = `
me = open("/proc/self/cgroup").read()
init = open("/proc/1/cgroup").read()
report(same=(me == init), me=me, init=init, roots=all(l.endswith(":/") for l in me.splitlines()))
`;
      const { result: r, report: rep } = await b.run(code);
      assert.ok(rep, show(r));
      assert.equal(rep.same, true, `the code's cgroups are not init's:\n${rep.me}\ninit:\n${rep.init}`);
      // Init made its cgroup namespace once placed: the code is at its root.
      if (b.layers.has("cgroupns")) assert.equal(rep.roots, true, `not at the root of its cgroup namespace:\n${rep.me}`);
    },
    { skip: b.cgroups ? undefined : `no per-task cgroups in this sandbox (isolation "${b.isolation}")` },
  );
});


b.finish();
