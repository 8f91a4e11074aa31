// Serves agents with the TypeScript worker's model-driven agent (model-agent.ts) until SIGINT or
// SIGTERM: agents whose llm_config names a provider are run by their model, with their role's
// tools, the workspace's file tools and the cluster's own; the others keep the sample behaviour of
// serve-agents.ts' kind (a summary of the step).
//
//   export OPENAI_API_KEY=...       # the variable the agents' api_key_env names
//   node dist/serve-model-agents.js --tokens ../../muster-data/tokens.json --workspace ./vault
//
// With --fake-model PORT it first starts the library's scripted fake model server on
// 127.0.0.1:PORT (testing.ts), so agents whose llm_config says
// {provider: openai, base_url: "http://127.0.0.1:PORT/v1", model: fake} run without a real model:
// it lists the workspace, then answers with what it found. It prints `serving N agents` once the
// execution service welcomes it, and how many assignments it handled when it stops.

import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { modelAgent } from "./model-agent.js";
import { FakeModel, openaiText, openaiToolCalls, toolResults } from "./testing.js";
import { type Behaviour, Worker } from "./worker.js";

const { values } = parseArgs({
  options: {
    execution: { type: "string", default: "127.0.0.1:50051" },
    roster: { type: "string", default: "127.0.0.1:50052" },
    tokens: { type: "string" },
    workspace: { type: "string", default: "workspace" },
    "fake-model": { type: "string" },
    name: { type: "string", default: "typescript-model-worker" },
  },
});
if (!values.tokens) throw new Error("--tokens is required: a JSON object of agent ids to roster tokens");
const agents = JSON.parse(readFileSync(values.tokens, "utf8")) as Record<string, string>;

let fake: FakeModel | undefined;
if (values["fake-model"] !== undefined) {
  fake = await FakeModel.start((request) => {
    if (toolResults(request) === 0) return openaiToolCalls([["list_files", { path: "" }]], 50, 5);
    const listing = JSON.parse(request.body.messages.at(-1).content);
    return openaiText(JSON.stringify({ summary: "looked at the workspace", listing }), 80, 20);
  }, Number(values["fake-model"]));
  console.log(`fake model at ${fake.url}/v1`);
}

/** Agents without a model: a summary of the step. */
const sample: Behaviour = async (assignment) => ({
  kind: "completed",
  output: { agent: assignment.agentId, step: assignment.stepId, text: `${assignment.agentId} (typescript) did: ${assignment.message}` },
  tokensUsed: 0,
  cost: 0,
});

const behaviour = modelAgent({ workspace: values.workspace!, roster: values.roster, fallback: sample });
const worker = new Worker({ execution: values.execution!, agents, behaviour, name: values.name }).start();
await worker.ready;
console.log(`serving ${Object.keys(agents).length} agents`);

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, async () => {
    await worker.stop();
    fake?.close();
    console.log(`stopped after ${worker.handled} assignments and ${worker.connections} connections`);
    process.exit(0);
  });
}
