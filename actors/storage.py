"""SQLite files private to the host: created 0600, WAL, `synchronous=NORMAL`.

Shared by the broadcaster's event store and the supervisor's journal. WAL lets
readers run beside the one writer; `synchronous=NORMAL` makes a commit survive
the process being killed without an fsync per commit.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a database is opened (the executor never does)
    import sqlite3

#: The supervisor's journal and the broadcaster's event store, in `$OPLOOP_HOME`.
JOURNAL_FILE = "journal.db"
EVENTS_FILE = "events.db"


def private_files(home: Path) -> list[Path]:
    """Every SQLite file of the host in `home`, with its WAL and shared-memory files."""
    return [home / f"{db}{suffix}" for db in (JOURNAL_FILE, EVENTS_FILE)
            for suffix in ("", "-wal", "-shm")]


def open_private_db(path: Path, schema: str) -> sqlite3.Connection:
    """Open (creating 0600, whatever the umask) the database at `path` and apply `schema`."""
    import sqlite3

    path.parent.mkdir(parents=True, exist_ok=True)
    # Created before SQLite opens it: its -wal and -shm files follow the mode.
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(schema)
    return db
