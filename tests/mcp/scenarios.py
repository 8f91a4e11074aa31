"""`muster mcp` driven by the official MCP Python SDK, as MCP clients use it.

Run by tests/tests/e2e/mcp.rs against a real cluster, with:
MUSTER (the command), the services' URLs (MUSTER_*_URL), MCP_URL (a
`muster mcp --listen` server), and the roster tokens WRITER_TOKEN (stdio),
THIRD_TOKEN and READER_TOKEN (HTTP), and the ids FIRST_EXECUTION (three
steps for the writer; the client leaves holding the last), SESSION (a
session where the writer is an analyst) and SECOND_EXECUTION (two steps for the third agent,
the reader informed). Prints `ok: ...` for each check; a failed check ends
the program with a traceback. After the second execution's first step it
takes the second and leaves without ending it: the test then checks the
cluster gave it back.
"""

import asyncio
import contextlib
import json
import os
import sys

import httpx2
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client


def ok(what):
    print(f"ok: {what}", flush=True)


def check(condition, what):
    if not condition:
        raise AssertionError(f"failed: {what}")
    ok(what)


def answer(result):
    """A tool result's structured content, and whether it is an error."""
    return result.structured_content, bool(result.is_error)


async def call(client, name, arguments):
    return answer(await client.call_tool(name, arguments))


WORK_TOOLS = {
    "get_organization_roster", "delegate_task", "get_my_role", "role_check", "assign_role", "post_to_inbox",
    "remember", "start_session", "set_lead", "list_notifications", "acknowledge_notifications", "next_assignment",
    "complete_step", "fail_step", "delegate_step", "invoke_tool",
}


