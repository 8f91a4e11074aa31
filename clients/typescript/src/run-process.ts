// Drives muster from TypeScript with the client generated from proto/:
// publishes a process, starts it, follows its events until it ends, and reads
// an agent's notifications as that agent. Workers (for example `muster agent`)
// serve the steps.
//
//   npm install && npm run generate && npm run build
//   node dist/run-process.js --process ../../examples/process.yaml \
//     --operator-token-file ../../muster-data/operator.token \
//     --tokens ../../muster-data/tokens.json --read-notifications-of archive-agent
//
// Prints a JSON summary; exits 0 when the execution completed. A refusal is
// printed with its code and its standard details (google.rpc.BadRequest,
// ErrorInfo, ...), as ConnectError gives them.

import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { Code, ConnectError, createClient, type Interceptor } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import { EventType, ExecutionStatus } from "./gen/muster/common/v1/common_pb.js";
import { ExecutionService } from "./gen/muster/execution/v1/execution_pb.js";
import { NotifierService } from "./gen/muster/notifier/v1/notifier_pb.js";

/** Sends `token` as the caller's bearer credential on every call. */
function bearer(token: string): Interceptor {
  return (next) => async (request) => {
    request.header.set("authorization", `Bearer ${token}`);
    return next(request);
  };
}

function transport(address: string, token: string) {
  return createGrpcTransport({ baseUrl: `http://${address}`, interceptors: [bearer(token)] });
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      execution: { type: "string", default: "127.0.0.1:50051" },
      notifier: { type: "string", default: "127.0.0.1:50054" },
      process: { type: "string" },
      "operator-token-file": { type: "string", default: "muster-data/operator.token" },
      tokens: { type: "string" },
      "read-notifications-of": { type: "string" },
    },
  });
  if (!values.process) {
    throw new Error("--process is required: the process YAML to publish and run");
  }
  const operatorToken = process.env.MUSTER_TOKEN ?? readFileSync(values["operator-token-file"]!, "utf8").trim();
  const execution = createClient(ExecutionService, transport(values.execution!, operatorToken));

  const source = readFileSync(values.process, "utf8");
  const published = await execution.publishProcess({ source, fileName: values.process });
  const name = published.process!.name;
  const started = await execution.startExecution({ processName: name });
  const executionId = started.execution!.id;

  // Events from the first; the stream ends with the execution.
  const events: string[] = [];
  let status = ExecutionStatus.UNSPECIFIED;
  for await (const message of execution.watchExecution({ executionId, afterSequence: 0n })) {
    const event = message.event!;
    events.push(EventType[event.eventType]);
    if (event.eventType === EventType.EXECUTION_FINISHED) {
      status = event.executionStatus;
      break;
    }
  }

  let notifications: number | undefined;
  const reader = values["read-notifications-of"];
  if (reader) {
    const tokens = JSON.parse(readFileSync(values.tokens!, "utf8")) as Record<string, string>;
    const notifier = createClient(NotifierService, transport(values.notifier!, tokens[reader]));
    const inbox = await notifier.listNotifications({ agentId: reader, afterCursor: 0n, limit: 1000 });
    notifications = inbox.notifications.filter((notification) => notification.event?.executionId === executionId).length;
  }

  const summary = {
    process: name,
    version: published.process!.version,
    executionId,
    status: ExecutionStatus[status],
    events: events.length,
    firstEvent: events[0],
    notifications,
  };
  console.log(JSON.stringify(summary));
  return status === ExecutionStatus.COMPLETED ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    const refused = ConnectError.from(error);
    const details = refused.details.map((detail) => ("type" in detail ? detail.type : detail.desc.typeName));
    console.error(JSON.stringify({ code: Code[refused.code], message: refused.rawMessage, details }));
    process.exit(2);
  },
);
