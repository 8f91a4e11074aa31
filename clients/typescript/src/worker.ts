// A muster agent worker for Node.js, on the client generated from proto/.
//
// It opens the execution service's ConnectWorker stream with the first served
// agent's roster token, says which agents it serves (each with its own token)
// and which tools it provides, keeps its lease with heartbeats, and runs each
// assignment with a behaviour: a result (output, tokens, cost, iterations,
// memory notes, an inbox to post to), a failure, or an onward delegation.
// Inputs and upstream outputs too large to travel in an assignment are read
// (ReadPayload, as the assignment's agent) before the behaviour runs. A
// cancelled assignment aborts the behaviour's signal and reports nothing. The
// behaviour may invoke tools that other workers provide (InvokeTool, as its
// agent). When the stream breaks, the worker connects again with exponential
// backoff (assignments lost with a connection are reassigned by the service).
// JSON values are plain JSON here: the generated client gives
// google.protobuf.Struct fields (inputs, tool inputs) as JSON objects, and the
// worker converts google.protobuf.Value ones (outputs) to and from JSON.

import { create, fromJson, type JsonObject, type JsonValue, type MessageInitShape, toJson } from "@bufbuild/protobuf";
import { type Value, ValueSchema } from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, createClient, type Client, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import {
  type Assignment,
  type ConnectWorkerRequest,
  ConnectWorkerRequestSchema,
  ExecutionService,
  MemoryScope,
  type ModelCallSchema,
  PayloadKind,
  type ToolCall,
} from "./gen/muster/execution/v1/execution_pb.js";

/** What a behaviour made of an assignment. */
export type Outcome =
  | {
      kind: "completed";
      /** The output, a JSON value. */
      output: JsonValue;
      tokensUsed?: number;
      /** In US dollars. */
      cost?: number;
      iterations?: number;
      /** What later runs should remember: the global memory's or the agent's role's. */
      remember?: { scope: "global" | "role"; text: string }[];
      /** An inbox to post the output to. */
      postToInbox?: string;
      /** No other role needs to run: the output is posted to no inbox. */
      skipTriggers?: boolean;
    }
  /** The step was handed onward (`context.delegate` accepted): nothing more is reported. */
  | { kind: "handedOff" }
  | { kind: "failed"; errorCode: string; message: string; retryable?: boolean }
  | {
      /** Hand the step onward: to a named colleague, or to whoever the roster chooses for the expertise. */
      kind: "delegate";
      toAgentId?: string;
      requiredExpertise?: string[];
      reason: string;
      /** Reported instead when the service refuses the delegation. */
      otherwise: Outcome;
    };

/** What a behaviour may use besides the assignment. */
export interface Context {
  /** Aborted when the service cancels the assignment. */
  signal: AbortSignal;
  /** Invokes a tool another worker provides, as the assignment's agent: its output, or an error with the tool's. */
  invokeTool(tool: string, input: JsonObject): Promise<JsonValue>;
  /** The execution service as the assignment's agent. */
  execution: Client<typeof ExecutionService>;
  /** The assignment's agent's roster token. */
  agentToken: string;
  /**
   * Reports the attempt's use so far (running totals) and, optionally, one model call: the service
   * counts it against budgets at once.
   */
  progress(update: { tokensUsed: number; cost: number; message?: string; modelCall?: MessageInitShape<typeof ModelCallSchema> }): void;
  /**
   * Asks the service to hand the step onward and waits for its answer. Accepted, the step is the
   * delegate's: return `{ kind: "handedOff" }`.
   */
  delegate(request: { toAgentId?: string; requiredExpertise?: string[]; requiredRole?: string; reason: string }): Promise<{ accepted: boolean; reason: string }>;
}

export type Behaviour = (assignment: Assignment, context: Context) => Promise<Outcome>;

/** A tool this worker provides: the service calls `run` with the input. */
export interface ProvidedTool {
  name: string;
  description: string;
  /** A JSON Schema of the input. */
  inputSchema: JsonObject;
  run(input: JsonObject, agentId: string): Promise<JsonValue>;
}

