"""What one `step` builds (`StepOut`), and the history repairs a run's end makes.

Apart from `machine.py`, which decides: this is the bookkeeping every decision goes
through. `StepOut` collects a step's actions and the history's additions, and its
`emit` is where a terminal event closes the run. The repairs keep the machine's
invariants whatever ends the run: messages said join the history (`take_said`),
streamed text is kept (`keep_partial`), every started tool gets its `TOOL_END`
(`end_started_tools`) and every `tool_use` its result (`close_open_calls`).
"""

from __future__ import annotations

from typing import Any

from actors.core.actions import Action, Emit, End
from actors.core.history import grown
from actors.core.state import Phase, RunState, replace
from actors.core.turn import ToolOutcome, results_message, tool_calls
from actors.usage import after_event, with_usage
from bus.vocab import TERMINAL, EventType

# Bound once, as in `machine.py` (a member looked up on its enum costs ~0.5 µs).
TOOL_END = EventType.TOOL_END
USER_MESSAGE = EventType.USER_MESSAGE
_IDLE = Phase.IDLE


class StepOut:
    """The actions of one step, and the state as it goes (a builder local to `step`)."""

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
        self.last = grown(self.last, role, added)[0]
        self.pending = (*self.pending, (role, tuple(added)))

    def emit(self, type_: str, turn: int, data: dict[str, Any]) -> None:
        """Publish an event of the open run; a terminal one closes it."""
        if not self.s.running:
            return
        if type_ in TERMINAL and self.s.said:
            take_said(self, turn)  # the run ends: what was said still joins the history
        s = self.s
        data = with_usage(type_, data, s.usage, s.unreported)  # TURN_END, ROUTE, the end
        self.actions.append(Emit(type_, turn, data, self.pending))
        self.pending = ()
        usage, unreported = after_event(type_, data, s.usage, s.unreported)
        if usage is not s.usage or unreported is not s.unreported:
            self.s = replace(s, usage=usage, unreported=unreported)
        if type_ in TERMINAL:
            self.s = replace(self.s, phase=_IDLE, last_end=type_, partial=(), calls=(),
                             started=(), outcomes=(), stop_request="", asks=())
            self.actions.append(End(type_))


def partial_text(partial: tuple[Any, ...]) -> str:
    """The text a `RunState.partial` list holds, oldest first."""
    parts: list[str] = []
    while partial:
        partial, text = partial
        parts.append(text)
    return "".join(reversed(parts))


def take_said(out: StepOut, turn: int) -> None:
    """The messages said so far join the history, one `USER_MESSAGE` each, in order
    (at a boundary: the last message is the user's, or an answered assistant's)."""
    said = out.s.said
    if not said:
        return
    out.s = replace(out.s, said=())
    for text, by in said:
        out.add("user", [{"type": "text", "text": text}])
        out.emit(USER_MESSAGE, turn, {"text": text, "by": by})


def end_started_tools(out: StepOut, why: str, ran_ms: dict[str, float] | None = None) -> None:
    """A `TOOL_END` (an error saying `why`) for each started call without one: every
    `TOOL_START` a viewer saw gets its end, whatever ends the run; its duration is how
    long the call had run (`ran_ms`, measured by the driver), 0 where not known."""
    s = out.s
    if not s.started:
        return
    known = dict(s.outcomes)
    calls = {c.id: c for c in s.calls}
    for call_id in s.started:
        if call_id not in known:
            call = calls.get(call_id)
            out.emit(TOOL_END, s.turn, {
                "tool_use_id": call_id, "name": call.name if call else "", "is_error": True,
                "output": why, "duration_ms": round((ran_ms or {}).get(call_id, 0.0), 3),
            })


def keep_partial(out: StepOut, why: str) -> None:
    """The model's streamed text of an interrupted reply joins the history, marked with
    `why` (only where an assistant message may come: after a user's)."""
    text = partial_text(out.s.partial)
    out.s = replace(out.s, partial=())
    last = out.last
    if text.strip() and (last is None or last.get("role") == "user"):
        out.add("assistant", [{"type": "text", "text": f"{text}\n\n[reply interrupted: {why}]"}])


def close_open_calls(out: StepOut, why: str) -> None:
    """Answer the last reply's calls that have no result yet with an error saying `why`
    (their known outcomes kept): no `tool_use` of the history goes unanswered."""
    last = out.last
    calls = tool_calls(last) if last is not None and last.get("role") == "assistant" else ()
    if calls:
        known = dict(out.s.outcomes)
        outcomes = [known.get(c.id) or ToolOutcome(why, True) for c in calls]
        out.add("user", results_message(calls, outcomes)["content"])