async def over_stdio():
    environment = {key: value for key, value in os.environ.items() if key.startswith("MUSTER_")}
    environment["MUSTER_TOKEN"] = os.environ["WRITER_TOKEN"]
    server = StdioServerParameters(command=os.environ["MUSTER"], args=["mcp"], env=environment)
    async with Client(server) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        check(WORK_TOOLS <= set(tools), f"every tool is listed ({sorted(WORK_TOOLS - set(tools))} missing)")
        complete = tools["complete_step"].input_schema
        check(complete["required"] == ["assignment_id"] and complete["additionalProperties"] is False,
              "complete_step's schema is StepResult's: assignment_id required, nothing unknown")
        check("output" in complete["properties"] and "skip_triggers" in complete["properties"]
              and "duration" not in complete["properties"], "complete_step takes output and skip_triggers")
        scopes = complete["properties"]["remember"]["items"]["properties"]["scope"]["enum"]
        check("MEMORY_SCOPE_ROLE" in scopes, "enums are offered by name")
        check(tools["fail_step"].input_schema["properties"]["retryable"]["type"] == "boolean", "fail_step's schema")
        delegate = tools["delegate_task"].input_schema
        check("assignment_id" in delegate["required"], "the catalogue's delegate_task names the step it hands on")

        first = os.environ["FIRST_EXECUTION"]
        for index in range(2):
            taken, error = await call(client, "next_assignment", {"wait_seconds": 30})
            check(not error and taken["assignment"] is not None, f"step {index} of the run is taken")
            assignment = taken["assignment"]
            check(assignment["execution_id"] == first and assignment["step_id"] == f"s{index}",
                  f"it is s{index} of {first}")
            if index == 1:
                check(assignment["shared_memory"].get("s0") == {"text": "done s0"},
                      f"s1's shared memory holds what s0 produced: {assignment.get('shared_memory')}")
            if index == 0:
                refused, error = await call(client, "delegate_step", {
                    "assignment_id": assignment["assignment_id"], "to_agent_id": "nobody", "reason": "try"})
                check(error and refused["error"]["code"] == "delegation_refused"
                      and "does not allow delegation" in refused["error"]["message"],
                      f"a delegation the cluster refuses says why, and the step stays held: {refused}")
            noted, error = await call(client, "remember", {"assignment_id": assignment["assignment_id"],
                                                            "text": f"s{index} was done over MCP", "scope": "global"})
            check(not error and noted["remembered"], "a note is kept for the step")
            ended, error = await call(client, "complete_step", {
                "assignment_id": assignment["assignment_id"], "output": {"text": f"done s{index}"}, "tokens_used": 7})
            check(not error and ended["ended"] == "completed", f"s{index} is completed")

        # Malformed arguments: a clear error, nothing changed.
        wrong, error = await call(client, "complete_step", {"assignment_id": 5})
        check(error and wrong["error"]["code"] == "invalid_arguments" and "assignment_id" in wrong["error"]["message"],
              f"a number for assignment_id is refused, naming it: {wrong}")
        wrong, error = await call(client, "complete_step", {"assignment_id": "a-1", "colour": "red"})
        check(error and wrong["error"]["code"] == "invalid_arguments" and "colour" in wrong["error"]["message"],
              f"an unknown argument is refused, naming it: {wrong}")
        wrong, error = await call(client, "complete_step", {"assignment_id": "not-held"})
        check(error and wrong["error"]["code"] == "not_found" and "not-held" in wrong["error"]["message"],
              f"a step not held is refused: {wrong}")
        wrong, error = await call(client, "next_assignment", {"wait_seconds": 61})
        check(error and wrong["error"]["code"] == "invalid_arguments", "a wait over 60 s is refused")

        # A refused action: the cluster's reason as a tool error.
        refused, error = await call(client, "set_lead", {"execution_id": first, "agent_id": "mcp-third"})
        check(error and refused["error"]["code"] == "permission_denied" and refused["error"]["message"],
              f"set_lead by an agent that may not is refused with the cluster's reason: {refused}")
        # In the session, the writer is an analyst: the matrix does not let it assign roles.
        refused, error = await call(client, "assign_role", {
            "execution_id": os.environ["SESSION"], "agent_id": "mcp-reader", "role": "developer"})
        check(error and refused["error"]["code"] == "permission_denied" and "analyst" in refused["error"]["message"],
              f"assign_role by an analyst is refused with the matrix's reason: {refused}")
        mine, error = await call(client, "get_my_role", {"execution_id": os.environ["SESSION"]})
        check(not error and mine["assignment"]["role"] == "analyst", f"get_my_role says analyst: {mine}")
        roster, error = await call(client, "get_organization_roster", {"filter": "all"})
        check(not error and roster["agent_context"]["id"] == "mcp-writer"
              and any(agent["id"] == "mcp-third" for agent in roster["colleagues"]),
              "the roster tool answers as the agent")

        resources = {resource.uri for resource in (await client.list_resources()).resources}
        check({"muster://notifications", "muster://role", "muster://prompt", "muster://roster"} <= set(map(str, resources)),
              "the resources are listed")
        prompt = await client.read_resource("muster://prompt")
        check("mcp-writer" in prompt.contents[0].text, "the rendered system prompt is the agent's")

        # The last step is taken, and the client goes away without ending it.
        taken, error = await call(client, "next_assignment", {"wait_seconds": 30})
        check(not error and taken["assignment"]["step_id"] == "s2", "s2 is taken, and the stdio client exits")


