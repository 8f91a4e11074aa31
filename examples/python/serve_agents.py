"""Serves agents with the Python worker library (muster_worker, of the
package muster-client in clients/python) and its sample behaviour until
SIGINT or SIGTERM:

    python3 examples/python/serve_agents.py --tokens muster-data/tokens.json

The tokens file maps agent ids to their roster tokens. The worker provides
the tool `word_count`; the behaviour is the sample one, and with the input
`count_words: true` it also counts the words of its instruction with
`word_count` (InvokeTool); `sleep_ms` makes it nap (printing `napping
<step>`, and `withdrawn <step>` if the service cancels it meanwhile). It prints `serving N agents` once the execution
service welcomes it, and how many assignments it handled (and over how many
connections) when it stops.
"""

import argparse
import json
import signal
import threading

from muster_worker import Tool, Worker, sample_behaviour, to_python


WORD_COUNT = Tool(
    name="word_count",
    description="Counts the words of a text",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    run=lambda tool_input, agent_id: {"words": len(tool_input["text"].split())},
)


def behaviour(assignment, context):
    """The sample behaviour; asked to, it naps (until withdrawn) and counts the words of its
    instruction with the tool."""
    inputs = to_python(assignment.inputs) or {}
    sleep_ms = inputs.get("sleep_ms")
    if isinstance(sleep_ms, (int, float)):
        print(f"napping {assignment.step_id}", flush=True)
        if context.cancelled.wait(sleep_ms / 1000):
            print(f"withdrawn {assignment.step_id}", flush=True)
            raise RuntimeError("withdrawn")
    output, tokens, cost, extra = sample_behaviour(assignment)
    if inputs.get("count_words") is True:
        output["words"] = context.invoke_tool("word_count", {"text": assignment.message})["words"]
    return output, tokens, cost, extra


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execution", default="127.0.0.1:50051")
    parser.add_argument("--tokens", required=True, help="JSON: agent id to roster token")
    parser.add_argument("--name", default="python-worker")
    args = parser.parse_args()
    with open(args.tokens) as file:
        credentials = json.load(file)

    stop = threading.Event()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signal_number, lambda *_: stop.set())
    worker = Worker(args.execution, credentials, behaviour=behaviour, name=args.name, tools=[WORD_COUNT]).start()
    print(f"serving {len(credentials)} agents", flush=True)
    stop.wait()
    worker.stop()
    print(f"stopped after {worker.handled} assignments and {worker.connections} connections", flush=True)


if __name__ == "__main__":
    main()
