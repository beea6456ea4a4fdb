"""The turn loop against a scripted fake model that records its calls (no processes)."""

from __future__ import annotations

import asyncio

from actors.supervisor.agents import Agent
from actors.supervisor.history import is_valid
from actors.config import Config
from actors.supervisor.session import ModelError, Session, run_session
from actors.supervisor.turn import ToolCall, ToolOutcome

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

    async def call_model(self, session, request, *, stream, turn):
        self.requests.append(request)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def run_tool(self, session, call: ToolCall, *, timeout_s):
        self.tool_calls.append(call)
        return ToolOutcome(f"ran {call.input['command']}", False, 1.0)

    def tool_catalogue(self):
        return [SHELL]

    def assert_complete(self):
        assert not self.replies, f"{len(self.replies)} scripted replies never asked for"


def run(io, prompt="go", agent=Agent(), max_turns=0):
    session = Session("s1", agent, "/tmp")
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
    assert io.events[-1][3] == {"text": "all done", "turns": 2, "stop": "end_turn"}
    assert [e[0] for e in io.events] == list(range(1, len(io.events) + 1))
    assert is_valid(session.history)


def test_reminders_are_sent_but_not_stored():
    io = ScriptedIO([text_reply("hi")])
    session = run(io)
    system = " ".join(b["text"] for b in io.requests[0]["system"])
    assert "Identity:" in system and "Identity:" not in str(session.history)
    assert io.requests[0]["temperature"] == 0.3 and io.requests[0]["tool_choice"] == {"type": "auto"}


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
        try:
            await task
        except asyncio.CancelledError:
            pass

    asyncio.run(main())
    assert types(io)[-1] == "CANCELLED" and types(io).count("CANCELLED") == 1
    assert is_valid(session.history) and session.state == "idle"
