"""A scripted fake model server for tests and examples, as the Rust agent's (agent/src/testing.rs):
real HTTP on 127.0.0.1 (a port of its own, in a thread), speaking enough of OpenAI's Chat Completions
and Anthropic's Messages for the agent, recording every request (path, headers, body) and answering
as the script says: JSON, an error status with headers, or never (HANG: the request is held until
the caller gives up, which is counted in `abandoned`).

    server = FakeModel(lambda request: openai_text("done", 10, 2))
    ... llm_config {"provider": "openai", "base_url": server.url + "/v1", ...}
    server.requests()  # [{"path", "headers", "body", "text", "index"}]
"""

import json
import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HANG = "hang"


def tool_results(request):
    """How many tool results a recorded request's conversation carries (OpenAI or Anthropic)."""
    count = 0
    for message in (request.get("body") or {}).get("messages") or []:
        if message.get("role") == "tool":
            count += 1
        elif isinstance(message.get("content"), list):
            count += sum(1 for block in message["content"] if isinstance(block, dict) and block.get("type") == "tool_result")
    return count


def openai_text(text, input_tokens, output_tokens):
    return {
        "json": {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake-model",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens, "total_tokens": input_tokens + output_tokens},
        }
    }


def openai_tool_calls(calls, input_tokens, output_tokens):
    """An OpenAI answer calling tools: [(name, arguments)]."""
    return {
        "json": {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "fake-model",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "tool_calls",
                    "message": {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
                            for index, (name, arguments) in enumerate(calls)
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens, "total_tokens": input_tokens + output_tokens},
        }
    }


def anthropic_text(text, input_tokens, output_tokens):
    return {
        "json": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-claude",
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
    }


def anthropic_tool_uses(calls, input_tokens, output_tokens):
    return {
        "json": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-claude",
            "content": [{"type": "tool_use", "id": f"toolu_{index}", "name": name, "input": arguments} for index, (name, arguments) in enumerate(calls)],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
        }
    }


def status(code, body="", headers=()):
    """An answer with another status, headers (such as ("retry-after", "1")) and a text body."""
    return {"status": code, "headers": list(headers), "body": body}


class FakeModel:
    """The fake server; `close()` stops it."""

    def __init__(self, script, port=0):
        self._script = script
        self._lock = threading.Lock()
        self._requests = []
        self._abandoned = 0
        self._closing = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                text = self.rfile.read(length).decode("utf-8", errors="replace")
                try:
                    body = json.loads(text)
                except ValueError:
                    body = None
                with server._lock:
                    recorded = {
                        "path": self.path.split("?")[0],
                        "headers": {name.lower(): value for name, value in self.headers.items()},
                        "body": body,
                        "text": text,
                        "index": len(server._requests),
                    }
                    server._requests.append(recorded)
                reply = server._script(recorded)
                if reply == HANG:
                    server._hold(self.connection)
                    self.close_connection = True
                    return
                if "json" in reply:
                    code, headers, payload = 200, [("content-type", "application/json")], json.dumps(reply["json"])
                else:
                    code, headers, payload = reply["status"], list(reply.get("headers", [])), reply.get("body", "")
                data = payload.encode()
                self.send_response(code)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def _hold(self, connection):
        """Holds a request unanswered until its caller closes the connection (abandoned) or the server stops."""
        while not self._closing.is_set():
            readable, _, _ = select.select([connection], [], [], 0.05)
            if readable:
                try:
                    if connection.recv(1, socket.MSG_PEEK) == b"":
                        with self._lock:
                            self._abandoned += 1
                        return
                except OSError:
                    with self._lock:
                        self._abandoned += 1
                    return

    def requests(self):
        with self._lock:
            return list(self._requests)

    def abandoned(self):
        """Held requests whose caller went away before an answer."""
        with self._lock:
            return self._abandoned

    def close(self):
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
