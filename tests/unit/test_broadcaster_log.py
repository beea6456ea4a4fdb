"""The broadcaster's event log: a memory tail over the supervisor's session log.

The log it reads is each store in turn (`journal`: the SQLite file, PostgreSQL)."""

from __future__ import annotations

import os
import sqlite3
import stat
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.broadcaster.actor import _range_problem
from actors.broadcaster.log import EventLog, SessionGone
from actors.broadcaster.store import EventStore
from actors.logstore import open_store
from actors.sessionlog import Record, SessionLog
from bench import pgcluster
from bus.messages import ReplayRequest


def frame(seq: int, size: int = 8) -> bytes:
    return f"{seq:08d}".encode().ljust(size, b".")


@pytest.fixture(params=["sqlite", "pg"])
def journal(request, tmp_path):
    """The supervisor's side: the session log the broadcaster reads."""
    if request.param == "sqlite":
        j = SessionLog(tmp_path / "sessions.db", reserve_mb=0)
    else:
        j = open_store(tmp_path, pgcluster.fresh_schema(request.getfixturevalue("pg_cluster")))
    yield j
    j.close()


@pytest.fixture
def store(journal, tmp_path):
    s = EventStore(tmp_path / "sessions.db", getattr(journal, "url", ""))
    yield s
    s.close()


def fill(journal: SessionLog, log: EventLog, sid: str, n: int, start: int = 1,
         size: int = 8) -> None:
    """Journal events start..start+n-1 of `sid` (as the supervisor does), then append them
    to the broadcaster's log (as they arrive)."""
    for seq in range(start, start + n):
        journal.commit([Record(sid, seq, frame(seq, size))])
        assert log.append(sid, seq, frame(seq, size)).stored


def test_log_files_are_private_and_in_wal_mode(tmp_path):
    old = os.umask(0o022)
    try:
        j = SessionLog(tmp_path / "sessions.db", reserve_mb=0)
        s = EventStore(j.path)
        fill(j, EventLog(s), "a", 3)
        names = ["sessions.db", "sessions.db-wal", "sessions.db-shm"]
        modes = {n: stat.S_IMODE((tmp_path / n).stat().st_mode) for n in names}
        mode = sqlite3.connect(tmp_path / "sessions.db").execute("PRAGMA journal_mode").fetchone()
        s.close()
        j.close()
    finally:
        os.umask(old)
    assert modes == dict.fromkeys(names, 0o600)
    assert mode == ("wal",)


def test_append_refuses_duplicates_and_gaps(journal, store):
    log = EventLog(store)
    fill(journal, log, "a", 2)
    assert log.append("a", 2, b"x").reason == "duplicate"
    assert log.append("a", 0, b"x").reason == "duplicate"
    assert log.append("a", 4, b"x").gap
    assert log.last_seq("a") == 2 and log.last_seq("b") is None


def test_memory_is_bounded_and_old_events_come_from_the_log(journal, store):
    log = EventLog(store, tail_events=10, memory_sessions=2)
    for sid in ("a", "b", "c"):
        fill(journal, log, sid, 100)
    stats = log.statistics()
    assert stats["memory_sessions"] == 2 and stats["memory_events"] <= 2 * 2 * 10
    for sid in ("a", "b", "c"):
        frames, more = log.range(sid, 1, 100, 1 << 20)
        assert frames == [frame(s) for s in range(1, 101)] and not more
    frames, more = log.range("c", 85, 95, 1 << 20)  # across the log/memory boundary
    assert frames == [frame(s) for s in range(85, 96)]


def test_range_is_cut_by_bytes_but_always_advances(journal, store):
    log = EventLog(store, tail_events=5)
    fill(journal, log, "a", 20, size=100)
    frames, more = log.range("a", 1, 20, 250)
    assert frames == [frame(1, 100), frame(2, 100)] and more
    frames, more = log.range("a", 3, 20, 1)  # a limit below one frame still yields one
    assert frames == [frame(3, 100)] and more
    frames, more = log.range("a", 18, 999, 1 << 20)  # clipped to the log
    assert len(frames) == 3 and not more