export interface WorkerOptions {
  /** `host:port` of the execution service. */
  execution: string;
  /** The agents served, by id: their roster tokens. */
  agents: Record<string, string>;
  behaviour: Behaviour;
  tools?: ProvidedTool[];
  name?: string;
  /** Assignments run at once (0: the service's default). */
  maxConcurrency?: number;
}

const FIRST_BACKOFF_MS = 100;
const MOST_BACKOFF_MS = 5_000;

function bearer(token: string): Interceptor {
  return (next) => async (request) => {
    request.header.set("authorization", `Bearer ${token}`);
    return next(request);
  };
}

/** A queue the request stream reads from; `close` ends the stream. */
class Outbox {
  private waiting: ((message: ConnectWorkerRequest | undefined) => void)[] = [];
  private queued: ConnectWorkerRequest[] = [];
  private closed = false;

  push(message: ConnectWorkerRequest) {
    const waiter = this.waiting.shift();
    if (waiter) waiter(message);
    else this.queued.push(message);
  }

  close() {
    this.closed = true;
    for (const waiter of this.waiting.splice(0)) waiter(undefined);
  }

  async *messages(): AsyncGenerator<ConnectWorkerRequest> {
    for (;;) {
      const next = this.queued.shift() ?? (this.closed ? undefined : await new Promise<ConnectWorkerRequest | undefined>((resolve) => this.waiting.push(resolve)));
      if (next === undefined) return;
      yield next;
    }
  }
}

export class Worker {
  /** Assignments finished: results and failures reported, delegations accepted. */
  handled = 0;
  /** Times the stream was opened. */
  connections = 0;
  private stopped = false;
  private outbox: Outbox | undefined;
  /** Ends the open stream at once when the worker stops. */
  private readonly hangUp = new AbortController();
  private readonly running = new Map<string, AbortController>();
  private readonly delegations = new Map<string, Outcome>();
  /** Delegations a behaviour waits the answer of (`context.delegate`), by assignment. */
  private readonly awaiting = new Map<string, (outcome: { accepted: boolean; reason: string }) => void>();
  private readonly clients = new Map<string, Client<typeof ExecutionService>>();
  private welcomed: (() => void) | undefined;
  private refusedAtStart: ((error: Error) => void) | undefined;
  private isWelcomed = false;
  /** Resolves once the execution service welcomes the worker; rejects,
   * with the service's reason, when it refuses it before that (a token or
   * a tool the agents' roles do not grant): trying again would not help. */
  readonly ready: Promise<void>;
  private done: Promise<void> | undefined;

  constructor(private readonly options: WorkerOptions) {
    this.ready = new Promise((resolve, reject) => {
      this.welcomed = resolve;
      this.refusedAtStart = reject;
    });
  }

  /** The execution service as `token`'s holder. */
  private client(token: string) {
    let client = this.clients.get(token);
    if (!client) {
      const transport = createGrpcTransport({ baseUrl: `http://${this.options.execution}`, interceptors: [bearer(token)] });
      client = createClient(ExecutionService, transport);
      this.clients.set(token, client);
    }
    return client;
  }

  /** Serves until `stop`; reconnects with backoff when the stream breaks. */
  start(): this {
    this.done = this.serve();
    return this;
  }

  async stop() {
    this.stopped = true;
    this.outbox?.close();
    this.hangUp.abort();
    for (const controller of this.running.values()) controller.abort();
    await this.done;
  }

  private async serve() {
    let backoff = FIRST_BACKOFF_MS;
    while (!this.stopped) {
      try {
        await this.session();
        backoff = FIRST_BACKOFF_MS;
      } catch (error) {
        const refused = ConnectError.from(error);
        if (this.stopped) return;
        if (refused.code === Code.Unauthenticated || refused.code === Code.PermissionDenied) {
          if (!this.isWelcomed) {
            this.stopped = true;
            this.refusedAtStart?.(new Error(`the execution service refused the worker: ${refused.message}`));
            return;
          }
          console.error(`worker refused: ${refused.message}`);
        }
        await new Promise((resolve) => setTimeout(resolve, backoff));
        backoff = Math.min(backoff * 2, MOST_BACKOFF_MS);
      }
    }
  }

