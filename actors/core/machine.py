"""The run as a pure state machine: `step(state, input) -> (state, actions)`.

No asyncio, no sockets, no clock: the driver (`actors/core/driver.py`,
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
  tool in flight is never run again: its outcome is waited for if it may still
  run on its executor (`Resume.adopt`), else its `TOOL_END` says "interrupted";
- messages said into a running run (`Say`) wait in the state and join the
  history at the next boundary, each a `USER_MESSAGE` event, in order, after
  the tool results and before the next model call (so no user text ever
  comes between a `tool_use` and its result);
- approvals: a call under an `ask` rule waits (`APPROVAL_REQUESTED`) while the
  reply's other calls run; a `Decide` (`APPROVAL_DECIDED`) runs it or answers it
  with an error; a pending approval stays pending across a restart.

The state keeps only the history's last message (what every decision looks
at); the history itself grows by the additions each `Emit` carries, applied
before the event is published (the session log journals them with it). What a step
builds as it goes (`StepOut`) and the repairs that close an ending run's history are
in `stepout.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from actors.core.actions import (
    AbortJobs,
    Action,
    Addition,
    CallModel,
    Emit,
    End,
    RunToolCalls,
    ToolJob,
)
from actors.core.catalogue import unavailable_message
from actors.core.history import Message, blocks
from actors.core.inputs import (
    Begin,
    Cancel,
    Compacted,
    Decide,
    Delta,
    Failed,
    Input,
    ModelFailed,
    ModelReplied,
    Resume,
    Retry,
    Routed,
    Sampled,
    Say,
    Start,
    StopLater,
    ToolFinished,
    ToolStarted,
    WorkerLost,
)
from actors.core.state import Phase, RunState, replace
from actors.core.stepout import (
    StepOut,
    close_open_calls,
    end_started_tools,
    keep_partial,
    partial_text,
    take_said,
)
from actors.core.turn import (
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
from actors.finite import finite_reply
from actors.finite import refusal as nonfinite_refusal
from actors.permissions import decide, denial
from actors.usage import of_reply
from bus.vocab import TERMINAL, CancelMode, EventType

#: Every name a caller of the machine needs: the step, its inputs, actions and state.
__all__ = ["CANCEL_WHY", "INTERRUPTED", "TERMINAL", "WORKER_LOST", "AbortJobs", "Action",
           "Addition", "Begin", "CallModel", "Cancel", "Compacted", "Decide", "Delta", "Emit",
           "End",
           "Failed", "Input", "ModelFailed", "ModelReplied", "Phase", "Resume", "Retry",
           "Routed", "RunState", "RunToolCalls", "Say", "Start", "StopLater", "ToolFinished",
           "ToolJob", "ToolStarted", "WorkerLost", "partial_text", "repair_prompt", "replace",
           "step"]


# The event types and phases a step names, bound once: a member looked up on its enum
# (`EventType.TURN_END`) goes through the enum's metaclass, ~0.5 µs in Python 3.11,
# and a turn names dozens. (The same objects: events are unchanged.)
APPROVAL_DECIDED = EventType.APPROVAL_DECIDED
APPROVAL_REQUESTED = EventType.APPROVAL_REQUESTED
CANCELLED = EventType.CANCELLED
COMPACTED = EventType.COMPACTED
DONE = EventType.DONE
ERROR = EventType.ERROR
RESUMED = EventType.RESUMED
RETRY = EventType.RETRY
ROUTE = EventType.ROUTE
SAMPLING = EventType.SAMPLING
SESSION_START = EventType.SESSION_START
THINKING = EventType.THINKING
TOKEN = EventType.TOKEN
TOOL_END = EventType.TOOL_END
TOOL_START = EventType.TOOL_START
TURN_END = EventType.TURN_END
TURN_START = EventType.TURN_START
_MODEL = Phase.MODEL
_READY = Phase.READY
_ROUTE = Phase.ROUTE
_TOOLS = Phase.TOOLS

#: The synthesised tool result (and interruption mark) for each cancel mode.
CANCEL_WHY: dict[str, str] = {
    CancelMode.UI: "cancelled by the user",
    CancelMode.OPERATION: "cancelled: the operation ended",
    CancelMode.DEADLINE: "cancelled: deadline",
}

#: The result given to a tool call a supervisor restart interrupted.
INTERRUPTED = ("interrupted: the supervisor restarted while this tool ran; it may or may "
               "not have completed, and it is not run again")

#: The result given to a started tool call whose executor went away.
WORKER_LOST = "failed: the executor running this tool went away"


def step(state: RunState, event: Input) -> tuple[RunState, list[Action]]:
    """The run's next state and the actions to carry out, given what happened."""
    kind = type(event)
    if kind is Delta:  # the most frequent input (a streamed batch): its own short path
        return _delta(state, event)  # type: ignore[arg-type]
    out = StepOut(state)
    if isinstance(event, Start):
        _start(out, event)
    elif isinstance(event, Resume):
        _resume(out, event)
    elif isinstance(event, Compacted):  # (also between runs: `oploop compact`)
        _compacted(out, event)
    elif not state.running:
        return state, []  # nothing of an ended run happens after its terminal event
    # (The inputs of every turn first: each is one class, so the order of the tests
    # changes nothing but how many are made.)
    elif isinstance(event, ToolStarted):
        if state.phase is _TOOLS:
            _tool_started(out, event.call_id, event.machine)
    elif isinstance(event, ToolFinished):
        if state.phase is _TOOLS:
            _tool_finished(out, event.call_id, event.outcome)
    elif isinstance(event, ModelReplied):
        if state.phase is _MODEL:
            if event.offered is not None:
                out.s = replace(state, offered=event.offered)
            _replied(out, event.message, event.now)
    elif isinstance(event, Cancel):
        _cancel(out, event)
    elif isinstance(event, Say):
        out.s = replace(state, said=(*state.said, (event.text, event.by)))
    elif isinstance(event, Sampled):  # its usage rides on its own event (CLOSES_CALL)
        out.s = replace(state, unreported=state.unreported + event.usage)
        out.emit(SAMPLING, state.turn, dict(event.data))
    elif isinstance(event, StopLater):
        out.s = replace(state, stop_request=CancelMode.OPERATION)
    elif isinstance(event, Begin) and state.phase is _READY:
        if state.router and state.first == 1:
            out.s = replace(state, phase=_ROUTE)
            out.actions.append(CallModel(0, route=True))
        else:
            _turn(out, state.first)
    elif isinstance(event, Routed) and state.phase is _ROUTE:
        direct = event.route == "DIRECT"
        out.s = replace(out.s, unreported=out.s.unreported + event.usage)
        route: dict[str, str] = {"route": "DIRECT" if direct else "AGENT"}
        if not direct and (event.reason or event.route is None):
            route["reason"] = event.reason or "the intent router's call failed"
        out.emit(ROUTE, 0, route)  # every decision, the fallback's reason with it
        out.s = replace(out.s, direct=direct)
        _turn(out, 1)
    elif isinstance(event, Retry) and state.phase in (_MODEL, _ROUTE):
        out.s = replace(state, partial=())
        retry: dict[str, Any] = {"attempt": event.attempt, "error": event.error,
                                 "wait_s": event.wait_s}
        if event.stall_bound_s:
            retry["stall_bound_s"] = event.stall_bound_s
        out.emit(RETRY, state.turn if state.phase is _MODEL else 0, retry)
    elif isinstance(event, ModelFailed) and state.phase in (_MODEL, _ROUTE):
        if state.phase is _ROUTE:  # the router may only save work: go on with tools
            out.emit(ROUTE, 0, {"route": "AGENT",
                                          "reason": f"{event.error}: {event.message}"})
            out.s = replace(out.s, direct=False)
            _turn(out, 1)
        else:
            out.emit(ERROR, state.turns, {"error": event.error, "message": event.message})
    elif isinstance(event, Decide) and state.phase is _TOOLS:
        _decide(out, event)
    elif isinstance(event, Failed):
        out.actions.append(AbortJobs())
        why = f"failed: {event.message}"
        out.s = replace(out.s, partial=())
        end_started_tools(out, why)
        close_open_calls(out, why)
        out.emit(ERROR, out.s.turns, {"error": event.error, "message": event.message})
    elif isinstance(event, WorkerLost):
        _worker_lost(out)
    state = out.s
    if out.last is not state.last or out.pending is not state.pending:
        state = replace(state, last=out.last, pending=out.pending)
    return state, out.actions


