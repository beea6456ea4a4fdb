"""Every input to a history is bounded (issue 27, item 4), with real processes: an MCP
server's 10 MB text and oversize image, its 3,000 tools of 5 KB; three 7 MB results
in one session; a 3.9 MB deny reason; said messages past the bus's frame in all; a
3,000,000-character ask_machine answer. Each enters cut, with a note saying how much,
the session finishes, and a follow-up in it still reaches the model."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from homes import make_home
from hostkit import WAIT_S, assert_one_run, of_type, oploop, run, running_host, unique_mark
from mcpkit import DONE, PYTHON, TEST_SERVER, call, history_of, tool_results, tools_of, wait_tools
from peerkit import (
    ask,
    free_ports,
    issue_peer_key,
    network_config,
    peer_config,
    tool_use,
    write_home,
)

from actors import bounds
from actors.sandbox.workspaces import remove_home
from bus.client import Client

# A guard only: the host and its MCP servers start with the module's first test.
pytestmark = pytest.mark.timeout(300)

MARK = unique_mark("oploop-mcp-bounds-test-")
SCRIPTS = {
    "bigtext": call("mcp__test__big_text", mb=10),
    "bigimage": call("mcp__test__images", count=1, mb=12),
    "three": [{"reply": [{"type": "tool_use", "name": "mcp__test__images",
                          "input": {"count": 2, "mb": 3.5}}]} for _ in range(3)] + [DONE],
    "deny": call("mcp__test__echo", text="hello"),
    "many": call("mcp__many__many_0001", q="hi"),
}


def config() -> str:
    tests = str(Path(TEST_SERVER).parent)
    server = f"""
timeout_s = 60
start_timeout_s = 90  # (importing the SDK on busy cores: a minute; `many` lists 3,000 tools)
[mcp.{{name}}.sandbox]
read_paths = ["{tests}"]
"""
    return f"""
[agents.careful.permissions]
"mcp__test__echo" = "ask"

