"""The SQLite session file itself: its page size and layout (what a commit writes), a
full disk and the space kept in reserve. (The log's semantics, against both stores,
are in `test_session_log.py`.)"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from actors import storage
from actors.sessionlog import JournalError, JournalFull, Record, SessionLog


def test_a_new_log_has_small_pages_and_an_old_one_keeps_its_own(tmp_path):
    """1 KiB pages (a commit writes whole pages: issue 28), the WAL checkpointed every
    4 MiB as before; a log made with SQLite's default 4 KiB pages is opened as it is."""
    new = SessionLog(tmp_path / "new.db", reserve_mb=0)
    assert new.db.execute("PRAGMA page_size").fetchone()[0] == storage.PAGE_SIZE == 1024
    assert new.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 4096
    new.close()
    old = tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(old)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE t (a)")
    log = SessionLog(old, reserve_mb=0)
    assert log.db.execute("PRAGMA page_size").fetchone()[0] == 4096
    assert log.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1024
    log.commit([Record("s1", 1, b"frame")])
    assert [r.seq for r in log.records("s1")] == [1]
    log.close()


def test_a_full_disk_writes_nothing_and_loses_nothing(tmp_path):
    log = SessionLog(tmp_path / "sessions.db", reserve_mb=0)
    log.commit([Record("s", 1, b"one")])
    pages = log.db.execute("PRAGMA page_count").fetchone()[0]
    log.db.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(JournalFull):
        log.commit([Record("s", seq, b"x" * 4000) for seq in range(2, 50)])
    assert log.range("s", 1, 99, 1 << 20) == ([(1, b"one")], False)
    log.db.execute(f"PRAGMA max_page_count = {pages * 1000}")  # space returns
    log.commit([Record("s", 2, b"two")])
    assert log.last_seq("s") == 2
    log.close()


def test_the_reserve_is_kept_given_up_when_full_and_refuses_new_work(tmp_path, monkeypatch):
    log = SessionLog(tmp_path / "sessions.db", reserve_mb=1)
    assert log.reserve_path.stat().st_size == 1 << 20
    assert log.low_space() == ""
    assert log.release_reserve() and not log.reserve_path.exists() and log.releases == 1
    monkeypatch.setattr(log, "free_bytes", lambda fresh=False: 1000)
    assert "reserve of 1 MB" in log.low_space() and "in use" in log.low_space()
    log.released = False
    assert "disk_full" in log.low_space() and "limits.journal_reserve_mb" in log.low_space()
    assert not log.keep_reserve()  # no room: not taken, and nothing raised
    monkeypatch.undo()
    assert log.keep_reserve() and log.reserve_path.exists()
    log.close()


def _wal_pages(path: Path) -> int:
    """Frames (pages) in the WAL of the database at `path`."""
    wal = Path(f"{path}-wal")
    return max(0, wal.stat().st_size - 32) // (storage.PAGE_SIZE + 24) if wal.exists() else 0


def test_a_group_commit_of_streamed_text_writes_a_few_pages_whatever_the_history(tmp_path):
    # Records keyed by rowid (the session's number, then the seq): the newest session's
    # next records go at the tree's right edge, with no index beside them to update.
    log = SessionLog(tmp_path / "sessions.db", reserve_mb=0)
    for other in ("a", "f", "z"):  # sessions before it, with large records (tool results)
        log.commit([Record(other, seq, b"f" * 200, b"d" * 20_000) for seq in range(1, 41)])
    log.commit([Record("m", seq, b"f" * 200, b"d" * 20_000) for seq in range(1, 201)])
    log.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    log.db.execute("PRAGMA wal_autocheckpoint=0")
    before, commits, seq = _wal_pages(log.path), 20, 200
    for _ in range(commits):  # 7 TOKENs of ~150 bytes each, as a 0.2 s group commit holds
        log.commit([Record("m", seq + i, b"t" * 120, b"x" * 30) for i in range(1, 8)])
        seq += 7
    per_commit = (_wal_pages(log.path) - before) / commits
    # ~4: the last leaf written again, the new one it filled, their parent, the file's
    # header page (the file grew); the WITHOUT ROWID table keyed (sid, seq) wrote ~8 here
    # (the leaf mid-tree and the neighbours rebalanced with it)
    assert per_commit <= 5, per_commit
    assert [r.seq for r in log.records("m", after=200)] == list(range(201, seq + 1))
    log.close()


def test_a_log_keyed_by_sid_and_seq_is_rewritten_keyed_by_rowid(tmp_path):
    path = tmp_path / "sessions.db"
    with contextlib.closing(sqlite3.connect(path)) as db:  # the layout before issue 28
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("CREATE TABLE records (sid TEXT NOT NULL, seq INTEGER NOT NULL, "
                   "frame BLOB NOT NULL, delta BLOB, PRIMARY KEY (sid, seq)) WITHOUT ROWID")
        db.executemany("INSERT INTO records VALUES (?, ?, ?, ?)",
                       [(sid, seq, f"{sid}{seq}".encode(), None if seq % 2 else b"d")
                        for sid in ("b", "a") for seq in range(1, 4)])
        db.commit()
    log = SessionLog(path, reserve_mb=0)
    reader = SessionLog(path, reserve_mb=0, readonly=True)  # (finds it done)
    for store in (log, reader):
        assert [(r.seq, r.frame, r.delta) for r in store.records("a")] == \
            [(1, b"a1", None), (2, b"a2", b"d"), (3, b"a3", None)]
        assert store.heads() == {"a": 3, "b": 3}
    log.commit([Record("c", 1, b"c1"), Record("b", 4, b"b4")])
    assert reader.range("b", 2, 10, 1 << 20) == ([(2, b"b2"), (3, b"b3"), (4, b"b4")], False)
    assert reader.last_seq("c") == 1 and reader.last_seq("nobody") is None
    log.close()
    reader.close()


def test_a_removed_sessions_number_is_never_given_again(tmp_path):
    log = SessionLog(tmp_path / "sessions.db", reserve_mb=0)
    reader = SessionLog(tmp_path / "sessions.db", reserve_mb=0, readonly=True)
    log.commit([Record("old", 1, b"old")])
    assert [r.frame for r in reader.records("old")] == [b"old"]  # (its number now cached)
    log.remove(["old"])
    log.close()
    log = SessionLog(tmp_path / "sessions.db", reserve_mb=0)  # a restarted supervisor
    log.commit([Record("new", 1, b"new")])
    assert reader.records("old") == [] and reader.range("old", 1, 9, 100) == ([], False)
    assert [r.frame for r in reader.records("new")] == [b"new"]
    log.close()
    reader.close()


def test_a_seq_out_of_the_keys_range_is_refused_and_nothing_is_written(tmp_path):
    log = SessionLog(tmp_path / "sessions.db", reserve_mb=0)
    with pytest.raises(JournalError, match="out of the session log's range"):
        log.commit([Record("s", 1, b"one"), Record("s", 1 << 32, b"two")])
    assert log.records("s") == [] and log.heads() == {}
    log.commit([Record("s", 1, b"one")])
    assert log.heads() == {"s": 1}
    log.close()
