"""The model-driven agent: a behaviour for `muster_worker.Worker` that runs each step with a
language model, as the agent's `llm_config` describes it. It is the Rust agent's (crate
muster-agent, `muster agent`) in Python, on the official `openai` and `anthropic` packages:

- the same `llm_config` keys (provider, base_url, model, temperature, max_tokens, timeout_seconds,
  api_key_env, prices); the key is read from the worker's environment variable that `api_key_env`
  names, never from the roster;
- the same prompt: the roster's system prompt for the agent, then the assignment with the role's
  context files read from the workspace;
- the same tools: the role's (through InvokeTool, as the agent), the workspace's file tools
  (`workspace.py`, confined to the folder and the role's read_paths/write_paths) and the
  cluster's own, their names, descriptions and schemas read from `catalogue.json`, a byte-for-byte
  copy of the Rust catalogue (agent/catalogue.json);
- the same loop, bounded by the agent's `max_iterations` (10 when unset; ITERATION_LIMIT after),
  reporting the step's tokens and cost after every model call (StepProgress) so a budget can stop
  it mid-step;
- the same retries: the SDKs' own are off (max_retries=0) and each call is tried at most 3 times on
  429, 5xx and broken connections, waiting as Retry-After says (at most 60 s), else 0.25 s doubling;
- the same failures: MODEL_UNAVAILABLE, MODEL_TIMEOUT, MODEL_MALFORMED, MODEL_REFUSED,
  MODEL_KEY_MISSING, LLM_CONFIG_INVALID, ITERATION_LIMIT, OUTPUT_SCHEMA.

A step the service withdraws (CancelAssignment) stops at once: the step runs as an asyncio task
that is cancelled, which aborts the HTTP call in flight. An agent whose `llm_config` names no
provider is given to the `fallback` behaviour (the sample one by default).
"""

import asyncio
import email.utils
import json
import math
import os
import re
import threading
import time

import grpc
from google.protobuf import duration_pb2, json_format

from muster.execution.v1 import execution_pb2
from muster.roster.v1 import roster_pb2, roster_pb2_grpc

from . import HANDED_OFF, StepFailed, sample_behaviour, to_python, to_struct
from .workspace import Access, FileError, Workspace

DEFAULT_TIMEOUT_SECONDS = 120.0
MAX_ATTEMPTS = 3
MAX_RETRY_AFTER_SECONDS = 60.0
FIRST_BACKOFF_SECONDS = 0.25
ERROR_EXCERPT_CHARS = 300
DEFAULT_MAX_ITERATIONS = 10
MAX_TOOL_CALLS_PER_REPLY = 32
MAX_TOOL_RESULT_CHARS = 64 * 1024
MAX_NOTES = 16
MAX_NOTE_BYTES = 4096
TOOLS_KEPT_FOR_SECONDS = 30.0
ANTHROPIC_DEFAULT_MAX_TOKENS = 4096
ANTHROPIC_API_VERSION = "2023-06-01"
MAX_VALUE_CHARS = 16 * 1024
MAX_CONTEXT_FILE_CHARS = 64 * 1024
MAX_CONTEXT_CHARS = 256 * 1024
MAX_FILES_PER_FOLDER = 20
MAX_MEMORY_CHARS = 64 * 1024
RETRIED_STATUSES = (429, 500, 502, 503, 504, 529)

with open(os.path.join(os.path.dirname(__file__), "catalogue.json"), encoding="utf-8") as _file:
    CATALOGUE = json.load(_file)
"""The Rust catalogue (agent/catalogue.json): cluster_tools and workspace_tools, each with its
name, description and input_schema."""
CLUSTER_TOOLS = {tool["name"]: tool for tool in CATALOGUE["cluster_tools"]}
WORKSPACE_TOOLS = {tool["name"]: tool for tool in CATALOGUE["workspace_tools"]}


# --- settings ------------------------------------------------------------------------------------


