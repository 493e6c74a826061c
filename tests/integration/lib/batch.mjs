// Batches (docs/contract.md §20, §21) for the tests of `ci batch`: the
// `ci` runner, reads of the batch lane's streams (which a real worker
// makes), and a stand-in worker that takes batch tasks and ends them the way §20 says a
// worker does (taken, the terminal record, the end event, the ack, then
// complete when the counts say so), with outcomes the test chooses.
//
//   const w = fakeBatchWorker(client);
//   const t = await w.take();                 // one task of CI_BATCH: { taskId, batchId, request, ... }
//   await w.taken(t);                         // ci.batches.<b>.taken
//   await w.end(t, { status: "TASK_STATUS_FAILED", error: "boom" });
//   const ev = await batchEvents(client, b);  // every message on ci.batches.<b>.*
import { spawn } from "node:child_process";
import { headers as natsHeaders } from "@nats-io/transport-node";
import { AckPolicy, DeliverPolicy } from "@nats-io/jetstream";

import { CLI_BIN } from "./worker.mjs";
import { decodeMessage, proto } from "./client.mjs";

export const BATCH_STREAM = "CI_BATCH";
export const BATCH_PREFIX = "ci.batch";
export const BATCHES_STREAM = "CI_BATCHES";
export const BATCHES_PREFIX = "ci.batches";
export const BATCH_CONSUMER = "ci-workers-batch";
export const SHORT = {
  TASK_STATUS_SUCCEEDED: "succeeded",
  TASK_STATUS_FAILED: "failed",
  TASK_STATUS_TIMED_OUT: "timed_out",
  TASK_STATUS_CANCELLED: "cancelled",
};

const NS = 1_000_000_000;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// Runs `ci args...` in cwd with CI_NATS_URL; resolves { code, signal,
// stdout, stderr }. Killed after timeoutMs. stdin: a string to write;
// onStderr(textSoFar): called as standard error grows.
export function ci(args, { cwd, url, timeoutMs = 60000, stdin, onStderr } = {}) {
  return new Promise((resolve, reject) => {
    const env = { ...process.env, CI_NATS_URL: url };
    const child = spawn(CLI_BIN, args, { cwd, env, stdio: [stdin === undefined ? "ignore" : "pipe", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => (stdout += d));
    child.stderr.on("data", (d) => {
      stderr += d;
      if (onStderr) onStderr(stderr);
    });
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
    if (stdin !== undefined) child.stdin.end(stdin);
  });
}

// Message counts per subject of CI_BATCHES for batch b: { taken: 3, ... }.
export async function batchSubjectCounts(jsm, b) {
  const si = await jsm.streams.info(BATCHES_STREAM, { subjects_filter: `${BATCHES_PREFIX}.${b}.*` });
  const out = {};
  for (const [subj, n] of Object.entries(si.state.subjects ?? {})) out[subj.slice(`${BATCHES_PREFIX}.${b}.`.length)] = n;
  return out;
}

// How many tasks of batch b wait in CI_BATCH.
export async function batchLeft(jsm, b) {
  const si = await jsm.streams.info(BATCH_STREAM, { subjects_filter: `${BATCH_PREFIX}.${b}` });
  return Object.values(si.state.subjects ?? {}).reduce((a, n) => a + n, 0);
}

// Every message on ci.batches.<b>.* (or one event's subject), in stream
// order: { subject, event, seq, msgId, data (string) }.
export async function batchEvents(client, b, event = "*") {
  const { jsm, js } = client;
  const filter = `${BATCHES_PREFIX}.${b}.${event}`;
  const si = await jsm.streams.info(BATCHES_STREAM, { subjects_filter: filter });
  const total = Object.values(si.state.subjects ?? {}).reduce((a, n) => a + n, 0);
  const out = [];
  if (total === 0) return out;
  const ci = await jsm.consumers.add(BATCHES_STREAM, {
    filter_subject: filter,
    ack_policy: AckPolicy.None,
    deliver_policy: DeliverPolicy.All,
    inactive_threshold: 60 * NS,
  });
  try {
    const consumer = await js.consumers.get(BATCHES_STREAM, ci.name);
    while (out.length < total) {
      const m = await consumer.next({ expires: 5000 });
      if (!m) throw new Error(`batchEvents ${filter}: ${out.length} of ${total} messages came`);
      out.push({
        subject: m.subject,
        event: m.subject.split(".").pop(),
        seq: m.seq,
        msgId: m.headers?.get("Nats-Msg-Id") || null,
        data: Buffer.from(m.data).toString("utf8"),
      });
    }
  } finally {
    await jsm.consumers.delete(BATCHES_STREAM, ci.name).catch(() => {});
  }
  return out;
}

// Polls cond() (async) every 50 ms until it is truthy; returns its value.
export async function until(what, cond, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await cond();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`not within ${timeoutMs} ms: ${what}`);
    await sleep(50);
  }
}

