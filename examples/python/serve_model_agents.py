"""Serves agents with the Python worker library's model-driven agent (muster_worker.model) until
SIGINT or SIGTERM: agents whose llm_config names a provider are run by their model, with their
role's tools, the workspace's file tools and the cluster's own; the others keep the sample behaviour.

    pip install 'clients/python[model]'       # openai and anthropic
    export OPENAI_API_KEY=...                 # the variable the agents' api_key_env names
    python3 examples/python/serve_model_agents.py --tokens muster-data/tokens.json --workspace ./vault

With --fake-model PORT it first starts the library's scripted fake model server on
127.0.0.1:PORT (muster_worker.testing), so agents whose llm_config says
{provider: openai, base_url: "http://127.0.0.1:PORT/v1", model: fake} run without a real model: it
lists the workspace, then answers with what it found. It prints `serving N agents` once the
execution service welcomes it, and how many assignments it handled when it stops.
"""

import argparse
import json
import signal
import threading

from muster_worker import Worker
from muster_worker.model import ModelAgent
from muster_worker.testing import FakeModel, openai_text, openai_tool_calls, tool_results


def fake_model_script(request):
    """List the workspace first; then answer with what the listing said."""
    if tool_results(request) == 0:
        return openai_tool_calls([("list_files", {"path": ""})], 50, 5)
    listing = request["body"]["messages"][-1]["content"]
    return openai_text(json.dumps({"summary": "looked at the workspace", "listing": json.loads(listing)}), 80, 20)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execution", default="127.0.0.1:50051")
    parser.add_argument("--roster", default="127.0.0.1:50052")
    parser.add_argument("--tokens", required=True, help="JSON: agent id to roster token")
    parser.add_argument("--workspace", default="workspace", help="the folder of the file tools (made when missing)")
    parser.add_argument("--fake-model", type=int, metavar="PORT", help="serve a scripted fake model on 127.0.0.1:PORT")
    parser.add_argument("--name", default="python-model-worker")
    args = parser.parse_args()
    with open(args.tokens) as file:
        credentials = json.load(file)

    fake = FakeModel(fake_model_script, port=args.fake_model) if args.fake_model is not None else None
    if fake is not None:
        print(f"fake model at {fake.url}/v1", flush=True)
    stop = threading.Event()
    for signal_number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signal_number, lambda *_: stop.set())
    agent = ModelAgent(args.workspace, roster=args.roster)
    worker = Worker(args.execution, credentials, behaviour=agent, name=args.name).start()
    print(f"serving {len(credentials)} agents", flush=True)
    stop.wait()
    worker.stop()
    if fake is not None:
        fake.close()
    print(f"stopped after {worker.handled} assignments and {worker.connections} connections", flush=True)


if __name__ == "__main__":
    main()
