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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from actors.config import Agent, Config
from actors.supervisor.catalogue import resolve_tools, unavailable_message
from actors.supervisor.deltas import TurnCache
from actors.supervisor.history import Message, add_reply, add_user_text, append_blocks
from actors.supervisor.machine import RunState
from actors.supervisor.request import build_request
from actors.supervisor.router import route_of, router_request
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


#: The events that end a run; exactly one per run.
TERMINAL = frozenset({"DONE", "ERROR", "CANCELLED"})

#: The synthesised tool result (and interruption mark) for each cancel mode.
CANCEL_WHY = {
    "ui": "cancelled by the user",
    "operation": "cancelled: the operation ended",
    "deadline": "cancelled: deadline",
}


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
    #: Text streamed so far by the model call in flight (kept, marked, on a cancel).
    partial: list[str] = field(default_factory=list)
    #: A cooperative cancel asked for ("operation"): honoured at the next boundary.
    stop_request: str = ""
    #: The current run has emitted its terminal event (nothing of it follows).
    run_over: bool = True
    #: Wall-clock time the current run must end by (0: no deadline).
    deadline: float = 0.0
    #: The terminal event type of the last run that ended.
    last_end: str = ""
    #: Checks a final answer (a typed output): None if it is fine, else the
    #: problem, which gets one repair turn and then ends the run with `ERROR`.
    output_check: Callable[[str], str | None] | None = None
    #: The current run's turn limit, and the turn it is in (for a resume).
    run_limit: int = 0
    run_turn: int = 0
    #: The current run's first seq, and the key of the `StartRun` that began it (a
    #: resent start is answered with this run).
    run_from_seq: int = 0
    start_key: str = ""
    #: Outcomes of the current reply's tool calls that have finished, by call id.
    outcomes: dict[str, ToolOutcome] = field(default_factory=dict)
    #: Ids of the current reply's tool calls whose `TOOL_START` went out.
    started_calls: list[str] = field(default_factory=list)
    #: The supervisor is stopping: the run is left open, as journaled, for the next
    #: supervisor to resume; it is not ended (cancelled) on the way out.
    suspended: bool = False
    #: What the turn path need not redo each turn (sanitising, history deltas).
    turn_cache: TurnCache = field(default_factory=TurnCache, repr=False, compare=False)
    #: How much of `history` the session log has: its length and last message then
    #: (see `fold.history_delta`).
    logged_len: int = field(default=0, repr=False, compare=False)
    logged_last: Message | None = field(default=None, repr=False, compare=False)

    def summary(self) -> dict[str, Any]:
        """The session as listed by `oploop sessions`."""
        return {
            "session": self.id,
            "state": self.state,
            "agent": self.agent.name,
            "runs": self.runs,
            "turns": self.turns,
            "last_seq": self.next_seq - 1,
            "last_end": self.last_end,
            "created": self.created,
        }


def run_state(session: Session) -> RunState:
    """`session` as the run's state machine (`machine.step`) sees it: what a fold of
    its log gives, ready for a `Resume` (an open run) or a `Start` (a follow-up)."""
    return RunState(
        phase="idle" if session.run_over else "model", runs=session.runs,
        turns=session.turns, turn=session.run_turn, limit=session.run_limit,
        last=session.history[-1] if session.history else None, last_end=session.last_end,
        stop_request=session.stop_request, started=tuple(session.started_calls),
        outcomes=tuple(session.outcomes.items()),
    )


class StopRun(Exception):
    """A cooperative cancel reached a loop boundary."""

    def __init__(self, mode: str) -> None:
        super().__init__(mode)
        self.mode = mode


class LoopIO(Protocol):
    """What the loop needs from the world."""

    #: Model aliases, hidden tool sets and the router's settings.
    config: Config

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        """Publish one event of `session` (the implementation stamps `seq`)."""
        ...

    async def call_model(
        self, session: Session, request: dict[str, Any], *, stream: bool, turn: int,
        route: bool = False,
    ) -> Message:
        """The model's reply to `request`; raises `ModelError`. `route`: the intent
        router's call, tried at most `[router] attempts` times within `timeout_s`."""
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


def emit(session: Session, io: LoopIO, type_: str, turn: int, data: dict[str, Any]) -> bool:
    """Publish an event of the current run, unless that run has already ended.

    This is what makes "exactly one terminal event" hold whoever races to end a
    run (the loop, a cancel, a deadline): the first terminal wins, and nothing
    of the run is published after it.
    """
    if session.run_over:
        return False
    if type_ in TERMINAL:
        session.run_over = True
        session.last_end = type_
    io.emit(session, type_, turn, data)
    return True


