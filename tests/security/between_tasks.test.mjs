// Attack battery: between tasks. What one task leaves in /workspace, /tmp
// and /dev/shm, a poisoned module or font cache, a socket it listens on, is
// invisible to the next task and to a task running at the same time
// (worker concurrency 2).
import { describe } from "node:test";

import { assert, blockUntilReleased, newTaskId, rand, releaseMarker, show, startBattery, waitProcessWith } from "./lib/battery.mjs";

const b = await startBattery("between_tasks", { concurrency: 2 });

// Python: write the traces of a task tagged `tag`.
const leave = (tag) => `
import os, socket, glob
paths = ["/workspace/${tag}.csv", "/tmp/${tag}", "/dev/shm/${tag}", "/workspace/sub-${tag}/x.csv", "/tmp/.${tag}-hidden"]
os.makedirs("/workspace/sub-${tag}", exist_ok=True)
for p in paths:
    with open(p, "w") as f:
        f.write("${tag}")
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind("\\0${tag}")
listener.listen(1)
`;

// Python: look for the traces of `tag`; reports what was found.
const look = (tag) => `
import os, socket
found = {}
for p in ["/workspace/${tag}.csv", "/tmp/${tag}", "/dev/shm/${tag}", "/workspace/sub-${tag}/x.csv", "/tmp/.${tag}-hidden"]:
    found[p] = os.path.exists(p)
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect("\\0${tag}")
        return "CONNECTED"
    finally:
        s.close()
attempt("connect_${tag}", connect)
listing = {d: sorted(os.listdir(d)) for d in ("/workspace", "/tmp", "/dev/shm")}
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
`;

describe("between_tasks", { concurrency: 1 }, () => {
  b.attack("files in /workspace, /tmp and /dev/shm, a poisoned module and font cache, and a listening socket of an earlier task are gone", async () => {
    const tag = `a${rand()}`;
    const first = `${leave(tag)}
# Poison what the next task might import or read.
with open("/workspace/numpy.py", "w") as f:
    f.write("raise SystemExit('poisoned numpy')\\n")
with open("/workspace/sitecustomize.py", "w") as f:
    f.write("raise SystemExit('poisoned site')\\n")
for p in glob.glob("/tmp/matplotlib/*.json"):
    with open(p, "w") as f:
        f.write("{ not json")
os.makedirs("/workspace/.config/matplotlib", exist_ok=True)
with open("/workspace/.config/matplotlib/matplotlibrc", "w") as f:
    f.write("backend: nonexistent\\n")
${look(tag)}
report(found=found, fonts=glob.glob("/tmp/matplotlib/*.json"))
`;
    const { result: ra, report: repA } = await b.run(first);
    assert.equal(ra.status, "TASK_STATUS_SUCCEEDED", show(ra));
    // Control: the task sees its own traces (so "not found" below means gone).
    assert.ok(Object.values(repA.found).every(Boolean), `the first task sees its own files: ${JSON.stringify(repA.found)}`);
    assert.equal(repA[`connect_${tag}`].ok, true, `the first task reaches its own socket: ${JSON.stringify(repA)}`);

    const second = `${look(tag)}
import numpy, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
plt.plot([1, 2, 3])
plt.savefig("plot.png")
report(found=found, listing=listing, numpy=numpy.__file__, backend=matplotlib.get_backend())
`;
    const { result: rb, report: repB } = await b.run(second);
    assert.equal(rb.status, "TASK_STATUS_SUCCEEDED", show(rb));
    assert.deepEqual(Object.entries(repB.found).filter(([, v]) => v), [], `traces of the first task: ${JSON.stringify(repB.found)}`);
    assert.equal(repB[`connect_${tag}`].ok, false, "the first task's socket is gone");
    assert.deepEqual(repB.listing["/workspace"], [], `a fresh workspace: ${JSON.stringify(repB.listing)}`);
    assert.deepEqual(repB.listing["/dev/shm"], [], `a fresh /dev/shm: ${JSON.stringify(repB.listing)}`);
    assert.ok(repB.listing["/tmp"].every((n) => n === "matplotlib"), `a fresh /tmp: ${JSON.stringify(repB.listing)}`);
    assert.match(repB.numpy, /^\/usr\//, "numpy is the runtime's, not the poisoned one");
    assert.match(repB.backend, /agg/i);
    assert.ok(rb.artifacts.some((a) => a.name === "plot.png"), "matplotlib works: the font cache was not poisoned");
    assert.doesNotMatch(rb.stderr, /poisoned|not json|JSONDecodeError/);
  });

  b.attack("a task running at the same time sees none of the other's files, sockets or processes", async () => {
    const ta = `a${rand()}`;
    const tb = `b${rand()}`;
    // A leaves its traces, then waits until B has run beside it (the test
    // lets it go on), then looks for B's.
    const marker = b.marker();
    const codeA = `${leave(ta)}
${blockUntilReleased(marker)}
${look(tb)}
mine = {p: os.path.exists(p) for p in paths}
report(found=found, mine=mine, pids=pids)
`;
    const codeB = `${leave(tb)}
${look(ta)}
report(found=found, listing=listing, pids=pids)
`;
    const idA = newTaskId("a");
    const a = b.run(codeA, { taskId: idA, limits: { timeoutMs: 20000 } });
    // B goes in once A has written and waits (the worker has two slots).
    await b.client.waitStatus(idA, "TASK_STATUS_RUNNING", 20000);
    await waitProcessWith(marker, 20000);
    const { result: rb, report: repB } = await b.run(codeB);
    assert.equal(releaseMarker(marker), 1, "A still waited for B");
    const { result: ra, report: repA } = await a;
    assert.equal(ra.status, "TASK_STATUS_SUCCEEDED", show(ra));
    assert.equal(rb.status, "TASK_STATUS_SUCCEEDED", show(rb));
    // They really overlapped.
    assert.ok(rb.startedAtMs > ra.startedAtMs && rb.finishedAtMs < ra.finishedAtMs, `B ran while A ran: A ${ra.startedAtMs}-${ra.finishedAtMs}, B ${rb.startedAtMs}-${rb.finishedAtMs}`);
    assert.ok(Object.values(repA.mine).every(Boolean), "A still sees its own files at the end");
    assert.deepEqual(Object.entries(repA.found).filter(([, v]) => v), [], `A sees B's files: ${JSON.stringify(repA.found)}`);
    assert.deepEqual(Object.entries(repB.found).filter(([, v]) => v), [], `B sees A's files: ${JSON.stringify(repB.found)}`);
    assert.equal(repA[`connect_${tb}`].ok, false, "A reaches B's socket");
    assert.equal(repB[`connect_${ta}`].ok, false, "B reaches A's socket");
    assert.ok(repB.pids.length <= 3 && repA.pids.length <= 3, `each sees only its own processes: A ${repA.pids}, B ${repB.pids}`);
    assert.ok(!repB.listing["/workspace"].some((n) => n.includes(ta)), JSON.stringify(repB.listing));
  });
});

b.finish();