  private async session() {
    const outbox = new Outbox();
    this.outbox = outbox;
    const agents = Object.entries(this.options.agents);
    const tools = this.options.tools ?? [];
    outbox.push(
      create(ConnectWorkerRequestSchema, {
        message: {
          case: "hello",
          value: {
            workerName: this.options.name ?? "typescript-worker",
            agents: agents.map(([agentId, token]) => ({ agentId, token })),
            tools: tools.map((tool) => ({
              name: tool.name,
              description: tool.description,
              inputSchema: tool.inputSchema,
            })),
            maxConcurrency: this.options.maxConcurrency ?? 0,
          },
        },
      }),
    );
    let heartbeat: NodeJS.Timeout | undefined;
    try {
      this.connections += 1;
      const stream = this.client(agents[0][1]).connectWorker(outbox.messages(), { signal: this.hangUp.signal });
      for await (const response of stream) {
        switch (response.message.case) {
          case "welcome": {
            const lease = response.message.value.lease;
            const leaseMs = Number(lease?.seconds ?? 0n) * 1000 + (lease?.nanos ?? 0) / 1e6;
            const every = Math.max(leaseMs / 3, 50);
            heartbeat = setInterval(() => outbox.push(create(ConnectWorkerRequestSchema, { message: { case: "heartbeat", value: {} } })), every);
            this.isWelcomed = true;
            this.welcomed?.();
            break;
          }
          case "assignment":
            void this.run(response.message.value, outbox);
            break;
          case "cancel":
            this.running.get(response.message.value.assignmentId)?.abort(response.message.value.reason);
            break;
          case "toolCall":
            void this.provide(response.message.value, outbox);
            break;
          case "delegation": {
            const outcome = response.message.value;
            const waiting = this.awaiting.get(outcome.assignmentId);
            if (waiting) {
              this.awaiting.delete(outcome.assignmentId);
              if (outcome.accepted) this.handled += 1;
              waiting({ accepted: outcome.accepted, reason: outcome.reason });
              break;
            }
            const otherwise = this.delegations.get(outcome.assignmentId);
            this.delegations.delete(outcome.assignmentId);
            if (outcome.accepted) this.handled += 1;
            else if (otherwise) this.report(outcome.assignmentId, withRefusal(otherwise, outcome.reason), outbox);
            break;
          }
        }
      }
      if (!this.stopped) throw new Error("the execution service ended the worker stream");
    } finally {
      clearInterval(heartbeat);
      outbox.close();
    }
  }

  private async run(assignment: Assignment, outbox: Outbox) {
    const controller = new AbortController();
    this.running.set(assignment.assignmentId, controller);
    const token = this.options.agents[assignment.agentId];
    const client = this.client(token);
    let outcome: Outcome;
    try {
      await this.fillPayloads(assignment, client);
      outcome = await this.options.behaviour(assignment, {
        signal: controller.signal,
        invokeTool: async (tool, input) => {
          const answer = (await client.invokeTool({ tool, input, executionId: assignment.executionId })).output;
          if (answer?.error) throw new Error(`tool ${tool} answered ${answer.statusCode}: ${answer.error}`);
          return answer?.output ? toJson(ValueSchema, answer.output) : null;
        },
        execution: client,
        agentToken: token,
        progress: ({ tokensUsed, cost, message, modelCall }) =>
          outbox.push(
            create(ConnectWorkerRequestSchema, {
              message: {
                case: "progress",
                value: { assignmentId: assignment.assignmentId, message: message ?? "", tokensUsed: BigInt(tokensUsed), cost, modelCall },
              },
            }),
          ),
        delegate: (request) =>
          new Promise((resolve) => {
            const timer = setTimeout(() => {
              this.awaiting.delete(assignment.assignmentId);
              resolve({ accepted: false, reason: "the execution service did not answer the delegation" });
            }, 60_000);
            this.awaiting.set(assignment.assignmentId, (outcome) => (clearTimeout(timer), resolve(outcome)));
            outbox.push(
              create(ConnectWorkerRequestSchema, {
                message: {
                  case: "delegate",
                  value: {
                    assignmentId: assignment.assignmentId,
                    toAgentId: request.toAgentId ?? "",
                    requiredExpertise: request.requiredExpertise ?? [],
                    requiredRole: request.requiredRole ?? "",
                    reason: request.reason,
                  },
                },
              }),
            );
          }),
      });
    } catch (error) {
      outcome = { kind: "failed", errorCode: "TYPESCRIPT_ERROR", message: String(error) };
    } finally {
      this.running.delete(assignment.assignmentId);
    }
    if (controller.signal.aborted) return; // cancelled: the service expects nothing more
    this.report(assignment.assignmentId, outcome, outbox);
  }

