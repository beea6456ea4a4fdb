"""What the dispatcher keeps of each worker and each job (`dispatch.py`), apart so
that what hands jobs over (`adoption.py`) needs no import of the dispatcher."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.machines import LOCAL
from bus.messages import Body, Envelope

#: Called with each message a job's worker sends before its result.
OnProgress = Callable[[Envelope], None]


class NoCapacity(Exception):
    """Too many jobs are waiting for workers of a role."""


@dataclass
class WorkerState:
    """A live worker as the supervisor sees it."""

    id: bytes
    role: str
    capacity: int
    tools: list[dict[str, Any]]
    inflight: set[str] = field(default_factory=set)
    control_id: bytes | None = None
    #: Its MCP servers' states (`ToolsChanged.servers`), for `oploop status` and `tools`.
    servers: list[dict[str, Any]] = field(default_factory=list)
    #: The worker machine it runs on (`LOCAL` for the host's own).
    machine: str = LOCAL

    #: How many of `inflight` are of each session (`Dispatcher._busy_with`, asked at every
    #: dispatch: looking each job up cost O(slots) a dispatch).
    sessions: dict[str, int] = field(default_factory=dict)

    @property
    def free(self) -> int:
        """Job slots not in use."""
        return self.capacity - len(self.inflight)

    def take(self, job: Job) -> None:
        """`job` runs here now."""
        if job.id not in self.inflight:
            self.inflight.add(job.id)
            sid = job.env.sid
            self.sessions[sid] = self.sessions.get(sid, 0) + 1

    def give(self, job: Job) -> None:
        """`job` no longer holds a slot here."""
        if job.id in self.inflight:
            self.inflight.discard(job.id)
            sid = job.env.sid
            left = self.sessions.get(sid, 0) - 1
            if left > 0:
                self.sessions[sid] = left
            else:
                self.sessions.pop(sid, None)


@dataclass
class Job:
    """One job in flight or waiting: what to send, whom it went to, who waits."""

    id: str
    role: str
    env: Envelope
    future: asyncio.Future[Envelope]
    on_progress: OnProgress
    worker: bytes | None = None
    dispatches: int = 0
    #: Abort sent: the worker's slot stays taken until it acknowledges (its reply).
    aborted: bool = False
    #: The body as one worker should receive it (history deltas), else `env.body`.
    for_worker: Callable[[bytes], Body] | None = None
    #: Only workers of this machine may take it (None: any worker of its role).
    machine: str | None = None
    #: An adopted job's messages that came before its run took it over (`adopted`).
    early: list[Envelope] | None = None

    @property
    def queue(self) -> tuple[str, str | None]:
        """The key of the queue it waits in: its role and machine."""
        return self.role, self.machine


#: Roles whose jobs may leave before the events emitted with them are committed: a
#: model call (made again after a crash, nothing lost). A tool job leaves only once its
#: `TOOL_START` is in the session log: a call the log does not show as started would
#: never be answered "interrupted" after a crash, and could be run twice.
EARLY_ROLES = frozenset({"llm"})


class Outbox:
    """Jobs matched to workers and encoded, to be sent together once the loop's turn is
    over (`Dispatcher._send_out`): the sends of a turn then go in one burst, which
    libzmq's I/O thread takes in one wake-up, and each worker receives them in one read
    and serves them in one round. One at a time, each send woke the I/O threads of both
    sides and the worker's loop again (issue 28: ~0.3 ms of CPU a turn in all).

    A job in the outbox holds its worker's slot, as one sent; it is never sent once
    aborted or its worker gone (`drop`, `take_worker`)."""

    __slots__ = ("_jobs",)

    def __init__(self) -> None:
        self._jobs: dict[str, tuple[Job, WorkerState, bytes]] = {}

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, job: Job, worker: WorkerState, frame: bytes) -> None:
        """Send `frame` (the encoded `job`) to `worker` with the others."""
        self._jobs[job.id] = (job, worker, frame)

    def take(self, early: bool = False) -> list[tuple[Job, WorkerState, bytes]]:
        """Everything to send, in the order it came, taken out; `early`: what may leave
        before this turn's events are committed: the jobs if all of them may
        (`EARLY_ROLES`), else none (then all go in one burst after the commit, as one
        wake-up of the I/O threads: many sessions' turns mix model calls and tool
        calls, and a burst each would cost a wake-up more a turn of the loop)."""
        if early and any(job.role not in EARLY_ROLES for job, _, _ in self._jobs.values()):
            return []
        out = list(self._jobs.values())
        self._jobs.clear()
        return out

    def drop(self, job: Job) -> bool:
        """Leave `job` unsent; whether it was waiting here."""
        return self._jobs.pop(job.id, None) is not None

    def take_worker(self, peer: bytes) -> list[tuple[Job, WorkerState]]:
        """The jobs waiting here for worker `peer`, in order, taken out."""
        mine = [(jid, job, w) for jid, (job, w, _) in self._jobs.items() if w.id == peer]
        for jid, _, _ in mine:
            del self._jobs[jid]
        return [(job, w) for _, job, w in mine]
