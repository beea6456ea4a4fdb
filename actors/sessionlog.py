"""The session log: every session's durable record, append-only (`$OPLOOP_HOME/sessions.db`).

One SQLite file in WAL mode, written by the supervisor alone and read by the
broadcaster (another process: WAL lets readers run beside the writer). It is
the only store of events: a restarted supervisor folds it back into sessions,
and a viewer's replay reads its frames (see docs/sessions.md).

Tables:

- `records`: per event one row (key, sid, seq, frame, delta): the encoded event as
  published, and the history changes that came with it (`delta`, msgpack, or
  NULL): a list of `(role, blocks)` operations replayed with the history's one
  merge rule (blocks of a role equal to the last message's join that message).
  Appending an event writes what it added, whatever the history's length. The
  rowid `key` is the session's number (`logs`) and the seq, `num << 32 | seq`:
  a session's records are one key range, and the newest session's next record
  goes at the tree's right edge (one leaf a commit, no secondary index to update).
- `logs`: each session's number in `records`' key, given at its first record
  (AUTOINCREMENT: a removed session's number is never given again, so a reader's
  cached number cannot point at another session's records).
- `sessions`: one small row per session (created, agent and cwd, a summary for
  listings, whether a run is open, a pending operation cancel), written at
  creation, at a run's start and end, and on an operation cancel.
- `compactions`: a session's folded state at a seq, written at a run's end (when
  due); a load starts there and reads only the records after it. Its history is
  a list of part hashes: each message is in `parts` once (keyed by the session and
  its digest), so a compaction writes only the messages new since the last one.
- `parts`: the messages compactions refer to, by (sid, hash).
- `starts`: `StartRun` keys and the run each began (a resent start after a
  restart is answered with that run).

Faults: SQLite's WAL checksums make a torn last commit invisible (the log ends
at the last whole one); a record that does not decode is the caller's to skip
(`Record.frame`/`delta` are raw bytes). A full disk raises `JournalFull`; the
log keeps a reserve file it gives up to finish what was running (see `commit`).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.storage import SESSIONS_FILE, bounded_cache, free_space, open_private_db

log = logging.getLogger("oploop.sessionlog")


@dataclass(frozen=True, slots=True)
class SessionOverview:
    """What retention needs to know of one stored session, without its history."""

    sid: str
    created: float
    last_activity: float
    #: Bytes the session holds on disk (its log, snapshot and events, every store).
    bytes: int
    running: bool

#: Space kept free for the log by default: below it new work is refused, and the
#: reserve file of this size is given up to journal the ends of running sessions.
DEFAULT_RESERVE_MB = 64
#: Seqs a session can have in the log: its records' keys are `num << 32 | seq`.
SEQ_MASK = (1 << 32) - 1
#: Sessions whose `logs` number a log keeps in memory (cleared past it, read again).
MAX_NUMS = 4096
#: How often (seconds) free space is measured at most.
FREE_SPACE_CHECK_S = 1.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    sid     TEXT PRIMARY KEY,
    created REAL NOT NULL,
    meta    BLOB NOT NULL,
    summary BLOB,
    updated REAL NOT NULL,
    running INTEGER NOT NULL DEFAULT 0,
    stop    BLOB
);
CREATE TABLE IF NOT EXISTS logs (
    num INTEGER PRIMARY KEY AUTOINCREMENT,
    sid TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS records (
    key   INTEGER PRIMARY KEY,
    sid   TEXT NOT NULL,
    seq   INTEGER NOT NULL,
    frame BLOB NOT NULL,
    delta BLOB
);
CREATE TABLE IF NOT EXISTS compactions (
    sid   TEXT PRIMARY KEY,
    seq   INTEGER NOT NULL,
    state BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS parts (
    sid  TEXT NOT NULL,
    hash BLOB NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (sid, hash)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS starts (
    key      TEXT PRIMARY KEY,
    sid      TEXT NOT NULL,
    run      INTEGER NOT NULL,
    from_seq INTEGER NOT NULL
);
"""


class JournalError(Exception):
    """The session log cannot be opened, read or written."""


class JournalFull(JournalError):
    """The disk (or the database's size limit) is full: nothing of the commit was written."""


