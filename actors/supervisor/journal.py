"""The supervisor's side of the session log: one loop iteration's facts, one commit.

Every event the supervisor emits becomes a `Record` here (its frame and the
history delta since the session's previous event); a run's start and end also
rewrite the session's small row, and a run's end writes a compaction, as does a
long run each time `compact_every_kb` of records were logged since its last one
and at least as many as the last compaction's own size (so that a huge history
is not rewritten every few KB: the bytes written stay within twice the log's).
It is written with the commit, when the session is exactly the fold of its
records (the driver changes a session and emits its events in one synchronous step). The
supervisor commits the batch at the end of the loop iteration and only then
publishes its events: whatever a viewer has seen, a restarted supervisor knows.
With `synchronous=NORMAL` a commit survives the process being killed without
an fsync per commit. Work and bytes per event depend on what the event added,
never on the history's length (docs/sessions.md).
"""

from __future__ import annotations

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


#: Default of `[limits] compact_every_kb`.
DEFAULT_COMPACT_EVERY_KB = 4096


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
        #: Per session: bytes of records logged since its last compaction, and that
        #: compaction's size (bound: sessions with a run open; an end compacts and
        #: drops them).
        self._since: dict[str, int] = {}
        self._size: dict[str, int] = {}
        #: Sessions whose compaction the next commit writes.
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
        extras = run_extras(session) if type_ == EventType.SESSION_START else None
        record = Record(session.id, seq, frame, record_delta(history_delta(session), extras))
        batch = self.batch
        batch.records.append(record)
        if type_ == EventType.USER_MESSAGE:  # a message taken leaves the row's queue
            batch.rows[session.id] = session_row(session)
        if type_ == EventType.SESSION_START:
            batch.rows[session.id] = session_row(session)
            if session.start_key:
                batch.starts.append(StartKey(session.start_key, session.id, session.runs, seq))
        if type_ in TERMINAL:
            batch.rows[session.id] = session_row(session)
            batch.compactions[session.id] = compaction(session)
            self._since.pop(session.id, None)
            self._size.pop(session.id, None)
            self._due.pop(session.id, None)
        elif self.compact_every:
            since = self._since.get(session.id, 0) + len(frame) + len(record.delta or b"")
            if since >= max(self.compact_every, self._size.get(session.id, 0)):
                self._due[session.id] = session
                since = 0
            self._since[session.id] = since
        return record

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
            self._since.pop(sid, None)
            self._size.pop(sid, None)

    def commit(self) -> Batch:
        """Write the batch; returns it. Raises `JournalError` (`JournalFull`), and then
        the batch stays pending: the next commit tries it again."""
        batch = self.batch
        for sid, session in self._due.items():  # (a long run: its state as of now)
            batch.compactions[sid] = comp = compaction(session)
            self._size[sid] = len(comp.state)
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