  /** Reads the values the assignment names in `payloadRefs` into it, as its agent. */
  private async fillPayloads(assignment: Assignment, client: Client<typeof ExecutionService>) {
    for (const ref of assignment.payloadRefs) {
      const chunks: Uint8Array[] = [];
      for await (const part of client.readPayload({ executionId: assignment.executionId, stepId: ref.stepId, kind: ref.kind })) {
        chunks.push(part.chunk);
      }
      const value = Buffer.concat(chunks);
      if (BigInt(value.length) !== ref.sizeBytes) {
        throw new Error(`payload of ${ref.stepId} is ${value.length} bytes, not ${ref.sizeBytes}`);
      }
      if (ref.kind === PayloadKind.INPUTS) assignment.inputs = JSON.parse(value.toString("utf8")) as JsonObject;
      else assignment.upstreamOutputs[ref.stepId] = fromJson(ValueSchema, JSON.parse(value.toString("utf8")) as JsonValue);
    }
    assignment.payloadRefs = [];
  }

  private report(assignmentId: string, outcome: Outcome, outbox: Outbox) {
    switch (outcome.kind) {
      case "completed":
        this.handled += 1;
        outbox.push(
          create(ConnectWorkerRequestSchema, {
            message: {
              case: "result",
              value: {
                assignmentId,
                output: fromJson(ValueSchema, outcome.output),
                tokensUsed: BigInt(outcome.tokensUsed ?? 0),
                cost: outcome.cost ?? 0,
                iterations: outcome.iterations ?? 1,
                postToInbox: outcome.postToInbox ?? "",
                skipTriggers: outcome.skipTriggers ?? false,
                remember: (outcome.remember ?? []).map((note) => ({
                  scope: note.scope === "global" ? MemoryScope.GLOBAL : MemoryScope.ROLE,
                  text: note.text,
                })),
              },
            },
          }),
        );
        break;
      case "failed":
        this.handled += 1;
        outbox.push(
          create(ConnectWorkerRequestSchema, {
            message: {
              case: "failure",
              value: { assignmentId, errorCode: outcome.errorCode, message: outcome.message, retryable: outcome.retryable ?? false },
            },
          }),
        );
        break;
      case "handedOff":
        break;
      case "delegate":
        // Finished when the service answers (DelegationOutcome).
        this.delegations.set(assignmentId, outcome.otherwise);
        outbox.push(
          create(ConnectWorkerRequestSchema, {
            message: {
              case: "delegate",
              value: {
                assignmentId,
                toAgentId: outcome.toAgentId ?? "",
                requiredExpertise: outcome.requiredExpertise ?? [],
                reason: outcome.reason,
              },
            },
          }),
        );
        break;
    }
  }

  private async provide(call: ToolCall, outbox: Outbox) {
    const tool = (this.options.tools ?? []).find((candidate) => candidate.name === call.tool);
    let output: { output?: Value; error: string; statusCode: number };
    try {
      if (!tool) throw new Error(`this worker provides no tool '${call.tool}'`);
      output = { output: fromJson(ValueSchema, await tool.run(call.input ?? {}, call.agentId)), error: "", statusCode: 200 };
    } catch (error) {
      output = { error: String(error), statusCode: 500 };
    }
    outbox.push(create(ConnectWorkerRequestSchema, { message: { case: "toolResult", value: { callId: call.callId, output } } }));
  }
}

/** `outcome` with a refused delegation's reason added to its output as `delegation_refused`. */
function withRefusal(outcome: Outcome, reason: string): Outcome {
  if (outcome.kind !== "completed") return outcome;
  const output: JsonObject =
    typeof outcome.output === "object" && outcome.output !== null && !Array.isArray(outcome.output)
      ? outcome.output
      : { value: outcome.output };
  return { ...outcome, output: { ...output, delegation_refused: reason } };
}
