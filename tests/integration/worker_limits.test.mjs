// The limits of a task: time, output size and memory, each keeping what
// the code printed before it was stopped.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";

import { startStack } from "./lib/stack.mjs";
import { runTask } from "./lib/client.mjs";
import { checkEvents, checkResultBasics, show } from "./lib/checks.mjs";

const MiB = 1024 * 1024;

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
      limits: { timeoutMs: 2000 },
    });
    const elapsed = Date.now() - t0;
    checkResultBasics(r, { taskId });
    assert.equal(r.status, "TASK_STATUS_TIMED_OUT", show(r));
    assert.equal(r.stdout, "early line\n");
    assert.equal(r.stderr, "early err\n");
    assert.match(r.error, /time/i);
    assert.match(r.error, /2000|2 s/);
    // The contract only makes exit_code absent when the code never ran; a
    // killed run may report one, but never a success.
    if (r.exitCode !== undefined) assert.notEqual(r.exitCode, 0, "a timed-out run does not exit 0");
    assert.ok(r.usage && r.usage.durationMs >= 1900 && r.usage.durationMs < 6000, `duration ${r.usage?.durationMs} ms is about the limit`);
    assert.ok(elapsed < 12000, `the result came ${elapsed} ms after the submit (limit 2000 ms)`);
    const evs = await stack.client.events(taskId);
    checkEvents(evs, { taskId, result: r, encoding: "protobuf", worker: worker.id });
    assert.equal(evs[1].headers["Ci-Status"], "timed_out");
  });

  test("time limit: output printed without flush before the timeout is kept too", async () => {
    // Agents rarely flush: "what the code printed before a timeout is kept".
    const { result: r } = await runTask(stack.client, {
      code: "import time\nprint('printed but not flushed')\ntime.sleep(30)",
      limits: { timeoutMs: 2000 },
    });
    assert.equal(r.status, "TASK_STATUS_TIMED_OUT", show(r));
    assert.equal(r.stdout, "printed but not flushed\n");
  });

  test("a busy loop is stopped by the time limit as well", async () => {
    const { result: r } = await runTask(stack.client, {
      code: "print('spinning', flush=True)\nwhile True:\n    pass",
      limits: { timeoutMs: 1500 },
    });
    assert.equal(r.status, "TASK_STATUS_TIMED_OUT", show(r));
    assert.equal(r.stdout, "spinning\n");
    assert.ok(r.usage.cpuMs >= 500, `the loop used CPU: ${r.usage.cpuMs} ms`);
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

  test("the worker is healthy after the limits were hit", async () => {
    const { result: r } = await runTask(stack.client, { code: "import numpy as np\nprint(int(np.arange(10).sum()))" });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.equal(r.stdout, "45\n");
    assert.equal(worker.exited(), null);
  });
});