def http_client(token):
    return Client(streamable_http_client(os.environ["MCP_URL"], http_client=httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}"}, timeout=httpx2.Timeout(90.0))))


async def over_http():
    second = os.environ["SECOND_EXECUTION"]
    async with httpx2.AsyncClient() as plain:
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        anonymous = await plain.post(os.environ["MCP_URL"], json=initialize)
        check(anonymous.status_code == 401 and "Bearer" in anonymous.text, "a request without a token is answered 401")
        forged = await plain.post(os.environ["MCP_URL"], json=initialize, headers={"Authorization": "Bearer forged"})
        check(forged.status_code == 401 and "refused" in forged.text, f"a token the roster refuses is answered 401: {forged.text}")

    # An agent holds at most 8 subscriptions at once.
    async with http_client(os.environ["THIRD_TOKEN"]) as third, contextlib.AsyncExitStack() as held:
        for _ in range(8):
            await held.enter_async_context(third.listen(resource_subscriptions=["muster://notifications"]))
        refused = None
        try:
            # Acknowledged before the server knows whose it is; then ended with the refusal.
            async with third.listen(resource_subscriptions=["muster://notifications"]) as ninth:
                async with asyncio.timeout(10):
                    async for _ in ninth:
                        break
        except Exception as error:  # noqa: BLE001 - the SDK's refusal, whatever its class
            refused = f"{type(error).__name__}: {error}"
        # The SDK reports the refusal (-32600, "an agent may hold 8 subscriptions at once") as the stream's loss.
        check(refused is not None and ("8 subscriptions" in refused or "SubscriptionLost" in refused),
              f"a ninth subscription is ended at once: {refused}")

    async with http_client(os.environ["THIRD_TOKEN"]) as third, http_client(os.environ["READER_TOKEN"]) as reader:
        # The reader sees none of the third agent's steps.
        nothing, error = await call(reader, "next_assignment", {"wait_seconds": 1})
        check(not error and nothing["assignment"] is None, "another agent's client is offered none of its steps")

        # What the reader heard before is read: an update now is news.
        before, error = await call(reader, "list_notifications", {"limit": 1000})
        cursors = [int(item["cursor"]) for item in before.get("notifications", [])]
        if cursors:
            acknowledged, error = await call(reader, "acknowledge_notifications", {"cursor": max(cursors)})
            check(not error, "the reader acknowledges what it heard")

        async def first_update():
            async with reader.listen(resource_subscriptions=["muster://notifications"]) as subscription:
                ok(f"subscribed to the notifications ({reader.protocol_version})")
                subscribed.set()
                async for event in subscription:
                    return event

        subscribed = asyncio.Event()
        waiting = asyncio.create_task(first_update())
        await asyncio.wait_for(subscribed.wait(), 30)
        taken, error = await call(third, "next_assignment", {"wait_seconds": 30})
        check(not error and taken["assignment"]["execution_id"] == second, "the third agent takes its step over HTTP")
        step = taken["assignment"]["assignment_id"]
        stolen, error = await call(reader, "complete_step", {"assignment_id": step, "output": "mine"})
        check(error and stolen["error"]["code"] == "not_found", "another agent cannot end the step")
        await call(third, "complete_step", {"assignment_id": step, "output": "from the third agent"})
        event = await asyncio.wait_for(waiting, 30)
        check("muster://notifications" in str(event), f"the completion reaches the reader as a resource update: {event}")

        heard = json.loads((await reader.read_resource("muster://notifications")).contents[0].text)
        check(heard["notifications"] and all(item["agent_id"] == "mcp-reader" for item in heard["notifications"]),
              "the reader's notifications are its own")
        last = max(int(item["cursor"]) for item in heard["notifications"])
        later = json.loads((await reader.read_resource(f"muster://notifications?after={last}")).contents[0].text)
        check(all(int(item["cursor"]) > last for item in later.get("notifications", [])),
              f"the page after a cursor holds only later notifications: {later}")
        try:
            await reader.read_resource("muster://notifications?after=soon")
            malformed = None
        except Exception as error:  # noqa: BLE001 - the SDK's error, whatever its class
            malformed = str(error)
        check(malformed is not None and "after=CURSOR" in malformed, f"a malformed page is refused: {malformed}")
        listed, error = await call(third, "list_notifications", {})
        check(not error and all(item["agent_id"] == "mcp-third" for item in listed.get("notifications", [])),
              "the third agent's notifications are its own")

        # The next step is taken and never ended: the client goes away.
        taken, error = await call(third, "next_assignment", {"wait_seconds": 30})
        check(not error and taken["assignment"]["step_id"] == "s1", "the third agent takes s1 and goes away")
    print(json.dumps({"abandoned": taken["assignment"]["assignment_id"]}), flush=True)


async def main():
    await over_stdio()
    await over_http()


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
