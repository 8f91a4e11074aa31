"""A muster agent worker in Python.

It connects to the execution service's ConnectWorker stream (authenticated
with the first served agent's roster token, or an operator's token when
given), says which agents it serves (each proving itself with its own roster
token) and which tools it provides, keeps its lease with heartbeats, runs
each assignment with a behaviour function (in a thread of its own) and
reports the result. When the stream breaks, it connects again by itself with
exponential backoff (assignments lost with a connection are reassigned by the
execution service). The sample behaviour writes a summary of the step from
its instruction and what it built on.

Inputs and upstream outputs too large to travel in an assignment are named in
its `payload_refs`; the worker reads them (ReadPayload, in chunks, as the
assignment's agent) into the assignment before the behaviour runs, so a
behaviour always sees them whole.

A behaviour is called with the assignment, and with a `Context` when it
takes a second argument: `context.cancelled` is a threading.Event set when
the service withdraws the assignment (nothing is reported then), and
`context.invoke_tool(name, input)` invokes a tool that a connected worker
provides, as the assignment's agent, returning its output.

JSON values travel as `google.protobuf.Struct` (objects: the assignment's
`inputs`, `shared_memory`, `llm_config`) and `google.protobuf.Value` (any
value: `upstream_outputs`, outputs); `to_python` turns either into plain
Python values, with integral numbers as ints.

A behaviour returns (output, tokens, cost), or (output, tokens, cost, extra)
where extra may hold "remember": a list of ("global" or "role", text) entries
for the global memory or the agent's role's (what later runs read in
`assignment.memory`), "post_to_inbox": an inbox to post the output to, and
"delegate": {"to_agent_id": ..., "required_expertise": [...], "reason": ...}
to hand the step onward (to a named colleague, or to whoever the roster
chooses for the expertise); if the service refuses the delegation, the output
is reported instead, with the refusal as its "delegation_refused".

A tool this worker provides is a `Tool(name, description, input_schema, run)`
where run(tool_input, agent_id) takes the input as a dict and returns a
JSON-able value.

Extra may also hold "skip_triggers": True (the output is posted to no inbox)
and "iterations". A behaviour fails its step with a code of its own by raising
`StepFailed(code, message, retryable)`, reports its use while it runs with
`context.progress(tokens_used, cost, model_call=...)`, and hands the step
onward itself with `context.delegate(...)`, which waits for the service's
answer; accepted, it returns `HANDED_OFF` and the worker reports nothing more.

`muster_worker.model.ModelAgent` is the model-driven behaviour (the Rust
agent's, on the `openai` and `anthropic` packages): see its module.
"""

import inspect
import json
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import grpc
from google.protobuf import json_format, struct_pb2

from muster.execution.v1 import execution_pb2, execution_pb2_grpc


HANDED_OFF = object()
"""What a behaviour returns when it handed its step onward (context.delegate accepted)."""

MEMORY_SCOPES = {"global": execution_pb2.MEMORY_SCOPE_GLOBAL, "role": execution_pb2.MEMORY_SCOPE_ROLE}
FIRST_BACKOFF_SECONDS = 0.1
# Refusals of a worker that connecting again would not change.
REFUSALS = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
MOST_BACKOFF_SECONDS = 5.0


def to_python(message):
    """A Struct or Value as plain Python values (None when not set); numbers travel as doubles,
    so integral ones within 2^53 come back as ints."""

    def whole(value):
        if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
            return int(value)
        if isinstance(value, list):
            return [whole(item) for item in value]
        if isinstance(value, dict):
            return {key: whole(item) for key, item in value.items()}
        return value

    return whole(json_format.MessageToDict(message))


def to_value(value):
    """Any JSON-able Python value as a google.protobuf.Value."""
    return json_format.ParseDict(value, struct_pb2.Value())


def to_struct(value):
    """A dict as a google.protobuf.Struct."""
    return json_format.ParseDict(value, struct_pb2.Struct())


