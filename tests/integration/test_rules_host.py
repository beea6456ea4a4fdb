"""Permission rules on what a call does, through a real host (issue 27 item 1): the
calls of the attack that got through the raw-string rules now wait for approval or are
denied, and `mcp__NAME__*` denies a server's tools, the ones it adds later too."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from homes import make_home, remove_home
from hostkit import assert_one_run, scripted_host
from mcpkit import DONE, PYTHON, TEST_SERVER, call, wait_tools

from bus.client import Client


def tool(name: str, **tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "name": name, "input": tool_input}


DENIED = [
    tool("read_file", path="/etc//passwd"),
    tool("read_file", path="/etc/./passwd"),
    tool("read_file", path="/usr/../etc/passwd"),
    tool("read_file", path="/proc/self/root/etc/passwd"),
    tool("list_dir", path="/etc//ssl"),
    tool("shell", command=" rm -rf nothing-here"),
    tool("shell", command="\\rm nothing-here"),
    tool("mcp__test__echo", text="hi"),
]
ASKED = ["ls /; echo INJECTED > proof.txt; cat proof.txt",
         "ls $(echo x; echo SUBST-RAN >&2)"]
SCRIPTS = {
    "denied": [{"reply": DENIED}, DONE],
    "asked": [{"reply": [tool("shell", command="ls -a"),
                         *(tool("shell", command=c) for c in ASKED)]}, DONE],
    "add": call("mcp__test__add_tool"),
    "extra": call("mcp__test__extra"),
}


def config() -> str:
    tests = str(Path(TEST_SERVER).parent)
    return f"""
[agents.attack.permissions]
"read_file(/etc/passwd)" = "deny"
"list_dir(/etc/ssl*)" = "deny"
"mcp__test__add_tool" = "allow"
"mcp__test__*" = "deny"
"shell(ls *)" = "allow"
"shell(rm *)" = "deny"
shell = "ask"

[mcp.test]
command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, "stdio", "oploop-rules-test"]
start_timeout_s = 90  # (importing the SDK on busy cores: a minute)
[mcp.test.sandbox]
read_paths = ["{tests}"]
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    home = make_home("opr-")
    (Path(home) / "oploop.toml").write_text(config())
    files = tmp_path_factory.mktemp("rules")
    # A name the supervisor cannot see through: only the executor, following the
    # symlink just before it reads, finds /etc/passwd behind it.
    (files / "innocent").symlink_to("/etc/passwd")
    scripts = {**SCRIPTS, "symlink": call("read_file", path=str(files / "innocent"))}
    try:
        with scripted_host(home, scripts, files) as running:
            wait_tools(running, {"mcp__test__echo"})
            yield running
    finally:
        remove_home(Path(home))


async def _run(home: str, prompt: str, deny_asked: bool = False) -> list[dict[str, Any]]:
    async with Client.connect(Path(home)) as client:
        started = await client.start(prompt, agent="attack")
        seen: list[dict[str, Any]] = []
        async for event in client.events(started.session, started.from_seq,
                                         stop_at="first"):
            seen.append(event)
            if event["type"] == "APPROVAL_REQUESTED" and deny_asked and sum(
                    e["type"] == "APPROVAL_REQUESTED" for e in seen) == len(ASKED):
                await client.deny(started.session, all=True, reason="not this")
        return seen


def test_the_calls_that_slipped_through_are_denied(host):
    seen = asyncio.run(_run(host, "#denied go"))
    assert_one_run(seen, seen[0]["seq"])
    assert not [e for e in seen if e["type"] == "APPROVAL_REQUESTED"]
    ends = [e["data"] for e in seen if e["type"] == "TOOL_END"]
    assert len(ends) == len(DENIED)
    for end in ends:
        assert end["is_error"] and "denied by the permission rule" in end["output"], end
        assert "root:" not in end["output"]  # /etc/passwd was never read
    assert seen[-1]["type"] == "DONE"


def test_the_injected_commands_wait_for_approval(host):
    seen = asyncio.run(_run(host, "#asked go", deny_asked=True))
    assert_one_run(seen, seen[0]["seq"])
    asked = [e["data"] for e in seen if e["type"] == "APPROVAL_REQUESTED"]
    assert sorted(a["input"]["command"] for a in asked) == sorted(ASKED)
    assert {a["rule"] for a in asked} == {"shell"}
    ends = {e["data"]["tool_use_id"]: e["data"] for e in seen if e["type"] == "TOOL_END"}
    outputs = "\n".join(e["output"] for e in ends.values())
    assert "INJECTED" not in outputs and "SUBST-RAN" not in outputs
    allowed = [e for e in ends.values() if not e["is_error"]]
    assert len(allowed) == 1, ends  # `ls -a` ran unasked
    assert seen[-1]["type"] == "DONE"


def test_a_symlink_to_a_denied_path_is_denied_by_the_executor(host):
    seen = asyncio.run(_run(host, "#symlink go"))
    end = next(e["data"] for e in seen if e["type"] == "TOOL_END")
    assert end["is_error"] and "denied by the permission rule" in end["output"], end
    assert "resolves to /etc/passwd" in end["output"] and "root:" not in end["output"]


def test_a_server_wildcard_denies_the_tools_it_adds_later(host):
    added = asyncio.run(_run(host, "#add go"))
    assert "added" in next(e["data"]["output"] for e in added if e["type"] == "TOOL_END")
    wait_tools(host, {"mcp__test__extra"})
    seen = asyncio.run(_run(host, "#extra go"))
    end = next(e["data"] for e in seen if e["type"] == "TOOL_END")
    assert end["is_error"] and "'mcp__test__*'" in end["output"], end
    assert "extra here" not in end["output"]
