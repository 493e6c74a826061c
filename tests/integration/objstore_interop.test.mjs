// The object store module against nats.js @nats-io/obj, both ways, on a real
// nats-server: what our C code writes, nats.js reads, and the other way round.
// objtool (tests/tools/objtool.c) drives the module; it is found in
// $CI_BUILD_DIR/tests (default /work/main/build) and, in a sanitizer build,
// runs under ASan/UBSan: any sanitizer report fails the test.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { connect, headers } from "@nats-io/transport-node";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Objm } from "@nats-io/obj";

import { startNatsServer } from "./lib/nats-server.mjs";

const BUILD = process.env.CI_BUILD_DIR || "/work/main/build";
const OBJTOOL = join(BUILD, "tests", "objtool");
const CHUNK = 128 * 1024;
const SIZES = [0, 1, CHUNK, 300 * 1024 + 7, 5 * 1024 * 1024];

const b64urlPadded = (buf) => Buffer.from(buf).toString("base64").replace(/\+/g, "-").replace(/\//g, "_");
const digestOf = (buf) => "SHA-256=" + b64urlPadded(createHash("sha256").update(buf).digest());

let srv;
let nc;
let jsm;
let objm;
let work;

// Runs objtool; resolves {code, stdout, stderr}. Fails on sanitizer reports.
function objtool(...args) {
  return new Promise((resolve, reject) => {
    const child = spawn(OBJTOOL, args, {
      stdio: ["ignore", "pipe", "pipe"],
      env: {
        ...process.env,
        ASAN_OPTIONS: process.env.ASAN_OPTIONS || "detect_leaks=1:abort_on_error=0",
        UBSAN_OPTIONS: process.env.UBSAN_OPTIONS || "print_stacktrace=1:halt_on_error=1",
      },
    });
    const out = [];
    const err = [];
    child.stdout.on("data", (d) => out.push(d));
    child.stderr.on("data", (d) => err.push(d));
    const timer = setTimeout(() => child.kill("SIGKILL"), 120_000);
    child.on("error", reject);
    child.on("close", (code, signal) => {
      clearTimeout(timer);
      const stderr = Buffer.concat(err).toString();
      if (/ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:/.test(stderr)) {
        reject(new Error(`objtool ${args.join(" ")}: sanitizer report:\n${stderr}`));
        return;
      }
      resolve({ code: signal ? `signal ${signal}` : code, stdout: Buffer.concat(out), stderr });
    });
  });
}

async function objtoolOk(...args) {
  const r = await objtool(...args);
  assert.equal(r.code, 0, `objtool ${args.join(" ")} failed: ${r.stderr}`);
  return r;
}

let fileNo = 0;
function tmpFile(data) {
  const p = join(work, `f${fileNo++}`);
  if (data !== undefined) writeFileSync(p, data);
  return p;
}

// A bucket's stream state: which chunk subjects hold messages.
async function chunkSubjects(bucket) {
  const si = await jsm.streams.info(`OBJ_${bucket}`, { subjects_filter: `$O.${bucket}.C.>` });
  return Object.keys(si.state.subjects || {});
}

before(async () => {
  assert.ok(existsSync(OBJTOOL), `objtool not built: ${OBJTOOL} (set CI_BUILD_DIR)`);
  work = mkdtempSync(join(tmpdir(), "ci-objtest-"));
  srv = await startNatsServer();
  nc = await connect({ servers: srv.url });
  jsm = await jetstreamManager(nc);
  objm = new Objm(nc);
});

after(async () => {
  await nc?.close();
  await srv?.stop();
  if (work) rmSync(work, { recursive: true, force: true });
});

describe("objtool put, nats.js get", () => {
  const bucket = "c-to-js";
  for (const size of SIZES) {
    test(`${size} bytes`, async () => {
      const data = randomBytes(size);
      const name = `task-${size}/out put.csv`;
      await objtoolOk(srv.url, bucket, "put", name, tmpFile(data));
      const os = await objm.open(bucket);
      const got = await os.getBlob(name);
      assert.ok(got, "nats.js does not find the object");
      assert.equal(Buffer.compare(Buffer.from(got), data), 0, "nats.js read other bytes");
      const info = await os.info(name);
      assert.equal(info.digest, digestOf(data));
      assert.equal(info.size, size);
      assert.equal(info.chunks, Math.ceil(size / CHUNK));
      assert.equal(info.bucket, bucket);
      assert.equal(info.deleted, false);
      assert.match(info.mtime, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{9}Z$/);
      assert.ok(!Number.isNaN(Date.parse(info.mtime)));
    });
  }

  test("the stream is configured as nats.js configures it", async () => {
    const si = await jsm.streams.info(`OBJ_${bucket}`);
    assert.deepEqual([...si.config.subjects].sort(), [`$O.${bucket}.C.>`, `$O.${bucket}.M.>`]);
    assert.equal(si.config.discard, "new");
    assert.equal(si.config.allow_rollup_hdrs, true);
    assert.equal(si.config.allow_direct, true);
    assert.equal(si.config.num_replicas, 1);
  });
});

describe("nats.js put, objtool get", () => {
  const bucket = "js-to-c";
  for (const size of SIZES) {
    test(`${size} bytes`, async () => {
      const os = await objm.create(bucket);
      const data = randomBytes(size);
      const name = `js/${size}.bin`;
      const info = await os.putBlob({ name }, data);
      const out = tmpFile();
      await objtoolOk(srv.url, bucket, "get", name, out);
      assert.equal(Buffer.compare(readFileSync(out), data), 0, "objtool read other bytes");
      const meta = JSON.parse((await objtoolOk(srv.url, bucket, "info", name)).stdout.toString());
      assert.equal(meta.digest, info.digest);
      assert.equal(meta.nuid, info.nuid);
      assert.equal(meta.size, size);
    });
  }
});

describe("replacing an object", () => {
  test("objtool put twice: nats.js reads the newer, the old chunks are purged", async () => {
    const bucket = "replace";
    const name = "dir/data.csv";
    const first = randomBytes(300 * 1024);
    const second = randomBytes(200 * 1024 + 3);
    await objtoolOk(srv.url, bucket, "put", name, tmpFile(first));
    const os = await objm.open(bucket);
    const oldNuid = (await os.info(name)).nuid;
    assert.deepEqual(await chunkSubjects(bucket), [`$O.${bucket}.C.${oldNuid}`]);
    await objtoolOk(srv.url, bucket, "put", name, tmpFile(second));
    const info = await os.info(name);
    assert.notEqual(info.nuid, oldNuid);
    assert.equal(Buffer.compare(Buffer.from(await os.getBlob(name)), second), 0);
    assert.deepEqual(await chunkSubjects(bucket), [`$O.${bucket}.C.${info.nuid}`]);
    // one meta per name: the rollup dropped the older one
    const si = await jsm.streams.info(`OBJ_${bucket}`, { subjects_filter: `$O.${bucket}.M.>` });
    assert.deepEqual(Object.values(si.state.subjects), [1]);
  });

  test("nats.js put twice: objtool reads the newer", async () => {
    const bucket = "replace-js";
    const os = await objm.create(bucket);
    await os.putBlob({ name: "x" }, randomBytes(1000));
    const second = randomBytes(140 * 1024);
    await os.putBlob({ name: "x" }, second);
    const out = tmpFile();
    await objtoolOk(srv.url, bucket, "get", "x", out);
    assert.equal(Buffer.compare(readFileSync(out), second), 0);
  });
});

describe("names", () => {
  test("the meta subject is the padded base64url of the UTF-8 name", async () => {
    const bucket = "names";
    // nats.js encodes names with btoa (Latin-1), so it cannot address this
    // name; nats.go and we use the UTF-8 bytes, as ADR-20 says.
    const name = "日本/ü.csv"; // 13 UTF-8 bytes: encoded with "==" padding
    const data = randomBytes(10);
    await objtoolOk(srv.url, bucket, "put", name, tmpFile(data));
    const subj = `$O.${bucket}.M.${b64urlPadded(Buffer.from(name, "utf8"))}`;
    assert.ok(subj.endsWith("="), "padding expected for this name");
    const m = await jsm.streams.getMessage(`OBJ_${bucket}`, { last_by_subj: subj });
    assert.ok(m, `no meta on ${subj}`);
    assert.equal(m.json().name, name);
    assert.equal(m.header.get("Nats-Rollup"), "sub");
    const out = tmpFile();
    await objtoolOk(srv.url, bucket, "get", name, out);
    assert.equal(Buffer.compare(readFileSync(out), data), 0);
  });

  test("ASCII names with slashes and spaces work both ways", async () => {
    const bucket = "names";
    const os = await objm.create(bucket);
    const a = randomBytes(77);
    await os.putBlob({ name: "a b/c=d/e.csv" }, a);
    const out = tmpFile();
    await objtoolOk(srv.url, bucket, "get", "a b/c=d/e.csv", out);
    assert.equal(Buffer.compare(readFileSync(out), a), 0);
  });
});

describe("failures", () => {
  const bucket = "failures";

  test("a missing name fails with a clear message", async () => {
    await objtoolOk(srv.url, bucket, "create");
    const r = await objtool(srv.url, bucket, "get", "nope/x.csv", tmpFile());
    assert.equal(r.code, 3);
    assert.match(r.stderr, /object 'nope\/x\.csv' not found in bucket 'failures'/);
  });

  test("a long name is cut in messages on a UTF-8 boundary", async () => {
    const name = "x" + "é".repeat(150); // byte 200 is inside a character
    const r = await objtool(srv.url, bucket, "get", name, tmpFile());
    assert.equal(r.code, 3);
    assert.ok(!r.stderr.includes("\uFFFD"), `invalid UTF-8 in: ${r.stderr}`);
    assert.ok(r.stderr.includes(`object '${"x" + "é".repeat(99)}...' not found`), r.stderr);
  });

  test("a missing bucket fails with a clear message", async () => {
    const r = await objtool(srv.url, "no-such-bucket", "get", "x", tmpFile());
    assert.equal(r.code, 3);
    assert.match(r.stderr, /bucket 'no-such-bucket' does not exist/);
  });

  test("an object deleted by nats.js is not found; one deleted by objtool is gone for nats.js", async () => {
    const os = await objm.open(bucket);
    await os.putBlob({ name: "del-js" }, randomBytes(1000));
    await os.delete("del-js");
    const r = await objtool(srv.url, bucket, "get", "del-js", tmpFile());
    assert.equal(r.code, 3);
    assert.match(r.stderr, /not found/);

    await objtoolOk(srv.url, bucket, "put", "del-c", tmpFile(randomBytes(200 * 1024)));
    const nuid = (await os.info("del-c")).nuid;
    await objtoolOk(srv.url, bucket, "delete", "del-c");
    assert.equal(await os.getBlob("del-c"), null);
    const info = await os.info("del-c");
    assert.equal(info.deleted, true);
    assert.ok(!(await chunkSubjects(bucket)).includes(`$O.${bucket}.C.${nuid}`));
  });

  test("an object larger than the limit is refused before reading", async () => {
    await objtoolOk(srv.url, bucket, "put", "big", tmpFile(randomBytes(300 * 1024)));
    const r = await objtool("--max", "1000", srv.url, bucket, "get", "big", tmpFile());
    assert.equal(r.code, 4);
    assert.match(r.stderr, /object 'big' in bucket 'failures' is 300\.0 KiB; the limit is 1000 bytes/);
  });

  // Tampering: rewrite the meta (as any client could) so that it no longer
  // matches the chunks.
  async function tamper(name, change) {
    const stream = `OBJ_${bucket}`;
    const subj = `$O.${bucket}.M.${b64urlPadded(Buffer.from(name))}`;
    const meta = (await jsm.streams.getMessage(stream, { last_by_subj: subj })).json();
    change(meta);
    const h = headers();
    h.set("Nats-Rollup", "sub");
    await jetstream(nc).publish(subj, JSON.stringify(meta), { headers: h });
    return meta;
  }

  test("a digest that does not match fails as an integrity error", async () => {
    await objtoolOk(srv.url, bucket, "put", "tampered", tmpFile(randomBytes(150 * 1024)));
    await tamper("tampered", (m) => (m.digest = digestOf(Buffer.from("something else"))));
    const r = await objtool(srv.url, bucket, "get", "tampered", tmpFile());
    assert.equal(r.code, 5);
    assert.match(r.stderr, /does not match its SHA-256 digest/);
  });

  test("a size that does not match fails as an integrity error", async () => {
    await objtoolOk(srv.url, bucket, "put", "short", tmpFile(randomBytes(150 * 1024)));
    await tamper("short", (m) => (m.size += 1));
    const r = await objtool(srv.url, bucket, "get", "short", tmpFile());
    assert.equal(r.code, 5);
    assert.match(r.stderr, /holds 153600 bytes; its metadata says 153601/);
  });

  test("missing chunks fail as an integrity error", async () => {
    await objtoolOk(srv.url, bucket, "put", "purged", tmpFile(randomBytes(150 * 1024)));
    const os = await objm.open(bucket);
    const { nuid } = await os.info("purged");
    await jsm.streams.purge(`OBJ_${bucket}`, { filter: `$O.${bucket}.C.${nuid}` });
    const r = await objtool(srv.url, bucket, "get", "purged", tmpFile());
    assert.equal(r.code, 5);
    assert.match(r.stderr, /missing chunks: found 0 of 2/);
  });

  test("a digest in hex, as some clients write it, is accepted", async () => {
    const data = randomBytes(1000);
    await objtoolOk(srv.url, bucket, "put", "hex", tmpFile(data));
    await tamper("hex", (m) => (m.digest = "SHA-256=" + createHash("sha256").update(data).digest("hex")));
    const out = tmpFile();
    await objtoolOk(srv.url, bucket, "get", "hex", out);
    assert.equal(Buffer.compare(readFileSync(out), data), 0);
  });
});

describe("creating buckets", () => {
  test("a bucket nats.js created opens with create on our side, and is updated", async () => {
    const bucket = "made-by-js";
    await objm.create(bucket, { ttl: 0 });
    await objtoolOk("--ttl", "3600", srv.url, bucket, "create");
    const si = await jsm.streams.info(`OBJ_${bucket}`);
    assert.equal(si.config.max_age, 3600 * 1e9);
    assert.equal(si.config.allow_direct, true);
    // unchanged config: no error either, and both sides still work
    await objtoolOk("--ttl", "3600", srv.url, bucket, "create");
    const data = randomBytes(5000);
    await objtoolOk(srv.url, bucket, "put", "k", tmpFile(data));
    const os = await objm.open(bucket);
    assert.equal(Buffer.compare(Buffer.from(await os.getBlob("k")), data), 0);
  });

  test("a bucket we created opens with nats.js create and open", async () => {
    const bucket = "made-by-c";
    await objtoolOk("--ttl", "60", srv.url, bucket, "create");
    const os = await objm.create(bucket);
    const status = await os.status();
    assert.equal(status.ttl, 60 * 1e9);
    await objm.open(bucket);
    const data = randomBytes(3000);
    await os.putBlob({ name: "n" }, data);
    const out = tmpFile();
    await objtoolOk(srv.url, bucket, "get", "n", out);
    assert.equal(Buffer.compare(readFileSync(out), data), 0);
  });

  test("many processes creating one bucket at once all succeed", async () => {
    const bucket = "race";
    const results = await Promise.all(
      Array.from({ length: 6 }, () => objtool("--ttl", "120", srv.url, bucket, "create")),
    );
    for (const r of results) assert.equal(r.code, 0, r.stderr);
    const si = await jsm.streams.info(`OBJ_${bucket}`);
    assert.equal(si.config.max_age, 120 * 1e9);
  });
});

describe("concurrency", () => {
  test("many threads put and get on one handle", async () => {
    const bucket = "stress";
    const r = await objtoolOk(srv.url, bucket, "stress", "6", "8");
    assert.match(r.stdout.toString(), /6 threads x 8 iterations ok/);
    // the shared name holds one whole version that nats.js can read
    const os = await objm.open(bucket);
    const got = await os.getBlob("stress/shared");
    assert.ok(got && got.length >= 8);
    // each thread's own names have exactly their latest chunks
    const live = new Set();
    for (let t = 0; t < 6; t++) {
      for (let i = 0; i < 2; i++) live.add(`$O.${bucket}.C.${(await os.info(`stress/${t}/${i}`)).nuid}`);
    }
    const subjects = await chunkSubjects(bucket);
    for (const s of live) assert.ok(subjects.includes(s), `chunks of a live object missing: ${s}`);
  });
});

// A full store: taking back what a put stored (by sequence) gives its room
// back at once. nats-server 2.9 goes on counting a purged subject's bytes
// against the store, so a purge would leave a full store full.
describe("taking a put back on a small store", () => {
  let small;
  before(async () => {
    small = await startNatsServer({ jetstreamConfig: "max_file_store: 32MB" });
  });
  after(async () => {
    await small?.stop();
  });

  test("put-undo of 20 MiB three times: each time the room comes back, and nothing is left", async () => {
    const f = tmpFile(randomBytes(20 << 20));
    for (let i = 0; i < 3; i++) await objtoolOk(small.url, "undo", "put-undo", `big${i}`, f);
    const ncs = await connect({ servers: small.url });
    try {
      const jsms = await jetstreamManager(ncs);
      const si = await jsms.streams.info("OBJ_undo");
      assert.equal(si.state.messages, 0, `messages left: ${JSON.stringify(si.state)}`);
      const ai = await jsms.getAccountInfo();
      assert.ok(ai.storage < 1 << 20, `the store still counts ${ai.storage} bytes`);
    } finally {
      await ncs.close();
    }
    // and a plain put of the same size fits
    await objtoolOk(small.url, "undo", "put", "after", f);
  });
});
