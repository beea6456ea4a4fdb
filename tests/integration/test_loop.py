"""The complete loop against the offline model, through the real SDK and real actors:
retries per fault, stop reasons, tool resolution, parallel tools, turn limits."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from homes import make_home
from hostkit import of_type, run, running_host, workspace

from actors.core.history import is_valid
from actors.sandbox.workspaces import remove_home
from bus.client import Client

CONFIG = """
[hidden.local]
readonly = ["shell"]

[agents.reader]
category_allowlist = ["exec"]

[agents.ro]
mode = "readonly"

[agents.serial]
parallel_tools = false

[agents.quick]
max_turns = 2

[agents.plain]
streaming = false
"""


def shell(command: str) -> dict:
    return {"type": "tool_use", "name": "shell", "input": {"command": command}}


def status(code: int, **headers: str) -> dict:
    return {"fault": "status", "status": code, "headers": headers}


def both_wait(mine: str, other: str) -> dict:
    """A shell call that marks itself started, then waits for the other one's mark:
    it can only finish if the two calls run at the same time."""
    return shell(f"touch {mine}; timeout 20 sh -c 'until [ -e {other} ]; do sleep 0.01; done'"
                 f" && echo met {other}")


OK = {"reply": "all good", "stop_reason": "end_turn"}
SCRIPTS = {
    "overloaded5": [status(529)] * 5 + [OK],
    "overloaded6": [status(529)] * 6,
    "ratelimit": [status(429, **{"retry-after": "1"}), OK],
    "drop": [{"fault": "drop", "after_events": 6, "reply": "words of a void attempt"}, OK],
    "stall": [{"fault": "stall", "seconds": 30, "ping_every_s": 0.05}, OK],
    "truncate": [{"fault": "truncate"}, OK],
    "errorevent": [{"fault": "error_event"}, OK],
    "badrequest": [status(400), OK],
    "pause": [{"reply": "working on it", "stop_reason": "pause_turn"}, OK],
    "maxtokens": [{"reply": "a long answer cut", "stop_reason": "max_tokens"}],
    "refusal": [{"reply": "I won't", "stop_reason": "refusal"}],
    "loop": [{"reply": [shell("echo again")]}] * 5,
    "parallel": [{"reply": [both_wait("a", "b"), both_wait("b", "a")]}, OK],
    "serial": [{"reply": [shell("echo one"), shell("echo two")]}, OK],
    "hidden": [{"reply": [shell("touch hidden-ran"),
                          {"type": "tool_use", "name": "no_such_tool", "input": {}}]}, OK],
    "allowlist": [
        {"reply": [{"type": "tool_use", "name": "write_file",
                    "input": {"path": "turn1.txt", "content": "x"}}]},
        {"reply": [{"type": "tool_use", "name": "write_file",
                    "input": {"path": "turn2.txt", "content": "x"}}]},
        OK,
    ],
}


@pytest.fixture(scope="module")
def host(tmp_path_factory):

    home = make_home("opl-")
    files = tmp_path_factory.mktemp("loop")
    (files / "scenario.json").write_text(json.dumps({"scripts": SCRIPTS}))
    (files / "oploop.toml").write_text(CONFIG)
    env = {
        "OPLOOP_OFFLINE_SCENARIO": str(files / "scenario.json"),
        "OPLOOP_CONFIG": str(files / "oploop.toml"),
        # Backoff injected small so that retry tests run fast; a server's
        # retry-after (1 s) stays below the cap and is honoured as sent.
        "OPLOOP_RETRY_BASE_S": "0.01",
        "OPLOOP_RETRY_MAX_S": "2",
        # No script here goes silent (the stall below pings: the pause bound is what
        # ends it), so the idle bound only has to stay out of the way: at 0.3 s a busy
        # machine's pause in a good stream was one more failure (five retries, then
        # ERROR for the sixth attempt of #overloaded5).
        "OPLOOP_STREAM_IDLE_S": "10",
        "OPLOOP_STREAM_PAUSE_S": "1",
    }
    try:
        with running_host(home, env) as running:
            yield running
    finally:
        remove_home(Path(home))


def retries(events):
    return [e["data"] for e in of_type(events, "RETRY")]


def test_five_overloads_then_success_takes_six_attempts(host):
    events = run(host, "#overloaded5 go")
    assert [r["attempt"] for r in retries(events)] == [1, 2, 3, 4, 5]
    assert all("overloaded" in r["error"] for r in retries(events))
    assert events[-1]["type"] == "DONE" and events[-1]["data"]["text"] == "all good", events[-1]


def test_six_failures_are_an_error_after_the_sixth_attempt(host):
    events = run(host, "#overloaded6 go")
    assert len(retries(events)) == 5
    assert events[-1]["type"] == "ERROR"
    assert "overloaded" in events[-1]["data"]["error"] + events[-1]["data"]["message"]


def test_retry_after_is_honoured(host):
    events = run(host, "#ratelimit go")
    (retry,) = retries(events)
    assert retry["wait_s"] == 1.0 and "rate_limit" in retry["error"]
    assert events[-1]["type"] == "DONE"


@pytest.mark.parametrize("fault, words", [
    ("drop", ("connection", "disconnect", "incomplete", "closed", "peer")),
    ("stall", ("stall", "idle")),
    ("truncate", ("incomplete", "message_stop", "truncat")),
    ("errorevent", ("overloaded",)),
])
def test_stream_faults_are_retried(host, fault, words):
    events = run(host, f"#{fault} go")
    (retry,) = retries(events)
    assert any(w in retry["error"].lower() for w in words), retry
    # The void attempt's text is never glued to the answer.
    assert events[-1]["type"] == "DONE" and events[-1]["data"]["text"] == "all good"


def test_bad_request_is_an_immediate_error(host):
    events = run(host, "#badrequest go")
    assert not retries(events)
    assert events[-1]["type"] == "ERROR" and events[-1]["data"]["error"] == "invalid_request_error"


def test_pause_turn_sends_the_turn_back(host):
    events = run(host, "#pause go")
    assert [e["data"]["stop"] for e in of_type(events, "TURN_END")] == ["pause_turn", "end_turn"]
    done = events[-1]["data"]
    assert (done["text"], done["turns"], done["stop"]) == ("all good", 2, "end_turn")


@pytest.mark.parametrize("script, stop", [("maxtokens", "max_tokens"), ("refusal", "refusal")])
def test_final_stop_reasons_are_shown(host, script, stop):
    events = run(host, f"#{script} go")
    assert events[-1]["type"] == "DONE" and events[-1]["data"]["stop"] == stop


def test_turn_limit_ends_with_a_valid_history(host):
    events = run(host, "#loop go", agent="quick")
    assert events[-1]["data"]["stop"] == "max_turns" and events[-1]["data"]["turns"] == 2
    info = asyncio.run(_inspect(host, events[0]["session"]))
    assert is_valid(info.history)
    assert info.history[-1]["content"][0]["type"] == "tool_result"


def test_non_streaming_agent(host):
    events = run(host, "run `echo plain`", agent="plain")
    # every turn's text arrives whole, one TOKEN event per reply
    tokens = of_type(events, "TOKEN")
    assert [e["turn"] for e in tokens] == [1, 2]
    assert tokens[-1]["data"]["text"] == events[-1]["data"]["text"]
    assert "plain" in events[-1]["data"]["text"]


def test_parallel_tool_calls_overlap(host, tmp_path):
    events = run(host, "#parallel go", cwd=str(tmp_path))
    kinds = [e["type"] for e in events if e["type"] in ("TOOL_START", "TOOL_END")]
    assert kinds == ["TOOL_START", "TOOL_START", "TOOL_END", "TOOL_END"]
    ends = of_type(events, "TOOL_END")
    assert all(not e["data"]["is_error"] and "met" in e["data"]["output"] for e in ends)


def test_serial_agent_runs_calls_one_by_one_in_order(host, tmp_path):
    events = run(host, "#serial go", agent="serial", cwd=str(tmp_path))
    tools = [(e["type"], e["data"].get("output", "").strip())
             for e in events if e["type"] in ("TOOL_START", "TOOL_END")]
    assert tools == [("TOOL_START", ""), ("TOOL_END", "one"), ("TOOL_START", ""),
                     ("TOOL_END", "two")]
    info = asyncio.run(_inspect(host, events[0]["session"]))
    uses = [b["id"] for b in info.history[1]["content"] if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for b in info.history[2]["content"]]
    assert results == uses


def test_hidden_and_unknown_tools_are_refused_and_never_run(host, tmp_path):
    events = run(host, "#hidden go", agent="ro", cwd=str(tmp_path))
    work = workspace(host, events[0]["session"])
    ends = {e["data"]["name"]: e["data"] for e in of_type(events, "TOOL_END")}
    assert ends["shell"] == {**ends["shell"], "is_error": True,
                             "output": "tool shell is not available"}
    assert ends["no_such_tool"]["output"] == "tool no_such_tool is not available"
    assert not (work / "hidden-ran").exists() and not (tmp_path / "hidden-ran").exists()
    assert events[-1]["type"] == "DONE"


def test_turn_one_allowlist_then_every_tool(host, tmp_path):
    events = run(host, "#allowlist go", agent="reader", cwd=str(tmp_path))
    first, second = of_type(events, "TOOL_END")
    assert first["data"]["is_error"] and "not available" in first["data"]["output"]
    assert not second["data"]["is_error"]
    work = workspace(host, events[0]["session"])
    assert not (work / "turn1.txt").exists() and (work / "turn2.txt").exists()


def test_tools_listing_per_agent(host):
    async def listing(agent):
        async with Client.connect(Path(host)) as client:
            return {t["name"]: (t["turn1"], t["later"]) for t in await client.tools(agent)}

    reader = asyncio.run(listing("reader"))
    assert reader == {"read_file": (True, True), "list_dir": (True, True),
                      "shell": (True, True), "write_file": (False, True)}
    ro = asyncio.run(listing("ro"))
    assert ro["shell"] == (False, False) and ro["write_file"] == (True, True)


async def _inspect(home, sid):
    async with Client.connect(Path(home)) as client:
        return await client.inspect(sid)