# Not frozen (nor hashable), unlike the other values here: several are made every turn,
# and a frozen dataclass's `__init__` sets each field through `object.__setattr__`
# (3x the cost of this one's). Nothing edits one once made.
@dataclass(slots=True)
class Record:
    """One event as logged: its encoded frame and the history delta it carries."""

    sid: str
    seq: int
    frame: bytes
    delta: bytes | None = None


@dataclass(frozen=True, slots=True)
class SessionRow:
    """A session's small row: everything but its records."""

    sid: str
    created: float
    meta: bytes
    summary: bytes | None
    updated: float
    running: bool
    stop: bytes | None = None


@dataclass(frozen=True, slots=True)
class Compaction:
    """A session's folded state as of `seq` (records up to `seq` need not be read).

    `parts`: (hash, data) pieces the state refers to. Written: those not stored yet
    (a store keeps each once per session, whatever later compactions repeat);
    read: every part the session has."""

    sid: str
    seq: int
    state: bytes
    parts: tuple[tuple[bytes, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class StartKey:
    """A `StartRun` key and the run it began."""

    key: str
    sid: str
    run: int
    from_seq: int


class SessionLog:
    """The log file; every method is one short synchronous transaction."""

    def __init__(self, path: Path, *, reserve_mb: float = DEFAULT_RESERVE_MB,
                 readonly: bool = False) -> None:
        self.path = path
        self.reserve_bytes = int(reserve_mb * (1 << 20))
        self.readonly = readonly
        try:
            self.db = open_private_db(path, _SCHEMA)
            _upgrade(self.db)
        except (OSError, sqlite3.Error) as exc:
            raise JournalError(f"cannot open the session log {path}: {exc}") from exc
        #: sid -> its number in `records`' key (bounded: cleared past `MAX_NUMS`).
        self._nums: dict[str, int] = {}
        self.commits = 0
        #: Times the reserve was given up (the supervisor ends the runs under way then).
        self.releases = 0
        #: The reserve is given up and not yet remade: new work waits for it.
        self.released = False
        self._free = (0.0, 0)  # (measured at, bytes free)
        if not readonly:
            self.keep_reserve()

    @classmethod
    def for_home(cls, home: Path, **kwargs: float) -> SessionLog:
        """The log of the host in `home`."""
        return cls(home / SESSIONS_FILE, **kwargs)  # type: ignore[arg-type]

    # -- space ------------------------------------------------------------------------

    @property
    def reserve_path(self) -> Path:
        """The file holding the log's reserve of disk space (`storage.reserve_file`)."""
        return self.path.with_name(self.path.name + ".reserve")

    def keep_reserve(self) -> bool:
        """Make sure the reserve file exists (when there is room for it); whether it does.

        Never raises: a host on a full disk still starts (`oploop up`), it only
        refuses new work until space returns.
        """
        path = self.reserve_path
        if self.reserve_bytes <= 0:
            return True
        try:
            if path.exists() and path.stat().st_size >= self.reserve_bytes:
                self.released = False
                return True
            if self.free_bytes(fresh=True) < 2 * self.reserve_bytes:
                return False  # taking it would leave less than the reserve to everyone else
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.reserve_bytes)
            finally:
                os.close(fd)
            self.released = False
        except OSError as exc:
            log.warning("session log: no reserve file %s (%s)", path, exc)
            path.unlink(missing_ok=True)
            return False
        return True

    def release_reserve(self) -> bool:
        """Give the reserve's space back to the file system; whether there was one."""
        try:
            self.reserve_path.unlink()
        except FileNotFoundError:
            return False
        self.releases += 1
        self.released = True
        log.error("session log: disk full, reserve of %d MB released", self.reserve_bytes >> 20)
        return True

    def free_bytes(self, fresh: bool = False) -> int:
        """Free bytes on the log's file system (measured at most once a second)."""
        now = time.monotonic()
        if fresh or now - self._free[0] > FREE_SPACE_CHECK_S:
            try:
                free = free_space(self.path.parent)
            except OSError:
                free = 0
            self._free = (now, free)
        return self._free[1]

    def low_space(self) -> str:
        """Why new work should be refused for lack of disk space ("" when there is room)."""
        if self.reserve_bytes <= 0:
            return ""
        if self.released and not self.keep_reserve():
            return (f"disk_full: the disk filled up and the session log's reserve of "
                    f"{self.reserve_bytes >> 20} MB (limits.journal_reserve_mb) is in use "
                    f"until space returns on {self.path.parent}")
        free = self.free_bytes()
        if free >= self.reserve_bytes:
            return ""
        return (f"disk_full: {free >> 20} MB free on {self.path.parent}, below the session "
                f"log's reserve of {self.reserve_bytes >> 20} MB (limits.journal_reserve_mb)")

    # -- writing ----------------------------------------------------------------------

    def commit(self, records: Sequence[Record], rows: Iterable[SessionRow] = (),
               compactions: Iterable[Compaction] = (), starts: Iterable[StartKey] = ()) -> None:
        """Append `records` and write `rows`, `compactions`, `starts`, in one transaction.

        On a full disk the reserve file is given up and the commit tried once more:
        that room is what lets the runs under way end with their `ERROR` journaled.
        Raises `JournalFull` (nothing written) when even that fails.
        """
        rows, compactions, starts = list(rows), list(compactions), list(starts)
        try:
            self._commit(records, rows, compactions, starts)
        except JournalFull:
            if not self.release_reserve():
                raise
            self._commit(records, rows, compactions, starts)
        self.commits += 1

    def _commit(self, records: Sequence[Record], rows: list[SessionRow],
                compactions: list[Compaction], starts: list[StartKey]) -> None:
        db = self.db
        try:
            db.execute("BEGIN")
            try:
                # (Most commits carry records only: an empty statement costs a few µs.)
                if rows:
                    db.executemany("INSERT OR REPLACE INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?)",
                                   [(r.sid, r.created, r.meta, r.summary, r.updated,
                                     int(r.running), r.stop) for r in rows])
                if records:
                    db.executemany("INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?)",
                                   [(self._key(r.sid, r.seq), r.sid, r.seq, r.frame, r.delta)
                                    for r in records])
                if compactions:
                    db.executemany("INSERT OR REPLACE INTO compactions VALUES (?, ?, ?)",
                                   [(c.sid, c.seq, c.state) for c in compactions])
                    db.executemany("INSERT OR IGNORE INTO parts VALUES (?, ?, ?)",
                                   [(c.sid, h, d) for c in compactions for h, d in c.parts])
                if starts:
                    db.executemany("INSERT OR REPLACE INTO starts VALUES (?, ?, ?, ?)",
                                   [(s.key, s.sid, s.run, s.from_seq) for s in starts])
                db.execute("COMMIT")
            except BaseException:
                self._nums.clear()  # (numbers given in the transaction are void)
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            if _is_full(exc):
                raise JournalFull(f"cannot write the session log {self.path}: {exc}") from exc
            raise JournalError(f"cannot write the session log {self.path}: {exc}") from exc

    def remove(self, sids: Iterable[str]) -> int:
        """Delete every trace of `sids` (rows, records, compactions, start keys); how many
        sessions were known. The caller makes sure none of them is running."""
        sids = list(sids)
        params = [(sid,) for sid in sids]
        db = self.db
        try:
            db.execute("BEGIN")
            try:
                known = sum(db.execute("SELECT count(*) FROM sessions WHERE sid = ?", p)
                            .fetchone()[0] for p in params)
                for sid in sids:
                    num = self._num(sid)
                    if num is not None:
                        db.execute("DELETE FROM records WHERE key BETWEEN ? AND ?",
                                   _key_range(num))
                    self._nums.pop(sid, None)
                for table in ("logs", "compactions", "parts", "starts", "sessions"):
                    db.executemany(f"DELETE FROM {table} WHERE sid = ?", params)  # noqa: S608
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise JournalError(f"cannot remove sessions from {self.path}: {exc}") from exc
        return int(known)

    # -- reading ----------------------------------------------------------------------

    def row(self, sid: str) -> SessionRow | None:
        """The small row of `sid`, or None for a session not in the log."""
        got = self._one("SELECT sid, created, meta, summary, updated, running, stop "
                        "FROM sessions WHERE sid = ?", (sid,))
        if got is None:
            return None
        sid_, created, meta, summary, updated, running, stop = got
        return SessionRow(sid_, created, meta, summary, updated, bool(running), stop)

    def running(self) -> list[str]:
        """Sessions whose last run was open when last journaled (to resume)."""
        return [sid for (sid,) in self._all("SELECT sid FROM sessions WHERE running = 1")]

    def summaries(self) -> list[tuple[str, bytes | None]]:
        """(sid, summary) of every session, oldest first."""
        return self._all("SELECT sid, summary FROM sessions ORDER BY created")

    def compaction(self, sid: str) -> Compaction | None:
        """The latest compaction of `sid`, or None."""
        got = self._one("SELECT sid, seq, state FROM compactions WHERE sid = ?", (sid,))
        if got is None:
            return None
        parts = self._all("SELECT hash, data FROM parts WHERE sid = ?", (sid,))
        return Compaction(*got, parts=tuple((bytes(h), bytes(d)) for h, d in parts))

    def records(self, sid: str, after: int = 0) -> list[Record]:
        """The records of `sid` with seq > `after`, in seq order."""
        num = self._num(sid)
        if num is None:
            return []
        first, last = _key_range(num)
        rows = self._all("SELECT sid, seq, frame, delta FROM records WHERE key BETWEEN ? AND ? "
                         "ORDER BY key", (first + max(after, 0), last))
        return [Record(*r) for r in rows if r[1] > after]

    def start(self, key: str) -> StartKey | None:
        """The run a `StartRun` key began, or None."""
        got = self._one("SELECT key, sid, run, from_seq FROM starts WHERE key = ?", (key,))
        return None if got is None else StartKey(*got)

    def last_seq(self, sid: str) -> int | None:
        """The newest seq logged for `sid`, or None when it has none."""
        num = self._num(sid)
        if num is None:
            return None
        got = self._one("SELECT seq FROM records WHERE key BETWEEN ? AND ? "
                        "ORDER BY key DESC LIMIT 1", _key_range(num))
        return None if got is None else int(got[0])

    def heads(self) -> dict[str, int]:
        """The newest seq of every session with records."""
        return dict(self._all(
            f"SELECT sid, head FROM (SELECT l.sid, (SELECT r.seq FROM records r WHERE r.key "
            f"BETWEEN l.num << 32 AND (l.num << 32) | {SEQ_MASK} ORDER BY r.key DESC LIMIT 1) "
            f"AS head FROM logs l) WHERE head IS NOT NULL"))  # noqa: S608 - a constant

    def range(self, sid: str, from_seq: int, to_seq: int,
              max_bytes: int) -> tuple[list[tuple[int, bytes]], bool]:
        """(seq, frame) of `sid` in `from_seq..to_seq` up to `max_bytes`, and whether cut.
        The first frame is returned whatever its size, so a reader always advances."""
        out: list[tuple[int, bytes]] = []
        size = 0
        num = self._num(sid)
        if num is None or to_seq < from_seq:
            return out, False
        first, last = _key_range(num)
        span = (first + max(from_seq, 0), min(first + max(to_seq, 0), last))
        try:
            cursor = self.db.execute("SELECT seq, frame FROM records WHERE key BETWEEN ? AND ? "
                                     "ORDER BY key", span)
            try:
                for seq, frame in cursor:
                    if out and size + len(frame) > max_bytes:
                        return out, True
                    out.append((seq, frame))
                    size += len(frame)
            finally:
                cursor.close()
        except sqlite3.Error as exc:
            raise JournalError(f"cannot read {self.path}: {exc}") from exc
        return out, False

    def sessions_overview(self) -> list[SessionOverview]:
        """Every session: created, last activity, bytes on disk (records and compaction,
        approximately), and whether a run is open. For retention; reads no frame.

        Through a read-only connection of its own: retention calls it in a thread,
        beside the writer's transactions on `self.db`."""
        try:
            with contextlib.closing(sqlite3.connect(f"file:{self.path}?mode=ro", uri=True,
                                                    check_same_thread=False)) as db:
                rows = list(bounded_cache(db).execute(
            "SELECT s.sid, s.created, s.updated, s.running, "
            "coalesce((SELECT sum(length(frame) + coalesce(length(delta), 0)) "
            "          FROM logs l JOIN records r ON r.key BETWEEN l.num << 32 AND "
            f"         (l.num << 32) | {SEQ_MASK} WHERE l.sid = s.sid), 0) + "
            "coalesce((SELECT length(state) FROM compactions c WHERE c.sid = s.sid), 0) + "
            "coalesce((SELECT sum(length(data)) FROM parts p WHERE p.sid = s.sid), 0) "
            "FROM sessions s ORDER BY s.created"))
        except sqlite3.Error as exc:
            raise JournalError(f"cannot read {self.path}: {exc}") from exc
        return [SessionOverview(sid, created, updated, int(size), bool(running))
                for sid, created, updated, running, size in rows]

    def close(self) -> None:
        """Close the database."""
        self.db.close()

    # -- keys -------------------------------------------------------------------------

    def _num(self, sid: str) -> int | None:
        """The number of `sid` in `records`' key, or None when it has no record."""
        num = self._nums.get(sid)
        if num is None:
            got = self._one("SELECT num FROM logs WHERE sid = ?", (sid,))
            if got is None:
                return None
            num = self._remember(sid, int(got[0]))
        return num

    def _remember(self, sid: str, num: int) -> int:
        if len(self._nums) >= MAX_NUMS:
            self._nums.clear()
        self._nums[sid] = num
        return num

    def _key(self, sid: str, seq: int) -> int:
        """The key of record `seq` of `sid`, numbering a new session (in the caller's
        transaction: a rollback clears what was numbered)."""
        if not 0 < seq <= SEQ_MASK:
            raise JournalError(f"seq {seq} of {sid} is out of the session log's range")
        num = self._num(sid)
        if num is None:
            cursor = self.db.execute("INSERT INTO logs (sid) VALUES (?)", (sid,))
            num = self._remember(sid, int(cursor.lastrowid or 0))
        return (num << 32) | seq

    def _one(self, sql: str, params: tuple[object, ...] = ()) -> Any:
        try:
            got = self.db.execute(sql, params).fetchone()
        except sqlite3.Error as exc:
            raise JournalError(f"cannot read {self.path}: {exc}") from exc
        return got

    def _all(self, sql: str, params: tuple[object, ...] = ()) -> list[Any]:
        try:
            return list(self.db.execute(sql, params))
        except sqlite3.Error as exc:
            raise JournalError(f"cannot read {self.path}: {exc}") from exc


def _key_range(num: int) -> tuple[int, int]:
    """The first and last key a session numbered `num` can have in `records`."""
    return num << 32, (num << 32) | SEQ_MASK


def _upgrade(db: sqlite3.Connection) -> None:
    """Rewrite a log made before `records` was keyed by rowid (a `WITHOUT ROWID` table
    keyed by (sid, seq)) into today's tables, in one transaction (a reader that opened
    it meanwhile waits on the lock, then finds it done)."""
    def old() -> bool:
        got = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' "
                         "AND name = 'records'").fetchone()
        return got is not None and "WITHOUT ROWID" in got[0].upper()

    if not old():
        return
    db.execute("BEGIN IMMEDIATE")
    try:
        if old():
            db.execute("ALTER TABLE records RENAME TO records_old")
            db.execute("CREATE TABLE records (key INTEGER PRIMARY KEY, sid TEXT NOT NULL, "
                       "seq INTEGER NOT NULL, frame BLOB NOT NULL, delta BLOB)")
            db.execute("INSERT OR IGNORE INTO logs (sid) SELECT DISTINCT sid FROM records_old "
                       "ORDER BY sid")
            db.execute("INSERT INTO records SELECT (l.num << 32) | r.seq, r.sid, r.seq, "
                       "r.frame, r.delta FROM records_old r JOIN logs l USING (sid) "
                       "ORDER BY l.num, r.seq")
            db.execute("DROP TABLE records_old")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    log.warning("session log: records rewritten keyed by rowid (one page per commit)")


def _is_full(exc: sqlite3.Error) -> bool:
    """Whether SQLite failed for lack of space (SQLITE_FULL, or ENOSPC from the OS)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code == getattr(sqlite3, "SQLITE_FULL", 13):
        return True
    text = str(exc).lower()
    return "full" in text or os.strerror(errno.ENOSPC).lower() in text
