// A client of the code-interpreter service, written the way an outside agent
// would write one: the official nats.js v3 packages and the project's .proto
// loaded at run time with protobufjs (so the schema itself is under test).
//
//   const c = await connectClient(srv.url);
//   const ack = await c.submit({ taskId, language: "python", code: "print(1)" });
//   const { result, encoding, raw } = await c.waitResult(taskId);
//   const evs = await c.events(taskId);            // RUNNING ... terminal
//   const bytes = await c.getObject(result.artifacts[0].object);
//   await c.close();
//
// Requests are plain objects in the proto3 JSON shape (lowerCamelCase names,
// InputFile.content as a Buffer/Uint8Array or base64 string). Results and
// events come back "normalized": every field present with its default,
// enums as names, 64-bit integers as Numbers, a oneof member (exitCode) only
// when it is set. `raw` is what was on the wire, decoded but untouched, so a
// test can check the exact JSON mapping.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { connect, headers as natsHeaders } from "@nats-io/transport-node";
import { jetstream, jetstreamManager, AckPolicy, DeliverPolicy } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { Objm } from "@nats-io/obj";
import protobuf from "protobufjs";

import { SOURCE_DIR } from "./worker.mjs";

export const SUBMIT_SUBJECT = "ci.submit";
export const STATUS_STREAM = "CI_STATUS";
export const STATUS_PREFIX = "ci.status";
export const OUTPUT_STREAM = "CI_OUTPUT";
export const OUTPUT_PREFIX = "ci.out";
export const CANCEL_PREFIX = "ci.cancel";
export const RESULTS_BUCKET = "ci-results";
export const FILES_BUCKET = "ci-files";
export const SESSIONS_BUCKET = "ci-sessions";
export const RUNTIME = "python-data-analysis-v1";
export const TERMINAL = new Set([
  "TASK_STATUS_SUCCEEDED",
  "TASK_STATUS_FAILED",
  "TASK_STATUS_TIMED_OUT",
  "TASK_STATUS_CANCELLED",
]);
// Ci-Status header values of the contract.
export const SHORT_STATUS = {
  TASK_STATUS_RUNNING: "running",
  TASK_STATUS_SUCCEEDED: "succeeded",
  TASK_STATUS_FAILED: "failed",
  TASK_STATUS_TIMED_OUT: "timed_out",
  TASK_STATUS_CANCELLED: "cancelled",
};

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export const PROTO_PATH = join(SOURCE_DIR, "schemas/ci/v1/ci.proto");
let rootCache = null;
export function proto() {
  if (!rootCache) rootCache = protobuf.loadSync(PROTO_PATH);
  return {
    root: rootCache,
    ExecutionRequest: rootCache.lookupType("ci.v1.ExecutionRequest"),
    ExecutionResult: rootCache.lookupType("ci.v1.ExecutionResult"),
    StatusEvent: rootCache.lookupType("ci.v1.StatusEvent"),
  };
}

let idSerial = 0;
// A fresh task id: prefix + time + counter + random, within [A-Za-z0-9_-]{1,64}.
export function newTaskId(prefix = "t") {
  const rnd = Math.random().toString(36).slice(2, 8);
  return `${prefix}-${Date.now().toString(36)}-${++idSerial}-${rnd}`.replace(/[^A-Za-z0-9_-]/g, "_").slice(0, 64);
}

const LONG_TYPES = new Set(["int64", "uint64", "sint64", "fixed64", "sfixed64"]);

function toSnake(s) {
  return s.replace(/[A-Z]/g, (c) => "_" + c.toLowerCase());
}

