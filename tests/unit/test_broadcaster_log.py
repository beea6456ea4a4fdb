"""The broadcaster's event log: memory tail over the SQLite store, retention, resend ring."""

from __future__ import annotations

import os
import sqlite3
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.broadcaster.actor import _range_problem
from actors.broadcaster.log import EventLog
from actors.broadcaster.store import EventStore
from actors.supervisor.resend import ResendRing
from bus.messages import ErrorReply, ReplayBatch, ReplayRequest


def frame(seq: int, size: int = 8) -> bytes:
    return f"{seq:08d}".encode().ljust(size, b".")


@pytest.fixture
def store(tmp_path):
    s = EventStore(tmp_path / "events.db")
    yield s
    s.close()


def fill(log: EventLog, sid: str, n: int, start: int = 1) -> None:
    for seq in range(start, start + n):
        assert log.append(sid, seq, frame(seq)).stored


def test_store_files_are_private_and_in_wal_mode(tmp_path):
    old = os.umask(0o022)
    try:
        s = EventStore(tmp_path / "events.db")
        log = EventLog(s)
        fill(log, "a", 3)
        log.flush()
        names = ["events.db", "events.db-wal", "events.db-shm"]
        modes = {n: stat.S_IMODE((tmp_path / n).stat().st_mode) for n in names}
        mode = sqlite3.connect(tmp_path / "events.db").execute("PRAGMA journal_mode").fetchone()
        s.close()
    finally:
        os.umask(old)
    assert modes == dict.fromkeys(names, 0o600)
    assert mode == ("wal",)


def test_append_refuses_duplicates_and_gaps(store):
    log = EventLog(store)
    fill(log, "a", 2)
    assert log.append("a", 2, b"x").reason == "duplicate"
    assert log.append("a", 0, b"x").reason == "duplicate"
    assert log.append("a", 4, b"x").gap
    assert log.last_seq("a") == 2 and log.last_seq("b") is None


def test_memory_is_bounded_and_old_events_come_from_the_store(store):
    log = EventLog(store, tail_events=10, memory_sessions=2)
    for sid in ("a", "b", "c"):
        fill(log, sid, 100)
    log.flush()
    stats = log.statistics()
    assert stats["memory_sessions"] == 2 and stats["memory_events"] == 20
    assert stats["unsaved"] == 0
    for sid in ("a", "b", "c"):
        frames, more = log.range(sid, 1, 100, 1 << 20)
        assert frames == [frame(s) for s in range(1, 101)] and not more
    frames, more = log.range("c", 85, 95, 1 << 20)  # across the store/memory boundary
    assert frames == [frame(s) for s in range(85, 96)]


def test_range_is_cut_by_bytes_but_always_advances(store):
    log = EventLog(store, tail_events=5)
    for seq in range(1, 21):
        log.append("a", seq, frame(seq, 100))
    log.flush()
    frames, more = log.range("a", 1, 20, 250)
    assert frames == [frame(1, 100), frame(2, 100)] and more
    frames, more = log.range("a", 3, 20, 1)  # a limit below one frame still yields one
    assert frames == [frame(3, 100)] and more
    frames, more = log.range("a", 18, 999, 1 << 20)  # clipped to the log
    assert len(frames) == 3 and not more


def test_a_restarted_log_has_everything_flushed(tmp_path):
    s = EventStore(tmp_path / "events.db")
    log = EventLog(s)
    fill(log, "a", 50)
    log.flush()
    fill(log, "a", 5, start=51)  # never flushed: a kill -9 loses these
    s.close()
    s2 = EventStore(tmp_path / "events.db")
    try:
        again = EventLog(s2)
        assert again.last_seq("a") == 50
        frames, _ = again.range("a", 1, 50, 1 << 20)
        assert frames == [frame(i) for i in range(1, 51)]
        assert again.append("a", 51, frame(51)).stored
    finally:
        s2.close()


def test_skip_to_leaves_a_hole_that_range_shows(store):
    log = EventLog(store)
    fill(log, "a", 3)
    assert log.skip_to("a", 7) == 3
    assert log.append("a", 7, frame(7)).stored
    frames, _ = log.range("a", 1, 7, 1 << 20)
    assert frames == [frame(i) for i in (1, 2, 3, 7)]
    assert log.skip_to("a", 5) == 0  # never backwards


def test_remove_deletes_whole_sessions_and_forget_drops_them_from_memory(store):
    log = EventLog(store)
    for sid in ("old", "mid", "new"):
        fill(log, sid, 3)
        log.flush()
    store.remove(["old", "mid", "never-seen"])
    log.forget(["old", "mid"])
    assert [s.sid for s in store.sessions()] == ["new"]
    assert store.range("old", 1, 3, 1 << 20) == ([], False)
    assert log.last_seq("old") is None and log.last_seq("new") == 3


@pytest.mark.parametrize(("from_seq", "to_seq", "ok"), [
    (1, 0, True), (11, 0, True), (3, 5, True), (5, 999, True),
    (0, 0, False), (-1, 0, False), (12, 0, False), (2**63, 0, False),
    (1, -1, False), (5, 3, False),
])
def test_replay_range_validation(from_seq, to_seq, ok):
    assert (_range_problem(ReplayRequest(from_seq, to_seq), last=10) == "") is ok


def test_resend_ring_answers_what_it_still_holds():
    ring = ResendRing(per_session=5)
    for seq in range(1, 11):
        ring.add("a", seq, frame(seq))
    batch = ring.answer("a", ReplayRequest(7, 8))
    assert isinstance(batch, ReplayBatch) and batch.events == [frame(7), frame(8)]
    assert batch.last_seq == 10 and not batch.more
    partial = ring.answer("a", ReplayRequest(2, 0))  # 2..5 fell out of the ring
    assert isinstance(partial, ReplayBatch) and partial.events == [frame(s) for s in range(6, 11)]
    for req, sid in ((ReplayRequest(11, 0), "a"), (ReplayRequest(1, 3), "a"), (ReplayRequest(1, 0), "b")):
        gone = ring.answer(sid, req)
        assert isinstance(gone, ErrorReply) and gone.code == "gone"


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 120),
    tail=st.integers(1, 20),
    flushes=st.sets(st.integers(1, 120)),
    window=st.tuples(st.integers(1, 130), st.integers(0, 130)),
)
def test_range_equals_the_appended_frames(tmp_path_factory, n, tail, flushes, window):
    s = EventStore(tmp_path_factory.mktemp("log") / "events.db")
    try:
        log = EventLog(s, tail_events=tail)
        for seq in range(1, n + 1):
            log.append("a", seq, frame(seq))
            if seq in flushes:
                log.flush()
        lo, hi = window
        hi = hi or n
        got: list[bytes] = []
        nxt = lo
        while nxt <= min(hi, n):
            frames, more = log.range("a", nxt, hi, 40)
            got += frames
            nxt += len(frames)
            if not more:
                break
        assert got == [frame(i) for i in range(lo, min(hi, n) + 1)]
    finally:
        s.close()