def json_bytes(message):
    """Bytes of a Struct or Value as compact JSON text."""
    return len(json.dumps(to_python(message), separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode())


def sample_behaviour(assignment):
    """Deterministic: no LLM. Returns (output as a JSON-able value, tokens, cost, extra); an input
    "remember" adds its text to the global memory, and an input "delegate" (agent id to colleague)
    hands the step onward."""
    upstream = sorted(assignment.upstream_outputs.keys())
    inputs = to_python(assignment.inputs) or {}
    remember = [("global", inputs["remember"])] if isinstance(inputs.get("remember"), str) else []
    extra = {"remember": remember}
    # An input "delegate" maps agents to the colleague each hands the step to.
    colleague = (inputs.get("delegate") or {}).get(assignment.agent_id)
    if colleague:
        extra["delegate"] = {"to_agent_id": colleague, "reason": f"{assignment.agent_id} hands it to {colleague}"}
    return (
        {
            "agent": assignment.agent_id,
            "step": assignment.step_id,
            "text": f"{assignment.agent_id} (python) did: {assignment.message}",
            "built_on": upstream,
            "inputs_bytes": json_bytes(assignment.inputs),
            "upstream_bytes": {step: json_bytes(output) for step, output in assignment.upstream_outputs.items()},
            "memory_entries": len(assignment.memory),
        },
        42,
        0.02,
        extra,
    )


class StepFailed(Exception):
    """Raised by a behaviour: the step fails with this code (retryable: another attempt may succeed)."""

    def __init__(self, error_code, message, retryable=False):
        super().__init__(message)
        self.error_code = error_code
        self.message = message
        self.retryable = retryable


@dataclass
class Tool:
    """A tool the worker provides; the service calls run(tool_input, agent_id)."""

    name: str
    description: str
    input_schema: dict
    run: Callable[[dict, str], object]


class Context:
    """What a behaviour may use besides its assignment."""

    def __init__(self, stub, metadata, execution_id, assignment_id="", worker=None, outbox=None):
        self.cancelled = threading.Event()
        self._stub = stub
        self._metadata = metadata
        self._execution_id = execution_id
        self.assignment_id = assignment_id
        self._worker = worker
        self._outbox = outbox

    @property
    def execution(self):
        """The execution service's stub; call it with `metadata=context.metadata` to act as the agent."""
        return self._stub

    @property
    def metadata(self):
        """The assignment's agent's credential, as gRPC call metadata."""
        return self._metadata

    def progress(self, tokens_used, cost, message="", model_call=None):
        """Reports the attempt's use so far (running totals) and, optionally, one model call
        (an execution_pb2.ModelCall): the service counts it against budgets at once."""
        if self._outbox is None:
            return
        progress = execution_pb2.StepProgress(
            assignment_id=self.assignment_id, message=message, tokens_used=tokens_used, cost=cost
        )
        if model_call is not None:
            progress.model_call.CopyFrom(model_call)
        self._outbox.put(execution_pb2.ConnectWorkerRequest(progress=progress))

    def delegate(self, to_agent_id="", required_expertise=(), required_role="", reason="", timeout=60.0):
        """Asks the service to hand the step onward and waits for its answer: (accepted, reason).
        Accepted, the step is the delegate's: return HANDED_OFF."""
        if self._worker is None or self._outbox is None:
            return False, "this worker cannot delegate"
        return self._worker._delegate(
            self._outbox,
            execution_pb2.DelegateStep(
                assignment_id=self.assignment_id,
                to_agent_id=to_agent_id,
                required_expertise=list(required_expertise),
                required_role=required_role,
                reason=reason,
            ),
            timeout,
        )

    def invoke_tool(self, tool, tool_input):
        """Invokes a tool as the assignment's agent; returns its output (plain Python values), or
        raises RuntimeError with the tool's error."""
        request = execution_pb2.InvokeToolRequest(tool=tool, input=to_struct(tool_input), execution_id=self._execution_id)
        output = self._stub.InvokeTool(request, metadata=self._metadata).output
        if output.error:
            raise RuntimeError(f"tool {tool} answered {output.status_code}: {output.error}")
        return to_python(output.output)


class Worker:
    """Serves agents until stop() is called, connecting again when the stream breaks."""

    def __init__(
        self,
        execution_address,
        credentials,
        behaviour=sample_behaviour,
        name="python-worker",
        token=None,
        tools=(),
        max_concurrency=8,
    ):
        self._channel = grpc.insecure_channel(execution_address)
        self._stub = execution_pb2_grpc.ExecutionServiceStub(self._channel)
        self._credentials = credentials
        # Every call carries a credential: `authorization: Bearer <token>`.
        self._token = token or next(iter(credentials.values()))
        self._metadata = [("authorization", f"Bearer {self._token}")]
        self._behaviour = behaviour
        self._takes_context = len(inspect.signature(behaviour).parameters) >= 2
        self._name = name
        self._tools = list(tools)
        self._max_concurrency = max_concurrency
        self._pool = ThreadPoolExecutor(max_workers=max_concurrency)
        # Tool calls have threads of their own: a behaviour waiting on a tool
        # this worker provides must not wait for its own thread.
        self._tool_pool = ThreadPoolExecutor(max_workers=4)
        self._lock = threading.Lock()
        self._running = {}  # assignment id -> Context
        self._delegated = {}  # assignment id -> the StepResult to report if refused
        self._awaiting = {}  # assignment id -> [threading.Event, DelegationOutcome] of context.delegate
        self._outbox = None
        self._responses = None
        self._stopped = threading.Event()
        self._thread = None
        self.welcomed = threading.Event()
        # Why the service refused the worker before welcoming it, if it did.
        self.refusal = None
        self.last_error = None
        self.handled = 0
        self.connections = 0
        # Heartbeats keep the worker's lease; the welcome says how long it is.
        self._heartbeat_every = 5.0

    def _hello(self):
        return execution_pb2.ConnectWorkerRequest(
            hello=execution_pb2.WorkerHello(
                worker_name=self._name,
                agents=[execution_pb2.ServedAgent(agent_id=a, token=t) for a, t in self._credentials.items()],
                tools=[
                    execution_pb2.ToolSpec(
                        name=tool.name, description=tool.description, input_schema=to_struct(tool.input_schema)
                    )
                    for tool in self._tools
                ],
                max_concurrency=self._max_concurrency,
            )
        )

    def _requests(self, outbox):
        yield self._hello()
        while True:
            try:
                message = outbox.get(timeout=self._heartbeat_every)
            except queue.Empty:
                yield execution_pb2.ConnectWorkerRequest(heartbeat=execution_pb2.WorkerHeartbeat())
                continue
            if message is None:
                return
            yield message

    def _serve(self):
        backoff = FIRST_BACKOFF_SECONDS
        while not self._stopped.is_set():
            try:
                self._session()
                backoff = FIRST_BACKOFF_SECONDS
            except grpc.RpcError as error:
                self.last_error = f"{error.code().name}: {error.details()}"
                # Refused before any welcome (a token, or a tool no role of
                # its agents grants): connecting again would not help.
                if not self.welcomed.is_set() and error.code() in REFUSALS:
                    self.refusal = self.last_error
                    return
            except Exception as error:  # the stream broke or could not open: connect again
                self.last_error = str(error)
            if self._stopped.wait(backoff):
                return
            backoff = min(backoff * 2, MOST_BACKOFF_SECONDS)

    def _session(self):
        outbox = queue.Queue()
        with self._lock:
            self._outbox = outbox
        self.connections += 1
        self._responses = self._stub.ConnectWorker(self._requests(outbox), metadata=self._metadata)
        try:
            for response in self._responses:
                kind = response.WhichOneof("message")
                if kind == "welcome":
                    self._heartbeat_every = max(response.welcome.lease.ToMilliseconds() / 3000.0, 0.05)
                    self.welcomed.set()
                elif kind == "assignment":
                    self._pool.submit(self._run, response.assignment, outbox)
                elif kind == "cancel":
                    with self._lock:
                        context = self._running.get(response.cancel.assignment_id)
                    if context is not None:
                        context.cancelled.set()
                elif kind == "tool_call":
                    self._tool_pool.submit(self._provide, response.tool_call, outbox)
                elif kind == "delegation":
                    self._answered(response.delegation, outbox)
        finally:
            outbox.put(None)

    def _fill_payloads(self, assignment, as_agent):
        """Reads the values the assignment names in payload_refs into it, as its agent."""
        for ref in assignment.payload_refs:
            request = execution_pb2.ReadPayloadRequest(
                execution_id=assignment.execution_id, step_id=ref.step_id, kind=ref.kind
            )
            value = b"".join(chunk.chunk for chunk in self._stub.ReadPayload(request, metadata=as_agent))
            if len(value) != ref.size_bytes:
                raise RuntimeError(f"payload of {ref.step_id} is {len(value)} bytes, not {ref.size_bytes}")
            if ref.kind == execution_pb2.PAYLOAD_KIND_INPUTS:
                assignment.inputs.CopyFrom(to_struct(json.loads(value)))
            elif ref.kind == execution_pb2.PAYLOAD_KIND_OUTPUT:
                assignment.upstream_outputs[ref.step_id].CopyFrom(to_value(json.loads(value)))
        del assignment.payload_refs[:]

    def _run(self, assignment, outbox):
        as_agent = [("authorization", f"Bearer {self._credentials.get(assignment.agent_id, self._token)}")]
        context = Context(self._stub, as_agent, assignment.execution_id, assignment.assignment_id, self, outbox)
        with self._lock:
            self._running[assignment.assignment_id] = context
        try:
            self._fill_payloads(assignment, as_agent)
            answer = self._behaviour(assignment, context) if self._takes_context else self._behaviour(assignment)
            if answer is HANDED_OFF:
                return  # the delegate's now: counted when the service accepted it
            output, tokens, cost, *extra = answer
            extra = extra[0] if extra else {}
            result = execution_pb2.StepResult(
                assignment_id=assignment.assignment_id,
                output=to_value(output),
                tokens_used=tokens,
                cost=cost,
                post_to_inbox=extra.get("post_to_inbox", ""),
                skip_triggers=bool(extra.get("skip_triggers", False)),
                iterations=int(extra.get("iterations", 0)),
                remember=[
                    execution_pb2.MemoryNote(scope=MEMORY_SCOPES[scope], text=text)
                    for scope, text in extra.get("remember", [])
                ],
            )
            delegate = extra.get("delegate")
            if delegate:
                with self._lock:
                    self._delegated[assignment.assignment_id] = result
                message = execution_pb2.ConnectWorkerRequest(
                    delegate=execution_pb2.DelegateStep(
                        assignment_id=assignment.assignment_id,
                        to_agent_id=delegate.get("to_agent_id", ""),
                        required_expertise=delegate.get("required_expertise", []),
                        reason=delegate.get("reason", ""),
                    )
                )
            else:
                message = execution_pb2.ConnectWorkerRequest(result=result)
        except StepFailed as failure:
            message = execution_pb2.ConnectWorkerRequest(
                failure=execution_pb2.StepFailure(
                    assignment_id=assignment.assignment_id,
                    error_code=failure.error_code,
                    message=failure.message,
                    retryable=failure.retryable,
                )
            )
        except Exception as error:  # a behaviour's fault fails the step, not the worker
            message = execution_pb2.ConnectWorkerRequest(
                failure=execution_pb2.StepFailure(
                    assignment_id=assignment.assignment_id, error_code="PYTHON_ERROR", message=str(error)
                )
            )
        finally:
            with self._lock:
                self._running.pop(assignment.assignment_id, None)
        if context.cancelled.is_set():
            return  # withdrawn: the service expects nothing more
        if message.WhichOneof("message") != "delegate":
            with self._lock:
                self.handled += 1
        outbox.put(message)

    def _delegate(self, outbox, request, timeout):
        """Sends a delegation and waits for the service's answer: (accepted, reason)."""
        waiting = [threading.Event(), None]
        with self._lock:
            self._awaiting[request.assignment_id] = waiting
        outbox.put(execution_pb2.ConnectWorkerRequest(delegate=request))
        answered = waiting[0].wait(timeout)
        with self._lock:
            self._awaiting.pop(request.assignment_id, None)
        if not answered:
            return False, "the execution service did not answer the delegation"
        return waiting[1].accepted, waiting[1].reason

    def _answered(self, outcome, outbox):
        """The service's answer to a delegation: done, or report the output kept for a refusal."""
        with self._lock:
            waiting = self._awaiting.get(outcome.assignment_id)
            if waiting is not None:
                waiting[1] = outcome
                if outcome.accepted:
                    self.handled += 1
                waiting[0].set()
                return
        with self._lock:
            result = self._delegated.pop(outcome.assignment_id, None)
            self.handled += 1
        if outcome.accepted or result is None:
            return
        output = to_python(result.output)
        output = output if isinstance(output, dict) else {"value": output}
        output["delegation_refused"] = outcome.reason
        result.output.CopyFrom(to_value(output))
        outbox.put(execution_pb2.ConnectWorkerRequest(result=result))

    def _provide(self, call, outbox):
        tool = next((tool for tool in self._tools if tool.name == call.tool), None)
        try:
            if tool is None:
                raise RuntimeError(f"this worker provides no tool '{call.tool}'")
            answer = tool.run(to_python(call.input) or {}, call.agent_id)
            output = execution_pb2.ToolOutput(output=to_value(answer), status_code=200)
        except Exception as error:
            output = execution_pb2.ToolOutput(error=str(error), status_code=500)
        outbox.put(execution_pb2.ConnectWorkerRequest(tool_result=execution_pb2.ToolCallResult(call_id=call.call_id, output=output)))

    def start(self):
        """Connects; returns once the execution service welcomes the worker.
        Raises RuntimeError with the service's reason when it refuses it, or
        after 30 s without a welcome (naming the last error)."""
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self.welcomed.wait(timeout=0.05):
            if self.refusal is not None:
                raise RuntimeError(f"the execution service refused the worker: {self.refusal}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the execution service did not welcome the worker within 30 s (last error: {self.last_error})")
        return self

    def stop(self):
        self._stopped.set()
        with self._lock:
            if self._outbox is not None:
                self._outbox.put(None)
            for context in self._running.values():
                context.cancelled.set()
        if self._responses is not None:
            self._responses.cancel()
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._tool_pool.shutdown(wait=False, cancel_futures=True)
        self._channel.close()
