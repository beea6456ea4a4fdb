"""A session: the data a conversation keeps between and during its runs.

Data only. A run's decisions are `machine.step`, carried out by
`driver.RunDriver`, which copies the machine's counters here after every step;
the session log journals this and folds its records back into it (`fold.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.config import Agent
from actors.supervisor.deltas import TurnCache
from actors.supervisor.history import Message
from actors.supervisor.machine import CANCEL_WHY, TERMINAL, RunState
from actors.supervisor.turn import ToolOutcome
from actors.usage import Meter

__all__ = ["CANCEL_WHY", "TERMINAL", "Session", "run_state"]


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
    #: Messages said into the open run and not yet taken (`(text, by)`, oldest first):
    #: journaled in the session's row, so a restart delivers them still.
    said: list[tuple[str, str]] = field(default_factory=list)
    #: The current reply's calls waiting for approval: call id -> expires_at.
    approvals: dict[str, float] = field(default_factory=dict)
    #: The current run's decisions: `[call_id, decision, by]`.
    decided: list[list[str]] = field(default_factory=list)
    #: Tools approved "always" in this session (session-scoped allow rules over `ask`).
    always: list[str] = field(default_factory=list)
    #: The supervisor is stopping: the run is left open, as journaled, for the next
    #: supervisor to resume; it is not ended (cancelled) on the way out.
    suspended: bool = False
    #: What the turn path need not redo each turn (sanitising, history deltas).
    turn_cache: TurnCache = field(default_factory=TurnCache, repr=False, compare=False)
    #: How much of `history` the session log has: its length and last message then
    #: (see `fold.history_delta`).
    logged_len: int = field(default=0, repr=False, compare=False)
    logged_last: Message | None = field(default=None, repr=False, compare=False)
    #: The driver of the session's open run (`driver.RunDriver`; None when no run is
    #: open in this process). Runtime only: never journaled.
    driver: Any = field(default=None, repr=False, compare=False)
    #: Tokens and cost, the fold of the session's events (`io.emit` and the log's fold
    #: apply each event to it; `summary` reports it).
    meter: Meter = field(default_factory=Meter)

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
            "usage": self.meter.total().to_dict(),
            **({"always_allow": list(self.always)} if self.always else {}),
            **({"waiting_approval": list(self.approvals)} if self.approvals else {}),
        }


def run_state(session: Session) -> RunState:
    """`session` as the run's state machine (`machine.step`) sees it: what a fold of
    its log gives, ready for a `Resume` (an open run) or a `Start` (a follow-up)."""
    return RunState(
        phase="idle" if session.run_over else "model", runs=session.runs,
        turns=session.turns, turn=session.run_turn, limit=session.run_limit,
        last=session.history[-1] if session.history else None, last_end=session.last_end,
        stop_request=session.stop_request, started=tuple(session.started_calls),
        outcomes=tuple(session.outcomes.items()), usage=session.meter.run,
        said=tuple((str(t), str(b)) for t, b in session.said),
        asks=tuple(session.approvals.items()),
        decided=tuple((d[0], d[1], d[2]) for d in session.decided),
        always=tuple(session.always),
    )


