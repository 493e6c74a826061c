// Attack battery: fresh state. A task must find the runtime as a fresh
// python3 would: in warm mode the zygote imported and exercised pandas,
// numpy and matplotlib before it forked the task (runtime/driver.py,
// _warm_prepare), and nothing of that may show beyond what a cache or an
// imported module is - no option, rcParam, warnings filter or registry entry,
// unit converter, open figure, font file, thread, fd, environment variable,
// file in /tmp, nor a random state shared with another task. The reference
// is a fresh `python3 -I -B` that the task starts itself, in the same
// sandbox, with the same environment: what the two see must be the same.
import { describe } from "node:test";
import { readdirSync, readFileSync } from "node:fs";

import { assert, show, sleep, startBattery } from "./lib/battery.mjs";
import { skipTest } from "../integration/lib/skip.mjs";

const b = await startBattery("fresh_state", { concurrency: 2 });

// Python: what a task can observe of the runtime's state, as the dict `fp`
// (printed as JSON by the fresh interpreter). Only this code's own imports
// and calls happen before it is taken.
const FINGERPRINT = String.raw`
import gc, json, linecache, os, sys, threading, warnings
import numpy as np
import pandas as pd
import matplotlib
import matplotlib.pyplot as plt
import matplotlib.units
import matplotlib.font_manager as fm
import dill._dill, dill.session

def _r(v):
    try:
        return repr(v)
    except Exception as e:
        return "<repr failed: %s>" % type(e).__name__

def _opt(k):
    try:
        return _r(pd.get_option(k))
    except Exception as e:
        return "<%s>" % type(e).__name__

def _environ_of_process():
    raw = open("/proc/self/environ", "rb").read().decode("utf-8", "replace")
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)

_umask = os.umask(0o22)
os.umask(_umask)
_cache_info = getattr(getattr(fm, "_get_font", None), "cache_info", None)
fp = {
    "pandas options": {k: _opt(k) for k in sorted(pd._config.config._registered_options)},
    "matplotlib rcParams": {k: _r(v) for k, v in sorted(matplotlib.rcParams.items())},
    "matplotlib backend": matplotlib.get_backend(),
    "open figures": plt.get_fignums(),
    "unit converters": sorted("%s -> %s.%s" % (_r(k), type(v).__module__, type(v).__name__)
                              for k, v in matplotlib.units.registry.items()),
    "font files cached": _cache_info().currsize if _cache_info else None,
    "numpy errors": np.geterr(),
    "numpy print options": {k: _r(v) for k, v in sorted(np.get_printoptions().items())},
    "warnings filters": [_r(f) for f in warnings.filters],
    "modules that recorded a warning": sorted(
        n for n, m in list(sys.modules.items())
        if isinstance(getattr(m, "__warningregistry__", None), dict)
        and set(m.__warningregistry__) - {"version"}),
    "threads": sorted(t.name for t in threading.enumerate()),
    "gc": [gc.isenabled(), list(gc.get_threshold())],
    "recursion limit": sys.getrecursionlimit(),
    "switch interval": sys.getswitchinterval(),
    "hooks": [sys.excepthook is sys.__excepthook__, sys.displayhook is sys.__displayhook__],
    "last exception": [hasattr(sys, a) for a in ("last_type", "last_value", "last_traceback")],
    "flags": _r(sys.flags),
    "cwd": os.getcwd(),
    "umask": _umask,
    "os.environ is the process's": dict(os.environ) == _environ_of_process(),
    "environment": sorted(os.environ.items()),
    "source lines cached": sorted(k for k in linecache.cache if k != "main.py"),
    "tmp": sorted(os.listdir("/tmp")),
    "dill's __main__ is the code's": dill._dill._main_module is sys.modules["__main__"]
        and dill.session._main_module is sys.modules["__main__"],
}
`;

// Each task, not only the battery's probe, must have run in the mode asked
// for: a warm task that fell back to a cold start would pass trivially.
function assertMode(report) {
  const mode = process.env.CI_SANDBOX_MODE;
  if (mode) assert.equal(report.warm, mode === "warm", `the task ran in ${mode} mode (pandas imported before its code: ${report.warm})`);
}

