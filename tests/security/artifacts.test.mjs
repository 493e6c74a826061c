// Attack battery: artifacts. The worker reads files the code left in
// /workspace; that is how Judge0 was broken (a symlink the host followed).
// Symlinks to host files, a directory symlink to '/', hard links, FIFOs,
// sockets and a process racing to swap a file for a symlink: nothing of the
// host may come back, only the regular files the code wrote, and the worker
// must not hang on a FIFO.
import { describe } from "node:test";
import { readFileSync } from "node:fs";

import { assert, show, startBattery } from "./lib/battery.mjs";

const b = await startBattery("artifacts");
const w = b.worker;

// Host texts that must never come back, whole or in part.
const HOST_SECRETS = [
  readFileSync("/etc/passwd", "utf8").split("\n")[0],
  (() => {
    try {
      return readFileSync("/etc/shadow", "utf8").split("\n")[0];
    } catch {
      return null;
    }
  })(),
  w.yaml.split("\n").find((l) => l.includes("url:")),
].filter(Boolean);

// Artifact name -> content, fetched from the object store.
async function fetchAll(result) {
  const out = {};
  for (const a of result.artifacts) {
    const data = await b.client.getObject(a.object);
    assert.ok(data, `artifact ${a.name} is in the store`);
    out[a.name] = Buffer.from(data);
    assert.equal(out[a.name].length, a.size, `size of ${a.name}`);
  }
  return out;
}

function assertNoHostContent(files) {
  for (const [name, data] of Object.entries(files)) {
    const text = data.toString("latin1");
    for (const s of HOST_SECRETS) assert.ok(!text.includes(s), `artifact ${name} holds host content: ${JSON.stringify(s)}`);
  }
}

async function assertNoObjects(taskId, names) {
  for (const n of names) assert.equal(await b.client.getObject(`${taskId}/${n}`), null, `an object was stored for ${n}`);
}

const REAL = "real,csv\n1,2\n";

// The names of the objects stored under taskId/, from the bucket's stream.
async function storedNames(taskId) {
  const prefix = "$O.ci-files.M.";
  const si = await b.client.jsm.streams.info("OBJ_ci-files", { subjects_filter: `${prefix}>` });
  return Object.keys(si.state.subjects ?? {})
    .map((s) => Buffer.from(s.slice(prefix.length), "base64url").toString("utf8"))
    .filter((n) => n.startsWith(`${taskId}/`))
    .map((n) => n.slice(taskId.length + 1))
    .sort();
}

