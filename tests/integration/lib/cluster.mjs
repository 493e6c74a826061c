// A JetStream cluster of real nats-servers on loopback, for the chaos tests:
// each node has a unique server_name, its own client, route and monitor
// port and store dir; routes list every other node; cluster name "ci-test".
// R3 streams need 2 of 3 nodes up.
//
//   const cl = await startCluster({ nodes: 3 });
//   cl.url            "nats://127.0.0.1:P1,nats://127.0.0.1:P2,..." (worker config)
//   cl.urls           the same as an array (nats.js)
//   cl.nodes[i]       { name, port, url, monitorUrl, dir, running(), kill(sig), start(), logs() }
//   await cl.jsz(i)   /jsz of node i (JSON), or null when it does not answer
//   await cl.connz(i) /connz of node i, the same way
//   await cl.stop()   stops every node and removes the store dirs
//
// A node keeps its ports and store dir across kill() and start(), as a pod
// with a persistent volume would.
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { SERVER_CONFIG } from "./stack.mjs";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

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

// A port that was free a moment ago (the kernel picks it; we close it and
// hand it to nats-server, which needs fixed route ports known up front).
function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.unref();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

async function getJson(url, timeoutMs = 2000) {
  const ctl = new AbortController();
  const t = setTimeout(() => ctl.abort(), timeoutMs);
  try {
    const r = await fetch(url, { signal: ctl.signal });
    if (!r.ok) return null;
    return await r.json();
  } catch {
    return null;
  } finally {
    clearTimeout(t);
  }
}

export async function startCluster({ nodes = 3, config = SERVER_CONFIG, bin = process.env.NATS_SERVER || "nats-server", timeoutMs = 30000 } = {}) {
  const root = mkdtempSync(join(tmpdir(), "ci-cluster-"));
  const specs = [];
  const used = new Set();
  const port = async () => {
    for (;;) {
      const p = await freePort();
      if (!used.has(p)) {
        used.add(p);
        return p;
      }
    }
  };
  for (let i = 0; i < nodes; i++) {
    specs.push({ name: `n${i + 1}`, port: await port(), routePort: await port(), monitorPort: await port() });
  }
  const handles = specs.map((spec) => {
    const dir = join(root, spec.name);
    mkdirSync(dir, { recursive: true });
    const routes = specs.filter((s) => s !== spec).map((s) => `"nats-route://127.0.0.1:${s.routePort}"`);
    const conf = join(dir, "nats.conf");
    writeFileSync(
      conf,
      [
        `server_name: "${spec.name}"`,
        `listen: "127.0.0.1:${spec.port}"`,
        `http: "127.0.0.1:${spec.monitorPort}"`,
        `jetstream { store_dir: ${JSON.stringify(join(dir, "js"))} }`,
        `cluster { name: "ci-test", listen: "127.0.0.1:${spec.routePort}", routes: [${routes.join(", ")}] }`,
        config,
      ].join("\n") + "\n",
    );
    let child = null;
    let exitPromise = null;
    let log = "";
    const node = {
      ...spec,
      dir,
      url: `nats://127.0.0.1:${spec.port}`,
      monitorUrl: `http://127.0.0.1:${spec.monitorPort}`,
      running: () => child !== null,
      logs: () => log,
      start() {
        if (child) return;
        const c = spawn(bin, ["-c", conf], { stdio: ["ignore", "ignore", "pipe"] });
        child = c;
        running.add(c);
        c.stderr.on("data", (d) => {
          log = (log + d.toString()).slice(-256 * 1024);
        });
        exitPromise = new Promise((resolve) => {
          c.on("exit", (code, signal) => {
            running.delete(c);
            if (child === c) child = null;
            resolve({ code, signal });
          });
        });
      },
      // Sends sig (SIGKILL by default) and waits for the exit.
      async kill(sig = "SIGKILL") {
        if (!child) return null;
        const p = exitPromise;
        child.kill(sig);
        const t = setTimeout(() => child?.kill("SIGKILL"), 10000);
        const r = await p;
        clearTimeout(t);
        return r;
      },
      // Waits until the node answers /healthz (JetStream included).
      async waitHealthy(ms = timeoutMs) {
        const deadline = Date.now() + ms;
        for (;;) {
          const h = await getJson(`${node.monitorUrl}/healthz`);
          if (h && h.status === "ok") return;
          if (!child) throw new Error(`nats-server ${spec.name} exited while starting:\n${log}`);
          if (Date.now() > deadline) throw new Error(`nats-server ${spec.name} not healthy within ${ms} ms:\n${log.slice(-4000)}`);
          await sleep(100);
        }
      },
    };
    return node;
  });

  const cluster = {
    nodes: handles,
    urls: handles.map((n) => n.url),
    url: handles.map((n) => n.url).join(","),
    dir: root,
    jsz: (i, query = "") => getJson(`${handles[i].monitorUrl}/jsz${query}`),
    // /connz of node i (its open client connections), or null when it does not answer.
    connz: (i, query = "") => getJson(`${handles[i].monitorUrl}/connz${query}`),
    // The name of the JetStream meta leader, as any running node sees it.
    async metaLeader() {
      for (let i = 0; i < handles.length; i++) {
        if (!handles[i].running()) continue;
        const j = await cluster.jsz(i);
        const l = j?.meta_cluster?.leader;
        if (l) return l;
      }
      return null;
    },
    node: (name) => handles.find((n) => n.name === name),
    async stop() {
      await Promise.all(handles.map((n) => n.kill("SIGTERM").catch(() => {})));
      if (!process.env.CI_KEEP_TMP) rmSync(root, { recursive: true, force: true });
    },
  };

  try {
    for (const n of handles) n.start();
    for (const n of handles) await n.waitHealthy();
    const deadline = Date.now() + timeoutMs;
    while (!(await cluster.metaLeader())) {
      if (Date.now() > deadline) throw new Error("the cluster elected no JetStream meta leader");
      await sleep(200);
    }
  } catch (e) {
    await cluster.stop();
    throw e;
  }
  return cluster;
}
