// Attack battery: the task's OOM score. When the task's cgroup runs out of
// memory, its OOM killer must take the code, never the sandbox's init. The
// task process raises its own score to 1000, which code may lower again; a
// worker with CAP_SYS_RESOURCE writes it itself, which also makes 1000 the
// lowest the code may set. Without that capability (some container
// runtimes take it from root) the file skips loudly; an OOM kill of init is
// then still reported as a memory failure (init_reach.test.mjs).
import { describe } from "node:test";
import { readFileSync } from "node:fs";

import { assert, show, startBattery } from "./lib/battery.mjs";

const b = await startBattery("oom_score");
// The worker (our child, same credentials) pins the task's OOM score only
// with CAP_SYS_RESOURCE, which some container runtimes take from root.
const CAP_SYS_RESOURCE = 24n;
const capEff = BigInt("0x" + (/^CapEff:\s*([0-9a-f]+)$/m.exec(readFileSync("/proc/self/status", "utf8"))?.[1] ?? "0"));
const canPin = ((capEff >> CAP_SYS_RESOURCE) & 1n) === 1n;

describe("oom_score", { concurrency: 1 }, () => {
  b.attack("the code cannot lower its OOM score below init's (a worker with CAP_SYS_RESOURCE pins it)", async () => {
    const code = `
def lower():
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("0")
attempt("lower", lower)
attempt("score", lambda: open("/proc/self/oom_score_adj").read().strip())
report()
`;
    const { result: r, report: rep } = await b.run(code);
    assert.equal(rep.lower.ok, false, `the code lowered its OOM score: ${show(r)}`);
    assert.equal(rep.lower.errno, 13, "EACCES");
    assert.equal(rep.score.value, "'1000'");
  }, { skip: canPin ? undefined : "the worker lacks CAP_SYS_RESOURCE here, so it cannot pin the task's OOM score (an OOM kill of init is still reported as a memory failure: init_reach)" });

});

b.finish();