def begin_run(session: Session, io: LoopIO, prompt: str, max_turns: int = 0,
              deadline_s: float = 0.0) -> int:
    """Open a run: `SESSION_START`, the user message stored. Returns the turn limit.

    Synchronous on purpose: a run exists (and can be cancelled) from the moment
    it is accepted, before its task first runs.
    """
    agent = session.agent
    limit = max_turns or agent.max_turns
    deadline_s = deadline_s or agent.deadline_s
    session.runs += 1
    session.state = "running"
    session.stop_request = ""
    session.run_over = False
    session.partial.clear()
    session.outcomes.clear()
    session.started_calls.clear()
    session.run_limit, session.run_turn = limit, 0
    session.deadline = time.time() + deadline_s if deadline_s > 0 else 0.0
    # Stored before the event: the session log journals it with SESSION_START.
    add_user_text(session.history, prompt)
    emit(session, io, "SESSION_START", 0, {
        "prompt": prompt, "agent": agent.name, "model": agent.model_id(io.config.aliases),
        "run": session.runs, "max_turns": limit, "deadline_s": deadline_s,
    })
    return limit


#: The result given to a tool call a supervisor restart interrupted.
INTERRUPTED = ("interrupted: the supervisor restarted while this tool ran; it may or may "
               "not have completed, and it is not run again")


def resume_run(session: Session, io: LoopIO, reason: str) -> int:
    """Pick up a run a supervisor restart interrupted; returns the turn to go on from.

    A reply whose tools were running keeps the results that were recorded and
    gets `INTERRUPTED` for the others (never a re-run: tools have side effects),
    each started one with its `TOOL_END`, so that viewers see it end; a model
    call in flight starts again (text streamed since the turn's `TURN_START` is
    void, as after a `RETRY`).
    """
    emit(session, io, "RESUMED", session.run_turn, {"reason": reason})
    session.partial.clear()
    last = session.history[-1] if session.history else {}
    if last.get("role") == "assistant" and tool_calls(last):
        for call in tool_calls(last):
            if call.id in session.started_calls and call.id not in session.outcomes:
                emit(session, io, "TOOL_END", session.run_turn, {
                    "tool_use_id": call.id, "name": call.name, "is_error": True,
                    "output": INTERRUPTED, "duration_ms": 0.0,
                })
        close_open_calls(session.history, INTERRUPTED, session.outcomes)
        session.outcomes.clear()
        session.started_calls.clear()
        emit(session, io, "TURN_END", session.run_turn, {"stop": "tool_use"})
        return session.run_turn + 1
    return max(1, session.run_turn)


async def drive_run(session: Session, io: LoopIO, limit: int, first_turn: int = 1) -> None:
    """The turns of the run `begin_run` opened, up to its single terminal event."""
    run = session.runs
    loop = asyncio.get_running_loop()
    when = loop.time() + (session.deadline - time.time()) if session.deadline else None
    deadline = asyncio.timeout_at(when)
    try:
        async with deadline:
            result = await run_turns(session, io, limit, first_turn)
    except StopRun as stop:
        finish_cancelled(session, io, stop.mode, run=run)
    except asyncio.CancelledError:
        if not session.suspended:
            finish_cancelled(session, io, "ui", run=run)
        raise
    except TimeoutError:
        if not deadline.expired():
            raise
        finish_cancelled(session, io, "deadline", run=run)
    except ModelError as exc:
        emit(session, io, "ERROR", session.turns, {"error": exc.error, "message": exc.message})
    except Exception as exc:  # the session's edge: a bug ends the run, not the supervisor
        log.exception("session %s failed", session.id)
        emit(session, io, "ERROR", session.turns, {
            "error": "internal", "message": f"{type(exc).__name__}: {exc}",
        })
    else:
        emit(session, io, "DONE", result.turns, {
            "text": result.text, "turns": result.turns, "stop": result.stop,
        })


async def run_session(session: Session, io: LoopIO, prompt: str, max_turns: int = 0,
                      deadline_s: float = 0.0) -> None:
    """One run of `session` on `prompt`: every event from SESSION_START to the terminal one."""
    limit = begin_run(session, io, prompt, max_turns, deadline_s)
    try:
        await drive_run(session, io, limit)
    finally:
        session.state = "idle"


def finish_cancelled(session: Session, io: LoopIO, mode: str, reason: str = "",
                     run: int = 0) -> bool:
    """End the current run as cancelled: history made valid, then `CANCELLED`.

    Every open `tool_use` gets a synthesised result, text streamed by an
    interrupted model call is kept (marked), so a follow-up can be sent at once.
    Returns False (and changes nothing) when the run is already over, or when
    `run` names an earlier run than the current one.
    """
    if session.run_over or (run and run != session.runs):
        return False
    why = CANCEL_WHY[mode]
    keep_partial(session, why)
    close_open_calls(session.history, why, session.outcomes)
    emit(session, io, "CANCELLED", session.turns, {"mode": mode, "reason": reason or why})
    return True


def keep_partial(session: Session, why: str) -> None:
    """Store the text an interrupted model call had streamed, marked as cut."""
    text = "".join(session.partial)
    session.partial.clear()
    ends_with_user = not session.history or session.history[-1].get("role") == "user"
    if text.strip() and ends_with_user:
        marked = f"{text}\n\n[reply interrupted: {why}]"
        append_blocks(session.history, "assistant", [{"type": "text", "text": marked}])


