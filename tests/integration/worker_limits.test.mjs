// The limits of a task: time, output size and memory, each keeping what
// the code printed before it was stopped.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startStack } from "./lib/stack.mjs";
import protobuf from "protobufjs";

import { runTask } from "./lib/client.mjs";
import { checkEvents, checkResultBasics, show } from "./lib/checks.mjs";

const MiB = 1024 * 1024;

// The raw bytes of string field `field` of a protobuf message (the last
// occurrence), without any UTF-8 decoding.
function protoStringBytes(buf, field) {
  const rd = protobuf.Reader.create(buf);
  let out = null;
  while (rd.pos < rd.len) {
    const tag = rd.uint32();
    if (tag >>> 3 === field && (tag & 7) === 2) out = Buffer.from(rd.bytes());
    else rd.skipType(tag & 7);
  }
  return out;
}
const strictUtf8 = new TextDecoder("utf-8", { fatal: true });

describe("worker limits", () => {
  let stack;
  let worker;
  before(async () => {
    stack = await startStack({ workers: 1, worker: { concurrency: 2 } });
    worker = stack.workers[0];
  });
  after(async () => {
    await stack?.stop();
  });

  test("time limit: TIMED_OUT near the limit, the flushed early output is kept", async () => {
    const t0 = Date.now();
    const { result: r, taskId } = await runTask(stack.client, {
      code: "import sys, time\nprint('early line', flush=True)\nsys.stderr.write('early err\\n')\nsys.stderr.flush()\ntime.sleep(30)\nprint('late line')",
      // Time for the code to start and print on a loaded machine.
      limits: { timeoutMs: 6000 },
    });
    const elapsed = Date.now() - t0;
    checkResultBasics(r, { taskId });
    assert.equal(r.status, "TASK_STATUS_TIMED_OUT", show(r));
    assert.equal(r.stdout, "early line\n");
    assert.equal(r.stderr, "early err\n");
    assert.match(r.error, /time/i);
    assert.match(r.error, /6000|6 s/);
    // The contract only makes exit_code absent when the code never ran; a
    // killed run may report one, but never a success.
    if (r.exitCode !== undefined) assert.notEqual(r.exitCode, 0, "a timed-out run does not exit 0");
    // Room for a loaded machine, well under the code's 30 s sleep.
    assert.ok(r.usage && r.usage.durationMs >= 5900 && r.usage.durationMs < 6000 + 10000, `duration ${r.usage?.durationMs} ms is about the limit`);
    assert.ok(elapsed < 6000 + 15000, `the result came ${elapsed} ms after the submit (limit 6000 ms)`);
    const evs = await stack.client.events(taskId);
    checkEvents(evs, { taskId, result: r, encoding: "protobuf", worker: worker.id });
    assert.equal(evs[1].headers["Ci-Status"], "timed_out");
  });

  test("time limit: output printed without flush before the timeout is kept too", async () => {
    // Agents rarely flush: "what the code printed before a timeout is kept".
    const { result: r } = await runTask(stack.client, {
      code: "import time\nprint('printed but not flushed')\ntime.sleep(30)",
      limits: { timeoutMs: 6000 }, // time to start and print on a loaded machine
    });
    assert.equal(r.status, "TASK_STATUS_TIMED_OUT", show(r));
    assert.equal(r.stdout, "printed but not flushed\n");
  });

  test("a busy loop is stopped by the time limit as well", async () => {
    const { result: r } = await runTask(stack.client, {
      code: "print('spinning', flush=True)\nwhile True:\n    pass",
      limits: { timeoutMs: 6000 }, // time to start and print on a loaded machine
    });
    assert.equal(r.status, "TASK_STATUS_TIMED_OUT", show(r));
    assert.equal(r.stdout, "spinning\n");
    // Loose bound: on a loaded machine the loop gets little CPU, but never none.
    assert.ok(r.usage.cpuMs >= 100, `the loop used CPU: ${r.usage.cpuMs} ms`);
  });

  test("output truncation: stdout and stderr are cut at 1 MiB and the result says how much was written", async () => {
    // Numbered lines, so that we can tell the kept part is the beginning.
    const code = [
      "import sys",
      "line = 'x' * 100",
      "n = 0",
      "while n < 3 * 1024 * 1024:",
      "    s = '%08d %s\\n' % (n, line)",
      "    sys.stdout.write(s)",
      "    n += len(s)",
      "sys.stdout.flush()",
      "sys.stderr.write('e' * (2 * 1024 * 1024 + 5))",
      "print('total', n, file=sys.stderr)",
    ].join("\n");
    const { result: r, taskId } = await runTask(stack.client, { code });
    checkResultBasics(r, { taskId });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    // What the code wrote, computed the same way.
    let expected = "";
    let n = 0;
    const parts = [];
    while (n < 3 * MiB) {
      const s = `${String(n).padStart(8, "0")} ${"x".repeat(100)}\n`;
      parts.push(s);
      n += s.length;
    }
    expected = parts.join("");
    assert.equal(r.stdoutTruncated, true);
    assert.equal(r.stdoutTotalBytes, expected.length, "stdout_total_bytes is what the code wrote");
    assert.equal(r.stdout.length, MiB, "stdout is cut at exactly 1 MiB");
    assert.ok(expected.startsWith(r.stdout), "the kept stdout is the beginning of what was written");
    assert.equal(r.stderrTruncated, true);
    const errTotal = 2 * MiB + 5 + Buffer.byteLength(`total ${n}\n`);
    assert.equal(r.stderrTotalBytes, errTotal);
    assert.equal(r.stderr.length, MiB);
    assert.ok(/^e+$/.test(r.stderr), "the kept stderr is the beginning");
  });

  test("truncation never splits a UTF-8 character", async () => {
    // 3-byte characters from offset 2: a cut at 1 MiB falls inside one
    // (2 + 3k is never 1048576).
    const { result: r } = await runTask(stack.client, {
      code: "import sys\nsys.stdout.write('ab' + '€' * 400000)",
    });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.stdoutTruncated, true);
    assert.equal(r.stdoutTotalBytes, 2 + 3 * 400000);
    const bytes = Buffer.byteLength(r.stdout);
    assert.ok(bytes <= MiB && bytes >= MiB - 3, `kept ${bytes} bytes`);
    assert.ok(/^ab€+\uFFFD?$/.test(r.stdout), "valid UTF-8: whole characters (a cut one may become U+FFFD)");
  });

  test("the 1 MiB cap holds for the stored output: 2 MiB of invalid UTF-8 is cut after U+FFFD replaces each byte", async () => {
    // Each invalid byte becomes U+FFFD (3 bytes): cut before the
    // replacement, 1 MiB of raw bytes came back as 3 MiB of text.
    const { result: r, bytes } = await runTask(stack.client, {
      code: "import sys\nsys.stdout.buffer.write(b'\\xff' * (2 << 20))\nsys.stderr.buffer.write(b'\\xfe' * (2 << 20))",
    });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.stdoutTotalBytes, 2 * MiB);
    assert.equal(r.stdoutTruncated, true);
    assert.equal(r.stderrTruncated, true);
    for (const [name, text, field] of [["stdout", r.stdout, 3], ["stderr", r.stderr, 4]]) {
      const stored = protoStringBytes(bytes, field);
      assert.ok(stored.length <= MiB && stored.length >= MiB - 3, `${name}: ${stored.length} bytes stored, the cap is ${MiB}`);
      assert.doesNotThrow(() => strictUtf8.decode(stored), `${name} is valid UTF-8, cut on a character boundary`);
      assert.ok(/^\uFFFD+$/.test(text), `${name} is U+FFFD only`);
    }
  });

  test("memory limit: FAILED, the error says the memory limit was exceeded, earlier output kept", async () => {
    const { result: r, taskId } = await runTask(stack.client, {
      code: [
        "print('allocating', flush=True)",
        "blocks = []",
        "for i in range(200):",
        "    blocks.append(b'x' * (8 * 1024 * 1024))  # written, so really resident",
        "print('allocated', len(blocks) * 8, 'MiB')",
      ].join("\n"),
      limits: { memoryMb: 256 },
    });
    checkResultBasics(r, { taskId });
    assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
    assert.match(r.error, /memory/i, show(r));
    assert.match(r.error, /limit|exceed/i, show(r));
    assert.match(r.error, /256/, "the error names the limit");
    assert.equal(r.stdout, "allocating\n");
    assert.ok(r.usage.memoryMb <= 256 + 64, `peak memory ${r.usage.memoryMb} MiB stayed near the 256 MiB limit`);
  });

  for (const json of [false, true]) {
    test(`invalid UTF-8 in the output is replaced, never passed on (${json ? "JSON" : "protobuf"})`, async () => {
      const { result: r, bytes, encoding } = await runTask(
        stack.client,
        { code: "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe\\xc3 end\\n')\nsys.stderr.buffer.write(b'\\xe2\\x82 bad\\n')" },
        { json },
      );
      assert.equal(encoding, json ? "json" : "protobuf");
      assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
      assert.equal(r.stdoutTotalBytes, 11, "total counts the bytes the code wrote");
      assert.match(r.stdout, /^ok \uFFFD+ end\n$/);
      assert.match(r.stderr, /^\uFFFD+ bad\n$/);
      // The stored bytes themselves are valid UTF-8 (a lenient decoder
      // would hide invalid bytes, so check them strictly).
      if (json) {
        assert.doesNotThrow(() => strictUtf8.decode(bytes), "the JSON result is valid UTF-8");
      } else {
        for (const field of [3, 4]) assert.doesNotThrow(() => strictUtf8.decode(protoStringBytes(bytes, field)), `field ${field} is valid UTF-8`);
      }
    });
  }

  test("a JSON result whose output needs heavy escaping still fits and says what was cut", async () => {
    // Control characters become \\u00XX in JSON: 6 bytes each, so 1 MiB of
    // them on both streams is ~12 MiB of JSON, more than the server's 8 MB.
    const { result: r, raw, encoding } = await runTask(
      stack.client,
      { code: "import sys\nsys.stdout.write('\\x01' * (1024 * 1024))\nsys.stderr.write('\\x02' * (1024 * 1024))" },
      { json: true },
    );
    assert.equal(encoding, "json");
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.stdoutTotalBytes, MiB);
    assert.equal(r.stderrTotalBytes, MiB);
    assert.ok(/^\x01*$/.test(r.stdout) && /^\x02*$/.test(r.stderr));
    // Whatever was kept: a shorter stream is flagged as cut.
    assert.equal(r.stdoutTruncated, r.stdout.length < MiB, `stdout ${r.stdout.length} chars, truncated ${r.stdoutTruncated}`);
    assert.equal(r.stderrTruncated, r.stderr.length < MiB, `stderr ${r.stderr.length} chars, truncated ${r.stderrTruncated}`);
    assert.ok(r.stdoutTruncated || r.stderrTruncated, "12 MiB of JSON cannot fit in 8 MB: something was cut");
    assert.equal(typeof raw.stdoutTotalBytes, "string");
  });

  test("artifacts are capped at 20 MiB in all; what is returned is intact", async () => {
    const code = [
      "for i in range(3):",
      "    with open(f'part{i}.csv', 'w') as f:",
      "        f.write('a,b\\n')",
      "        f.write(('%d,%d\\n' % (i, i)) * (8 * 1024 * 1024 // 4))",
      "print('written')",
    ].join("\n");
    const { result: r, taskId } = await runTask(stack.client, { code });
    assert.match(r.stdout, /written/, show(r));
    const total = r.artifacts.reduce((n, a) => n + a.size, 0);
    assert.ok(total <= 20 * MiB, `artifacts total ${total} bytes, more than 20 MiB`);
    assert.ok(r.artifacts.length < 3, "not all three 8 MiB files can be returned");
    for (const a of r.artifacts) {
      const bytes = await stack.client.getObject(a.object);
      assert.equal(bytes.length, a.size);
      assert.equal(a.object, `${taskId}/${a.name}`);
    }
    assert.match(r.error, /artifact|20/i, `the result says artifacts were left out: ${show(r)}`);
  });

  test("the worker is healthy after the limits were hit", async () => {
    const { result: r } = await runTask(stack.client, { code: "import numpy as np\nprint(int(np.arange(10).sum()))" });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.stdout, "45\n");
    assert.equal(worker.exited(), null);
  });
});