// Runs a task that compares what it sees of the runtime with a fresh
// python3's (FINGERPRINT), and checks that they are the same.
async function checkFresh() {
  const code = `
import json, os, subprocess, sys
_warm = "pandas" in sys.modules  # before this code imports it: the run came from a warm zygote
FINGERPRINT = ${JSON.stringify(FINGERPRINT)}
# The open fds, before anything here opens one: the driver's own are the
# three standard ones and the report channel, moved to 100 and up.
fds = {}
for name in os.listdir("/proc/self/fd"):
  try:
      fds[int(name)] = os.readlink("/proc/self/fd/" + name)
  except OSError:
      pass  # the listing's own, closed by now
exec(FINGERPRINT)
mine = fp
fresh = subprocess.run([sys.executable, "-I", "-B", "-c", FINGERPRINT + "print(json.dumps(fp))"],
                     capture_output=True, text=True, timeout=50)
report(warm=_warm, mine=json.loads(json.dumps(mine)), fresh=json.loads(fresh.stdout) if fresh.returncode == 0 else None,
     fresh_err=fresh.stderr[-2000:], fds=fds)
`;
  const { result, report } = await b.run(code, { limits: { timeoutMs: 60000 } });
  assert.equal(result.status, "TASK_STATUS_SUCCEEDED", show(result));
  assertMode(report);
  assert.ok(report.fresh, `the fresh python3 ran: ${report.fresh_err}`);
  // Control: the comparison sees something (a fresh interpreter has
  // pandas' options and matplotlib's rcParams too).
  assert.ok(Object.keys(report.fresh["pandas options"]).length > 50, "pandas options were read");
  assert.ok(Object.keys(report.fresh["matplotlib rcParams"]).length > 100, "rcParams were read");
  const differ = [];
  for (const [k, v] of Object.entries(report.fresh)) {
    if (JSON.stringify(report.mine[k]) === JSON.stringify(v)) continue;
    if (v && typeof v === "object" && !Array.isArray(v)) {
      const keys = new Set([...Object.keys(v), ...Object.keys(report.mine[k] ?? {})]);
      for (const kk of keys)
        if (JSON.stringify(report.mine[k]?.[kk]) !== JSON.stringify(v[kk]))
          differ.push(`${k} ${kk}: task ${JSON.stringify(report.mine[k]?.[kk])}, fresh ${JSON.stringify(v[kk])}`);
    } else {
      differ.push(`${k}: task ${JSON.stringify(report.mine[k])}, fresh ${JSON.stringify(v)}`);
    }
  }
  assert.deepEqual(differ, [], `the task's runtime differs from a fresh python3:\n${differ.join("\n")}`);
  assert.equal(report.mine["os.environ is the process's"], true);
  assert.deepEqual(report.mine.tmp.filter((n) => n !== "matplotlib"), [], "nothing in /tmp but matplotlib's font cache dir");
  assert.equal(report.mine.cwd, "/workspace");
  // No fd beyond 0-2 and the report channel (a pipe at 100 or above).
  const extra = Object.entries(report.fds).filter(([fd]) => Number(fd) > 2);
  assert.equal(extra.length, 1, `one fd beyond 0-2 (the report channel): ${JSON.stringify(report.fds)}`);
  assert.ok(Number(extra[0][0]) >= 100 && /^pipe:/.test(extra[0][1]), `the report channel: ${JSON.stringify(report.fds)}`);
  assert.match(report.fds[0], /\/dev\/null$/, "stdin is /dev/null");
}

// Children of pid (from /proc/<pid>/task/*/children).
function childrenOf(pid) {
  try {
    return readdirSync(`/proc/${pid}/task`).flatMap((t) =>
      readFileSync(`/proc/${pid}/task/${t}/children`, "utf8").split(" ").filter(Boolean).map(Number));
  } catch {
    return [];
  }
}

const comm = (pid) => { try { return readFileSync(`/proc/${pid}/comm`, "utf8").trim(); } catch { return ""; } };

// The task processes of the worker's spares (each zygote's children are
// spare inits, each with its task process), and for each whether it has
// run its warm-up: it has used CPU and waits in recvfrom() for its task
// (child_wait_byte), past the poll() of WARM_UP_DELAY_MS and the steps of
// ci_driver._warm_up (src/zygote/main.c, prefork_task_main).
function spares() {
  const out = [];
  for (const z of childrenOf(b.worker.pid).filter((p) => comm(p) === "ci-zygote"))
    for (const init of childrenOf(z))
      for (const task of childrenOf(init)) {
        try {
          const nr = Number(readFileSync(`/proc/${task}/syscall`, "utf8").split(" ")[0]);
          const stat = readFileSync(`/proc/${task}/stat`, "utf8");
          const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
          const ticks = Number(f[11]) + Number(f[12]); // utime, stime
          out.push({ task, warmed: nr === 45 /* recvfrom, x86_64 */ && ticks > 0, nr, ticks });
        } catch {
          // gone meanwhile
        }
      }
  return out;
}

describe("fresh_state", { concurrency: 1 }, () => {
  b.attack("a task finds options, rcParams, warnings, converters, figures, fds, environment and /tmp as a fresh python3 does", async () => {
    await checkFresh();
  });

  // Warm mode only (no spares in cold). A spare idle for 150 ms runs ci_driver._warm_up (pandas, the driver,
  // sessions, describe) in the very process that then takes a task: what
  // that left must not show either. Waits until every spare has warmed up.
  if (process.env.CI_SANDBOX_MODE === "warm") b.attack("a task taken by a spare that has run its idle warm-up finds the state a fresh python3 does", async (t) => {
    if (process.arch !== "x64") return skipTest(t, "the syscall number of recvfrom is x86_64's");
    const deadline = Date.now() + 120000;
    let seen = spares();
    while ((seen.length === 0 || !seen.every((s) => s.warmed)) && Date.now() < deadline) {
      await sleep(100);
      seen = spares();
    }
    if (seen.length === 0 || !seen.every((s) => s.warmed))
      return skipTest(t, `the spares did not warm up within 120 s (SCHED_IDLE on a busy machine?): ${JSON.stringify(seen)}`);
    await checkFresh();
  });

  b.attack("two tasks do not share a random state (random, numpy's legacy generator, a new Generator)", async () => {
    const code = `
import sys
_warm = "pandas" in sys.modules
import random
import numpy as np
report(warm=_warm, py=random.getrandbits(64), legacy=np.random.get_state()[1][:8].tolist(),
       legacy_draw=np.random.randint(0, 2**62), rng=int(np.random.default_rng().integers(0, 2**62)))
`;
    const runs = [];
    for (let i = 0; i < 3; i++) {
      const { result, report } = await b.run(code);
      assert.equal(result.status, "TASK_STATUS_SUCCEEDED", show(result));
      assertMode(report);
      runs.push(report);
    }
    for (const key of ["py", "legacy", "legacy_draw", "rng"]) {
      const seen = new Set(runs.map((r) => JSON.stringify(r[key])));
      assert.equal(seen.size, runs.length, `${key} differs in each task: ${JSON.stringify(runs.map((r) => r[key]))}`);
    }
  });
});

b.finish();
