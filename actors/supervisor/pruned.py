"""Tombstones: the ids of deleted sessions, so each is answered "no such session (pruned)".

A table in the supervisor's journal file (`pruned`), bounded to `MAX_TOMBSTONES`
rows, oldest out: an id asked about after that many later deletions is answered
as never known. Nothing is held in memory; the table is read only when a
request names a session the supervisor does not hold (a rare path).
"""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path

from actors.storage import open_private_db

#: Deleted session ids remembered (about 50 bytes each on disk: 5 MB at most).
MAX_TOMBSTONES = 100_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pruned (sid TEXT PRIMARY KEY, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS pruned_by_age ON pruned (at);
"""


class Tombstones:
    """Ids of deleted sessions, on disk, at most `limit` of them."""

    def __init__(self, path: Path, limit: int = MAX_TOMBSTONES) -> None:
        self.path = path
        self.limit = limit
        self._db = open_private_db(path, _SCHEMA)

    def add(self, sids: Collection[str], now: float | None = None) -> None:
        """Remember `sids` as deleted (and forget the oldest beyond the bound)."""
        if not sids:
            return
        at = time.time() if now is None else now
        db = self._db
        db.execute("BEGIN")
        try:
            db.executemany("INSERT OR REPLACE INTO pruned VALUES (?, ?)", [(s, at) for s in sids])
            db.execute("DELETE FROM pruned WHERE sid IN (SELECT sid FROM pruned "
                       "ORDER BY at DESC LIMIT -1 OFFSET ?)", (self.limit,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise

    def __contains__(self, sid: object) -> bool:
        row = self._db.execute("SELECT 1 FROM pruned WHERE sid = ?", (sid,)).fetchone()
        return row is not None

    def __len__(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM pruned").fetchone()[0])

    def close(self) -> None:
        """Close the database."""
        self._db.close()
