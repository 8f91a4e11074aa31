"""A muster agent worker in Python.

It connects to the execution service's ConnectWorker stream (authenticated
with the first served agent's roster token, or an operator's token when
given), says which agents it serves (each proving itself with its own roster
token), runs each assignment with a behaviour function and reports the result. The sample behaviour writes a
summary of the step from its instruction and what it built on.

Inputs and upstream outputs too large to travel in an assignment are named in
its `payload_refs`; the worker reads them (ReadPayload, in chunks) into the
assignment before the behaviour runs, so a behaviour always sees them whole.

A behaviour returns (output, tokens, cost), or (output, tokens, cost, extra)
where extra may hold "remember": a list of ("global" or "role", text) entries
for the global memory or the agent's role's (what later runs read in
`assignment.memory`), and "post_to_inbox": an inbox to post the output to.
"""

import json
import queue
import threading

import grpc

from muster.execution.v1 import execution_pb2, execution_pb2_grpc


MEMORY_SCOPES = {"global": execution_pb2.MEMORY_SCOPE_GLOBAL, "role": execution_pb2.MEMORY_SCOPE_ROLE}


def sample_behaviour(assignment):
    """Deterministic: no LLM. Returns (output as a JSON-able value, tokens, cost, extra); an input
    "remember" adds its text to the global memory."""
    upstream = sorted(assignment.upstream_outputs.keys())
    inputs = json.loads(assignment.inputs_json or "{}")
    remember = [("global", inputs["remember"])] if isinstance(inputs.get("remember"), str) else []
    return (
        {
            "agent": assignment.agent_id,
            "step": assignment.step_id,
            "text": f"{assignment.agent_id} (python) did: {assignment.message}",
            "built_on": upstream,
            "inputs_bytes": len(assignment.inputs_json),
            "upstream_bytes": {step: len(output) for step, output in assignment.upstream_outputs.items()},
            "memory_entries": len(assignment.memory),
        },
        42,
        0.02,
        {"remember": remember},
    )


class Worker:
    """Serves agents until stop() is called."""

    def __init__(self, execution_address, credentials, behaviour=sample_behaviour, name="python-worker", token=None):
        self._channel = grpc.insecure_channel(execution_address)
        self._stub = execution_pb2_grpc.ExecutionServiceStub(self._channel)
        self._credentials = credentials
        # Every call carries a credential: `authorization: Bearer <token>`.
        self._token = token or next(iter(credentials.values()))
        self._metadata = [("authorization", f"Bearer {self._token}")]
        self._behaviour = behaviour
        self._name = name
        self._outbox = queue.Queue()
        self._thread = None
        self._responses = None
        self.welcomed = threading.Event()
        self.handled = 0
        # Heartbeats keep the worker's lease; the welcome says how long it is.
        self._heartbeat_every = 5.0

    def _requests(self):
        yield execution_pb2.ConnectWorkerRequest(
            hello=execution_pb2.WorkerHello(
                worker_name=self._name,
                agents=[execution_pb2.ServedAgent(agent_id=a, token=t) for a, t in self._credentials.items()],
            )
        )
        while True:
            try:
                message = self._outbox.get(timeout=self._heartbeat_every)
            except queue.Empty:
                yield execution_pb2.ConnectWorkerRequest(heartbeat=execution_pb2.WorkerHeartbeat())
                continue
            if message is None:
                return
            yield message

    def _serve(self):
        self._responses = self._stub.ConnectWorker(self._requests(), metadata=self._metadata)
        try:
            for response in self._responses:
                kind = response.WhichOneof("message")
                if kind == "welcome":
                    self._heartbeat_every = max(response.welcome.lease_ms / 3000.0, 0.05)
                    self.welcomed.set()
                elif kind == "assignment":
                    self._run(response.assignment)
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.CANCELLED:
                raise

    def _fill_payloads(self, assignment):
        """Reads the values the assignment names in payload_refs into it, as its agent."""
        as_agent = [("authorization", f"Bearer {self._credentials.get(assignment.agent_id, self._token)}")]
        for ref in assignment.payload_refs:
            request = execution_pb2.ReadPayloadRequest(
                execution_id=assignment.execution_id, step_id=ref.step_id, kind=ref.kind
            )
            value = b"".join(chunk.chunk for chunk in self._stub.ReadPayload(request, metadata=as_agent))
            if len(value) != ref.size_bytes:
                raise RuntimeError(f"payload of {ref.step_id} is {len(value)} bytes, not {ref.size_bytes}")
            if ref.kind == execution_pb2.PAYLOAD_KIND_INPUTS:
                assignment.inputs_json = value.decode()
            elif ref.kind == execution_pb2.PAYLOAD_KIND_OUTPUT:
                assignment.upstream_outputs[ref.step_id] = value.decode()
        del assignment.payload_refs[:]

    def _run(self, assignment):
        try:
            self._fill_payloads(assignment)
            output, tokens, cost, *extra = self._behaviour(assignment)
            extra = extra[0] if extra else {}
            message = execution_pb2.ConnectWorkerRequest(
                result=execution_pb2.StepResult(
                    assignment_id=assignment.assignment_id,
                    output_json=json.dumps(output),
                    tokens_used=tokens,
                    cost=cost,
                    post_to_inbox=extra.get("post_to_inbox", ""),
                    remember=[
                        execution_pb2.MemoryNote(scope=MEMORY_SCOPES[scope], text=text)
                        for scope, text in extra.get("remember", [])
                    ],
                )
            )
        except Exception as error:  # a behaviour's fault fails the step, not the worker
            message = execution_pb2.ConnectWorkerRequest(
                failure=execution_pb2.StepFailure(
                    assignment_id=assignment.assignment_id, error_code="PYTHON_ERROR", message=str(error)
                )
            )
        self.handled += 1
        self._outbox.put(message)

    def start(self):
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self.welcomed.wait(timeout=30):
            raise RuntimeError("the execution service did not welcome the worker")
        return self

    def stop(self):
        self._outbox.put(None)
        if self._responses is not None:
            self._responses.cancel()
        self._thread.join(timeout=10)
        self._channel.close()
