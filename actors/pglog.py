"""The session log in PostgreSQL (`[store] url = "postgresql://..."`, `OPLOOP_STORE`).

The same tables and semantics as the SQLite store (`actors.sessionlog`; the
interface: `actors.logstore.SessionStore`), in a database several hosts share:

- `records` (sid, seq, epoch, frame, delta): `(sid, seq)` is the primary key and
  a record is inserted, never replaced: a second writer of a seq fails, whoever
  it is. `epoch` is the lease epoch its writer held (0: written unleased);
- `sessions`, `compactions`, `starts`: as in SQLite (written with upserts);
- `leases` (sid, owner, epoch, expires): which host runs which session
  (`actors.pgleases`); `hosts`: the hosts on the store and when each was last heard;
- `oploop_meta`: the schema's version. A store of a newer version is refused
  (`JournalError`, one line), never written.

psycopg 3, synchronous (chosen by measurement over asyncpg: bench/pgdrivers.py and
docs/sessions.md): one connection for the writer's short transactions, another per
thread that reads beside it (retention's overview). A lost connection (the server
restarted) is remade at the next call; the call that found it lost raises
`JournalError` (the supervisor's commit is retried every second).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import errors as pgerrors

from actors.pgleases import Fence
from actors.sessionlog import (
    Compaction,
    JournalError,
    Record,
    SessionOverview,
    SessionRow,
    StartKey,
)

log = logging.getLogger("oploop.pglog")

#: The schema this code writes; a store with a larger one is refused. (2: compactions
#: refer to their messages in `parts`, which version 1 cannot read.)
SCHEMA_VERSION = 2
#: How long a connection attempt may take (seconds).
CONNECT_TIMEOUT_S = 5
#: Over TCP, a link gone silent (cut, its far end dead: no RST) fails a call within
#: about this long instead of the kernel's minutes of retransmissions: what was sent
#: and not acknowledged (`tcp_user_timeout`), or an answer awaited on an idle link
#: (keepalives every second, 3 missed). libpq ignores both on a unix socket.
SILENT_LINK_MS = 3_000
_TCP = {"tcp_user_timeout": SILENT_LINK_MS, "keepalives": 1, "keepalives_idle": 1,
        "keepalives_interval": 1, "keepalives_count": 3}
#: A transaction left idle this long (its process frozen) is ended by the server.
IDLE_TX_TIMEOUT_MS = 2_000
#: Records from which a commit streams them with COPY rather than INSERTs (COPY has a
#: fixed cost per statement, and is several times faster per row beyond it).
COPY_FROM = 16
#: Rows a replay reads per query (it stops at its byte budget).
RANGE_CHUNK = 512

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS oploop_meta (key text PRIMARY KEY, value text NOT NULL)",
    """CREATE TABLE IF NOT EXISTS sessions (
        sid     text PRIMARY KEY,
        created double precision NOT NULL,
        meta    bytea NOT NULL,
        summary bytea,
        updated double precision NOT NULL,
        running boolean NOT NULL DEFAULT false,
        stop    bytea)""",
    "CREATE INDEX IF NOT EXISTS sessions_running ON sessions (sid) WHERE running",
    """CREATE TABLE IF NOT EXISTS records (
        sid   text NOT NULL,
        seq   bigint NOT NULL,
        epoch bigint NOT NULL DEFAULT 0,
        frame bytea NOT NULL,
        delta bytea,
        PRIMARY KEY (sid, seq))""",
    """CREATE TABLE IF NOT EXISTS compactions (
        sid   text PRIMARY KEY,
        seq   bigint NOT NULL,
        state bytea NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS parts (
        sid  text NOT NULL,
        hash bytea NOT NULL,
        data bytea NOT NULL,
        PRIMARY KEY (sid, hash))""",
    """CREATE TABLE IF NOT EXISTS starts (
        key      text PRIMARY KEY,
        sid      text NOT NULL,
        run      bigint NOT NULL,
        from_seq bigint NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS starts_sid ON starts (sid)",
    """CREATE TABLE IF NOT EXISTS leases (
        sid     text PRIMARY KEY,
        owner   text,
        epoch   bigint NOT NULL DEFAULT 0,
        expires timestamptz NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS leases_owner ON leases (owner)",
    """CREATE TABLE IF NOT EXISTS hosts (
        id      text PRIMARY KEY,
        name    text NOT NULL,
        control text NOT NULL DEFAULT '',
        seen    timestamptz NOT NULL,
        down    boolean NOT NULL DEFAULT false)""",
    # (Added after version 1, idempotently: whether the host takes new sessions placed
    # by others; an embedded host does not, its runs ending with its CLI.)
    "ALTER TABLE hosts ADD COLUMN IF NOT EXISTS placeable boolean NOT NULL DEFAULT false",
    # (Likewise: how hosts on other machines reach it, `actors.peerhosts.Reach`: its TCP
    # control and events addresses, its CURVE server key, the key it connects with.)
    "ALTER TABLE hosts ADD COLUMN IF NOT EXISTS control_tcp text NOT NULL DEFAULT '', "
    "ADD COLUMN IF NOT EXISTS events_tcp text NOT NULL DEFAULT '', "
    "ADD COLUMN IF NOT EXISTS server_key text NOT NULL DEFAULT '', "
    "ADD COLUMN IF NOT EXISTS client_key text NOT NULL DEFAULT ''",
)
#: Serialises schema creation between hosts starting at once (CREATE TABLE IF NOT
#: EXISTS races in PostgreSQL): a transaction-scoped advisory lock, for DDL only.
_SCHEMA_LOCK = 0x6F706C6F6F70  # "oploop"


def redact(url: str) -> str:
    """`url` without its password (for messages and logs)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urlunsplit(parts._replace(netloc=netloc))


class SchemaTooNew(JournalError):
    """The store was written by a newer oploop: this one refuses to touch it."""


class PgSessionLog:
    """The session log in PostgreSQL; every method is one short transaction."""

    def __init__(self, url: str, *, readonly: bool = False) -> None:
        self.url = url
        self.readonly = readonly
        self.commits = 0
        self.releases = 0  # (no reserve file: the server's disk is the server's)
        self.released = False
        #: The lease fence of the host writing (None: writes are not fenced, as for
        #: `oploop store copy`; `actors.pgleases`).
        self.fence: Fence | None = None
        self._local = threading.local()
        self._writer_thread = threading.get_ident()
        self._conns: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()
        conn = self.connection()
        # Readers create it too (idempotent, serialised): the broadcaster may open the
        # store before the supervisor has, at a new store's first start.
        self._create_schema(conn)
        self._check_version(conn)

    @property
    def where(self) -> str:
        """The store's URL, without its password."""
        return redact(self.url)

    # -- connections ------------------------------------------------------------------

    def connect(self) -> psycopg.Connection[Any]:
        """A new autocommit connection to the store (the caller closes it)."""
        try:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S,
                                   prepare_threshold=0, **_TCP)
            # A process frozen inside a commit (stopped, swapped out) must not keep its
            # lease rows locked: the server ends such a transaction, and other hosts'
            # claims (which skip locked rows) then take its sessions.
            conn.execute(f"SET idle_in_transaction_session_timeout = {IDLE_TX_TIMEOUT_MS}")
            return conn
        except psycopg.Error as exc:
            raise JournalError(f"cannot connect to the store {self.where}: "
                               f"{_first_line(exc)}") from exc

    def connection(self) -> psycopg.Connection[Any]:
        """This thread's connection to the store (remade when it was lost)."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if conn is not None:
            conn.close()
        conn = self.connect()
        self._local.conn = conn
        with self._lock:
            self._conns.append(conn)
        return conn

    def _create_schema(self, conn: psycopg.Connection[Any]) -> None:
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                conn.execute(_SCHEMA[0])
                got = conn.execute("SELECT value FROM oploop_meta WHERE key = 'schema'").fetchone()
                if got is not None and int(got[0]) > SCHEMA_VERSION:
                    return  # refused by _check_version, untouched
                for sql in _SCHEMA[1:]:
                    conn.execute(sql)
                conn.execute("INSERT INTO oploop_meta VALUES ('schema', %s) "
                             "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                             (str(SCHEMA_VERSION),))
        except psycopg.Error as exc:
            raise JournalError(f"cannot create the schema in {self.where}: "
                               f"{_first_line(exc)}") from exc

    def _check_version(self, conn: psycopg.Connection[Any]) -> None:
        try:
            got = conn.execute("SELECT value FROM oploop_meta WHERE key = 'schema'").fetchone()
        except psycopg.Error as exc:
            raise JournalError(f"cannot read {self.where}: {_first_line(exc)}") from exc
        version = int(got[0]) if got is not None else 0
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(f"the store {self.where} has schema version {version}, newer "
                               f"than this oploop's {SCHEMA_VERSION}: upgrade oploop to use it")

    # -- space (the server's own) -----------------------------------------------------

    def low_space(self) -> str:
        """Always "": the server's disk is its administrator's (a full one fails commits,
        which the supervisor reports and retries)."""
        return ""

    def keep_reserve(self) -> bool:
        """No reserve file to keep: True."""
        return True

    # -- writing ----------------------------------------------------------------------

    def commit(self, records: Sequence[Record], rows: Iterable[SessionRow] = (),
               compactions: Iterable[Compaction] = (), starts: Iterable[StartKey] = ()) -> None:
        """Append `records` and write `rows`, `compactions`, `starts`, in one transaction.

        With a fence (a host holding leases), the transaction first checks that every
        session it writes is still this host's at the epoch it claimed, by the
        database's clock (`actors.pgleases.Fence.check`): a host whose lease lapsed
        writes nothing (`LeaseLost`). A record's seq already taken fails the whole
        commit (`JournalError`)."""
        rows, compactions, starts = list(rows), list(compactions), list(starts)
        fence = self.fence
        try:
            conn = self.connection()
            with conn.transaction():
                epochs = fence.check(conn, _sids(records, rows, compactions, starts)) \
                    if fence is not None else {}
                with conn.cursor() as cur:
                    if rows:
                        cur.executemany(
                            "INSERT INTO sessions VALUES (%s, %s, %s, %s, %s, %s, %s) "
                            "ON CONFLICT (sid) DO UPDATE SET created = excluded.created, "
                            "meta = excluded.meta, summary = excluded.summary, "
                            "updated = excluded.updated, running = excluded.running, "
                            "stop = excluded.stop",
                            [(r.sid, r.created, r.meta, r.summary, r.updated, r.running, r.stop)
                             for r in rows])
                    if len(records) >= COPY_FROM:  # a group commit: one COPY stream
                        with cur.copy("COPY records (sid, seq, epoch, frame, delta) "
                                      "FROM STDIN") as copy:
                            for r in records:
                                copy.write_row((r.sid, r.seq, epochs.get(r.sid, 0), r.frame,
                                                r.delta))
                    elif records:
                        cur.executemany(
                            "INSERT INTO records VALUES (%s, %s, %s, %s, %s)",
                            [(r.sid, r.seq, epochs.get(r.sid, 0), r.frame, r.delta)
                             for r in records])
                    if compactions:
                        cur.executemany(
                            "INSERT INTO compactions VALUES (%s, %s, %s) ON CONFLICT (sid) "
                            "DO UPDATE SET seq = excluded.seq, state = excluded.state",
                            [(c.sid, c.seq, c.state) for c in compactions])
                        parts = [(c.sid, h, d) for c in compactions for h, d in c.parts]
                        if parts:
                            cur.executemany("INSERT INTO parts VALUES (%s, %s, %s) "
                                            "ON CONFLICT (sid, hash) DO NOTHING", parts)
                    if starts:
                        cur.executemany(
                            "INSERT INTO starts VALUES (%s, %s, %s, %s) ON CONFLICT (key) "
                            "DO UPDATE SET sid = excluded.sid, run = excluded.run, "
                            "from_seq = excluded.from_seq",
                            [(s.key, s.sid, s.run, s.from_seq) for s in starts])
                ended = [r.sid for r in rows if not r.running]
                if fence is not None and ended:
                    fence.release(conn, ended)  # (a run's end gives its lease up with it)
        except JournalError:
            raise  # (LeaseLost: nothing written)
        except pgerrors.UniqueViolation as exc:
            if not self._written(records):
                raise JournalError(f"cannot write to {self.where}: a record's seq is already "
                                   f"logged (another writer): {_first_line(exc)}") from exc
            # A try before this one was committed, but its answer was lost with the
            # connection (the server stopped at its COMMIT): that is this commit.
            ended = [r.sid for r in rows if not r.running]
        except psycopg.Error as exc:
            raise JournalError(f"cannot write to {self.where}: {_first_line(exc)}") from exc
        if fence is not None and ended:
            fence.released(ended)
        self.commits += 1

    def _written(self, records: Sequence[Record]) -> bool:
        """Whether every one of `records` is logged already, frame for frame."""
        if not records:
            return False
        try:
            got = self.connection().execute(
                "SELECT count(*) FROM records r JOIN unnest(%s::text[], %s::bigint[], "
                "%s::bytea[]) AS w(sid, seq, frame) ON r.sid = w.sid AND r.seq = w.seq "
                "AND r.frame = w.frame",
                ([r.sid for r in records], [r.seq for r in records],
                 [r.frame for r in records])).fetchone()
        except psycopg.Error:
            return False
        return got is not None and int(got[0]) == len(records)

    def remove(self, sids: Iterable[str]) -> int:
        """Delete every trace of `sids` (rows, records, compactions, start keys, leases);
        how many sessions were known."""
        sids = list(sids)
        try:
            conn = self.connection()
            with conn.transaction():
                known = conn.execute("SELECT count(*) FROM sessions WHERE sid = ANY(%s)",
                                     (sids,)).fetchone()
                for table in ("records", "compactions", "parts", "starts", "leases",
                              "sessions"):
                    conn.execute(f"DELETE FROM {table} WHERE sid = ANY(%s)",  # noqa: S608
                                 (sids,))
        except psycopg.Error as exc:
            raise JournalError(f"cannot remove sessions from {self.where}: "
                               f"{_first_line(exc)}") from exc
        return int(known[0]) if known else 0

    # -- reading ----------------------------------------------------------------------

    def row(self, sid: str) -> SessionRow | None:
        """The small row of `sid`, or None for a session not in the log."""
        got = self._one("SELECT sid, created, meta, summary, updated, running, stop "
                        "FROM sessions WHERE sid = %s", (sid,))
        if got is None:
            return None
        sid_, created, meta, summary, updated, running, stop = got
        return SessionRow(sid_, created, meta, summary, updated, bool(running), stop)

    def running(self) -> list[str]:
        """Sessions whose last run was open when last journaled (to resume)."""
        return [sid for (sid,) in self._all("SELECT sid FROM sessions WHERE running")]

    def summaries(self) -> list[tuple[str, bytes | None]]:
        """(sid, summary) of every session, oldest first."""
        return [(sid, summary) for sid, summary in
                self._all("SELECT sid, summary FROM sessions ORDER BY created, sid")]

    def compaction(self, sid: str) -> Compaction | None:
        """The latest compaction of `sid`, or None."""
        got = self._one("SELECT sid, seq, state FROM compactions WHERE sid = %s", (sid,))
        if got is None:
            return None
        parts = self._all("SELECT hash, data FROM parts WHERE sid = %s", (sid,))
        return Compaction(*got, parts=tuple((bytes(h), bytes(d)) for h, d in parts))

    def records(self, sid: str, after: int = 0) -> list[Record]:
        """The records of `sid` with seq > `after`, in seq order."""
        rows = self._all("SELECT sid, seq, frame, delta FROM records WHERE sid = %s AND seq > %s "
                         "ORDER BY seq", (sid, after))
        return [Record(*r) for r in rows]

    def start(self, key: str) -> StartKey | None:
        """The run a `StartRun` key began, or None."""
        got = self._one("SELECT key, sid, run, from_seq FROM starts WHERE key = %s", (key,))
        return None if got is None else StartKey(*got)

    def last_seq(self, sid: str) -> int | None:
        """The newest seq logged for `sid`, or None when it has none."""
        got = self._one("SELECT max(seq) FROM records WHERE sid = %s", (sid,))
        return None if got is None or got[0] is None else int(got[0])

    def heads(self) -> dict[str, int]:
        """The newest seq of every session with records."""
        return dict(self._all("SELECT sid, max(seq) FROM records GROUP BY sid"))

    def range(self, sid: str, from_seq: int, to_seq: int,
              max_bytes: int) -> tuple[list[tuple[int, bytes]], bool]:
        """(seq, frame) of `sid` in `from_seq..to_seq` up to `max_bytes`, and whether cut.
        The first frame is returned whatever its size, so a reader always advances.
        Read in chunks of `RANGE_CHUNK` rows: a small budget reads few rows."""
        out: list[tuple[int, bytes]] = []
        size = 0
        start = from_seq
        while start <= to_seq:
            chunk = self._all("SELECT seq, frame FROM records WHERE sid = %s AND seq BETWEEN "
                              "%s AND %s ORDER BY seq LIMIT %s",
                              (sid, start, to_seq, RANGE_CHUNK))
            for seq, frame in chunk:
                if out and size + len(frame) > max_bytes:
                    return out, True
                out.append((seq, bytes(frame)))
                size += len(frame)
            if len(chunk) < RANGE_CHUNK:
                break
            start = chunk[-1][0] + 1
        return out, False

    def sessions_overview(self) -> list[SessionOverview]:
        """Every session: created, last activity, bytes stored (records and compaction),
        and whether a run is open. For retention (in a thread: its own connection)."""
        rows = self._all(
            "SELECT s.sid, s.created, s.updated, s.running, "
            "coalesce((SELECT sum(octet_length(frame) + coalesce(octet_length(delta), 0)) "
            "          FROM records r WHERE r.sid = s.sid), 0) + "
            "coalesce((SELECT octet_length(state) FROM compactions c WHERE c.sid = s.sid), 0) + "
            "coalesce((SELECT sum(octet_length(data)) FROM parts p WHERE p.sid = s.sid), 0) "
            "FROM sessions s ORDER BY s.created")
        return [SessionOverview(sid, created, updated, int(size), bool(running))
                for sid, created, updated, running, size in rows]

    def close(self) -> None:
        """Close every connection this store opened."""
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    def _one(self, sql: str, params: tuple[object, ...] = ()) -> Any:
        try:
            return self.connection().execute(sql, params).fetchone()
        except psycopg.Error as exc:
            raise JournalError(f"cannot read {self.where}: {_first_line(exc)}") from exc

    def _all(self, sql: str, params: tuple[object, ...] = ()) -> list[Any]:
        try:
            return self.connection().execute(sql, params).fetchall()
        except psycopg.Error as exc:
            raise JournalError(f"cannot read {self.where}: {_first_line(exc)}") from exc


def _sids(records: Sequence[Record], rows: list[SessionRow], compactions: list[Compaction],
          starts: list[StartKey]) -> set[str]:
    """Every session a commit writes."""
    return ({r.sid for r in records} | {r.sid for r in rows} | {c.sid for c in compactions}
            | {s.sid for s in starts})


def _first_line(exc: BaseException) -> str:
    """An error's first line (psycopg's messages carry detail lines and hints)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