def close_open_calls(history: list[Message], why: str,
                     known: dict[str, ToolOutcome] | None = None) -> None:
    """Answer the tool calls of a trailing assistant message: with their `known`
    outcomes where they finished, else with an error result saying `why`."""
    calls = tool_calls(history[-1]) if history and history[-1].get("role") == "assistant" else ()
    known = known or {}
    if calls:
        outcomes = [known.get(c.id) or ToolOutcome(why, True) for c in calls]
        append_blocks(history, "user", results_message(calls, outcomes)["content"])


def check_stop(session: Session) -> None:
    """A loop boundary: raise `StopRun` if a cooperative cancel is pending."""
    if session.stop_request:
        raise StopRun(session.stop_request)


async def run_turns(session: Session, io: LoopIO, limit: int, first_turn: int = 1) -> RunResult:
    """The turn loop proper; returns how the run ended (`StopRun` at a boundary)."""
    agent = session.agent
    config = io.config
    direct = first_turn == 1 and config.router.enabled and await is_direct(session, io)
    repaired = False
    for turn in range(first_turn, limit + 1):
        check_stop(session)
        if turn != session.run_turn:  # (a resumed turn is counted once)
            session.turns += 1
        session.run_turn = turn
        emit(session, io, "TURN_START", turn, {})
        tools = [] if direct else resolve_tools(io.tool_catalogue(), agent, turn, config.hidden)
        request = build_request(
            agent, session.turn_cache.sanitized(session.history), tools,
            session=session.id, cwd=session.cwd, aliases=config.aliases,
        )
        session.partial.clear()
        reply = await io.call_model(session, request, stream=agent.streaming, turn=turn)
        session.partial.clear()
        add_reply(session.history, stored_reply(reply))
        step = next_step(reply)
        if isinstance(step, FinalOutput):
            problem = session.output_check(step.text) if session.output_check else None
            if problem is not None and not repaired and turn < limit:
                repaired = True
                add_user_text(session.history, repair_prompt(problem))
                emit(session, io, "TURN_END", turn, {"stop": "output_invalid", "problem": problem})
                continue
            if problem is not None:
                raise ModelError("output_invalid", problem)
            emit(session, io, "TURN_END", turn, {"stop": step.stop})
            return RunResult(step.text, step.stop, turn)
        if isinstance(step, RunTools):
            check_stop(session)
            offered = {t["name"] for t in tools}
            session.outcomes.clear()
            session.started_calls.clear()
            outcomes = await run_calls(session, io, step.calls, offered, turn)
            append_blocks(session.history, "user", results_message(step.calls, outcomes)["content"])
            session.outcomes.clear()
            session.started_calls.clear()
            emit(session, io, "TURN_END", turn, {"stop": "tool_use"})
        elif isinstance(step, Continue):
            emit(session, io, "TURN_END", turn, {"stop": step.reason})
        else:
            raise AssertionError(f"unhandled step {step!r}")
    check_stop(session)
    return RunResult("", "max_turns", limit)


def repair_prompt(problem: str) -> str:
    """The user turn asking the model to fix a final answer that did not parse."""
    return (f"Your final answer could not be parsed: {problem}\n"
            "Reply again with only the JSON object, nothing before or after it.")


async def is_direct(session: Session, io: LoopIO) -> bool:
    """The intent router: one cheap call deciding DIRECT (send no tools) or AGENT.

    Any failure, or an answer that is neither, means AGENT: the router may only
    ever save work, never lose the tools a request needed.
    """
    request = router_request(session.history, io.config.router, session.id, io.config.aliases)
    try:
        reply = await io.call_model(session, request, stream=False, turn=0, route=True)
    except ModelError as exc:
        log.info("intent router failed (%s): AGENT", exc)
        emit(session, io, "ROUTE", 0, {"route": "AGENT", "reason": f"{exc.error}: {exc.message}"})
        return False
    route, reason = route_of(reply)
    emit(session, io, "ROUTE", 0, {"route": route, "reason": reason} if reason else
         {"route": route})
    return route == "DIRECT"


async def run_calls(
    session: Session, io: LoopIO, calls: tuple[ToolCall, ...], offered: set[str], turn: int
) -> list[ToolOutcome]:
    """Run a reply's tool calls (concurrently if the agent allows); outcomes in call order."""
    agent = session.agent
    width = agent.max_parallel_tools if agent.parallel_tools else 1
    gate = asyncio.Semaphore(max(1, width))

    async def one(call: ToolCall) -> ToolOutcome:
        async with gate:
            emit(session, io, "TOOL_START", turn, {
                "tool_use_id": call.id, "name": call.name, "input": call.input,
            })
            session.started_calls.append(call.id)
            if call.name in offered:
                outcome = await io.run_tool(session, call, timeout_s=agent.tool_timeout_s)
            else:  # hidden or unknown: never run, and the refusal names no hidden tool
                outcome = ToolOutcome(unavailable_message(call.name), True)
            session.outcomes[call.id] = outcome
            emit(session, io, "TOOL_END", turn, {
                "tool_use_id": call.id, "name": call.name, "is_error": outcome.is_error,
                "output": outcome.output, "duration_ms": outcome.duration_ms,
            })
            return outcome

    if width == 1:
        return [await one(call) for call in calls]
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(call)) for call in calls]
    return [t.result() for t in tasks]