def test_a_restarted_broadcaster_counts_the_journaled_events_as_its_own(journal, store,
                                                                         tmp_path):
    log = EventLog(store)
    fill(journal, log, "a", 50)
    journal.commit([Record("a", 51, frame(51))])  # journaled, never delivered (in flight)
    again = EventLog(EventStore(tmp_path / "sessions.db", getattr(journal, "url", "")))
    assert again.last_seq("a") == 51
    frames, _ = again.range("a", 1, 51, 1 << 20)
    assert frames == [frame(i) for i in range(1, 52)]
    assert again.append("a", 52, frame(52)).stored


def test_skip_to_leaves_a_hole_that_range_shows(journal, store):
    log = EventLog(store)
    fill(journal, log, "a", 3)
    assert log.skip_to("a", 7) == 3
    assert log.append("a", 7, frame(7)).stored
    frames, _ = log.range("a", 1, 7, 1 << 20)
    assert frames == [frame(i) for i in (1, 2, 3, 7)]
    assert log.skip_to("a", 5) == 0  # never backwards


def test_removed_sessions_are_gone_from_the_log_and_forget_drops_them_from_memory(
        journal, store):
    log = EventLog(store, tail_events=1)  # memory keeps the last event or two of each
    for sid in ("old", "mid", "new"):
        fill(journal, log, sid, 3)
    journal.remove(["old", "mid", "never-seen"])  # the supervisor deletes ...
    with pytest.raises(SessionGone):  # (a replay meanwhile: told it is gone, not a part)
        log.range("mid", 1, 3, 1 << 20)
    log.forget(["old", "mid"])  # ... and tells the broadcaster (ForgetSessions)
    assert store.range("old", 1, 3, 1 << 20) == ([], False)
    assert log.range("old", 1, 3, 1 << 20) == ([], False)
    assert log.last_seq("old") is None and log.last_seq("new") == 3
    assert log.statistics()["memory_sessions"] == 1


@pytest.mark.parametrize(("from_seq", "to_seq", "ok"), [
    (1, 0, True), (11, 0, True), (3, 5, True), (5, 999, True),
    (0, 0, False), (-1, 0, False), (12, 0, False), (2**63, 0, False),
    (1, -1, False), (5, 3, False),
])
def test_replay_range_validation(from_seq, to_seq, ok):
    assert (_range_problem(ReplayRequest(from_seq, to_seq), last=10) == "") is ok


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(1, 120),
    tail=st.integers(1, 20),
    window=st.tuples(st.integers(1, 130), st.integers(0, 130)),
)
def test_range_equals_the_appended_frames(journal, store, n, tail, window):
    sid = uuid.uuid4().hex  # (one store for every example: a session each)
    log = EventLog(store, tail_events=tail)
    fill(journal, log, sid, n)
    lo, hi = window
    hi = hi or n
    got: list[bytes] = []
    nxt = lo
    while nxt <= min(hi, n):
        frames, more = log.range(sid, nxt, hi, 40)
        got += frames
        nxt += len(frames)
        if not more:
            break
    assert got == [frame(i) for i in range(lo, min(hi, n) + 1)]


def test_memory_is_bounded_in_bytes_too(journal, store):
    log = EventLog(store, tail_events=1000, memory_sessions=10, memory_bytes=10_000)
    for sid in ("a", "b", "c"):
        fill(journal, log, sid, 30, size=1000)
    stats = log.statistics()
    assert stats["memory_bytes"] <= 10_000 and stats["memory_sessions"] >= 1
    for sid in ("a", "b", "c"):  # what memory let go is read from the log
        frames, _ = log.range(sid, 1, 30, 1 << 20)
        assert frames == [frame(s, 1000) for s in range(1, 31)]
