// `ci batch` against a real nats-server whose streams, buckets and batch
// consumer a real worker made (started, then stopped, so that the settings
// under test are the worker's), with the test playing the worker
// (lib/batch.mjs: taken, the terminal record, the end event, complete), so
// that every count, summary and result line is checked against messages
// the test chose: states a real worker passes through too fast to see (a
// batch half taken, an expired result, a submission that died before its
// seal, no batch lane at all). The same commands against a running worker:
// batch_cli.test.mjs; the worker's own side: batch_lane.test.mjs.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createServer, connect as tcpConnect } from "node:net";
import { existsSync, mkdirSync, mkdtempSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Kvm } from "@nats-io/kv";
import { Objm } from "@nats-io/obj";
import { startNatsServer } from "./lib/nats-server.mjs";
import { startStack } from "./lib/stack.mjs";
import { CLI_BIN } from "./lib/worker.mjs";
import { connectClient, decodeMessage, FILES_BUCKET, normalize, proto, RESULTS_BUCKET } from "./lib/client.mjs";
import {
  BATCH_CONSUMER, BATCH_STREAM, BATCHES_STREAM, BATCHES_PREFIX, BATCH_PREFIX, batchEvents, batchLeft, batchSubjectCounts, ci,
  fakeBatchWorker, until,
} from "./lib/batch.mjs";

// A nats-server set up by a real worker, which is then stopped: the
// streams, buckets and consumers are the worker's own, and nobody but the
// test takes a task.
async function stackWithoutWorker() {
  // Cold: it runs no task, and a warm start waits for a zygote's imports.
  const stack = await startStack({ workers: 1, worker: { local: { mode: "cold" } } });
  const x = await stack.workers[0].stop("SIGTERM", 90000);
  assert.equal(x.code, 0, "the worker drained and exited");
  return stack;
}

const COUNT_KEYS = ["total", "queued", "running", "succeeded", "failed", "timed_out", "cancelled"];

