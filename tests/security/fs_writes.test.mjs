// Attack battery: writes outside the task. Nothing of the host is writable:
// not /, not /etc, not the runtime's site-packages; /tmp and /dev/shm are the
// task's own. Every write is checked on the host afterwards: nothing was
// created or changed.
import { describe } from "node:test";
import { existsSync, readFileSync, statSync } from "node:fs";
import { hostname } from "node:os";

import { assert, rand, show, startBattery } from "./lib/battery.mjs";

const b = await startBattery("fs_writes");

// The host files a write could corrupt: their mtime and ctime before and after.
function stamp(paths) {
  const out = {};
  for (const p of paths) {
    try {
      const st = statSync(p);
      out[p] = `${st.mtimeMs}/${st.ctimeMs}/${st.size}/${st.mode}`;
    } catch {
      out[p] = "absent";
    }
  }
  return out;
}

function assertFailed(rep, keys) {
  for (const k of keys) {
    assert.ok(rep[k], `no attempt ${k}`);
    assert.equal(rep[k].ok, false, `${k} must fail inside the sandbox: ${JSON.stringify(rep[k])}`);
  }
}

describe("fs_writes", { concurrency: 3 }, () => {
  b.attack("writes to /, /etc, the runtime's site-packages, /usr/local, /var, /bin fail; nothing appears on the host", async () => {
    const u = `ci-sec-${rand()}`;
    const targets = {
      root: `/${u}`,
      etc: `/etc/${u}`,
      dist_packages: `/usr/lib/python3/dist-packages/${u.replace(/-/g, "_")}.py`,
      usr_local: `/usr/local/lib/${u}.py`,
      var: `/var/${u}`,
      var_cache: `/var/cache/fontconfig/${u}`,
      bin: `/bin/${u}`,
      usr_bin: `/usr/bin/${u}`,
    };
    const guarded = ["/usr/bin/python3", "/etc/passwd", "/etc/hostname", "/etc/ld.so.cache", "/usr/lib/python3/dist-packages"];
    const before = stamp(guarded);
    const code = `
import os, glob
def put(p, data, mode="w"):
    # A with block: an error at close (where a buffered write lands) counts.
    with open(p, mode) as f:
        f.write(data)
    return "WROTE"
T = ${JSON.stringify(targets)}
def write(p):
    with open(p, "w") as f:
        f.write("import os; os.system('echo pwned')\\n")
    return "WROTE"
for k, p in T.items():
    attempt("write_" + k, lambda p=p: write(p))
attempt("mkdir_root", lambda: os.mkdir("/${u}-dir"))
attempt("mkdir_etc", lambda: os.mkdir("/etc/${u}-dir"))
attempt("symlink_root", lambda: os.symlink("/workspace", "/${u}-link"))
attempt("append_python", lambda: put("/usr/bin/python3", b"x", "ab"))
attempt("chmod_python", lambda: os.chmod("/usr/bin/python3", 0o777))
attempt("utime_python", lambda: os.utime("/usr/bin/python3", (0, 0)))
attempt("unlink_etc_passwd", lambda: os.unlink("/etc/passwd"))
attempt("rename_etc_hostname", lambda: os.rename("/etc/hostname", "/etc/${u}"))
attempt("append_ld_cache", lambda: put("/etc/ld.so.cache", b"x", "ab"))
site = glob.glob("/etc/python3*/sitecustomize.py")
attempt("sitecustomize", lambda: put(site[0] if site else "/etc/python3/sitecustomize.py", "import os\\n", "a"))
attempt("mknod", lambda: os.mknod("/workspace/${u}-null", 0o666 | 0o020000, os.makedev(1, 3)))
# The control: the workspace itself is writable.
attempt("workspace", lambda: write("/workspace/${u}.txt"))
report()
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(rep.workspace.ok, true, `the workspace is writable: ${JSON.stringify(rep.workspace)}`);
    assertFailed(rep, [
      ...Object.keys(targets).map((k) => `write_${k}`),
      "mkdir_root", "mkdir_etc", "symlink_root", "append_python", "chmod_python", "utime_python",
      "unlink_etc_passwd", "rename_etc_hostname", "append_ld_cache", "sitecustomize", "mknod",
    ]);
    // Checked on the host.
    for (const p of [...Object.values(targets), `/${u}-dir`, `/etc/${u}-dir`, `/${u}-link`, `/etc/${u}`]) {
      assert.equal(existsSync(p), false, `${p} was created on the host`);
    }
    assert.deepEqual(stamp(guarded), before, "a host file was changed");
  });

  b.attack("/tmp, /dev/shm and /var/tmp writes stay in the task: nothing appears in the host's", async () => {
    const u = `ci-sec-${rand()}`;
    const code = `
import os
def write(p):
    with open(p, "w") as f:
        f.write("${u}")
    return open(p).read()
attempt("tmp", lambda: write("/tmp/${u}"))
attempt("dev_shm", lambda: write("/dev/shm/${u}"))
attempt("var_tmp", lambda: write("/var/tmp/${u}"))
attempt("via_init_root", lambda: write("/proc/1/root/tmp/${u}-init"))
attempt("via_self_root", lambda: write("/proc/self/root/../../tmp/${u}-self"))
attempt("via_workspace_dotdot", lambda: write("/workspace/../tmp/${u}-dotdot"))
attempt("via_cwd", lambda: write("/proc/self/cwd/../tmp/${u}-cwd"))
attempt("listing", lambda: sorted(os.listdir("/tmp")))
report()
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    // The task's private /tmp and /dev/shm work (so the host check below
    // is about a write that really happened).
    assert.equal(rep.tmp.ok, true, JSON.stringify(rep.tmp));
    assert.equal(rep.dev_shm.ok, true, JSON.stringify(rep.dev_shm));
    assert.doesNotMatch(rep.listing.value, /ci-nats-|ci-worker-|ci-sec-creds/, "the host's /tmp is visible");
    for (const p of [`/tmp/${u}`, `/dev/shm/${u}`, `/var/tmp/${u}`, `/tmp/${u}-init`, `/tmp/${u}-self`, `/tmp/${u}-dotdot`, `/tmp/${u}-cwd`]) {
      assert.equal(existsSync(p), false, `${p} was created on the host`);
    }
    const cwd = `/proc/${b.worker.pid}/cwd`;
    assert.equal(existsSync(`${cwd}/${u}`), false, "nothing in the worker's working directory");
  });

  b.attack("/proc/sys, the hostname and oom_score_adj are not writable", async () => {
    const hostBefore = hostname();
    const corePattern = readFileSync("/proc/sys/kernel/core_pattern", "utf8");
    const code = `
import os, socket
def put(p, data, mode="w"):
    with open(p, mode) as f:
        f.write(data)
    return "WROTE"
def rewrite(p):
    # Writes back what is there: harmless even where it would succeed.
    v = open(p).read()
    with open(p, "w") as f:
        f.write(v)
    return "WROTE " + v.strip()
attempt("core_pattern", lambda: rewrite("/proc/sys/kernel/core_pattern"))
attempt("proc_hostname", lambda: rewrite("/proc/sys/kernel/hostname"))
attempt("sethostname", lambda: socket.sethostname("${"x" + rand(4)}"))
oom_before = open("/proc/self/oom_score_adj").read().strip()
attempt("oom_lower", lambda: put("/proc/self/oom_score_adj", "-1000"))
attempt("oom_value", lambda: open("/proc/self/oom_score_adj").read().strip())
attempt("sys", lambda: os.listdir("/sys"))
attempt("hostname", lambda: socket.gethostname())
report(oom_before=oom_before)
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assertFailed(rep, ["core_pattern", "proc_hostname", "sethostname", "oom_lower", "sys"]);
    // The code may raise its own OOM score (the sandbox does, to 1000), never lower it.
    assert.equal(rep.oom_value.value, `'${rep.oom_before}'`, "oom_score_adj is unchanged");
    assert.notEqual(rep.oom_value.value, "'-1000'");
    assert.equal(rep.hostname.value, "'sandbox'", "the sandbox has its own hostname");
    assert.equal(hostname(), hostBefore, "the host's hostname is unchanged");
    assert.equal(readFileSync("/proc/sys/kernel/core_pattern", "utf8"), corePattern);
  });
});

b.finish();