// Problems of obj as the proto3 canonical JSON *output* of type: unknown or
// snake_case keys, 64-bit integers not written as strings, enums not written
// as names, bytes not base64. An empty list means it is canonical.
export function jsonProblems(type, obj, path = type.name) {
  const problems = [];
  if (obj === null || typeof obj !== "object" || Array.isArray(obj)) {
    return [`${path}: not a JSON object`];
  }
  const byName = new Map(type.fieldsArray.map((f) => [f.name, f]));
  for (const [k, v] of Object.entries(obj)) {
    const f = byName.get(k);
    if (!f) {
      const snake = type.fieldsArray.find((x) => toSnake(x.name) === k);
      problems.push(snake ? `${path}.${k}: written in snake_case, proto3 JSON output uses lowerCamelCase '${snake.name}'` : `${path}.${k}: not a field of ${type.name}`);
      continue;
    }
    const check = (x, p) => {
      if (f.resolvedType instanceof protobuf.Type) {
        problems.push(...jsonProblems(f.resolvedType, x, p));
      } else if (f.resolvedType instanceof protobuf.Enum) {
        if (typeof x !== "string" || !(x in f.resolvedType.values)) problems.push(`${p}: enum must be written as its name, got ${JSON.stringify(x)}`);
      } else if (LONG_TYPES.has(f.type)) {
        if (typeof x !== "string" || !/^-?\d+$/.test(x)) problems.push(`${p}: 64-bit integer must be a decimal string, got ${JSON.stringify(x)}`);
      } else if (f.type === "bytes") {
        if (typeof x !== "string" || !/^[A-Za-z0-9+/]*={0,2}$/.test(x)) problems.push(`${p}: bytes must be base64, got ${JSON.stringify(x)}`);
      } else if (f.type === "string") {
        if (typeof x !== "string") problems.push(`${p}: must be a string`);
      } else if (f.type === "bool") {
        if (typeof x !== "boolean") problems.push(`${p}: must be a boolean`);
      } else if (typeof x !== "number" || !Number.isInteger(x)) {
        problems.push(`${p}: must be an integer number, got ${JSON.stringify(x)}`);
      }
    };
    if (f.map) {
      if (v === null || typeof v !== "object") problems.push(`${path}.${k}: map must be an object`);
      else for (const [mk, mv] of Object.entries(v)) if (typeof mv !== "string") problems.push(`${path}.${k}.${mk}: must be a string`);
    } else if (f.repeated) {
      if (!Array.isArray(v)) problems.push(`${path}.${k}: repeated field must be an array`);
      else v.forEach((x, i) => check(x, `${path}.${k}[${i}]`));
    } else {
      check(v, `${path}.${k}`);
    }
  }
  return problems;
}

// A message object (from JSON or from protobufjs' toObject with longs and
// enums as strings) with every field filled in; see the file comment.
export function normalize(type, obj) {
  const out = {};
  for (const f of type.fieldsArray) {
    let v = obj ? obj[f.name] : undefined;
    const conv = (x) => {
      if (f.resolvedType instanceof protobuf.Type) return normalize(f.resolvedType, x);
      if (f.resolvedType instanceof protobuf.Enum) return typeof x === "number" ? f.resolvedType.valuesById[x] : x;
      if (LONG_TYPES.has(f.type)) return Number(typeof x === "object" && x !== null && "low" in x ? protobuf.util.LongBits.from(x).toNumber(f.type.startsWith("u")) : x);
      if (f.type === "bytes") return typeof x === "string" ? Buffer.from(x, "base64") : Buffer.from(x);
      return x;
    };
    if (f.partOf) {
      // A oneof member (here: the exitCode presence oneof): absent stays absent.
      if (v !== undefined && v !== null) out[f.name] = conv(v);
      continue;
    }
    if (f.map) {
      out[f.name] = { ...(v ?? {}) };
    } else if (f.repeated) {
      out[f.name] = (v ?? []).map(conv);
    } else if (v === undefined || v === null) {
      if (f.resolvedType instanceof protobuf.Type) out[f.name] = null;
      else if (f.resolvedType instanceof protobuf.Enum) out[f.name] = f.resolvedType.valuesById[0];
      else if (f.type === "string") out[f.name] = "";
      else if (f.type === "bool") out[f.name] = false;
      else if (f.type === "bytes") out[f.name] = Buffer.alloc(0);
      else out[f.name] = 0;
    } else {
      out[f.name] = conv(v);
    }
  }
  return out;
}