def _delta(state: RunState, ev: Delta) -> tuple[RunState, list[Action]]:
    """A streamed batch: a `TOKEN` or `THINKING` event of the call in flight (the router's
    too, at turn 0); model text is kept for a cancel."""
    if state.phase is _MODEL:
        kind = THINKING if ev.channel == "thinking" else TOKEN
        if kind == TOKEN:
            state = replace(state, partial=(state.partial, ev.text))
        return state, [Emit(kind, state.turn, {"text": ev.text})]
    if state.phase is _ROUTE:
        kind = THINKING if ev.channel == "thinking" else TOKEN
        return state, [Emit(kind, 0, {"text": ev.text})]
    return state, []


def _start(out: StepOut, ev: Start) -> None:
    if out.s.running:
        return  # one run at a time: the caller refuses a second start
    out.s = replace(out.s, phase=_READY, runs=out.s.runs + 1, first=1, router=ev.router,
                    turn=0, limit=ev.limit, stop_request="", partial=(), direct=False,
                    repaired=False, offered=ev.offered, check=ev.check, calls=(),
                    started=(), outcomes=(), rules=ev.rules, cwd=ev.cwd,
                    approval_timeout_s=ev.approval_timeout_s, asks=(), decided=())
    out.add("user", [{"type": "text", "text": ev.prompt}])
    out.emit(SESSION_START, 0, {
        "prompt": ev.prompt, "agent": ev.agent, "model": ev.model, "run": out.s.runs,
        "max_turns": ev.limit, "deadline_s": ev.deadline_s,
    })


