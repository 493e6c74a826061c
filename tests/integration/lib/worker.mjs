// A real ci-worker process for integration tests.
//
//   const w = await startWorker({ natsUrl: srv.url, id: "w1", concurrency: 2,
//                                 limits: { max_timeout_ms: 60000 } });
//   ... w.lines() (parsed JSON log lines), w.configPath ...
//   const { code, signal } = await w.stop();      // SIGTERM, waits for the exit
//
// The worker's YAML config is written into a fresh temp dir from the options;
// section and key names are those of src/core/config.h (struct ci_config):
//   natsUrl        nats.url (required)
//   id             worker.id (default: a unique "itest-..." id)
//   concurrency    worker.concurrency (default 1)
//   nats, jetstream, worker, limits, local: objects merged into that section
//                  (e.g. local: { isolation: "required" })
//   env            extra environment variables for the worker
//   extraYaml      text appended to the generated YAML as is (e.g. comments)
//   readyTimeoutMs how long to wait for the "worker.ready" log line (default 90000:
//                  a loaded machine starting warm zygotes under ASan is slow)
//   onSpawn        called with the handle as soon as the process runs, before
//                  it is ready (to watch its log while it starts)
//   (worker.metrics_addr defaults to 127.0.0.1:0 here; handle.monitorUrl is
//   the base URL of /metrics, /healthz and /readyz, or null when "")
//   bin            the binary (default $CI_BUILD_DIR/ci-worker, CI_BUILD_DIR
//                  defaulting to /work/main/build)
//
// stdout and stderr of the worker go to <dir>/worker.log. Every worker still
// running when the test process exits is SIGKILLed.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

export const BUILD_DIR = process.env.CI_BUILD_DIR || "/work/main/build";
export const SOURCE_DIR = process.env.CI_SOURCE_DIR || new URL("../../..", import.meta.url).pathname.replace(/\/$/, "");
export const WORKER_BIN = join(BUILD_DIR, "ci-worker");
export const CLI_BIN = join(BUILD_DIR, "ci");

const running = new Set();
process.on("exit", () => {
  for (const child of running) {
    try {
      child.kill("SIGKILL");
    } catch {
      // already gone
    }
  }
});

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let serial = 0;

// YAML for one scalar: strings always double-quoted (JSON escaping is valid
// YAML), numbers and booleans plain.
function yamlScalar(v) {
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  if (typeof v === "bigint") return v.toString();
  return JSON.stringify(String(v));
}

export function workerYaml(sections) {
  const out = [];
  for (const [section, keys] of Object.entries(sections)) {
    const entries = Object.entries(keys ?? {}).filter(([, v]) => v !== undefined);
    if (entries.length === 0) continue;
    out.push(`${section}:`);
    for (const [k, v] of entries) out.push(`  ${k}: ${yamlScalar(v)}`);
  }
  return out.join("\n") + "\n";
}

// Parses the JSON lines of a log text; other lines are returned as { raw }.
export function parseLogLines(text) {
  const lines = [];
  for (const l of text.split("\n")) {
    if (!l.trim()) continue;
    try {
      lines.push(JSON.parse(l));
    } catch {
      lines.push({ raw: l });
    }
  }
  return lines;
}