[mcp.test]
command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, "stdio", "{MARK}"]
{server.format(name="test")}
[mcp.many]
command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, "stdio", "many", "{MARK}"]
{server.format(name="many")}
"""


@pytest.fixture(scope="module")
def host():
    home = make_home("opbd-")
    Path(home, "oploop.toml").write_text(config())
    scenario = Path(home, "scenario.json")
    scenario.write_text(json.dumps({"scripts": SCRIPTS}))
    try:
        with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(scenario),
                                 "OPLOOP_EXECUTORS": "1"}) as h:
            # (3,000 tools take the server a while to add and list on a loaded machine)
            wait_tools(h, {"mcp__test__big_text", "mcp__many__many_0000"}, timeout=240)
            yield h
    finally:
        remove_home(Path(home))


def tool_end(events: list[dict[str, Any]]) -> dict[str, Any]:
    (end,) = of_type(events, "TOOL_END")
    return end["data"]


def follow_up_works(home: str, session: str) -> None:
    """A follow-up in `session` reaches the model and ends DONE."""
    events = run(home, "and now, what happened?", session=session)
    assert events[-1]["type"] == "DONE", events[-1]


def test_a_10_mb_mcp_text_enters_cut_with_a_note(host):
    events = run(host, "#bigtext")
    end = tool_end(events)
    out = end["output"]
    assert not end["is_error"]
    assert len(out) < bounds.MAX_RESULT_CHARS + 100
    assert out.startswith("first line 0123456789") and out.endswith("last line")
    # (cut where it enters: at the frame's bound, then to a third of the context budget)
    assert re.search(r"\[truncated: \d+ chars omitted\]", out), out[:300]
    (result,) = tool_results(asyncio.run(history_of(host, events[0]["session"])))
    assert result["content"] == out
    assert events[-1]["type"] == "DONE"
    follow_up_works(host, events[0]["session"])


def test_an_image_over_the_apis_size_is_dropped_on_the_executor_with_a_note(host):
    # 12 MB: 16 MB of base64, past the reply frame: before, the call failed "oversize"
    end = tool_end(events := run(host, "#bigimage"))
    assert not end["is_error"], end
    assert end["output"] == "[image 1 dropped: larger than 5 MB]"
    assert events[-1]["type"] == "DONE"


def test_three_7_mb_results_leave_the_session_able_to_call_the_model(host):
    # 2 images of 3.5 MB each per result: 28 MB of base64 in the history after three
    # (before: "22027475 bytes > 16777216" on every later model call, follow-ups too)
    events = run(host, "#three")
    ends = of_type(events, "TOOL_END")
    assert len(ends) == 3 and not any(e["data"]["is_error"] for e in ends), ends
    assert events[-1]["type"] == "DONE", events[-1]
    assert events[-1]["data"]["turns"] == 4
    follow_up_works(host, events[0]["session"])
    follow_up_works(host, events[0]["session"])


def test_a_catalogue_of_3000_tools_of_5_kb_is_bounded(host):
    tools = asyncio.run(tools_of(host))
    mcp = [t for t in tools.values() if t["name"].startswith("mcp__")]
    assert len(mcp) == bounds.MAX_TOOLS
    many = [t for t in mcp if t["name"].startswith("mcp__many__")]
    assert many and all(len(t["description"]) < bounds.MAX_TOOL_DESCRIPTION_CHARS + 30
                        for t in many)
    assert tools["mcp__many__many_0000"]["description"].endswith(
        f"… [{5000 + 8 - bounds.MAX_TOOL_DESCRIPTION_CHARS} chars cut]")
    size = sum(len(json.dumps(t)) for t in mcp)
    assert size < 600_000, size  # against 15.8 MB before
    status = json.loads(oploop(host, "status", "--json").stdout)
    (server,) = [s for s in status["mcp"] if s["name"] == "many"]
    capped = [n for n in server["left_out"] if not n.startswith("task_only:")]  # (a task's)
    assert capped == [f"{server['tools'] - len(many) - 1} more tool(s): the catalogue "
                      f"holds at most {bounds.MAX_TOOLS} MCP tools (limits.max_tools)"]
    events = run(host, "#many")
    assert tool_end(events)["output"] == "many: hi"
    assert events[-1]["type"] == "DONE"


def test_a_3_9_mb_deny_reason_is_cut_in_every_copy(host):
    reason = "no " * 1_300_000

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with Client.connect(Path(host)) as client:
            started = await client.start("#deny", agent="careful")
            seen: list[dict[str, Any]] = []
            async for event in client.events(started.session, started.from_seq,
                                             stop_at="first"):
                seen.append(event)
                if event["type"] == "APPROVAL_REQUESTED":
                    await client.deny(started.session, all=True, reason=reason)
            history = list((await client.inspect(started.session)).history)
        return seen, history

    events, history = asyncio.run(main())
    assert_one_run(events)
    (decided,) = of_type(events, "APPROVAL_DECIDED")
    cut = f"{reason[:bounds.MAX_REASON_CHARS]}… [{len(reason) - bounds.MAX_REASON_CHARS} chars cut]"
    assert decided["data"]["reason"] == cut
    end = tool_end(events)
    assert end["is_error"] and end["output"] == f"mcp__test__echo: not run: denied by local: {cut}"
    (result,) = tool_results(history)
    assert result["content"] == end["output"]
    assert max(len(json.dumps(e)) for e in events) < 10_000
    assert events[-1]["type"] == "DONE"


def test_said_messages_past_the_frame_in_all_leave_the_session_callable(host):
    # Each said message is refused over limits.max_prompt_chars (test_say.py); 85 of
    # 200,000 characters (50k tokens each: this host's 200 MCP tools take ~92k of the
    # 160k budget of the 200k window) are 17 MB of history, past the bus's 16 MiB frame:
    # the requests' view is compacted, the log keeps them all.
    text = "x" * 199_990

    async def main() -> None:
        async with Client.connect(Path(host)) as client:
            started = await client.start("hello")
            sid = started.session
            events = [e async for e in client.events(sid, started.from_seq, stop_at="first")]
            for n in range(85):
                ack = await client.say(sid, f"{n:02d} {text}", timeout=WAIT_S)
                assert ack.state == "started", ack
                events = [e async for e in client.events(sid, ack.from_seq,
                                                         stop_at="first")]
                assert events[-1]["type"] == "DONE", (n, events[-1]["data"])

    asyncio.run(main())


# -- ask_machine: another host's 3,000,000-character answer -----------------------------


#: A's `[limits] max_result_chars`: its own, applied to what B answers and to its
#: built-ins' results too.
A_LIMIT = 10_000
A_SCRIPTS = {
    "askb": [{"reply": [ask("b", "#long answer")]}, {"reply": "A is done"}],
    "shellbig": [{"reply": [tool_use("shell", command="head -c 50000 /dev/zero | tr '\\0' x")]},
                 {"reply": "A is done"}],
}


@pytest.fixture(scope="module")
def pair():
    """A (peer b; max_result_chars 10,000), B on 127.0.0.2 whose agent answers with
    3,000,000 characters."""
    homes = {name: make_home(f"bnd{name}-") for name in "ab"}
    listen = f"tcp://127.0.0.2:{free_ports('127.0.0.2')}"
    try:
        env_b = write_home(homes["b"], {"long": [{"reply": "y" * 3_000_000}]},
                           network_config(listen))
        key = issue_peer_key(homes["b"], "host-a")
        env_a = write_home(homes["a"], A_SCRIPTS, f"[limits]\nmax_result_chars = {A_LIMIT}\n"
                           + peer_config("b", listen, key))
        with running_host(homes["b"], env_b), running_host(homes["a"], env_a):
            yield homes
    finally:
        for home in homes.values():
            remove_home(Path(home))


def test_a_3_000_000_character_ask_machine_answer_enters_cut(pair):
    events = run(pair["a"], "#askb")
    (end,) = [e["data"] for e in of_type(events, "TOOL_END") if e["data"]["name"] == "ask_machine"]
    assert not end["is_error"], end
    out = end["output"]
    assert len(out) < A_LIMIT + 100
    assert f"[truncated: {3_000_000 - A_LIMIT} chars omitted]" in out
    (result,) = tool_results(asyncio.run(history_of(pair["a"], events[0]["session"])))
    assert result["content"] == out
    assert max(len(json.dumps(e)) for e in events) < 2 * bounds.MAX_RESULT_CHARS
    assert events[-1]["type"] == "DONE"
    follow_up_works(pair["a"], events[0]["session"])


def test_the_hosts_limit_applies_to_every_tool_result_the_built_ins_too(pair):
    # shell keeps 64 KiB itself; A takes at most max_result_chars and 1 KiB of notes
    events = run(pair["a"], "#shellbig")
    out = tool_end(events)["output"]
    cut = 50_000 - A_LIMIT - bounds.NOTE_ROOM
    assert out == "x" * 5512 + f"\n[truncated: {cut} chars omitted]\n" + "x" * 5512
    assert events[-1]["type"] == "DONE"
