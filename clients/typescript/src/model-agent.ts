// The model-driven agent: a behaviour for the TypeScript worker (worker.ts) that runs each step with a
// language model, as the agent's `llm_config` describes it. It is the Rust agent's (crate
// muster-agent, `muster agent`) in TypeScript, on the official `openai` and `@anthropic-ai/sdk`
// packages:
//
// - the same `llm_config` keys (provider, base_url, model, temperature, max_tokens,
//   timeout_seconds, api_key_env, prices); the key is read from the worker's environment variable
//   that `api_key_env` names, never from the roster;
// - the same prompt: the roster's system prompt for the agent, then the assignment with the role's
//   context files read from the workspace;
// - the same tools: the role's (through InvokeTool, as the agent), the workspace's file tools
//   (workspace.ts, confined to the folder and the role's read_paths/write_paths) and the cluster's
//   own, their names, descriptions and schemas read from catalogue.json, a byte-for-byte copy of the
//   Rust catalogue (agent/catalogue.json);
// - the same loop, bounded by the agent's `max_iterations` (10 when unset; ITERATION_LIMIT after),
//   reporting the step's tokens and cost after every model call (StepProgress);
// - the same retries: the SDKs' own are off (maxRetries: 0) and each call is tried at most 3 times
//   on 429, 5xx and broken connections, waiting as Retry-After says (at most 60 s), else 0.25 s
//   doubling;
// - the same failures: MODEL_UNAVAILABLE, MODEL_TIMEOUT, MODEL_MALFORMED, MODEL_REFUSED,
//   MODEL_KEY_MISSING, LLM_CONFIG_INVALID, ITERATION_LIMIT, OUTPUT_SCHEMA.
//
// A step the service withdraws (CancelAssignment) stops at once: the worker aborts the step's
// signal, which aborts the HTTP call in flight. An agent whose `llm_config` names no provider is
// given to the `fallback` behaviour.

