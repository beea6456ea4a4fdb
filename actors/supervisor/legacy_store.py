"""`SessionStore` over today's two files: the journal and the broadcaster's event store.

A stand-in until the session log (issue 13 item 1) gives the store its own
`sessions_overview()` and `remove()`: swap it for that store where the
supervisor is built (`actors/supervisor/actor.py`, `_main`).

The overview reads both files through connections of its own, read-only, so it
can run in a thread beside the supervisor's commits. `remove` deletes from the
journal only: the event store has one writer, the broadcaster, which the
supervisor tells to forget the same sessions (`ForgetSessions`).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Collection
from pathlib import Path

from actors.storage import EVENTS_FILE
from actors.supervisor.journal import Journal
from actors.supervisor.retention import SessionOverview


class LegacySessionStore:
    """Retention's view of `journal.db` + `events.db` in one home."""

    def __init__(self, journal: Journal, events_path: Path) -> None:
        self.journal = journal
        self.events_path = events_path

    @classmethod
    def for_home(cls, journal: Journal, home: Path) -> LegacySessionStore:
        """The store of the host in `home`, around its open `journal`."""
        return cls(journal, home / EVENTS_FILE)

    def sessions_overview(self) -> list[SessionOverview]:
        """Every session either file holds. Today's files keep no creation time and no
        run state: `created` is the last activity, `running` False (the supervisor
        knows which run, and never lets retention near them)."""
        sizes: dict[str, int] = {}
        activity: dict[str, float] = {}
        with _read_only(self.journal.path) as db:
            for sid, size in db.execute("SELECT id, length(snapshot) FROM sessions"):
                sizes[sid] = sizes.get(sid, 0) + size
            for sid, size in db.execute("SELECT sid, sum(length(frame)) FROM events GROUP BY sid"):
                sizes[sid] = sizes.get(sid, 0) + size
        if self.events_path.exists():
            with _read_only(self.events_path) as db:
                for sid, updated in db.execute("SELECT sid, updated FROM sessions"):
                    activity[sid] = updated
                for sid, size in db.execute(
                        "SELECT sid, sum(length(frame)) FROM events GROUP BY sid"):
                    sizes[sid] = sizes.get(sid, 0) + size
        # A journaled session the broadcaster has not stored yet is as new as can be.
        newest = max(activity.values(), default=0.0)
        out = []
        for sid, size in sizes.items():
            last = activity.get(sid, newest)
            out.append(SessionOverview(sid, last, last, size, False))
        return out

    def remove(self, sids: Collection[str]) -> int:
        """Delete `sids` from the journal (snapshots and kept events); how many it held."""
        return self.journal.remove(sids)


def _read_only(path: Path) -> contextlib.closing[sqlite3.Connection]:
    """A read-only connection to a host's SQLite file, closed on exit."""
    return contextlib.closing(
        sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False))