def _turn(out: StepOut, turn: int) -> None:
    """A turn boundary: messages said join the history; then stop if asked, end at
    the limit, else start `turn`."""
    take_said(out, turn)
    s = out.s
    if s.stop_request:
        _finish_cancelled(out, s.stop_request, "")
        return
    if turn > s.limit:
        out.emit(DONE, s.limit, {"text": "", "turns": s.limit, "stop": "max_turns"})
        return
    turns = s.turns + 1 if turn != s.turn else s.turns  # a resumed turn is counted once
    out.s = replace(s, phase=_MODEL, turn=turn, turns=turns, partial=(), calls=(),
                    started=(), outcomes=())
    out.emit(TURN_START, turn, {})
    out.actions.append(CallModel(turn, direct=out.s.direct))


def _replied(out: StepOut, reply: Message, now: float = 0.0) -> None:
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
            out.emit(TURN_END, turn, {"stop": "output_invalid", "problem": problem})
            _turn(out, turn + 1)
        elif problem is not None:
            out.emit(ERROR, out.s.turns, {"error": "output_invalid", "message": problem})
        elif out.s.said and turn < s.limit:  # said while it answered: the model hears it
            out.emit(TURN_END, turn, {"stop": nxt.stop})
            _turn(out, turn + 1)
        else:
            out.emit(TURN_END, turn, {"stop": nxt.stop})
            out.emit(DONE, turn, {"text": nxt.text, "turns": turn, "stop": nxt.stop})
    elif isinstance(nxt, RunTools):
        if s.stop_request:
            _finish_cancelled(out, s.stop_request, "")
            return
        jobs = _jobs(out.s, nxt.calls, nonfinite)
        out.s = replace(out.s, phase=_TOOLS, calls=nxt.calls, started=(), outcomes=())
        if s.rules:
            jobs = _ask(out, jobs, now)
        out.actions.append(RunToolCalls(turn, jobs))
    elif isinstance(nxt, Continue):
        out.emit(TURN_END, turn, {"stop": nxt.reason})
        _turn(out, turn + 1)


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


