"""MCP servers' resources, prompts and instructions end to end (issue 30, item 6): the
tests' own server (stdio, in the sandbox) and the reference `server-everything` (npm,
stdio), driven by sessions whose offline model calls their tools.

- a server with resources offers `mcp__NAME__read_resource`; a resource link in a tool
  result is read with it (text, and an image as an image block);
- `include_instructions = true` puts the server's instructions on its first tool (and
  so in the system prompt), only for that server;
- `oploop prompts` lists the servers' prompts; `oploop run --prompt SERVER/PROMPT k=v`
  starts a session from one; a bad one is refused with the server's reason.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from everything import everything, serving
from homes import make_home
from hostkit import events_of, of_type, oploop, run, running_host
from mcpkit import DONE, PYTHON, TEST_SERVER, free_port, history_of, tool_results, wait_tools

from actors.config import Agent
from actors.core.request import reminders
from actors.sandbox.workspaces import remove_home


def turns(*calls: tuple[str, dict]) -> list[dict]:
    """A script: one turn per call, then a final answer."""
    return [*({"reply": [{"type": "tool_use", "name": n, "input": i}]} for n, i in calls),
            DONE]


SCRIPTS = {
    "linked": turns(("mcp__test__linked", {}),
                    ("mcp__test__read_resource", {"uri": "test://secret"})),
    "pixel": turns(("mcp__test__read_resource", {"uri": "test://pixel"})),
    "template": turns(("mcp__test__read_resource", {"uri": "test://note/abc"})),
    "missing": turns(("mcp__test__read_resource", {"uri": "test://nothing"})),
    "everything": turns(("mcp__ev__get-resource-links", {"count": 2}),
                        ("mcp__ev__read_resource",
                         {"uri": "demo://resource/dynamic/text/2"})),
    "everything-http": turns(("mcp__evh__get-resource-links", {"count": 2}),
                             ("mcp__evh__read_resource",
                              {"uri": "demo://resource/dynamic/text/2"})),
}


@pytest.fixture(scope="module")
def host():
    program = everything()
    with serving(program, free_port()) as url:
        yield from _host(program, url)


def _host(program: Path, url: str) -> Iterator[str]:
    home = make_home("opmx-")
    tests = str(Path(TEST_SERVER).parent)
    Path(home, "oploop.toml").write_text(f"""
[mcp.test]
command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, "stdio"]
start_timeout_s = 90  # (importing the SDK on busy cores: a minute)
include_instructions = true
timeout_s = 30
[mcp.test.sandbox]
read_paths = ["{tests}"]

[mcp.ev]
command = ["{program}", "stdio"]
timeout_s = 30

[mcp.evh]                       # the same, over streamable HTTP
url = "{url}"
timeout_s = 30
""")
    scenario = Path(tempfile.mkdtemp(prefix="opmx-s-", dir="/tmp"), "scenario.json")
    scenario.write_text(json.dumps({"scripts": SCRIPTS}))
    try:
        with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}) as h:
            wait_tools(h, {"mcp__test__read_resource", "mcp__ev__read_resource",
                           "mcp__evh__read_resource"})
            yield h
    finally:
        remove_home(Path(home))
        scenario.unlink()
        scenario.parent.rmdir()


def outputs(events: list[dict]) -> list[dict]:
    return [e["data"] for e in of_type(events, "TOOL_END")]


def test_a_servers_resources_are_offered_as_a_read_resource_tool(host):
    tools = {t["name"]: t for t in map(json.loads,
                                       oploop(host, "tools", "--json").stdout.splitlines())}
    reader = tools["mcp__test__read_resource"]
    assert reader["server"] == "test" and reader["input_schema"]["required"] == ["uri"]
    assert "test://greeting: A greeting" in reader["description"]
    assert "template test://note/{name}" in reader["description"]
    assert "mcp__ev__read_resource" in tools  # the reference server's too


def test_a_resource_link_in_a_result_is_read_with_read_resource(host):
    events = run(host, "#linked")
    linked, read = outputs(events)
    assert "[resource test://secret: secret]" in linked["output"]
    assert read == {**read, "is_error": False, "output": "the linked secret is 7"}
    results = tool_results(asyncio.run(history_of(host, events[0]["session"])))
    assert results[-1]["content"] == "the linked secret is 7"
    assert events[-1]["type"] == "DONE"


def test_an_image_resource_is_an_image_block_and_a_template_is_read(host):
    events = run(host, "#pixel")
    (result,) = tool_results(asyncio.run(history_of(host, events[0]["session"])))
    (image,) = [b for b in result["content"] if b["type"] == "image"]
    assert image["source"]["media_type"] == "image/png"
    (note,) = outputs(run(host, "#template"))
    assert note["output"] == "note abc"


def test_an_unknown_resource_is_an_error_result_naming_the_server(host):
    (missing,) = outputs(run(host, "#missing"))
    assert missing["is_error"] and "MCP server test" in missing["output"], missing


@pytest.mark.parametrize("script", ["everything", "everything-http"])
def test_the_reference_servers_resource_links_are_readable(host, script):
    links, read = outputs(run(host, f"#{script}"))
    assert "[resource demo://resource/dynamic/text/2" in links["output"], links
    assert not read["is_error"] and "Resource 2" in read["output"], read


def test_instructions_ride_on_the_first_tool_of_the_server_that_asks_for_them(host):
    tools = [json.loads(line) for line in oploop(host, "tools", "--json").stdout.splitlines()]
    carrying = {t["server"]: t["instructions"] for t in tools if t.get("instructions")}
    assert list(carrying) == ["test"]  # not ev's: it did not set include_instructions
    assert carrying["test"].startswith("Test server instructions")
    said = "\n".join(reminders(Agent(), tools, "/"))
    assert "Instructions of the MCP server test" in said and "call echo" in said


def test_prompts_are_listed_and_a_session_starts_from_one(host):
    listed = oploop(host, "prompts")
    assert listed.returncode == 0, listed.stderr
    assert "test/review topic=... [tone=...]  — Review a topic" in listed.stdout
    assert "ev/args-prompt" in listed.stdout and "ev/simple-prompt" in listed.stdout
    done = oploop(host, "run", "--json", "--prompt", "test/review", "topic=oploop",
                  "tone=brief")
    assert done.returncode == 0, done.stderr
    session = events_of(done.stdout)[0]["session"]
    first = asyncio.run(history_of(host, session))[0]
    text = first["content"] if isinstance(first["content"], str) else first["content"][0]["text"]
    assert text == ("Please review oploop, in a brief tone.\n\n(The assistant said:)\n"
                    "I will review it.")


@pytest.mark.parametrize("server", ["ev", "evh"])
def test_the_reference_servers_prompt_with_arguments(host, server):
    done = oploop(host, "run", "--json", "--prompt", f"{server}/args-prompt", "city=Paris")
    assert done.returncode == 0, done.stderr
    first = asyncio.run(history_of(host, events_of(done.stdout)[0]["session"]))[0]
    content = first["content"]
    text = content if isinstance(content, str) else content[0]["text"]
    assert "Paris" in text


def test_a_bad_prompt_is_refused_with_the_servers_reason(host):
    missing = oploop(host, "run", "--prompt", "test/review")  # topic is required
    assert missing.returncode != 0 and "MCP server test" in missing.stderr, missing.stderr
    unknown = oploop(host, "run", "--prompt", "nope/review")
    assert unknown.returncode != 0 and "nope" in unknown.stderr, unknown.stderr
    malformed = oploop(host, "run", "--prompt", "review")
    assert malformed.returncode != 0 and "SERVER/PROMPT" in malformed.stderr
