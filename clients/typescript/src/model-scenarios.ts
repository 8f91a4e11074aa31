// The model-driven agent's scenarios, driven by the Rust end-to-end tests
// (tests/tests/e2e/model_clients.rs) against a real cluster; the Python library has the same
// program (clients/python/tests/model_scenarios.py), whose docstring says what it does.
//
//   node dist/model-scenarios.js --execution HOST:PORT --roster HOST:PORT --workspace DIR --outside FILE

import * as readline from "node:readline";
import { parseArgs } from "node:util";

import { modelAgent } from "./model-agent.js";
import { FakeModel, anthropicText, openaiText, openaiToolCalls, toolResults } from "./testing.js";
import { type ProvidedTool, Worker } from "./worker.js";

const { values } = parseArgs({
  options: {
    execution: { type: "string" },
    roster: { type: "string" },
    workspace: { type: "string" },
    outside: { type: "string" },
  },
});
const outside = values.outside!;

const servers: Record<string, FakeModel> = {
  tools: await FakeModel.start((request) => {
    const done = toolResults(request);
    if (done === 0) {
      return openaiToolCalls(
        [
          ["word_count", { text: "three little words" }],
          ["read_file", { path: "../secret.txt" }],
          ["read_file", { path: outside }],
          ["read_file", { path: "escape/secret.txt" }],
          ["read_file", { path: "link-out" }],
        ],
        100,
        10,
      );
    }
    if (done === 5) {
      return openaiToolCalls(
        [
          ["write_file", { path: "out/draft.md", content: "draft" }],
          ["append_file", { path: "out/draft.md", content: " and more" }],
          ["list_files", { path: "out" }],
          ["move_file", { from: "out/draft.md", to: "final/draft.md" }],
          ["read_file", { path: "final/draft.md" }],
        ],
        200,
        20,
      );
    }
    return openaiText('{"done": true, "summary": "drafted"}', 300, 30);
  }),
  looping: await FakeModel.start(() => openaiToolCalls([["list_files", { path: "" }]], 10, 1)),
  limited: await FakeModel.start((request) =>
    request.index === 0 ? { status: 429, headers: [["retry-after", "1"]], body: "rate limited" } : anthropicText("fine after waiting", 5, 2),
  ),
  hanging: await FakeModel.start(() => "hang"),
};
console.log(JSON.stringify({ servers: Object.fromEntries(Object.entries(servers).map(([name, server]) => [name, server.url])) }));

const wordCount: ProvidedTool = {
  name: "word_count",
  description: "Counts the words of a text",
  inputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
  run: async (input) => ({ words: String(input.text).split(/\s+/).filter(Boolean).length }),
};

let worker: Worker | undefined;
const lines = readline.createInterface({ input: process.stdin });
for await (const line of lines) {
  const command = line.trim();
  if (worker === undefined) {
    const agents = JSON.parse(command) as Record<string, string>;
    const behaviour = modelAgent({ workspace: values.workspace!, roster: values.roster });
    worker = new Worker({ execution: values.execution!, agents, behaviour, tools: [wordCount], name: "typescript-model-worker" }).start();
    await worker.ready;
    console.log(JSON.stringify({ serving: Object.keys(agents).length }));
  } else if (command === "requests") {
    const requests = Object.fromEntries(Object.entries(servers).map(([name, server]) => [name, server.requests()]));
    const abandoned = Object.fromEntries(Object.entries(servers).map(([name, server]) => [name, server.abandoned()]));
    console.log(JSON.stringify({ requests, abandoned }));
  } else if (command === "stop") {
    break;
  }
}
lines.close();
await worker?.stop();
for (const server of Object.values(servers)) server.close();
process.exit(0);
