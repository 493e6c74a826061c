// Attack battery: input file names. A name that is a path, a dot name, or
// holds a NUL, a newline or a control character, or is 300 bytes long, is
// refused before anything is opened, and so is one with a character that is
// invisible or reorders text (U+202E, U+200B, U+FEFF, U+2028, tags): the
// task is FAILED with an error that says what is wrong with the name, the
// code never runs (no RUNNING event, no exit code, no output), and nothing
// is created on the host.
import { describe } from "node:test";
import { existsSync, readdirSync } from "node:fs";

import { assert, newTaskId, rand, show, startBattery } from "./lib/battery.mjs";

const b = await startBattery("input_names");

// Host places a name escaping the workspace could land in.
function hostPlaces(u) {
  return [`/${u}`, `/tmp/${u}`, `/var/tmp/${u}`, `/dev/shm/${u}`, `${process.cwd()}/${u}`, `/proc/${b.worker.pid}/cwd/${u}`, `${b.worker.dir}/${u}`];
}

function hostHasAnything(u) {
  const hits = hostPlaces(u).filter((p) => existsSync(p));
  // A bare-mode task directory would sit in /tmp: look one level down too.
  for (const d of readdirSync("/tmp")) {
    if (d.startsWith("ci-task-") && existsSync(`/tmp/${d}/${u}`)) hits.push(`/tmp/${d}/${u}`);
  }
  return hits;
}

const u = () => `ci-sec-${rand()}`;
const cases = [
  // [label, name(u), error regexps, encoding]
  ["../x", (x) => `../${x}`, [/input/i, /path/i]],
  ["../../x", (x) => `../../${x}`, [/input/i, /path/i]],
  ["/abs", (x) => `/tmp/${x}`, [/input/i, /path/i]],
  ["..", () => "..", [/input/i, /'\.'/]],
  [".", () => ".", [/input/i, /'\.'/]],
  ["a name with a NUL (protobuf)", (x) => `${x}\0.csv`, [/NUL/]],
  ["a name with a NUL (JSON)", (x) => `${x}\0.csv`, [/NUL/], "json"],
  ["a name with a newline", (x) => `${x}\n.csv`, [/input/i, /letters, digits/]],
  ["a name with a newline (JSON)", (x) => `${x}\n.csv`, [/input/i, /letters, digits/], "json"],
  ["a name with an ANSI escape", (x) => `\x1b[31m${x}.csv`, [/input/i, /letters, digits/]],
  ["a name of 300 bytes", (x) => `${x}-${"n".repeat(300 - x.length - 1)}`, [/input/i, /128/]],
  ["a/b", (x) => `${x}/b.csv`, [/input/i, /path/i]],
  ["a backslash", (x) => `..\\${x}`, [/input/i, /path/i]],
  ["an empty name", () => "", [/input file 1 has no name/i]],
  [".hidden", (x) => `.${x}`, [/input/i, /start with '\.'/]],
  // Invisible or reordering characters: the error names the one it found.
  ["a bidi override U+202E", (x) => `${x}\u202egnp.csv`, [/input/i, /U\+202E/, /control or format character/]],
  ["a bidi override U+202E (JSON)", (x) => `${x}\u202egnp.csv`, [/input/i, /U\+202E/], "json"],
  ["a zero-width space U+200B", (x) => `${x}\u200b.csv`, [/input/i, /U\+200B/]],
  ["a BOM U+FEFF", (x) => `\ufeff${x}.csv`, [/input/i, /U\+FEFF/]],
  ["a line separator U+2028", (x) => `${x}\u2028.csv`, [/input/i, /U\+2028/]],
  ["a tag character U+E0041", (x) => `${x}\u{e0041}.csv`, [/input/i, /U\+E0041/]],
  ["a C1 control U+009B", (x) => `${x}\u009b2J.csv`, [/input/i, /U\+009B/]],
];

describe("input_names", { concurrency: 8 }, () => {
  for (const [label, mk, res, encoding] of cases) {
    for (const source of ["content", "object"]) {
      b.attack(`input name ${label} (${source}) is refused before anything is opened`, async () => {
        const x = u();
        const name = mk(x);
        const file = source === "content" ? { name, content: Buffer.from("a,b\n1,2\n") } : { name, object: `inputs/${x}/data.csv` };
        if (source === "object") await b.client.putObject(`inputs/${x}/data.csv`, "a,b\n1,2\n");
        const taskId = newTaskId("name");
        // The code would write a marker on the host path if it ever ran.
        const code = `open("/tmp/${x}-ran", "w").write("ran")\nprint("RAN ${x}")`;
        const { result: r, raw } = await b.run(code, { taskId, files: [file], json: encoding === "json", ran: false, prelude: false });
        assert.equal(r.status, "TASK_STATUS_FAILED", show(r));
        for (const re of res) assert.match(r.error, re, show(r));
        assert.ok(r.error.length < 1024, "one sentence");
        assert.equal(r.exitCode, undefined, `the code never ran: ${show(r)}`);
        assert.equal(r.stdout, "");
        assert.doesNotMatch(JSON.stringify(raw), /RAN /);
        assert.deepEqual(r.artifacts, []);
        // Control characters of the name never reach the agent raw.
        assert.doesNotMatch(r.error, /[\0\n\x1b\u0080-\u009f\u200b-\u200f\u2028-\u202e\ufeff]|\u{e0041}/u, "the error quotes the name safely");
        const evs = await b.client.events(taskId);
        assert.deepEqual(evs.map((e) => e.event.status), ["TASK_STATUS_FAILED"], "no RUNNING: refused before the sandbox");
        assert.deepEqual(hostHasAnything(x), [], "something was created on the host");
        assert.equal(existsSync(`/tmp/${x}-ran`), false);
      });
    }
  }

  b.attack("a valid name right next to the bad ones is accepted (control)", async () => {
    const x = u();
    const { result: r } = await b.run(`print(open("${x}.csv").read(), end="")`, { files: [{ name: `${x}.csv`, content: Buffer.from("a,b\n") }] });
    assert.equal(r.status, "TASK_STATUS_SUCCEEDED", show(r));
    assert.match(r.stdout, /a,b\n$/);
    assert.deepEqual(hostHasAnything(`${x}.csv`), []);
  });
});

b.finish();
