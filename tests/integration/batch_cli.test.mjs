// ===========================================================================
// NEEDS THE WORKER'S BATCH LANE. This file runs `ci batch` end to end
// against a real ci-worker: it passes only once the worker serves batches
// (contract §20, §21: it makes CI_BATCH, CI_BATCHES and the consumer
// ci-workers-batch at start, takes batch tasks, publishes taken, the end
// events and complete, and honours a batch's cancel), that is once the
// worker's branch (batch-worker) is merged. Until then it fails in before()
// saying so. It is registered in tests/CMakeLists.txt by its own commit,
// "register batch_cli (needs the worker's batch lane)", to be merged after
// the worker's branch. The same commands against a stand-in worker that
// the test plays itself: batch_events.test.mjs.
// ===========================================================================
//
// 20 CSV files, one task each through `ci batch submit --file-each`, two
// of which raise; status, wait, results, a second submission that runs
// nothing twice, cancel, and ci stats' batch lane.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { startStack } from "./lib/stack.mjs";
import { CLI_BIN } from "./lib/worker.mjs";
import { decodeMessage, normalize, proto } from "./lib/client.mjs";
import { BATCH_CONSUMER, BATCH_STREAM, BATCHES_STREAM, batchEvents, batchSubjectCounts, ci, until } from "./lib/batch.mjs";

const ENDED = ["succeeded", "failed", "timed_out", "cancelled"];
const KEYS = ["total", "queued", "running", "succeeded", "failed", "timed_out", "cancelled"];