import { create, type JsonObject, type JsonValue, toJson } from "@bufbuild/protobuf";
import { DurationSchema, ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

import catalogue from "./catalogue.json" with { type: "json" };
import {
  AssignRoleResponseSchema,
  type Assignment,
  CheckRoleResponseSchema,
  GetMyRoleResponseSchema,
  MemoryScope,
  MessagePriority,
} from "./gen/muster/execution/v1/execution_pb.js";
import { GetOrganizationRosterResponseSchema, RosterFilter, RosterService } from "./gen/muster/roster/v1/roster_pb.js";
import type { Behaviour, Context, Outcome } from "./worker.js";
import { type Access, FileError, Workspace } from "./workspace.js";

const DEFAULT_TIMEOUT_SECONDS = 120;
const MAX_ATTEMPTS = 3;
const MAX_RETRY_AFTER_SECONDS = 60;
const FIRST_BACKOFF_SECONDS = 0.25;
const ERROR_EXCERPT_CHARS = 300;
const DEFAULT_MAX_ITERATIONS = 10;
const MAX_TOOL_CALLS_PER_REPLY = 32;
const MAX_TOOL_RESULT_CHARS = 64 * 1024;
const MAX_NOTES = 16;
const MAX_NOTE_BYTES = 4096;
const TOOLS_KEPT_FOR_MS = 30_000;
const ANTHROPIC_DEFAULT_MAX_TOKENS = 4096;
const ANTHROPIC_API_VERSION = "2023-06-01";
const MAX_VALUE_CHARS = 16 * 1024;
const MAX_CONTEXT_FILE_CHARS = 64 * 1024;
const MAX_CONTEXT_CHARS = 256 * 1024;
const MAX_FILES_PER_FOLDER = 20;
const MAX_MEMORY_CHARS = 64 * 1024;
const RETRIED_STATUSES = [429, 500, 502, 503, 504, 529];

/** A tool as a model is offered it. */
export interface ToolDefinition {
  name: string;
  description: string;
  input_schema: JsonObject;
}

/** The Rust catalogue (agent/catalogue.json). */
export const CATALOGUE = catalogue as unknown as { cluster_tools: ToolDefinition[]; workspace_tools: ToolDefinition[] };
const CLUSTER_TOOLS = new Map(CATALOGUE.cluster_tools.map((tool) => [tool.name, tool]));
const WORKSPACE_TOOLS = new Map(CATALOGUE.workspace_tools.map((tool) => [tool.name, tool]));

// --- settings ------------------------------------------------------------------------------------

export interface LlmConfig {
  provider: "openai" | "anthropic";
  baseUrl: string;
  model: string;
  temperature?: number;
  maxTokens?: number;
  timeoutSeconds: number;
  apiKeyEnv?: string;
  prices?: { inputPerMillion: number; outputPerMillion: number };
}

/** The settings of an llm_config; undefined when it names no provider; an Error naming the key for a bad value. */
export function readLlmConfig(config: JsonObject | undefined): LlmConfig | undefined {
  if (!config || config.provider === undefined || config.provider === null) return undefined;
  const provider = config.provider;
  if (provider !== "openai" && provider !== "anthropic") {
    throw new Error(`llm_config.provider ${JSON.stringify(provider)} is neither "openai" nor "anthropic"`);
  }
  const text = (key: string): string | undefined => {
    const value = config[key];
    if (value === undefined || value === null) return undefined;
    if (typeof value === "string" && value.trim() !== "") return value.trim();
    throw new Error(`llm_config.${key} must be a non-empty string`);
  };
  const number = (key: string): number | undefined => {
    const value = config[key];
    if (value === undefined || value === null) return undefined;
    if (typeof value !== "number") throw new Error(`llm_config.${key} must be a number`);
    return value;
  };
  const model = text("model");
  if (model === undefined) throw new Error("llm_config.model is required with a provider");
  const baseUrl = text("base_url") ?? (provider === "openai" ? "https://api.openai.com/v1" : "https://api.anthropic.com");
  if (!baseUrl.startsWith("http://") && !baseUrl.startsWith("https://")) {
    throw new Error("llm_config.base_url must start with http:// or https://");
  }
  const timeoutSeconds = number("timeout_seconds") ?? DEFAULT_TIMEOUT_SECONDS;
  if (!(timeoutSeconds > 0 && timeoutSeconds <= 3600)) throw new Error("llm_config.timeout_seconds must be above 0 and at most 3600");
  const maxTokens = config.max_tokens;
  if (maxTokens !== undefined && maxTokens !== null && !(typeof maxTokens === "number" && Number.isInteger(maxTokens) && maxTokens >= 1)) {
    throw new Error("llm_config.max_tokens must be a whole number of at least 1");
  }
  const apiKeyEnv = text("api_key_env");
  if (apiKeyEnv !== undefined && !/^[A-Za-z_][A-Za-z0-9_]*$/.test(apiKeyEnv)) {
    throw new Error("llm_config.api_key_env must name an environment variable ([A-Za-z_][A-Za-z0-9_]*)");
  }
  let prices: LlmConfig["prices"];
  if (config.prices !== undefined && config.prices !== null) {
    if (typeof config.prices !== "object" || Array.isArray(config.prices)) throw new Error("llm_config.prices must be a mapping");
    const given = config.prices as JsonObject;
    const price = (key: string) => {
      const value = given[key] ?? 0;
      if (typeof value !== "number" || !Number.isFinite(value) || value < 0) {
        throw new Error(`llm_config.prices.${key} must be a number of at least 0`);
      }
      return value;
    };
    prices = { inputPerMillion: price("input_per_million"), outputPerMillion: price("output_per_million") };
  }
  return {
    provider,
    baseUrl: baseUrl.replace(/\/+$/, ""),
    model,
    temperature: number("temperature"),
    maxTokens: typeof maxTokens === "number" ? maxTokens : undefined,
    timeoutSeconds,
    apiKeyEnv,
    prices,
  };
}

const cost = (config: LlmConfig, input: number, output: number) =>
  config.prices ? (input * config.prices.inputPerMillion + output * config.prices.outputPerMillion) / 1_000_000 : 0;

/** A model call that failed: the step's error code, and whether another attempt may succeed. */
export class ModelError extends Error {
  constructor(readonly code: string, message: string, readonly retryable: boolean) {
    super(message);
  }
}

// --- the providers -------------------------------------------------------------------------------

interface ToolCall {
  id: string;
  name: string;
  /** Undefined when the arguments are not a JSON object; `raw` then holds their text. */
  arguments?: JsonObject;
  raw?: string;
}

type Turn =
  | { kind: "user"; text: string }
  | { kind: "assistant"; text: string; toolCalls: ToolCall[] }
  | { kind: "toolResults"; results: { callId: string; content: string; isError: boolean }[] };

export function openaiBody(config: LlmConfig, system: string, turns: Turn[], tools: ToolDefinition[], outputSchema?: JsonValue) {
  const messages: JsonObject[] = [{ role: "system", content: system }];
  for (const turn of turns) {
    if (turn.kind === "user") messages.push({ role: "user", content: turn.text });
    else if (turn.kind === "assistant") {
      const message: JsonObject = { role: "assistant", content: turn.text === "" ? null : turn.text };
      if (turn.toolCalls.length > 0) {
        message.tool_calls = turn.toolCalls.map((call) => ({
          id: call.id,
          type: "function",
          function: { name: call.name, arguments: call.arguments ? JSON.stringify(call.arguments) : (call.raw ?? "") },
        }));
      }
      messages.push(message);
    } else {
      for (const result of turn.results) messages.push({ role: "tool", tool_call_id: result.callId, content: result.content });
    }
  }
  const body: JsonObject = { model: config.model, messages };
  if (tools.length > 0) {
    body.tools = tools.map((tool) => ({
      type: "function",
      function: { name: tool.name, description: tool.description, parameters: tool.input_schema },
    }));
  }
  if (config.temperature !== undefined) body.temperature = config.temperature;
  if (config.maxTokens !== undefined) body.max_tokens = config.maxTokens;
  if (outputSchema !== undefined) body.response_format = { type: "json_schema", json_schema: { name: "step_output", schema: outputSchema } };
  return body;
}

export function anthropicBody(config: LlmConfig, system: string, turns: Turn[], tools: ToolDefinition[]) {
  const messages: JsonObject[] = [];
  for (const turn of turns) {
    if (turn.kind === "user") messages.push({ role: "user", content: turn.text });
    else if (turn.kind === "assistant") {
      const content: JsonObject[] = turn.text === "" ? [] : [{ type: "text", text: turn.text }];
      for (const call of turn.toolCalls) content.push({ type: "tool_use", id: call.id, name: call.name, input: call.arguments ?? {} });
      messages.push({ role: "assistant", content });
    } else {
      messages.push({
        role: "user",
        content: turn.results.map((result) => ({ type: "tool_result", tool_use_id: result.callId, content: result.content, is_error: result.isError })),
      });
    }
  }
  const body: JsonObject = { model: config.model, system, max_tokens: config.maxTokens ?? ANTHROPIC_DEFAULT_MAX_TOKENS, messages };
  if (tools.length > 0) body.tools = tools.map((tool) => ({ name: tool.name, description: tool.description, input_schema: tool.input_schema }));
  if (config.temperature !== undefined) body.temperature = config.temperature;
  return body;
}

interface Reply {
  text: string;
  toolCalls: ToolCall[];
  inputTokens: number;
  outputTokens: number;
  model: string;
}

const tokens = (value: unknown) => (typeof value === "number" && Number.isInteger(value) && value >= 0 ? value : 0);

function openaiReply(answer: any): Reply {
  const message = answer?.choices?.[0]?.message;
  if (typeof message !== "object" || message === null) throw new Error("no choices[0].message in the answer");
  const text = message.content ?? "";
  if (typeof text !== "string") throw new Error("choices[0].message.content is not text");
  const toolCalls: ToolCall[] = [];
  if (message.tool_calls !== undefined && message.tool_calls !== null) {
    if (!Array.isArray(message.tool_calls)) throw new Error("choices[0].message.tool_calls is not a list");
    message.tool_calls.forEach((call: any, index: number) => {
      const name = call?.function?.name;
      if (typeof name !== "string") throw new Error(`tool_calls[${index}] has no function.name`);
      const raw = call.function.arguments;
      const id = typeof call.id === "string" && call.id ? call.id : `call_${index}`;
      if (raw === undefined || raw === null || (typeof raw === "string" && raw.trim() === "")) toolCalls.push({ id, name, arguments: {} });
      else if (typeof raw === "string") {
        let parsed: unknown;
        try {
          parsed = JSON.parse(raw);
        } catch {
          parsed = undefined;
        }
        if (typeof parsed === "object" && parsed !== null && !Array.isArray(parsed)) toolCalls.push({ id, name, arguments: parsed as JsonObject });
        else toolCalls.push({ id, name, raw });
      } else if (typeof raw === "object" && !Array.isArray(raw)) toolCalls.push({ id, name, arguments: raw });
      else toolCalls.push({ id, name, raw: JSON.stringify(raw) });
    });
  }
  return {
    text,
    toolCalls,
    inputTokens: tokens(answer.usage?.prompt_tokens),
    outputTokens: tokens(answer.usage?.completion_tokens),
    model: typeof answer.model === "string" ? answer.model : "",
  };
}

function anthropicReply(answer: any): Reply {
  if (!Array.isArray(answer?.content)) throw new Error("no content list in the answer");
  let text = "";
  const toolCalls: ToolCall[] = [];
  answer.content.forEach((block: any, index: number) => {
    if (block?.type === "text") text += typeof block.text === "string" ? block.text : "";
    else if (block?.type === "tool_use") {
      if (typeof block.name !== "string") throw new Error(`content[${index}] (tool_use) has no name`);
      const id = typeof block.id === "string" && block.id ? block.id : `toolu_${index}`;
      const input = block.input;
      if (input === undefined || input === null) toolCalls.push({ id, name: block.name, arguments: {} });
      else if (typeof input === "object" && !Array.isArray(input)) toolCalls.push({ id, name: block.name, arguments: input });
      else toolCalls.push({ id, name: block.name, raw: JSON.stringify(input) });
    }
  });
  return {
    text,
    toolCalls,
    inputTokens: tokens(answer.usage?.input_tokens),
    outputTokens: tokens(answer.usage?.output_tokens),
    model: typeof answer.model === "string" ? answer.model : "",
  };
}

/** The wait a Retry-After header asks for, in seconds: seconds, or an HTTP date. */
export function retryAfter(value: string | null | undefined): number | undefined {
  const given = (value ?? "").trim();
  if (given === "") return undefined;
  if (/^[0-9.]+$/.test(given)) {
    const seconds = Number(given);
    return Number.isFinite(seconds) && seconds >= 0 ? Math.min(seconds, 86_400) : undefined;
  }
  const at = Date.parse(given);
  return Number.isNaN(at) ? undefined : Math.max((at - Date.now()) / 1000, 0);
}

function excerpt(text: string): string {
  const line = text.split(/\s+/).filter(Boolean).join(" ");
  return line.length > ERROR_EXCERPT_CHARS ? `${line.slice(0, ERROR_EXCERPT_CHARS)}…` : line;
}

function sleep(seconds: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal.aborted) return reject(new Error("withdrawn"));
    const aborted = () => (clearTimeout(timer), reject(new Error("withdrawn")));
    const timer = setTimeout(() => (signal.removeEventListener("abort", aborted), resolve()), seconds * 1000);
    signal.addEventListener("abort", aborted, { once: true });
  });
}

