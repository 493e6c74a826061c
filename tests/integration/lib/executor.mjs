// Fixtures for the cloudrun provider's tests, all on loopback:
//
//   const ex = await startExecutor({ limits: { max_input_bytes: 1048576 } });
//   ex.url, ex.lines(), await ex.healthz(), await ex.stop()
//       a real ci-executor on a free port (it binds port 0 and logs the port),
//       or on opts.port (an executor started again where it was); with
//       executor.auth none unless opts.executor says otherwise;
//       opts.noUserns = { uid } runs it where user namespaces cannot be
//       created (lib/nouserns.py), as uid (0 = root);
//   const { code, lines } = await runExecutorToExit(opts)
//       the same, for an executor that must refuse to start;
//   const md = await startMetadataServer({ lifetimeS: 3600 });
//   md.url (the identity endpoint), md.hits, md.tokens, md.lifetimeS = 4
//       a stand-in for the GCE metadata server: GET ...?audience=A&format=full
//       with Metadata-Flavor: Google answers a JWT-shaped token whose payload
//       has aud = A and exp = now + lifetimeS, and a random signature - or,
//       with { signer: { privateKey, kid }, claims }, a real RS256 token
//       with those claims added (signJwt); with failStatus (e.g. 500) it
//       answers that status instead (md.failed counts);
//   const px = await startProxy(ex.url, { fault: (n, req) => ... });
//   px.url, px.count("/execute"), px.auths
//       an HTTP proxy in front of the executor that counts requests, keeps
//       their Authorization headers, and can answer instead of forwarding
//       (fault returns { status, body }, or { destroy: true } to close the
//       connection without an answer once the request is read, or null to
//       forward); with tls: { key, cert } it speaks HTTPS (px.url https://);
//   const c = selfSignedCert(dir)
//       c.key, c.cert (PEM) and c.certPath for 127.0.0.1, from the openssl CLI.
//
// Every child still running when the test process exits is SIGKILLed.
import { spawn, spawnSync } from "node:child_process";
import { randomBytes, sign as cryptoSign } from "node:crypto";
import { chmodSync, existsSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, request } from "node:http";
import { createServer as createTlsServer } from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { BUILD_DIR, parseLogLines, workerYaml } from "./worker.mjs";

export const EXECUTOR_BIN = join(BUILD_DIR, "ci-executor");
export const NOUSERNS = join(import.meta.dirname ?? new URL(".", import.meta.url).pathname, "nouserns.py");

// Whether lib/nouserns.py can take user namespaces away here: "" when it
// can, else why not.
export function nousernsUnavailable() {
  const r = spawnSync("python3", [NOUSERNS, "--check"], { encoding: "utf8" });
  return r.status === 0 && r.stdout.trim() === "ok" ? "" : (r.stderr || r.error?.message || `exit ${r.status}`).trim();
}
export const IDENTITY_PATH = "/computeMetadata/v1/instance/service-accounts/default/identity";

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

// A ci-executor with the given config sections (worker.yaml format: limits,
// local, worker), listening on 127.0.0.1 and a free port.
function spawnExecutor(opts) {
  const { env = {}, bin = EXECUTOR_BIN, port = 0 } = opts;
  if (!existsSync(bin)) throw new Error(`startExecutor: ${bin} does not exist: build it first`);
  const dir = mkdtempSync(join(tmpdir(), "ci-executor-"));
  const configPath = join(dir, "executor.yaml");
  const logPath = join(dir, "executor.log");
  const executor = opts.executor ?? { auth: "none" };
  writeFileSync(configPath, workerYaml({ worker: { ...opts.worker }, limits: { ...opts.limits }, local: { ...opts.local }, executor }));
  // An unprivileged executor must read its config.
  chmodSync(dir, 0o755);
  chmodSync(configPath, 0o644);
  const logFd = openSync(logPath, "a");
  const args = ["--config", configPath, "--listen", "127.0.0.1", "--port", String(port)];
  const [cmd, argv] = opts.noUserns ? ["python3", [NOUSERNS, String(opts.noUserns.uid ?? 0), bin, ...args]] : [bin, args];
  const child = spawn(cmd, argv, {
    stdio: ["ignore", logFd, logFd],
    env: { ...process.env, ...env },
  });
  closeSync(logFd);
  return { child, dir, logPath };
}

