// Everything that is not a plain success: duplicates, undecodable bodies,
// bad task ids, every validation rule of docs/contract.md, and user-code errors
// with their hints.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startStack } from "./lib/stack.mjs";
import { newTaskId, runTask } from "./lib/client.mjs";
import { checkEvents, checkRefused, checkResultBasics, show } from "./lib/checks.mjs";

const MiB = 1024 * 1024;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

describe("worker errors", () => {
  let stack;
  let worker;
  before(async () => {
    // 32 MB so that a request with more than 20 MiB of inline input can be
    // published at all and the worker's own limit is what refuses it.
    stack = await startStack({ workers: 1, worker: { concurrency: 2 }, serverConfig: "max_payload: 32MB" });
    worker = stack.workers[0];
  });
  after(async () => {
    await stack?.stop();
  });

  const warnCount = () => worker.lines().filter((l) => l.level === "warn" || l.level === "error").length;

  // All messages of CI_TASKS are gone (acked or terminated, none waiting for
  // a redelivery), within timeoutMs.
  async function tasksStreamDrains(timeoutMs = 10000) {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const si = await stack.client.jsm.streams.info("CI_TASKS");
      const ci = await stack.client.jsm.consumers.info("CI_TASKS", "ci-workers");
      if (si.state.messages === 0 && ci.num_ack_pending === 0 && ci.num_pending === 0) return;
      if (Date.now() > deadline) throw new Error(`CI_TASKS still holds ${si.state.messages} messages (ack pending ${ci.num_ack_pending}, pending ${ci.num_pending})`);
      await sleep(100);
    }
  }

  async function kvKeys() {
    const kv = await stack.client.kvBucket();
    const keys = [];
    for await (const k of await kv.keys()) keys.push(k);
    return new Set(keys);
  }

  test("the same task published twice is deduplicated by Nats-Msg-Id and runs once", async () => {
    const c = stack.client;
    const taskId = newTaskId("dup");
    const req = { taskId, language: "python", code: "print('ran once')" };
    const a1 = await c.submit(req);
    const a2 = await c.submit(req);
    assert.equal(a1.duplicate, false);
    assert.equal(a2.duplicate, true, "the second PubAck says duplicate");
    assert.equal(a2.seq, a1.seq);
    const { result: r } = await c.waitResult(taskId, 30000);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.attempt, 1);
    // Nothing left in CI_TASKS to run (none waiting, none in progress): a
    // second run would have published its RUNNING event before its ack.
    await tasksStreamDrains();
    const evs = await c.events(taskId);
    assert.equal(evs.filter((e) => e.event.status === "TASK_STATUS_RUNNING").length, 1, "one RUNNING event");
    checkEvents(evs, { taskId, result: r, encoding: "protobuf", worker: worker.id });
  });

  test("an undecodable protobuf body with a valid Nats-Msg-Id ends FAILED with a decode error", async () => {
    const c = stack.client;
    const taskId = newTaskId("garbage");
    // 0xff...: a field with number 0x1fffffff... and an invalid wire type.
    await c.submit(null, { body: Buffer.from([0xff, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02]), msgId: taskId });
    const { result: r, encoding } = await c.waitResult(taskId, 30000);
    assert.equal(encoding, "protobuf");
    checkResultBasics(r, { taskId });
    assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
    assert.match(r.error, /decod|pars|not a valid|invalid|malformed/i, `error says the body could not be decoded: ${r.error}`);
    assert.equal(r.exitCode, undefined, "the code never ran");
    const evs = await c.events(taskId);
    assert.equal(evs[evs.length - 1].event.status, "TASK_STATUS_FAILED");
    assert.equal(evs.filter((e) => e.event.status !== "TASK_STATUS_RUNNING").length, 1, "exactly one terminal event");
  });

  test("an undecodable JSON body with a valid Nats-Msg-Id ends FAILED, reported as JSON", async () => {
    const c = stack.client;
    const taskId = newTaskId("badjson");
    await c.submit(null, { body: '{"language": "python", "code": ', msgId: taskId, contentType: "application/json" });
    const { result: r, encoding, problems } = await c.waitResult(taskId, 30000);
    assert.equal(encoding, "json", "the error result is in the encoding of the request");
    assert.deepEqual(problems, []);
    assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
    assert.match(r.error, /decod|pars|JSON|not a valid|invalid|malformed/i, r.error);
    assert.equal(r.exitCode, undefined);
  });

  test("an undecodable body without Nats-Msg-Id is dropped and logged; the worker keeps working", async () => {
    const c = stack.client;
    const before = await kvKeys();
    const warnsBefore = warnCount();
    await c.submit(null, { body: Buffer.from([0xff, 0xff, 0xff, 0xff]), msgId: null });
    await worker.waitLog(() => warnCount() > warnsBefore, 10000);
    const { result: r } = await runTask(c, { code: "print('still alive')" }, { timeoutMs: 30000 });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.stdout, "still alive\n");
    const added = [...(await kvKeys())].filter((k) => !before.has(k));
    assert.deepEqual(added, [r.taskId], "nothing was stored for the dropped message");
    await tasksStreamDrains();
    assert.equal(worker.exited(), null, "the worker is still running");
  });

  test("invalid task ids are dropped, never stored, never redelivered", async () => {
    const c = stack.client;
    const before = await kvKeys();
    const warnsBefore = warnCount();
    const bad = ["bad id", "bad.id", "x".repeat(65), "a/b", "ünï"];
    for (const id of bad) await c.submit({ taskId: id, language: "python", code: "print(1)" }, { msgId: null });
    // No task_id in the body and an invalid Nats-Msg-Id.
    await c.submit({ language: "python", code: "print(1)" }, { msgId: "not valid!" });
    // Neither.
    await c.submit({ language: "python", code: "print(1)" }, { msgId: null });
    const deadline = Date.now() + 15000;
    while (warnCount() < warnsBefore + bad.length + 2) {
      if (Date.now() > deadline) throw new Error(`expected ${bad.length + 2} warnings, got ${warnCount() - warnsBefore}; log:\n${worker.logText()}`);
      await sleep(100);
    }
    await tasksStreamDrains();
    const added = [...(await kvKeys())].filter((k) => !before.has(k));
    assert.deepEqual(added, [], "no result stored for an invalid task id");
    // The body's task_id wins over Nats-Msg-Id.
    const taskId = newTaskId("bodyid");
    const otherId = newTaskId("msgid");
    await c.submit({ taskId, language: "python", code: "print(2)" }, { msgId: otherId });
    const { result: r } = await c.waitResult(taskId, 30000);
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(await c.getResult(otherId), null);
  });

  test("a body task_id that is not an id, under a valid Nats-Msg-Id, ends FAILED under the Nats-Msg-Id", async () => {
    const c = stack.client;
    for (const [label, badId] of [["65 chars", "x".repeat(65)], ["a/b.c*", "a/b.c*"]]) {
      const msgId = newTaskId("badbody");
      await c.submit({ taskId: badId, language: "python", code: "print('must not run')" }, { msgId });
      const { result: r } = await c.waitResult(msgId, 30000);
      assert.equal(r.status, "TASK_STATUS_FAILED", `${label}: ${show(r)}`);
      assert.equal(r.taskId, msgId);
      assert.ok(r.error.includes(`task_id '${badId.slice(0, 64)}'`), `${label}: the error names the bad id: ${r.error}`);
      assert.match(r.error, /Nats-Msg-Id/);
      assert.equal(r.stdout, "", "the code never ran");
      const evs = await c.events(msgId);
      assert.equal(evs.length, 1, "one terminal event");
      assert.equal(evs[0].headers["Ci-Status"], "failed");
    }
  });

  // Every validation rule: [name, request fields, error regexps].
  const rules = [
    ["unsupported language", { language: "ruby" }, [/unsupported language/i, /ruby/]],
    ["missing language", { language: "" }, [/unsupported language/i]],
    ["empty code", { code: "" }, [/code/i, /empty/i]],
    ["code over 1 MiB", { code: "#" + "x".repeat(MiB) }, [/code/i, /limit|at most|too/i]],
    ["timeout above the cap", { limits: { timeoutMs: 60001 } }, [/timeout/i, /60000|limit|cap/i]],
    ["memory above the cap", { limits: { memoryMb: 1000000 } }, [/memory/i, /limit|cap/i]],
    ["bad policy.network", { policy: { network: "full" } }, [/network/i, /full/]],
    ["bad policy.packages", { policy: { packages: "anything" } }, [/packages/i, /anything/]],
    ["bad runtime", { runtime: "python-2.7" }, [/runtime/i, /python-2\.7/]],
    ["a session id that is not one", { sessionId: "a.b" }, [/session_id 'a\.b' \(3 bytes\) is not a session id/]],
    ["input name ../x.csv", { files: [{ name: "../x.csv", content: Buffer.from("a\n") }] }, [/input|name/i, /x\.csv/]],
    ["input name /abs", { files: [{ name: "/abs", content: Buffer.from("a\n") }] }, [/input|name/i, /abs/]],
    ["input name ..", { files: [{ name: "..", content: Buffer.from("a\n") }] }, [/input|name/i]],
    ["input name .hidden", { files: [{ name: ".hidden", content: Buffer.from("a\n") }] }, [/input|name/i, /hidden/]],
    ["input name of 300 bytes", { files: [{ name: "n".repeat(300), content: Buffer.from("a\n") }] }, [/input|name/i]],
    ["empty input name", { files: [{ name: "", content: Buffer.from("a\n") }] }, [/input|name/i]],
    ["input with neither content nor object", { files: [{ name: "a.csv" }] }, [/input|a\.csv/i]],
    [
      "inline inputs over 20 MiB in all",
      { files: [{ name: "a.csv", content: Buffer.alloc(10.5 * MiB, 0x61) }, { name: "b.csv", content: Buffer.alloc(10.5 * MiB, 0x62) }] },
      [/input/i, /limit|at most|too|20/i],
    ],
  ];

  test("every validation rule gives FAILED with a specific error, before any code runs", async () => {
    const c = stack.client;
    const ids = [];
    for (const [name, fields] of rules) {
      const taskId = newTaskId("rule");
      ids.push(taskId);
      await c.submit({ taskId, language: "python", code: "print('must not run')", ...fields });
      void name;
    }
    const failures = [];
    for (let i = 0; i < rules.length; i++) {
      const [name, , res] = rules[i];
      const { result: r, problems } = await c.waitResult(ids[i], 30000);
      try {
        checkResultBasics(r, { taskId: ids[i], encodingProblems: problems });
        checkRefused(r, ids[i], res);
        assert.ok(r.error.length < 1024, "the error is one sentence, not a dump");
      } catch (e) {
        failures.push(`${name}: ${e.message}`);
      }
    }
    assert.deepEqual(failures, []);
  });

  test("a refused label is never echoed: a 900 KiB value gives a small FAILED result; an empty key is refused", async () => {
    const c = stack.client;
    const big = newTaskId("biglabel");
    await c.submit({ taskId: big, language: "python", code: "print('must not run')", labels: { team: "data", blob: "v".repeat(900 * 1024) } });
    const empty = newTaskId("emptykey");
    await c.submit({ taskId: empty, language: "python", code: "print('must not run')", labels: { team: "data", "": "v" } });
    const { result: r, bytes } = await c.waitResult(big, 30000);
    assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
    assert.match(r.error, /the value of label 'blob' is 921600 bytes; the limit is 1024 bytes/);
    assert.ok(bytes.length < 4096, `the stored result is ${bytes.length} bytes, not the label echoed`);
    assert.deepEqual(r.labels ?? {}, {}, "labels that broke the rules are not echoed");
    const { result: e } = await c.waitResult(empty, 30000);
    assert.equal(e.status, "TASK_STATUS_FAILED", show(e));
    assert.match(e.error, /has an empty key/);
    assert.equal(e.stdout, "", "the code never ran");
  });

  test("an input naming a missing object fails with an error that names it", async () => {
    const { result: r } = await runTask(stack.client, {
      code: "print(open('data.csv').read())",
      files: [{ name: "data.csv", object: "inputs/nowhere/missing-object.csv" }],
    });
    checkRefused(r, r.taskId, [/missing-object\.csv/, /not|missing|no such|exist/i]);
  });

  test("inputs from the object store over 20 MiB in all are refused", async () => {
    const c = stack.client;
    const p = newTaskId("big");
    await c.putObject(`inputs/${p}/a.csv`, Buffer.alloc(10.5 * MiB, 0x61));
    await c.putObject(`inputs/${p}/b.csv`, Buffer.alloc(10.5 * MiB, 0x62));
    const { result: r } = await runTask(c, {
      code: "print('must not run')",
      files: [
        { name: "a.csv", object: `inputs/${p}/a.csv` },
        { name: "b.csv", object: `inputs/${p}/b.csv` },
      ],
    });
    checkRefused(r, r.taskId, [/input/i, /limit|at most|too|20/i]);
  });

  test("an input from the object store is in the workspace under its name", async () => {
    const c = stack.client;
    const obj = `inputs/${newTaskId("obj")}/source.csv`;
    const rows = ["k,v"];
    for (let i = 0; i < 50000; i++) rows.push(`${i % 7},${i}`); // > 128 KiB: several chunks
    const csv = rows.join("\n") + "\n";
    assert.ok(csv.length > 300 * 1024);
    await c.putObject(obj, Buffer.from(csv));
    const { result: r } = await runTask(c, {
      code: "import pandas as pd\ndf = pd.read_csv('data.csv')\nprint(len(df), df['v'].sum(), df.groupby('k')['v'].count().to_dict()[3])",
      files: [{ name: "data.csv", object: obj }],
    });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    let count3 = 0;
    for (let i = 0; i < 50000; i++) if (i % 7 === 3) count3++;
    assert.equal(r.stdout, `50000 ${(49999 * 50000) / 2} ${count3}\n`);
  });

  test("an uncaught exception: FAILED, exit code 1, traceback in stderr, error names the exception", async () => {
    const { result: r, taskId } = await runTask(stack.client, {
      code: "print('before')\ndef f():\n    raise ValueError('the answer is not 42')\nf()\n",
    });
    checkResultBasics(r, { taskId });
    assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
    assert.equal(r.exitCode, 1);
    assert.equal(r.stdout, "before\n");
    assert.match(r.stderr, /Traceback \(most recent call last\)/);
    assert.match(r.stderr, /ValueError: the answer is not 42/);
    assert.match(r.error, /ValueError/);
    const evs = await stack.client.events(taskId);
    checkEvents(evs, { taskId, result: r, encoding: "protobuf", worker: worker.id });
    assert.equal(evs[1].event.exitCode, 1, "the terminal event carries the exit code");
  });

  test("a non-zero sys.exit is FAILED with that exit code", async () => {
    const { result: r } = await runTask(stack.client, { code: "import sys\nprint('bye')\nsys.exit(3)" });
    assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
    assert.equal(r.exitCode, 3);
    assert.equal(r.stdout, "bye\n");
    assert.ok(r.error.length > 0, "error says why");
  });

  test("NameError for pd: the hint says to import pandas as pd", async () => {
    const { result: r } = await runTask(stack.client, { code: "df = pd.DataFrame({'a': [1, 2]})\nprint(df)" });
    assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
    assert.equal(r.exitCode, 1);
    assert.match(r.error, /NameError/);
    assert.match(r.stderr, /NameError: name 'pd' is not defined/);
    assert.match(r.hint, /import pandas as pd/, show(r));
  });

  for (const mod of ["requests", "sklearn"]) {
    test(`ModuleNotFoundError for ${mod}: the hint says pip is not available`, async () => {
      const { result: r } = await runTask(stack.client, { code: `import ${mod}\nprint('imported')` });
      assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
      assert.equal(r.stdout, "");
      assert.match(r.error, /ModuleNotFoundError/);
      assert.match(r.error + r.hint, new RegExp(mod));
      assert.match(r.hint, /pip/i, show(r));
      assert.match(r.hint, /not|no |unavailable|cannot/i, show(r));
    });
  }

  test("FileNotFoundError: the hint lists the files that do exist", async () => {
    const { result: r } = await runTask(stack.client, {
      code: "import pandas as pd\ndf = pd.read_csv('sales_2024.csv')",
      files: [
        { name: "sales.csv", content: Buffer.from("a,b\n1,2\n") },
        { name: "costs 2024.csv", content: Buffer.from("c\n3\n") },
      ],
    });
    assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
    assert.match(r.error, /FileNotFoundError/);
    const text = r.hint + " " + r.error;
    assert.match(text, /sales\.csv/, show(r));
    assert.match(text, /costs 2024\.csv/, show(r));
  });

  test("no odd body crashes or stalls the worker: each gets a terminal result", async () => {
    const c = stack.client;
    const J = "application/json";
    const P = "application/protobuf";
    const deep = '{"language":"python","code":"print(1)","labels":' + '{"a":'.repeat(20000) + '"x"' + "}".repeat(20001);
    // [body, content type, must be FAILED]
    const bodies = [
      ["[]", J, true],
      ["null", J, true],
      ['"just a string"', J, true],
      ['{"language": "python", "code": 5}', J, true],
      ['{"language":"python","code":"print(1)","files":[{"name":"a.csv","content":"!!!not base64"}]}', J, true],
      ['{"language":"python","code":"print(1)","limits":{"timeoutMs":-5}}', J, true],
      ['{"language":"python","code":"print(1)","limits":{"timeoutMs":1e20}}', J, true],
      ['{"language":"python","code":"print(1)","limits":{"timeoutMs":1.5}}', J, true],
      ['{"language":"python","code":"print(1)","files":[{"name":"a.csv","content":"YQ==","object":"x"}]}', J, true],
      [deep, J, true],
      ['{"language":"python","code":"print(1)","status":"TASK_STATUS_SUCCEEDED"}', J, false],
      ['{"language":"python","code":"print(\'\\u0000\')"}', J, false],
      ["", P, true], // decodes as an empty request: no language
      [Buffer.from([0x12, 0x06, 0x70, 0x79, 0x74, 0x68, 0x6f, 0x6e, 0x1a, 0x03, 0xff, 0xfe, 0x31]), P, false], // code not UTF-8
      [Buffer.from([0x1a, 0xff, 0xff, 0xff, 0xff, 0x0f]), P, true], // length past the end
      ['{"language":"python","code":"print(1)"}', "text/plain", true],
    ];
    const ids = [];
    for (const [body, ct] of bodies) {
      const taskId = newTaskId("odd");
      ids.push(taskId);
      await c.submit(null, { body, msgId: taskId, contentType: ct });
    }
    const problems = [];
    for (let i = 0; i < bodies.length; i++) {
      let r;
      try {
        ({ result: r } = await c.waitResult(ids[i], 30000));
      } catch (e) {
        problems.push(`body ${i}: ${e.message}`);
        continue;
      }
      if (bodies[i][2] && r.status !== "TASK_STATUS_FAILED") problems.push(`body ${i}: ${r.status}, expected FAILED`);
      if (r.status === "TASK_STATUS_FAILED" && !r.error) problems.push(`body ${i}: FAILED without an error`);
    }
    assert.deepEqual(problems, []);
    assert.equal(worker.exited(), null, "the worker is still running");
    await tasksStreamDrains();
  });

  test("the worker is still healthy and its log never shows task payloads", async () => {
    const secret = `payload-marker-${Date.now()}`;
    const { result: r } = await runTask(stack.client, { code: `x = '${secret}'\nprint(x)` });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(worker.exited(), null);
    assert.doesNotMatch(worker.logText(), new RegExp(secret), "code and output are never logged");
  });
});