// A stand-in for a worker of the batch lane: it takes tasks from
// ci-workers-batch and ends them as the test says, publishing what
// contract §20 makes a worker publish, in the same order.
export function fakeBatchWorker(client, { id = "fake-worker" } = {}) {
  const { js, jsm } = client;
  const { ExecutionRequest, ExecutionResult } = proto();
  const publish = (subject, data, msgId, contentType) => {
    const h = natsHeaders();
    if (contentType) h.set("Content-Type", contentType);
    return js.publish(subject, typeof data === "string" ? Buffer.from(data) : data, { headers: h, msgID: msgId, timeout: 10000 });
  };
  return {
    // The next task, or null when none came within expiresMs.
    async take(expiresMs = 2000) {
      const consumer = await js.consumers.get(BATCH_STREAM, BATCH_CONSUMER);
      const m = await consumer.next({ expires: expiresMs });
      if (!m) return null;
      const ct = m.headers?.get("Content-Type") || "";
      const json = ct.startsWith("application/json");
      const d = decodeMessage(ExecutionRequest, m.data, json ? "json" : "protobuf");
      return {
        msg: m,
        subject: m.subject,
        msgId: m.headers?.get("Nats-Msg-Id") || null,
        contentType: ct,
        json,
        request: d.value,
        raw: d.raw,
        taskId: d.value.taskId,
        batchId: d.value.batchId,
      };
    },
    async taken(t) {
      return publish(`${BATCHES_PREFIX}.${t.batchId}.taken`, t.taskId, `${t.taskId}.taken`);
    },
    // The terminal record (in the request's encoding, as a worker writes
    // it), the end event, the ack (ack: false leaves it to the caller, as a
    // worker between its end event and its ack), and complete when the
    // batch is done. Returns the record as canonical JSON (an object).
    async end(t, { status = "TASK_STATUS_SUCCEEDED", error = "", stdout = "", exitCode, complete = true, ack = true } = {}) {
      const rec = { taskId: t.taskId, status, worker: id, attempt: 1, startedAtMs: "1700000000000", finishedAtMs: "1700000001000", runtime: "python-data-analysis-v1", batchId: t.batchId };
      if (stdout) rec.stdout = stdout;
      if (error) rec.error = error;
      if (exitCode !== undefined) rec.exitCode = exitCode;
      if (Object.keys(t.request.labels ?? {}).length) rec.labels = t.request.labels;
      const bytes = t.json ? Buffer.from(JSON.stringify(rec)) : ExecutionResult.encode(ExecutionResult.fromObject(rec)).finish();
      const kv = await client.kvBucket();
      await kv.put(t.taskId, bytes);
      const body = { taskId: t.taskId, status };
      if (error) body.error = error.slice(0, 256);
      await publish(`${BATCHES_PREFIX}.${t.batchId}.${SHORT[status]}`, JSON.stringify(body), `${t.taskId}.end`, "application/json");
      if (ack) await t.msg.ackAck();
      if (complete) await this.completeIfDone(t.batchId);
      return rec;
    },
    // As a worker does after each end event (contract §20 "Complete").
    async completeIfDone(b) {
      const n = await batchSubjectCounts(jsm, b);
      if (!n.sealed) return false;
      const m = await jsm.direct.getMessage(BATCHES_STREAM, { last_by_subj: `${BATCHES_PREFIX}.${b}.sealed` });
      const total = Number(JSON.parse(Buffer.from(m.data).toString()).total);
      const ended = (n.succeeded ?? 0) + (n.failed ?? 0) + (n.timed_out ?? 0) + (n.cancelled ?? 0);
      if (ended < total) return false;
      const body = { batchId: b, total: String(total), succeeded: String(n.succeeded ?? 0), failed: String(n.failed ?? 0), timedOut: String(n.timed_out ?? 0), cancelled: String(n.cancelled ?? 0) };
      await publish(`${BATCHES_PREFIX}.${b}.complete`, JSON.stringify(body), `${b}.complete`, "application/json");
      return true;
    },
  };
}