// For an executor that must not start: its exit code and log.
export async function runExecutorToExit(opts = {}) {
  const { child, dir, logPath } = spawnExecutor(opts);
  running.add(child);
  const t = setTimeout(() => child.kill("SIGKILL"), opts.timeoutMs ?? 30000);
  const [code, signal] = await new Promise((resolve) => child.on("exit", (c, s) => resolve([c, s])));
  clearTimeout(t);
  running.delete(child);
  const text = readFileSync(logPath, "utf8");
  if (!process.env.CI_KEEP_TMP) rmSync(dir, { recursive: true, force: true });
  return { code, signal, text, lines: parseLogLines(text) };
}

export async function startExecutor(opts = {}) {
  // 90 s as for a worker (lib/worker.mjs): a warm executor's start (the
  // probe, the font cache's run, a zygote's imports, its first task) under
  // ASan took over 30 s when the suite began beside two CPU burners.
  const { readyTimeoutMs = 90000 } = opts;
  const { child, dir, logPath } = spawnExecutor(opts);
  running.add(child);
  let exited = null;
  const exitPromise = new Promise((resolve) => {
    child.on("exit", (code, signal) => {
      exited = { code, signal };
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
  const deadline = Date.now() + readyTimeoutMs;
  let ready = null;
  while (!(ready = lines().find((l) => l.event === "executor.ready"))) {
    const fail = (why) => {
      const text = logText();
      if (!process.env.CI_KEEP_TMP) rmSync(dir, { recursive: true, force: true });
      return new Error(`${why}:\n${text}`);
    };
    if (exited) throw fail(`ci-executor exited before it was ready (${JSON.stringify(exited)})`);
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw fail(`ci-executor not ready within ${readyTimeoutMs} ms`);
    }
    await sleep(50);
  }
  const url = `http://127.0.0.1:${ready.port}`;
  const handle = {
    url,
    port: ready.port,
    pid: child.pid,
    dir,
    logText,
    lines,
    exited: () => exited,
    signal: (sig) => child.kill(sig),
    async healthz() {
      const r = await fetch(`${url}/healthz`);
      return r.json();
    },
    // SIGTERM (or signal), waits for the exit.
    async stop(signal = "SIGTERM") {
      if (!exited) {
        child.kill(signal);
        const t = setTimeout(() => child.kill("SIGKILL"), 20000);
        await exitPromise;
        clearTimeout(t);
      }
      return exited;
    },
    async cleanup() {
      await handle.stop("SIGKILL");
      if (!process.env.CI_KEEP_TMP) rmSync(dir, { recursive: true, force: true });
    },
  };
  return handle;
}

const b64url = (x) => Buffer.from(x).toString("base64url");

// A compact JWS: RS256 with privateKey unless header.alg says otherwise
// (then signature is used as given: for tokens that must be refused).
export function signJwt(payload, { privateKey, kid = "itest", header = {}, signature } = {}) {
  const h = { alg: "RS256", kid, typ: "JWT", ...header };
  const input = `${b64url(JSON.stringify(h))}.${b64url(JSON.stringify(payload))}`;
  const sig = signature ?? cryptoSign("sha256", Buffer.from(input), privateKey);
  return `${input}.${b64url(sig)}`;
}

export async function startMetadataServer({ lifetimeS = 3600, signer = null, claims = {}, failStatus = 0 } = {}) {
  const md = {
    lifetimeS,
    failStatus,
    failed: 0,
    hits: 0,
    tokens: [], // every token issued, in order
    issuedAt: [], // Date.now() of each
    audiences: [],
    refused: 0,
    url: null,
  };
  const server = createServer((req, res) => {
    const u = new URL(req.url, "http://x");
    if (u.pathname !== IDENTITY_PATH || req.method !== "GET") {
      res.writeHead(404).end("not found");
      return;
    }
    if (req.headers["metadata-flavor"] !== "Google") {
      md.refused++;
      res.writeHead(403).end("Missing Metadata-Flavor:Google header");
      return;
    }
    if (md.failStatus) {
      md.failed++;
      res.writeHead(md.failStatus, { "Content-Type": "text/plain" }).end("injected metadata server failure");
      return;
    }
    md.hits++;
    const aud = u.searchParams.get("audience");
    md.audiences.push({ audience: aud, format: u.searchParams.get("format") });
    const now = Math.floor(Date.now() / 1000);
    const header = { alg: "RS256", kid: "itest", typ: "JWT" };
    const payload = { aud, azp: "itest", exp: now + md.lifetimeS, iat: now, iss: "https://accounts.google.com", sub: "1234567890", ...claims };
    const token = signer
      ? signJwt(payload, signer)
      : `${b64url(JSON.stringify(header))}.${b64url(JSON.stringify(payload))}.${b64url("SECRET-SIGNATURE-" + randomBytes(24).toString("hex"))}`;
    md.tokens.push(token);
    md.issuedAt.push(Date.now());
    res.writeHead(200, { "Content-Type": "text/html; charset=utf-8", "Metadata-Flavor": "Google" }).end(token);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  md.url = `http://127.0.0.1:${server.address().port}${IDENTITY_PATH}`;
  md.close = () => new Promise((resolve) => server.close(() => resolve()));
  return md;
}

// fault(n, info) is called for every request (n counts per path from 1,
// info = { method, path, headers }); it returns null to forward the request
// or { status, body, headers } to answer it instead.
export async function startProxy(target, { fault = () => null, tls = null } = {}) {
  const t = new URL(target);
  const px = {
    counts: new Map(),
    auths: [], // Authorization header of each /execute, in order
    url: null,
    count: (path) => px.counts.get(path) ?? 0,
  };
  const handler = (req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const path = new URL(req.url, "http://x").pathname;
      const n = (px.counts.get(path) ?? 0) + 1;
      px.counts.set(path, n);
      if (path === "/execute") px.auths.push(req.headers.authorization ?? null);
      const f = fault(n, { method: req.method, path, headers: req.headers });
      if (f?.destroy) {
        req.socket.destroy();
        return;
      }
      if (f) {
        res.writeHead(f.status, { "Content-Type": "application/json", ...(f.headers ?? {}) }).end(f.body ?? "");
        return;
      }
      const body = Buffer.concat(chunks);
      const headers = { ...req.headers, host: t.host, "content-length": String(body.length) };
      delete headers.expect;
      delete headers.connection;
      const up = request({ host: t.hostname, port: t.port, method: req.method, path: req.url, headers }, (ur) => {
        const h = { ...ur.headers };
        delete h.connection;
        delete h["transfer-encoding"];
        const parts = [];
        ur.on("data", (c) => parts.push(c));
        ur.on("end", () => {
          const b = Buffer.concat(parts);
          h["content-length"] = String(b.length);
          res.writeHead(ur.statusCode, h).end(b);
        });
      });
      up.on("error", () => {
        if (!res.headersSent) res.writeHead(502, { "Content-Type": "application/json" }).end('{"error":"proxy: upstream failed"}');
      });
      // The worker giving up (cancel, timeout) closes its side: pass it on.
      res.on("close", () => {
        if (!res.writableFinished) up.destroy();
      });
      up.end(body);
    });
  };
  const server = tls ? createTlsServer({ key: tls.key, cert: tls.cert }, handler) : createServer(handler);
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  px.url = `${tls ? "https" : "http"}://127.0.0.1:${server.address().port}`;
  px.close = () =>
    new Promise((resolve) => {
      server.closeAllConnections?.();
      server.close(() => resolve());
    });
  return px;
}

// A self-signed certificate for 127.0.0.1 (P-256, one day) in dir.
export function selfSignedCert(dir) {
  const keyPath = join(dir, "key.pem");
  const certPath = join(dir, "cert.pem");
  const r = spawnSync("openssl", ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-keyout", keyPath, "-out", certPath, "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`openssl req failed: ${r.error ?? r.stderr}`);
  return { key: readFileSync(keyPath), cert: readFileSync(certPath), certPath };
}

// A loopback port where nothing listens (bound, then released).
export async function closedPort() {
  const s = createServer();
  await new Promise((resolve) => s.listen(0, "127.0.0.1", resolve));
  const port = s.address().port;
  await new Promise((resolve) => s.close(resolve));
  return port;
}

// The cloudrun section of a worker's YAML, for startWorker's extraYaml.
export function cloudrunYaml(keys) {
  return workerYaml({ cloudrun: keys });
}
