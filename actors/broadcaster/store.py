"""Every session's event log on disk: one SQLite file in `$OPLOOP_HOME`.

The broadcaster is the only writer. WAL with `synchronous=NORMAL` makes a
commit survive the broadcaster being killed (what a restart must not lose);
only a power cut can take the last commits, and those are still in the
supervisor's resend ring. The file and its `-wal`/`-shm` companions are 0600:
SQLite gives the companions the database file's own mode.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from actors.storage import EVENTS_FILE, open_private_db

#: The file name of the event store inside `$OPLOOP_HOME`.
STORE_FILE = EVENTS_FILE

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    sid      TEXT PRIMARY KEY,
    last_seq INTEGER NOT NULL,
    updated  REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    sid   TEXT NOT NULL,
    seq   INTEGER NOT NULL,
    frame BLOB NOT NULL,
    PRIMARY KEY (sid, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_by_age ON sessions (updated);
"""


class StoreError(Exception):
    """The event store cannot be opened or written (disk full, corrupt file, ...)."""


@dataclass(frozen=True, slots=True)
class StoredSession:
    """What the store knows of one session without reading its events."""

    sid: str
    last_seq: int
    updated: float


class EventStore:
    """Frames of every session by (sid, seq), plus each session's newest seq."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._db = open_private_db(path, _SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"cannot open event store {path}: {exc}") from exc

    def sessions(self) -> list[StoredSession]:
        """Every stored session."""
        rows = self._db.execute("SELECT sid, last_seq, updated FROM sessions").fetchall()
        return [StoredSession(*row) for row in rows]

    def write(self, events: Iterable[tuple[str, int, bytes]], heads: dict[str, int]) -> None:
        """Store `events` (sid, seq, frame) and each session's new `last_seq`, atomically."""
        now = time.time()
        try:
            with self._transaction():
                self._db.executemany(
                    "INSERT OR IGNORE INTO events (sid, seq, frame) VALUES (?, ?, ?)", events
                )
                self._db.executemany(
                    "INSERT INTO sessions (sid, last_seq, updated) VALUES (?, ?, ?) "
                    "ON CONFLICT (sid) DO UPDATE SET last_seq = excluded.last_seq, "
                    "updated = excluded.updated",
                    ((sid, seq, now) for sid, seq in heads.items()),
                )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write to {self.path}: {exc}") from exc

    def range(
        self, sid: str, from_seq: int, to_seq: int, max_bytes: int
    ) -> tuple[list[tuple[int, bytes]], bool]:
        """Stored (seq, frame) of `sid` in `from_seq..to_seq` up to `max_bytes`; and whether cut.

        The first frame is returned whatever its size, so a reader always advances.
        """
        out: list[tuple[int, bytes]] = []
        size = 0
        try:
            cursor = self._db.execute(
                "SELECT seq, frame FROM events WHERE sid = ? AND seq BETWEEN ? AND ? ORDER BY seq",
                (sid, from_seq, to_seq),
            )
            try:
                for seq, frame in cursor:
                    if out and size + len(frame) > max_bytes:
                        return out, True
                    out.append((seq, frame))
                    size += len(frame)
            finally:
                cursor.close()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read {self.path}: {exc}") from exc
        return out, False

    def remove(self, sids: Collection[str]) -> None:
        """Delete every event of `sids` (the supervisor deleted those sessions)."""
        try:
            with self._transaction():
                params = [(sid,) for sid in sids]
                self._db.executemany("DELETE FROM events WHERE sid = ?", params)
                self._db.executemany("DELETE FROM sessions WHERE sid = ?", params)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot delete from {self.path}: {exc}") from exc

    def close(self) -> None:
        """Close the database (the WAL is checkpointed by SQLite on the last close)."""
        self._db.close()

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    """BEGIN … COMMIT, or ROLLBACK on error (the connection runs in autocommit mode)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self._db.execute("COMMIT")
        else:
            self._db.execute("ROLLBACK")