/** A model endpoint as one agent's settings describe it, called through the official SDK. */
export class Model {
  constructor(readonly config: LlmConfig, private readonly environment: Record<string, string | undefined> = process.env) {}

  /** The key from the worker's environment; undefined when no variable is named. */
  apiKey(): string | undefined {
    const name = this.config.apiKeyEnv;
    if (name === undefined) return undefined;
    const key = (this.environment[name] ?? "").trim();
    if (key === "") {
      throw new ModelError("MODEL_KEY_MISSING", `the environment variable ${name} (llm_config.api_key_env) is not set in the worker's environment`, false);
    }
    return key;
  }

  /** One HTTP attempt: the answer's text (the SDK throws for a status other than 2xx). */
  private async post(body: JsonObject, key: string | undefined, signal: AbortSignal): Promise<string> {
    const timeout = this.config.timeoutSeconds * 1000;
    // The key is always given, so the SDK never reads OPENAI_API_KEY or ANTHROPIC_API_KEY by
    // itself; without one, a placeholder whose header each request omits. Retries are ours.
    if (this.config.provider === "openai") {
      const client = new OpenAI({ apiKey: key ?? "no-key", baseURL: this.config.baseUrl, timeout, maxRetries: 0 });
      const headers = key ? undefined : { Authorization: null };
      const response = await client.chat.completions.create(body as any, { signal, headers }).asResponse();
      return response.text();
    }
    const client = new Anthropic({ apiKey: key ?? "no-key", baseURL: this.config.baseUrl, timeout, maxRetries: 0 });
    // The same wire as the Rust agent's: the key as x-api-key, API version 2023-06-01 (this SDK
    // would send it as a bearer token, with a newer version).
    const headers = { Authorization: null, "x-api-key": key ?? null, "anthropic-version": ANTHROPIC_API_VERSION };
    const response = await client.messages.create(body as any, { signal, headers }).asResponse();
    return response.text();
  }

