#!/usr/bin/env node
// A stdio MCP server in Node with no dependencies, for the tests: the initialize
// handshake and tools/list + tools/call, as the SDK-written Node servers answer them.
// Installed by the tests as `node_modules/node-mcp/index.js` with `lib/answer.js` beside
// it (required at start: the package folder must be readable, not only this file).
"use strict";

const readline = require("readline");
const answer = require("./lib/answer.js");

const TOOLS = {
  wasm: {
    description: "Allocate a WebAssembly memory (V8 reserves ~10 GiB of address space).",
    run: () => {
      const memory = new WebAssembly.Memory({ initial: 16, maximum: 1024 });
      memory.grow(16);
      return `wasm memory of ${memory.buffer.byteLength} bytes`;
    },
  },
  allocate: {
    description: "Hold a buffer of `mb` MiB, written.",
    run: (args) => {
      globalThis.held = Buffer.alloc(args.mb << 20, 1);
      return `holding ${globalThis.held.length >> 20} MiB`;
    },
  },
  fetch: {
    description: "Fail as Node SDK servers do: a bare error, the why on stderr.",
    run: () => {
      process.stderr.write("fetch failed: getaddrinfo ENOTFOUND example.invalid\n");
      throw new Error("");
    },
  },
  answer: { description: "The answer from the package's own module.", run: () => answer() },
};

function send(message) {
  process.stdout.write(JSON.stringify({ jsonrpc: "2.0", ...message }) + "\n");
}

function handle(request) {
  const { id, method, params } = request;
  if (id === undefined) return; // a notification
  if (method === "initialize") {
    send({
      id,
      result: {
        protocolVersion: params.protocolVersion,
        capabilities: { tools: {} },
        serverInfo: { name: "node-mcp", version: "1.0.0" },
      },
    });
  } else if (method === "tools/list") {
    const tools = Object.entries(TOOLS).map(([name, tool]) => ({
      name,
      description: tool.description,
      inputSchema: { type: "object", properties: { mb: { type: "integer" } } },
    }));
    send({ id, result: { tools } });
  } else if (method === "tools/call") {
    const tool = TOOLS[params.name];
    try {
      const text = tool.run(params.arguments || {});
      send({ id, result: { content: [{ type: "text", text }] } });
    } catch (error) {
      const text = `Error executing tool ${params.name}${error.message ? ": " + error.message : ""}`;
      send({ id, result: { content: [{ type: "text", text }], isError: true } });
    }
  } else if (method === "ping") {
    send({ id, result: {} });
  } else {
    send({ id, error: { code: -32601, message: `Method not found: ${method}` } });
  }
}

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  if (line.trim()) handle(JSON.parse(line));
});