describe("ci batch with a stand-in worker", () => {
  let stack, client, dir, url, worker;
  before(async () => {
    assert.ok(existsSync(CLI_BIN), `${CLI_BIN} is built`);
    stack = await stackWithoutWorker();
    url = stack.server.url;
    client = stack.client;
    await client.jsm.consumers.info(BATCH_STREAM, BATCH_CONSUMER); // the worker made the lane
    worker = fakeBatchWorker(client);
    dir = mkdtempSync(join(tmpdir(), "ci-batch-events-"));
  });
  after(async () => {
    await stack?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const fresh = (name) => mkdtempSync(join(dir, `${name}-`));
  const status = async (b) => {
    const r = await ci(["batch", "status", b, "--json"], { url });
    assert.equal(r.code, 0, r.stderr);
    return r;
  };
  // Takes every task of batch b waiting in CI_BATCH (n of them), in order.
  const takeAll = async (n) => {
    const got = [];
    while (got.length < n) {
      const t = await worker.take(5000);
      assert.ok(t, `task ${got.length + 1} of ${n} taken`);
      got.push(t);
    }
    return got;
  };

  test("an unknown batch: status, wait and results exit 2 with a sentence (1 is wait's 'a task did not succeed'), as a bad id does", async () => {
    // wait gives a batch's submission time to publish it (60 s, or --wait-ms).
    for (const cmd of [["status", "nope"], ["status", "nope", "--json"], ["wait", "nope", "--wait-ms", "300"], ["results", "nope", "--jsonl"]]) {
      const r = await ci(["batch", ...cmd], { url });
      assert.equal(r.code, 2, `${cmd}: ${r.stderr}`);
      assert.equal(r.stdout, "");
      assert.match(r.stderr, /no batch 'nope'/);
    }
    const bad = await ci(["batch", "status", "a.b"], { url });
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /not a batch id/);
  });

  test("cancel of an unknown batch is refused (exit 2) and publishes nothing: it would wait a day for a batch that gets the id", async () => {
    const r = await ci(["batch", "cancel", "nope-cancel"], { url });
    assert.equal(r.code, 2, r.stderr);
    assert.equal(r.stdout, "");
    assert.match(r.stderr, /no batch 'nope-cancel': no task of it is stored .*nothing was cancelled/);
    assert.deepEqual(await batchSubjectCounts(client.jsm, "nope-cancel"), {}, "no cancel event");
    // A cancel alone (published by hand) is no batch either.
    await client.js.publish(`${BATCHES_PREFIX}.nope-cancel.cancel`, new Uint8Array());
    const again = await ci(["batch", "cancel", "nope-cancel"], { url });
    assert.equal(again.code, 2, again.stderr);
    assert.equal((await batchSubjectCounts(client.jsm, "nope-cancel")).cancel, 1);
  });

  let b1, files, tasks;
  test("submit --file-each: one task per file in sorted order, ids <b>-<n>, big inputs uploaded, the seal, status counts them queued", async () => {
    const cwd = fresh("submit");
    mkdirSync(join(cwd, "in"));
    files = ["c.csv", "a.csv", "e.csv", "b.csv", "d.csv"];
    for (const f of files) writeFileSync(join(cwd, "in", f), `name,value\n${f},1\n`);
    // One over 256 KiB: it goes to the object store, as ci run does.
    writeFileSync(join(cwd, "in", "e.csv"), "x,y\n" + "1,2\n".repeat(80000));
    writeFileSync(join(cwd, "in", "notes.txt"), "not matched");
    writeFileSync(join(cwd, "s.py"), "import glob\nprint(glob.glob('*.csv'))\n");
    b1 = "b1-" + Date.now().toString(36);
    const r = await ci(["batch", "submit", "s.py", "--file-each", "in/*.csv", "--batch", b1, "--label", "team=x"], { cwd, url });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `${b1}\n`);
    assert.match(r.stderr, new RegExp(`batch ${b1}: 5 tasks: 5 submitted; sealed`));
    assert.equal(await batchLeft(client.jsm, b1), 5);

    const st = await status(b1);
    assert.equal(st.stdout, '{"total":5,"queued":5,"running":0,"succeeded":0,"failed":0,"timed_out":0,"cancelled":0}\n');
    const seal = await batchEvents(client, b1, "sealed");
    assert.equal(seal.length, 1);
    assert.equal(seal[0].msgId, `${b1}.sealed`);
    assert.deepEqual(JSON.parse(seal[0].data), { total: "5" });

    tasks = await takeAll(5);
    const sorted = [...files].sort();
    tasks.forEach((t, i) => {
      assert.equal(t.subject, `${BATCH_PREFIX}.${b1}`);
      assert.equal(t.taskId, `${b1}-${i + 1}`);
      assert.equal(t.msgId, t.taskId);
      assert.equal(t.batchId, b1);
      assert.equal(t.request.sessionId, "");
      assert.equal(t.request.code, "import glob\nprint(glob.glob('*.csv'))\n");
      assert.deepEqual(t.request.labels, { team: "x" });
      assert.equal(t.request.files.length, 1);
      assert.equal(t.request.files[0].name, sorted[i]);
    });
    assert.equal(tasks[0].request.files[0].content.toString(), "name,value\na.csv,1\n");
    assert.equal(tasks[4].request.files[0].object, `inputs/${b1}-5/e.csv`);
    const big = await client.getObject(`inputs/${b1}-5/e.csv`);
    assert.ok(big, "the large input is in the object store");
    assert.equal(big.length, 4 + 4 * 80000);
    // Taken by the stand-in but not yet said so: still queued by the counts.
    assert.equal((await status(b1)).stdout, '{"total":5,"queued":5,"running":0,"succeeded":0,"failed":0,"timed_out":0,"cancelled":0}\n');
  });

  test("status follows taken and end events; wait past --wait-ms exits 124 and says where the batch is", async () => {
    await worker.taken(tasks[0]);
    await worker.taken(tasks[1]);
    await worker.end(tasks[0], { status: "TASK_STATUS_SUCCEEDED", stdout: "ok\n", exitCode: 0 });
    await worker.end(tasks[1], { status: "TASK_STATUS_FAILED", error: "the code exited with code 1 (KeyError: 'value')", exitCode: 1 });
    await worker.taken(tasks[2]);
    const st = await status(b1);
    assert.equal(st.stdout, '{"total":5,"queued":2,"running":1,"succeeded":1,"failed":1,"timed_out":0,"cancelled":0}\n');
    const human = await ci(["batch", "status", b1], { url });
    assert.equal(human.code, 0, human.stderr);
    assert.match(human.stdout, /^tasks: +5 \(sealed\)$/m);
    assert.match(human.stdout, /^running: +1$/m);
    assert.match(human.stdout, /^complete: +no$/m);

    const w = await ci(["batch", "wait", b1, "--wait-ms", "1200"], { url });
    assert.equal(w.code, 124, w.stderr);
    assert.match(w.stderr, /not every task ended within 1200 ms: 2\/5 ended: 1 succeeded, 1 failed, 0 timed out, 0 cancelled; 1 running, 2 queued/);
    // Not a terminal: plain lines, no bar, no carriage return.
    assert.doesNotMatch(w.stderr, /\r|\[#/);
  });

  let records;
  test("wait ends when the last task ends: exit 1, failures grouped by error with task ids; complete exactly once", async () => {
    // The wait must be under way (its first progress line out) before the
    // last tasks end, so that it is the ending it waits for.
    let progress = "";
    const waiting = ci(["batch", "wait", b1], { url, timeoutMs: 60000, onStderr: (e) => (progress = e) });
    records = {};
    await until("wait printed its first progress line", async () => /2\/5 ended/.test(progress));
    records[tasks[2].taskId] = await worker.end(tasks[2], { status: "TASK_STATUS_TIMED_OUT", error: "the code ran longer than 1000 ms", exitCode: 137 });
    for (const i of [3, 4]) await worker.taken(tasks[i]);
    records[tasks[3].taskId] = await worker.end(tasks[3], { status: "TASK_STATUS_FAILED", error: "the code exited with code 1 (KeyError: 'value')", exitCode: 1 });
    records[tasks[4].taskId] = await worker.end(tasks[4], { status: "TASK_STATUS_CANCELLED", error: "the task was cancelled" });
    const w = await waiting;
    assert.equal(w.code, 1, `${w.stdout}\n${w.stderr}`);
    const lines = w.stdout.split("\n");
    assert.equal(lines[0], `batch ${b1}: 1 of 5 tasks succeeded; 2 failed, 1 timed out, 1 cancelled`);
    // The largest group first, with its tasks.
    assert.equal(lines[1], "  2 failed: the code exited with code 1 (KeyError: 'value')");
    assert.equal(lines[2], `    tasks ${b1}-2, ${b1}-4`);
    assert.match(w.stdout, new RegExp(`^  1 timed_out: the code ran longer than 1000 ms\\n    tasks ${b1}-3$`, "m"));
    assert.match(w.stdout, new RegExp(`^  1 cancelled: the task was cancelled\\n    tasks ${b1}-5$`, "m"));
    assert.match(w.stderr, /5\/5 ended: 1 succeeded, 2 failed, 1 timed out, 1 cancelled; 0 running, 0 queued/);

    const st = await status(b1);
    assert.equal(st.stdout, '{"total":5,"queued":0,"running":0,"succeeded":1,"failed":2,"timed_out":1,"cancelled":1}\n');
    const complete = await batchEvents(client, b1, "complete");
    assert.equal(complete.length, 1);
    assert.deepEqual(JSON.parse(complete[0].data), { batchId: b1, total: "5", succeeded: "1", failed: "2", timedOut: "1", cancelled: "1" });
    const human = await ci(["batch", "status", b1], { url });
    assert.match(human.stdout, /^complete: +yes$/m);
  });

  test("results --jsonl: one line per ended task in the order they ended, equal to the stored results; an expired one says so", async () => {
    const r = await ci(["batch", "results", b1, "--jsonl"], { url });
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.trimEnd().split("\n");
    assert.equal(lines.length, 5);
    const ends = (await batchEvents(client, b1)).filter((e) => ["succeeded", "failed", "timed_out", "cancelled"].includes(e.event));
    const { ExecutionResult } = proto();
    const kv = await client.kvBucket();
    for (let i = 0; i < 5; i++) {
      const line = JSON.parse(lines[i]);
      assert.equal(line.taskId, JSON.parse(ends[i].data).taskId, "in the order of the end events");
      const stored = await kv.get(line.taskId);
      const want = decodeMessage(ExecutionResult, stored.value);
      assert.deepEqual(normalize(ExecutionResult, line), want.value, `line ${i + 1}`);
      assert.equal(line.batchId, b1);
    }
    // The stored results are protobuf (ci submits protobuf): the lines are
    // the JSON mapping of them.
    assert.equal(JSON.parse(lines.find((l) => JSON.parse(l).taskId === `${b1}-3`)).exitCode, 137);

    // Without --jsonl: id, status and error, one line each.
    const plain = await ci(["batch", "results", b1], { url });
    assert.equal(plain.code, 0, plain.stderr);
    assert.match(plain.stdout, new RegExp(`^${b1}-2 failed: the code exited with code 1 \\(KeyError: 'value'\\)$`, "m"));
    assert.match(plain.stdout, new RegExp(`^${b1}-1 succeeded$`, "m"));

    // A result that expired (deleted here) becomes the end event's line.
    await kv.delete(`${b1}-4`);
    const r2 = await ci(["batch", "results", b1, "--jsonl"], { url });
    assert.equal(r2.code, 0, r2.stderr);
    const gone = r2.stdout.trimEnd().split("\n").map((l) => JSON.parse(l)).find((l) => l.taskId === `${b1}-4`);
    assert.deepEqual(Object.keys(gone).sort(), ["batchId", "error", "status", "taskId"]);
    assert.equal(gone.status, "TASK_STATUS_FAILED");
    assert.equal(gone.batchId, b1);
    assert.match(gone.error, /^the result expired from the results bucket; the task's end event said: the code exited with code 1 \(KeyError: 'value'\)$/);
    assert.match(r2.stderr, /1 results had expired/);

    // A record that is not an ExecutionResult: its line says so, the others stay.
    const saved = (await kv.get(`${b1}-5`)).value;
    await kv.put(`${b1}-5`, Buffer.from([0xff, 0xff, 0xff]));
    const r3 = await ci(["batch", "results", b1, "--jsonl"], { url });
    assert.equal(r3.code, 0, r3.stderr);
    const all = r3.stdout.trimEnd().split("\n").map((l) => JSON.parse(l));
    assert.equal(all.length, 5);
    const bad = all.find((l) => l.taskId === `${b1}-5`);
    assert.equal(bad.status, "TASK_STATUS_CANCELLED");
    assert.equal(bad.error, "the stored result cannot be read; the task's end event said: the task was cancelled");
    await kv.put(`${b1}-5`, saved);
  });

  test("the same submit again runs nothing twice: taken tasks skipped, also without their result; a batch sealed with another total refuses", async () => {
    const cwd = fresh("again");
    mkdirSync(join(cwd, "in"));
    for (const f of files) writeFileSync(join(cwd, "in", f), `name,value\n${f},1\n`);
    writeFileSync(join(cwd, "s.py"), "import glob\nprint(glob.glob('*.csv'))\n");
    const before = (await client.jsm.streams.info(BATCH_STREAM)).state.last_seq;
    const r = await ci(["batch", "submit", "s.py", "--file-each", "in/*.csv", "--batch", b1], { cwd, url });
    assert.equal(r.code, 0, r.stderr);
    // b1-4's record is gone (the test above), but its taken event says a
    // worker took it: not published again (the queue's dedup window would
    // hide a copy only for 1 h).
    assert.match(r.stderr, new RegExp(`batch ${b1}: 5 tasks: 0 submitted, 5 skipped \\(taken by a worker already, or their result is terminal\\); sealed already`));
    assert.match(r.stderr, /every task has ended/);
    assert.equal((await client.jsm.streams.info(BATCH_STREAM)).state.last_seq, before, "nothing new stored in CI_BATCH");
    assert.equal(await worker.take(1000), null);
    assert.equal((await batchEvents(client, b1, "complete")).length, 1, "complete stays one message");

    writeFileSync(join(cwd, "in", "f.csv"), "x\n");
    const more = await ci(["batch", "submit", "s.py", "--file-each", "in/*.csv", "--batch", b1], { cwd, url });
    assert.equal(more.code, 2, more.stderr);
    assert.match(more.stderr, new RegExp(`batch ${b1} was sealed with 5 tasks; this submission has 6`));
    assert.equal((await client.jsm.streams.info(BATCH_STREAM)).state.last_seq, before);
  });

  test("submit --jsonl: taskId kept or <b>-<n> for the n-th request (blank lines are not counted), batchId checked, --wire-json sends JSON", async () => {
    const cwd = fresh("jsonl");
    const b = "bj-" + Date.now().toString(36);
    const lines = [
      JSON.stringify({ taskId: "own-id-" + b, language: "python", code: "print(1)" }),
      "",
      JSON.stringify({ language: "python", code: "print(2)", batchId: b, limits: { timeoutMs: 5000 }, labels: { k: "v" } }),
      "   ",
      JSON.stringify({ language: "python", code: "print(3)", files: [{ name: "x.csv", content: Buffer.from("a,b\n").toString("base64") }] }),
    ];
    writeFileSync(join(cwd, "r.jsonl"), lines.join("\n") + "\n");
    const r = await ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", b, "--wire-json"], { cwd, url });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `${b}\n`);
    assert.match(r.stderr, /3 tasks: 3 submitted; sealed\n/);
    const got = await takeAll(3);
    // Requests 2 and 3 (on lines 3 and 5): a blank line changes no id.
    assert.deepEqual(got.map((t) => t.taskId), ["own-id-" + b, `${b}-2`, `${b}-3`]);
    for (const t of got) {
      assert.equal(t.contentType, "application/json");
      assert.equal(t.subject, `${BATCH_PREFIX}.${b}`);
      assert.equal(t.batchId, b);
      assert.equal(t.msgId, t.taskId);
    }
    assert.equal(got[0].request.code, "print(1)");
    assert.equal(got[1].request.limits.timeoutMs, 5000);
    assert.deepEqual(got[1].request.labels, { k: "v" });
    assert.equal(got[2].request.files[0].content.toString(), "a,b\n");
    for (const t of got) {
      await worker.taken(t);
      await worker.end(t, { status: "TASK_STATUS_SUCCEEDED" });
    }
    // The stand-in published complete after the last end, as a worker does.
    assert.equal((await batchEvents(client, b, "complete")).length, 1);
    const w = await ci(["batch", "wait", b], { url });
    assert.equal(w.code, 0, w.stderr);
    assert.equal(w.stdout, `batch ${b}: all 3 tasks succeeded\n`);
    // Results stored as JSON (the requests were): the lines are the records.
    const res = await ci(["batch", "results", b, "--jsonl"], { url });
    const kv = await client.kvBucket();
    for (const l of res.stdout.trimEnd().split("\n")) {
      const line = JSON.parse(l);
      assert.deepEqual(line, JSON.parse(Buffer.from((await kv.get(line.taskId)).value).toString()));
    }
  });

  test("a submission that died before its seal: run again, it skips the ended tasks, seals, and publishes complete itself", async () => {
    const cwd = fresh("reseal");
    const b = "br-" + Date.now().toString(36);
    const reqs = [1, 2, 3].map((n) => ({ language: "python", code: `print(${n})` }));
    writeFileSync(join(cwd, "r.jsonl"), reqs.map((r) => JSON.stringify(r)).join("\n") + "\n");
    // What the first run got out before it died: the tasks, no seal.
    reqs.forEach((r, i) => (r.taskId = `${b}-${i + 1}`));
    for (const r of reqs) await client.submit({ ...r, batchId: b }, { subject: `${BATCH_PREFIX}.${b}` });
    for (const t of await takeAll(3)) {
      await worker.taken(t);
      await worker.end(t, { status: "TASK_STATUS_SUCCEEDED" });
    }
    assert.equal((await batchSubjectCounts(client.jsm, b)).complete, undefined, "no seal, no complete");
    assert.equal((await status(b)).stdout, '{"total":3,"queued":0,"running":0,"succeeded":3,"failed":0,"timed_out":0,"cancelled":0}\n');
    const human = await ci(["batch", "status", b], { url });
    assert.match(human.stdout, /^tasks: +3 so far \(not sealed/m);

    const again = await ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", b], { cwd, url });
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stderr, /3 tasks: 0 submitted, 3 skipped .*; sealed\n/);
    assert.match(again.stderr, /every task has ended; the complete event is published/);
    const complete = await batchEvents(client, b, "complete");
    assert.equal(complete.length, 1);
    assert.equal(complete[0].msgId, `${b}.complete`);
    assert.deepEqual(JSON.parse(complete[0].data), { batchId: b, total: "3", succeeded: "3", failed: "0", timedOut: "0", cancelled: "0" });
    // Once more: the seal and complete stay one message each.
    const third = await ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", b], { cwd, url });
    assert.equal(third.code, 0, third.stderr);
    assert.match(third.stderr, /sealed already\n.*every task has ended\n/s);
    const n = await batchSubjectCounts(client.jsm, b);
    assert.equal(n.sealed, 1);
    assert.equal(n.complete, 1);
  });

  test("a submission that fails after its seal (publishing complete) says the seal is published, not that the batch is not sealed", async () => {
    const cwd = fresh("sealfail");
    const b = "bz-" + Date.now().toString(36);
    const reqs = [1, 2].map((n) => ({ language: "python", code: `print(${n})` }));
    writeFileSync(join(cwd, "r.jsonl"), reqs.map((r) => JSON.stringify(r)).join("\n") + "\n");
    // A first run that died before its seal; its tasks have ended since.
    for (const [i, r] of reqs.entries()) await client.submit({ ...r, taskId: `${b}-${i + 1}`, batchId: b }, { subject: `${BATCH_PREFIX}.${b}` });
    for (const t of await takeAll(2)) {
      await worker.taken(t);
      await worker.end(t, { status: "TASK_STATUS_SUCCEEDED" });
    }
    // CI_BATCHES takes one message more (the seal), then refuses (complete).
    const { config, state } = await client.jsm.streams.info(BATCHES_STREAM);
    await client.jsm.streams.update(BATCHES_STREAM, { ...config, discard: "new", max_msgs: state.messages + 1 });
    let r;
    try {
      r = await ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", b], { cwd, url });
    } finally {
      await client.jsm.streams.update(BATCHES_STREAM, config);
    }
    assert.equal(r.code, 3, r.stderr);
    assert.match(r.stderr, new RegExp(`batch ${b}: all 2 tasks went out and the seal is published; what failed came after it`));
    assert.doesNotMatch(r.stderr, /not sealed/);
    const n = await batchSubjectCounts(client.jsm, b);
    assert.equal(n.sealed, 1);
    assert.equal(n.complete, undefined);
    const again = await ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", b], { cwd, url });
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stderr, /every task has ended; the complete event is published/);
  });

  test("before the seal, total is taken + the batch's tasks left in the queue not running: a task that ended and is not acked yet counts twice for that moment", async () => {
    const b = "bs-" + Date.now().toString(36);
    // What a submission got out so far: two tasks, no seal.
    for (const n of [1, 2]) await client.submit({ taskId: `${b}-${n}`, batchId: b, language: "python", code: `print(${n})` }, { subject: `${BATCH_PREFIX}.${b}` });
    const json = async () => JSON.parse((await status(b)).stdout);
    assert.deepEqual(await json(), { total: 2, queued: 2, running: 0, succeeded: 0, failed: 0, timed_out: 0, cancelled: 0 });
    const t1 = await worker.take(5000);
    assert.equal(t1.taskId, `${b}-1`);
    await worker.taken(t1);
    assert.deepEqual(await json(), { total: 2, queued: 1, running: 1, succeeded: 0, failed: 0, timed_out: 0, cancelled: 0 });
    // Its end event is stored; its worker has not acked it yet: in taken
    // and in the queue both (contract §20, "Before the seal").
    await worker.end(t1, { ack: false });
    assert.deepEqual(await json(), { total: 3, queued: 2, running: 0, succeeded: 1, failed: 0, timed_out: 0, cancelled: 0 });
    const human = await ci(["batch", "status", b], { url });
    assert.match(human.stdout, /^tasks: +3 so far \(not sealed: its submission has not finished\)$/m);
    await t1.msg.ackAck();
    await until("the ack removed it from the queue", async () => (await batchLeft(client.jsm, b)) === 1);
    assert.deepEqual(await json(), { total: 2, queued: 1, running: 0, succeeded: 1, failed: 0, timed_out: 0, cancelled: 0 });
    const t2 = await worker.take(5000);
    await worker.taken(t2);
    await worker.end(t2);
  });

  test("submit refuses bad input with exit 2 before anything goes out: a bad JSONL line is named, no match, a folder, a long batch id", async () => {
    const cwd = fresh("bad");
    const b = "bad-" + Date.now().toString(36);
    const ok = JSON.stringify({ language: "python", code: "print(1)" });
    const cases = [
      [[ok, "{not json"], /r\.jsonl:2: /],
      [[ok, ok, JSON.stringify({ language: "python", code: "x", batchId: "other" })], /r\.jsonl:3: batchId 'other' is not this batch/],
      [[JSON.stringify({ language: "python", code: "x", sessionId: "s1" })], /r\.jsonl:1: sessionId is set/],
      [[JSON.stringify({ language: "python", code: "x", bogus: 1 })], /r\.jsonl:1: .*bogus/],
      [[JSON.stringify({ language: "ruby", code: "x" })], /r\.jsonl:1: unsupported language 'ruby'/],
      [[JSON.stringify({ taskId: "t1", language: "python", code: "x" }), ok, JSON.stringify({ taskId: "t1", language: "python", code: "y" })], /lines 1 and 3 both have taskId 't1'/],
      [["", "  "], /holds no request/],
    ];
    for (const [lines, re] of cases) {
      writeFileSync(join(cwd, "r.jsonl"), lines.join("\n"));
      const r = await ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", b], { cwd, url });
      assert.equal(r.code, 2, `${lines}: ${r.stderr}`);
      assert.match(r.stderr, re);
    }
    writeFileSync(join(cwd, "s.py"), "print(1)\n");
    mkdirSync(join(cwd, "d.csv"));
    // Every input is checked before the first task goes out: a bad one
    // sorted after good ones left those published and the batch unsealed.
    mkdirSync(join(cwd, "names"));
    mkdirSync(join(cwd, "sizes"));
    for (const d of ["names", "sizes"]) for (const f of ["a.csv", "b.csv"]) writeFileSync(join(cwd, d, f), "x\n");
    writeFileSync(join(cwd, "names", "c;d.csv"), "x\n");
    writeFileSync(join(cwd, "sizes", "z.csv"), "");
    truncateSync(join(cwd, "sizes", "z.csv"), 21 * 1024 * 1024); // sparse: over the 20 MiB limit
    for (const [args, re] of [
      [["--file-each", "none/*.csv"], /matches no file/],
      [["--file-each", "*.csv"], /'d\.csv' is not a regular file/],
      [["--file-each", "s.py", "--batch", "b".repeat(63)], /leave room for 62/],
      [["--file-each", "s.py", "--file", "s.py"], /does not take --file/],
      [["--file-each", "names/*.csv"], /--file-each: 'names\/c;d\.csv' cannot be an input: its name 'c;d\.csv' is not allowed \(use only letters.*nothing was submitted/],
      [["--file-each", "sizes/*.csv"], /--file-each: 'sizes\/z\.csv' is 22020096 bytes; an input may be at most 20971520 bytes .*nothing was submitted/],
      [["--file-each", "names/a.csv", "--label", "novalue"], /label 'novalue' is not KEY=VALUE; nothing was submitted/],
    ]) {
      const r = await ci(["batch", "submit", "s.py", ...args, ...(args.includes("--batch") ? [] : ["--batch", b])], { cwd, url });
      assert.equal(r.code, 2, `${args}: ${r.stderr}`);
      assert.match(r.stderr, re);
      assert.doesNotMatch(r.stderr, /went out before this/, `${args}`);
      assert.equal(await batchLeft(client.jsm, b), 0, `${args}: nothing was published`);
    }
    assert.equal(await batchLeft(client.jsm, b), 0, "nothing was published");
    assert.deepEqual(await batchSubjectCounts(client.jsm, b), {});
  });

  test("submit refuses a task id in use outside the batch (its record says another batch, or none) before anything goes out", async () => {
    const cwd = fresh("used");
    const b = "bu-" + Date.now().toString(36);
    const kv = await client.kvBucket();
    const rec = (id, status, batchId) => Buffer.from(JSON.stringify({ taskId: id, status, ...(batchId ? { batchId } : {}) }));
    await kv.put(`solo-${b}`, rec(`solo-${b}`, "TASK_STATUS_SUCCEEDED"));
    await kv.put(`other-${b}`, rec(`other-${b}`, "TASK_STATUS_RUNNING", "another-batch"));
    const fresh1 = JSON.stringify({ taskId: `new-${b}`, language: "python", code: "print(1)" });
    for (const [id, re] of [
      [`solo-${b}`, new RegExp(`r\\.jsonl:3: task id 'solo-${b}' is in use: a task outside any batch has it \\(succeeded in the results bucket\\); task ids must be unique .*give the line another taskId; nothing was submitted`)],
      [`other-${b}`, new RegExp(`r\\.jsonl:3: task id 'other-${b}' is in use: a task of batch 'another-batch' has it \\(running`)],
    ]) {
      writeFileSync(join(cwd, "r.jsonl"), [fresh1, "", JSON.stringify({ taskId: id, language: "python", code: "print(2)" })].join("\n") + "\n");
      const r = await ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", b], { cwd, url });
      assert.equal(r.code, 2, r.stderr);
      assert.match(r.stderr, re);
      assert.equal(await batchLeft(client.jsm, b), 0, "nothing was published");
    }
    // --file-each: <b>-<n> of another batch's task (or a task submitted
    // alone under that id).
    writeFileSync(join(cwd, "a.csv"), "a\n");
    writeFileSync(join(cwd, "b.csv"), "b\n");
    writeFileSync(join(cwd, "s.py"), "print(1)\n");
    await kv.put(`${b}-2`, rec(`${b}-2`, "TASK_STATUS_FAILED"));
    const f = await ci(["batch", "submit", "s.py", "--file-each", "*.csv", "--batch", b], { cwd, url });
    assert.equal(f.code, 2, f.stderr);
    assert.match(f.stderr, new RegExp(`--file-each: the task of 'b\\.csv': task id '${b}-2' is in use: a task outside any batch has it \\(failed .*submit under another --batch; nothing was submitted`));
    assert.equal(await batchLeft(client.jsm, b), 0, "nothing was published");
    assert.deepEqual(await batchSubjectCounts(client.jsm, b), {});
  });

  test("submit of a new batch stops at a task id that another batch's queued task has (CI_BATCH drops it as a copy): exit 2, naming the line, not sealed", async () => {
    const cwd = fresh("queued");
    const b = "bq-" + Date.now().toString(36);
    // Another batch's task, queued: it has no record in ci-results yet.
    await client.submit({ taskId: `x-${b}`, batchId: `other-${b}`, language: "python", code: "print(0)" }, { subject: `${BATCH_PREFIX}.other-${b}` });
    const lines = [1, 2, 3].map((n) => JSON.stringify({ ...(n === 2 ? { taskId: `x-${b}` } : {}), language: "python", code: `print(${n})` }));
    writeFileSync(join(cwd, "r.jsonl"), lines.join("\n") + "\n");
    const r = await ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", b], { cwd, url });
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, new RegExp(`r\\.jsonl:2: task id 'x-${b}' is in use: a task of batch 'other-${b}', queued or running, has it \\(CI_BATCH dropped this task as a copy of its message \\d+ on 'ci\\.batch\\.other-${b}'\\); task ids must be unique \\(contract §11\\): give the line another taskId`));
    assert.match(r.stderr, new RegExp(`batch ${b}: 1 of 3 tasks went out before this; it is not sealed: once the line has another taskId, run the same command again to finish it \\(run as it is, it stops at that line again\\)`));
    assert.equal((await batchSubjectCounts(client.jsm, b)).sealed, undefined, "not sealed");
    // --file-each: <b>-<n> is another batch's queued task.
    const f = "bf-" + Date.now().toString(36);
    await client.submit({ taskId: `${f}-2`, batchId: `other-${f}`, language: "python", code: "print(0)" }, { subject: `${BATCH_PREFIX}.other-${f}` });
    for (const n of ["a", "b"]) writeFileSync(join(cwd, `${n}.csv`), `${n}\n`);
    writeFileSync(join(cwd, "s.py"), "print(1)\n");
    const e = await ci(["batch", "submit", "s.py", "--file-each", "*.csv", "--batch", f], { cwd, url });
    assert.equal(e.code, 2, e.stderr);
    assert.match(e.stderr, new RegExp(`--file-each: the task of 'b\\.csv': task id '${f}-2' is in use: a task of batch 'other-${f}', queued or running, has it .*submit under another --batch`));
    assert.match(e.stderr, new RegExp(`batch ${f}: 1 of 2 tasks went out before this; it is not sealed and cannot be finished under this id: cancel it \\(ci batch cancel ${f}\\)`));
    // The queue as the tests after this one expect it: empty.
    for (const t of await takeAll(4)) await t.msg.ackAck();
  });

  test("a submission stopped at another batch's queued task id, run again as it is, stops there again; the other batch's own submission run again counts its copies; nothing runs twice", async () => {
    const cwd = fresh("rerun");
    const a = "ra-" + Date.now().toString(36);
    const b = "rb-" + Date.now().toString(36);
    const shared = `s-${a}`;
    const line = (n, taskId) => JSON.stringify({ ...(taskId ? { taskId } : {}), language: "python", code: `print(${n})` });
    writeFileSync(join(cwd, "a.jsonl"), [line(1, shared), line(2), line(3)].join("\n") + "\n");
    writeFileSync(join(cwd, "b.jsonl"), [line(1), line(2, shared), line(3)].join("\n") + "\n");
    // Batch a's submission stopped after two of its three tasks (no seal).
    await client.submit({ taskId: shared, batchId: a, language: "python", code: "print(1)" }, { subject: `${BATCH_PREFIX}.${a}` });
    await client.submit({ taskId: `${a}-2`, batchId: a, language: "python", code: "print(2)" }, { subject: `${BATCH_PREFIX}.${a}` });
    // Batch b has a line with a's queued task's id: its first run stops
    // there, and so does every run after it while the line keeps the id
    // (b has a task stored by then: a copy is no longer taken for in use
    // just because the batch is new).
    for (const run of ["first", "again"]) {
      const r = await ci(["batch", "submit", "--jsonl", "b.jsonl", "--batch", b], { cwd, url });
      assert.equal(r.code, 2, `${run}: ${r.stderr}`);
      assert.match(r.stderr, new RegExp(`b\\.jsonl:2: task id '${shared}' is in use: a task of batch '${a}', queued or running, has it \\(CI_BATCH dropped this task as a copy of its message \\d+ on 'ci\\.batch\\.${a}'\\); .*give the line another taskId`), run);
      assert.match(r.stderr, new RegExp(`batch ${b}: 1 of 3 tasks went out before this; it is not sealed`), run);
      assert.equal((await batchSubjectCounts(client.jsm, b)).sealed, undefined, `${run}: not sealed`);
      assert.equal(await batchLeft(client.jsm, b), 1, `${run}: only ${b}-1 went out`);
    }
    // --file-each (the client's own submit path): the same.
    const f = "rf-" + Date.now().toString(36);
    const fdir = fresh("rerunfiles");
    for (const n of ["a", "b"]) writeFileSync(join(fdir, `${n}.csv`), `${n}\n`);
    writeFileSync(join(fdir, "s.py"), "print(1)\n");
    await client.submit({ taskId: `${f}-2`, batchId: `other-${f}`, language: "python", code: "print(0)" }, { subject: `${BATCH_PREFIX}.other-${f}` });
    for (const run of ["first", "again"]) {
      const r = await ci(["batch", "submit", "s.py", "--file-each", "*.csv", "--batch", f], { cwd: fdir, url });
      assert.equal(r.code, 2, `${run}: ${r.stderr}`);
      assert.match(r.stderr, new RegExp(`--file-each: the task of 'b\\.csv': task id '${f}-2' is in use: a task of batch 'other-${f}', queued or running, has it`), run);
      assert.equal((await batchSubjectCounts(client.jsm, f)).sealed, undefined, `${run}: not sealed`);
    }
    // Batch a's own submission, run again after its stop: its two copies
    // are its own (on ci.batch.<a>), the third goes out, the seal.
    const ra = await ci(["batch", "submit", "--jsonl", "a.jsonl", "--batch", a], { cwd, url });
    assert.equal(ra.code, 0, ra.stderr);
    assert.match(ra.stderr, new RegExp(`batch ${a}: 3 tasks: 1 submitted, 2 queued already \\(not queued again\\); sealed\n`));
    // b, once the line has another id: its first task is its own copy.
    writeFileSync(join(cwd, "b.jsonl"), [line(1), line(2, `t-${b}`), line(3)].join("\n") + "\n");
    const rb = await ci(["batch", "submit", "--jsonl", "b.jsonl", "--batch", b], { cwd, url });
    assert.equal(rb.code, 0, rb.stderr);
    assert.match(rb.stderr, new RegExp(`batch ${b}: 3 tasks: 2 submitted, 1 queued already \\(not queued again\\); sealed\n`));
    // The queue holds each task once, on its own batch's subject: a's
    // three, b's three, f's first and the other batch's f-2.
    assert.equal((await client.jsm.streams.info(BATCH_STREAM)).state.messages, 8, "eight tasks queued");
    const got = await takeAll(8);
    assert.equal(await worker.take(1000), null, "nothing more is queued");
    const byId = new Map(got.map((t) => [t.taskId, t]));
    assert.equal(byId.size, 8, `each task once: ${got.map((t) => t.taskId)}`);
    for (const [ids, batch] of [[[shared, `${a}-2`, `${a}-3`], a], [[`${b}-1`, `t-${b}`, `${b}-3`], b], [[`${f}-1`], f], [[`${f}-2`], `other-${f}`]]) {
      for (const id of ids) {
        const t = byId.get(id);
        assert.ok(t, `${id} queued`);
        assert.equal(t.subject, `${BATCH_PREFIX}.${batch}`, id);
        assert.equal(t.batchId, batch, id);
      }
    }
    assert.equal(byId.get(shared).request.code, "print(1)");
    for (const t of got) {
      if (t.batchId === a || t.batchId === b) {
        await worker.taken(t);
        await worker.end(t, { status: "TASK_STATUS_SUCCEEDED" });
      } else {
        await t.msg.ackAck();
      }
    }
    for (const x of [a, b]) {
      const w = await ci(["batch", "wait", x, "--wait-ms", "20000"], { url });
      assert.equal(w.code, 0, w.stderr);
      assert.equal(w.stdout, `batch ${x}: all 3 tasks succeeded\n`);
    }
  });

  test("a new batch's task dropped as a copy of a task that was taken and acked, with no record saying whose, is in use too", async () => {
    const cwd = fresh("gone");
    const b = "bg-" + Date.now().toString(36);
    // Another batch's task, taken and acked without a record (deleted, or
    // expired): the stream keeps its id, not its message.
    await client.submit({ taskId: `g-${b}`, batchId: `other-${b}`, language: "python", code: "print(0)" }, { subject: `${BATCH_PREFIX}.other-${b}` });
    const [t] = await takeAll(1);
    await t.msg.ackAck();
    await until("the acked task left the queue", async () => (await batchLeft(client.jsm, `other-${b}`)) === 0);
    writeFileSync(join(cwd, "r.jsonl"), JSON.stringify({ taskId: `g-${b}`, language: "python", code: "print(1)" }) + "\n");
    const r = await ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", b], { cwd, url });
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, new RegExp(`r\\.jsonl:1: task id 'g-${b}' is in use: CI_BATCH dropped this task as a copy of one that no record says is of this batch, which had nothing stored when this submission began`));
    assert.deepEqual(await batchSubjectCounts(client.jsm, b), {});
  });

  test("submit looks task ids up many at a time, and not at all for the <b>-<n> of a batch id it made", async () => {
    const cwd = fresh("lookups");
    const b = "bl-" + Date.now().toString(36);
    const kv = await client.kvBucket();
    await kv.put(`used-${b}`, Buffer.from(JSON.stringify({ taskId: `used-${b}`, status: "TASK_STATUS_SUCCEEDED", batchId: "another-batch" })));
    // 300 requests, the last one's id in use: refused once every id was looked up.
    const lines = [];
    for (let n = 1; n < 300; n++) lines.push(JSON.stringify({ language: "python", code: `print(${n})` }));
    lines.push(JSON.stringify({ taskId: `used-${b}`, language: "python", code: "print(0)" }));
    writeFileSync(join(cwd, "r.jsonl"), lines.join("\n") + "\n");
    // The lookups as the server sees them: each request and its answer (the
    // server may pass the answer on before its copy of the request).
    const nc = client.nc;
    const waiting = new Set();
    const early = new Set();
    let asked = 0;
    let most = 0;
    const requests = nc.subscribe("$JS.API.STREAM.MSG.GET.KV_ci-results", {
      callback: (_, m) => {
        if (!m.reply) return;
        asked++;
        if (!early.delete(m.reply)) waiting.add(m.reply);
        most = Math.max(most, waiting.size);
      },
    });
    const answers = nc.subscribe("_INBOX.>", { callback: (_, m) => waiting.delete(m.subject) || early.add(m.subject) });
    await nc.flush();
    try {
      const given = await ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", b], { cwd, url });
      assert.equal(given.code, 2, given.stderr);
      assert.match(given.stderr, new RegExp(`r\\.jsonl:300: task id 'used-${b}' is in use: a task of batch 'another-batch' has it`));
      await nc.flush();
      assert.equal(asked, 300);
      assert.ok(most > 1, `at most ${most} lookup(s) were in flight at once`);
      assert.ok(most <= 64, `${most} lookups in flight at once: the window is 64`);
      // Without --batch the id is made now: no task can have <b>-<n> yet.
      asked = 0;
      const made = await ci(["batch", "submit", "--jsonl", "r.jsonl"], { cwd, url });
      assert.equal(made.code, 2, made.stderr);
      assert.match(made.stderr, new RegExp(`r\\.jsonl:300: task id 'used-${b}' is in use`));
      await nc.flush();
      assert.equal(asked, 1, "only the line's own taskId was looked up");
    } finally {
      requests.unsubscribe();
      answers.unsubscribe();
    }
    assert.equal(await batchLeft(client.jsm, b), 0, "nothing was published");
  });

  test("submit without --batch makes and prints an id; cancel publishes on ci.batches.<b>.cancel and status says so", async () => {
    const cwd = fresh("cancel");
    writeFileSync(join(cwd, "one.csv"), "a\n1\n");
    writeFileSync(join(cwd, "s.py"), "print(open('one.csv').read())\n");
    const r = await ci(["batch", "submit", "s.py", "--file-each", "*.csv"], { cwd, url });
    assert.equal(r.code, 0, r.stderr);
    const b = r.stdout.trim();
    assert.match(b, /^b-[0-9a-f]{16}$/);
    const c = await ci(["batch", "cancel", b], { url });
    assert.equal(c.code, 0, c.stderr);
    assert.equal(c.stdout, `batch ${b}: cancel published on ci.batches.${b}.cancel\n`);
    assert.match(c.stderr, /its 1 tasks not ended yet end cancelled \(1 queued are never run, 0 running are stopped\)/);
    const ev = await batchEvents(client, b, "cancel");
    assert.equal(ev.length, 1);
    assert.equal(ev[0].msgId, null);
    const human = await ci(["batch", "status", b], { url });
    assert.match(human.stdout, /^cancel: +requested/m);
    // The stand-in worker ends it cancelled, as a worker that finds the cancel does.
    const t = await worker.take(5000);
    assert.equal(t.taskId, `${b}-1`);
    await worker.taken(t);
    await worker.end(t, { status: "TASK_STATUS_CANCELLED", error: "the batch was cancelled" });
    assert.equal((await status(b)).stdout, '{"total":1,"queued":0,"running":0,"succeeded":0,"failed":0,"timed_out":0,"cancelled":1}\n');
  });

  test("ci stats shows the batch lane beside the interactive one", async () => {
    const cwd = fresh("stats");
    writeFileSync(join(cwd, "a.csv"), "a\n");
    writeFileSync(join(cwd, "b.csv"), "b\n");
    writeFileSync(join(cwd, "s.py"), "print(1)\n");
    const r = await ci(["batch", "submit", "s.py", "--file-each", "*.csv"], { cwd, url });
    assert.equal(r.code, 0, r.stderr);
    const s = await ci(["stats", "--json"], { url });
    assert.equal(s.code, 0, s.stderr);
    const j = JSON.parse(s.stdout);
    assert.equal(j.queue.stream, "CI_TASKS");
    assert.equal(j.batchQueue.stream, "CI_BATCH");
    assert.equal(j.batchQueue.consumer, "ci-workers-batch");
    assert.equal(j.batchQueue.pending, "2");
    const text = await ci(["stats"], { url });
    assert.match(text.stdout, /^batch queue: +2 waiting for a worker \(consumer ci-workers-batch; stream CI_BATCH holds 2\)/m);
    // Drain it for the tests after this one.
    for (const t of await takeAll(2)) await t.msg.ackAck();
  });

  test("wait on a terminal draws a progress bar in place, never wider than the terminal", async () => {
    const cwd = fresh("tty");
    writeFileSync(join(cwd, "a.csv"), "a\n");
    writeFileSync(join(cwd, "s.py"), "print(1)\n");
    const r = await ci(["batch", "submit", "s.py", "--file-each", "*.csv"], { cwd, url });
    const b = r.stdout.trim();
    const task = await worker.take(5000);
    await worker.taken(task);
    await worker.end(task, { status: "TASK_STATUS_SUCCEEDED" });
    // script(1) gives ci a terminal (-e passes its exit code on) whose
    // size it does not know (stdin is no terminal): ci takes $COLUMNS.
    const onTerminal = (columns) => new Promise((resolve) => {
      const child = spawn("script", ["-qec", `${CLI_BIN} batch wait ${b}`, "/dev/null"], {
        env: { ...process.env, CI_NATS_URL: url, COLUMNS: String(columns) }, stdio: ["ignore", "pipe", "pipe"],
      });
      let out = "";
      child.stdout.on("data", (d) => (out += d));
      child.on("close", (code) => resolve({ code, out }));
    });
    const w = await onTerminal(100);
    assert.equal(w.code, 0, w.out);
    assert.match(w.out, /\r\[#{10,40}\] 1\/1 ended \(1 ok, 0 not\), 0 running, 0 queued\x1b\[K/);
    assert.match(w.out, new RegExp(`batch ${b}: all 1 tasks succeeded`));
    // A narrow terminal: a line that wrapped could not be redrawn in place.
    // Each redraw ("\r" ... erase) fits in 29 columns: the bar goes first,
    // then the text is cut.
    for (const columns of [30, 57, 58]) {
      const n = await onTerminal(columns);
      assert.equal(n.code, 0, n.out);
      const redraws = [...n.out.matchAll(/\r([^\r\n]*)\x1b\[K/g)].map((m) => m[1]);
      assert.ok(redraws.length > 0, n.out);
      for (const line of redraws) assert.ok(line.length <= columns - 1, `${columns} columns: ${JSON.stringify(line)} is ${line.length} wide`);
      assert.equal(redraws.at(-1).startsWith("["), columns >= 58, `${columns}: ${redraws.at(-1)}`);
    }
  });

  test("wait rides out NATS not answering for a while (its request timed out): it asks again, then ends as usual", async () => {
    const cwd = fresh("hiccup");
    writeFileSync(join(cwd, "a.csv"), "a\n");
    writeFileSync(join(cwd, "s.py"), "print(1)\n");
    const r = await ci(["batch", "submit", "s.py", "--file-each", "*.csv"], { cwd, url });
    assert.equal(r.code, 0, r.stderr);
    const b = r.stdout.trim();
    let err = "";
    let exited = false;
    const waiting = ci(["batch", "wait", b], { url, timeoutMs: 120000, onStderr: (e) => (err = e) }).then((x) => {
      exited = true;
      return x;
    });
    await until("wait printed its first progress line", async () => /0\/1 ended/.test(err));
    // The server stops answering until wait's request (5 s) times out.
    assert.ok(stack.server.signal("SIGSTOP"));
    try {
      await until("wait saw a request time out", async () => exited || /asking again/.test(err), 60000);
    } finally {
      stack.server.signal("SIGCONT");
    }
    assert.ok(!exited, `wait gave up at the first timeout: ${err}`);
    assert.match(err, new RegExp(`batch ${b}: .*; asking again for up to 30 s`));
    const task = await worker.take(5000);
    await worker.taken(task);
    await worker.end(task, { status: "TASK_STATUS_SUCCEEDED" });
    const w = await waiting;
    assert.equal(w.code, 0, w.stderr);
    assert.match(w.stderr, /NATS answers again/);
    assert.equal(w.stdout, `batch ${b}: all 1 tasks succeeded\n`);
  });

  test("wait whose --wait-ms runs out while NATS does not answer exits 124 (timed out), not 3 (NATS failed)", async () => {
    const cwd = fresh("waitnats");
    writeFileSync(join(cwd, "a.csv"), "a\n");
    writeFileSync(join(cwd, "s.py"), "print(1)\n");
    const r = await ci(["batch", "submit", "s.py", "--file-each", "*.csv"], { cwd, url });
    assert.equal(r.code, 0, r.stderr);
    const b = r.stdout.trim();
    let err = "";
    const waiting = ci(["batch", "wait", b, "--wait-ms", "2500"], { url, timeoutMs: 60000, onStderr: (e) => (err = e) });
    await until("wait printed its first progress line", async () => /0\/1 ended/.test(err));
    // Its next request waits 5 s for an answer, past --wait-ms.
    assert.ok(stack.server.signal("SIGSTOP"));
    let w;
    try {
      w = await waiting;
    } finally {
      stack.server.signal("SIGCONT");
    }
    assert.equal(w.code, 124, w.stderr);
    assert.match(w.stderr, new RegExp(`batch ${b}: not every task ended within 2500 ms: 0/1 ended: .*\\(NATS has not answered for \\d+ s: `));
    const task = await worker.take(5000);
    await worker.taken(task);
    await worker.end(task, { status: "TASK_STATUS_SUCCEEDED" });
  });

  test("wait on a batch whose submission has not published anything yet waits for it (submit --batch B & wait B)", async () => {
    const cwd = fresh("appear");
    writeFileSync(join(cwd, "a.csv"), "a\n");
    writeFileSync(join(cwd, "s.py"), "print(1)\n");
    const b = "ba-" + Date.now().toString(36);
    let err = "";
    const waiting = ci(["batch", "wait", b, "--wait-ms", "30000"], { url, timeoutMs: 60000, onStderr: (e) => (err = e) });
    await until("wait said it waits for the batch", async () => /nothing of it is stored yet; waiting up to 30 s for its submission to publish it/.test(err));
    const r = await ci(["batch", "submit", "s.py", "--file-each", "*.csv", "--batch", b], { cwd, url });
    assert.equal(r.code, 0, r.stderr);
    const task = await worker.take(5000);
    await worker.taken(task);
    await worker.end(task, { status: "TASK_STATUS_SUCCEEDED" });
    const w = await waiting;
    assert.equal(w.code, 0, w.stderr);
    assert.equal(w.stdout, `batch ${b}: all 1 tasks succeeded\n`);
    // A batch that never comes: exit 2 once the bound (here --wait-ms) passed.
    const t0 = Date.now();
    const never = await ci(["batch", "wait", b + "-typo", "--wait-ms", "1500"], { url });
    assert.equal(never.code, 2, never.stderr);
    assert.match(never.stderr, new RegExp(`no batch '${b}-typo' \\(waited 1 s for it\\)`));
    assert.ok(Date.now() - t0 >= 1500);
  });

  // Last in this stack: it leaves 200,000 messages in CI_BATCHES.
  test("results reads every end event however many other events come first (200,020 cancels before them)", async () => {
    const cwd = fresh("many");
    const b = "bm-" + Date.now().toString(36);
    writeFileSync(join(cwd, "r.jsonl"), [1, 2].map((n) => JSON.stringify({ language: "python", code: `print(${n})` })).join("\n") + "\n");
    const r = await ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", b], { cwd, url });
    assert.equal(r.code, 0, r.stderr);
    // More events than the read once stopped at (2 x 100,000 + 16, a
    // guess of taken + ended): cancels are kept however many come. Core
    // publishes, which the stream stores; flushed, then counted.
    const N = 200020;
    const subj = `${BATCHES_PREFIX}.${b}.cancel`;
    for (let i = 0; i < N; i++) {
      client.nc.publish(subj);
      if (i % 10000 === 9999) await client.nc.flush();
    }
    await client.nc.flush();
    await until("the cancels are stored", async () => (await batchSubjectCounts(client.jsm, b)).cancel === N, 120000);
    for (const t of await takeAll(2)) {
      await worker.taken(t);
      await worker.end(t, { status: "TASK_STATUS_CANCELLED", error: "the batch was cancelled" });
    }
    const res = await ci(["batch", "results", b, "--jsonl"], { url, timeoutMs: 300000 });
    assert.equal(res.code, 0, res.stderr);
    const lines = res.stdout.split("\n").filter(Boolean).map((l) => JSON.parse(l));
    assert.deepEqual(lines.map((l) => l.taskId), [`${b}-1`, `${b}-2`]);
    assert.doesNotMatch(res.stderr, /cut/);

    // An end event that expires (here: is deleted; the oldest go first)
    // after results counted the ended tasks and before its read reached it
    // (behind the 200,020 cancels) is not read and not counted after the
    // read: the results are not cut.
    const first = await client.jsm.direct.getMessage(BATCHES_STREAM, { next_by_subj: `${BATCHES_PREFIX}.${b}.cancelled`, seq: 1 });
    const consumers = async () => (await client.jsm.consumers.list(BATCHES_STREAM).next()).map((c) => c.name);
    const earlier = new Set(await consumers());
    const reading = ci(["batch", "results", b, "--jsonl"], { url, timeoutMs: 300000 });
    await until("results began to read the events", async () => (await consumers()).some((n) => !earlier.has(n)), 60000);
    await client.jsm.streams.deleteMessage(BATCHES_STREAM, first.seq);
    const less = await reading;
    assert.equal(less.code, 0, less.stderr);
    assert.deepEqual(less.stdout.split("\n").filter(Boolean).map((l) => JSON.parse(l).taskId), [`${b}-2`], "the read was under way when the event went");
    assert.doesNotMatch(less.stderr, /cut/);
  });
});

describe("ci batch submit against a server that takes messages of at most 64 KiB", () => {
  const MAX = 65536;
  let server, client, url, dir;
  before(async () => {
    assert.ok(existsSync(CLI_BIN), `${CLI_BIN} is built`);
    server = await startNatsServer({ config: `max_payload: ${MAX}` });
    url = server.url;
    client = await connectClient(url);
    // What ci binds to and the batch lane, made here: a worker, which would
    // make them, takes seconds to start, and none needs to run.
    await new Kvm(client.js).create(RESULTS_BUCKET);
    await new Objm(client.js).create(FILES_BUCKET);
    await client.jsm.streams.add({ name: BATCH_STREAM, subjects: [`${BATCH_PREFIX}.*`], retention: "workqueue", duplicate_window: 3600 * 1e9 });
    await client.jsm.streams.add({ name: BATCHES_STREAM, subjects: [`${BATCHES_PREFIX}.>`] });
    dir = mkdtempSync(join(tmpdir(), "ci-batch-small-"));
    writeFileSync(join(dir, "s.py"), "print(1)\n");
  });
  after(async () => {
    await client?.close().catch(() => {});
    await server?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  // Every batch id here has 2 characters: a task's id, in each message, is
  // as long in all of them, and the sizes add up. Each gets its own folder.
  let nth = 0;
  const batchId = () => `m${nth++}`;
  const folder = (files) => {
    const cwd = mkdtempSync(join(dir, "in-"));
    for (const [name, size] of Object.entries(files)) writeFileSync(join(cwd, name), "x".repeat(size));
    return cwd;
  };
  const submitEach = (files) => ci(["batch", "submit", join(dir, "s.py"), "--file-each", "*.csv", "--batch", batchId()], { cwd: folder(files), url });
  // The message of a task with one file of n bytes inline, as ci measures it
  // (from its refusal of a file of MAX bytes): n plus what the rest takes.
  let rest;
  const messageOf = (n) => n + rest;

  test("--file-each: the largest message is checked against max_payload, headers included", async () => {
    const probe = await submitEach({ "a.csv": MAX });
    assert.equal(probe.code, 2, probe.stderr);
    const m = probe.stderr.match(/the task for 'a\.csv' would be a message of (\d+) bytes; the server takes messages of at most 65536 bytes \(headers included\)/);
    assert.ok(m, probe.stderr);
    rest = Number(m[1]) - MAX;
    // Under max_payload, but not with the headers (256 bytes kept for them).
    const close = await submitEach({ "a.csv": MAX - 100 - rest });
    assert.equal(close.code, 2, close.stderr);
    assert.match(close.stderr, new RegExp(`would be a message of ${MAX - 100} bytes; .*\\(headers included\\).*nothing was submitted`));
    const fits = await submitEach({ "a.csv": MAX - 256 - rest });
    assert.equal(fits.code, 0, fits.stderr);
    assert.match(fits.stderr, /1 tasks: 1 submitted; sealed/);
  });

  test("--file-each: of files sent inline, the one making the largest message is checked, its name counted", async () => {
    // The same size, a name 123 characters longer: its message is the
    // larger, and only it goes over (a check by size alone took a.csv).
    const size = MAX - 256 - rest - 50;
    const long = "x".repeat(124) + ".csv";
    const r = await submitEach({ "a.csv": size, [long]: size });
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, new RegExp(`the task for '${long}' would be a message of ${messageOf(size) + 124} bytes`));
    assert.doesNotMatch(r.stderr, /went out before this/);
  });

  test("--jsonl: a request is checked against max_payload, headers included", async () => {
    const cwd = mkdtempSync(join(dir, "jsonl-"));
    const line = (n) => JSON.stringify({ language: "python", code: "#" + "x".repeat(n - 1) });
    const submitLine = (n) => {
      writeFileSync(join(cwd, "r.jsonl"), line(n) + "\n");
      return ci(["batch", "submit", "--jsonl", "r.jsonl", "--batch", batchId()], { cwd, url });
    };
    const probe = await submitLine(MAX);
    assert.equal(probe.code, 2, probe.stderr);
    const m = probe.stderr.match(/r\.jsonl:1: the request is (\d+) bytes; the server takes messages of at most 65536 bytes \(headers included\)/);
    assert.ok(m, probe.stderr);
    const extra = Number(m[1]) - MAX;
    const close = await submitLine(MAX - 100 - extra);
    assert.equal(close.code, 2, close.stderr);
    assert.match(close.stderr, new RegExp(`r\\.jsonl:1: the request is ${MAX - 100} bytes; .*\\(headers included\\)`));
    const fits = await submitLine(MAX - 256 - extra);
    assert.equal(fits.code, 0, fits.stderr);
  });
});

describe("ci batch before any worker made the batch lane", () => {
  let stack, url;
  before(async () => {
    // What a worker that predates batches leaves: its streams and buckets,
    // without the batch lane's.
    stack = await stackWithoutWorker();
    url = stack.server.url;
    await stack.client.jsm.streams.delete(BATCH_STREAM);
    await stack.client.jsm.streams.delete(BATCHES_STREAM);
  });
  after(async () => {
    await stack?.stop();
  });

  test("status, submit and cancel exit 3 naming the missing stream; ci stats says the lane is not there", async () => {
    const cwd = mkdtempSync(join(tmpdir(), "ci-batch-nolane-"));
    try {
      writeFileSync(join(cwd, "a.csv"), "a\n");
      writeFileSync(join(cwd, "s.py"), "print(1)\n");
      for (const args of [["batch", "status", "b1"], ["batch", "submit", "s.py", "--file-each", "*.csv"], ["batch", "cancel", "b1"], ["batch", "results", "b1", "--jsonl"]]) {
        const r = await ci(args, { cwd, url });
        assert.equal(r.code, 3, `${args}: ${r.stderr}`);
        assert.match(r.stderr, /stream CI_BATCHES not found: no worker that serves batches has run/);
      }
      const s = await ci(["stats", "--json"], { url });
      assert.equal(s.code, 0, s.stderr);
      assert.equal(JSON.parse(s.stdout).batchQueue, null);
      const t = await ci(["stats"], { url });
      assert.match(t.stdout, /^batch queue: +none \(no consumer ci-workers-batch on stream CI_BATCH/m);
    } finally {
      rmSync(cwd, { recursive: true, force: true });
    }
  });
});

// A TCP proxy in front of the server that the test can cut: connections
// are then refused (counted), as by a server that is down.
async function cuttableProxy(port) {
  const sockets = new Set();
  const p = { refusing: false, refused: 0 };
  const server = createServer((client) => {
    if (p.refusing) {
      p.refused++;
      return client.destroy();
    }
    const upstream = tcpConnect(port, "127.0.0.1");
    for (const s of [client, upstream]) {
      sockets.add(s);
      s.on("close", () => sockets.delete(s));
      s.on("error", () => {});
    }
    client.pipe(upstream);
    upstream.pipe(client);
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  p.url = `nats://127.0.0.1:${server.address().port}`;
  p.cut = () => {
    p.refusing = true;
    for (const s of sockets) s.destroy();
  };
  p.restore = () => (p.refusing = false);
  p.close = () => {
    p.cut();
    server.close();
  };
  return p;
}

describe("ci batch wait when NATS goes away", () => {
  let stack, url, worker, dir;
  before(async () => {
    stack = await stackWithoutWorker();
    url = stack.server.url;
    worker = fakeBatchWorker(stack.client);
    dir = mkdtempSync(join(tmpdir(), "ci-batch-gone-"));
    writeFileSync(join(dir, "a.csv"), "a\n");
    writeFileSync(join(dir, "s.py"), "print(1)\n");
  });
  after(async () => {
    await stack?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test("wait rides out NATS refusing connections for longer than a client's five reconnects: its connection goes on trying for --retry-ms", async () => {
    const proxy = await cuttableProxy(stack.server.port);
    try {
      const b = "bo-" + Date.now().toString(36);
      let err = "";
      const waiting = ci(["batch", "wait", b, "--retry-ms", "60000"], { url: proxy.url, timeoutMs: 120000, onStderr: (e) => (err = e) });
      // The default bound for a batch whose submission has not published
      // anything yet (no --wait-ms given).
      await until("wait said it waits for the batch", async () => /nothing of it is stored yet; waiting up to 60 s for its submission to publish it/.test(err));
      const r = await ci(["batch", "submit", "s.py", "--file-each", "*.csv", "--batch", b], { cwd: dir, url });
      assert.equal(r.code, 0, r.stderr);
      await until("wait printed its first progress line", async () => /0\/1 ended/.test(err));
      // NATS goes away until wait's connection has tried more than the five
      // times a ci connection tries elsewhere (nats.c would close it then,
      // and no later question could be answered).
      proxy.cut();
      await until("wait's connection tried again 7 times", async () => proxy.refused >= 7, 60000);
      assert.match(err, new RegExp(`batch ${b}: .*; asking again for up to 60 s\n`));
      proxy.restore();
      const task = await worker.take(5000);
      await worker.taken(task);
      await worker.end(task, { status: "TASK_STATUS_SUCCEEDED" });
      const w = await waiting;
      assert.equal(w.code, 0, w.stderr);
      assert.match(w.stderr, /NATS answers again/);
      assert.equal(w.stdout, `batch ${b}: all 1 tasks succeeded\n`);
    } finally {
      proxy.close();
    }
  });

  test("wait whose NATS stays away gives up after --retry-ms with exit 3, saying so", async () => {
    const proxy = await cuttableProxy(stack.server.port);
    try {
      const r = await ci(["batch", "submit", "s.py", "--file-each", "*.csv"], { cwd: dir, url });
      assert.equal(r.code, 0, r.stderr);
      const b = r.stdout.trim();
      let err = "";
      const waiting = ci(["batch", "wait", b, "--retry-ms", "8000"], { url: proxy.url, timeoutMs: 120000, onStderr: (e) => (err = e) });
      await until("wait printed its first progress line", async () => /0\/1 ended/.test(err));
      const t0 = Date.now();
      proxy.cut();
      const w = await waiting;
      const took = Date.now() - t0;
      assert.equal(w.code, 3, w.stderr);
      assert.equal(w.stdout, "");
      assert.match(w.stderr, new RegExp(`batch ${b}: .*; asking again for up to 8 s\n`));
      assert.match(w.stderr, new RegExp(`batch ${b}: .* \\(no answer for \\d+ s, --retry-ms 8000: giving up\\)\n$`));
      const [, said] = w.stderr.match(/no answer for (\d+) s/);
      assert.ok(Number(said) >= 8, `gave up after ${said} s without an answer, before --retry-ms`);
      // The window after the last answer (less than a poll before the cut)
      // and at most one request's 5 s wait: not the default 30 s.
      assert.ok(took < 25000, `exit ${took} ms after NATS went away`);
      assert.ok(proxy.refused >= 1, "its connection tried again");
    } finally {
      proxy.close();
    }
  });
});