describe("ci batch against a worker", () => {
  let stack, url, dir, client;
  before(async () => {
    assert.ok(existsSync(CLI_BIN), `${CLI_BIN} is built`);
    stack = await startStack({ workers: 1, worker: { concurrency: 2 } });
    url = stack.server.url;
    client = stack.client;
    dir = mkdtempSync(join(tmpdir(), "ci-batch-cli-"));
    for (const [what, f] of [
      [`stream ${BATCH_STREAM}`, () => client.jsm.streams.info(BATCH_STREAM)],
      [`stream ${BATCHES_STREAM}`, () => client.jsm.streams.info(BATCHES_STREAM)],
      [`consumer ${BATCH_CONSUMER}`, () => client.jsm.consumers.info(BATCH_STREAM, BATCH_CONSUMER)],
    ]) {
      await f().catch(() => {
        throw new Error(`the worker made no ${what}: this test needs the worker's batch lane (contract §21), from the batch-worker branch`);
      });
    }
  });
  after(async () => {
    await stack?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const statusJson = async (b) => {
    const r = await ci(["batch", "status", b, "--json"], { url });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^\{"total":\d+,"queued":\d+,"running":\d+,"succeeded":\d+,"failed":\d+,"timed_out":\d+,"cancelled":\d+\}\n$/);
    const j = JSON.parse(r.stdout);
    assert.deepEqual(Object.keys(j), KEYS);
    return j;
  };

  const batch = "e2e-" + Date.now().toString(36);
  const cwd = () => join(dir, "csv");
  const BAD = new Set([7, 13]); // their CSV lacks the column: KeyError
  const submitArgs = ["batch", "submit", "sum.py", "--file-each", "in/data-*.csv", "--batch", batch, "--label", "job=e2e"];

  test("submit 20 CSVs with --file-each: the batch id on stdout, all 20 published and sealed", async () => {
    mkdirSync(join(cwd(), "in"), { recursive: true });
    for (let n = 1; n <= 20; n++) {
      const name = `data-${String(n).padStart(2, "0")}.csv`;
      const col = BAD.has(n) ? "value" : "amount";
      writeFileSync(join(cwd(), "in", name), `region,${col}\nnorth,${n}\nsouth,${2 * n}\n`);
    }
    writeFileSync(
      join(cwd(), "sum.py"),
      ["import csv, glob", "name = glob.glob('*.csv')[0]", "rows = list(csv.DictReader(open(name)))", "print(name, sum(int(r['amount']) for r in rows))"].join("\n") + "\n",
    );
    const r = await ci(submitArgs, { cwd: cwd(), url });
    assert.equal(r.code, 0, r.stderr);
    assert.equal(r.stdout, `${batch}\n`);
    assert.match(r.stderr, new RegExp(`batch ${batch}: 20 tasks: 20 submitted; sealed`));
    const j = await statusJson(batch);
    assert.equal(j.total, 20);
    assert.equal(j.queued + j.running + j.succeeded + j.failed + j.timed_out + j.cancelled, 20, JSON.stringify(j));
  });

  test("wait exits 1 with the two failures grouped by their error; status --json is exact; one complete event", async () => {
    const w = await ci(["batch", "wait", batch, "--wait-ms", "240000"], { url, timeoutMs: 250000 });
    assert.equal(w.code, 1, `${w.stdout}\n${w.stderr}`);
    const lines = w.stdout.split("\n");
    assert.equal(lines[0], `batch ${batch}: 18 of 20 tasks succeeded; 2 failed, 0 timed out, 0 cancelled`);
    assert.equal(lines[1], "  2 failed: KeyError: 'amount'");
    const ids = lines[2].replace(/^ {4}tasks /, "").split(", ").sort();
    assert.deepEqual(ids, [`${batch}-13`, `${batch}-7`]);
    assert.deepEqual(await statusJson(batch), { total: 20, queued: 0, running: 0, succeeded: 18, failed: 2, timed_out: 0, cancelled: 0 });
    const complete = await batchEvents(client, batch, "complete");
    assert.equal(complete.length, 1);
    assert.deepEqual(JSON.parse(complete[0].data), { batchId: batch, total: "20", succeeded: "18", failed: "2", timedOut: "0", cancelled: "0" });
  });

  test("results --jsonl: 20 lines in the order the tasks ended, each equal to its record in ci-results", async () => {
    const r = await ci(["batch", "results", batch, "--jsonl"], { url });
    assert.equal(r.code, 0, r.stderr);
    const lines = r.stdout.trimEnd().split("\n").map((l) => JSON.parse(l));
    assert.equal(lines.length, 20);
    const ends = (await batchEvents(client, batch)).filter((e) => ENDED.includes(e.event)).map((e) => JSON.parse(e.data).taskId);
    assert.deepEqual(lines.map((l) => l.taskId), ends);
    const { ExecutionResult } = proto();
    const kv = await client.kvBucket();
    for (const line of lines) {
      const stored = await kv.get(line.taskId);
      assert.ok(stored, `${line.taskId} has a record`);
      assert.deepEqual(normalize(ExecutionResult, line), decodeMessage(ExecutionResult, stored.value).value, line.taskId);
      assert.equal(line.batchId, batch);
      assert.deepEqual(line.labels, { job: "e2e" });
      // Task n got the n-th file in sorted order.
      const n = Number(line.taskId.slice(batch.length + 1));
      const name = `data-${String(n).padStart(2, "0")}.csv`;
      if (BAD.has(n)) {
        assert.equal(line.status, "TASK_STATUS_FAILED");
        assert.equal(line.error, "KeyError: 'amount'");
      } else {
        assert.equal(line.status, "TASK_STATUS_SUCCEEDED", line.error);
        assert.equal(line.stdout, `${name} ${3 * n}\n`);
      }
    }
  });

  test("the same submit again runs nothing twice", async () => {
    const kv = await client.kvBucket();
    const revisions = {};
    for (let n = 1; n <= 20; n++) revisions[n] = (await kv.get(`${batch}-${n}`)).revision;
    const lastSeq = (await client.jsm.streams.info(BATCH_STREAM)).state.last_seq;
    const taken = (await batchSubjectCounts(client.jsm, batch)).taken;
    const r = await ci(submitArgs, { cwd: cwd(), url });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /20 tasks: 0 submitted, 20 skipped \(taken by a worker already, or their result is terminal\); sealed already/);
    assert.equal((await client.jsm.streams.info(BATCH_STREAM)).state.last_seq, lastSeq, "nothing new in CI_BATCH");
    // A task that went out again would be taken again and rewrite its record.
    const c = await batchSubjectCounts(client.jsm, batch);
    assert.equal(c.taken, taken);
    assert.equal(c.complete, 1);
    for (let n = 1; n <= 20; n++) assert.equal((await kv.get(`${batch}-${n}`)).revision, revisions[n], `${batch}-${n} untouched`);
    assert.deepEqual(await statusJson(batch), { total: 20, queued: 0, running: 0, succeeded: 18, failed: 2, timed_out: 0, cancelled: 0 });
    // Later, when the results and the queue's dedup window are gone (1 h),
    // the batch's taken events (24 h) still say every task went out: the
    // results are deleted here as their expiry would.
    for (let n = 1; n <= 20; n++) await kv.purge(`${batch}-${n}`);
    const late = await ci(submitArgs, { cwd: cwd(), url });
    assert.equal(late.code, 0, late.stderr);
    assert.match(late.stderr, /20 tasks: 0 submitted, 20 skipped/);
    assert.doesNotMatch(late.stderr, /queued already/, "nothing was published (the dedup window would hide it only for 1 h)");
    assert.equal((await client.jsm.streams.info(BATCH_STREAM)).state.last_seq, lastSeq);
  });

  test("cancel: the running tasks are stopped, the queued never run; wait exits 1 saying they were cancelled", async () => {
    const c = join(dir, "cancel");
    mkdirSync(c);
    for (let n = 1; n <= 6; n++) writeFileSync(join(c, `x${n}.csv`), "a\n1\n");
    writeFileSync(join(c, "slow.py"), "import time\ntime.sleep(50)\nprint('not cancelled')\n");
    const b = "cx-" + Date.now().toString(36);
    const r = await ci(["batch", "submit", "slow.py", "--file-each", "*.csv", "--batch", b], { cwd: c, url });
    assert.equal(r.code, 0, r.stderr);
    // Both slots busy with a task of the batch.
    await until("two tasks of the batch run", async () => (await statusJson(b)).running === 2, 60000);
    const x = await ci(["batch", "cancel", b], { url });
    assert.equal(x.code, 0, x.stderr);
    assert.match(x.stdout, new RegExp(`^batch ${b}: cancel published on ci.batches.${b}.cancel$`, "m"));
    const w = await ci(["batch", "wait", b, "--wait-ms", "40000"], { url, timeoutMs: 45000 });
    assert.equal(w.code, 1, `${w.stdout}\n${w.stderr}`);
    assert.match(w.stdout, new RegExp(`^batch ${b}: 0 of 6 tasks succeeded; 0 failed, 0 timed out, 6 cancelled$`, "m"));
    assert.deepEqual(await statusJson(b), { total: 6, queued: 0, running: 0, succeeded: 0, failed: 0, timed_out: 0, cancelled: 6 });
    const res = await ci(["batch", "results", b, "--jsonl"], { url });
    const lines = res.stdout.trimEnd().split("\n").map((l) => JSON.parse(l));
    assert.equal(lines.length, 6);
    for (const l of lines) {
      assert.equal(l.status, "TASK_STATUS_CANCELLED");
      assert.ok(!(l.stdout ?? "").includes("not cancelled"), l.taskId);
    }
    // Two were running (killed: exit code 137), four never ran.
    assert.equal(lines.filter((l) => l.exitCode === 137).length, 2, JSON.stringify(lines.map((l) => [l.taskId, l.exitCode, l.error])));
    assert.equal(lines.filter((l) => l.exitCode === undefined).length, 4);
  });

  test("ci stats shows the batch lane", async () => {
    const s = await ci(["stats", "--json"], { url });
    assert.equal(s.code, 0, s.stderr);
    const j = JSON.parse(s.stdout);
    assert.equal(j.batchQueue.stream, BATCH_STREAM);
    assert.equal(j.batchQueue.consumer, BATCH_CONSUMER);
    assert.equal(j.batchQueue.pending, "0");
    const t = await ci(["stats"], { url });
    assert.match(t.stdout, /^batch queue: +0 waiting for a worker \(consumer ci-workers-batch; stream CI_BATCH holds 0\)/m);
  });
});
