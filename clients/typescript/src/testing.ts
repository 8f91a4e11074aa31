// A scripted fake model server for tests and examples, as the Rust agent's (agent/src/testing.rs):
// real HTTP on 127.0.0.1 (node's http, a port of its own), speaking enough of OpenAI's Chat
// Completions and Anthropic's Messages for the agent, recording every request (path, headers, body)
// and answering as the script says: JSON, an error status with headers, or never ("hang": the
// request is held until the caller gives up, which is counted in `abandoned`).

import * as http from "node:http";
import type { AddressInfo } from "node:net";

export interface Recorded {
  path: string;
  /** Names in lowercase. */
  headers: Record<string, string>;
  /** The body as JSON (null when it was not JSON). */
  body: any;
  text: string;
  /** How many requests came before it. */
  index: number;
}

export type Reply = { json: unknown } | { status: number; headers?: [string, string][]; body?: string } | "hang";

/** How many tool results a recorded request's conversation carries (OpenAI or Anthropic). */
export function toolResults(request: Recorded): number {
  let count = 0;
  for (const message of request.body?.messages ?? []) {
    if (message.role === "tool") count += 1;
    else if (Array.isArray(message.content)) count += message.content.filter((block: any) => block?.type === "tool_result").length;
  }
  return count;
}

const usage = (input: number, output: number) => ({ prompt_tokens: input, completion_tokens: output, total_tokens: input + output });

export function openaiText(text: string, inputTokens: number, outputTokens: number): Reply {
  return {
    json: {
      id: "chatcmpl-fake", object: "chat.completion", created: 0, model: "fake-model",
      choices: [{ index: 0, finish_reason: "stop", message: { role: "assistant", content: text } }],
      usage: usage(inputTokens, outputTokens),
    },
  };
}

/** An OpenAI answer calling tools: [name, arguments] each. */
export function openaiToolCalls(calls: [string, unknown][], inputTokens: number, outputTokens: number): Reply {
  return {
    json: {
      id: "chatcmpl-fake", object: "chat.completion", created: 0, model: "fake-model",
      choices: [{
        index: 0, finish_reason: "tool_calls",
        message: {
          role: "assistant", content: null,
          tool_calls: calls.map(([name, args], index) => ({ id: `call_${index}`, type: "function", function: { name, arguments: JSON.stringify(args) } })),
        },
      }],
      usage: usage(inputTokens, outputTokens),
    },
  };
}

export function anthropicText(text: string, inputTokens: number, outputTokens: number): Reply {
  return {
    json: {
      id: "msg_fake", type: "message", role: "assistant", model: "fake-claude",
      content: [{ type: "text", text }], stop_reason: "end_turn",
      usage: { input_tokens: inputTokens, output_tokens: outputTokens },
    },
  };
}

export function anthropicToolUses(calls: [string, unknown][], inputTokens: number, outputTokens: number): Reply {
  return {
    json: {
      id: "msg_fake", type: "message", role: "assistant", model: "fake-claude",
      content: calls.map(([name, input], index) => ({ type: "tool_use", id: `toolu_${index}`, name, input })),
      stop_reason: "tool_use",
      usage: { input_tokens: inputTokens, output_tokens: outputTokens },
    },
  };
}

export class FakeModel {
  private readonly recorded: Recorded[] = [];
  private held = 0;
  private readonly server: http.Server;
  /** `http://127.0.0.1:PORT`, once started. */
  url = "";

  private constructor(script: (request: Recorded) => Reply) {
    this.server = http.createServer((request, response) => {
      const chunks: Buffer[] = [];
      request.on("data", (chunk: Buffer) => chunks.push(chunk));
      request.on("end", () => {
        const text = Buffer.concat(chunks).toString("utf8");
        let body: unknown = null;
        try {
          body = JSON.parse(text);
        } catch {
          body = null;
        }
        const headers: Record<string, string> = {};
        for (const [name, value] of Object.entries(request.headers)) headers[name.toLowerCase()] = String(value);
        const recorded: Recorded = { path: (request.url ?? "").split("?")[0], headers, body, text, index: this.recorded.length };
        this.recorded.push(recorded);
        const reply = script(recorded);
        if (reply === "hang") {
          response.on("close", () => {
            if (!response.writableEnded) this.held += 1;
          });
          return;
        }
        if ("json" in reply) {
          response.writeHead(200, { "content-type": "application/json" });
          response.end(JSON.stringify(reply.json));
        } else {
          response.writeHead(reply.status, Object.fromEntries(reply.headers ?? []));
          response.end(reply.body ?? "");
        }
      });
    });
  }

  /** Starts a server on 127.0.0.1 answering with `script` (on `port`; 0: one of its own). */
  static async start(script: (request: Recorded) => Reply, port = 0): Promise<FakeModel> {
    const model = new FakeModel(script);
    await new Promise<void>((resolve) => model.server.listen(port, "127.0.0.1", resolve));
    model.url = `http://127.0.0.1:${(model.server.address() as AddressInfo).port}`;
    return model;
  }

  requests(): Recorded[] {
    return [...this.recorded];
  }

  /** Held requests whose caller went away before an answer. */
  abandoned(): number {
    return this.held;
  }

  close() {
    this.server.closeAllConnections();
    this.server.close();
  }
}
