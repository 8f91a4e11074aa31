"""The model-driven agent's scenarios, driven by the Rust end-to-end tests (tests/tests/e2e/model_clients.rs)
against a real cluster; the TypeScript library has the same program (src/model-scenarios.ts).

It starts scripted fake model servers (muster_worker.testing) and prints them as one JSON line,
{"servers": {name: url}}; reads one line of agent tokens (JSON, agent id to token) and serves those
agents with ModelAgent on --workspace, providing the tool word_count, printing {"serving": N}; then
answers each line it reads: "requests" with {"requests": {name: [...]}, "abandoned": {name: n}},
"stop" by stopping. The servers:

- tools (OpenAI): word_count, then four reads that lead out of the workspace; then every file tool;
  then the answer {"done": true, "summary": "drafted"}; 110, 220 and 330 tokens.
- looping (OpenAI): list_files, forever.
- limited (Anthropic): a 429 with Retry-After: 1, then "fine after waiting".
- hanging (OpenAI): never answers.
"""

import argparse
import json
import sys

from muster_worker import Tool, Worker
from muster_worker.model import ModelAgent
from muster_worker.testing import HANG, FakeModel, anthropic_text, openai_text, openai_tool_calls, status, tool_results


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--execution", required=True)
    parser.add_argument("--roster", required=True)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--outside", required=True, help="an absolute path outside the workspace")
    args = parser.parse_args()

    def tools_script(request):
        done = tool_results(request)
        if done == 0:
            return openai_tool_calls(
                [
                    ("word_count", {"text": "three little words"}),
                    ("read_file", {"path": "../secret.txt"}),
                    ("read_file", {"path": args.outside}),
                    ("read_file", {"path": "escape/secret.txt"}),
                    ("read_file", {"path": "link-out"}),
                ],
                100,
                10,
            )
        if done == 5:
            return openai_tool_calls(
                [
                    ("write_file", {"path": "out/draft.md", "content": "draft"}),
                    ("append_file", {"path": "out/draft.md", "content": " and more"}),
                    ("list_files", {"path": "out"}),
                    ("move_file", {"from": "out/draft.md", "to": "final/draft.md"}),
                    ("read_file", {"path": "final/draft.md"}),
                ],
                200,
                20,
            )
        return openai_text('{"done": true, "summary": "drafted"}', 300, 30)

    servers = {
        "tools": FakeModel(tools_script),
        "looping": FakeModel(lambda request: openai_tool_calls([("list_files", {"path": ""})], 10, 1)),
        "limited": FakeModel(
            lambda request: status(429, "rate limited", [("retry-after", "1")])
            if request["index"] == 0
            else anthropic_text("fine after waiting", 5, 2)
        ),
        "hanging": FakeModel(lambda request: HANG),
    }
    print(json.dumps({"servers": {name: server.url for name, server in servers.items()}}), flush=True)

    tokens = json.loads(sys.stdin.readline())
    word_count = Tool(
        name="word_count",
        description="Counts the words of a text",
        input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        run=lambda tool_input, agent_id: {"words": len(tool_input["text"].split())},
    )
    agent = ModelAgent(args.workspace, roster=args.roster)
    worker = Worker(args.execution, tokens, behaviour=agent, name="python-model-worker", tools=[word_count]).start()
    print(json.dumps({"serving": len(tokens)}), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "requests":
            print(
                json.dumps(
                    {
                        "requests": {name: server.requests() for name, server in servers.items()},
                        "abandoned": {name: server.abandoned() for name, server in servers.items()},
                    }
                ),
                flush=True,
            )
        elif command == "stop":
            break
    worker.stop()
    for server in servers.values():
        server.close()


if __name__ == "__main__":
    main()
