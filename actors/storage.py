"""SQLite files private to the host: created 0600, WAL, `synchronous=NORMAL`.

Shared by the broadcaster's event store and the supervisor's journal. WAL lets
readers run beside the one writer; `synchronous=NORMAL` makes a commit survive
the process being killed without an fsync per commit.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path


def open_private_db(path: Path, schema: str) -> sqlite3.Connection:
    """Open (creating 0600, whatever the umask) the database at `path` and apply `schema`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created before SQLite opens it: its -wal and -shm files follow the mode.
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    os.chmod(path, 0o600)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(schema)
    return db