class LlmConfig:
    """An agent's model settings, read from its assignment's llm_config."""

    def __init__(self, provider, base_url, model, temperature, max_tokens, timeout, api_key_env, prices):
        self.provider = provider
        self.base_url = base_url
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.api_key_env = api_key_env
        self.prices = prices  # (input_per_million, output_per_million) or None

    @classmethod
    def from_dict(cls, config):
        """The settings, or None when no provider is named; ValueError naming the key for a value the
        format library would refuse at import."""
        if not isinstance(config, dict) or config.get("provider") is None:
            return None
        provider = config["provider"]
        if provider not in ("openai", "anthropic"):
            raise ValueError(f"llm_config.provider {json.dumps(provider)} is neither \"openai\" nor \"anthropic\"")

        def text(key):
            value = config.get(key)
            if value is None:
                return None
            if isinstance(value, str) and value.strip():
                return value.strip()
            raise ValueError(f"llm_config.{key} must be a non-empty string")

        def number(key):
            value = config.get(key)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"llm_config.{key} must be a number")
            return float(value)

        model = text("model")
        if model is None:
            raise ValueError("llm_config.model is required with a provider")
        base_url = text("base_url") or ("https://api.openai.com/v1" if provider == "openai" else "https://api.anthropic.com")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError("llm_config.base_url must start with http:// or https://")
        timeout = number("timeout_seconds")
        if timeout is None:
            timeout = DEFAULT_TIMEOUT_SECONDS
        elif not 0 < timeout <= 3600:
            raise ValueError("llm_config.timeout_seconds must be above 0 and at most 3600")
        max_tokens = config.get("max_tokens")
        if max_tokens is not None:
            if isinstance(max_tokens, float) and max_tokens.is_integer():
                max_tokens = int(max_tokens)
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise ValueError("llm_config.max_tokens must be a whole number of at least 1")
        api_key_env = text("api_key_env")
        if api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api_key_env):
            raise ValueError("llm_config.api_key_env must name an environment variable ([A-Za-z_][A-Za-z0-9_]*)")
        prices = config.get("prices")
        if prices is not None:
            if not isinstance(prices, dict):
                raise ValueError("llm_config.prices must be a mapping")
            read = []
            for key in ("input_per_million", "output_per_million"):
                price = prices.get(key, 0)
                price = 0 if price is None else price
                if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price < 0:
                    raise ValueError(f"llm_config.prices.{key} must be a number of at least 0")
                read.append(float(price))
            prices = tuple(read)
        return cls(provider, base_url.rstrip("/"), model, number("temperature"), max_tokens, timeout, api_key_env, prices)

    def api_key(self, environment=None):
        """The key from the worker's environment; None when no variable is named; ModelError naming
        the variable (never a value) when it is unset."""
        if self.api_key_env is None:
            return None
        key = (os.environ if environment is None else environment).get(self.api_key_env, "").strip()
        if not key:
            raise ModelError(
                "MODEL_KEY_MISSING",
                f"the environment variable {self.api_key_env} (llm_config.api_key_env) is not set in the worker's environment",
                False,
            )
        return key

    def cost(self, input_tokens, output_tokens):
        if self.prices is None:
            return 0.0
        return (input_tokens * self.prices[0] + output_tokens * self.prices[1]) / 1_000_000


class ModelError(Exception):
    """A model call that failed: the step's error code, and whether another attempt may succeed."""

    def __init__(self, code, message, retryable):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = retryable


# --- the providers -------------------------------------------------------------------------------


def openai_body(config, system, turns, tools, output_schema):
    """A Chat Completions request, as the Rust agent makes it."""
    messages = [{"role": "system", "content": system}]
    for turn in turns:
        if turn["kind"] == "user":
            messages.append({"role": "user", "content": turn["text"]})
        elif turn["kind"] == "assistant":
            message = {"role": "assistant", "content": turn["text"] or None}
            if turn["tool_calls"]:
                message["tool_calls"] = [
                    {
                        "id": call["id"],
                        "type": "function",
                        "function": {
                            "name": call["name"],
                            "arguments": json.dumps(call["arguments"], separators=(",", ":"))
                            if call["arguments"] is not None
                            else call["raw"],
                        },
                    }
                    for call in turn["tool_calls"]
                ]
            messages.append(message)
        else:
            for result in turn["results"]:
                messages.append({"role": "tool", "tool_call_id": result["call_id"], "content": result["content"]})
    body = {"model": config.model, "messages": messages}
    if tools:
        body["tools"] = [
            {"type": "function", "function": {"name": tool["name"], "description": tool["description"], "parameters": tool["input_schema"]}}
            for tool in tools
        ]
    if config.temperature is not None:
        body["temperature"] = config.temperature
    if config.max_tokens is not None:
        body["max_tokens"] = config.max_tokens
    if output_schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "step_output", "schema": output_schema}}
    return body


def anthropic_body(config, system, turns, tools):
    """A Messages request, as the Rust agent makes it."""
    messages = []
    for turn in turns:
        if turn["kind"] == "user":
            messages.append({"role": "user", "content": turn["text"]})
        elif turn["kind"] == "assistant":
            content = [{"type": "text", "text": turn["text"]}] if turn["text"] else []
            for call in turn["tool_calls"]:
                arguments = call["arguments"] if call["arguments"] is not None else {}
                content.append({"type": "tool_use", "id": call["id"], "name": call["name"], "input": arguments})
            messages.append({"role": "assistant", "content": content})
        else:
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": r["call_id"], "content": r["content"], "is_error": r["is_error"]}
                        for r in turn["results"]
                    ],
                }
            )
    body = {
        "model": config.model,
        "system": system,
        "max_tokens": config.max_tokens or ANTHROPIC_DEFAULT_MAX_TOKENS,
        "messages": messages,
    }
    if tools:
        body["tools"] = [{"name": t["name"], "description": t["description"], "input_schema": t["input_schema"]} for t in tools]
    if config.temperature is not None:
        body["temperature"] = config.temperature
    return body


