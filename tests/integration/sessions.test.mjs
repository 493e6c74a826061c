// Sessions (docs/contract.md §16) against real workers: state across steps,
// files across steps, order of steps submitted at once, isolation, a worker
// SIGKILLed between steps, exceptions and timeouts, expiry and close, the
// size cap, and a step that ran already.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

import { startStack } from "./lib/stack.mjs";
import { newTaskId, runTask } from "./lib/client.mjs";
import { show } from "./lib/checks.mjs";
import { CLI_BIN } from "./lib/worker.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const run = promisify(execFile);
const CSV = "region,amount\nnorth,4\neast,20\nwest,7\nnorth,6\neast,15\n";
const IDLE_S = 3;

const newSession = (p = "s") => newTaskId(p);

async function step(client, sessionId, code, extra = {}) {
  return runTask(client, { sessionId, code, limits: { timeoutMs: 30000 }, ...extra });
}

function succeeded(r) {
  assert.equal(r.result.status, "TASK_STATUS_SUCCEEDED", show(r.result));
  return r.result;
}

describe("sessions", () => {
  let stack;
  let kv;
  before(async () => {
    stack = await startStack({ workers: 2, worker: { concurrency: 2, sessions: { idle_s: IDLE_S } } });
    kv = await stack.client.sessionsBucket();
  });
  after(async () => {
    await stack?.stop();
  });

  test("a DataFrame read from an input in step 1 is there in step 2, with pd, a function and its globals", async () => {
    const c = stack.client;
    const s = newSession();
    const r1 = succeeded(
      await step(c, s, "import pandas as pd\ndf = pd.read_csv('sales.csv')\nscale = 2\ndef total(frame):\n    return int(frame['amount'].sum()) * scale\nprint(len(df))\n", {
        files: [{ name: "sales.csv", content: Buffer.from(CSV) }],
      }),
    );
    assert.equal(r1.stdout, "5\n");
    assert.equal(r1.session.sessionId, s);
    assert.equal(r1.session.step, 1);
    assert.equal(r1.session.newSession, true);
    assert.equal(r1.session.previousStateGone, false);
    assert.equal(r1.session.restoredFromStep, 0);
    assert.equal(r1.session.stateKept, true);
    assert.ok(r1.session.stateBytes > 0);

    // scale changes in step 2: total() reads the session's globals, not a copy.
    const r2 = succeeded(await step(c, s, "scale = 3\nprint(type(df).__name__, pd.__name__, total(df))\n"));
    assert.equal(r2.stdout, "DataFrame pandas 156\n");
    assert.equal(r2.session.step, 2);
    assert.equal(r2.session.newSession, false);
    assert.equal(r2.session.restoredFromStep, 1);
    assert.equal(r2.session.stateKept, true);

    const rec = JSON.parse(new TextDecoder().decode((await kv.get(s)).value));
    assert.equal(rec.sessionId, s);
    assert.equal(rec.step, "2");
    assert.equal(rec.stateStep, "2");
    assert.equal(rec.state, `.sessions/${s}/2-1`);
    assert.equal(rec.lastTaskId, r2.taskId);
    assert.equal(rec.stateBytes, String(r2.session.stateBytes));
    // The previous step's state object is deleted once the new one is recorded.
    assert.equal(await c.objectInfo(`.sessions/${s}/1-1`).then((i) => (i && !i.deleted ? i : null)), null);
    assert.ok(await c.objectInfo(`.sessions/${s}/2-1`));
  });

  test("every kind the contract names carries over, and shared objects stay shared", async () => {
    const c = stack.client;
    const s = newSession();
    succeeded(
      await step(
        c,
        s,
        [
          "import datetime as dt, numpy, pandas",
          "i, f, z, t, b = 7, 2.5, 3j, 'text', b'\\x00\\xff'",
          "lst, dct, st, tup = [1, [2]], {'k': (1, 2)}, {3, 4}, (5, 'six')",
          "arr = numpy.arange(6).reshape(2, 3)",
          "ser = pandas.Series([1.5, 2.5], index=['a', 'b'])",
          "when = dt.datetime(2026, 12, 1, 12, 30)",
          "day = pandas.Timestamp('2026-12-01')",
          "alias = lst",
          "class Point:",
          "    def __init__(self, x): self.x = x",
          "pt = Point(4)",
        ].join("\n") + "\n",
      ),
    );
    const r2 = succeeded(
      await step(
        c,
        s,
        [
          "alias.append(9)",
          "print(i, f, z, t, b, lst, dct, sorted(st), tup)",
          "print(arr.sum(), ser['b'], when.isoformat(), day.day, pt.x, type(pt).__name__)",
          "print(dt.date(2026, 1, 2), numpy.__name__, pandas.__name__)",
        ].join("\n") + "\n",
      ),
    );
    assert.equal(
      r2.stdout,
      "7 2.5 3j text b'\\x00\\xff' [1, [2], 9] {'k': (1, 2)} [3, 4] (5, 'six')\n" +
        "15 2.5 2026-12-01T12:30:00 1 4 Point\n2026-01-02 numpy pandas\n",
    );
    assert.deepEqual([...r2.session.dropped], []);
  });

  test("files carry over; a restored file is no artifact again unless the step changes it", async () => {
    const c = stack.client;
    const s = newSession();
    const r1 = succeeded(await step(c, s, "open('notes.txt','w').write('hello')\nimport os\nos.mkdir('out')\nopen('out/a.csv','w').write('x\\n1\\n')\nopen('b.csv','w').write('y\\n2\\n')\n"));
    assert.deepEqual(r1.artifacts.map((a) => a.name).sort(), ["b.csv", "out/a.csv"]);
    const r2 = succeeded(await step(c, s, "print(open('notes.txt').read(), open('out/a.csv').read().split()[1])\nopen('b.csv','a').write('3\\n')\n"));
    assert.equal(r2.stdout, "hello 1\n");
    assert.deepEqual(r2.artifacts.map((a) => a.name), ["b.csv"], "only the changed file is an artifact");
    const r3 = succeeded(await step(c, s, "import os\nprint(sorted(n for n in os.listdir('.') if not n.startswith('.')))\n"));
    assert.equal(r3.stdout, "['b.csv', 'notes.txt', 'out']\n", "the session's files, and no file of the transport");
  });

  test("five steps submitted at once run one at a time, in order", async () => {
    const c = stack.client;
    const s = newSession();
    const ids = [];
    for (let i = 1; i <= 5; i++) {
      const taskId = newTaskId(`order${i}`);
      ids.push(taskId);
      const code = i === 1 ? "seen = [1]\nprint(seen)\n" : `import time\ntime.sleep(0.2)\nseen.append(${i})\nprint(seen)\n`;
      await c.submit({ taskId, language: "python", sessionId: s, code });
    }
    const results = [];
    for (const id of ids) results.push((await c.waitResult(id, 120000)).result);
    for (let i = 0; i < 5; i++) {
      assert.equal(results[i].status, "TASK_STATUS_SUCCEEDED", show(results[i]));
      assert.equal(results[i].session.step, i + 1);
      assert.equal(results[i].stdout, `[${Array.from({ length: i + 1 }, (_, k) => k + 1).join(", ")}]\n`);
      if (i > 0) assert.ok(results[i].startedAtMs >= results[i - 1].finishedAtMs, `step ${i + 1} started before step ${i} ended`);
    }
    assert.equal(results.every((r) => r.attempt === 1), true, "waiting for a turn is no attempt");
  });

  test("two sessions never see each other's state; a task without a session sees none", async () => {
    const c = stack.client;
    const a = newSession("a");
    const b = newSession("b");
    succeeded(await step(c, a, "secret = 'A'\nopen('a.txt','w').write('A')\n"));
    const rb = succeeded(await step(c, b, "import os\nprint('secret' in globals(), os.path.exists('a.txt'))\n"));
    assert.equal(rb.stdout, "False False\n");
    const none = (await runTask(c, { code: "import os\nprint('secret' in globals(), os.path.exists('a.txt'))\n" })).result;
    assert.equal(none.stdout, "False False\n");
    assert.ok(none.session == null, "no session info without a session");
  });

  test("an exception keeps what was assigned before it; a later step sees it", async () => {
    const c = stack.client;
    const s = newSession();
    const r1 = (await step(c, s, "a = 41\nraise ValueError('boom')\nb = 2\n")).result;
    assert.equal(r1.status, "TASK_STATUS_FAILED");
    assert.equal(r1.session.stateKept, true);
    const r2 = succeeded(await step(c, s, "print(a + 1, 'b' in globals())\n"));
    assert.equal(r2.stdout, "42 False\n");
  });

  test("a timeout leaves the state as it was before that step, and says so", async () => {
    const c = stack.client;
    const s = newSession();
    succeeded(await step(c, s, "x = 1\n"));
    const r2 = (await step(c, s, "x = 2\nimport time\ntime.sleep(60)\n", { limits: { timeoutMs: 1500 } })).result;
    assert.equal(r2.status, "TASK_STATUS_TIMED_OUT", show(r2));
    assert.equal(r2.session.stateKept, false);
    assert.equal(r2.session.step, 2);
    assert.match(r2.error, /state was not kept \(the step timed out\): the session keeps the state of step 1/);
    const r3 = succeeded(await step(c, s, "print(x)\n"));
    assert.equal(r3.stdout, "1\n");
    assert.equal(r3.session.step, 3);
    assert.equal(r3.session.restoredFromStep, 1);
  });

  test("what cannot be kept is dropped, named, and a later use gets a hint", async () => {
    const c = stack.client;
    const s = newSession();
    const r1 = succeeded(await step(c, s, "fh = open('f.txt', 'w')\ngen = (i for i in range(3))\nsquare = lambda v: v * v\nkept = 5\n"));
    assert.deepEqual([...r1.session.dropped].sort(), ["fh (open file)", "gen (generator)"]);
    const r2 = (await step(c, s, "print(square(kept))\nfh.write('x')\n")).result;
    assert.equal(r2.stdout, "25\n");
    assert.equal(r2.status, "TASK_STATUS_FAILED");
    assert.match(r2.error, /NameError/);
    assert.match(r2.hint, /'fh' was not kept/);
  });

  test("an idle session expires; the next step starts afresh and says the state is gone", async () => {
    const c = stack.client;
    const s = newSession();
    const r1 = succeeded(await step(c, s, "x = 1\n"));
    // The condition is time itself: wait until the session has been idle past idle_s.
    while (Date.now() - r1.finishedAtMs < IDLE_S * 1000 + 500) await sleep(200);
    const r2 = succeeded(await step(c, s, "print('x' in globals())\n"));
    assert.equal(r2.stdout, "False\n");
    assert.equal(r2.session.newSession, true);
    assert.equal(r2.session.previousStateGone, true);
    assert.equal(r2.session.step, 1);
  });

  test("ci session show, ls and close; a closed session's next step starts afresh", async () => {
    const c = stack.client;
    const s = newSession();
    const dir = mkdtempSync(join(tmpdir(), "ci-session-"));
    writeFileSync(join(dir, "step1.py"), "x = 1\nprint('one')\n");
    writeFileSync(join(dir, "step2.py"), "print('x' in globals())\n");
    const env = { ...process.env, CI_NATS_URL: stack.server.url };
    const one = await run(CLI_BIN, ["run", "--session", s, "--no-save", join(dir, "step1.py")], { env });
    assert.equal(one.stdout, "one\n");
    assert.match(one.stderr, new RegExp(`session ${s}, step 1: new session; state kept`));
    const shown = await run(CLI_BIN, ["session", "show", s], { env });
    assert.match(shown.stdout, /steps: +1 /);
    const listed = JSON.parse((await run(CLI_BIN, ["session", "ls", "--json"], { env })).stdout);
    assert.ok(listed.some((r) => r.sessionId === s && r.step === "1"));
    const closed = await run(CLI_BIN, ["session", "close", s], { env });
    assert.match(closed.stdout, /closed/);
    assert.equal(JSON.parse(new TextDecoder().decode((await kv.get(s)).value)).closed, true);
    assert.equal(await c.objectInfo(`.sessions/${s}/1-1`).then((i) => (i && !i.deleted ? i : null)), null, "close deletes the state");
    const two = await run(CLI_BIN, ["run", "--session", s, "--no-save", join(dir, "step2.py")], { env });
    assert.equal(two.stdout, "False\n");
    assert.match(two.stderr, /new session \(the earlier state is gone/);
    await assert.rejects(run(CLI_BIN, ["session", "show", "no-such-session-x"], { env }), (e) => e.code === 2 && /no session/.test(e.stderr));
    await assert.rejects(run(CLI_BIN, ["session", "close", "no-such-session-x"], { env }), (e) => e.code === 2 && /no session/.test(e.stderr));
    await assert.rejects(run(CLI_BIN, ["session", "close", "a.b"], { env }), (e) => e.code === 2);
  });

  test("a session id or subject that does not fit is refused with a clear error", async () => {
    const c = stack.client;
    const bad = (await runTask(c, { code: "print(1)", sessionId: "a.b" }, { subject: "ci.submit" })).result;
    assert.equal(bad.status, "TASK_STATUS_FAILED");
    assert.match(bad.error, /session_id 'a.b' \(3 bytes\) is not a session id/);
    const wrongSubject = (await runTask(c, { code: "print(1)", sessionId: "s-right" }, { subject: "ci.submit" })).result;
    assert.equal(wrongSubject.status, "TASK_STATUS_FAILED");
    assert.match(wrongSubject.error, /must be published on 'ci\.submit\.s-right'/);
    const noSession = (await runTask(c, { code: "print(1)" }, { subject: "ci.submit.other" })).result;
    assert.equal(noSession.status, "TASK_STATUS_FAILED");
    assert.match(noSession.error, /a session's subject, without session_id/);
  });

  test("a step the record names as its last already does not run again", async () => {
    const c = stack.client;
    const s = newSession();
    const r1 = succeeded(await step(c, s, "n = 1\n"));
    // As a worker leaves the record when it dies between the record and the
    // result: the record's last task is the step that comes again.
    const again = newTaskId("again");
    const rec = JSON.parse(new TextDecoder().decode((await kv.get(s)).value));
    rec.lastTaskId = again;
    await kv.put(s, JSON.stringify(rec));
    const r2 = (await step(c, s, "n += 1\nprint(n)\n", { taskId: again })).result;
    assert.equal(r2.status, "TASK_STATUS_FAILED", show(r2));
    assert.equal(r2.stdout, "", "the code did not run");
    assert.match(r2.error, /ran already as step 1/);
    assert.equal(r1.session.step, 1);
  });
});

describe("sessions: limits and a worker killed between steps", () => {
  let stack;
  before(async () => {
    stack = await startStack({ workers: 0, worker: { concurrency: 1, sessions: { max_state_mb: 1 } } });
  });
  after(async () => {
    await stack?.stop();
  });

  test("a step over the state cap keeps its status; the session keeps the previous state", async () => {
    const w = await stack.addWorker();
    const c = stack.client;
    const s = newSession();
    succeeded(await step(c, s, "x = 1\n"));
    const r2 = succeeded(await step(c, s, "big = b'x' * 3_000_000\nx = 2\n"));
    assert.equal(r2.session.stateKept, false);
    assert.match(r2.error, /over the cap of 1 MiB/);
    assert.match(r2.error, /the session keeps the state of step 1/);
    const r3 = succeeded(await step(c, s, "print(x, 'big' in globals())\n"));
    assert.equal(r3.stdout, "1 False\n");
    await w.stop();
  });

  test("the worker of step 1 is SIGKILLed; step 2 runs on another worker and sees step 1's state", async () => {
    const w1 = await stack.addWorker();
    const c = stack.client;
    const s = newSession();
    const r1 = succeeded(await step(c, s, "import numpy as np\narr = np.arange(10)\n"));
    assert.equal(r1.worker, w1.id);
    await w1.kill();
    const w2 = await stack.addWorker();
    const r2 = succeeded(await step(c, s, "print(int(arr.sum()))\n"));
    assert.equal(r2.worker, w2.id);
    assert.equal(r2.stdout, "45\n");
    assert.equal(r2.session.restoredFromStep, 1);
  });
});
