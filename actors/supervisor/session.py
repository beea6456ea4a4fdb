"""One session and the turn loop that drives it.

The loop is the reference one (DESIGN.md §3): resolve tools, sanitise the
history, build the request, call the model, append the reply, run the tool
calls it asks for, append their results, and go on until a reply asks for no
tool or the turn limit is reached. All I/O goes through `LoopIO`, so the same
loop runs against workers in the supervisor and against fakes in tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from actors.supervisor.agents import Agent
from actors.supervisor.catalogue import resolve_tools, unavailable_message
from actors.supervisor.deltas import TurnCache
from actors.supervisor.history import Message, add_user_text
from actors.supervisor.request import build_request
from actors.supervisor.turn import (
    Continue,
    FinalOutput,
    RunTools,
    ToolCall,
    ToolOutcome,
    next_step,
    results_message,
    stored_reply,
    tool_calls,
)

log = logging.getLogger("oploop.session")


class ModelError(Exception):
    """The model call failed for good (retries spent, or a final API error)."""

    def __init__(self, error: str, message: str, status: int = 0) -> None:
        super().__init__(f"{error}: {message}")
        self.error = error
        self.message = message
        self.status = status


@dataclass
class Session:
    """A conversation: its agent, stored history, counters and sequence."""

    id: str
    agent: Agent
    cwd: str
    history: list[Message] = field(default_factory=list)
    state: str = "idle"
    runs: int = 0
    turns: int = 0
    next_seq: int = 1
    created: float = field(default_factory=time.time)
    task: asyncio.Task[None] | None = None
    #: What the turn path need not redo each turn (sanitising, history deltas).
    turn_cache: TurnCache = field(default_factory=TurnCache, repr=False, compare=False)

    def summary(self) -> dict[str, Any]:
        """The session as listed by `oploop sessions`."""
        return {
            "session": self.id,
            "state": self.state,
            "agent": self.agent.name,
            "runs": self.runs,
            "turns": self.turns,
            "last_seq": self.next_seq - 1,
            "created": self.created,
        }


class LoopIO(Protocol):
    """What the loop needs from the world."""

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        """Publish one event of `session` (the implementation stamps `seq`)."""
        ...

    async def call_model(
        self, session: Session, request: dict[str, Any], *, stream: bool, turn: int
    ) -> Message:
        """The model's reply to `request`; raises `ModelError`."""
        ...

    async def run_tool(self, session: Session, call: ToolCall, *, timeout_s: float) -> ToolOutcome:
        """Run one tool call; failures are outcomes with `is_error`."""
        ...

    def tool_catalogue(self) -> list[dict[str, Any]]:
        """The tool specs (wire dicts) the executors offer now."""
        ...


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a run ended: the final text, its stop reason, and turns taken."""

    text: str
    stop: str
    turns: int


async def run_session(session: Session, io: LoopIO, prompt: str, max_turns: int = 0) -> None:
    """One run of `session` on `prompt`: every event from SESSION_START to the terminal one."""
    agent = session.agent
    limit = max_turns or agent.max_turns
    session.runs += 1
    session.state = "running"
    io.emit(session, "SESSION_START", 0, {
        "prompt": prompt, "agent": agent.name, "model": agent.model_id(),
        "run": session.runs, "max_turns": limit,
    })
    add_user_text(session.history, prompt)
    try:
        result = await run_turns(session, io, limit)
    except asyncio.CancelledError:
        # Keep the history valid for a follow-up: answer every unanswered tool_use.
        close_open_calls(session.history, "cancelled by the user")
        io.emit(session, "CANCELLED", session.turns, {"mode": "ui", "reason": "cancelled"})
        raise
    except ModelError as exc:
        io.emit(session, "ERROR", session.turns, {"error": exc.error, "message": exc.message})
    except Exception as exc:  # the session's edge: a bug ends the run, not the supervisor
        log.exception("session %s failed", session.id)
        io.emit(session, "ERROR", session.turns, {
            "error": "internal", "message": f"{type(exc).__name__}: {exc}",
        })
    else:
        io.emit(session, "DONE", result.turns, {
            "text": result.text, "turns": result.turns, "stop": result.stop,
        })
    finally:
        session.state = "idle"


def close_open_calls(history: list[Message], why: str) -> None:
    """Answer the tool calls of a trailing assistant message with error results."""
    calls = tool_calls(history[-1]) if history and history[-1].get("role") == "assistant" else ()
    if calls:
        history.append(results_message(calls, [ToolOutcome(why, True) for _ in calls]))


async def run_turns(session: Session, io: LoopIO, limit: int) -> RunResult:
    """The turn loop proper; returns how the run ended."""
    agent = session.agent
    for turn in range(1, limit + 1):
        session.turns += 1
        io.emit(session, "TURN_START", turn, {})
        tools = resolve_tools(io.tool_catalogue(), agent, turn)
        request = build_request(
            agent, session.turn_cache.sanitized(session.history), tools,
            session=session.id, cwd=session.cwd,
        )
        reply = await io.call_model(session, request, stream=agent.streaming, turn=turn)
        session.history.append(stored_reply(reply))
        step = next_step(reply)
        if isinstance(step, FinalOutput):
            io.emit(session, "TURN_END", turn, {"stop": step.stop})
            return RunResult(step.text, step.stop, turn)
        if isinstance(step, RunTools):
            offered = {t["name"] for t in tools}
            outcomes = await run_calls(session, io, step.calls, offered, turn)
            session.history.append(results_message(step.calls, outcomes))
            io.emit(session, "TURN_END", turn, {"stop": "tool_use"})
        elif isinstance(step, Continue):
            io.emit(session, "TURN_END", turn, {"stop": step.reason})
        else:
            raise AssertionError(f"unhandled step {step!r}")
    return RunResult("", "max_turns", limit)


async def run_calls(
    session: Session, io: LoopIO, calls: tuple[ToolCall, ...], offered: set[str], turn: int
) -> list[ToolOutcome]:
    """Run a reply's tool calls (concurrently if the agent allows); outcomes in call order."""
    agent = session.agent
    width = agent.max_parallel_tools if agent.parallel_tools else 1
    gate = asyncio.Semaphore(max(1, width))

    async def one(call: ToolCall) -> ToolOutcome:
        async with gate:
            io.emit(session, "TOOL_START", turn, {
                "tool_use_id": call.id, "name": call.name, "input": call.input,
            })
            if call.name in offered:
                outcome = await io.run_tool(session, call, timeout_s=agent.tool_timeout_s)
            else:  # hidden or unknown: never run, and the refusal names no hidden tool
                outcome = ToolOutcome(unavailable_message(call.name), True)
            io.emit(session, "TOOL_END", turn, {
                "tool_use_id": call.id, "name": call.name, "is_error": outcome.is_error,
                "output": outcome.output, "duration_ms": outcome.duration_ms,
            })
            return outcome

    if width == 1:
        return [await one(call) for call in calls]
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(call)) for call in calls]
    return [t.result() for t in tasks]
