// Rich outputs (docs/contract.md §17) through a real worker, in both
// encodings: a task ending in df.head(3), display() of a figure, a session
// step with display() that keeps its state, and `ci run` printing them and
// saving an inline image.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";

import { startStack } from "./lib/stack.mjs";
import { newTaskId, runTask } from "./lib/client.mjs";
import { checkResultBasics, show } from "./lib/checks.mjs";
import { CLI_BIN } from "./lib/worker.mjs";

const run = promisify(execFile);

const CODE = `
import pandas as pd
import matplotlib.pyplot as plt

df = pd.DataFrame({"region": ["north", "east", "west", "south", "x"], "amount": [4, 20, 7, 1, 2]})
print("rows", len(df))
fig, ax = plt.subplots()
ax.bar(df["region"], df["amount"])
display(fig)
df.head(3)
`;

describe("rich outputs", () => {
  let stack;
  before(async () => {
    stack = await startStack({ workers: 1, worker: { concurrency: 2 } });
  });
  after(async () => {
    await stack?.stop();
  });

  for (const json of [false, true]) {
    const encoding = json ? "json" : "protobuf";
    test(`a task ending in df.head(3), ${encoding}`, async () => {
      const taskId = newTaskId(`outputs-${encoding}`);
      const r = await runTask(stack.client, { taskId, code: CODE, limits: { timeoutMs: 30000 } }, { json });
      assert.equal(r.encoding, encoding);
      checkResultBasics(r.result, { taskId, encodingProblems: r.problems });
      const res = r.result;
      assert.equal(res.status, "TASK_STATUS_SUCCEEDED", show(res));
      assert.equal(res.stdout, "rows 5\n");
      assert.equal(res.outputsTruncated, false);
      assert.equal(res.outputs.length, 2, show(res));

      const [fig, table] = res.outputs;
      assert.equal(fig.kind, "display");
      assert.match(fig.data["text/plain"], /^<Figure size/);
      assert.ok(Buffer.from(fig.data["image/png"], "base64").subarray(0, 8).equals(Buffer.from("\x89PNG\r\n\x1a\n", "latin1")));
      assert.equal(fig.artifact, "");
      // The figure shown is closed: not saved again as figure-1.png.
      assert.deepEqual(res.artifacts, []);

      assert.equal(table.kind, "result");
      assert.deepEqual(Object.keys(table.data).sort(), ["application/json", "text/html", "text/plain"]);
      assert.equal(table.data["text/plain"], "  region  amount\n0  north       4\n1   east      20\n2   west       7");
      assert.match(table.data["text/html"], /<table[^>]*class="dataframe"/);
      assert.deepEqual(JSON.parse(table.data["application/json"]), [
        { region: "north", amount: 4 },
        { region: "east", amount: 20 },
        { region: "west", amount: 7 },
      ]);
      assert.equal(table.totalRows, 3);
      assert.equal(table.truncated, false);
      if (json) {
        assert.ok(Array.isArray(r.raw.outputs), "outputs is a JSON array");
        assert.equal(r.raw.outputs[1].totalRows, "3", "uint64 as a decimal string");
        assert.ok(!("outputsTruncated" in r.raw), "a false bool is omitted");
      }
    });
  }

  test("a session step with display() keeps its state", async () => {
    const sessionId = newTaskId("outputs-s");
    const r1 = await runTask(stack.client, { sessionId, code: "x = 41\ndisplay(x)\n", limits: { timeoutMs: 30000 } });
    assert.equal(r1.result.status, "TASK_STATUS_SUCCEEDED", show(r1.result));
    assert.equal(r1.result.session.stateKept, true, show(r1.result));
    assert.deepEqual(r1.result.session.dropped, []);
    assert.deepEqual(r1.result.outputs.map((o) => o.data["text/plain"]), ["41"]);
    const r2 = await runTask(stack.client, { sessionId, code: "x + 1\n", limits: { timeoutMs: 30000 } });
    assert.equal(r2.result.status, "TASK_STATUS_SUCCEEDED", show(r2.result));
    assert.equal(r2.result.session.restoredFromStep, 1);
    assert.deepEqual(r2.result.outputs.map((o) => [o.kind, o.data["text/plain"]]), [["result", "42"]]);
  });

  test("ci run prints each output's text after stdout", async () => {
    const dir = mkdtempSync(join(tmpdir(), "ci-outputs-"));
    const script = join(dir, "t.py");
    writeFileSync(script, "print('hello')\ndisplay('shown')\n6 * 7\n");
    const env = { ...process.env, CI_NATS_URL: stack.server.url };
    const { stdout } = await run(CLI_BIN, ["run", "--no-save", script], { env, timeout: 60000 });
    assert.equal(stdout, "hello\n'shown'\n42\n");
  });

  test("ci run saves a figure shown inline as inline-N.png, beside (never over) an artifact, and --no-save does not", async () => {
    const dir = mkdtempSync(join(tmpdir(), "ci-outputs-"));
    const script = join(dir, "t.py");
    // A big figure becomes an artifact (output-1.png, the runtime's name);
    // the small one stays inline and is saved under its own name.
    writeFileSync(script, "import matplotlib.pyplot as plt\nbig, bx = plt.subplots(figsize=(10, 10), dpi=100)\n" +
      "import numpy as np\nbx.imshow(np.random.default_rng(1).random((800, 800)))\ndisplay(big)\n" +
      "fig, ax = plt.subplots(figsize=(2, 2))\nax.plot([1, 2])\nprint('drawn')\nfig\n");
    const env = { ...process.env, CI_NATS_URL: stack.server.url };
    const { stdout, stderr } = await run(CLI_BIN, ["run", script], { env, cwd: dir, timeout: 60000 });
    assert.match(stdout, /^drawn\n<Figure size 1000x1000 .*>\n\[image: artifact output-1\.png\]\n<Figure size 200x200 .*>\n\[image: output 2, inline PNG\]\n$/);
    assert.match(stderr, /saved output-1\.png \(\d+ bytes\)/);
    assert.match(stderr, /saved inline-2\.png \(\d+ bytes; the image of output 2\)/);
    const png = (f) => readFileSync(join(dir, f));
    for (const f of ["output-1.png", "inline-2.png"]) assert.ok(png(f).subarray(0, 8).equals(Buffer.from("\x89PNG\r\n\x1a\n", "latin1")), f);
    assert.ok(png("output-1.png").length > png("inline-2.png").length * 4);
    const other = mkdtempSync(join(tmpdir(), "ci-outputs-"));
    await run(CLI_BIN, ["run", "--no-save", script], { env, cwd: other, timeout: 60000 });
    assert.deepEqual(readdirSync(other), []);
  });
});
