// An official MCP SDK client connected to `ci mcp` (tests and bench).
//
//   const { client, problems } = await mcpClient(url, dir);
//   const r = await client.callTool({ name: "run_python", arguments: { code: "print(1)" } });
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

import { CLI_BIN } from "./worker.mjs";

// Connects an SDK client to `ci mcp --url URL extra...` run in cwd.
export async function mcpClient(url, cwd, extra = []) {
  const transport = new StdioClientTransport({
    command: CLI_BIN,
    args: ["mcp", "--url", url, ...extra],
    cwd,
    env: { PATH: process.env.PATH, TMPDIR: cwd },
    stderr: "pipe",
  });
  const client = new Client({ name: "ci-test", version: "1.0.0" });
  const problems = [];
  // The SDK runs a notification's handler a microtask after the message,
  // a response's at once: a progress notification that reaches it in the
  // same read as the result (written just before it, as the protocol
  // wants) finds its handler gone. Not a protocol problem of ours.
  client.onerror = (e) => {
    if (!/Received a progress notification for an unknown token/.test(String(e))) problems.push(String(e));
  };
  await client.connect(transport);
  return { client, problems };
}