  /** One model call: the answer as JSON and the time it took, retries included. */
  async complete(body: JsonObject, signal: AbortSignal): Promise<{ answer: any; latencyMs: number }> {
    const key = this.apiKey();
    const sdk = this.config.provider === "openai" ? OpenAI : Anthropic;
    const started = Date.now();
    let pause = FIRST_BACKOFF_SECONDS;
    let timedOut = 0;
    for (let attempt = 1; ; attempt++) {
      let failure: string;
      try {
        const text = await this.post(body, key, signal);
        try {
          return { answer: JSON.parse(text), latencyMs: Date.now() - started };
        } catch (error) {
          throw new ModelError("MODEL_MALFORMED", `the model's answer could not be read: not JSON (${error}): ${excerpt(text)}`, true);
        }
      } catch (error) {
        if (error instanceof ModelError) throw error;
        if (signal.aborted || error instanceof sdk.APIUserAbortError) throw new Error("withdrawn");
        if (error instanceof sdk.APIConnectionTimeoutError) {
          timedOut += 1;
          failure = "timed out";
        } else if (error instanceof sdk.APIConnectionError) {
          failure = String((error as Error).message);
        } else if (error instanceof sdk.APIError && typeof error.status === "number") {
          const status = error.status;
          const text = excerpt(error.error !== undefined ? JSON.stringify(error.error) : error.message);
          if (!RETRIED_STATUSES.includes(status)) {
            throw new ModelError("MODEL_REFUSED", `the model endpoint refused the request: HTTP ${status}: ${text}`, false);
          }
          const wait = retryAfter(error.headers?.get("retry-after"));
          if (wait !== undefined) {
            if (wait > MAX_RETRY_AFTER_SECONDS) {
              throw new ModelError(
                "MODEL_UNAVAILABLE",
                `the model endpoint was unavailable after ${attempt} attempt(s): HTTP ${status}, Retry-After ${Math.floor(wait)} s is too long to wait`,
                true,
              );
            }
            pause = wait;
          }
          failure = `HTTP ${status}: ${text}`;
        } else {
          throw error;
        }
      }
      if (attempt >= MAX_ATTEMPTS) {
        if (timedOut === attempt) {
          throw new ModelError("MODEL_TIMEOUT", `the model endpoint did not answer within ${this.config.timeoutSeconds} s (${MAX_ATTEMPTS} attempts)`, true);
        }
        throw new ModelError("MODEL_UNAVAILABLE", `the model endpoint was unavailable after ${attempt} attempt(s): ${failure}`, true);
      }
      await sleep(pause, signal);
      pause = Math.min(pause * 2, MAX_RETRY_AFTER_SECONDS);
    }
  }
}

/** The text of a model's final answer as a step's output: the JSON it gave (an object or array, bare or fenced), else the text. */
export function answerAsOutput(text: string): JsonValue {
  const trimmed = text.trim();
  let unfenced = trimmed;
  for (const prefix of ["```json", "```"]) {
    if (trimmed.startsWith(prefix) && trimmed.endsWith("```") && trimmed.length >= prefix.length + 3) {
      unfenced = trimmed.slice(prefix.length, -3).trim();
      break;
    }
  }
  try {
    const value = JSON.parse(unfenced);
    return typeof value === "object" && value !== null ? value : trimmed;
  } catch {
    return trimmed;
  }
}

// --- JSON schemas (the subset the catalogue and simple output schemas use) ------------------------

/** The first way `value` misses `schema`, or undefined. */
export function schemaProblem(schema: any, value: any, at = ""): string | undefined {
  if (typeof schema !== "object" || schema === null) return undefined;
  const where = at || "the value";
  const kinds: Record<string, (v: any) => boolean> = {
    object: (v) => typeof v === "object" && v !== null && !Array.isArray(v),
    array: Array.isArray,
    string: (v) => typeof v === "string",
    boolean: (v) => typeof v === "boolean",
    null: (v) => v === null,
    integer: (v) => Number.isInteger(v),
    number: (v) => typeof v === "number",
  };
  if (schema.type !== undefined) {
    const names: string[] = Array.isArray(schema.type) ? schema.type : [schema.type];
    if (!names.some((name) => (kinds[name] ?? (() => true))(value))) {
      return `${where}: ${JSON.stringify(value)} is not of type ${JSON.stringify(schema.type)}`;
    }
  }
  const same = (left: unknown, right: unknown) => JSON.stringify(left) === JSON.stringify(right);
  if (Array.isArray(schema.enum) && !schema.enum.some((item: unknown) => same(item, value))) {
    return `${where}: ${JSON.stringify(value)} is not one of ${JSON.stringify(schema.enum)}`;
  }
  if ("const" in schema && !same(schema.const, value)) return `${where}: ${JSON.stringify(value)} is not ${JSON.stringify(schema.const)}`;
  if (kinds.object(value)) {
    for (const name of schema.required ?? []) if (!(name in value)) return `${where}: ${JSON.stringify(name)} is a required property`;
    const properties = schema.properties ?? {};
    for (const [name, item] of Object.entries(value)) {
      if (name in properties) {
        const problem = schemaProblem(properties[name], item, `${at}/${name}`);
        if (problem) return problem;
      } else if (schema.additionalProperties === false) return `${where}: additional property ${JSON.stringify(name)} is not allowed`;
    }
  }
  if (Array.isArray(value)) {
    if (schema.maxItems !== undefined && value.length > schema.maxItems) return `${where}: has more than ${schema.maxItems} items`;
    if (schema.minItems !== undefined && value.length < schema.minItems) return `${where}: has fewer than ${schema.minItems} items`;
    for (const [index, item] of value.entries()) {
      const problem = schemaProblem(schema.items, item, `${at}/${index}`);
      if (problem) return problem;
    }
  }
  if (typeof value === "string") {
    const length = [...value].length;
    if (schema.maxLength !== undefined && length > schema.maxLength) return `${where}: is longer than ${schema.maxLength} characters`;
    if (schema.minLength !== undefined && length < schema.minLength) return `${where}: is shorter than ${schema.minLength} characters`;
    if (schema.pattern !== undefined && !new RegExp(schema.pattern, "u").test(value)) {
      return `${where}: ${JSON.stringify(value)} does not match ${JSON.stringify(schema.pattern)}`;
    }
  }
  if (typeof value === "number") {
    if (schema.minimum !== undefined && value < schema.minimum) return `${where}: ${value} is less than the minimum of ${schema.minimum}`;
    if (schema.maximum !== undefined && value > schema.maximum) return `${where}: ${value} is greater than the maximum of ${schema.maximum}`;
  }
  return undefined;
}