describe("artifacts", { concurrency: 3 }, () => {
  b.attack("symlinks to /etc/passwd, /etc/shadow, the worker config, /proc and a PNG, and directory symlinks to / and /etc, bring nothing back", async () => {
    const code = `
import os, glob
pngs = glob.glob("/usr/share/matplotlib/mpl-data/images/*.png") + glob.glob("/usr/share/**/*.png", recursive=True)[:1]
links = {
    "passwd.csv": "/etc/passwd",
    "shadow.csv": "/etc/shadow",
    "config.csv": ${JSON.stringify(w.configPath)},
    "environ.csv": "/proc/1/environ",
    "mounts.csv": "/proc/self/mounts",
    "rel.csv": "../etc/passwd",
    "host.png": pngs[0] if pngs else "/nonexistent.png",
    "rootdir": "/",
}
for name, target in links.items():
    attempt("symlink " + name, lambda n=name, t=target: os.symlink(t, n))
os.makedirs("sub", exist_ok=True)
attempt("symlink sub/etc", lambda: os.symlink("/etc", "sub/etc"))
attempt("symlink sub/up", lambda: os.symlink("..", "sub/up"))
with open("real.csv", "w") as f:
    f.write(${JSON.stringify(REAL)})
report(png=pngs[:1])
`;
    const { taskId, result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(rep["symlink passwd.csv"].ok, true, "the symlinks were made");
    assert.equal(rep["symlink rootdir"].ok, true);
    const files = await fetchAll(r);
    assert.deepEqual(Object.keys(files), ["real.csv"], show(r.artifacts));
    assert.equal(files["real.csv"].toString(), REAL);
    assertNoHostContent(files);
    await assertNoObjects(taskId, ["passwd.csv", "shadow.csv", "config.csv", "environ.csv", "mounts.csv", "rel.csv", "host.png", "rootdir/etc/passwd", "sub/etc/passwd"]);
  });

  b.attack("hard links (nlink 2) to a file the code made, and to an input, are not returned; a hard link to a host file fails", async () => {
    const code = `
import os
with open("a.csv", "w") as f:
    f.write("hard,link\\n")
attempt("link a->b", lambda: os.link("a.csv", "b.csv"))
attempt("nlink", lambda: os.stat("a.csv").st_nlink)
attempt("link input", lambda: os.link("in.csv", "in2.csv"))
attempt("link passwd", lambda: os.link("/etc/passwd", "passwd.csv"))
attempt("link tmp", lambda: (open("/tmp/t.csv", "w").write("x"), os.link("/tmp/t.csv", "t.csv")))
with open("real.csv", "w") as f:
    f.write(${JSON.stringify(REAL)})
report()
`;
    const { taskId, result: r, report: rep } = await b.run(code, { files: [{ name: "in.csv", content: Buffer.from("input,file\n") }] });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(rep["link a->b"].ok, true, JSON.stringify(rep));
    assert.equal(rep.nlink.value, "2");
    assert.equal(rep["link passwd"].ok, false, "a hard link to a host file fails");
    assert.equal(rep["link tmp"].ok, false, "a hard link across the task's file systems fails");
    const files = await fetchAll(r);
    assert.deepEqual(Object.keys(files), ["real.csv"], show(r.artifacts));
    assertNoHostContent(files);
    await assertNoObjects(taskId, ["a.csv", "b.csv", "in.csv", "in2.csv", "passwd.csv"]);
  });

  b.attack("a FIFO (also as figure-1.png), a unix socket and a FIFO held open by a writer do not hang the worker", async () => {
    const marker = b.marker();
    const code = `
import os, socket, subprocess, sys
os.mkfifo("fifo.csv")
os.mkfifo("figure-1.png")
os.makedirs("sub")
os.mkfifo("sub/deep.png")
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("sock.csv")
s.listen(1)
# A writer that holds a FIFO open and would feed it forever.
os.mkfifo("held.csv")
subprocess.Popen([sys.executable, "-c", "import os\\nf = os.open('held.csv', os.O_RDWR)\\nwhile True: os.write(f, b'x' * 4096)", ${JSON.stringify(marker)}], start_new_session=True)
import matplotlib.pyplot as plt
plt.plot([1, 2, 3])
with open("real.csv", "w") as f:
    f.write(${JSON.stringify(REAL)})
report()
`;
    // The worker's own time for it (not the queue's), with room for a loaded
    // machine and matplotlib's import; a hang held to the task's limit
    // would take 60 s.
    const { taskId, result: r } = await b.run(code, { limits: { timeoutMs: 60000 } });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    const took = Number(r.finishedAtMs) - Number(r.startedAtMs);
    assert.ok(took < 30000, `the task took ${took} ms: the worker hung on a FIFO`);
    const files = await fetchAll(r);
    // The driver never overwrites: the figure went to the next free name.
    assert.deepEqual(Object.keys(files).sort(), ["figure-2.png", "real.csv"], show(r.artifacts));
    assert.equal(files["figure-2.png"].subarray(1, 4).toString(), "PNG");
    await assertNoObjects(taskId, ["fifo.csv", "figure-1.png", "sub/deep.png", "sock.csv", "held.csv"]);
  });

  b.attack("a process racing to swap files for symlinks to host files until it is killed brings nothing back", async () => {
    const marker = b.marker();
    const racer = `
import os
os.makedirs("d", exist_ok=True)
while True:
    for n, t in (("race.csv", "/etc/passwd"), ("race.png", "/etc/shadow"), ("d/x.csv", "/etc/passwd")):
        tmp = n + ".tmp"
        try:
            os.symlink(t, tmp)
            os.rename(tmp, n)
            with open(tmp, "w") as f:
                f.write("safe,csv\\n")
            os.rename(tmp, n)
        except OSError:
            pass
    try:
        os.rename("d", "d.old")
        os.symlink("/etc", "d")
        os.unlink("d")
        os.rename("d.old", "d")
    except OSError:
        pass
`;
    const code = `
import subprocess, sys, time
for i in range(2):
    subprocess.Popen([sys.executable, "-c", ${JSON.stringify(racer)}, ${JSON.stringify(marker)}], start_new_session=True)
time.sleep(1.0)
import os
report(seen=sorted(os.listdir(".")), links=[n for n in os.listdir(".") if os.path.islink(n)])
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.ok(rep.seen.includes("race.csv") && rep.seen.includes("race.png"), `the racers ran: ${JSON.stringify(rep.seen)}`);
    const files = await fetchAll(r);
    for (const [name, data] of Object.entries(files)) {
      // A racer killed between its two renames leaves d.old behind (seen in
      // both modes): a real file of its own, so it may come back.
      assert.match(name, /^(race\.csv|d(\.old)?\/x\.csv)$/, `unexpected artifact ${name}`);
      assert.equal(data.toString(), "safe,csv\n", `artifact ${name} has foreign content`);
    }
    assertNoHostContent(files);
  });

  b.attack("names that are not UTF-8 or hold control characters, a deep tree and 3000 entries: nothing odd comes back and the worker does not stall", async () => {
    const code = `
import os
for n in (b"bad\\xff.csv", b"new\\nline.csv", b"esc\\x1b[31m.csv", b"del\\x7f.csv"):
    with open(n, "wb") as f:
        f.write(b"x,y\\n")
p = "deep"
for i in range(60):
    p = os.path.join(p, "d")
os.makedirs(p)
with open(os.path.join(p, "bottom.csv"), "w") as f:
    f.write("a\\n")
os.makedirs("many")
made = 0
try:
    for i in range(3000):
        open("many/%05d.txt" % i, "w").close()
        made += 1
except OSError as e:
    print("stopped", e)
with open("real.csv", "w") as f:
    f.write(${JSON.stringify(REAL)})
report(made=made)
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    // The worker's own time for it (not the queue's), with room for a loaded machine.
    const took = Number(r.finishedAtMs) - Number(r.startedAtMs);
    assert.ok(took < 30000, `bounded time: ${took} ms`);
    assert.ok(rep.made > 1000, `entries were made: ${rep.made}`);
    for (const a of r.artifacts) {
      assert.doesNotMatch(a.name, /[\u0000-\u001f\u007f-\u009f\ufffd]/, `artifact name ${JSON.stringify(a.name)}`);
      assert.doesNotMatch(a.name, /(^|\/)\.\.?(\/|$)/);
    }
    assert.ok(!r.artifacts.some((a) => a.name.endsWith("bottom.csv")), "the walk has a depth limit");
    assert.ok(r.artifacts.some((a) => a.name === "real.csv"), `the walk still works: ${show(r.artifacts)}`);
  });

  b.attack("names with a bidi override, zero-width, BOM, tag, soft hyphen or line separator do not come back; a note names them escaped", async () => {
    // "x\u202egnp.csv" shows as "xvsc.png"; "a\u200b.csv" looks like "a.csv".
    const code = String.raw`
import os
png = b"\x89PNG\r\n\x1a\n" + b"\0" * 16
for n in ("report\u202egnp.csv", "a\u200b.csv", "\ufeffbom.csv", "x\u2028y.csv", "soft\u00adhyphen.csv",
          "tag\U000e0041.csv", "arabic\u0600.csv", "hiero\U0001343f.csv"):
    with open(n, "w") as f:
        f.write("x,y\n")
with open("img\u2066.png", "wb") as f:
    f.write(png)
os.makedirs("dir\u200d")
with open("dir\u200d/inner.csv", "w") as f:
    f.write("in,dir\n")
with open("caf\u00e9 \u4e2d.csv", "w") as f:
    f.write("fine,name\n")
with open("real.csv", "w") as f:
    f.write("real,csv\n1,2\n")
report(made=sorted(os.listdir(".")))
`;
    const { taskId, result: r, report: rep } = await b.run(code);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.ok(rep.made.includes("report\u202egnp.csv"), `the files were made: ${JSON.stringify(rep.made)}`);
    assert.deepEqual(r.artifacts.map((a) => a.name).sort(), ["caf\u00e9 \u4e2d.csv", "real.csv"], show(r.artifacts));
    const hidden = /[\u00ad\u0600-\u0605\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]|\u{e0041}|\u{1343f}/u;
    for (const a of r.artifacts) assert.doesNotMatch(a.name, hidden);
    // The object store holds the task's two artifacts and nothing else (the
    // JS client cannot look up names beyond Latin-1: read the metadata
    // subjects, $O.<bucket>.M.<base64url of the name>, instead).
    assert.deepEqual(await storedNames(taskId), ["caf\u00e9 \u4e2d.csv", "real.csv"]);
    // The agent learns what was skipped, and the note itself holds only text.
    assert.ok(!hidden.test(r.error), `the note quotes the names escaped: ${JSON.stringify(r.error)}`);
    assert.match(r.error, /'arabic\\u0600\.csv' \(U\+0600\)/, JSON.stringify(r.error));
    assert.match(r.error, /'dir\\u200d' \(U\+200D\)/, JSON.stringify(r.error));
    assert.match(r.error, /'hiero\\U0001343f\.csv' \(U\+1343F\)/, JSON.stringify(r.error));
    assert.match(r.error, /'a\\u200b\.csv' \(U\+200B\)/, JSON.stringify(r.error));
    assert.match(r.error, /and others were skipped: artifact names must be UTF-8 without control or format characters/, JSON.stringify(r.error));
  });

  b.attack("an artifact path of 2 KB and 990 small artifacts: refused or stored, without a stall", async () => {
    const code = `
import os
os.chdir("/workspace")
for i in range(7):
    os.mkdir("d%d" % i + "x" * 240)
    os.chdir("d%d" % i + "x" * 240)
with open("y" * 250 + ".csv", "w") as f:
    f.write("a,b\\n")
os.chdir("/workspace")
for i in range(990):
    with open("f%04d.csv" % i, "w") as f:
        f.write("a,b\\n%d,1\\n" % i)
report(made=True)
`;
    const t0 = Date.now();
    const { result: r, report: rep } = await b.run(code, { limits: { timeoutMs: 30000 } });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show({ ...r, artifacts: r.artifacts.length }));
    assert.equal(rep.made, true);
    assert.ok(Date.now() - t0 < 30000, `took ${Date.now() - t0} ms`);
    assert.ok(!r.artifacts.some((a) => a.name.length > 1024), "no over-long object name was stored");
    assert.match(r.error, /object name/i, "the long one is named in a note");
    const sample = r.artifacts.find((a) => a.name === "f0500.csv");
    assert.ok(sample, `the small artifacts were stored: ${r.artifacts.length}`);
    assert.equal(Buffer.from(await b.client.getObject(sample.object)).toString(), "a,b\n500,1\n");
  });
});

b.finish();
