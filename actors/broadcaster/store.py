"""The broadcaster's view of the session log: it reads, the supervisor writes.

There is one durable store of events, the supervisor's session log
(`actors.logstore`: `$OPLOOP_HOME/sessions.db`, or PostgreSQL at `[store] url`,
where it reads what any host wrote). The supervisor commits an
event there before it publishes it, so every event the broadcaster receives
is already on disk: the broadcaster keeps only a bounded tail in memory and
reads anything older from the log (SQLite WAL lets it read from its own
process while the supervisor writes). A broadcaster restart loses nothing
but what was in flight, which it asks the supervisor for (`backfill.py`).
"""

from __future__ import annotations

from pathlib import Path

from actors.logstore import SessionStore, open_store
from actors.sessionlog import JournalError, SessionLog
from actors.storage import SESSIONS_FILE

#: The file name of the session log inside `$OPLOOP_HOME`.
STORE_FILE = SESSIONS_FILE


class StoreError(Exception):
    """The session log cannot be opened or read (a corrupt file, an I/O error, ...)."""


class EventStore:
    """Read-only access to the frames of the session log, by (sid, seq)."""

    def __init__(self, path: Path, url: str = "") -> None:
        """The log at `url` (PostgreSQL), or ("") the SQLite file at `path`."""
        self.path = path
        self.url = url
        try:
            self._log: SessionStore = open_store(path.parent, url, readonly=True) if url \
                else SessionLog(path, readonly=True)
        except JournalError as exc:
            raise StoreError(str(exc)) from exc

    def heads(self) -> dict[str, int]:
        """The newest logged seq of every session."""
        try:
            return self._log.heads()
        except JournalError as exc:
            raise StoreError(str(exc)) from exc

    def range(
        self, sid: str, from_seq: int, to_seq: int, max_bytes: int
    ) -> tuple[list[tuple[int, bytes]], bool]:
        """Logged (seq, frame) of `sid` in `from_seq..to_seq` up to `max_bytes`; and whether
        cut. The first frame is returned whatever its size, so a reader always advances."""
        try:
            return self._log.range(sid, from_seq, to_seq, max_bytes)
        except JournalError as exc:
            raise StoreError(str(exc)) from exc

    def last_seq(self, sid: str) -> int | None:
        """The newest logged seq of `sid`, or None."""
        try:
            return self._log.last_seq(sid)
        except JournalError as exc:
            raise StoreError(str(exc)) from exc

    @property
    def shared(self) -> SessionStore | None:
        """The store when other hosts may write it too (PostgreSQL), else None."""
        return self._log if self.url else None

    def close(self) -> None:
        """Close the connection."""
        self._log.close()