// --- what the model is told ----------------------------------------------------------------------

function truncate(text: string, most: number): string {
  return text.length <= most ? text : `${text.slice(0, most)}\n… (${text.length - most} more characters left out)`;
}

const fenced = (value: unknown) => "```json\n" + truncate(JSON.stringify(value, null, 2), MAX_VALUE_CHARS) + "\n```";

const valueJson = (value: Parameters<typeof toJson<typeof ValueSchema>>[1] | undefined) => (value ? toJson(ValueSchema, value) : null);

export function systemPrompt(assignment: Assignment): string {
  let prompt = assignment.systemPrompt.trim() || `You are ${assignment.agentId}, an agent of a team run by muster.`;
  if (assignment.sessionContext.trim() !== "") {
    prompt += `\n\n# Team session\nYour role in it: ${assignment.sessionRole}\n${assignment.sessionContext.trim()}`;
  }
  return prompt;
}

interface ContextFile {
  path: string;
  content?: string;
  why?: string;
}

/** The role's context files from the workspace. */
export function readContextFiles(workspace: Workspace, paths: string[]): ContextFile[] {
  const files: ContextFile[] = [];
  let left = MAX_CONTEXT_CHARS;
  for (const given of paths) {
    let names: string[];
    try {
      const listed = workspace.listFiles(given);
      names = listed.entries.filter((entry) => entry.kind === "file").slice(0, MAX_FILES_PER_FOLDER).map((entry) => `${given.replace(/\/+$/, "")}/${entry.name}`);
      if (names.length === 0) files.push({ path: given, why: "the folder holds no file" });
    } catch {
      names = [given];
    }
    for (const name of names) {
      if (left === 0) {
        files.push({ path: name, why: "left out: the context files already fill the prompt's share" });
        continue;
      }
      try {
        const kept = truncate(workspace.readFile(name).content, Math.min(MAX_CONTEXT_FILE_CHARS, left));
        left = Math.max(left - kept.length, 0);
        files.push({ path: name, content: kept });
      } catch (error) {
        files.push({ path: name, why: error instanceof Error ? error.message : String(error) });
      }
    }
  }
  return files;
}

export function outputSchema(assignment: Assignment): JsonObject | undefined {
  const schema = assignment.roleDefinition?.outputSchema;
  return schema && Object.keys(schema).length > 0 ? schema : undefined;
}

/** The first user message: the assignment. */
export function task(assignment: Assignment, contextFiles: ContextFile[]): string {
  const name = !assignment.stepName || assignment.stepName === assignment.stepId ? "" : ` (${assignment.stepName})`;
  let text =
    `# Your task\nProcess ${assignment.processName} (version ${assignment.processVersion}), execution ` +
    `${assignment.executionId}, step ${assignment.stepId}${name}, attempt ${assignment.attempt}.\n\n`;
  text += (assignment.message.trim() || "(The step gives no instruction: do what your role is for.)") + "\n";
  if (assignment.inputs && Object.keys(assignment.inputs).length > 0) text += `\n## Inputs\n${fenced(assignment.inputs)}\n`;
  const upstream = Object.keys(assignment.upstreamOutputs).sort();
  if (upstream.length > 0) {
    text += "\n## What the steps this one depends on produced\n";
    for (const step of upstream) text += `### ${step}\n${fenced(valueJson(assignment.upstreamOutputs[step]))}\n`;
  }
  if (assignment.sharedMemory) {
    let earlier = "";
    for (const step of Object.keys(assignment.sharedMemory).sort()) {
      if (step in assignment.upstreamOutputs || earlier.length > MAX_MEMORY_CHARS) continue;
      earlier += `### ${step}\n${fenced(assignment.sharedMemory[step])}\n`;
    }
    if (earlier) text += `\n## Earlier steps this one builds on\n${earlier}`;
  }
  if (assignment.history.length > 0) {
    text += "\n## History (oldest first)\n";
    for (const entry of assignment.history) {
      const at = entry.at ? new Date(Number(entry.at.seconds) * 1000 + Math.floor(entry.at.nanos / 1e6)).toISOString().replace(".000Z", "Z") : "";
      text += `- ${at} ${entry.stepId}: ${entry.action} by ${entry.agentId}\n`;
    }
  }
  if (assignment.memory.length > 0) {
    text += "\n## What your team remembers (newest first)\n";
    for (const entry of assignment.memory) {
      const scope = entry.scope === MemoryScope.GLOBAL ? "global" : `role ${entry.role}`;
      text += `- [${scope}, by ${entry.author}] ${entry.text.trim()}\n`;
    }
  }
  if (contextFiles.length > 0) {
    text += "\n## Context files (from the workspace)\n";
    for (const file of contextFiles) {
      text += file.content !== undefined ? `### ${file.path}\n\`\`\`\n${file.content.trimEnd()}\n\`\`\`\n` : `### ${file.path}\n(not read: ${file.why})\n`;
    }
  }
  text +=
    "\n## How to answer\nUse the tools offered when they help. When you are done, answer with the step's " +
    "result: plain text, or a JSON object when the result has structure. Your answer is the step's output.\n";
  const schema = outputSchema(assignment);
  if (schema) text += `The answer must be a JSON object matching this JSON schema, and nothing else:\n${fenced(schema)}\n`;
  return text;
}