def _tokens(value):
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def openai_reply(answer):
    """(text, tool calls, input tokens, output tokens, model) of a Chat Completions answer."""
    try:
        message = answer["choices"][0]["message"]
        assert isinstance(message, dict)
    except (KeyError, IndexError, TypeError, AssertionError):
        raise ValueError("no choices[0].message in the answer") from None
    text = message.get("content")
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise ValueError("choices[0].message.content is not text")
    calls = []
    raw_calls = message.get("tool_calls")
    if raw_calls is not None:
        if not isinstance(raw_calls, list):
            raise ValueError("choices[0].message.tool_calls is not a list")
        for index, call in enumerate(raw_calls):
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str):
                raise ValueError(f"tool_calls[{index}] has no function.name")
            raw = function.get("arguments")
            arguments, text_of = {}, None
            if isinstance(raw, str) and raw.strip():
                try:
                    arguments = json.loads(raw)
                except ValueError:
                    arguments = None
                if not isinstance(arguments, dict):
                    arguments, text_of = None, raw
            elif isinstance(raw, dict):
                arguments = raw
            elif raw not in (None, "") and not isinstance(raw, str):
                arguments, text_of = None, json.dumps(raw)
            calls.append({"id": call.get("id") or f"call_{index}", "name": name, "arguments": arguments, "raw": text_of})
    usage = answer.get("usage") or {}
    return text, calls, _tokens(usage.get("prompt_tokens")), _tokens(usage.get("completion_tokens")), answer.get("model") or ""


def anthropic_reply(answer):
    """(text, tool calls, input tokens, output tokens, model) of a Messages answer."""
    blocks = answer.get("content")
    if not isinstance(blocks, list):
        raise ValueError("no content list in the answer")
    text, calls = "", []
    for index, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            text += block.get("text") or ""
        elif kind == "tool_use":
            name = block.get("name")
            if not isinstance(name, str):
                raise ValueError(f"content[{index}] (tool_use) has no name")
            given = block.get("input")
            arguments, raw = (given, None) if isinstance(given, dict) else ({}, None) if given is None else (None, json.dumps(given))
            calls.append({"id": block.get("id") or f"toolu_{index}", "name": name, "arguments": arguments, "raw": raw})
    usage = answer.get("usage") or {}
    return text, calls, _tokens(usage.get("input_tokens")), _tokens(usage.get("output_tokens")), answer.get("model") or ""


def retry_after(headers):
    """The wait a Retry-After header asks for, in seconds: seconds, or an HTTP date."""
    value = (headers.get("retry-after") or "").strip() if headers is not None else ""
    if not value:
        return None
    try:
        seconds = float(value)
        return min(seconds, 86_400.0) if math.isfinite(seconds) and seconds >= 0 else None
    except ValueError:
        pass
    try:
        at = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(at.timestamp() - time.time(), 0.0)


def excerpt(text):
    line = " ".join(text.split())
    return line[:ERROR_EXCERPT_CHARS] + "…" if len(line) > ERROR_EXCERPT_CHARS else line


