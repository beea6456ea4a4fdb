"""SQLite files private to the host: created 0600, WAL, `synchronous=NORMAL`.

The session log (`actors.sessionlog`): the supervisor writes it, the
broadcaster reads it from its own process. WAL lets readers run beside the one
writer; `synchronous=NORMAL` makes a commit survive
the process being killed without an fsync per commit.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a database is opened (the executor never does)
    import sqlite3

#: The session log in `$OPLOOP_HOME` (every session's events and history).
SESSIONS_FILE = "sessions.db"
#: How long a connection waits for another process's lock (the broadcaster reading
#: while the supervisor creates the schema) before failing.
BUSY_TIMEOUT_MS = 5_000


log = logging.getLogger("oploop.storage")

#: Free bytes below which a starting host gives up the session log's reserve: enough
#: for its runtime files, not for new work (refused until space returns).
START_MIN_FREE = 4 << 20


def reserve_file(home: Path) -> Path:
    """The file holding the session log's reserve of disk space (see `actors.sessionlog`)."""
    return home / (SESSIONS_FILE + ".reserve")


def free_space(path: Path | str) -> int:
    """Free bytes on `path`'s file system for a user without privilege: what
    `shutil.disk_usage(path).free` says, from the same `statvfs`. (Not through shutil:
    it loads zlib, bz2 and lzma at import, ~0.45 MiB resident in every actor that only
    asks this.)"""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def make_room_to_start(home: Path) -> bool:
    """Give up the session log's reserve in `home` when the disk is too full for a host
    to start (`oploop up` always starts); whether it was given up."""
    reserve = reserve_file(home)
    try:
        if free_space(home) >= START_MIN_FREE or not reserve.exists():
            return False
        reserve.unlink()
    except OSError:
        return False
    log.error("disk full in %s: the session log's reserve was given up so that the host "
              "starts; new runs are refused until space returns", home)
    return True


def private_files(home: Path) -> list[Path]:
    """Every SQLite file of the host in `home`, with its WAL and shared-memory files."""
    return [home / f"{db}{suffix}" for db in (SESSIONS_FILE,)
            for suffix in ("", "-wal", "-shm", ".reserve")]


#: SQLite's page cache per connection, in KiB (`PRAGMA cache_size` takes it negative).
#: SQLite's default is 2,000 KiB per connection, filled by one pass of retention over the
#: whole store and then kept for good; the reads that matter (a session's last records)
#: are few pages, and the OS page cache holds the file anyway.
PAGE_CACHE_KIB = 512

#: SQLite's page size for a database oploop creates (an existing one keeps its own). A
#: commit writes whole pages to the WAL, two or three of them for one record (the leaf
#: it goes in, its neighbours when they are rebalanced, the parent): at 4 KiB that was
#: ~5 KB per streamed TOKEN event; at 1 KiB, with TOKENs committed in groups
#: (`supervisor.actor.TOKEN_COMMIT_S`), under 1 KB. Large frames (tool results) take
#: overflow pages either way: a 4-byte link per page more.
PAGE_SIZE = 1024
#: Bytes of WAL after which a commit checkpoints it into the database: SQLite's default
#: (1,000 pages) at 4 KiB pages, kept in bytes whatever the page size.
WAL_CHECKPOINT_BYTES = 4 << 20


def bounded_cache(db: sqlite3.Connection) -> sqlite3.Connection:
    """Cap `db`'s page cache at `PAGE_CACHE_KIB` (every connection oploop opens)."""
    db.execute(f"PRAGMA cache_size=-{PAGE_CACHE_KIB}")
    return db


def open_private_db(path: Path, schema: str) -> sqlite3.Connection:
    """Open (creating 0600, whatever the umask) the database at `path` and apply `schema`."""
    import sqlite3

    path.parent.mkdir(parents=True, exist_ok=True)
    # Created before SQLite opens it: its -wal and -shm files follow the mode. Only
    # when missing: closing a descriptor of a database this process already has open
    # (the supervisor opens sessions.db twice: the log, the tombstones) would drop
    # every POSIX lock SQLite holds on it (they are per process), and another process
    # closing its connection would then delete the WAL under us (a lost commit).
    if not path.exists():
        with contextlib.suppress(FileExistsError):  # (made meanwhile by another process)
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    os.chmod(path, 0o600)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    bounded_cache(db)
    db.execute(f"PRAGMA page_size={PAGE_SIZE}")  # (before WAL: it fixes the page size)
    db.execute("PRAGMA journal_mode=WAL")
    page = db.execute("PRAGMA page_size").fetchone()[0]
    db.execute(f"PRAGMA wal_autocheckpoint={max(1, WAL_CHECKPOINT_BYTES // page)}")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(schema)
    return db