def _ask(out: StepOut, jobs: tuple[ToolJob, ...], now: float) -> tuple[ToolJob, ...]:
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
        out.emit(APPROVAL_REQUESTED, s.turn, {"call_id": c.id, "tool": c.name,
                                                "input": c.input, "rule": key,
                                                "expires_at": expires})
    if asks:
        out.s = replace(out.s, asks=tuple(asks))
    return tuple(run)


def _decide(out: StepOut, ev: Decide) -> None:
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
    out.emit(APPROVAL_DECIDED, s.turn, data)
    refusal = None
    if ev.decision == "deny":
        refusal = ToolOutcome(f"{call.name}: not run: denied by {ev.by}: {reason}", True)
    out.actions.append(RunToolCalls(s.turn, (ToolJob(call, refusal),)))
    if always:  # the same tool's other waiting calls are approved with it
        for other in [c for c in out.s.calls if c.name == call.name
                      and c.id in dict(out.s.asks)]:
            _decide(out, Decide(other.id, "approve", ev.by, f"always {call.name} (session)"))


def _tool_started(out: StepOut, call_id: str, machine: str) -> None:
    s = out.s
    call = next((c for c in s.calls if c.id == call_id), None)
    if call is None or call_id in s.started:
        return
    data: dict[str, Any] = {"tool_use_id": call.id, "name": call.name, "input": call.input}
    if machine:
        data["machine"] = machine
    out.emit(TOOL_START, s.turn, data)
    out.s = replace(out.s, started=out.s.started + (call_id,))


def _tool_finished(out: StepOut, call_id: str, outcome: ToolOutcome) -> None:
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
    if outcome.shown:
        data["for_user"] = outcome.shown
    out.emit(TOOL_END, s.turn, data)
    if len(outcomes) < len(s.calls):
        out.s = replace(s, outcomes=outcomes)
        return
    known = dict(outcomes)
    out.add("user", results_message(s.calls, [known[c.id] for c in s.calls])["content"])
    out.s = replace(s, calls=(), started=(), outcomes=())
    out.emit(TURN_END, s.turn, {"stop": "tool_use"})
    _turn(out, s.turn + 1)


def _worker_lost(out: StepOut) -> None:
    s = out.s
    if s.phase in (_MODEL, _ROUTE):
        out.s = replace(s, partial=())
        out.actions.append(CallModel(s.turn, direct=s.direct, route=s.phase is _ROUTE))
        return
    known = dict(s.outcomes)
    for call_id in s.started:
        if call_id not in known:
            _tool_finished(out, call_id, ToolOutcome(WORKER_LOST, True))


def _cancel(out: StepOut, ev: Cancel) -> None:
    if ev.mode not in CANCEL_WHY:
        raise ValueError(f"unknown cancel mode {ev.mode!r}")
    if ev.mode == CancelMode.OPERATION:
        out.s = replace(out.s, stop_request=out.s.stop_request or CancelMode.OPERATION)
        for call_id, _ in out.s.asks:  # a waiting call is not work in flight: not run
            _decide(out, Decide(call_id, "deny", "cancel", CANCEL_WHY[CancelMode.OPERATION]))
        return
    out.actions.append(AbortJobs())
    _finish_cancelled(out, ev.mode, ev.reason, dict(ev.ran_ms))


def _finish_cancelled(out: StepOut, mode: str, reason: str,
                      ran_ms: dict[str, float] | None = None) -> None:
    """History made valid (partial text kept, open calls answered), then `CANCELLED`."""
    why = CANCEL_WHY[mode]
    keep_partial(out, why)
    end_started_tools(out, why, ran_ms)
    close_open_calls(out, why)
    out.emit(CANCELLED, out.s.turns, {"mode": mode, "reason": reason or why})


