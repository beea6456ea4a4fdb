"""The supervisor's journal: sessions and their latest events, durable before published.

SQLite in WAL mode (`$OPLOOP_HOME/journal.db`, 0600). The supervisor groups the
events of one loop iteration and the snapshots of the sessions they touched
into one transaction, commits it, and only then pushes those events to the
broadcaster: whatever a viewer has seen, a restarted supervisor knows, so a
resumed session counts on from the journal's `next_seq` with no gap and no
reused seq. With `synchronous=NORMAL` a commit survives the process being
killed (the case this guards against) without an fsync per commit.

The tail of each session's events is kept (the broadcaster asks for ranges it
lost); older ones are pruned, the broadcaster's own store has them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import msgpack

from actors.config import Agent
from actors.storage import JOURNAL_FILE, open_private_db
from actors.supervisor.session import Session
from actors.supervisor.turn import ToolOutcome

log = logging.getLogger("oploop.journal")

JOURNAL_NAME = JOURNAL_FILE
#: Events kept per session for the broadcaster's resends (older ones are pruned).
KEEP_EVENTS = 20_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (id TEXT PRIMARY KEY, snapshot BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    sid TEXT NOT NULL, seq INTEGER NOT NULL, frame BLOB NOT NULL, PRIMARY KEY (sid, seq)
) WITHOUT ROWID;
"""

#: Session fields a snapshot carries (the rest is runtime state: tasks, hooks).
_FIELDS = ("id", "cwd", "history", "state", "runs", "turns", "next_seq", "created",
           "stop_request", "run_over", "deadline", "last_end", "run_limit", "run_turn",
           "run_from_seq", "start_key", "started_calls")


class Journal:
    """One SQLite file; every method is a short synchronous transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.db = open_private_db(path, _SCHEMA)
        self.commits = 0

    @classmethod
    def for_home(cls, home: Path) -> Journal:
        """The journal of the host in `home`."""
        return cls(home / JOURNAL_NAME)

    def commit(self, events: Iterable[tuple[str, int, bytes]], sessions: Iterable[Session]) -> None:
        """Store `events` and the snapshots of `sessions` in one transaction."""
        db = self.db
        db.execute("BEGIN")
        try:
            db.executemany("INSERT OR REPLACE INTO events VALUES (?, ?, ?)", events)
            db.executemany("INSERT OR REPLACE INTO sessions VALUES (?, ?)",
                           [(s.id, snapshot(s)) for s in sessions])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.commits += 1

    def prune(self, sid: str, last_seq: int, keep: int = KEEP_EVENTS) -> None:
        """Drop the events of `sid` older than its newest `keep`."""
        self.db.execute("DELETE FROM events WHERE sid = ? AND seq <= ?", (sid, last_seq - keep))

    def remove(self, sids: Collection[str]) -> int:
        """Delete the snapshots and kept events of `sids`, in one transaction; returns how
        many sessions it held."""
        db = self.db
        params = [(sid,) for sid in sids]
        db.execute("BEGIN")
        try:
            db.executemany("DELETE FROM events WHERE sid = ?", params)
            held = db.executemany("DELETE FROM sessions WHERE id = ?", params).rowcount
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return held

    def sessions(self, agents: dict[str, Agent]) -> list[Session]:
        """Every journaled session, rebuilt (an agent no longer configured keeps the
        settings it had)."""
        out = []
        for sid, blob in self.db.execute("SELECT id, snapshot FROM sessions"):
            try:
                out.append(restore(blob, agents))
            except (ValueError, TypeError, KeyError) as exc:
                log.error("journal: session %s cannot be restored (%s); skipped", sid, exc)
        return out

    def events(self, sid: str) -> list[tuple[int, bytes]]:
        """The kept events of `sid`, in seq order."""
        return list(self.db.execute(
            "SELECT seq, frame FROM events WHERE sid = ? ORDER BY seq", (sid,)))

    def close(self) -> None:
        """Close the database."""
        self.db.close()


def snapshot(session: Session) -> bytes:
    """A session as bytes: its fields, its agent in full, its finished tool outcomes."""
    data: dict[str, Any] = {name: getattr(session, name) for name in _FIELDS}
    data["agent"] = dataclasses.asdict(session.agent)
    data["outcomes"] = {k: [o.output, o.is_error, o.duration_ms]
                        for k, o in session.outcomes.items()}
    packed: bytes = msgpack.packb(data, use_bin_type=True)
    return packed


def restore(blob: bytes, agents: dict[str, Agent]) -> Session:
    """The session a `snapshot` describes."""
    data = msgpack.unpackb(blob, raw=False)
    raw_agent = data.pop("agent")
    raw_agent["category_allowlist"] = tuple(raw_agent.get("category_allowlist", ()))
    agent = agents.get(raw_agent.get("name", "")) or Agent(**raw_agent)
    outcomes = {k: ToolOutcome(v[0], v[1], v[2]) for k, v in data.pop("outcomes").items()}
    # A field added since the snapshot was written keeps its default.
    session = Session(agent=agent, **{k: data[k] for k in _FIELDS if k in data})
    session.outcomes = outcomes
    return session
