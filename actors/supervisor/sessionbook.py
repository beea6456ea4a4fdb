"""The sessions a supervisor knows: in memory while running, else in the session log.

`SessionBook` is the `Supervisor`'s base: which sessions exist (`session`, `known`,
`summaries`), what a request naming a missing one is told, the open runs the log holds,
the runs recent `StartRun` keys began, and, on a store other hosts share, whether this
host holds a session's lease (`own`, `elsewhere`). Apart from `actor.py`, whose
`Supervisor` adds the sockets, the commits and the runs: these are the lookups, with
no socket of their own. A session leaves memory once its end is committed, which is
the supervisor's to schedule (`_schedule_flush`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import msgpack

from actors.config import Config
from actors.core.session import Session
from actors.sessionlog import JournalError, Record
from actors.supervisor.journal import Journal
from bus.messages import RunStarted

if TYPE_CHECKING:
    from actors.supervisor.ownership import Ownership  # (psycopg: a shared store only)
    from actors.supervisor.pruning import Pruner

log = logging.getLogger("oploop.supervisor")

#: Start keys remembered in memory (resends come within seconds; older ones, and
#: every one across a restart, are looked up in the session log).
MAX_START_KEYS = 1_024


class SessionBook:
    """Every session of the supervisor: in memory while running (and a while after
    its end, until that end is committed), else folded from the log when asked for."""

    def __init__(self, config: Config, journal: Journal | None) -> None:
        self.config = config
        self.journal = journal
        #: Sessions whose run ended: they leave memory once that end is committed.
        self._ended: list[Session] = []
        #: `StartRun` keys of recent runs -> their `RunStarted` (bounded, oldest out).
        self._starts: dict[str, RunStarted] = {}
        #: The sessions in memory: running, or loaded to be read, or ended and not yet
        #: committed (`_ended`).
        self.sessions: dict[str, Session] = {}
        #: Retention (None: nothing is ever deleted, as without a journal).
        self.pruner: Pruner | None = None
        #: This host's leases on a store other hosts share (None: the store is its own).
        self.ownership: Ownership | None = None  # (psycopg is imported only then)

    def session(self, sid: str) -> Session | None:
        """The session `sid`: in memory, else folded from the log (and kept in memory
        until its next run ends); None when there is no such session."""
        session = self.sessions.get(sid)
        if session is not None or self.journal is None or not sid:
            return session
        try:
            session = self.journal.load(sid, dict(self.config.agents))
        except JournalError as exc:
            log.error("session %s cannot be loaded: %s", sid, exc)
            return None
        if session is not None:
            self.sessions[sid] = session
            self._ended.append(session)  # leaves memory again unless a run starts
            self._schedule_flush()
        return session

    def known(self, sid: str) -> bool:
        """Whether `sid` is a session in memory or in the log (without loading it)."""
        if sid in self.sessions:
            return True
        if self.journal is None or not sid:
            return False
        try:
            return self.journal.log.row(sid) is not None
        except JournalError as exc:
            log.error("session %s: %s", sid, exc)
            return False

    def no_session(self, sid: str) -> str:
        """What a request naming a session the supervisor does not hold is told."""
        if self.pruner is not None and self.pruner.pruned(sid):
            return f"no such session {sid!r} (pruned)"
        return f"no session {sid!r}"

    def no_agent(self, name: str) -> str:
        """What a request naming an agent the configuration does not have is told."""
        return f"no agent {name!r} (configured: {', '.join(sorted(self.config.agents))})"

    def summaries(self) -> list[dict[str, Any]]:
        """Every session as `oploop sessions` lists it (memory first, then the log)."""
        out = [s.summary() for s in self.sessions.values()]
        if self.journal is None:
            return out
        try:
            logged = self.journal.log.summaries()
        except JournalError as exc:
            log.error("session list: %s", exc)
            return out
        for sid, summary in logged:
            if sid not in self.sessions and summary:
                try:
                    out.append(msgpack.unpackb(summary, raw=False))
                except (ValueError, TypeError, msgpack.UnpackException):
                    log.error("session %s: its summary does not decode; not listed", sid)
        return out

    def running_sessions(self) -> set[str]:
        """Sessions with a run not over, or whose run's task is still unwinding."""
        return {sid for sid, s in self.sessions.items()
                if not s.run_over or (s.task is not None and not s.task.done())}

    def open_in_log(self) -> list[str]:
        """The sessions whose run the session log has open (none without a log)."""
        return self.journal.open_sessions() if self.journal is not None else []

    def run_records(self, session: Session) -> list[Record]:
        """The records of `session`'s latest run in the log (none without a log)."""
        return self.journal.run_records(session) if self.journal is not None else []

    def forget_when_committed(self, session: Session) -> None:
        """`session`'s run has ended: it leaves memory once that end is committed."""
        if self.journal is not None:
            self._ended.append(session)
            self._schedule_flush()

    def started_by(self, key: str) -> RunStarted | None:
        """The run a `StartRun` with `key` already began (memory, else the log), or None."""
        if not key:
            return None
        known = self._starts.get(key)
        if known is None and self.journal is not None:
            known = self.journal.start_of(key)
        return known

    def remember_start(self, key: str, started: RunStarted) -> None:
        """Remember the run a `StartRun` with `key` began (a resend gets it)."""
        if not key:
            return
        self._starts[key] = started
        if len(self._starts) > MAX_START_KEYS:
            del self._starts[next(iter(self._starts))]

    def own(self, sid: str) -> tuple[str, str] | None:
        """Take `sid`'s lease when the store is shared (`Ownership.acquire`); None when
        taken (or the store is this host's alone), else why not as (error, message)."""
        if self.ownership is None:
            return None
        problem = self.ownership.acquire(sid)
        if not problem:
            return None
        return ("busy" if "is running on host" in problem else "unavailable"), problem

    def elsewhere(self, session: Session) -> str:
        """Why `session`'s open run cannot be acted on here: another host of the shared
        store holds it (a request `forwarding` could not send on: the store out of
        reach, a request forwarded here already), or ""."""
        if self.ownership is None or session.run_over or \
                session.id in self.ownership.fence.epochs:
            return ""
        return self.ownership.runs_elsewhere(session.id)

    def not_resumed(self, sid: str) -> None:
        """`sid` was claimed (or found open) but is not resumed: its lease is given up."""
        if self.ownership is not None and sid in self.ownership.fence.epochs:
            self.ownership.release({sid})

    def _schedule_flush(self, urgent: bool = True) -> None:
        """Commit what this loop iteration wrote soon (the `Supervisor`'s group commit),
        and with it let the sessions whose end it holds leave memory."""
        raise NotImplementedError