class Model:
    """A model endpoint as one agent's settings describe it, called through the official SDK."""

    def __init__(self, config, environment=None):
        self.config = config
        self._environment = environment

    def _client(self, key):
        config = self.config
        # The SDKs' retries are off: ours (3 attempts, Retry-After) are in charge. The key is always
        # given, so the SDK never reads OPENAI_API_KEY or ANTHROPIC_API_KEY by itself; without one, a
        # placeholder whose header each request omits.
        key = key or "no-key"
        if config.provider == "openai":
            import openai

            return openai.AsyncOpenAI(api_key=key, base_url=config.base_url, timeout=config.timeout, max_retries=0)
        import anthropic

        return anthropic.AsyncAnthropic(api_key=key, base_url=config.base_url, timeout=config.timeout, max_retries=0)

    async def _post(self, client, body, key):
        """One HTTP attempt: the httpx response of a 2xx answer (the SDK raises for the others)."""
        if self.config.provider == "openai":
            import openai

            # Without a key (a local server) no credential header is sent, as the SDK is told explicitly.
            extra = {} if key else {"extra_headers": {"Authorization": openai.Omit()}}
            raw = await client.chat.completions.with_raw_response.create(**body, **extra)
        else:
            import anthropic

            # The same wire as the Rust agent's: the key as x-api-key, API version 2023-06-01 (this SDK
            # would send it as a bearer token, with a newer version).
            headers = {"Authorization": anthropic.Omit(), "anthropic-version": ANTHROPIC_API_VERSION}
            headers["x-api-key"] = key if key else anthropic.Omit()
            extra = {"extra_headers": headers}
            raw = await client.messages.with_raw_response.create(**body, **extra)
        return raw.http_response

    async def complete(self, body):
        """One model call: (answer as JSON, attempts, latency in seconds); ModelError when it fails."""
        key = self.config.api_key(self._environment)
        if self.config.provider == "openai":
            import openai as sdk
        else:
            import anthropic as sdk
        client = self._client(key)
        started = time.monotonic()
        pause, attempts, timed_out = FIRST_BACKOFF_SECONDS, 0, 0
        try:
            while True:
                attempts += 1
                try:
                    response = await self._post(client, body, key)
                    text = response.text
                    try:
                        answer = json.loads(text)
                    except ValueError as error:
                        raise ModelError("MODEL_MALFORMED", f"the model's answer could not be read: not JSON ({error}): {excerpt(text)}", True) from None
                    return answer, attempts, time.monotonic() - started
                except sdk.APIStatusError as error:
                    status = error.status_code
                    body_text = excerpt(error.response.text if error.response is not None else str(error))
                    if status not in RETRIED_STATUSES:
                        raise ModelError("MODEL_REFUSED", f"the model endpoint refused the request: HTTP {status}: {body_text}", False) from None
                    wait = retry_after(error.response.headers if error.response is not None else None)
                    if wait is not None:
                        if wait > MAX_RETRY_AFTER_SECONDS:
                            raise ModelError(
                                "MODEL_UNAVAILABLE",
                                f"the model endpoint was unavailable after {attempts} attempt(s): HTTP {status}, Retry-After {int(wait)} s is too long to wait",
                                True,
                            ) from None
                        pause = wait
                    failure = f"HTTP {status}: {body_text}"
                except sdk.APITimeoutError:
                    timed_out += 1
                    failure = "timed out"
                except sdk.APIConnectionError as error:
                    failure = str(error) or type(error).__name__
                if attempts >= MAX_ATTEMPTS:
                    if timed_out == attempts:
                        raise ModelError(
                            "MODEL_TIMEOUT",
                            f"the model endpoint did not answer within {self.config.timeout:g} s ({MAX_ATTEMPTS} attempts)",
                            True,
                        )
                    raise ModelError("MODEL_UNAVAILABLE", f"the model endpoint was unavailable after {attempts} attempt(s): {failure}", True)
                await asyncio.sleep(pause)
                pause = min(pause * 2, MAX_RETRY_AFTER_SECONDS)
        finally:
            await client.close()


def answer_as_output(text):
    """The text of a model's final answer as a step's output: the JSON it gave (an object or array,
    bare or in a fenced block), else the text itself."""
    trimmed = text.strip()
    unfenced = trimmed
    for prefix in ("```json", "```"):
        if trimmed.startswith(prefix) and trimmed.endswith("```") and len(trimmed) >= len(prefix) + 3:
            unfenced = trimmed[len(prefix) : -3].strip()
            break
    try:
        value = json.loads(unfenced)
    except ValueError:
        return trimmed
    return value if isinstance(value, (dict, list)) else trimmed


# --- JSON schemas (the subset the catalogue and simple output schemas use) ------------------------


def schema_problem(schema, value, at=""):
    """The first way `value` misses `schema`, or None: type, enum, const, required, properties,
    additionalProperties, items, minItems/maxItems, minLength/maxLength, pattern, minimum/maximum."""
    if not isinstance(schema, dict):
        return None
    kinds = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool) or isinstance(v, float) and v.is_integer(),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    }
    where = at or "the value"
    wanted = schema.get("type")
    if wanted is not None:
        names = wanted if isinstance(wanted, list) else [wanted]
        if not any(kinds.get(name, lambda v: True)(value) for name in names):
            return f"{where}: {json.dumps(value)} is not of type {json.dumps(wanted)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where}: {json.dumps(value)} is not one of {json.dumps(schema['enum'])}"
    if "const" in schema and value != schema["const"]:
        return f"{where}: {json.dumps(value)} is not {json.dumps(schema['const'])}"
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                return f"{where}: {json.dumps(name)} is a required property"
        properties = schema.get("properties", {})
        for name, item in value.items():
            if name in properties:
                problem = schema_problem(properties[name], item, f"{at}/{name}")
                if problem:
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"{where}: additional property {json.dumps(name)} is not allowed"
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            return f"{where}: has more than {schema['maxItems']} items"
        if "minItems" in schema and len(value) < schema["minItems"]:
            return f"{where}: has fewer than {schema['minItems']} items"
        for index, item in enumerate(value):
            problem = schema_problem(schema.get("items"), item, f"{at}/{index}")
            if problem:
                return problem
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            return f"{where}: is longer than {schema['maxLength']} characters"
        if "minLength" in schema and len(value) < schema["minLength"]:
            return f"{where}: is shorter than {schema['minLength']} characters"
        if "pattern" in schema and not re.search(schema["pattern"], value):
            return f"{where}: {json.dumps(value)} does not match {json.dumps(schema['pattern'])}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where}: {value} is less than the minimum of {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where}: {value} is greater than the maximum of {schema['maximum']}"
    return None


# --- what the model is told ----------------------------------------------------------------------