// --- the agent -----------------------------------------------------------------------------------

class ToolError extends Error {
  constructor(readonly code: string, message: string) {
    super(message);
  }
}

const HANDED_OFF = Symbol("handed off");

function refused(error: unknown): ToolError {
  const refusal = ConnectError.from(error);
  const codes: Partial<Record<Code, string>> = {
    [Code.InvalidArgument]: "invalid_arguments",
    [Code.OutOfRange]: "invalid_arguments",
    [Code.PermissionDenied]: "permission_denied",
    [Code.Unauthenticated]: "permission_denied",
    [Code.NotFound]: "not_found",
    [Code.AlreadyExists]: "already_exists",
    [Code.FailedPrecondition]: "failed_precondition",
    [Code.ResourceExhausted]: "resource_exhausted",
    [Code.Unavailable]: "unavailable",
    [Code.DeadlineExceeded]: "unavailable",
  };
  return new ToolError(codes[refusal.code] ?? "internal", refusal.rawMessage);
}

export interface ModelAgentOptions {
  /** The folder its file tools act in (made, 0700, when missing). */
  workspace: string;
  /** The roster's `host:port`, for get_organization_roster. */
  roster?: string;
  /** The behaviour of agents whose llm_config names no provider. */
  fallback?: Behaviour;
  /** Where keys are read (the process's environment by default). */
  environment?: Record<string, string | undefined>;
}

/** Whether the assignment's agent is model-driven: its llm_config names a provider. */
export const servesModel = (assignment: Assignment) => assignment.llmConfig?.provider !== undefined && assignment.llmConfig?.provider !== null;

/** The model-driven behaviour: `new Worker({ ..., behaviour: modelAgent({ workspace }) })`. */
export function modelAgent(options: ModelAgentOptions): Behaviour {
  const workspace = new Workspace(options.workspace);
  let registered: { at: number; tools: { name: string; description: string; inputSchema?: JsonObject }[] } | undefined;
  const rosterClients = new Map<string, ReturnType<typeof createClient<typeof RosterService>>>();
  const roster = (token: string) => {
    let client = rosterClients.get(token);
    if (!client) {
      const bearer: Interceptor = (next) => async (request) => {
        request.header.set("authorization", `Bearer ${token}`);
        return next(request);
      };
      client = createClient(RosterService, createGrpcTransport({ baseUrl: `http://${options.roster ?? "127.0.0.1:50052"}`, interceptors: [bearer] }));
      rosterClients.set(token, client);
    }
    return client;
  };
  const registeredTools = async (context: Context) => {
    if (registered && Date.now() - registered.at < TOOLS_KEPT_FOR_MS) return registered.tools;
    const tools: { name: string; description: string; inputSchema?: JsonObject }[] = [];
    let pageToken = "";
    for (let page = 0; page < 10; page++) {
      try {
        const answer = await context.execution.listTools({ pageSize: 1000, pageToken });
        tools.push(...answer.tools);
        pageToken = answer.nextPageToken;
        if (!pageToken) break;
      } catch {
        break;
      }
    }
    registered = { at: Date.now(), tools };
    return tools;
  };

  return async (assignment, context) => {
    if (!servesModel(assignment)) {
      if (options.fallback) return options.fallback(assignment, context);
      return { kind: "failed", errorCode: "NOT_MODEL_DRIVEN", message: "the agent's llm_config names no provider" };
    }
    let config: LlmConfig;
    try {
      config = readLlmConfig(assignment.llmConfig)!;
    } catch (error) {
      return { kind: "failed", errorCode: "LLM_CONFIG_INVALID", message: (error as Error).message };
    }
    const step = new StepRun(assignment, context, new Model(config, options.environment ?? process.env), workspace, registeredTools, roster);
    return step.run();
  };
}

class StepRun {
  private readonly role;
  private readonly access: Access;
  private readonly workspaceTools: string[];
  private readonly provided: string[];
  private inputTokens = 0;
  private outputTokens = 0;
  private cost = 0;
  private readonly notes: { scope: "global" | "role"; text: string }[] = [];
  private skipTriggers = false;
  private posts = 0;

  constructor(
    private readonly assignment: Assignment,
    private readonly context: Context,
    private readonly model: Model,
    private readonly workspace: Workspace,
    private readonly registeredTools: (context: Context) => Promise<{ name: string; description: string; inputSchema?: JsonObject }[]>,
    private readonly roster: (token: string) => ReturnType<typeof createClient<typeof RosterService>>,
  ) {
    this.role = assignment.roleDefinition;
    this.access = { readPaths: this.role?.readPaths ?? [], writePaths: this.role?.writePaths ?? [] };
    const tools = this.role?.tools ?? [];
    this.workspaceTools = tools.filter((name) => WORKSPACE_TOOLS.has(name));
    this.provided = tools.filter((name) => !WORKSPACE_TOOLS.has(name) && !CLUSTER_TOOLS.has(name));
  }