def _resume(out: StepOut, ev: Resume) -> None:
    """Go on with an open run after a restart (the state is the log's fold)."""
    s = out.s
    if not s.running:
        return
    out.s = replace(s, offered=ev.offered, check=ev.check, partial=(), direct=False,
                    rules=ev.rules, approval_timeout_s=ev.approval_timeout_s, cwd=ev.cwd)
    out.emit(RESUMED, s.turn, {"reason": ev.reason})
    last = out.last
    calls = tool_calls(last) if last is not None and last.get("role") == "assistant" else ()
    known = dict(s.outcomes)
    if calls and (s.asks or ev.adopt and any(c.id in s.started and c.id not in known
                                             for c in calls)):
        _resume_tools(out, calls, ev.adopt)
        return
    if calls:
        for call in calls:
            if call.id in s.started and call.id not in known:
                out.emit(TOOL_END, s.turn, {
                    "tool_use_id": call.id, "name": call.name, "is_error": True,
                    "output": INTERRUPTED, "duration_ms": 0.0,
                })
        close_open_calls(out, INTERRUPTED)
        out.s = replace(out.s, calls=(), started=(), outcomes=())
        out.emit(TURN_END, s.turn, {"stop": "tool_use"})
        out.s = replace(out.s, phase=_READY, first=s.turn + 1, router=False)
        return
    out.s = replace(out.s, phase=_READY, first=max(1, s.turn), router=ev.router)


def _resume_tools(out: StepOut, calls: tuple[ToolCall, ...], adopt: bool) -> None:
    """A restart while calls wait for approval, or run on executors that may still run
    them (`adopt`): the waiting ones still wait; one in flight is waited for (`adopt`:
    an adopted job, never started again) or interrupted; one never started is answered
    as interrupted (never run late)."""
    s = out.s
    known = dict(s.outcomes)
    asked = dict(s.asks)
    outcomes = list(s.outcomes)
    adopted: list[ToolJob] = []
    for call in calls:
        if call.id in known or call.id in asked:
            continue
        if call.id in s.started and adopt:
            adopted.append(ToolJob(call, adopted=True))
            continue
        if call.id in s.started:
            out.emit(TOOL_END, s.turn, {
                "tool_use_id": call.id, "name": call.name, "is_error": True,
                "output": INTERRUPTED, "duration_ms": 0.0,
            })
        outcomes.append((call.id, ToolOutcome(INTERRUPTED, True)))
    out.s = replace(out.s, phase=_TOOLS, calls=tuple(calls), outcomes=tuple(outcomes),
                    started=tuple(c for c in s.started if c not in asked))
    if adopted:
        out.actions.append(RunToolCalls(s.turn, tuple(adopted)))


def _compacted(out: StepOut, ev: Compacted) -> None:
    """The requests' view changes (`COMPACTED`, which carries it for the fold). In a run,
    the summary call's tokens are the turn's (its `TURN_END` reports them); between
    runs the event reports them itself."""
    s = out.s
    if ev.prior != s.context:
        return  # computed from a view that has changed since: stale
    data: dict[str, Any] = {
        "before_tokens": ev.before_tokens, "after_tokens": ev.after_tokens,
        "cleared_results": ev.cleared_results, "summarised_turns": ev.summarised_turns,
        "by": ev.by, **ev.view.to_data(), **({"note": ev.note} if ev.note else {}),
    }
    if s.running:
        out.s = replace(s, context=ev.view, unreported=s.unreported + ev.usage)
        out.emit(COMPACTED, s.turn, data)
        return
    out.s = replace(s, context=ev.view)
    if ev.usage.tokens:
        data["usage"] = ev.usage.to_dict()
    out.actions.append(Emit(COMPACTED, s.turn, data, out.pending))
    out.pending = ()


def repair_prompt(problem: str) -> str:
    """The user turn asking the model to fix a final answer that did not parse."""
    return (f"Your final answer could not be parsed: {problem}\n"
            "Reply again with only the JSON object, nothing before or after it.")
