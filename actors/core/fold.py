"""A run's state as a fold over its events: `fold_event(state, type, turn, data)`.

What the session log replays (`supervisor/fold.py` reads the records; this
says what each event means for the run): `SESSION_START` opens a run,
`TURN_START` counts a turn, `TOOL_START`/`TOOL_END` record the current reply's
calls, the approval events its waiting calls and decisions, `COMPACTED` the
requests' view of the history (`core/context.py`), a terminal event closes the
run. The result is the `RunState` the machine had when it emitted the event, as
far as a `Resume` needs it (an open run folds to `Phase.MODEL`: `machine.step` on
`Resume` works out where it really was).
"""

from __future__ import annotations

from typing import Any

from actors.core.context import ContextView
from actors.core.state import Phase, RunState
from actors.core.turn import ToolOutcome
from actors.usage import ZERO, after_event
from bus.vocab import TERMINAL, EventType

__all__ = ["fold_event"]


def fold_event(s: RunState, kind: str, turn: int, data: dict[str, Any]) -> RunState:
    """`s` once the event (`kind`, `turn`, `data`) of its session has gone out."""
    usage = after_event(kind, data, s.usage, ZERO)[0]  # the run's tokens, as `Meter.run`
    if kind == EventType.SESSION_START:
        return s._replace(phase=Phase.MODEL, runs=int(data.get("run", s.runs + 1)),
                          stop_request="", limit=int(data.get("max_turns", 0)), turn=0,
                          outcomes=(), started=(), asks=(), decided=(), usage=usage)
    if kind == EventType.TURN_START:
        return s._replace(turns=s.turns + 1 if turn != s.turn else s.turns, turn=turn,
                          usage=usage)
    if kind == EventType.TOOL_START:
        return s._replace(started=(*s.started, data["tool_use_id"]), usage=usage)
    if kind == EventType.TOOL_END:
        outcome = ToolOutcome(data["output"], bool(data["is_error"]),
                              float(data.get("duration_ms", 0.0)),
                              tuple(data.get("images") or ()))
        outcomes = dict(s.outcomes)
        outcomes[data["tool_use_id"]] = outcome
        return s._replace(outcomes=tuple(outcomes.items()), usage=usage)
    if kind == EventType.TURN_END:
        return s._replace(outcomes=(), started=(), asks=(), usage=usage)
    if kind == EventType.APPROVAL_REQUESTED:
        asks = dict(s.asks)
        asks[data["call_id"]] = float(data["expires_at"])
        return s._replace(asks=tuple(asks.items()), usage=usage)
    if kind == EventType.APPROVAL_DECIDED:
        always = s.always
        if data.get("always") and data["always"] not in always:
            always = (*always, data["always"])
        return s._replace(asks=tuple(a for a in s.asks if a[0] != data["call_id"]),
                          decided=(*s.decided, (data["call_id"], data["decision"], data["by"])),
                          always=always, usage=usage)
    if kind == EventType.COMPACTED:
        return s._replace(context=ContextView.from_data(data), usage=usage)
    if kind in TERMINAL:
        return s._replace(phase=Phase.IDLE, last_end=kind, asks=(), started=(), outcomes=(),
                          stop_request="", usage=usage)
    if usage is not s.usage:
        return s._replace(usage=usage)
    return s
