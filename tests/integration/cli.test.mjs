// The `ci` command-line client against a real worker: run, submit, get,
// watch, cancel, as a person or a shell pipeline would use them.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, lstatSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { headers as natsHeaders } from "@nats-io/transport-node";

import { startStack } from "./lib/stack.mjs";
import { CLI_BIN } from "./lib/worker.mjs";
import { PNG_MAGIC, sha256hex, show } from "./lib/checks.mjs";
import { newTaskId, proto } from "./lib/client.mjs";

// Runs `ci args...` in cwd with CI_NATS_URL; resolves { code, stdout, stderr }.
// Killed after timeoutMs.
function ci(args, { cwd, url, timeoutMs = 60000 }) {
  return new Promise((resolve, reject) => {
    const env = { ...process.env, CI_NATS_URL: url };
    const child = spawn(CLI_BIN, args, { cwd, env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => (stderr += d));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
}

describe("ci command-line client", () => {
  let stack;
  let dir;
  let url;
  before(async () => {
    assert.ok(existsSync(CLI_BIN), `${CLI_BIN} is built`);
    stack = await startStack({ workers: 1, worker: { concurrency: 2 } });
    url = stack.server.url;
    dir = mkdtempSync(join(tmpdir(), "ci-cli-"));
  });
  after(async () => {
    await stack?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  // A new empty working directory for one invocation.
  const fresh = (name) => mkdtempSync(join(dir, `${name}-`));

  test("ci run script.py --file data.csv: prints the script's stdout, saves the PNG here, exits 0", async () => {
    const cwd = fresh("run");
    writeFileSync(join(cwd, "data.csv"), "city,temp\nOslo,3\nRome,18\nOslo,5\nRome,20\n");
    writeFileSync(
      join(cwd, "script.py"),
      [
        "import pandas as pd",
        "import matplotlib.pyplot as plt",
        "df = pd.read_csv('data.csv')",
        "m = df.groupby('city')['temp'].mean()",
        "for city, t in m.items():",
        "    print(f'{city} {t:.1f}')",
        "m.plot.bar()",
        "plt.savefig('chart.png')",
      ].join("\n"),
    );
    const res = await ci(["run", "script.py", "--file", "data.csv"], { cwd, url });
    assert.equal(res.code, 0, `exit code; stderr:\n${res.stderr}`);
    assert.equal(res.stdout, "Oslo 4.0\nRome 19.0\n");
    const png = readFileSync(join(cwd, "chart.png"));
    assert.deepEqual(png.subarray(0, 8), PNG_MAGIC);
    assert.ok(png.length > 1000);
  });

  test("ci run of a failing script: traceback on stderr, exit code 1", async () => {
    const cwd = fresh("fail");
    writeFileSync(join(cwd, "bad.py"), "print('partial')\nraise KeyError('no such column')\n");
    const res = await ci(["run", "bad.py"], { cwd, url });
    assert.equal(res.code, 1, `stderr:\n${res.stderr}`);
    assert.equal(res.stdout, "partial\n");
    assert.match(res.stderr, /Traceback/);
    assert.match(res.stderr, /KeyError/);
  });

  test("ci run exits with the script's own exit code", async () => {
    const cwd = fresh("exit");
    writeFileSync(join(cwd, "seven.py"), "import sys\nsys.exit(7)\n");
    const res = await ci(["run", "seven.py"], { cwd, url });
    assert.equal(res.code, 7, `stderr:\n${res.stderr}`);
  });

  test("ci run reads the code from stdin with '-'", async () => {
    const cwd = fresh("stdin");
    const res = await new Promise((resolve, reject) => {
      const child = spawn(CLI_BIN, ["run", "-"], { cwd, env: { ...process.env, CI_NATS_URL: url }, stdio: ["pipe", "pipe", "pipe"] });
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (d) => (stdout += d));
      child.stderr.on("data", (d) => (stderr += d));
      const timer = setTimeout(() => child.kill("SIGKILL"), 60000);
      child.on("error", reject);
      child.on("close", (code) => {
        clearTimeout(timer);
        resolve({ code, stdout, stderr });
      });
      child.stdin.end("print(6 * 7)\n");
    });
    assert.equal(res.code, 0, res.stderr);
    assert.equal(res.stdout, "42\n");
  });

  test("ci submit prints an id; ci watch prints events to the terminal one; ci get --json gives the result", async () => {
    const cwd = fresh("submit");
    writeFileSync(join(cwd, "s.py"), "import time\ntime.sleep(1)\nprint('submitted')\n");
    const sub = await ci(["submit", "s.py"], { cwd, url });
    assert.equal(sub.code, 0, sub.stderr);
    const id = sub.stdout.trim();
    assert.match(id, /^[A-Za-z0-9_-]{1,64}$/, `ci submit prints the task id, got ${JSON.stringify(sub.stdout)}`);

    const watch = await ci(["watch", id], { cwd, url, timeoutMs: 60000 });
    assert.equal(watch.code, 0, watch.stderr);
    const lines = watch.stdout.trim().split("\n");
    assert.ok(lines.length >= 2, `watch printed: ${watch.stdout}`);
    assert.match(lines[0], /running/);
    assert.match(lines[lines.length - 1], /succeeded/);

    const get = await ci(["get", id, "--json"], { cwd, url });
    assert.equal(get.code, 0, get.stderr);
    const r = JSON.parse(get.stdout);
    assert.equal(r.taskId, id);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED");
    assert.equal(r.stdout, "submitted\n");
    // The same as an outside client reads from the KV bucket.
    const { result } = await stack.client.waitResult(id, 5000);
    assert.equal(result.status, "TASK_STATUS_SUCCEEDED", show(result));
    assert.equal(result.stdout, r.stdout);

    const human = await ci(["get", id], { cwd, url });
    assert.equal(human.code, 0);
    assert.match(human.stdout, /succeeded/);
    assert.match(human.stdout, /submitted/);
  });

  test("ci cancel stops a running task", async () => {
    const cwd = fresh("cancel");
    writeFileSync(join(cwd, "long.py"), "import time\ntime.sleep(30)\n");
    const sub = await ci(["submit", "long.py"], { cwd, url });
    assert.equal(sub.code, 0, sub.stderr);
    const id = sub.stdout.trim();
    await stack.client.waitStatus(id, "TASK_STATUS_RUNNING", 30000);
    const t0 = Date.now();
    const cancel = await ci(["cancel", id], { cwd, url });
    assert.equal(cancel.code, 0, cancel.stderr);
    const { result } = await stack.client.waitResult(id, 20000);
    assert.equal(result.status, "TASK_STATUS_CANCELLED", show(result));
    // With the start of ci, on a loaded machine; well under the code's 30 s.
    assert.ok(Date.now() - t0 < 15000, `CANCELLED ${Date.now() - t0} ms after ci cancel started`);
    const watch = await ci(["watch", id], { cwd, url, timeoutMs: 20000 });
    assert.equal(watch.code, 0);
    assert.match(watch.stdout.trim().split("\n").pop(), /cancelled/);
  });

  test("ci run saves every artifact with the bytes of the object store", async () => {
    const cwd = fresh("artifacts");
    writeFileSync(join(cwd, "a.py"), "import pandas as pd\npd.DataFrame({'a': [1, 2]}).to_csv('table.csv', index=False)\n");
    const res = await ci(["run", "a.py", "--json"], { cwd, url });
    assert.equal(res.code, 0, res.stderr);
    const r = JSON.parse(res.stdout);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED");
    assert.equal(r.artifacts.length, 1);
    const saved = readFileSync(join(cwd, "table.csv"));
    assert.equal(saved.toString(), "a\n1\n2\n");
    assert.equal(sha256hex(saved), r.artifacts[0].sha256);
  });

  test("ci get of an unknown task exits 2 (as a usage error: no such task)", async () => {
    const cwd = fresh("unknown");
    const res = await ci(["get", "no-such-task-here"], { cwd, url });
    assert.equal(res.code, 2, res.stderr);
    assert.match(res.stderr, /no result for task 'no-such-task-here'/);
  });

  // Every path under root, without following symlinks: "d/", "f", "l -> target".
  function tree(root, rel = "") {
    const out = [];
    for (const name of readdirSync(join(root, rel)).sort()) {
      const p = rel ? `${rel}/${name}` : name;
      const st = lstatSync(join(root, p));
      if (st.isSymbolicLink()) out.push(`${p} -> ${readlinkSync(join(root, p))}`);
      else if (st.isDirectory()) out.push(`${p}/`, ...tree(root, p));
      else out.push(p);
    }
    return out;
  }

  test("ci run saves only artifacts with safe names: no hidden file, no odd extension, nothing through a symlink", async () => {
    // The names are the untrusted code's choice, and any file starting like
    // a PNG is an artifact.
    const cwd = fresh("unsafe");
    const outside = fresh("outside");
    symlinkSync(outside, join(cwd, "sub2"));
    symlinkSync(join(outside, "victim.png"), join(cwd, "link.png"));
    writeFileSync(
      join(cwd, "s.py"),
      [
        "import os",
        "png = b'\\x89PNG\\r\\n\\x1a\\n' + b'\\nssh-ed25519 AAAA attacker\\n'",
        "open('.bashrc', 'wb').write(png)",
        "os.makedirs('.ssh')",
        "open('.ssh/authorized_keys', 'wb').write(png)",
        "open('noext', 'wb').write(png)",
        "open('fake.csv', 'wb').write(png)",
        "open('link.png', 'wb').write(png)",
        "open('x.png', 'wb').write(png)",
        "os.makedirs('sub')",
        "open('sub/ok.csv', 'w').write('a\\n1\\n')",
        "os.makedirs('sub2')",
        "open('sub2/y.csv', 'w').write('b\\n2\\n')",
        "print('wrote them')",
      ].join("\n"),
    );
    const around = readdirSync(dir).sort();
    const res = await ci(["run", "s.py"], { cwd, url });
    // The script succeeded; artifacts it could not save make it exit 3.
    assert.equal(res.code, 3, `exit code; stderr:\n${res.stderr}`);
    assert.equal(res.stdout, "wrote them\n");
    assert.deepEqual(tree(cwd), [`link.png -> ${join(outside, "victim.png")}`, "s.py", "sub/", "sub/ok.csv", `sub2 -> ${outside}`, "x.png"]);
    assert.equal(readFileSync(join(cwd, "x.png")).toString("latin1"), "\x89PNG\r\n\x1a\n\nssh-ed25519 AAAA attacker\n");
    assert.equal(readFileSync(join(cwd, "sub/ok.csv"), "utf8"), "a\n1\n");
    assert.deepEqual(readdirSync(outside), [], "nothing was written through a symlink");
    assert.deepEqual(readdirSync(dir).sort(), around, "nothing was written next to the working directory");
    // Each refusal names its culprit.
    for (const name of [".bashrc", ".ssh/authorized_keys", "noext", "fake.csv"]) {
      const re = new RegExp(`not saving artifact '${name.replace(/\./g, "\\.")}' here: its name is unsafe`);
      assert.match(res.stderr, re, res.stderr);
    }
    assert.match(res.stderr, /cannot write 'sub2\/y\.csv'/, res.stderr);
    assert.match(res.stderr, /cannot write 'link\.png'/, res.stderr);
    assert.match(res.stderr, /saved x\.png/, res.stderr);
    assert.match(res.stderr, /saved sub\/ok\.csv/, res.stderr);
  });

  // Runs `ci args...` with stdout and stderr on a pseudo-terminal (script(1)
  // of util-linux) and resolves { code, tty }: all the terminal showed.
  function ciOnTerminal(args, { cwd, url, timeoutMs = 60000 }) {
    const cmd = [CLI_BIN, ...args].map((a) => `'${a.replace(/'/g, "'\\''")}'`).join(" ");
    return new Promise((resolve, reject) => {
      const env = { ...process.env, CI_NATS_URL: url, TERM: "xterm" };
      const child = spawn("script", ["-qec", cmd, "/dev/null"], { cwd, env, stdio: ["pipe", "pipe", "pipe"] });
      const chunks = [];
      let stderr = "";
      child.stdout.on("data", (d) => chunks.push(d));
      child.stderr.on("data", (d) => (stderr += d));
      const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
      child.on("error", (e) => {
        clearTimeout(timer);
        reject(e);
      });
      child.on("close", (code) => {
        clearTimeout(timer);
        resolve({ code, tty: Buffer.concat(chunks), stderr });
      });
    });
  }

  // s as JSON with C1 controls and bidi/zero-width characters escaped too:
  // safe to show in a failure message.
  const visible = (s) =>
    JSON.stringify(s).replace(/[\u007f-\u009f\u00ad\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);

  test("ci run to a terminal shows the task's control characters escaped; to a pipe they pass byte for byte", async (t) => {
    if (spawnSync("script", ["-qec", "true", "/dev/null"]).status !== 0) {
      t.skip("SKIPPED: script(1) of util-linux (Debian: bsdutils) is missing, so no pseudo-terminal");
      return;
    }
    const cwd = fresh("tty");
    // Clears the screen, writes the clipboard (OSC 52), sets the title,
    // moves the cursor back over the line (CR, C1 CSI), flips text (U+202E),
    // on stdout, stderr, in the error (ci's own "ci: failed:" line) and the
    // hint (which lists the workspace after a FileNotFoundError).
    writeFileSync(
      join(cwd, "esc.py"),
      [
        String.raw`import os, sys`,
        String.raw`open("\x1b[1mHINT\u009b2J.txt", "w").close()`,
        String.raw`sys.stdout.write("out:\x1b[2J\x1b]52;c;ZWNobyBwd25lZA==\x07\u009b1A\u202eevil\rover\x7f\ttab\u200b\n")`,
        String.raw`sys.stdout.flush()`,
        String.raw`sys.stderr.write("err:\x1b]0;title\x07\x1b[31mred\n")`,
        String.raw`sys.stderr.flush()`,
        String.raw`raise FileNotFoundError("\x1b[8mhidden\u202eline")`,
      ].join("\n"),
    );
    // What the terminal showed, checked to hold only text. The terminal
    // turns "\n" into "\r\n"; nothing else may be a control.
    const onlyText = (res, what) => {
      const shown = res.tty.toString("utf8").replace(/\r\n/g, "\n");
      for (const [name, re] of [
        ["ESC", /\x1b/],
        ["BEL", /\x07/],
        ["CR", /\r/],
        ["DEL", /\x7f/],
        ["a C1 control", /[\u0080-\u009f]/],
        ["a bidi or zero-width character", /[\u200b-\u200f\u202a-\u202e\u2066-\u2069]/],
        ["a line separator", /[\u2028\u2029]/],
      ])
        assert.ok(!re.test(shown), `${what}: ${name} reached the terminal: ${visible(shown)}`);
      assert.ok(!res.tty.includes(0x1b), `${what}: no ESC byte reaches the terminal`);
      return shown;
    };
    const id = newTaskId("tty");
    const res = await ciOnTerminal(["run", "esc.py", "--no-save", "--id", id], { cwd, url });
    assert.equal(res.code, 1, `exit code; terminal: ${visible(res.tty.toString("utf8"))} ${res.stderr}`);
    const shown = onlyText(res, "ci run");
    assert.match(shown, /out:/, visible(shown));
    // Shown, escaped, where they were.
    assert.ok(shown.includes("out:\\x1b[2J\\x1b]52;c;ZWNobyBwd25lZA==\\x07\\u009b1A\\u202eevil\\x0dover\\x7f\ttab\\u200b\n"), visible(shown));
    assert.ok(shown.includes("err:\\x1b]0;title\\x07\\x1b[31mred\n"), visible(shown));
    assert.match(shown, /ci: failed: FileNotFoundError: \\x1b\[8mhidden\\u202eline[;\n]/, visible(shown));
    assert.match(shown, /ci: hint: the files in \/workspace are: \\x1b\[1mHINT\\u009b2J\.txt\n/, visible(shown));
    // ci get and ci watch quote the same result.
    const get = onlyText(await ciOnTerminal(["get", id], { cwd, url }), "ci get");
    assert.match(get, /error: +FileNotFoundError: \\x1b\[8mhidden\\u202eline[;\n]/, visible(get));
    assert.match(get, /--- stdout ---\nout:\\x1b\[2J/, visible(get));
    const watch = onlyText(await ciOnTerminal(["watch", id], { cwd, url }), "ci watch");
    assert.match(watch, /failed \S+ FileNotFoundError: \\x1b\[8mhidden\\u202eline[;\n]/, visible(watch));

    // Through pipes the same task's output is what the code wrote, byte for byte.
    const piped = await ci(["run", "esc.py", "--no-save"], { cwd, url });
    assert.equal(piped.code, 1, piped.stderr);
    assert.equal(piped.stdout, "out:\x1b[2J\x1b]52;c;ZWNobyBwd25lZA==\x07\u009b1A\u202eevil\rover\x7f\ttab\u200b\n");
    assert.ok(piped.stderr.startsWith("err:\x1b]0;title\x07\x1b[31mred\n"), visible(piped.stderr));
    assert.ok(piped.stderr.includes("ci: failed: FileNotFoundError: \x1b[8mhidden\u202eline"), visible(piped.stderr));
    // --json on a terminal stays JSON (its own escapes, for a machine).
    const json = await ciOnTerminal(["run", "esc.py", "--no-save", "--json"], { cwd, url });
    const line = json.tty.toString("utf8").split("\r\n").find((l) => l.startsWith("{"));
    assert.ok(line, visible(json.tty.toString("utf8")));
    assert.equal(JSON.parse(line).stdout, "out:\x1b[2J\x1b]52;c;ZWNobyBwd25lZA==\x07\u009b1A\u202eevil\rover\x7f\ttab\u200b\n");
  });

  test("ci run does not save an artifact whose name holds a bidi override or a zero-width character", async () => {
    // The worker never lists such a name; a result from elsewhere (a
    // forged KV record) must not put "x\u202egnp.csv" into the user's folder
    // either, where it would show as "xvsc.png".
    const cwd = fresh("bidi");
    writeFileSync(join(cwd, "slow.py"), "import time\ntime.sleep(60)\n");
    const id = newTaskId("bidi");
    const run = ci(["run", "slow.py", "--id", id, "--wait-ms", "30000"], { cwd, url, timeoutMs: 40000 });
    await stack.client.waitStatus(id, "TASK_STATUS_RUNNING", 30000);
    await stack.client.putObject(`${id}/plain.csv`, "a,b\n1,2\n");
    const artifact = (name) => ({ name, mimeType: "text/csv", size: "8", sha256: sha256hex(Buffer.from("a,b\n1,2\n")), object: `${id}/plain.csv` });
    const kv = await stack.client.kvBucket();
    await kv.put(id, JSON.stringify({ taskId: id, status: "TASK_STATUS_SUCCEEDED", worker: "w9", exitCode: 0, artifacts: [artifact("x\u202egnp.csv"), artifact("a\u200b.csv"), artifact("ok.csv")] }));
    // ci run reads the stored result when no terminal event comes.
    const res = await run;
    await ci(["cancel", id], { cwd, url });
    assert.equal(res.code, 3, `exit code; stderr: ${visible(res.stderr)}`);
    assert.deepEqual(readdirSync(cwd).sort(), ["ok.csv", "slow.py"], visible(res.stderr));
    assert.match(res.stderr, /not saving artifact 'x\u202egnp\.csv' here: its name is unsafe/, visible(res.stderr));
    assert.match(res.stderr, /not saving artifact 'a\u200b\.csv' here/, visible(res.stderr));
  });

  test("ci watch ends on the stored result when the terminal event never came", async () => {
    const c = stack.client;
    const kv = await c.kvBucket();
    const { StatusEvent } = proto();
    // Two tasks whose RUNNING event is in the stream and whose terminal
    // result is in the bucket, but whose terminal event was lost.
    const ok = newTaskId("lostok");
    const bad = newTaskId("lostbad");
    for (const [id, at] of [[ok, 100], [bad, 200]]) {
      const h = natsHeaders();
      h.set("Ci-Task-Id", id);
      h.set("Ci-Status", "running");
      h.set("Content-Type", "application/protobuf");
      const ev = StatusEvent.encode(StatusEvent.fromObject({ taskId: id, status: "TASK_STATUS_RUNNING", atMs: at, worker: "w9" })).finish();
      await c.js.publish(`ci.status.${id}`, ev, { headers: h, timeout: 10000 });
    }
    await kv.put(ok, JSON.stringify({ taskId: ok, status: "TASK_STATUS_SUCCEEDED", worker: "w9", startedAtMs: "100", finishedAtMs: "123", exitCode: 0 }));
    await kv.put(bad, JSON.stringify({ taskId: bad, status: "TASK_STATUS_FAILED", worker: "w9", startedAtMs: "200", finishedAtMs: "456", exitCode: 2, error: "boom" }));
    const t0 = Date.now();
    const [human, json] = await Promise.all([
      ci(["watch", ok, "--wait-ms", "20000"], { cwd: dir, url, timeoutMs: 30000 }),
      ci(["watch", bad, "--json", "--wait-ms", "20000"], { cwd: dir, url, timeoutMs: 30000 }),
    ]);
    const took = Date.now() - t0;
    assert.equal(human.code, 0, human.stderr);
    assert.equal(human.stdout, "100 running w9\n123 succeeded w9\n", "the stored result is printed as the missed event");
    assert.equal(human.stderr, "");
    assert.equal(json.code, 0, json.stderr);
    const lines = json.stdout.trim().split("\n").map((l) => JSON.parse(l));
    assert.deepEqual(
      lines.map((e) => [e.status, e.atMs, e.worker]),
      [
        ["TASK_STATUS_RUNNING", "200", "w9"],
        ["TASK_STATUS_FAILED", "456", "w9"],
      ],
    );
    assert.equal(lines[1].taskId, bad);
    assert.equal(lines[1].message, "boom", "the result's error is the event's message");
    assert.equal(lines[1].exitCode, 2);
    assert.ok(took < 15000, `watch gave up waiting for the event after ${took} ms, not at --wait-ms`);
  });

  // Live output (contract §19): the same bytes as the result, shown earlier.
  test("ci run shows a flushed line while the code still runs, and the same bytes as the result", async () => {
    const cwd = fresh("live");
    writeFileSync(join(cwd, "t.py"), "import sys, time\nprint('a', flush=True)\nsys.stderr.write('e1\\n'); sys.stderr.flush()\ntime.sleep(2)\nprint('b')\n");
    const env = { ...process.env, CI_NATS_URL: url };
    const child = spawn(CLI_BIN, ["run", "--no-save", "t.py"], { cwd, env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    let firstAt = 0;
    child.stdout.on("data", (d) => {
      stdout += d;
      if (!firstAt && stdout.includes("a\n")) firstAt = Date.now();
    });
    child.stderr.on("data", (d) => (stderr += d));
    const code = await new Promise((res) => child.on("close", res));
    const endAt = Date.now();
    assert.equal(code, 0, stderr);
    assert.equal(stdout, "a\nb\n", "nothing shown twice, nothing lost");
    assert.equal(stderr, "e1\n");
    assert.ok(firstAt && endAt - firstAt >= 1500, `the first line came ${endAt - firstAt} ms before the end`);
  });

  test("ci run of 3 MiB of output prints exactly what the result keeps", async () => {
    const cwd = fresh("livebig");
    writeFileSync(join(cwd, "t.py"), "import sys\nfor i in range(3 * 1024):\n    print(str(i).rjust(1023, '.'), flush=(i % 7 == 0))\n_ = sys.stderr.write('done\\n')\n");
    const runId = newTaskId("livebig");
    const run = await ci(["run", "--no-save", "--id", runId, "t.py"], { cwd, url, timeoutMs: 120000 });
    assert.equal(run.code, 0, run.stderr);
    const own = JSON.parse((await ci(["get", runId, "--json"], { cwd, url })).stdout);
    assert.equal(run.stdout.length, own.stdout.length, `ci run printed ${run.stdout.length} characters, the result keeps ${own.stdout.length}`);
    assert.equal(run.stdout, own.stdout, "ci run: its result's kept stdout, byte for byte");
    const sub = await ci(["submit", "t.py"], { cwd, url });
    const taskId = sub.stdout.trim();
    const watched = await ci(["watch", taskId, "--output", "--wait-ms", "100000"], { cwd, url, timeoutMs: 120000 });
    const got = await ci(["get", taskId, "--json"], { cwd, url });
    const r = JSON.parse(got.stdout);
    assert.equal(r.stdoutTruncated, true);
    assert.equal(run.stdout, r.stdout, "ci run: the result's kept stdout, byte for byte");
    assert.equal(watched.stdout, r.stdout, "ci watch --output: the same");
    assert.match(run.stderr, /^done\nci: stdout was cut: the code wrote \d+ bytes\n$/);
    assert.equal(watched.code, 0, watched.stderr);
  });

  test("ci watch ID --output follows a task submitted elsewhere and exits with its exit code", async () => {
    const cwd = fresh("watchout");
    writeFileSync(join(cwd, "t.py"), "import sys\nprint('line 1', flush=True)\nprint('oops', file=sys.stderr)\nsys.exit(3)\n");
    const sub = await ci(["submit", "t.py"], { cwd, url });
    assert.equal(sub.code, 0, sub.stderr);
    const taskId = sub.stdout.trim();
    const w = await ci(["watch", taskId, "--output"], { cwd, url });
    assert.equal(w.code, 3, w.stderr);
    assert.equal(w.stdout, "line 1\n");
    assert.match(w.stderr, /^oops\n/);
    // Once it ended, a second watch replays the same.
    const again = await ci(["watch", taskId, "--output"], { cwd, url });
    assert.equal(again.stdout, "line 1\n");
    assert.equal(again.code, 3);
  });

  test("--wait-ms running out is exit 124 (timed out) in ci run and ci watch, not 3 (NATS failed); the task goes on", async () => {
    const cwd = fresh("waitms");
    writeFileSync(join(cwd, "slow.py"), "import time\ntime.sleep(60)\n");
    const id = newTaskId("waitms");
    const run = await ci(["run", "slow.py", "--id", id, "--wait-ms", "1500"], { cwd, url });
    assert.equal(run.code, 124, run.stderr);
    assert.match(run.stderr, new RegExp(`task ${id} did not end within 1500 ms \\(it goes on: 'ci get ${id}' gives its result once it ends\\)`));
    const watches = [["watch", id], ["watch", id, "--output"], ["watch", id, "--json"], ["watch", newTaskId("never")]];
    const got = await Promise.all(watches.map((args) => ci([...args, "--wait-ms", "1000"], { cwd, url })));
    got.forEach((w, i) => {
      assert.equal(w.code, 124, `${watches[i]}: ${w.stderr}`);
      assert.match(w.stderr, new RegExp(`task ${watches[i][1]} did not end within 1000 ms`));
    });
    assert.equal((await ci(["cancel", id], { cwd, url })).code, 0);
  });
});
