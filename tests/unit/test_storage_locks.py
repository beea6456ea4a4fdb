"""Opening the session log a second time in one process must not drop the first
connection's locks (POSIX locks are per process: closing any descriptor of the file
releases them all). With them dropped, another process closing its connection thinks
it is the last, checkpoints and deletes the WAL, and the first one's next commit goes
into a deleted file: lost. The supervisor opens `sessions.db` twice (the log and the
tombstones of pruned sessions)."""

from __future__ import annotations

import subprocess
import sys

from actors.storage import open_private_db

READ_AND_CLOSE = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1])
print(db.execute("SELECT count(*) FROM t").fetchone()[0])
db.close()
"""


def count_elsewhere(path) -> int:
    """Rows of t as another process reads them (opening and closing its connection)."""
    done = subprocess.run([sys.executable, "-c", READ_AND_CLOSE, str(path)], check=True,
                          timeout=30, capture_output=True, text=True)
    return int(done.stdout)


def test_a_second_open_in_one_process_loses_no_commit(tmp_path):
    path = tmp_path / "sessions.db"
    first = open_private_db(path, "CREATE TABLE IF NOT EXISTS t (x INTEGER);")
    first.execute("INSERT INTO t VALUES (1)")
    second = open_private_db(path, "CREATE TABLE IF NOT EXISTS u (y INTEGER);")
    # Another process (the broadcaster, a reader) opens and closes the database.
    assert count_elsewhere(path) == 1
    first.execute("INSERT INTO t VALUES (2)")
    try:
        assert count_elsewhere(path) == 2  # the commit is in the WAL everyone reads
    finally:
        second.close()
        first.close()