def _truncate(text, most):
    if len(text) <= most:
        return text
    return f"{text[:most]}\n… ({len(text) - most} more characters left out)"


def _fenced(value):
    return "```json\n" + _truncate(json.dumps(value, indent=2, ensure_ascii=False), MAX_VALUE_CHARS) + "\n```"


def system_prompt(assignment):
    prompt = assignment.system_prompt.strip() or f"You are {assignment.agent_id}, an agent of a team run by muster."
    if assignment.session_context.strip():
        prompt += f"\n\n# Team session\nYour role in it: {assignment.session_role}\n{assignment.session_context.strip()}"
    return prompt


def read_context_files(workspace, paths):
    """The role's context files from the workspace: [(path, text or None, why not)]."""
    files, left = [], MAX_CONTEXT_CHARS
    for path in paths:
        try:
            listed = workspace.list_files(path)
            names = [
                f"{path.rstrip('/')}/{entry['name']}" for entry in listed["entries"] if entry["kind"] == "file"
            ][:MAX_FILES_PER_FOLDER]
            if not names:
                files.append((path, None, "the folder holds no file"))
        except FileError:
            names = [path]
        for name in names:
            if left == 0:
                files.append((name, None, "left out: the context files already fill the prompt's share"))
                continue
            try:
                text = workspace.read_file(name)["content"]
            except FileError as error:
                files.append((name, None, str(error)))
                continue
            kept = _truncate(text, min(MAX_CONTEXT_FILE_CHARS, left))
            left = max(left - len(kept), 0)
            files.append((name, kept, None))
    return files


def output_schema(assignment):
    role = assignment.role_definition if assignment.HasField("role_definition") else None
    if role is None or not role.HasField("output_schema") or not role.output_schema.fields:
        return None
    return to_python(role.output_schema)


def _timestamp(timestamp):
    return timestamp.ToJsonString() if timestamp.ByteSize() else ""


def task(assignment, context_files):
    """The first user message: the assignment."""
    name = "" if not assignment.step_name or assignment.step_name == assignment.step_id else f" ({assignment.step_name})"
    text = (
        f"# Your task\nProcess {assignment.process_name} (version {assignment.process_version}), execution "
        f"{assignment.execution_id}, step {assignment.step_id}{name}, attempt {assignment.attempt}.\n\n"
    )
    instruction = assignment.message.strip()
    text += (instruction or "(The step gives no instruction: do what your role is for.)") + "\n"
    inputs = to_python(assignment.inputs) if assignment.HasField("inputs") else None
    if inputs:
        text += f"\n## Inputs\n{_fenced(inputs)}\n"
    if assignment.upstream_outputs:
        text += "\n## What the steps this one depends on produced\n"
        for step in sorted(assignment.upstream_outputs):
            text += f"### {step}\n{_fenced(to_python(assignment.upstream_outputs[step]))}\n"
    if assignment.HasField("shared_memory"):
        memory = to_python(assignment.shared_memory) or {}
        earlier = ""
        for step in sorted(memory):
            if step in assignment.upstream_outputs or len(earlier) > MAX_MEMORY_CHARS:
                continue
            earlier += f"### {step}\n{_fenced(memory[step])}\n"
        if earlier:
            text += f"\n## Earlier steps this one builds on\n{earlier}"
    if assignment.history:
        text += "\n## History (oldest first)\n"
        for entry in assignment.history:
            text += f"- {_timestamp(entry.at)} {entry.step_id}: {entry.action} by {entry.agent_id}\n"
    if assignment.memory:
        text += "\n## What your team remembers (newest first)\n"
        for entry in assignment.memory:
            scope = "global" if entry.scope == execution_pb2.MEMORY_SCOPE_GLOBAL else f"role {entry.role}"
            text += f"- [{scope}, by {entry.author}] {entry.text.strip()}\n"
    if context_files:
        text += "\n## Context files (from the workspace)\n"
        for path, content, why in context_files:
            if content is not None:
                text += f"### {path}\n```\n{content.rstrip()}\n```\n"
            else:
                text += f"### {path}\n(not read: {why})\n"
    text += (
        "\n## How to answer\nUse the tools offered when they help. When you are done, answer with the step's "
        "result: plain text, or a JSON object when the result has structure. Your answer is the step's output.\n"
    )
    schema = output_schema(assignment)
    if schema is not None:
        text += f"The answer must be a JSON object matching this JSON schema, and nothing else:\n{_fenced(schema)}\n"
    return text


# --- the agent -----------------------------------------------------------------------------------


class _Withdrawn(Exception):
    pass


def tool_error(code, message):
    return {"error": {"code": code, "message": message}}


_STATUS_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_arguments",
    grpc.StatusCode.OUT_OF_RANGE: "invalid_arguments",
    grpc.StatusCode.PERMISSION_DENIED: "permission_denied",
    grpc.StatusCode.UNAUTHENTICATED: "permission_denied",
    grpc.StatusCode.NOT_FOUND: "not_found",
    grpc.StatusCode.ALREADY_EXISTS: "already_exists",
    grpc.StatusCode.FAILED_PRECONDITION: "failed_precondition",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "resource_exhausted",
    grpc.StatusCode.UNAVAILABLE: "unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "unavailable",
}


