// Serves agents with the TypeScript worker (worker.ts) and a deterministic
// sample behaviour, until SIGINT or SIGTERM:
//
//   node dist/serve-agents.js --tokens ../../muster-data/tokens.json [--execution 127.0.0.1:50051]
//
// The tokens file maps agent ids to their roster tokens. The worker provides
// the tool `word_count`. The behaviour writes what the step asked, what it
// built on and how large its inputs were; an input `remember` (a string) is
// added to the global memory, with `count_words: true` it counts the words
// of its instruction with `word_count` (InvokeTool), and an input `delegate`
// (agent id to colleague) hands the step onward; `sleep_ms` makes it nap
// (printing `napping <step>`, and `withdrawn <step>` if the service cancels
// it meanwhile). It prints
// `serving N agents` once the execution service welcomes it, and how many
// assignments it handled when it stops.

import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { type Behaviour, type ProvidedTool, Worker } from "./worker.js";

/** A tool this worker provides: the words of `text`. */
const wordCount: ProvidedTool = {
  name: "word_count",
  description: "Counts the words of a text",
  inputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
  run: async (input) => ({ words: String(input.text).split(/\s+/).filter(Boolean).length }),
};

/** Waits `milliseconds`, or less when `signal` aborts first: whether it slept the whole time. */
function nap(milliseconds: number, signal: AbortSignal): Promise<boolean> {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(true), milliseconds);
    signal.addEventListener("abort", () => (clearTimeout(timer), resolve(false)), { once: true });
  });
}

const sample: Behaviour = async (assignment, context) => {
  const inputs = assignment.inputs ?? {};
  // An input `sleep_ms` makes it take that long, unless the service withdraws the step.
  if (typeof inputs.sleep_ms === "number") {
    console.log(`napping ${assignment.stepId}`);
    if (!(await nap(inputs.sleep_ms, context.signal))) {
      console.log(`withdrawn ${assignment.stepId}`);
      throw new Error("withdrawn");
    }
  }
  // Asked to, it counts the words of its instruction with the tool (whichever worker provides it).
  const words = inputs.count_words === true
    ? ((await context.invokeTool("word_count", { text: assignment.message })) as { words: number }).words
    : null;
  const done = {
    kind: "completed" as const,
    output: {
      agent: assignment.agentId,
      step: assignment.stepId,
      text: `${assignment.agentId} (typescript) did: ${assignment.message}`,
      built_on: Object.keys(assignment.upstreamOutputs).sort(),
      inputs_bytes: Buffer.byteLength(JSON.stringify(inputs)),
      words,
    },
    tokensUsed: 42,
    cost: 0.02,
    remember: typeof inputs.remember === "string" ? [{ scope: "global" as const, text: inputs.remember }] : [],
  };
  // An input `delegate` maps agents to the colleague each hands the step to.
  const colleague = (inputs.delegate as Record<string, string> | undefined)?.[assignment.agentId];
  if (colleague) {
    return { kind: "delegate", toAgentId: colleague, reason: `${assignment.agentId} hands it to ${colleague}`, otherwise: done };
  }
  return done;
};

const { values } = parseArgs({
  options: {
    execution: { type: "string", default: "127.0.0.1:50051" },
    tokens: { type: "string" },
    name: { type: "string", default: "typescript-worker" },
  },
});
if (!values.tokens) {
  throw new Error("--tokens is required: a JSON object of agent ids to roster tokens");
}
const agents = JSON.parse(readFileSync(values.tokens, "utf8")) as Record<string, string>;
const worker = new Worker({ execution: values.execution!, agents, behaviour: sample, tools: [wordCount], name: values.name }).start();
await worker.ready;
console.log(`serving ${Object.keys(agents).length} agents`);

for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, async () => {
    await worker.stop();
    console.log(`stopped after ${worker.handled} assignments and ${worker.connections} connections`);
    process.exit(0);
  });
}
