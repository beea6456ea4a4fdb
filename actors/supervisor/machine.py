"""The run as a pure state machine: `step(state, input) -> (state, actions)`.

No asyncio, no sockets, no clock: the driver (`actors/supervisor/driver.py`,
in the supervisor and in the in-process `Runner`) feeds it what happened (a
model reply, streamed text, a tool outcome, a cancel, a supervisor restart)
and carries out the actions it returns (publish an event, call the model, run
tools, abort jobs). It makes every decision of a run, and it owns the run's
invariants, so that they hold for any order of inputs:

- exactly one terminal event (`DONE`, `ERROR`, `CANCELLED`) per run, and no
  event of the run after it;
- every `tool_use` the history holds is answered when the run ends (results
  synthesised for cancelled or interrupted calls);
- every `TOOL_START` has its `TOOL_END` (a cancelled tool's says so, `is_error`);
- the cancel modes: "ui" and "deadline" end the run now, "operation" at the
  next boundary (a turn's start, before a reply's tools run, after the last turn);
- resume after a supervisor restart: a model call in flight is made again, a
  tool in flight is never run again (its `TOOL_END` says "interrupted");
- messages said into a running run (`Say`) wait in the state and join the
  history at the next boundary, each a `USER_MESSAGE` event, in order, after
  the tool results and before the next model call (so no user text ever
  comes between a `tool_use` and its result);
- approvals: a call under an `ask` rule waits (`APPROVAL_REQUESTED`) while the
  reply's other calls run; a `Decide` (`APPROVAL_DECIDED`) runs it or answers it
  with an error; a pending approval stays pending across a restart.

The state keeps only the history's last message (what every decision looks
at); the history itself grows by the additions each `Emit` carries, applied
before the event is published (the session log journals them with it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from actors.finite import finite_reply
from actors.finite import refusal as nonfinite_refusal
from actors.permissions import Rule, decide, denial
from actors.supervisor.catalogue import unavailable_message
from actors.supervisor.history import Message, blocks
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
from actors.usage import ZERO, Usage, after_event, of_reply, with_usage

#: The events that end a run; exactly one per run.
TERMINAL = frozenset({"DONE", "ERROR", "CANCELLED"})

#: The synthesised tool result (and interruption mark) for each cancel mode.
CANCEL_WHY = {
    "ui": "cancelled by the user",
    "operation": "cancelled: the operation ended",
    "deadline": "cancelled: deadline",
}

#: The result given to a tool call a supervisor restart interrupted.
INTERRUPTED = ("interrupted: the supervisor restarted while this tool ran; it may or may "
               "not have completed, and it is not run again")

#: The result given to a started tool call whose executor went away.
WORKER_LOST = "failed: the executor running this tool went away"

#: One history addition: `append_blocks(history, role, blocks)`.
Addition = tuple[str, tuple[dict[str, Any], ...]]


# --- inputs ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Start:
    """A new run on `prompt`: at most `limit` turns; `deadline_s` is reported only
    (the driver turns it into a `Cancel("deadline")` when it passes)."""

    prompt: str
    limit: int
    agent: str = ""
    model: str = ""
    deadline_s: float = 0.0
    #: Ask the intent router first (a `CallModel(route=True)`, answered by `Routed`).
    router: bool = False
    #: Tool names offered on each turn (a call of any other is refused, never run).
    offered: frozenset[str] = frozenset()
    #: Checks a final answer: None if fine, else the problem (one repair turn).
    check: Callable[[str], str | None] | None = None
    #: The agent's permission rules (`actors.permissions`): `deny` refuses a call,
    #: `ask` waits for a `Decide` for at most `approval_timeout_s` (the driver's timer).
    rules: tuple[Rule, ...] = ()
    approval_timeout_s: float = 600.0
    #: The session's working directory: the rules judge a call's paths against it.
    cwd: str = ""


@dataclass(frozen=True, slots=True)
class Begin:
    """The driver is ready to do the run's work (its task runs, the tools are known):
    the turns of a started or resumed run begin (or the intent router's call)."""


@dataclass(frozen=True, slots=True)
class Routed:
    """The intent router's answer ("DIRECT", "AGENT"), or None if its call failed;
    `usage`: what its call used (`actors.usage.of_reply`); `reason` says why a failed
    or unclear call fell back to AGENT (in the ROUTE event)."""

    route: str | None
    usage: Usage = ZERO
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Delta:
    """Text (or thinking) the model call in flight streamed: a `TOKEN` (`THINKING`)
    event; text is kept, marked, if the run is cancelled."""

    text: str
    channel: str = "text"


@dataclass(frozen=True, slots=True)
class Retry:
    """The model call in flight is being retried (a `RETRY` event): the text it
    streamed is void."""

    attempt: int = 0
    error: str = ""
    wait_s: float = 0.0
    #: After a stall, the bound that fired (the `RETRY` event's `stall_bound_s`).
    stall_bound_s: float = 0.0


@dataclass(frozen=True, slots=True)
class ModelReplied:
    """The model's reply (an assistant message with `stop_reason`)."""

    message: Message
    #: The tool names the request offered (a call of any other is refused, never
    #: run); None: those the run started with.
    offered: frozenset[str] | None = None
    #: Wall-clock time of the reply (a call under `ask` expires `approval_timeout_s`
    #: after it): the machine has no clock of its own.
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class ModelFailed:
    """The model call failed for good: the run ends `ERROR`."""

    error: str
    message: str


@dataclass(frozen=True, slots=True)
class ToolStarted:
    """The driver is about to run call `call_id` (its parallelism gate let it in) on
    `machine` ("": not said)."""

    call_id: str
    machine: str = ""


@dataclass(frozen=True, slots=True)
class ToolFinished:
    """Call `call_id` finished with `outcome` (failures are outcomes with `is_error`)."""

    call_id: str
    outcome: ToolOutcome


@dataclass(frozen=True, slots=True)
class Cancel:
    """A cancel: "ui" and "deadline" end the run now, "operation" at the next boundary."""

    mode: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Decide:
    """A decision on the pending approval of call `call_id`: `decision` is "approve" or
    "deny"; `by` names who decided ("local", a key, "timeout"); a denied call's result
    is an error saying `reason`. A call not pending is ignored (the caller answers)."""

    call_id: str
    decision: str
    by: str
    reason: str = ""
    #: Approve this tool's calls for the rest of the session (a session-scoped allow
    #: rule, over `ask` only: never over `deny`).
    always: bool = False


@dataclass(frozen=True, slots=True)
class Failed:
    """The run cannot go on (a driver's bug, the session log failing): it ends `ERROR`
    at once, its work aborted, its open calls answered with `message`."""

    error: str
    message: str


@dataclass(frozen=True, slots=True)
class WorkerLost:
    """The worker serving the run went away: a model call is made again; started
    tools that had not finished end as errors (a tool is never run twice)."""


@dataclass(frozen=True, slots=True)
class Resume:
    """A supervisor restart: go on with the run the folded state describes."""

    reason: str
    router: bool = False
    offered: frozenset[str] = frozenset()
    check: Callable[[str], str | None] | None = None
    rules: tuple[Rule, ...] = ()
    approval_timeout_s: float = 600.0
    cwd: str = ""


@dataclass(frozen=True, slots=True)
class Say:
    """A user message into the open run, said by `by` (a key's name, or "local"):
    queued, it joins the history at the next boundary as a `USER_MESSAGE`. (An idle
    session has no run to take it: the caller starts one on it instead.)"""

    text: str
    by: str = "local"


Input = (Start | Begin | Routed | Delta | Retry | ModelReplied | ModelFailed | ToolStarted
         | ToolFinished | Cancel | Failed | WorkerLost | Resume | Say | Decide)


# --- actions --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Emit:
    """Publish one event; first append `added` to the history (journaled with it)."""

    type: str
    turn: int
    data: dict[str, Any]
    added: tuple[Addition, ...] = ()


@dataclass(frozen=True, slots=True)
class CallModel:
    """Call the model on the history: for `turn`, with no tools if `direct`; or the
    intent router's call if `route`."""

    turn: int
    direct: bool = False
    route: bool = False


@dataclass(frozen=True, slots=True)
class ToolJob:
    """One call to run; `refusal` set: do not run it, its outcome is that."""

    call: ToolCall
    refusal: ToolOutcome | None = None


@dataclass(frozen=True, slots=True)
class RunToolCalls:
    """Run `jobs` (report `ToolStarted` then `ToolFinished` for each)."""

    turn: int
    jobs: tuple[ToolJob, ...]


@dataclass(frozen=True, slots=True)
class AbortJobs:
    """Abort whatever work of the run is in flight (model call, tools)."""


@dataclass(frozen=True, slots=True)
class End:
    """The run is over (its terminal event was the last `Emit`)."""

    type: str


Action = Emit | CallModel | RunToolCalls | AbortJobs | End


# --- state ----------------------------------------------------------------------------

class RunState(NamedTuple):
    """A session's run as the machine sees it (all values, nothing mutable shared).

    A named tuple rather than a frozen dataclass: a step makes a new state or
    two, and `_replace` costs a fifth of `dataclasses.replace` (measured: 1.0 vs
    4.7 µs), which is most of a step. Only small values and persistent lists
    (`partial`) are copied; the history is never held here, only its last message.
    """

    #: "idle" (no run open), "ready" (opened, waiting for `Begin`), "route", "model",
    #: "tools".
    phase: str = "idle"
    runs: int = 0
    #: Turns over all runs (`ERROR` and `CANCELLED` report it).
    turns: int = 0
    turn: int = 0
    limit: int = 0
    last: Message | None = None
    last_end: str = ""
    stop_request: str = ""
    #: Text streamed by the model call in flight, newest last, as a persistent list
    #: `(older, text)` (`()` when empty): a delta adds one pair, nothing is copied.
    partial: tuple[Any, ...] = ()
    direct: bool = False
    repaired: bool = False
    offered: frozenset[str] = frozenset()
    check: Callable[[str], str | None] | None = None
    #: The current reply's calls, the ids started, and the outcomes finished.
    calls: tuple[ToolCall, ...] = ()
    started: tuple[str, ...] = ()
    outcomes: tuple[tuple[str, ToolOutcome], ...] = ()
    #: History additions not yet carried by an `Emit`.
    pending: tuple[Addition, ...] = ()
    #: In phase "ready": the turn `Begin` starts, and whether the router goes first.
    first: int = 1
    router: bool = False
    #: The run's tokens as its events so far report them, and those of calls
    #: answered whose `TURN_END` (or `ROUTE`) is still to come (`actors.usage`).
    usage: Usage = ZERO
    unreported: Usage = ZERO
    #: Messages said (`Say`) and not yet taken, oldest first: `(text, by)` pairs.
    said: tuple[tuple[str, str], ...] = ()
    #: The agent's permission rules (`actors.permissions`) and how long an `ask` waits.
    rules: tuple[Rule, ...] = ()
    approval_timeout_s: float = 600.0
    #: The session's working directory, against which the rules judge a call's paths.
    cwd: str = ""
    #: The current reply's calls waiting for a decision: `(call_id, expires_at)`.
    asks: tuple[tuple[str, float], ...] = ()
    #: The run's decisions so far: `(call_id, decision, by)` ("already decided by").
    decided: tuple[tuple[str, str, str], ...] = ()
    #: Tools approved "always" in this session: their `ask` calls run unasked.
    always: tuple[str, ...] = ()

    @property
    def running(self) -> bool:
        """A run is open (its terminal event has not gone out)."""
        return self.phase != "idle"


def replace(state: RunState, **changes: Any) -> RunState:
    """`state` with `changes` (a new value: states are never edited)."""
    return state._replace(**changes)


class _Out:
    """The actions of one step, and the state as it goes (a local builder)."""

    __slots__ = ("s", "actions", "last", "pending")

    def __init__(self, state: RunState) -> None:
        self.s = state
        self.actions: list[Action] = []
        #: The history's last message and the additions not yet emitted, as they go
        #: (kept here, not in `s`, during a step: one state copy fewer per addition).
        self.last = state.last
        self.pending = state.pending

    def add(self, role: str, added: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> None:
        """Append blocks to the history (the `append_blocks` rule)."""
        last = self.last
        if last is not None and last.get("role") == role:
            self.last = {"role": role, "content": blocks(last) + list(added)}
        else:
            self.last = {"role": role, "content": list(added)}
        self.pending = (*self.pending, (role, tuple(added)))

    def emit(self, type_: str, turn: int, data: dict[str, Any]) -> None:
        """Publish an event of the open run; a terminal one closes it."""
        if not self.s.running:
            return
        if type_ in TERMINAL and self.s.said:
            _take_said(self, turn)  # the run ends: what was said still joins the history
        s = self.s
        data = with_usage(type_, data, s.usage, s.unreported)  # TURN_END, ROUTE, the end
        self.actions.append(Emit(type_, turn, data, self.pending))
        self.pending = ()
        usage, unreported = after_event(type_, data, s.usage, s.unreported)
        if usage is not s.usage or unreported is not s.unreported:
            self.s = replace(s, usage=usage, unreported=unreported)
        if type_ in TERMINAL:
            self.s = replace(self.s, phase="idle", last_end=type_, partial=(), calls=(),
                             started=(), outcomes=(), stop_request="", asks=())
            self.actions.append(End(type_))


def step(state: RunState, event: Input) -> tuple[RunState, list[Action]]:
    """The run's next state and the actions to carry out, given what happened."""
    kind = type(event)
    if kind is Delta:  # the most frequent input (a streamed batch): its own short path
        return _delta(state, event)  # type: ignore[arg-type]
    out = _Out(state)
    if isinstance(event, Start):
        _start(out, event)
    elif isinstance(event, Resume):
        _resume(out, event)
    elif not state.running:
        return state, []  # nothing of an ended run happens after its terminal event
    elif isinstance(event, Cancel):
        _cancel(out, event)
    elif isinstance(event, Say):
        out.s = replace(state, said=(*state.said, (event.text, event.by)))
    elif isinstance(event, Begin) and state.phase == "ready":
        if state.router and state.first == 1:
            out.s = replace(state, phase="route")
            out.actions.append(CallModel(0, route=True))
        else:
            _turn(out, state.first)
    elif isinstance(event, Routed) and state.phase == "route":
        direct = event.route == "DIRECT"
        out.s = replace(out.s, unreported=out.s.unreported + event.usage)
        route: dict[str, str] = {"route": "DIRECT" if direct else "AGENT"}
        if not direct and (event.reason or event.route is None):
            route["reason"] = event.reason or "the intent router's call failed"
        out.emit("ROUTE", 0, route)  # every decision, the fallback's reason with it
        out.s = replace(out.s, direct=direct)
        _turn(out, 1)
    elif isinstance(event, Retry) and state.phase in ("model", "route"):
        out.s = replace(state, partial=())
        retry: dict[str, Any] = {"attempt": event.attempt, "error": event.error,
                                 "wait_s": event.wait_s}
        if event.stall_bound_s:
            retry["stall_bound_s"] = event.stall_bound_s
        out.emit("RETRY", state.turn if state.phase == "model" else 0, retry)
    elif isinstance(event, ModelReplied) and state.phase == "model":
        if event.offered is not None:
            out.s = replace(state, offered=event.offered)
        _replied(out, event.message, event.now)
    elif isinstance(event, ModelFailed) and state.phase in ("model", "route"):
        if state.phase == "route":  # the router may only save work: go on with tools
            out.emit("ROUTE", 0, {"route": "AGENT", "reason": f"{event.error}: {event.message}"})
            out.s = replace(out.s, direct=False)
            _turn(out, 1)
        else:
            out.emit("ERROR", state.turns, {"error": event.error, "message": event.message})
    elif isinstance(event, ToolStarted) and state.phase == "tools":
        _tool_started(out, event.call_id, event.machine)
    elif isinstance(event, ToolFinished) and state.phase == "tools":
        _tool_finished(out, event.call_id, event.outcome)
    elif isinstance(event, Decide) and state.phase == "tools":
        _decide(out, event)
    elif isinstance(event, Failed):
        out.actions.append(AbortJobs())
        why = f"failed: {event.message}"
        out.s = replace(out.s, partial=())
        _end_started_tools(out, why)
        _close_open_calls(out, why)
        out.emit("ERROR", out.s.turns, {"error": event.error, "message": event.message})
    elif isinstance(event, WorkerLost):
        _worker_lost(out)
    state = out.s
    if out.last is not state.last or out.pending is not state.pending:
        state = replace(state, last=out.last, pending=out.pending)
    return state, out.actions


def _delta(state: RunState, ev: Delta) -> tuple[RunState, list[Action]]:
    """A streamed batch: a `TOKEN` or `THINKING` event of the call in flight (the router's
    too, at turn 0); model text is kept for a cancel."""
    if state.phase == "model":
        kind = "THINKING" if ev.channel == "thinking" else "TOKEN"
        if kind == "TOKEN":
            state = replace(state, partial=(state.partial, ev.text))
        return state, [Emit(kind, state.turn, {"text": ev.text})]
    if state.phase == "route":
        kind = "THINKING" if ev.channel == "thinking" else "TOKEN"
        return state, [Emit(kind, 0, {"text": ev.text})]
    return state, []


def partial_text(partial: tuple[Any, ...]) -> str:
    """The text a `RunState.partial` list holds, oldest first."""
    parts: list[str] = []
    while partial:
        partial, text = partial
        parts.append(text)
    return "".join(reversed(parts))


def _start(out: _Out, ev: Start) -> None:
    if out.s.running:
        return  # one run at a time: the caller refuses a second start
    out.s = replace(out.s, phase="ready", runs=out.s.runs + 1, first=1, router=ev.router,
                    turn=0, limit=ev.limit, stop_request="", partial=(), direct=False,
                    repaired=False, offered=ev.offered, check=ev.check, calls=(),
                    started=(), outcomes=(), rules=ev.rules, cwd=ev.cwd,
                    approval_timeout_s=ev.approval_timeout_s, asks=(), decided=())
    out.add("user", [{"type": "text", "text": ev.prompt}])
    out.emit("SESSION_START", 0, {
        "prompt": ev.prompt, "agent": ev.agent, "model": ev.model, "run": out.s.runs,
        "max_turns": ev.limit, "deadline_s": ev.deadline_s,
    })


def _turn(out: _Out, turn: int) -> None:
    """A turn boundary: messages said join the history; then stop if asked, end at
    the limit, else start `turn`."""
    _take_said(out, turn)
    s = out.s
    if s.stop_request:
        _finish_cancelled(out, s.stop_request, "")
        return
    if turn > s.limit:
        out.emit("DONE", s.limit, {"text": "", "turns": s.limit, "stop": "max_turns"})
        return
    turns = s.turns + 1 if turn != s.turn else s.turns  # a resumed turn is counted once
    out.s = replace(s, phase="model", turn=turn, turns=turns, partial=(), calls=(),
                    started=(), outcomes=())
    out.emit("TURN_START", turn, {})
    out.actions.append(CallModel(turn, direct=out.s.direct))


def _replied(out: _Out, reply: Message, now: float = 0.0) -> None:
    s = out.s
    reply, nonfinite = finite_reply(reply)  # NaN/Infinity never enter the history
    out.s = replace(s, partial=(), unreported=s.unreported + of_reply(reply))
    out.add("assistant", blocks(stored_reply(reply)))
    nxt = next_step(reply)
    turn = s.turn
    if isinstance(nxt, FinalOutput):
        problem = s.check(nxt.text) if s.check else None
        if problem is not None and not s.repaired and turn < s.limit:
            out.s = replace(out.s, repaired=True)
            out.add("user", [{"type": "text", "text": repair_prompt(problem)}])
            out.emit("TURN_END", turn, {"stop": "output_invalid", "problem": problem})
            _turn(out, turn + 1)
        elif problem is not None:
            out.emit("ERROR", out.s.turns, {"error": "output_invalid", "message": problem})
        elif out.s.said and turn < s.limit:  # said while it answered: the model hears it
            out.emit("TURN_END", turn, {"stop": nxt.stop})
            _turn(out, turn + 1)
        else:
            out.emit("TURN_END", turn, {"stop": nxt.stop})
            out.emit("DONE", turn, {"text": nxt.text, "turns": turn, "stop": nxt.stop})
    elif isinstance(nxt, RunTools):
        if s.stop_request:
            _finish_cancelled(out, s.stop_request, "")
            return
        jobs = _jobs(out.s, nxt.calls, nonfinite)
        out.s = replace(out.s, phase="tools", calls=nxt.calls, started=(), outcomes=())
        if s.rules:
            jobs = _ask(out, jobs, now)
        out.actions.append(RunToolCalls(turn, jobs))
    elif isinstance(nxt, Continue):
        out.emit("TURN_END", turn, {"stop": nxt.reason})
        _turn(out, turn + 1)


def _take_said(out: _Out, turn: int) -> None:
    """The messages said so far join the history, one `USER_MESSAGE` each, in order
    (at a boundary: the last message is the user's, or an answered assistant's)."""
    said = out.s.said
    if not said:
        return
    out.s = replace(out.s, said=())
    for text, by in said:
        out.add("user", [{"type": "text", "text": text}])
        out.emit("USER_MESSAGE", turn, {"text": text, "by": by})


def _jobs(s: RunState, calls: tuple[ToolCall, ...],
          nonfinite: Mapping[str, list[str]] | None = None) -> tuple[ToolJob, ...]:
    """A reply's calls as jobs: one not offered, with NaN/Infinity in its input, or
    under a `deny` rule, is refused."""
    offered = set() if s.direct else s.offered
    jobs = []
    for c in calls:
        refusal = None
        if nonfinite and c.id in nonfinite:
            refusal = ToolOutcome(nonfinite_refusal(c.name, nonfinite[c.id]), True)
        elif c.name not in offered:
            refusal = ToolOutcome(unavailable_message(c.name), True)
        elif s.rules:
            verdict, key = decide(s.rules, c.name, c.input, s.cwd)
            if verdict == "deny":
                refusal = ToolOutcome(denial(c.name, key), True)
        jobs.append(ToolJob(c, refusal))
    return tuple(jobs)


def _ask(out: _Out, jobs: tuple[ToolJob, ...], now: float) -> tuple[ToolJob, ...]:
    """The jobs to run now: a call under `ask` waits, announced by `APPROVAL_REQUESTED`."""
    s = out.s
    run: list[ToolJob] = []
    asks: list[tuple[str, float]] = []
    for job in jobs:
        c = job.call
        verdict, key = ("allow", "") if job.refusal else decide(s.rules, c.name, c.input, s.cwd)
        if verdict != "ask" or c.name in s.always:
            run.append(job)
            continue
        expires = round(now + s.approval_timeout_s, 3)
        asks.append((c.id, expires))
        out.emit("APPROVAL_REQUESTED", s.turn, {"call_id": c.id, "tool": c.name,
                                                "input": c.input, "rule": key,
                                                "expires_at": expires})
    if asks:
        out.s = replace(out.s, asks=tuple(asks))
    return tuple(run)


def _decide(out: _Out, ev: Decide) -> None:
    """A decision on a pending call: run it, or answer it with an error saying why."""
    s = out.s
    if ev.call_id not in dict(s.asks) or ev.decision not in ("approve", "deny"):
        return
    call = next(c for c in s.calls if c.id == ev.call_id)
    reason = ev.reason or ("approved" if ev.decision == "approve" else "denied")
    always = ev.always and ev.decision == "approve"
    out.s = replace(s, asks=tuple(a for a in s.asks if a[0] != ev.call_id),
                    decided=(*s.decided, (ev.call_id, ev.decision, ev.by)),
                    always=(*s.always, call.name) if always and call.name not in s.always
                    else s.always)
    data: dict[str, Any] = {"call_id": ev.call_id, "decision": ev.decision, "by": ev.by,
                            "reason": reason}
    if always:
        data["always"] = call.name  # journaled: the fold restores the session's rule
    out.emit("APPROVAL_DECIDED", s.turn, data)
    refusal = None
    if ev.decision == "deny":
        refusal = ToolOutcome(f"{call.name}: not run: denied by {ev.by}: {reason}", True)
    out.actions.append(RunToolCalls(s.turn, (ToolJob(call, refusal),)))
    if always:  # the same tool's other waiting calls are approved with it
        for other in [c for c in out.s.calls if c.name == call.name
                      and c.id in dict(out.s.asks)]:
            _decide(out, Decide(other.id, "approve", ev.by, f"always {call.name} (session)"))


def _tool_started(out: _Out, call_id: str, machine: str) -> None:
    s = out.s
    call = next((c for c in s.calls if c.id == call_id), None)
    if call is None or call_id in s.started:
        return
    data: dict[str, Any] = {"tool_use_id": call.id, "name": call.name, "input": call.input}
    if machine:
        data["machine"] = machine
    out.emit("TOOL_START", s.turn, data)
    out.s = replace(out.s, started=out.s.started + (call_id,))


def _tool_finished(out: _Out, call_id: str, outcome: ToolOutcome) -> None:
    s = out.s
    call = next((c for c in s.calls if c.id == call_id), None)
    if call is None or call_id not in s.started or call_id in dict(s.outcomes):
        return
    outcomes = (*s.outcomes, (call_id, outcome))
    data: dict[str, Any] = {
        "tool_use_id": call.id, "name": call.name, "is_error": outcome.is_error,
        "output": outcome.output, "duration_ms": outcome.duration_ms,
        # (only when there are: the fold rebuilds the tool_result from this event)
        **({"images": list(outcome.images)} if outcome.images else {}),
    }
    if outcome.machine:
        data["machine"] = outcome.machine
    out.emit("TOOL_END", s.turn, data)
    if len(outcomes) < len(s.calls):
        out.s = replace(s, outcomes=outcomes)
        return
    known = dict(outcomes)
    out.add("user", results_message(s.calls, [known[c.id] for c in s.calls])["content"])
    out.s = replace(s, calls=(), started=(), outcomes=())
    out.emit("TURN_END", s.turn, {"stop": "tool_use"})
    _turn(out, s.turn + 1)


def _worker_lost(out: _Out) -> None:
    s = out.s
    if s.phase in ("model", "route"):
        out.s = replace(s, partial=())
        out.actions.append(CallModel(s.turn, direct=s.direct, route=s.phase == "route"))
        return
    known = dict(s.outcomes)
    for call_id in s.started:
        if call_id not in known:
            _tool_finished(out, call_id, ToolOutcome(WORKER_LOST, True))


def _cancel(out: _Out, ev: Cancel) -> None:
    if ev.mode not in CANCEL_WHY:
        raise ValueError(f"unknown cancel mode {ev.mode!r}")
    if ev.mode == "operation":
        out.s = replace(out.s, stop_request=out.s.stop_request or "operation")
        for call_id, _ in out.s.asks:  # a waiting call is not work in flight: not run
            _decide(out, Decide(call_id, "deny", "cancel", CANCEL_WHY["operation"]))
        return
    out.actions.append(AbortJobs())
    _finish_cancelled(out, ev.mode, ev.reason)


def _finish_cancelled(out: _Out, mode: str, reason: str) -> None:
    """History made valid (partial text kept, open calls answered), then `CANCELLED`."""
    why = CANCEL_WHY[mode]
    _keep_partial(out, why)
    _end_started_tools(out, why)
    _close_open_calls(out, why)
    out.emit("CANCELLED", out.s.turns, {"mode": mode, "reason": reason or why})


def _end_started_tools(out: _Out, why: str) -> None:
    """A `TOOL_END` (an error saying `why`) for each started call without one: every
    `TOOL_START` a viewer saw gets its end, whatever ends the run."""
    s = out.s
    if not s.started:
        return
    known = dict(s.outcomes)
    calls = {c.id: c for c in s.calls}
    for call_id in s.started:
        if call_id not in known:
            call = calls.get(call_id)
            out.emit("TOOL_END", s.turn, {
                "tool_use_id": call_id, "name": call.name if call else "", "is_error": True,
                "output": why, "duration_ms": 0.0,
            })


def _keep_partial(out: _Out, why: str) -> None:
    text = partial_text(out.s.partial)
    out.s = replace(out.s, partial=())
    last = out.last
    if text.strip() and (last is None or last.get("role") == "user"):
        out.add("assistant", [{"type": "text", "text": f"{text}\n\n[reply interrupted: {why}]"}])


def _close_open_calls(out: _Out, why: str) -> None:
    last = out.last
    calls = tool_calls(last) if last is not None and last.get("role") == "assistant" else ()
    if calls:
        known = dict(out.s.outcomes)
        outcomes = [known.get(c.id) or ToolOutcome(why, True) for c in calls]
        out.add("user", results_message(calls, outcomes)["content"])


def _resume(out: _Out, ev: Resume) -> None:
    """Go on with an open run after a restart (the state is the log's fold)."""
    s = out.s
    if not s.running:
        return
    out.s = replace(s, offered=ev.offered, check=ev.check, partial=(), direct=False,
                    rules=ev.rules, approval_timeout_s=ev.approval_timeout_s, cwd=ev.cwd)
    out.emit("RESUMED", s.turn, {"reason": ev.reason})
    last = out.last
    calls = tool_calls(last) if last is not None and last.get("role") == "assistant" else ()
    if calls and s.asks:
        _resume_asking(out, calls)
        return
    if calls:
        known = dict(s.outcomes)
        for call in calls:
            if call.id in s.started and call.id not in known:
                out.emit("TOOL_END", s.turn, {
                    "tool_use_id": call.id, "name": call.name, "is_error": True,
                    "output": INTERRUPTED, "duration_ms": 0.0,
                })
        _close_open_calls(out, INTERRUPTED)
        out.s = replace(out.s, calls=(), started=(), outcomes=())
        out.emit("TURN_END", s.turn, {"stop": "tool_use"})
        out.s = replace(out.s, phase="ready", first=s.turn + 1, router=False)
        return
    out.s = replace(out.s, phase="ready", first=max(1, s.turn), router=ev.router)


def _resume_asking(out: _Out, calls: tuple[ToolCall, ...]) -> None:
    """A restart while calls wait for approval: they still wait; a call in flight is
    interrupted, one never started is answered as interrupted (never run late)."""
    s = out.s
    known = dict(s.outcomes)
    asked = dict(s.asks)
    outcomes = list(s.outcomes)
    for call in calls:
        if call.id in known or call.id in asked:
            continue
        if call.id in s.started:
            out.emit("TOOL_END", s.turn, {
                "tool_use_id": call.id, "name": call.name, "is_error": True,
                "output": INTERRUPTED, "duration_ms": 0.0,
            })
        outcomes.append((call.id, ToolOutcome(INTERRUPTED, True)))
    out.s = replace(out.s, phase="tools", calls=tuple(calls), outcomes=tuple(outcomes),
                    started=tuple(c for c in s.started if c not in asked))


def repair_prompt(problem: str) -> str:
    """The user turn asking the model to fix a final answer that did not parse."""
    return (f"Your final answer could not be parsed: {problem}\n"
            "Reply again with only the JSON object, nothing before or after it.")
