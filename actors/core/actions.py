"""What a run asks for: the actions `machine.step` returns, which the driver carries out
in order (publish an event, call the model, run tools, abort the work in flight)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from actors.core.turn import ToolCall, ToolOutcome

__all__ = ["AbortJobs", "Action", "Addition", "CallModel", "Emit", "End", "RunToolCalls",
           "ToolJob"]

#: One history addition: `append_blocks(history, role, blocks)`.
Addition = tuple[str, tuple[dict[str, Any], ...]]



# Not frozen (nor hashable), unlike the other actions: several are made every turn,
# and a frozen dataclass's `__init__` sets each field through `object.__setattr__`
# (3x the cost of this one's). Nothing edits one once made.
@dataclass(slots=True)
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
    """One call to run; `refusal` set: do not run it, its outcome is that. `adopted`:
    a call started before a supervisor restart, perhaps still running on its executor:
    wait for its outcome (`LoopIO.adopt_tool`), never start it again."""

    call: ToolCall
    refusal: ToolOutcome | None = None
    adopted: bool = False


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
