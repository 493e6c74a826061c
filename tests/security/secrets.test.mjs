// Attack battery: the worker's secrets. The worker starts with canaries in
// its environment, in its config file (the NATS token and a comment) and in
// a credentials file beside the config; the code tries every way we know to
// read them and prints (and saves as an artifact) whatever it got. No canary
// may appear anywhere in what comes back: stdout, stderr, error, hint, the
// raw KV value, the status events, the artifacts.
import { after, describe } from "node:test";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { assert, rand, show, startBattery } from "./lib/battery.mjs";

const CANARY_ENV = `envcanary${rand()}`;
const CANARY_TOKEN = `tokencanary${rand()}`;
const CANARY_COMMENT = `commentcanary${rand()}`;
const CANARY_CREDS = `credscanary${rand()}`;
const CANARY_PATH = `pathcanary${rand()}`;
const CANARIES = [CANARY_ENV, CANARY_TOKEN, CANARY_COMMENT, CANARY_CREDS, CANARY_PATH];

// Fake credentials files (nats-server here takes no auth, so the worker is
// not told to use them: they only have to be host files the code must not
// read). The code is given the first one's path; the second one's path
// holds a canary and is written only in the worker's config, so the code
// would have to read the config or list the folder to learn it.
const credsDir = mkdtempSync(join(tmpdir(), "ci-sec-creds-"));
const credsPath = join(credsDir, "user.creds");
const hiddenCredsPath = join(credsDir, `${CANARY_PATH}.creds`);
const credsText = `-----BEGIN NATS USER JWT-----\n${CANARY_CREDS}\n------END NATS USER JWT------\n`;
writeFileSync(credsPath, credsText, { mode: 0o600 });
writeFileSync(hiddenCredsPath, credsText, { mode: 0o644 });
after(() => rmSync(credsDir, { recursive: true, force: true }));

const b = await startBattery("secrets", {
  worker: {
    env: { CI_CANARY_SECRET: CANARY_ENV, NATS_TOKEN: CANARY_TOKEN },
    nats: { token: CANARY_TOKEN },
    extraYaml: `# ${CANARY_COMMENT}\n# creds_file: ${hiddenCredsPath}\n`,
  },
});
const w = b.worker;

// Every byte a client can get back for a task.
async function everythingReturned(taskId, result, bytes) {
  const parts = [Buffer.from(bytes), Buffer.from(JSON.stringify(result))];
  for (const e of await b.client.events(taskId)) parts.push(Buffer.from(e.bytes));
  for (const a of result.artifacts) {
    const data = await b.client.getObject(a.object);
    assert.ok(data, `artifact ${a.name} is in the store`);
    parts.push(Buffer.from(data));
  }
  return Buffer.concat(parts).toString("latin1");
}

function assertNoCanary(text, what) {
  for (const c of CANARIES) assert.ok(!text.includes(c), `canary ${c} leaked into ${what}`);
}

