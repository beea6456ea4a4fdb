"""MCP sampling through the session's model (issue 30, item 8): a server with
`sampling = true` asks for a model call mid-call; it is approved under the agent's
rules (`ask` by default: a question to the operators), made with the session's model
through the llm callers (the offline model, over HTTP, plays the scripted answer), said
as a `SAMPLING` event whose usage counts with the run's. The tests' own server's
`summarise` and the reference server's `trigger-sampling-request`, over stdio."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from everything import everything, serving
from homes import make_home
from hostkit import assert_one_run, of_type, running_host
from mcpkit import DONE, PYTHON, TEST_SERVER, free_port, wait_tools

from actors.sandbox.workspaces import remove_home
from bus.client import Client

SUMMARY = {"reply": "a short summary", "stop_reason": "end_turn"}


def summarise(server: str) -> list[dict[str, Any]]:
    """The call, then the sampling request's answer (it is the session's model: the
    scenario's next turn), then the run's last answer."""
    return [{"reply": [{"type": "tool_use", "name": f"mcp__{server}__summarise",
                        "input": {"text": "a long text to summarise"}}]}, SUMMARY, DONE]


SCRIPTS = {
    "sample": summarise("test"),
    "unsampled": summarise("plain"),
    "everything": [{"reply": [{"type": "tool_use", "name": "mcp__ev__trigger-sampling-request",
                               "input": {"prompt": "say hi", "maxTokens": 20}}]},
                   SUMMARY, DONE],
    "everything-http": [{"reply": [{"type": "tool_use",
                                    "name": "mcp__evh__trigger-sampling-request",
                                    "input": {"prompt": "say hi", "maxTokens": 20}}]},
                        SUMMARY, DONE],
}


@pytest.fixture(scope="module")
def host():
    program = everything()
    with serving(program, free_port()) as url:
        yield from _host(program, url)


def _host(program: Path, url: str) -> Iterator[str]:
    home = make_home("opms-")
    tests = str(Path(TEST_SERVER).parent)
    server = (f"command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, \"stdio\"]\n"
              "start_timeout_s = 90  # (importing the SDK on busy cores: a minute)")
    Path(home, "oploop.toml").write_text(f"""
[agents.trusting.permissions]
"mcp__test__sampling" = "allow"
"mcp__ev__sampling" = "allow"
"mcp__evh__sampling" = "allow"

[agents.strict.permissions]
"mcp__test__sampling" = "deny"

[mcp.test]
{server}
sampling = true
[mcp.test.sandbox]
read_paths = ["{tests}"]

[mcp.plain]                     # the same server, not allowed to sample
{server}
[mcp.plain.sandbox]
read_paths = ["{tests}"]

[mcp.ev]
command = ["{program}", "stdio"]
sampling = true

[mcp.evh]                       # the same, over streamable HTTP
url = "{url}"
sampling = true
""")
    scenario = Path(tempfile.mkdtemp(prefix="opms-s-", dir="/tmp"), "scenario.json")
    scenario.write_text(json.dumps({"scripts": SCRIPTS}))
    try:
        with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}) as h:
            wait_tools(h, {"mcp__test__summarise", "mcp__plain__summarise",
                           "mcp__ev__trigger-sampling-request",
                           "mcp__evh__trigger-sampling-request"})
            yield h
    finally:
        remove_home(Path(home))
        scenario.unlink()
        scenario.parent.rmdir()


async def sampled_run(home: str, prompt: str, agent: str = "",
                      action: str | None = None) -> list[dict[str, Any]]:
    """A run; a question for approval is answered `action` (None: none is expected)."""
    async with Client.connect(Path(home)) as client:
        started = await client.start(prompt, agent=agent)
        events = []
        async for event in client.events(started.session, started.from_seq, stop_at="first"):
            events.append(event)
            if event["type"] == "ELICITATION_REQUESTED":
                assert action is not None, f"unexpected question: {event['data']}"
                await client.answer(started.session, event["data"]["id"], action=action)
    assert_one_run(events, started.from_seq)
    return events


def output(events: list[dict[str, Any]]) -> str:
    (end,) = of_type(events, "TOOL_END")
    return end["data"]["output"]


def test_sampling_asks_the_operators_first_then_uses_the_sessions_model(host):
    events = asyncio.run(sampled_run(host, "#sample", action="accept"))
    (asked,) = of_type(events, "ELICITATION_REQUESTED")
    assert asked["data"]["server"] == "test" and asked["data"]["sampling"]["max_tokens"] == 50
    assert "asks to use the model" in asked["data"]["message"]
    assert "a long text to summarise" in asked["data"]["message"]
    (sampled,) = of_type(events, "SAMPLING")
    assert sampled["data"]["id"] == asked["data"]["id"]
    model = sampled["data"]["model"]  # the session's (the offline model says it back)
    assert sampled["data"]["server"] == "test" and model
    assert sampled["data"]["usage"]["input_tokens"] > 0
    assert output(events) == f"summary by {model} (endTurn): a short summary"
    # Counted with the run's own calls.
    done = events[-1]
    assert done["type"] == "DONE"
    turns = sum(e["data"]["usage"]["input_tokens"] for e in of_type(events, "TURN_END"))
    assert done["data"]["usage"]["input_tokens"] == \
        turns + sampled["data"]["usage"]["input_tokens"]


def test_a_declined_sampling_is_an_error_for_the_server(host):
    events = asyncio.run(sampled_run(host, "#sample", action="decline"))
    assert not of_type(events, "SAMPLING")
    assert output(events) == "no summary: not approved (decline)"


def test_an_allow_rule_needs_no_question_and_a_deny_rule_refuses(host):
    events = asyncio.run(sampled_run(host, "#sample", agent="trusting"))
    assert of_type(events, "SAMPLING") and not of_type(events, "ELICITATION_REQUESTED")
    assert output(events).endswith("(endTurn): a short summary"), output(events)
    denied = asyncio.run(sampled_run(host, "#sample", agent="strict"))
    assert output(denied).startswith("no summary: denied by the permission rules")


def test_a_server_without_sampling_is_not_offered_it(host):
    events = asyncio.run(sampled_run(host, "#unsampled"))
    assert not of_type(events, "SAMPLING")
    assert output(events).startswith("no summary:"), output(events)


@pytest.mark.parametrize(("script", "server"), [("everything", "ev"),
                                               ("everything-http", "evh")])
def test_the_reference_servers_sampling_tool(host, script, server):
    events = asyncio.run(sampled_run(host, f"#{script}", agent="trusting"))
    (sampled,) = of_type(events, "SAMPLING")
    assert sampled["data"]["server"] == server
    assert "a short summary" in output(events), output(events)