  async run(): Promise<Outcome> {
    try {
      return await this.loop();
    } catch (error) {
      if (error instanceof ModelError) return { kind: "failed", errorCode: error.code, message: error.message, retryable: error.retryable };
      throw error;
    }
  }

  private async loop(): Promise<Outcome> {
    const config = this.model.config;
    const system = systemPrompt(this.assignment);
    const turns: Turn[] = [{ kind: "user", text: task(this.assignment, readContextFiles(this.workspace, this.role?.contextFiles ?? [])) }];
    const tools = await this.offeredTools();
    const schema = outputSchema(this.assignment);
    const maxIterations = this.assignment.maxIterations || DEFAULT_MAX_ITERATIONS;
    let corrected = false;
    for (let iteration = 1; iteration <= maxIterations; iteration++) {
      const body = config.provider === "openai" ? openaiBody(config, system, turns, tools, schema) : anthropicBody(config, system, turns, tools);
      const { answer, latencyMs } = await this.model.complete(body, this.context.signal);
      let reply: Reply;
      try {
        reply = config.provider === "openai" ? openaiReply(answer) : anthropicReply(answer);
      } catch (error) {
        throw new ModelError("MODEL_MALFORMED", `the model's answer could not be read: ${(error as Error).message}`, true);
      }
      this.count(iteration, reply, latencyMs);
      if (reply.toolCalls.length === 0) {
        const output = answerAsOutput(reply.text);
        const problem = schema ? schemaProblem(schema, output) : undefined;
        if (problem !== undefined) {
          if (corrected) {
            return {
              kind: "failed",
              errorCode: "OUTPUT_SCHEMA",
              message: `the model's answer does not match the role's output schema, even after being told why: ${problem}`,
            };
          }
          corrected = true;
          turns.push({ kind: "assistant", text: reply.text, toolCalls: [] });
          turns.push({
            kind: "user",
            text: `Your answer does not match the required output schema: ${problem}. Answer again with only the JSON object, matching the schema.`,
          });
          continue;
        }
        return {
          kind: "completed",
          output,
          tokensUsed: this.inputTokens + this.outputTokens,
          cost: this.cost,
          iterations: iteration,
          remember: this.notes,
          skipTriggers: this.skipTriggers,
        };
      }
      turns.push({ kind: "assistant", text: reply.text, toolCalls: reply.toolCalls });
      const results = [];
      for (const [index, call] of reply.toolCalls.entries()) {
        const result =
          index >= MAX_TOOL_CALLS_PER_REPLY
            ? new ToolError("too_many_calls", `at most ${MAX_TOOL_CALLS_PER_REPLY} tool calls are run per answer`)
            : await this.call(call);
        if (result === HANDED_OFF) return { kind: "handedOff" };
        results.push(toolResult(call.id, result));
      }
      turns.push({ kind: "toolResults", results });
    }
    return {
      kind: "failed",
      errorCode: "ITERATION_LIMIT",
      message: `the model was still calling tools after ${maxIterations} model calls, the agent's max_iterations`,
    };
  }

  /** Adds a call's usage and reports the step's use so far, with the call's record. */
  private count(iteration: number, reply: Reply, latencyMs: number) {
    const callCost = cost(this.model.config, reply.inputTokens, reply.outputTokens);
    this.inputTokens += reply.inputTokens;
    this.outputTokens += reply.outputTokens;
    this.cost += callCost;
    this.context.progress({
      tokensUsed: this.inputTokens + this.outputTokens,
      cost: this.cost,
      message: `model call ${iteration}`,
      modelCall: {
        iteration,
        model: reply.model || this.model.config.model,
        inputTokens: BigInt(reply.inputTokens),
        outputTokens: BigInt(reply.outputTokens),
        latency: create(DurationSchema, { seconds: BigInt(Math.floor(latencyMs / 1000)), nanos: (latencyMs % 1000) * 1_000_000 }),
        toolCalls: reply.toolCalls.map((call) => call.name).slice(0, 64),
        cost: callCost,
      },
    });
  }

  /** The role's workspace tools, its provided tools (with their registered schemas), then the cluster's. */
  private async offeredTools(): Promise<ToolDefinition[]> {
    const tools = this.workspaceTools.map((name) => WORKSPACE_TOOLS.get(name)!);
    if (this.provided.length > 0) {
      const registered = await this.registeredTools(this.context);
      for (const name of this.provided) {
        const spec = registered.find((tool) => tool.name === name);
        tools.push({
          name,
          description: spec?.description || `The ${name} tool of your role.`,
          input_schema: spec?.inputSchema && Object.keys(spec.inputSchema).length > 0 ? spec.inputSchema : { type: "object" },
        });
      }
    }
    return [...tools, ...CATALOGUE.cluster_tools];
  }

  /** Runs one tool call: its result, a ToolError, or HANDED_OFF. */
  private async call(call: ToolCall): Promise<JsonValue | ToolError | typeof HANDED_OFF> {
    if (!call.arguments) return new ToolError("invalid_arguments", `the arguments are not a JSON object: ${(call.raw ?? "").slice(0, 200)}`);
    const args = call.arguments;
    try {
      if (this.workspaceTools.includes(call.name)) {
        const problem = schemaProblem(WORKSPACE_TOOLS.get(call.name)!.input_schema, args);
        if (problem) return new ToolError("invalid_arguments", problem);
        return this.workspaceCall(call.name, args);
      }
      if (CLUSTER_TOOLS.has(call.name)) {
        const problem = schemaProblem(CLUSTER_TOOLS.get(call.name)!.input_schema, args);
        if (problem) return new ToolError("invalid_arguments", problem);
        return await this.clusterCall(call.name, call.id, args);
      }
      if (this.provided.includes(call.name)) return await this.invoke(call.name, args);
    } catch (error) {
      if (error instanceof ToolError) return error;
      throw error;
    }
    return new ToolError("unknown_tool", `no tool named '${call.name}' is offered to you`);
  }