class _ToolError(Exception):
    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


def _refused(error):
    return _ToolError(_STATUS_CODES.get(error.code(), "internal"), error.details() or str(error.code()))


def _wire_json(message):
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


class ModelAgent:
    """The model-driven behaviour: pass it to `Worker(..., behaviour=ModelAgent(...))`.

    workspace: the folder its file tools act in (made, 0700, when missing); roster: the roster's
    `host:port`, for get_organization_roster; fallback: the behaviour of agents whose llm_config
    names no provider; environment: where keys are read (the process's environment by default)."""

    def __init__(self, workspace, roster="127.0.0.1:50052", fallback=sample_behaviour, environment=None):
        self.workspace = Workspace(workspace)
        self._roster_address = roster
        self._roster = None
        self._fallback = fallback
        self._environment = environment
        self._lock = threading.Lock()
        self._registered = (0.0, [])

    @staticmethod
    def serves(assignment):
        """Whether the assignment's agent is model-driven: its llm_config names a provider."""
        return assignment.HasField("llm_config") and "provider" in assignment.llm_config.fields

    def __call__(self, assignment, context):
        if not self.serves(assignment):
            try:
                return self._fallback(assignment, context)
            except TypeError:
                return self._fallback(assignment)
        try:
            config = LlmConfig.from_dict(to_python(assignment.llm_config))
        except ValueError as problem:
            raise StepFailed("LLM_CONFIG_INVALID", str(problem)) from None
        return asyncio.run(self._watched(_Step(self, assignment, context, Model(config, self._environment))))

    async def _watched(self, step):
        """Runs the step as a task, cancelled (and its HTTP call with it) when the service withdraws it."""
        task = asyncio.ensure_future(step.run())
        while not task.done():
            await asyncio.wait({task}, timeout=0.05)
            if step.context.cancelled.is_set() and not task.done():
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass
                raise _Withdrawn("withdrawn by the execution service")
        return task.result()

    def roster_stub(self):
        with self._lock:
            if self._roster is None:
                self._roster = roster_pb2_grpc.RosterServiceStub(grpc.insecure_channel(self._roster_address))
            return self._roster

    def registered_tools(self, context):
        """The tools connected workers provide, read at most every 30 s."""
        with self._lock:
            read_at, tools = self._registered
            if time.monotonic() - read_at < TOOLS_KEPT_FOR_SECONDS and read_at:
                return tools
        tools, page_token = [], ""
        for _ in range(10):
            try:
                page = context.execution.ListTools(
                    execution_pb2.ListToolsRequest(page_size=1000, page_token=page_token), metadata=context.metadata
                )
            except grpc.RpcError:
                break
            tools.extend(page.tools)
            page_token = page.next_page_token
            if not page_token:
                break
        with self._lock:
            self._registered = (time.monotonic(), tools)
        return tools


