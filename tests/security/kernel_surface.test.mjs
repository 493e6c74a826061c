// Attack battery: the kernel surface. Through ctypes (libc.syscall), the
// code calls what sandboxes deny: mount, new namespaces, setns, bpf,
// perf_event_open, userfaultfd, io_uring, kernel AIO, clock setting,
// keyrings, ptrace, modules, kexec, reboot, swap, NUMA page moves, ... Each
// must fail with the errno the seccomp filter gives (EPERM; ENOSYS for clone3
// and for system calls newer than the filter's libseccomp), printed by the
// code and checked here. Every call is made harmless even where it would succeed (bad magic
// numbers, the current time, NULL buffers), so a failing sandbox shows up
// as a failed assertion, not as a changed host.
//
// System call numbers come from this machine's <sys/syscall.h> (cc -dM -E),
// so the file works on any architecture; a name the headers lack is skipped.
import { describe } from "node:test";
import { execFileSync } from "node:child_process";
import { arch } from "node:os";

import { assert, show, startBattery } from "./lib/battery.mjs";

const b = await startBattery("kernel_surface");

function syscallNumbers() {
  const text = execFileSync("cc", ["-dM", "-E", "-"], { input: "#include <sys/syscall.h>\n", encoding: "utf8" });
  const nr = {};
  for (const m of text.matchAll(/^#define __NR_(\w+) (\d+)$/gm)) nr[m[1]] = Number(m[2]);
  return nr;
}
const NR = syscallNumbers();
assert.ok(NR.mount > 0 && NR.bpf > 0, "system call numbers from <sys/syscall.h>");

// System calls newer than the filter's libseccomp: Debian 12's 2.5.4 names
// none past futex_requeue (456), so a deny list built with it cannot name
// these, and Debian 12's headers (Linux 6.1) lack them too. Since 424 the
// numbers are the same on every architecture but alpha. Each call is given
// arguments it refuses (NULL, fd -1, bad flags).
const NEWER = {
  statmount: [457, "None, None, 0, 0"],
  listmount: [458, "None, None, 0, 0"],
  lsm_get_self_attr: [459, "0, None, None, 0"],
  lsm_set_self_attr: [460, "0, None, 0, 0"],
  lsm_list_modules: [461, "None, None, 0"],
  mseal: [462, "0, 0, 0xffff"],
  setxattrat: [463, "-1, None, 0, None, None, 0"],
  getxattrat: [464, "-1, None, 0, None, None, 0"],
  listxattrat: [465, "-1, None, 0, None, 0"],
  removexattrat: [466, "-1, None, 0, None"],
  open_tree_attr: [467, "-1, None, 0, None, 0"],
};
for (const [name, [nr]] of Object.entries(NEWER)) if (NR[name] === undefined) NR[name] = nr;

// Which of them this kernel has: called here, outside any sandbox, they
// answer something other than ENOSYS. Only those can show the filter.
function hostErrnos(argsOf) {
  const calls = Object.entries(argsOf).map(([name, args]) => `("${name}", ${NR[name]}, [${args}])`);
  const py = `
import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
for name, nr, args in [${calls.join(", ")}]:
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
    out[name] = ctypes.get_errno() if r < 0 else 0
print(json.dumps(out))
`;
  return JSON.parse(execFileSync("python3", ["-c", py], { encoding: "utf8" }));
}
const hostErrno = hostErrnos({
  ...Object.fromEntries(Object.entries(NEWER).map(([name, [, args]]) => [name, args])),
  futex_waitv: "None, 0, 0, None, 0",
});

const EPERM = 1;
const ENOSYS = 38;
const hostHas = Object.keys(NEWER).filter((n) => hostErrno[n] !== ENOSYS);
const CLONE_NEWUSER = 0x10000000;
const CLONE_NEWNS = 0x00020000;
const CLONE_NEWNET = 0x40000000;
const SIGCHLD = 17;

// Python shared by the cases: sc(name, *args) -> {"r", "errno"}.
const PRELUDE = `
import ctypes, os, time
NR = ${JSON.stringify(NR)}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
calls = {}
extra = {}
def sc(key, name, *args):
    if name not in NR:
        calls[key] = {"skipped": "no __NR_" + name}
        return
    conv = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[name]), *conv)
    e = ctypes.get_errno()
    if name == "clone" and r == 0:
        os._exit(0)  # the child of a clone that should have failed
    if name == "clone" and r > 0:
        os.waitpid(r, 0)
    calls[key] = {"r": r, "errno": e if r < 0 else 0}
class timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]
class timeval(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("usec", ctypes.c_long)]
`;

// Runs the calls; asserts each one failed with its expected errno, after
// check(report) if given (report: calls, and extra as the body filled it).
async function expectDenied(body, expected, check = () => {}) {
  const code = `${PRELUDE}${body}\nreport(calls=calls, extra=extra)\n`;
  const { result: r, report: rep } = await b.run(code);
  assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
  check(rep);
  const bad = [];
  for (const [key, errno] of Object.entries(expected)) {
    const c = rep.calls[key];
    if (!c) bad.push(`${key}: not called`);
    else if (c.skipped) continue;
    else if (c.r >= 0 || c.errno !== errno) bad.push(`${key}: returned ${c.r}, errno ${c.errno} (expected errno ${errno})`);
  }
  assert.deepEqual(bad, [], `calls that were not denied: ${JSON.stringify(rep.calls)}`);
  assert.ok(Object.values(rep.calls).filter((c) => !c.skipped).length >= Object.keys(expected).length / 2, "most calls exist here");
}

describe("kernel_surface", { concurrency: 3 }, () => {
  b.attack("mount, umount, pivot_root, chroot, the new mount API, unshare, setns and clone with namespace flags are denied", async () => {
    const body = `
sc("mount", "mount", b"none", b"/tmp", b"tmpfs", 0, None)
sc("umount2", "umount2", b"/proc", 2)
sc("pivot_root", "pivot_root", b"/tmp", b"/tmp")
sc("chroot", "chroot", b"/tmp")
sc("open_tree", "open_tree", -100, b"/", 0)
sc("fsopen", "fsopen", b"tmpfs", 0)
sc("move_mount", "move_mount", -1, b"", -100, b"/tmp", 0)
sc("mount_setattr", "mount_setattr", -100, b"/", 0, None, 0)
sc("unshare_user", "unshare", ${CLONE_NEWUSER})
sc("unshare_mnt", "unshare", ${CLONE_NEWNS})
sc("unshare_net", "unshare", ${CLONE_NEWNET})
fd = os.open("/proc/self/ns/net", os.O_RDONLY)
sc("setns", "setns", fd, 0)
sc("clone_newuser", "clone", ${CLONE_NEWUSER | SIGCHLD}, 0, 0, 0, 0)
sc("clone3", "clone3", None, 0)
`;
    await expectDenied(body, {
      mount: EPERM, umount2: EPERM, pivot_root: EPERM, chroot: EPERM, open_tree: EPERM, fsopen: EPERM, move_mount: EPERM,
      mount_setattr: EPERM, unshare_user: EPERM, unshare_mnt: EPERM, unshare_net: EPERM, setns: EPERM, clone_newuser: EPERM, clone3: ENOSYS,
    });
  });

  b.attack("bpf, perf_event_open, userfaultfd, io_uring, keyrings, ptrace and process_vm are denied", async () => {
    const body = `
sc("bpf", "bpf", 0, None, 0)
sc("perf_event_open", "perf_event_open", None, 0, -1, -1, 0)
sc("userfaultfd", "userfaultfd", 0)
sc("io_uring_setup", "io_uring_setup", 1, None)
sc("io_uring_enter", "io_uring_enter", -1, 0, 0, 0, None, 0)
sc("io_uring_register", "io_uring_register", -1, 0, None, 0)
sc("keyctl", "keyctl", 1, None)
sc("add_key", "add_key", b"user", b"ci-sec", b"data", 4, -2)
sc("request_key", "request_key", b"user", b"ci-sec", None, -2)
sc("ptrace", "ptrace", 0, 0, None, None)
sc("process_vm_readv", "process_vm_readv", 1, None, 0, None, 0, 0)
sc("pidfd_getfd", "pidfd_getfd", -1, 0, 0)
sc("kcmp", "kcmp", 1, 1, 0, 0, 0)
sc("name_to_handle_at", "name_to_handle_at", -100, b"/", None, None, 0)
sc("open_by_handle_at", "open_by_handle_at", -100, None, 0)
sc("memfd_create", "memfd_create", b"ci-sec", 0)
sc("shmget", "shmget", 0, 4096, 0o1600)
sc("msgget", "msgget", 0, 0o1600)
sc("fanotify_init", "fanotify_init", 0, 0)
`;
    await expectDenied(body, {
      bpf: EPERM, perf_event_open: EPERM, userfaultfd: EPERM, io_uring_setup: EPERM, io_uring_enter: EPERM, io_uring_register: EPERM,
      keyctl: EPERM, add_key: EPERM, request_key: EPERM, ptrace: EPERM, process_vm_readv: EPERM, pidfd_getfd: EPERM, kcmp: EPERM,
      name_to_handle_at: EPERM, open_by_handle_at: EPERM, memfd_create: EPERM, shmget: EPERM, msgget: EPERM, fanotify_init: EPERM,
    });
  });

  b.attack("clock setting, modules, kexec, reboot, swap, acct, syslog and personality flags are denied", async () => {
    const body = `
now = timespec()
libc.clock_gettime(0, ctypes.byref(now))
sc("clock_settime", "clock_settime", 0, ctypes.byref(now))
tv = timeval(now.sec, now.nsec // 1000)
sc("settimeofday", "settimeofday", ctypes.byref(tv), None)
sc("adjtimex", "adjtimex", None)
sc("clock_adjtime", "clock_adjtime", 0, None)
sc("init_module", "init_module", None, 0, b"")
sc("finit_module", "finit_module", -1, b"", 0)
sc("delete_module", "delete_module", b"ci_sec_nonexistent", 0)
sc("kexec_load", "kexec_load", 0, 0, None, 0x7fff0000)
sc("kexec_file_load", "kexec_file_load", -1, -1, 0, None, 0x7fff0000)
sc("reboot", "reboot", 0, 0, 0, None)  # bad magic numbers: never a reboot
sc("swapon", "swapon", b"/ci-sec-nonexistent", 0)
sc("swapoff", "swapoff", b"/ci-sec-nonexistent")
sc("acct", "acct", b"/ci-sec-nonexistent")
buf = ctypes.create_string_buffer(4096)
sc("syslog", "syslog", 3, buf, 4096)
sc("personality_no_aslr", "personality", 0x0040000)
sc("personality_exec", "personality", 0x0400000)
sc("quotactl", "quotactl", 0, None, 0, None)
sc("vhangup", "vhangup")
sc("tiocsti", "ioctl", 0, 0x5412, ctypes.c_char_p(b"x"))
sc("sethostname", "sethostname", b"x", 1)
sc("setdomainname", "setdomainname", b"x", 1)
`;
    await expectDenied(body, {
      clock_settime: EPERM, settimeofday: EPERM, adjtimex: EPERM, clock_adjtime: EPERM, init_module: EPERM, finit_module: EPERM,
      delete_module: EPERM, kexec_load: EPERM, kexec_file_load: EPERM, reboot: EPERM, swapon: EPERM, swapoff: EPERM, acct: EPERM,
      syslog: EPERM, personality_no_aslr: EPERM, personality_exec: EPERM, quotactl: EPERM, vhangup: EPERM, tiocsti: EPERM,
      sethostname: EPERM, setdomainname: EPERM,
    });
  });

  b.attack("kernel AIO is denied: io_setup cannot take the host's AIO pool (fs.aio-nr)", async () => {
    const body = `
def aio_nr():
    try:
        with open("/proc/sys/fs/aio-nr") as f:
            return int(f.read())
    except OSError:
        return None
before = aio_nr()
ctx = ctypes.c_ulong(0)
sc("io_setup", "io_setup", 32768, ctypes.byref(ctx))
during = aio_nr()
if calls["io_setup"].get("r") == 0:
    libc.syscall(ctypes.c_long(NR["io_destroy"]), ctx)
sc("io_destroy", "io_destroy", 0)
sc("io_submit", "io_submit", 0, 0, None)
sc("io_cancel", "io_cancel", 0, None, None)
sc("io_getevents", "io_getevents", 0, 0, 0, None, None)
sc("io_pgetevents", "io_pgetevents", 0, 0, 0, None, None, None)
extra["aio_nr"] = [before, during]
`;
    const aioNotTaken = (rep) => {
      const [before, during] = rep.extra.aio_nr;
      if (before !== null && during !== null)
        assert.ok(during - before < 32768, `fs.aio-nr went from ${before} to ${during} while the task held its io_setup(32768)`);
    };
    await expectDenied(body, {
      io_setup: EPERM, io_destroy: EPERM, io_submit: EPERM, io_cancel: EPERM, io_getevents: EPERM, io_pgetevents: EPERM,
    }, aioNotTaken);
  });

  b.attack("memfd_secret, modify_ldt and the NUMA page movers (mbind, move_pages, migrate_pages) are denied", async () => {
    const body = `
sc("memfd_secret", "memfd_secret", 0)
sc("modify_ldt", "modify_ldt", 0, ctypes.create_string_buffer(16), 16)
sc("move_pages", "move_pages", 0, 0, None, None, None, 0)
sc("migrate_pages", "migrate_pages", 0, 0, None, None)
sc("mbind", "mbind", None, 0, 0, None, 0, 0)
sc("set_mempolicy_home_node", "set_mempolicy_home_node", 0, 0, 0, 0)
`;
    await expectDenied(body, {
      memfd_secret: EPERM, modify_ldt: EPERM, move_pages: EPERM, migrate_pages: EPERM, mbind: EPERM, set_mempolicy_home_node: EPERM,
    });
  });

  b.attack(
    "system calls newer than the filter's libseccomp (statmount, listmount, lsm_*, mseal, *xattrat, open_tree_attr) answer ENOSYS",
    async () => {
      const body = Object.entries(NEWER).map(([name, [, args]]) => `sc("${name}", "${name}", ${args})`).join("\n") + `
sc("nr_500", "nr_500")
sc("nr_1000", "nr_1000")
`;
      const expected = { nr_500: ENOSYS, nr_1000: ENOSYS };
      for (const name of hostHas) expected[name] = ENOSYS;
      const code = `${PRELUDE}NR["nr_500"] = 500\nNR["nr_1000"] = 1000\n${body}\nreport(calls=calls)\n`;
      const { result: r, report: rep } = await b.run(code);
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      const bad = Object.entries(expected)
        .filter(([key, errno]) => !rep.calls[key] || rep.calls[key].r >= 0 || rep.calls[key].errno !== errno)
        .map(([key]) => `${key}: ${JSON.stringify(rep.calls[key])} (outside: errno ${hostErrno[key]})`);
      assert.deepEqual(bad, [], `calls that reached the kernel: ${JSON.stringify(rep.calls)}`);
    },
    { skip: hostHas.length ? undefined : `this kernel has none of ${Object.keys(NEWER).join(", ")} (each answers ENOSYS outside the sandbox too)` },
  );

  b.attack(
    "a system call through another ABI (x32) kills the process instead of dodging the filter",
    async () => {
      const code = `
import subprocess, sys
probe = "import ctypes; libc = ctypes.CDLL(None); libc.syscall.restype = ctypes.c_long; print(libc.syscall(ctypes.c_long(0x40000000 | 39)))"
p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
ok = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
report(rc=p.returncode, out=p.stdout, err=p.stderr[-300:], control=ok.returncode)
`;
      const { result: r, report: rep } = await b.run(code);
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(rep.control, 0, "a plain child runs");
      assert.equal(rep.rc, -31, `the x32 getpid must be killed by SIGSYS: ${JSON.stringify(rep)}`);
    },
    { skip: arch() === "x64" ? undefined : `x32 exists on x86_64 only (this is ${arch()})` },
  );

  b.attack("the denials leave ordinary calls alone (control)", async () => {
    const body = `
sc("getpid", "getpid")
sc("uname", "uname", ctypes.create_string_buffer(390))
sc("personality_linux", "personality", 0)
sc("clone_plain", "clone", ${SIGCHLD}, 0, 0, 0, 0)
sc("futex_waitv", "futex_waitv", None, 0, 0, None, 0)
sc("get_mempolicy", "get_mempolicy", None, None, 0, None, 0)
`;
    const code = `${PRELUDE}${body}\nreport(calls=calls)\n`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    for (const k of ["getpid", "uname", "personality_linux", "clone_plain"]) {
      assert.ok(rep.calls[k].r >= 0, `${k} works: ${JSON.stringify(rep.calls)}`);
    }
    // A number near the top of what the filter knows still reaches the kernel
    // (the answer it gives outside, EINVAL): the ENOSYS guard starts above.
    if (NR.futex_waitv && hostErrno.futex_waitv !== ENOSYS)
      assert.equal(rep.calls.futex_waitv.errno, hostErrno.futex_waitv, `futex_waitv reaches the kernel: ${JSON.stringify(rep.calls)}`);
    assert.equal(rep.calls.get_mempolicy.r, 0, `get_mempolicy works: ${JSON.stringify(rep.calls)}`);
  });
});

b.finish();
