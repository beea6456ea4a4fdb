"""The session log's interface, and which store a host uses.

A store keeps every session's records, its small row, its latest compaction
(a folded-state snapshot) and the `StartRun` keys (`actors.sessionlog` says what
each holds). Two stores implement `SessionStore` with the same semantics:

- `actors.sessionlog.SessionLog`: one SQLite file in `$OPLOOP_HOME` (the
  default, embedded: nothing to run besides oploop);
- `actors.pglog.PgSessionLog`: PostgreSQL at `[store] url` (or `OPLOOP_STORE`),
  which several hosts share (leases and fencing: docs/sessions.md).

`open_store` picks one from the URL ("" is the SQLite file). Every method is one
short synchronous transaction; errors are `JournalError` (`JournalFull` when
nothing could be written for lack of space).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from actors.configparts.store import STORE_SCHEMES
from actors.sessionlog import (
    DEFAULT_RESERVE_MB,
    Compaction,
    Record,
    SessionLog,
    SessionOverview,
    SessionRow,
    StartKey,
)
from actors.storage import SESSIONS_FILE


class SessionStore(Protocol):
    """What the supervisor, the broadcaster and retention use of the session log."""

    #: Commits made so far.
    commits: int
    #: Times the disk reserve was given up (the supervisor ends the runs under way then).
    releases: int

    @property
    def where(self) -> str:
        """Where the store is, for messages (a path, or a URL without its password)."""

    def commit(self, records: Sequence[Record], rows: Iterable[SessionRow] = (),
               compactions: Iterable[Compaction] = (), starts: Iterable[StartKey] = ()) -> None:
        """Append `records` and write `rows`, `compactions`, `starts`, in one transaction
        (all or nothing)."""

    def remove(self, sids: Iterable[str]) -> int:
        """Delete every trace of `sids`; how many sessions were known."""

    def row(self, sid: str) -> SessionRow | None:
        """The small row of `sid`, or None."""

    def running(self) -> list[str]:
        """Sessions whose last run was open when last journaled."""

    def summaries(self) -> list[tuple[str, bytes | None]]:
        """(sid, summary) of every session, oldest first."""

    def compaction(self, sid: str) -> Compaction | None:
        """The latest compaction of `sid`, or None."""

    def records(self, sid: str, after: int = 0) -> list[Record]:
        """The records of `sid` with seq > `after`, in seq order."""

    def start(self, key: str) -> StartKey | None:
        """The run a `StartRun` key began, or None."""

    def last_seq(self, sid: str) -> int | None:
        """The newest seq logged for `sid`, or None."""

    def heads(self) -> dict[str, int]:
        """The newest seq of every session with records."""

    def range(self, sid: str, from_seq: int, to_seq: int,
              max_bytes: int) -> tuple[list[tuple[int, bytes]], bool]:
        """(seq, frame) of `sid` in `from_seq..to_seq` up to `max_bytes` (the first
        whatever its size), and whether cut."""

    def sessions_overview(self) -> list[SessionOverview]:
        """Every session's size and times, for retention (may be called in a thread)."""

    def low_space(self) -> str:
        """Why new work should be refused for lack of space ("" when there is room)."""

    def keep_reserve(self) -> bool:
        """Keep the store's reserve of space, where it has one; whether it is kept."""

    def close(self) -> None:
        """Close the store."""


def is_pg_url(url: str) -> bool:
    """Whether `url` names a PostgreSQL store."""
    return url.startswith(STORE_SCHEMES)


def open_store(home: Path, url: str = "", *, readonly: bool = False,
               reserve_mb: float = DEFAULT_RESERVE_MB) -> SessionStore:
    """The session log of the host in `home`: PostgreSQL at `url`, or (`url` "") the
    SQLite file `$OPLOOP_HOME/sessions.db`. Raises `JournalError` saying why not."""
    if not url:
        return SessionLog(home / SESSIONS_FILE, reserve_mb=reserve_mb, readonly=readonly)
    from actors.pglog import PgSessionLog  # (psycopg only where a PostgreSQL store is used)

    return PgSessionLog(url, readonly=readonly)