describe("secrets", { concurrency: 2 }, () => {
  b.attack("the canaries are really planted on the host (control)", async () => {
    const env = readFileSync(`/proc/${w.pid}/environ`, "latin1");
    assert.ok(env.includes(CANARY_ENV), "the worker's environment holds the canary");
    const cfg = readFileSync(w.configPath, "utf8");
    assert.ok(cfg.includes(CANARY_TOKEN) && cfg.includes(CANARY_COMMENT) && cfg.includes(CANARY_PATH), "the config holds the canaries");
    assert.ok(readFileSync(credsPath, "utf8").includes(CANARY_CREDS));
  });

  b.attack("environment, /proc environs and cmdlines, the config, the creds file, /etc/shadow and inherited fds give no canary", async () => {
    const code = `
import os, stat, sys
def read(path, n=1 << 20):
    with open(path, "rb") as f:
        return f.read(n).decode("latin1")
attempt("os_environ", lambda: dict(os.environ))
attempt("self_environ", lambda: read("/proc/self/environ"))
attempt("init_environ", lambda: read("/proc/1/environ"))
attempt("init_cmdline", lambda: read("/proc/1/cmdline"))
attempt("ppid", lambda: os.getppid())
attempt("parent_environ", lambda: read("/proc/%d/environ" % os.getppid()))
attempt("parent_cmdline", lambda: read("/proc/%d/cmdline" % os.getppid()))
attempt("worker_host_pid_environ", lambda: read("/proc/${w.pid}/environ"))
attempt("config", lambda: read(${JSON.stringify(w.configPath)}))
attempt("config_dir", lambda: os.listdir(${JSON.stringify(w.dir)}))
attempt("config_via_init_root", lambda: read("/proc/1/root" + ${JSON.stringify(w.configPath)}))
attempt("creds", lambda: read(${JSON.stringify(credsPath)}))
attempt("creds_dir", lambda: os.listdir(${JSON.stringify(credsDir)}))
attempt("shadow", lambda: read("/etc/shadow"))
attempt("mountinfo", lambda: read("/proc/self/mountinfo"))
# Every process of the sandbox, every fd this process holds.
procs = {}
for p in os.listdir("/proc"):
    if p.isdigit():
        for what in ("environ", "cmdline"):
            try:
                procs[p + "/" + what] = read("/proc/%s/%s" % (p, what))
            except Exception as e:
                procs[p + "/" + what] = type(e).__name__
fds = {}
for fd in range(0, 1024):
    try:
        st = os.fstat(fd)
    except OSError:
        continue
    try:
        target = os.readlink("/proc/self/fd/%d" % fd)
    except OSError as e:
        target = type(e).__name__
    data = ""
    if stat.S_ISREG(st.st_mode):
        try:
            data = os.pread(fd, 1 << 16, 0).decode("latin1")
        except OSError as e:
            data = type(e).__name__
    fds[fd] = [target, stat.S_IFMT(st.st_mode), data]
# Every readable small file outside /usr and /proc.
found = {}
for top in ("/etc", "/var", "/tmp", "/workspace", "/dev/shm", "/"):
    for root, dirs, files in os.walk(top):
        if root == "/":
            dirs[:] = []
        for n in files:
            p = os.path.join(root, n)
            try:
                if os.path.isfile(p):
                    found[p] = read(p, 1 << 14)
            except Exception as e:
                found[p] = type(e).__name__
report(procs=procs, fds=fds, n_files=len(found), env_keys=sorted(os.environ))
# All of it goes back three ways: stdout (above), stderr and an artifact.
loot = _json.dumps({"results": _results, "files": found})[: 15 << 20]
with open("loot.csv", "w") as f:
    f.write(loot)
print(loot[:200000], file=sys.stderr)
`;
    const { taskId, result: r, report: rep, bytes } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    // The reading worked (so a canary would have shown).
    assert.equal(rep.os_environ.ok, true, JSON.stringify(rep.os_environ));
    assert.ok(rep.env_keys.includes("HOME"), `os.environ was read: ${rep.env_keys}`);
    assert.equal(rep.self_environ.ok, true, JSON.stringify(rep.self_environ));
    assert.ok(Object.values(rep.procs).some((v) => v.includes("HOME=")), "/proc/*/environ was read");
    assert.ok(rep.n_files > 3, `files were read: ${rep.n_files}`);
    // Only stdin (/dev/null), stdout, stderr and the driver's report pipe
    // are open: nothing of the worker's (its NATS socket, its config).
    assert.deepEqual(Object.keys(rep.fds).sort(), ["0", "1", "100", "2"], `fds the code holds: ${JSON.stringify(rep.fds)}`);
    assert.ok(Object.values(rep.fds).every(([target]) => /^(pipe:|\/dev\/null$)/.test(target)), `fds the code holds: ${JSON.stringify(rep.fds)}`);
    assert.ok(r.artifacts.some((a) => a.name === "loot.csv"), `the loot came back as an artifact: ${show({ ...r, stdout: "", stderr: r.stderr.slice(-500) })}`);
    // The host's secrets are out of reach.
    for (const k of ["config", "config_dir", "config_via_init_root", "creds", "creds_dir", "shadow", "worker_host_pid_environ"]) {
      assert.equal(rep[k].ok, false, `${k} must fail: ${JSON.stringify(rep[k])}`);
    }
    assertNoCanary(await everythingReturned(taskId, r, bytes), "the task's result, events or artifacts");
  });

  b.attack("an exception and the report channel carrying the environment give no canary either", async () => {
    // The driver formats errors and hints from what the code raised: make
    // it raise with everything it can find in the message.
    const code = `
import os
env = dict(os.environ)
try:
    env["init"] = open("/proc/1/environ", "rb").read().decode("latin1")
except Exception as e:
    env["init"] = repr(e)
raise RuntimeError(repr(env))
`;
    const { taskId, result: r, bytes } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
    assert.match(r.error, /RuntimeError/, show(r));
    assert.match(r.stderr, /HOME/, "the environment was in the exception");
    assertNoCanary(await everythingReturned(taskId, r, bytes), "a failed task's result");
  });
});

b.finish();
