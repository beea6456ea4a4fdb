"""A session: who it is, its run's one state, and its history.

The run's state is one value, `Session.run` (a `RunState`): `machine.step` makes
every new one (`driver.RunDriver.feed`, or `feed_undriven` for an open run that
no driver here carries), and the session log folds its records into one
(`core/fold.py`). What else a session holds is its identity (id, agent, cwd,
created), its history (grown by the additions each `Emit` carries), what the
session log needs (`next_seq`, the run's first seq, key and deadline) and
runtime handles (its task, its driver), never a copy of the run's counters:
the names below that read like fields (`runs`, `run_over`, `said`, ...) are
views of `run`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.config import Agent
from actors.core.context import ContextMemo, ContextView
from actors.core.deltas import TurnCache
from actors.core.history import Message
from actors.core.inputs import Input
from actors.core.machine import step
from actors.core.request import RequestMemo
from actors.core.state import Phase, RunState
from actors.core.timeline import Timeline, title_of
from actors.core.turn import ToolOutcome
from actors.usage import Meter

__all__ = ["Session", "feed_undriven"]

#: (Bound once: a member looked up on its enum costs ~0.5 µs in Python 3.11.)
_IDLE = Phase.IDLE


@dataclass
class Session:
    """A conversation: its identity, its run's state, its history and sequence."""

    id: str
    agent: Agent
    cwd: str
    history: list[Message] = field(default_factory=list)
    #: The run's state (the current run's, or the last one's once it ended): changed by
    #: `machine.step` only.
    run: RunState = field(default_factory=RunState)
    next_seq: int = 1
    created: float = field(default_factory=time.time)
    task: asyncio.Task[None] | None = None
    #: Wall-clock time the current run must end by (0: no deadline).
    deadline: float = 0.0
    #: Checks a final answer (a typed output): None if it is fine, else the
    #: problem, which gets one repair turn and then ends the run with `ERROR`.
    output_check: Callable[[str], str | None] | None = None
    #: The current run's first seq, and the key of the `StartRun` that began it (a
    #: resent start is answered with this run).
    run_from_seq: int = 0
    start_key: str = ""
    #: The supervisor is stopping: the run is left open, as journaled, for the next
    #: supervisor to resume; it is not ended (cancelled) on the way out.
    suspended: bool = False
    #: What the turn path need not redo each turn (sanitising, history deltas).
    turn_cache: TurnCache = field(default_factory=TurnCache, repr=False, compare=False)
    #: The requests' sizes and view prefix (`core/context.py`): runtime only.
    context_memo: ContextMemo = field(default_factory=ContextMemo, repr=False, compare=False)
    #: The request's parts that do not change from turn to turn (`core/request.py`).
    request_memo: RequestMemo = field(default_factory=RequestMemo, repr=False, compare=False)
    #: How much of `history` the session log has: its length and last message then
    #: (see `fold.history_delta`).
    logged_len: int = field(default=0, repr=False, compare=False)
    logged_last: Message | None = field(default=None, repr=False, compare=False)
    #: Bytes of records logged since the session's latest log compaction, and that
    #: compaction's size: whether the next one is due (`supervisor/journal.py`).
    log_since: int = field(default=0, repr=False, compare=False)
    log_compacted: int = field(default=0, repr=False, compare=False)
    #: The digest of each logged message as its compactions refer to it (by position,
    #: with the message it was taken of), and the digests the store already holds.
    log_digests: list[tuple[Message, bytes]] = field(default_factory=list, repr=False,
                                                     compare=False)
    log_parts: set[bytes] = field(default_factory=set, repr=False, compare=False)
    #: The driver of the session's open run (`driver.RunDriver`; None when no run is
    #: open in this process). Runtime only: never journaled.
    driver: Any = field(default=None, repr=False, compare=False)
    #: Tokens and cost, the fold of the session's events (`stamp` applies each event
    #: to it; `summary` reports it).
    meter: Meter = field(default_factory=Meter)
    #: Title and times, the fold of the session's events (as `meter`).
    timeline: Timeline = field(default_factory=Timeline)

    def stamp(self, type_: str, data: dict[str, Any], ts: float | None = None) -> int:
        """The seq of the session's next event, sent at `ts` (default: now), taken (and
        its tokens and times counted): the one place an event of a session gets its seq."""
        seq = self.next_seq
        self.next_seq += 1
        self.meter.apply(type_, data)  # the session's tokens: the fold of its events
        self.timeline.apply(type_, data, time.time() if ts is None else ts)
        return seq

    # -- views of `run` ----------------------------------------------------------------

    @property
    def run_over(self) -> bool:
        """No run is open (the last one's terminal event went out)."""
        return self.run.phase is _IDLE

    @property
    def state(self) -> str:
        """"running" while a run is open, else "idle" (as listed)."""
        return "idle" if self.run.phase is _IDLE else "running"

    @property
    def runs(self) -> int:
        return self.run.runs

    @property
    def turns(self) -> int:
        return self.run.turns

    @property
    def run_turn(self) -> int:
        return self.run.turn

    @property
    def run_limit(self) -> int:
        return self.run.limit

    @property
    def last_end(self) -> str:
        return self.run.last_end

    @property
    def stop_request(self) -> str:
        return self.run.stop_request

    @property
    def said(self) -> list[tuple[str, str]]:
        """Messages said into the open run and not yet taken (`(text, by)`, oldest first)."""
        return list(self.run.said)

    @property
    def started_calls(self) -> list[str]:
        return list(self.run.started)

    @property
    def outcomes(self) -> dict[str, ToolOutcome]:
        return dict(self.run.outcomes)

    @property
    def approvals(self) -> dict[str, float]:
        """The current reply's calls waiting for approval: call id -> expires_at."""
        return dict(self.run.asks)

    @property
    def decided(self) -> list[list[str]]:
        """The current run's decisions: `[call_id, decision, by]`."""
        return [list(d) for d in self.run.decided]

    @property
    def context(self) -> ContextView:
        """What the session's requests show of its history (`core/context.py`)."""
        return self.run.context

    @property
    def always(self) -> list[str]:
        """Tools approved "always" in this session."""
        return list(self.run.always)

    def summary(self) -> dict[str, Any]:
        """The session as listed by `oploop sessions`."""
        run = self.run
        return {
            "session": self.id,
            "state": self.state,
            "agent": self.agent.name,
            "runs": run.runs,
            "turns": run.turns,
            "last_seq": self.next_seq - 1,
            "last_end": run.last_end,
            "created": self.created,
            "usage": self.meter.total().to_dict(),
            **self._times(),
            **({"always_allow": list(run.always)} if run.always else {}),
            **({"waiting_approval": [a[0] for a in run.asks]} if run.asks else {}),
        }


    def _times(self) -> dict[str, Any]:
        """The summary's title and times: `title` (the first prompt, cut), `started`
        (the session's first run), `run_started` (the current or last run's start),
        `ended` (the last run's end; None while none has ended), `duration_s` (the
        finished runs' time; a running run's own is `now - run_started` more)."""
        t = self.timeline
        title = t.title
        if not title and self.history:  # logged before titles were kept: its first prompt
            first = self.history[0].get("content")
            if isinstance(first, list):
                first = " ".join(b.get("text", "") for b in first
                                 if isinstance(b, dict) and b.get("type") == "text")
            title = title_of(first)
        return {"title": title, "started": self.created, "run_started": t.run_started or None,
                "ended": t.ended or None, "duration_s": round(t.busy_s, 3)}


def feed_undriven(session: Session, event: Input) -> None:
    """Step `session`'s run on `event` where no driver carries it (an open run a
    restart left, not resumed in this process): only inputs that ask for nothing
    (`Say`, `StopLater`) are recorded so, for its next driver to honour."""
    state, actions = step(session.run, event)
    if actions:
        raise RuntimeError(f"{type(event).__name__} asks for work no driver carries")
    session.run = state
