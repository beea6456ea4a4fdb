"""A run's state as `machine.step` sees it: one `RunState` value per session, its
`Phase` the one answer to whether a run is open."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any, NamedTuple

from actors.core.actions import Addition
from actors.core.context import EMPTY, ContextView
from actors.core.history import Message
from actors.core.turn import ToolCall, ToolOutcome
from actors.permissions import Rule
from actors.usage import ZERO, Usage

__all__ = ["Phase", "RunState", "replace"]



class Phase(StrEnum):
    """Where a run is: the one answer to "is a run open" (`IDLE`: none is)."""

    #: No run open (none yet, or the last one's terminal event went out).
    IDLE = "idle"
    #: Opened (`Start`, `Resume`), waiting for `Begin`.
    READY = "ready"
    #: The intent router's call in flight.
    ROUTE = "route"
    #: A model call in flight (also: an open run as folded from its log).
    MODEL = "model"
    #: The reply's tools running or waiting for approval.
    TOOLS = "tools"


#: (Bound once: a member looked up on its enum costs ~0.5 µs in Python 3.11.)
_IDLE = Phase.IDLE


class RunState(NamedTuple):
    """A session's run as the machine sees it (all values, nothing mutable shared).

    A named tuple rather than a frozen dataclass: a step makes a new state or
    two, and `_replace` costs a fifth of `dataclasses.replace` (measured: 1.0 vs
    4.7 µs), which is most of a step. Only small values and persistent lists
    (`partial`) are copied; the history is never held here, only its last message.
    """

    #: Where the run is (`Phase.IDLE`: no run open).
    phase: Phase = Phase.IDLE
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
    #: What the session's requests show of its history (`COMPACTED` changes it; it
    #: outlives the run: a follow-up starts from it).
    context: ContextView = EMPTY

    @property
    def running(self) -> bool:
        """A run is open (its terminal event has not gone out)."""
        return self.phase is not _IDLE


#: Each field's place in a `RunState` (for `replace`).
_INDEX = {name: i for i, name in enumerate(RunState._fields)}
_new_tuple = tuple.__new__


def replace(state: RunState, **changes: Any) -> RunState:
    """`state` with `changes` (a new value: states are never edited).

    Not `_replace`, which looks up every one of the ~30 fields in the changes (3-4x
    slower, and a step makes a few states): the changed places are set in a copy.
    """
    values = list(state)
    try:
        for name, value in changes.items():
            values[_INDEX[name]] = value
    except KeyError as exc:
        raise ValueError(f"RunState has no field {exc.args[0]!r}") from None
    return _new_tuple(RunState, values)
