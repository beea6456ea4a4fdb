"""The turn loop against a scripted fake model that records its calls (no processes)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from actors.config import MODEL_ALIASES, Agent, Config, RouterConfig
from actors.core.driver import run_session
from actors.core.history import is_valid
from actors.core.loopio import ModelError
from actors.core.machine import Delta
from actors.core.request import MAX_CACHE_BREAKPOINTS, count_breakpoints
from actors.core.session import Session
from actors.core.turn import ToolCall, ToolOutcome
from actors.usage import ZERO

SHELL = {"name": "shell", "description": "run", "input_schema": {"type": "object"},
         "tags": ["exec"], "core": False, "risky": True}


def tool_reply(*ids):
    return {"role": "assistant", "stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": i, "name": "shell", "input": {"command": i}} for i in ids]}


def text_reply(text, stop="end_turn"):
    return {"role": "assistant", "stop_reason": stop, "content": [{"type": "text", "text": text}]}


class ScriptedIO:
    """A `LoopIO` whose model plays `replies` in order and records every request."""

    def __init__(self, replies, config=None):
        self.config = config or Config()
        self.replies = list(replies)
        self.requests = []
        self.events = []
        self.tool_calls = []

    def emit(self, session, type_, turn, data):
        self.events.append((session.next_seq, type_, turn, data))
        session.next_seq += 1

    async def call_model(self, session, request, *, stream, turn, progress, route=False):
        self.requests.append(request)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def run_tool(self, session, call: ToolCall, *, timeout_s):
        self.tool_calls.append(call)
        return ToolOutcome(f"ran {call.input['command']}", False, 1.0)

    def tool_catalogue(self, machine=""):
        return [SHELL]

    def tool_machine(self, session, tool=""):
        return ""

    def assert_complete(self):
        assert not self.replies, f"{len(self.replies)} scripted replies never asked for"


def run(io, prompt="go", agent=None, max_turns=0):
    session = Session("s1", agent or Agent(), "/tmp")
    asyncio.run(run_session(session, io, prompt, max_turns))
    return session


def types(io):
    return [e[1] for e in io.events]


def test_tool_calls_then_final_answer():
    io = ScriptedIO([tool_reply("a", "b"), text_reply("all done")])
    session = run(io)
    io.assert_complete()
    assert [c.id for c in io.tool_calls] == ["a", "b"]
    results = session.history[2]["content"]
    assert [r["tool_use_id"] for r in results] == ["a", "b"]  # call order kept
    assert types(io)[0] == "SESSION_START" and types(io)[-1] == "DONE"
    assert io.events[-1][3] == {"text": "all done", "turns": 2, "stop": "end_turn",
                                "usage": ZERO.to_dict()}  # (these replies report none)
    assert [e[0] for e in io.events] == list(range(1, len(io.events) + 1))
    assert is_valid(session.history)


def test_reminders_are_sent_but_not_stored():
    io = ScriptedIO([text_reply("hi")])
    session = run(io)
    system = " ".join(b["text"] for b in io.requests[0]["system"])
    assert "Identity:" in system and "Identity:" not in str(session.history)
    assert io.requests[0]["temperature"] == 0.3
    assert io.requests[0]["tool_choice"] == {"type": "auto"}


def test_turn_limit_ends_with_a_valid_history():
    io = ScriptedIO([tool_reply("a"), tool_reply("b")])
    session = run(io, max_turns=2)
    io.assert_complete()
    assert io.events[-1][3]["stop"] == "max_turns"
    assert is_valid(session.history)


def test_unknown_tool_is_refused_without_running():
    reply = {"role": "assistant", "stop_reason": "tool_use", "content": [
        {"type": "tool_use", "id": "x", "name": "secret_tool", "input": {}}]}
    io = ScriptedIO([reply, text_reply("ok")])
    session = run(io)
    assert not io.tool_calls
    result = session.history[2]["content"][0]
    assert result["is_error"] and result["content"] == "tool secret_tool is not available"


def test_model_failure_is_one_error_event():
    io = ScriptedIO([ModelError("overloaded_error", "Overloaded", 529)])
    run(io)
    assert types(io).count("ERROR") == 1 and types(io)[-1] == "ERROR"
    assert not any(t in ("DONE", "CANCELLED") for t in types(io))


def test_cancel_mid_tool_leaves_a_valid_history_and_one_terminal_event():
    class Hanging(ScriptedIO):
        async def run_tool(self, session, call, *, timeout_s):
            await asyncio.Event().wait()

    io = Hanging([tool_reply("a")])
    session = Session("s1", Agent(), "/tmp")

    async def main():
        task = asyncio.create_task(run_session(session, io, "go"))
        while "TOOL_START" not in types(io):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert types(io)[-1] == "CANCELLED" and types(io).count("CANCELLED") == 1
    assert is_valid(session.history) and session.state == "idle"
    # The tool a viewer saw start is seen to end, as cancelled.
    assert types(io)[-3:] == ["TOOL_START", "TOOL_END", "CANCELLED"]
    assert io.events[-2][3]["is_error"] and io.events[-2][3]["output"] == "cancelled by the user"


def test_cache_breakpoints_never_exceed_four_and_sit_on_prefix_and_latest_user_turns():
    replies = [tool_reply(f"c{i}") for i in range(6)] + [text_reply("done")]
    io = ScriptedIO(replies)
    run(io)
    for request in io.requests:
        assert count_breakpoints(request) <= MAX_CACHE_BREAKPOINTS
        assert "cache_control" in request["system"][0]  # the static prefix
        marked = [i for i, m in enumerate(request["messages"])
                  if any("cache_control" in b for b in m["content"])]
        users = [i for i, m in enumerate(request["messages"]) if m["role"] == "user"]
        assert marked == users[-2:]


def test_stored_history_carries_no_cache_markers_or_reminders():
    io = ScriptedIO([tool_reply("a"), text_reply("done")])
    session = run(io)
    assert "cache_control" not in str(session.history)
    assert "Environment:" in io.requests[1]["system"][-1]["text"]


def test_target_machine_suppresses_the_environment_reminder():
    io = ScriptedIO([text_reply("hi")])
    run(io, agent=Agent(target_machine="db-1"))
    reminders = io.requests[0]["system"][-1]["text"]
    assert "Target machine:" in reminders and "db-1" in reminders
    assert "Environment:" not in reminders
    # nor the local platform's "tools act on it directly", which would contradict it
    assert "Platform: a local machine" not in reminders


def test_no_tools_means_the_honesty_reminder():
    class NoTools(ScriptedIO):
        def tool_catalogue(self, machine=""):
            return []

    io = NoTools([text_reply("hi")])
    run(io)
    assert "tools" not in io.requests[0]
    assert "No tools are available" in io.requests[0]["system"][-1]["text"]


def test_model_alias_and_agent_overrides_reach_the_request():
    io = ScriptedIO([text_reply("hi")], Config(aliases={"fast": "claude-x-1"}))
    run(io, agent=Agent(model="fast", temperature=0.7, max_tokens=77))
    assert io.requests[0]["model"] == "claude-x-1"
    assert io.requests[0]["temperature"] == 0.7 and io.requests[0]["max_tokens"] == 77


def test_pause_turn_continues_with_the_same_conversation():
    paused = {"role": "assistant", "stop_reason": "pause_turn",
              "content": [{"type": "text", "text": "thinking"}]}
    io = ScriptedIO([paused, text_reply("done")])
    session = run(io)
    io.assert_complete()
    assert io.requests[1]["messages"][-1]["role"] == "assistant"
    assert io.events[-1][3]["stop"] == "end_turn" and is_valid(session.history)
    assert [b["text"] for b in session.history[-1]["content"]] == ["thinking", "done"]


def test_intent_router_direct_sends_no_tools():
    route = {"role": "assistant", "stop_reason": "end_turn",
             "content": [{"type": "text", "text": "DIRECT"}]}
    config = Config(router=RouterConfig(enabled=True, model="haiku", max_tokens=4))
    io = ScriptedIO([route, text_reply("Paris")], config)
    run(io)
    classify, answer = io.requests
    assert classify["max_tokens"] == 4 and classify["model"] == MODEL_ALIASES["haiku"]
    assert "tools" not in classify and "tools" not in answer
    assert ("ROUTE" in types(io)) and io.events[-1][3]["text"] == "Paris"


@pytest.mark.parametrize("route, reason", [
    ({"role": "assistant", "stop_reason": "end_turn",
      "content": [{"type": "text", "text": "AGENT"}]}, None),
    ({"role": "assistant", "stop_reason": "end_turn",
      "content": [{"type": "text", "text": "no idea"}]}, "neither DIRECT nor AGENT"),
    (ModelError("overloaded_error", "Overloaded", 529), "overloaded_error: Overloaded"),
])
def test_intent_router_falls_back_to_agent_and_says_why(route, reason):
    config = Config(router=RouterConfig(enabled=True))
    io = ScriptedIO([route, text_reply("done")], config)
    run(io)
    assert io.requests[1]["tools"][0]["name"] == "shell"
    assert types(io)[-1] == "DONE"
    (routed,) = [e[3] for e in io.events if e[1] == "ROUTE"]
    assert routed["route"] == "AGENT"
    assert (reason in routed["reason"]) if reason else "reason" not in routed


def test_operation_cancel_stops_at_the_next_boundary():
    class Stopping(ScriptedIO):
        async def run_tool(self, session, call, *, timeout_s):
            session.driver.cancel("operation")  # asked for while the tool runs
            return await super().run_tool(session, call, timeout_s=timeout_s)

    io = Stopping([tool_reply("a"), text_reply("never asked")])
    session = run(io)
    assert len(io.requests) == 1 and len(io.tool_calls) == 1
    assert io.events[-1][1:] == ("CANCELLED", 1, {
        "mode": "operation", "reason": "cancelled: the operation ended",
        "usage": ZERO.to_dict()})
    assert is_valid(session.history)


def test_deadline_cancels_and_keeps_the_streamed_text():
    class Slow(ScriptedIO):
        async def call_model(self, session, request, *, stream, turn, progress, route=False):
            progress(Delta("half an ans"))
            await asyncio.Event().wait()

    io = Slow([])
    session = Session("s1", Agent(), "/tmp")
    asyncio.run(run_session(session, io, "go", deadline_s=0.05))
    assert io.events[-1][1] == "CANCELLED" and io.events[-1][3]["mode"] == "deadline"
    assert ("TOKEN", {"text": "half an ans"}) in [(e[1], e[3]) for e in io.events]
    text = session.history[-1]["content"][0]["text"]
    assert text == "half an ans\n\n[reply interrupted: cancelled: deadline]"
    assert is_valid(session.history)
