// A real nats-server with JetStream for integration tests: its own store
// directory and a free loopback port (the server picks it: port -1, and tells
// us through its ports file, so two test files never race for one port).
//
//   const srv = await startNatsServer({ config: "max_payload: 8MB" });
//   ... srv.url ...
//   await srv.stop();
//
// Options:
//   config     extra nats-server config text appended to the generated file
//   jetstream  false to run without JetStream (default true)
//   jetstreamConfig  extra text inside the jetstream { } block (e.g. "max_file_store: 8MB")
//   monitor    true to open the HTTP monitor on a free port (srv.monitorUrl)
//   timeoutMs  how long to wait for the server to accept (default 15000)
//   bin        the nats-server binary (default $NATS_SERVER or "nats-server")
import { spawn } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

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

// Resolves once a TCP client gets the server's INFO line.
function probe(port) {
  return new Promise((resolve) => {
    const sock = connect({ host: "127.0.0.1", port });
    let buf = "";
    const done = (ok) => {
      sock.destroy();
      resolve(ok);
    };
    sock.setTimeout(1000, () => done(false));
    sock.on("data", (d) => {
      buf += d.toString();
      if (buf.startsWith("INFO ")) done(true);
    });
    sock.on("error", () => done(false));
  });
}

export async function startNatsServer(opts = {}) {
  const {
    config = "",
    jetstream = true,
    monitor = false,
    timeoutMs = 15000,
    bin = process.env.NATS_SERVER || "nats-server",
  } = opts;
  const dir = mkdtempSync(join(tmpdir(), "ci-nats-"));
  const conf = join(dir, "nats.conf");
  const lines = [
    "listen: 127.0.0.1:-1",
    `ports_file_dir: ${JSON.stringify(dir)}`,
    monitor ? "http: 127.0.0.1:-1" : "",
    jetstream ? `jetstream {\n  store_dir: ${JSON.stringify(join(dir, "js"))}\n  ${opts.jetstreamConfig ?? ""}\n}` : "",
    config,
  ];
  writeFileSync(conf, lines.filter(Boolean).join("\n") + "\n");

  const child = spawn(bin, ["-c", conf], { stdio: ["ignore", "ignore", "pipe"] });
  running.add(child);
  let log = "";
  child.stderr.on("data", (d) => {
    log = (log + d.toString()).slice(-64 * 1024);
  });
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

  const cleanupDir = () => rmSync(dir, { recursive: true, force: true });
  const fail = async (why) => {
    if (!exited) {
      child.kill("SIGKILL");
      await exitPromise;
    }
    cleanupDir();
    throw new Error(`nats-server did not start: ${why}\n${log}`);
  };

  const deadline = Date.now() + timeoutMs;
  let ports = null;
  while (!ports) {
    if (exited) {
      const e = exited.error ? exited.error.message : `exit ${exited.code} ${exited.signal ?? ""}`;
      return fail(e);
    }
    if (Date.now() > deadline) return fail(`no ports file after ${timeoutMs} ms`);
    const f = readdirSync(dir).find((n) => n.endsWith(".ports"));
    if (f) {
      try {
        ports = JSON.parse(readFileSync(join(dir, f), "utf8"));
      } catch {
        ports = null; // written but not complete yet
      }
    }
    if (!ports) await sleep(25);
  }
  const url = ports.nats[0];
  const port = Number(new URL(url).port);
  while (!(await probe(port))) {
    if (exited) return fail("exited while starting");
    if (Date.now() > deadline) return fail(`port ${port} does not answer`);
    await sleep(25);
  }

  let stopped = false;
  return {
    url,
    port,
    pid: child.pid,
    monitorUrl: monitor && ports.monitoring ? ports.monitoring[0] : undefined,
    dir,
    logs: () => log,
    // { code, signal } once it exited unasked, else null.
    died: () => (stopped ? null : exited),
    // Sends signal to the server (SIGSTOP freezes it with its connections
    // open, SIGCONT lets it go on) and returns at once; false when it has
    // exited.
    signal(signal) {
      if (exited) return false;
      return child.kill(signal);
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      if (!exited) {
        child.kill("SIGTERM");
        child.kill("SIGCONT"); // a frozen server must run to exit
        const t = setTimeout(() => child.kill("SIGKILL"), 5000);
        await exitPromise;
        clearTimeout(t);
      }
      cleanupDir();
    },
  };
}
