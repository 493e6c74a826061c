// One test file's service: a nats-server, N workers, a connected client.
//
//   const stack = await startStack({ workers: 1, worker: { limits: {...} } });
//   after(() => stack.stop());
//   const { result } = await runTask(stack.client, { code: "print(1)" });
//
// The server gets max_payload 8MB, as the dev config does, so that a result
// with 1 MiB of stdout and 1 MiB of stderr fits in one KV value. stop() kills
// whatever is still running and never throws, so it is safe in after().
import { startNatsServer } from "./nats-server.mjs";
import { startWorker } from "./worker.mjs";
import { connectClient } from "./client.mjs";

export const SERVER_CONFIG = "max_payload: 8MB";

export async function startStack({ workers = 1, worker = {}, serverConfig = SERVER_CONFIG, jetstreamConfig } = {}) {
  const server = await startNatsServer({ config: serverConfig, jetstreamConfig });
  const stack = {
    server,
    workers: [],
    client: null,
    // Starts one more worker on this server; opts as for startWorker.
    async addWorker(opts = {}) {
      const w = await startWorker({ natsUrl: server.url, ...worker, ...opts });
      stack.workers.push(w);
      return w;
    },
    async stop() {
      if (stack.client) await stack.client.close().catch(() => {});
      // The workers stop at the same time: each drain takes a second or so
      // (a slot's fetch runs out first), whatever the others do.
      await Promise.all(stack.workers.map(async (w) => {
        // A worker still running must drain on SIGTERM and exit 0, and no
        // worker may have printed a sanitizer report (ASan, LSan at exit,
        // UBSan): that is how "no input leaks or corrupts memory" is checked.
        // stop() must not throw, so a failure marks the test file failed.
        let problem = null;
        if (!w.exited()) {
          const x = await w.stop("SIGTERM", 90000).catch((e) => ({ error: e }));
          if (x.error) problem = x.error.message;
          else if (x.code !== 0) problem = `exit code ${x.code}, signal ${x.signal} after SIGTERM`;
        }
        const log = w.logText();
        if (/ERROR: (Address|Leak)Sanitizer|runtime error: |SUMMARY: UndefinedBehaviorSanitizer/.test(log))
          problem = "a sanitizer report in its log";
        if (problem) {
          process.stderr.write(`worker ${w.id}: ${problem}; log:\n${log.slice(-20000)}\n`);
          process.exitCode = 1;
        } else if (process.env.CI_SHOW_WORKER_LOG) {
          process.stderr.write(`--- log of ${w.id} ---\n${log}\n`);
        }
        await w.cleanup().catch(() => {});
      }));
      await server.stop().catch(() => {});
    },
  };
  try {
    for (let i = 0; i < workers; i++) await stack.addWorker();
    stack.client = await connectClient(server.url);
    stack.client.check = () => {
      const dead = stack.workers.find((w) => w.crashed());
      if (dead) {
        const x = dead.exited();
        throw new Error(`worker ${dead.id} died (exit code ${x.code}, signal ${x.signal}); log:\n${dead.logText().slice(-8000)}`);
      }
      const gone = server.died?.();
      if (gone) throw new Error(`nats-server died (exit code ${gone.code}, signal ${gone.signal}); log:\n${server.logs().slice(-8000)}`);
      stack.client.checkConnection();
    };
  } catch (e) {
    await stack.stop();
    throw e;
  }
  return stack;
}