export async function startWorker(opts = {}) {
  const {
    natsUrl,
    id = `itest-${process.pid}-${++serial}`,
    concurrency = 1,
    env = {},
    readyTimeoutMs = 90000,
    bin = WORKER_BIN,
  } = opts;
  if (!natsUrl) throw new Error("startWorker: natsUrl is required");
  if (!existsSync(bin)) throw new Error(`startWorker: ${bin} does not exist: build it first (cmake --build ${BUILD_DIR})`);

  const dir = mkdtempSync(join(tmpdir(), "ci-worker-"));
  const configPath = join(dir, "worker.yaml");
  const logPath = join(dir, "worker.log");
  const yaml = workerYaml({
    nats: { url: natsUrl, ...opts.nats },
    jetstream: { ...opts.jetstream },
    // metrics_addr: any free port, so that many workers share one machine.
    worker: { id, concurrency, metrics_addr: "127.0.0.1:0", ...opts.worker },
    limits: { ...opts.limits },
    sessions: { ...opts.sessions },
    local: { ...opts.local },
  }) + (opts.extraYaml ?? "");
  writeFileSync(configPath, yaml);

  const logFd = openSync(logPath, "a");
  // The worker's environment: ours minus CI_NATS_URL (it would override the
  // config), plus what the test asks for.
  const childEnv = { ...process.env };
  delete childEnv.CI_NATS_URL;
  Object.assign(childEnv, env);
  const child = spawn(bin, ["--config", configPath], {
    stdio: ["ignore", logFd, logFd],
    env: childEnv,
  });
  closeSync(logFd);
  running.add(child);
  let exited = null;
  const exitPromise = new Promise((resolve) => {
    child.on("exit", (code, signal) => {
      exited = { code, signal };
      running.delete(child);
      resolve(exited);
    });
    child.on("error", (e) => {
      exited = { code: null, signal: null, error: e };
      running.delete(child);
      resolve(exited);
    });
  });

  const logText = () => {
    try {
      return readFileSync(logPath, "utf8");
    } catch {
      return "";
    }
  };
  const lines = () => parseLogLines(logText());

  let stopRequested = false;
  const handle = {
    id,
    pid: child.pid,
    dir,
    configPath,
    logPath,
    yaml,
    logText,
    lines,
    exited: () => exited,
    // Exited although nobody asked it to stop: a crash.
    crashed: () => exited !== null && !stopRequested,
    exitPromise,
    // Log lines whose "event" is name.
    events: (name) => lines().filter((l) => l.event === name),
    // Waits (bounded) until a log line satisfies pred; returns it.
    async waitLog(pred, timeoutMs = 10000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const hit = lines().find(pred);
        if (hit) return hit;
        if (Date.now() > deadline) throw new Error(`worker ${id}: no matching log line within ${timeoutMs} ms; log:\n${logText()}`);
        await sleep(50);
      }
    },
    // Sends signal (SIGTERM by default) and waits for the exit, at most
    // timeoutMs; then SIGKILLs and throws. Returns { code, signal }.
    async stop(signal = "SIGTERM", timeoutMs = 30000) {
      stopRequested = true;
      if (!exited) {
        child.kill(signal);
        let timer;
        const timedOut = new Promise((resolve) => {
          timer = setTimeout(() => resolve("timeout"), timeoutMs);
        });
        const r = await Promise.race([exitPromise, timedOut]);
        clearTimeout(timer);
        if (r === "timeout") {
          child.kill("SIGKILL");
          await exitPromise;
          throw new Error(`worker ${id} did not exit within ${timeoutMs} ms of ${signal}; log:\n${logText()}`);
        }
      }
      return exited;
    },
    // Sends signal to the worker (SIGSTOP, SIGCONT...) and returns at once;
    // false when it has exited already.
    signal(signal) {
      if (exited) return false;
      return child.kill(signal);
    },
    // SIGKILL, no questions: for cleanup after failures.
    async kill() {
      stopRequested = true;
      if (!exited) {
        child.kill("SIGKILL");
        await exitPromise;
      }
      return exited;
    },
    // Kills the worker if needed and removes its temp dir, unless the
    // environment asks to keep it (CI_KEEP_TMP=1) for a post-mortem.
    async cleanup() {
      await handle.kill();
      if (!process.env.CI_KEEP_TMP) rmSync(dir, { recursive: true, force: true });
    },
  };

  if (opts.onSpawn) opts.onSpawn(handle);
  const deadline = Date.now() + readyTimeoutMs;
  for (;;) {
    const ready = lines().find((l) => l.event === "worker.ready");
    if (ready) {
      // http://127.0.0.1:PORT of /metrics, /healthz, /readyz (null when off).
      handle.monitorUrl = ready.metrics_addr ? `http://${ready.metrics_addr}` : null;
      break;
    }
    if (exited) {
      const why = exited.error ? exited.error.message : `exit code ${exited.code}, signal ${exited.signal}`;
      const text = logText();
      rmSync(dir, { recursive: true, force: true });
      throw new Error(`worker ${id} exited before it was ready (${why}); log:\n${text}`);
    }
    if (Date.now() > deadline) {
      const text = logText();
      await handle.cleanup();
      throw new Error(`worker ${id} was not ready within ${readyTimeoutMs} ms; log:\n${text}`);
    }
    await sleep(50);
  }
  return handle;
}
