"""The supervisor's side of the session log: one loop iteration's facts, one commit.

Every event the supervisor emits becomes a `Record` here (its frame and the
history delta since the session's previous event); a run's start and end also
rewrite the session's small row. A compaction (the session's whole state) is
written once `compact_every_kb` of records, and at least as many bytes as the last
one took, were logged since the session's last one: mid-run (at the next commit) or
at a run's end, whichever comes first. So a large history is not rewritten at every
short run of a chat, nor every few KB of a long run; a busy host's short runs write
none at their end (at 10 turns a run, a run's end compaction was a third of the
commits' cost); the bytes of compactions stay within those of the records, and a
load folds at most about `compact_every_kb` of records after the compaction.
It is written with the commit, when the session is exactly the fold of its
records (the driver changes a session and emits its events in one synchronous step). The
supervisor commits the batch at the end of the loop iteration and only then
publishes its events: whatever a viewer has seen, a restarted supervisor knows.
With `synchronous=NORMAL` a commit survives the process being killed without
an fsync per commit. Work and bytes per event depend on what the event added,
never on the history's length (docs/sessions.md).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

from actors.config import Agent
from actors.core.session import Session
from actors.logstore import SessionStore
from actors.sessionlog import (
    DEFAULT_RESERVE_MB,
    Compaction,
    JournalError,
    Record,
    SessionLog,
    SessionRow,
    StartKey,
)
from actors.storage import SESSIONS_FILE
from actors.supervisor.fold import (
    compaction,
    history_delta,
    load_session,
    record_delta,
    run_extras,
    session_row,
)
from bus.messages import RunStarted
from bus.vocab import TERMINAL, EventType

log = logging.getLogger("oploop.journal")

__all__ = ["Batch", "Journal", "JournalError"]


@dataclass(slots=True)
class Batch:
    """What one commit writes."""

    records: list[Record] = field(default_factory=list)
    rows: dict[str, SessionRow] = field(default_factory=dict)
    compactions: dict[str, Compaction] = field(default_factory=dict)
    starts: list[StartKey] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.records or self.rows or self.compactions or self.starts)


#: (Bound once: a member looked up on its enum costs ~0.5 µs in Python 3.11, and every
#: event is recorded here.)
_SESSION_START, _USER_MESSAGE = EventType.SESSION_START, EventType.USER_MESSAGE

#: Default of `[limits] compact_every_kb`.
DEFAULT_COMPACT_EVERY_KB = 256


class Journal:
    """Collects a loop iteration's records and commits them to the `SessionLog`."""

    def __init__(self, path: Path, reserve_mb: float = DEFAULT_RESERVE_MB,
                 compact_every_kb: int = DEFAULT_COMPACT_EVERY_KB,
                 store: SessionStore | None = None) -> None:
        #: The store (`store`, else the SQLite file at `path`: `actors.logstore`).
        self.log: SessionStore = store if store is not None else \
            SessionLog(path, reserve_mb=reserve_mb)
        self.path = path
        self.batch = Batch()
        self.compact_every = compact_every_kb * 1024
        #: Sessions whose compaction the next commit writes (mid-run).
        self._due: dict[str, Session] = {}

    @classmethod
    def for_home(cls, home: Path, reserve_mb: float = DEFAULT_RESERVE_MB,
                 compact_every_kb: int = DEFAULT_COMPACT_EVERY_KB) -> Journal:
        """The journal of the host in `home`."""
        return cls(home / SESSIONS_FILE, reserve_mb, compact_every_kb)

    @property
    def commits(self) -> int:
        """Commits made so far."""
        return self.log.commits

    def record(self, session: Session, type_: str, seq: int, frame: bytes) -> Record:
        """Add event `seq` of `session` (already encoded) with the history it added."""
        extras = run_extras(session) if type_ == _SESSION_START else None
        record = Record(session.id, seq, frame, record_delta(history_delta(session), extras))
        batch = self.batch
        batch.records.append(record)
        if type_ == _USER_MESSAGE:  # a message taken leaves the row's queue
            batch.rows[session.id] = session_row(session)
        if type_ == _SESSION_START:
            batch.rows[session.id] = session_row(session)
            if session.start_key:
                batch.starts.append(StartKey(session.start_key, session.id, session.runs, seq))
        session.log_since += len(frame) + len(record.delta or b"")
        due = session.log_since >= max(self.compact_every, session.log_compacted)
        if type_ in TERMINAL:
            batch.rows[session.id] = session_row(session)
            self._due.pop(session.id, None)
            if due:
                self._compact(session)
        elif due and self.compact_every:  # (0: never mid-run)
            self._due[session.id] = session
        return record

    def _compact(self, session: Session) -> None:
        """Write `session`'s state as of now with the batch (it is the fold of its
        records now: the end of a step, `docs/sessions.md`)."""
        comp = compaction(session)
        pending = self.batch.compactions.get(session.id)
        if pending is not None and pending.parts:
            # A compaction still to be committed (its commit failed, or the same
            # batch): the messages it was to store are taken as stored already.
            comp = dataclasses.replace(comp, parts=pending.parts + comp.parts)
        self.batch.compactions[session.id] = comp
        session.log_since, session.log_compacted = 0, len(comp.state)

    def touch(self, session: Session) -> None:
        """Rewrite the session's row with the next commit (e.g. an operation cancel)."""
        self.batch.rows[session.id] = session_row(session)

    def drop(self, sids: set[str]) -> None:
        """Leave everything of `sids` out of the pending batch (another host runs them
        now: `actors.supervisor.ownership`)."""
        batch = self.batch
        batch.records = [r for r in batch.records if r.sid not in sids]
        batch.starts = [s for s in batch.starts if s.sid not in sids]
        for sid in sids:
            batch.rows.pop(sid, None)
            batch.compactions.pop(sid, None)
            self._due.pop(sid, None)

    def commit(self) -> Batch:
        """Write the batch; returns it. Raises `JournalError` (`JournalFull`), and then
        the batch stays pending: the next commit tries it again."""
        batch = self.batch
        for session in self._due.values():  # (a long run: its state as of now)
            self._compact(session)
        self._due.clear()
        if batch:
            self.log.commit(batch.records, batch.rows.values(), batch.compactions.values(),
                            batch.starts)
        self.batch = Batch()
        return batch

    def start_of(self, key: str) -> RunStarted | None:
        """The run the `StartRun` with `key` began, as logged, or None (a failed lookup
        is logged: the start is then taken as new)."""
        try:
            logged = self.log.start(key)
        except JournalError as exc:
            log.error("start key lookup: %s", exc)
            return None
        return None if logged is None else RunStarted(logged.sid, logged.run, logged.from_seq)

    def open_sessions(self) -> list[str]:
        """The sessions whose run the log has open (none if it cannot list them)."""
        try:
            return list(self.log.running())
        except JournalError as exc:
            log.error("cannot list the sessions to resume: %s", exc)
            return []

    def run_records(self, session: Session) -> list[Record]:
        """The records of `session`'s latest run, from its `SESSION_START` on (none if
        they cannot be read: that is logged)."""
        try:
            return list(self.log.records(session.id, after=max(0, session.run_from_seq - 1)))
        except JournalError as exc:
            log.error("session %s: cannot read its run's records: %s", session.id, exc)
            return []

    def load(self, sid: str, agents: dict[str, Agent]) -> Session | None:
        """The session `sid` folded from the log (None: no such session)."""
        return load_session(self.log, sid, agents)

    def close(self) -> None:
        """Close the log."""
        self.log.close()