// Decodes a result or event body. JSON when it parses as a JSON object
// (protobuf of these messages can never start with '{': that would be a
// group start of field 15), else protobuf. encodingHint ("json" |
// "protobuf") forces one.
export function decodeMessage(type, bytes, encodingHint) {
  const buf = Buffer.from(bytes);
  let encoding = encodingHint;
  if (!encoding) encoding = buf.length > 0 && buf[0] === 0x7b ? "json" : "protobuf";
  if (encoding === "json") {
    const raw = JSON.parse(buf.toString("utf8"));
    return { encoding, raw, value: normalize(type, raw), problems: jsonProblems(type, raw) };
  }
  const msg = type.decode(buf);
  const raw = type.toObject(msg, { longs: String, enums: String });
  return { encoding, raw, value: normalize(type, raw), problems: [] };
}

// proto3 JSON for a request object: bytes as base64, the rest as given.
export function requestToJson(req) {
  const copy = { ...req };
  if (Array.isArray(req.files)) {
    copy.files = req.files.map((f) => {
      const g = { ...f };
      if (g.content !== undefined && typeof g.content !== "string") g.content = Buffer.from(g.content).toString("base64");
      return g;
    });
  }
  return JSON.stringify(copy);
}

export function requestToProtobuf(req) {
  const { ExecutionRequest } = proto();
  const obj = { ...req };
  if (Array.isArray(req.files)) {
    obj.files = req.files.map((f) => {
      const g = { ...f };
      if (typeof g.content === "string") g.content = Buffer.from(g.content, "base64");
      return g;
    });
  }
  const err = ExecutionRequest.verify(ExecutionRequest.fromObject(obj));
  if (err) throw new Error(`requestToProtobuf: ${err}`);
  return ExecutionRequest.encode(ExecutionRequest.fromObject(obj)).finish();
}

function headersToObject(h) {
  const out = {};
  if (!h) return out;
  for (const k of h.keys()) out[k] = h.get(k);
  return out;
}