class _Step:
    """One run of one assignment: the loop of model calls and tool calls."""

    def __init__(self, agent, assignment, context, model):
        self.agent, self.assignment, self.context, self.model = agent, assignment, context, model
        role = assignment.role_definition
        self.role = role
        self.access = Access(role.read_paths, role.write_paths)
        self.workspace_tools = [name for name in role.tools if name in WORKSPACE_TOOLS]
        self.provided = [name for name in role.tools if name not in WORKSPACE_TOOLS and name not in CLUSTER_TOOLS]
        self.input_tokens = self.output_tokens = 0
        self.cost = 0.0
        self.notes = []
        self.skip_triggers = False
        self.posts = 0

    async def run(self):
        assignment = self.assignment
        context_files = await asyncio.to_thread(read_context_files, self.agent.workspace, list(self.role.context_files))
        system = system_prompt(assignment)
        turns = [{"kind": "user", "text": task(assignment, context_files)}]
        tools = await asyncio.to_thread(self.offered_tools)
        schema = output_schema(assignment)
        max_iterations = assignment.max_iterations or DEFAULT_MAX_ITERATIONS
        corrected = False
        for iteration in range(1, max_iterations + 1):
            if self.model.config.provider == "openai":
                body = openai_body(self.model.config, system, turns, tools, schema)
            else:
                body = anthropic_body(self.model.config, system, turns, tools)
            try:
                answer, _attempts, latency = await self.model.complete(body)
                read = openai_reply if self.model.config.provider == "openai" else anthropic_reply
                try:
                    text, calls, input_tokens, output_tokens, model = read(answer)
                except ValueError as problem:
                    raise ModelError("MODEL_MALFORMED", f"the model's answer could not be read: {problem}", True) from None
            except ModelError as error:
                raise StepFailed(error.code, error.message, error.retryable) from None
            self.count(iteration, model, input_tokens, output_tokens, latency, calls)
            if not calls:
                output = answer_as_output(text)
                problem = schema_problem(schema, output) if schema is not None else None
                if problem is not None:
                    if corrected:
                        raise StepFailed(
                            "OUTPUT_SCHEMA",
                            f"the model's answer does not match the role's output schema, even after being told why: {problem}",
                        )
                    corrected = True
                    turns.append({"kind": "assistant", "text": text, "tool_calls": []})
                    turns.append(
                        {
                            "kind": "user",
                            "text": f"Your answer does not match the required output schema: {problem}. Answer again with "
                            "only the JSON object, matching the schema.",
                        }
                    )
                    continue
                extra = {
                    "remember": self.notes,
                    "skip_triggers": self.skip_triggers,
                    "iterations": iteration,
                }
                return output, self.input_tokens + self.output_tokens, self.cost, extra
            turns.append({"kind": "assistant", "text": text, "tool_calls": calls})
            results = []
            for index, call in enumerate(calls):
                if index >= MAX_TOOL_CALLS_PER_REPLY:
                    result = _ToolError("too_many_calls", f"at most {MAX_TOOL_CALLS_PER_REPLY} tool calls are run per answer")
                else:
                    result = await self.call(call)
                if result is HANDED_OFF:
                    return HANDED_OFF
                results.append(self.tool_result(call["id"], result))
            turns.append({"kind": "tool_results", "results": results})
        raise StepFailed(
            "ITERATION_LIMIT",
            f"the model was still calling tools after {max_iterations} model calls, the agent's max_iterations",
        )

    def count(self, iteration, model, input_tokens, output_tokens, latency, calls):
        """Adds a call's usage and reports the step's use so far, with the call's record."""
        cost = self.model.config.cost(input_tokens, output_tokens)
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cost += cost
        millis = int(latency * 1000)
        record = execution_pb2.ModelCall(
            iteration=iteration,
            model=model or self.model.config.model,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            latency=duration_pb2.Duration(seconds=millis // 1000, nanos=(millis % 1000) * 1_000_000),
            tool_calls=[call["name"] for call in calls][:64],
            cost=cost,
        )
        self.context.progress(
            self.input_tokens + self.output_tokens, self.cost, message=f"model call {iteration}", model_call=record
        )

    def offered_tools(self):
        """The role's workspace tools, its provided tools (with their registered schemas), then the cluster's."""
        tools = [WORKSPACE_TOOLS[name] for name in self.workspace_tools]
        if self.provided:
            registered = {spec.name: spec for spec in self.agent.registered_tools(self.context)}
            for name in self.provided:
                spec = registered.get(name)
                schema = to_python(spec.input_schema) if spec is not None and spec.HasField("input_schema") else None
                tools.append(
                    {
                        "name": name,
                        "description": (spec.description if spec is not None and spec.description else f"The {name} tool of your role."),
                        "input_schema": schema or {"type": "object"},
                    }
                )
        return tools + list(CATALOGUE["cluster_tools"])

    @staticmethod
    def tool_result(call_id, result):
        if isinstance(result, _ToolError):
            value, is_error = tool_error(result.code, result.message), True
        else:
            value, is_error = result, False
        content = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
        if len(content) > MAX_TOOL_RESULT_CHARS:
            content = f"{content[:MAX_TOOL_RESULT_CHARS]}… (cut at {MAX_TOOL_RESULT_CHARS} characters)"
        return {"call_id": call_id, "content": content, "is_error": is_error}

    async def call(self, call):
        """Runs one tool call: its result, a _ToolError, or HANDED_OFF."""
        arguments = call["arguments"]
        if arguments is None:
            return _ToolError("invalid_arguments", f"the arguments are not a JSON object: {(call['raw'] or '')[:200]}")
        name = call["name"]
        try:
            if name in self.workspace_tools:
                problem = schema_problem(WORKSPACE_TOOLS[name]["input_schema"], arguments)
                if problem:
                    return _ToolError("invalid_arguments", problem)
                return await asyncio.to_thread(self.workspace_call, name, arguments)
            if name in CLUSTER_TOOLS:
                problem = schema_problem(CLUSTER_TOOLS[name]["input_schema"], arguments)
                if problem:
                    return _ToolError("invalid_arguments", problem)
                return await self.cluster_call(name, call["id"], arguments)
            if name in self.provided:
                return await asyncio.to_thread(self.invoke, name, arguments)
        except _ToolError as error:
            return error
        return _ToolError("unknown_tool", f"no tool named '{name}' is offered to you")

    def workspace_call(self, name, arguments):
        workspace, access = self.agent.workspace, self.access
        text = lambda key: arguments.get(key) or ""  # noqa: E731
        try:
            if name == "read_file":
                return workspace.read_file(text("path"), access)
            if name in ("write_file", "append_file"):
                return workspace.write_file(text("path"), text("content"), name == "append_file", access)
            if name == "list_files":
                return workspace.list_files(text("path"), access)
            return workspace.move_file(text("from"), text("to"), access)
        except FileError as error:
            raise _ToolError("file_refused", str(error)) from None
        except OSError as error:
            raise _ToolError("file_refused", f"{text('path') or text('from')}: {os.strerror(error.errno or 0)}") from None

    def invoke(self, tool, arguments):
        """A tool a provider serves, through the execution service (which checks the role's
        permission and the input's schema, and routes the call)."""
        request = execution_pb2.InvokeToolRequest(
            tool=tool, input=to_struct(arguments), execution_id=self.assignment.execution_id
        )
        try:
            output = self.context.execution.InvokeTool(request, metadata=self.context.metadata).output
        except grpc.RpcError as error:
            raise _refused(error) from None
        if output.status_code == 200:
            return to_python(output.output) if output.HasField("output") else None
        code = {400: "invalid_arguments", 403: "permission_denied", 404: "not_found"}.get(output.status_code, "tool_failed")
        raise _ToolError(code, f"{output.error} (status {output.status_code})")

    async def cluster_call(self, name, call_id, arguments):
        text = lambda key: arguments.get(key) or ""  # noqa: E731
        execution_id = self.assignment.execution_id
        stub, metadata = self.context.execution, self.context.metadata

        def call(method, request):
            try:
                return _wire_json(method(request, metadata=metadata))
            except grpc.RpcError as error:
                raise _refused(error) from None

        if name == "get_organization_roster":
            filters = {
                "my_team": roster_pb2.ROSTER_FILTER_MY_TEAM,
                "available": roster_pb2.ROSTER_FILTER_AVAILABLE,
                "by_expertise": roster_pb2.ROSTER_FILTER_BY_EXPERTISE,
            }
            request = roster_pb2.GetOrganizationRosterRequest(
                agent_id=self.assignment.agent_id,
                filter=filters.get(text("filter"), roster_pb2.ROSTER_FILTER_ALL),
                expertise=text("expertise"),
            )
            return await asyncio.to_thread(call, self.agent.roster_stub().GetOrganizationRoster, request)
        if name == "delegate_task":
            accepted, reason = await asyncio.to_thread(
                self.context.delegate,
                text("to_agent_id"),
                [tag for tag in arguments.get("expertise") or [] if isinstance(tag, str)],
                text("role"),
                text("reason"),
            )
            if accepted:
                return HANDED_OFF
            raise _ToolError("delegation_refused", reason)
        if name == "get_my_role":
            return await asyncio.to_thread(call, stub.GetMyRole, execution_pb2.GetMyRoleRequest(execution_id=execution_id))
        if name == "role_check":
            request = execution_pb2.CheckRoleRequest(execution_id=execution_id, action=text("action"), agent_id=text("agent_id"))
            return await asyncio.to_thread(call, stub.CheckRole, request)
        if name == "assign_role":
            request = execution_pb2.AssignRoleRequest(
                execution_id=execution_id, agent_id=text("agent_id"), role=text("role"), subtask=text("subtask")
            )
            return await asyncio.to_thread(call, stub.AssignRole, request)
        if name == "post_to_inbox":
            priorities = {"low": execution_pb2.MESSAGE_PRIORITY_LOW, "high": execution_pb2.MESSAGE_PRIORITY_HIGH}
            self.posts += 1
            request = execution_pb2.PostToInboxRequest(
                inbox=text("inbox"),
                priority=priorities.get(text("priority"), execution_pb2.MESSAGE_PRIORITY_NORMAL),
                body=text("body"),
                subject=text("subject"),
                # A call the model makes once is posted once, however often it is sent.
                idempotency_key=f"{self.context.assignment_id}/{call_id}/{self.posts}",
            )
            try:
                answer = await asyncio.to_thread(stub.PostToInbox, request, metadata=metadata)
            except grpc.RpcError as error:
                raise _refused(error) from None
            return {"message_id": answer.message.id, "triggered_execution_ids": list(answer.triggered_execution_ids)}
        if name == "remember":
            return self.remember(text("text"), text("scope"))
        self.skip_triggers = True  # skip_triggers
        return {"skip_triggers": True, "reason": text("reason")}

    def remember(self, note, scope):
        if len(self.notes) >= MAX_NOTES:
            raise _ToolError("resource_exhausted", f"a step may leave at most {MAX_NOTES} notes")
        is_global = scope == "global"
        if not is_global and not self.assignment.HasField("role_definition"):
            raise _ToolError("failed_precondition", 'you hold no role: use scope "global"')
        if not note.strip() or len(note.encode()) > MAX_NOTE_BYTES:
            raise _ToolError(
                "invalid_arguments", f"a note holds 1 to {MAX_NOTE_BYTES} bytes; this one has {len(note.strip().encode())}"
            )
        self.notes.append(("global" if is_global else "role", note))
        return {"remembered": True, "scope": "global" if is_global else "role", "notes": len(self.notes)}