  private workspaceCall(name: string, args: JsonObject): JsonValue {
    const text = (key: string) => (typeof args[key] === "string" ? (args[key] as string) : "");
    try {
      switch (name) {
        case "read_file":
          return this.workspace.readFile(text("path"), this.access);
        case "write_file":
        case "append_file":
          return this.workspace.writeFile(text("path"), text("content"), name === "append_file", this.access);
        case "list_files":
          return this.workspace.listFiles(text("path"), this.access);
        default:
          return this.workspace.moveFile(text("from"), text("to"), this.access);
      }
    } catch (error) {
      if (error instanceof FileError) throw new ToolError("file_refused", error.message);
      throw new ToolError("file_refused", `${text("path") || text("from")}: ${(error as Error).message}`);
    }
  }

  /** A tool a provider serves, through the execution service (which checks the role's permission and the input's schema). */
  private async invoke(tool: string, input: JsonObject): Promise<JsonValue> {
    let output;
    try {
      output = (await this.context.execution.invokeTool({ tool, input, executionId: this.assignment.executionId })).output;
    } catch (error) {
      throw refused(error);
    }
    if (output?.statusCode === 200) return valueJson(output.output);
    const codes: Record<number, string> = { 400: "invalid_arguments", 403: "permission_denied", 404: "not_found" };
    throw new ToolError(codes[output?.statusCode ?? 0] ?? "tool_failed", `${output?.error ?? ""} (status ${output?.statusCode ?? 0})`);
  }

  private async clusterCall(name: string, callId: string, args: JsonObject): Promise<JsonValue | typeof HANDED_OFF> {
    const text = (key: string) => (typeof args[key] === "string" ? (args[key] as string) : "");
    const executionId = this.assignment.executionId;
    const execution = this.context.execution;
    const wire = async <T>(call: () => Promise<T>, schema: Parameters<typeof toJson>[0]) => {
      try {
        return toJson(schema, (await call()) as any, { useProtoFieldName: true });
      } catch (error) {
        throw refused(error);
      }
    };
    switch (name) {
      case "get_organization_roster": {
        const filters: Record<string, RosterFilter> = {
          my_team: RosterFilter.MY_TEAM,
          available: RosterFilter.AVAILABLE,
          by_expertise: RosterFilter.BY_EXPERTISE,
        };
        const request = { agentId: this.assignment.agentId, filter: filters[text("filter")] ?? RosterFilter.ALL, expertise: text("expertise") };
        return wire(() => this.roster(this.context.agentToken).getOrganizationRoster(request), GetOrganizationRosterResponseSchema);
      }
      case "delegate_task": {
        const expertise = Array.isArray(args.expertise) ? args.expertise.filter((tag): tag is string => typeof tag === "string") : [];
        const outcome = await this.context.delegate({ toAgentId: text("to_agent_id"), requiredExpertise: expertise, requiredRole: text("role"), reason: text("reason") });
        if (outcome.accepted) return HANDED_OFF;
        throw new ToolError("delegation_refused", outcome.reason);
      }
      case "get_my_role":
        return wire(() => execution.getMyRole({ executionId }), GetMyRoleResponseSchema);
      case "role_check":
        return wire(() => execution.checkRole({ executionId, action: text("action"), agentId: text("agent_id") }), CheckRoleResponseSchema);
      case "assign_role":
        return wire(
          () => execution.assignRole({ executionId, agentId: text("agent_id"), role: text("role"), subtask: text("subtask") }),
          AssignRoleResponseSchema,
        );
      case "post_to_inbox": {
        const priorities: Record<string, MessagePriority> = { low: MessagePriority.LOW, high: MessagePriority.HIGH };
        this.posts += 1;
        try {
          const answer = await execution.postToInbox({
            inbox: text("inbox"),
            priority: priorities[text("priority")] ?? MessagePriority.NORMAL,
            body: text("body"),
            subject: text("subject"),
            // A call the model makes once is posted once, however often it is sent.
            idempotencyKey: `${this.assignment.assignmentId}/${callId}/${this.posts}`,
          });
          return { message_id: answer.message?.id ?? "", triggered_execution_ids: answer.triggeredExecutionIds };
        } catch (error) {
          throw refused(error);
        }
      }
      case "remember":
        return this.remember(text("text"), text("scope"));
      default:
        this.skipTriggers = true;
        return { skip_triggers: true, reason: text("reason") };
    }
  }

  private remember(note: string, scope: string): JsonValue {
    if (this.notes.length >= MAX_NOTES) throw new ToolError("resource_exhausted", `a step may leave at most ${MAX_NOTES} notes`);
    const global = scope === "global";
    if (!global && !this.assignment.roleDefinition) throw new ToolError("failed_precondition", 'you hold no role: use scope "global"');
    if (note.trim() === "" || Buffer.byteLength(note) > MAX_NOTE_BYTES) {
      throw new ToolError("invalid_arguments", `a note holds 1 to ${MAX_NOTE_BYTES} bytes; this one has ${Buffer.byteLength(note.trim())}`);
    }
    this.notes.push({ scope: global ? "global" : "role", text: note });
    return { remembered: true, scope: global ? "global" : "role", notes: this.notes.length };
  }
}

function toolResult(callId: string, result: JsonValue | ToolError) {
  const value = result instanceof ToolError ? { error: { code: result.code, message: result.message } } : result;
  let content = JSON.stringify(value) ?? "null";
  if (content.length > MAX_TOOL_RESULT_CHARS) content = `${content.slice(0, MAX_TOOL_RESULT_CHARS)}… (cut at ${MAX_TOOL_RESULT_CHARS} characters)`;
  return { callId, content, isError: result instanceof ToolError };
}