export async function connectClient(url) {
  const nc = await connect({ servers: url, name: "ci-itest", maxReconnectAttempts: 10 });
  // The connection's last status changes, so that a test that finds it closed
  // says why instead of timing out on "closed connection".
  const history = [];
  let closedWhy = null;
  (async () => {
    for await (const s of nc.status()) {
      if (s.type === "ping") continue;
      history.push(`${new Date().toISOString()} ${s.type}${s.error ? ` ${s.error}` : ""}${s.server ? ` ${s.server}` : ""}`);
      if (history.length > 20) history.shift();
    }
  })().catch(() => {});
  nc.closed().then((e) => { closedWhy = e ? String(e) : "closed by the test"; });
  const checkConnection = () => {
    if (nc.isClosed())
      throw new Error(`the test's NATS connection is closed (${closedWhy ?? "reason not known yet"}); its last status changes:\n${history.join("\n") || "(none)"}`);
  };
  const js = jetstream(nc, { timeout: 10000 });
  const jsm = await jetstreamManager(nc, { timeout: 10000 });
  let kv = null;
  let os = null;
  const kvBucket = async () => (kv ??= await new Kvm(js).open(RESULTS_BUCKET));
  const objBucket = async () => (os ??= await new Objm(js).open(FILES_BUCKET));
  let skv = null;
  const sessionsBucket = async () => (skv ??= await new Kvm(js).open(SESSIONS_BUCKET));

  const client = {
    // Called on every poll of the wait loops below; a test stack sets it to
    // throw as soon as a worker crashed, rather than wait for a timeout.
    check: checkConnection,
    checkConnection,
    nc,
    js,
    jsm,
    kvBucket,
    objBucket,
    sessionsBucket,

    // JetStream-publishes request on ci.submit. Options:
    //   json     true = proto3 JSON with Content-Type: application/json
    //   body     raw body (string or bytes) sent as is, instead of request
    //   msgId    Nats-Msg-Id (default: request.taskId; null = no header)
    //   contentType  Content-Type to send (default by json; null = none)
    //   headers  extra headers { name: value }
    //   subject  where to publish (default: ci.submit, or ci.submit.<sessionId>
    //            for a request with a sessionId that is one subject token)
    // Returns the PubAck ({ stream, seq, duplicate }).
    async submit(request, opts = {}) {
      const { json = false, body, headers = {} } = opts;
      const msgId = opts.msgId === undefined ? request?.taskId : opts.msgId;
      let data;
      if (body !== undefined) data = typeof body === "string" ? Buffer.from(body) : body;
      else data = json ? Buffer.from(requestToJson(request)) : requestToProtobuf(request);
      const h = natsHeaders();
      const ct = opts.contentType !== undefined ? opts.contentType : json ? "application/json" : "application/protobuf";
      if (ct) h.set("Content-Type", ct);
      for (const [k, v] of Object.entries(headers)) h.set(k, v);
      const popts = { headers: h, timeout: 10000 };
      if (msgId) popts.msgID = msgId;
      // A session's steps go on its own subject (docs/contract.md §16).
      const sessionSubject = /^[A-Za-z0-9_-]{1,64}$/.test(request?.sessionId ?? "");
      const subject = opts.subject ?? (sessionSubject ? `${SUBMIT_SUBJECT}.${request.sessionId}` : SUBMIT_SUBJECT);
      return js.publish(subject, data, popts);
    },

    // JetStream-publishes an empty message on ci.cancel.<id>.
    async cancel(taskId) {
      return js.publish(`${CANCEL_PREFIX}.${taskId}`, new Uint8Array(0), { timeout: 10000 });
    },

    // The current KV value of the task, decoded, or null.
    async getResult(taskId) {
      const b = await kvBucket();
      const e = await b.get(taskId);
      if (!e || e.operation !== "PUT" || e.value.length === 0) return null;
      const d = decodeMessage(proto().ExecutionResult, e.value);
      return { result: d.value, raw: d.raw, encoding: d.encoding, problems: d.problems, revision: e.revision, bytes: e.value };
    },

    // Polls the KV bucket until the task has a terminal result; at most
    // timeoutMs, then throws with the last status seen.
    async waitResult(taskId, timeoutMs = 60000) {
      const deadline = Date.now() + timeoutMs;
      let last = null;
      for (;;) {
        try {
          last = await client.getResult(taskId);
        } catch (e) {
          // The bucket may not exist before the first worker created it.
          if (Date.now() > deadline) throw e;
        }
        if (last && TERMINAL.has(last.result.status)) return last;
        client.check();
        if (Date.now() > deadline) throw new Error(`task ${taskId}: no terminal result within ${timeoutMs} ms (last status: ${last ? last.result.status : "none"})`);
        await sleep(100);
      }
    },

    // Polls until the task's stored status is `status` (e.g. RUNNING).
    async waitStatus(taskId, status, timeoutMs = 30000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        let r = null;
        try {
          r = await client.getResult(taskId);
        } catch {
          r = null;
        }
        if (r && r.result.status === status) return r;
        client.check();
        if (Date.now() > deadline) throw new Error(`task ${taskId}: status ${status} not seen within ${timeoutMs} ms (last: ${r ? r.result.status : "none"})`);
        await sleep(50);
      }
    },

    // Every StatusEvent of the task in stream CI_STATUS, in order, replayed
    // with an ephemeral consumer. With untilTerminal (default) it waits (at
    // most timeoutMs) for a terminal event, then keeps listening settleMs
    // more so that an extra event after the terminal one is seen too.
    // Each item: { subject, headers, headerKeys, contentType, encoding, raw, event, problems, bytes }.
    async events(taskId, { untilTerminal = true, timeoutMs = 30000, settleMs = 1000 } = {}) {
      const subject = `${STATUS_PREFIX}.${taskId}`;
      const ci = await jsm.consumers.add(STATUS_STREAM, {
        filter_subject: subject,
        ack_policy: AckPolicy.None,
        deliver_policy: DeliverPolicy.All,
        inactive_threshold: 60_000_000_000,
      });
      const consumer = await js.consumers.get(STATUS_STREAM, ci.name);
      const out = [];
      const deadline = Date.now() + timeoutMs;
      let terminalAt = null;
      try {
        for (;;) {
          const now = Date.now();
          if (terminalAt !== null && now - terminalAt >= settleMs) break;
          if (terminalAt === null && now > deadline) {
            if (untilTerminal) throw new Error(`task ${taskId}: no terminal status event within ${timeoutMs} ms (got ${out.map((e) => e.event.status).join(", ") || "none"})`);
            break;
          }
          client.check();
          const m = await consumer.next({ expires: 1000 });
          if (!m) {
            if (!untilTerminal) break;
            continue;
          }
          const h = headersToObject(m.headers);
          const contentType = h["Content-Type"];
          const d = decodeMessage(proto().StatusEvent, m.data, contentType === "application/json" ? "json" : contentType === "application/protobuf" ? "protobuf" : undefined);
          out.push({
            subject: m.subject,
            headers: h,
            headerKeys: m.headers ? [...m.headers.keys()] : [],
            contentType,
            encoding: d.encoding,
            raw: d.raw,
            event: d.value,
            problems: d.problems,
            bytes: m.data,
          });
          if (terminalAt === null && TERMINAL.has(d.value.status)) terminalAt = Date.now();
        }
      } finally {
        await jsm.consumers.delete(STATUS_STREAM, ci.name).catch(() => {});
      }
      return out;
    },

    // The task's live output chunks (docs/contract.md §19) replayed from
    // stream CI_OUTPUT with an ordered consumer, in stream order, until
    // those of attempt add up to want ({ stdout, stderr }: byte counts, e.g.
    // the result's), at most timeoutMs. Each item: { stream, seq, attempt,
    // taskId, data (Buffer), streamSeq }; seq and attempt as the headers say
    // (strings).
    async outputChunks(taskId, want, { attempt = "1", timeoutMs = 30000 } = {}) {
      const prefix = `${OUTPUT_PREFIX}.${taskId}.`;
      const consumer = await js.consumers.get(OUTPUT_STREAM, { filter_subjects: `${prefix}>` });
      const got = [];
      const size = (s) => got.filter((c) => c.stream === s && c.attempt === attempt).reduce((n, c) => n + c.data.length, 0);
      const deadline = Date.now() + timeoutMs;
      try {
        while (size("stdout") < want.stdout || size("stderr") < want.stderr) {
          client.check();
          if (Date.now() > deadline) throw new Error(`task ${taskId}: the replay of its output stopped at ${size("stdout")}/${want.stdout} and ${size("stderr")}/${want.stderr} bytes`);
          const m = await consumer.next({ expires: 1000 });
          if (!m) continue;
          got.push({
            stream: m.subject.slice(prefix.length),
            seq: m.headers?.get("Ci-Seq"),
            attempt: m.headers?.get("Ci-Attempt"),
            taskId: m.headers?.get("Ci-Task-Id"),
            data: Buffer.from(m.data),
            streamSeq: m.seq,
          });
        }
      } finally {
        await consumer.delete().catch(() => {});
      }
      return got;
    },

    // The bytes of an object of bucket ci-files, or null when it is absent.
    async getObject(name) {
      const b = await objBucket();
      return b.getBlob(name);
    },
    async objectInfo(name) {
      const b = await objBucket();
      return b.info(name);
    },
    async putObject(name, data) {
      const b = await objBucket();
      return b.putBlob({ name }, Buffer.from(data));
    },

    async close() {
      await nc.close().catch(() => {});
    },
  };
  return client;
}

// Runs one request end to end: submit, wait for the terminal result.
export async function runTask(client, request, opts = {}) {
  const taskId = request.taskId ?? newTaskId();
  const req = { language: "python", ...request, taskId };
  await client.submit(req, opts);
  const r = await client.waitResult(taskId, opts.timeoutMs ?? 60000);
  return { taskId, ...r };
}
