"""Compaction as the driver meets it (`supervisor/journal.py`): a long run compacted
every `compact_every_kb` and folding from there, a chat of short runs that does not
rewrite its history at every end, none mid-run when turned off. The journal commits
once per loop iteration, as the supervisor does (`test_driver.py` commits per event).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from test_driver import FOLDED, FakeIO, check_events, reply

from actors.config import Agent
from actors.core.driver import RunDriver
from actors.core.history import Message
from actors.core.loopio import Progress
from actors.core.machine import Delta
from actors.core.session import Session
from actors.core.turn import ToolCall, ToolOutcome
from actors.supervisor.fold import load_session
from actors.supervisor.journal import Journal
from bus.codec import encode
from bus.messages import Envelope, Event


class IterationIO(FakeIO):
    """Journals as the supervisor does: records at emit time, one commit per loop
    iteration (`call_soon`); the model asks for one tool per turn, whose output is
    2 KB, until `turns`. After each commit that wrote a compaction of a running
    session, the session folded from the log is compared with the live one."""

    def __init__(self, journal: Journal, turns: int) -> None:
        super().__init__(journal, [])
        self.turns = turns
        self.scheduled = False
        self.session: Session | None = None
        self.compactions: list[int] = []

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        seq = session.next_seq
        session.next_seq += 1
        frame = encode(Envelope(Event(seq, type_, turn, time.time(), data), sid=session.id))
        self.journal.record(session, type_, seq, frame)
        self.events.append((seq, type_, data))
        self.session = session
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.commit)

    def commit(self) -> None:
        self.scheduled = False
        batch = self.journal.commit()
        session = self.session
        if session is not None and "s1" in batch.compactions and not session.run_over:
            self.compactions.append(batch.compactions["s1"].seq)
            loaded = load_session(self.journal.log, "s1", {})
            assert loaded is not None
            assert {f: getattr(loaded, f) for f in FOLDED} == \
                {f: getattr(session, f) for f in FOLDED}

    async def call_model(self, session: Session, request: dict[str, Any], *, stream: bool,
                         turn: int, progress: Progress) -> Message:
        progress(Delta("reading"))
        await asyncio.sleep(0)
        return reply("tools1" if turn < self.turns else "done", turn)

    async def run_tool(self, session: Session, call: ToolCall, *, timeout_s: float) -> ToolOutcome:
        await asyncio.sleep(0)
        return ToolOutcome("x" * 2048, False, 1.0)


def test_a_long_run_is_compacted_every_n_kb_and_folds_from_there(tmp_path):
    journal = Journal(tmp_path / "sessions.db", reserve_mb=0, compact_every_kb=8)
    io = IterationIO(journal, turns=40)
    session = Session("s1", Agent(max_turns=50), "/tmp")

    async def go() -> None:
        driver = RunDriver(session, io)
        driver.start("read it all")
        await driver.run()
        await asyncio.sleep(0)  # (the last commit)

    try:
        asyncio.run(go())
        check_events(io.events)
        # ~2 KB of log per turn, a compaction every 8 KB (or its own size, once larger).
        assert len(io.compactions) >= 3, io.compactions
        assert io.compactions == sorted(io.compactions)
        # Ended: the log (its last compaction and the records after it) folds into
        # the session as it is.
        loaded = load_session(journal.log, "s1", {})
        assert loaded is not None
        assert {f: getattr(loaded, f) for f in FOLDED} == \
            {f: getattr(session, f) for f in FOLDED}
    finally:
        journal.close()


def _count_commits(journal: Journal) -> list[tuple[int, int]]:
    """Have `journal`'s log note, for each commit, the bytes of its records and of its
    compactions; the list it fills."""
    written: list[tuple[int, int]] = []
    commit = journal.log.commit

    def counting(records, rows, compactions, starts):  # type: ignore[no-untyped-def]
        records, compactions = list(records), list(compactions)
        written.append((sum(len(r.frame) + len(r.delta or b"") for r in records),
                        sum(len(c.state) + sum(len(d) for _, d in c.parts)
                            for c in compactions)))
        commit(records, rows, compactions, starts)

    journal.log.commit = counting  # type: ignore[method-assign]
    return written


def _chat(journal: Journal, io: IterationIO, session: Session, runs: int) -> None:
    """`runs` runs of `session` one after the other; after each, the log folds into it."""
    async def chat() -> None:
        for n in range(runs):
            driver = RunDriver(session, io)
            driver.start(f"message {n}")
            await driver.run()
            await asyncio.sleep(0)  # (the run's last commit)
            loaded = load_session(journal.log, "s1", {})
            assert loaded is not None
            assert {f: getattr(loaded, f) for f in FOLDED} == \
                {f: getattr(session, f) for f in FOLDED}, f"after run {n + 1}"

    asyncio.run(chat())


def test_a_chat_of_short_runs_does_not_rewrite_its_history_at_every_end(tmp_path):
    """Each run's end wrote the session's whole state: a chat of N short runs wrote
    its history N times over (quadratic). A compaction now refers to its messages by
    digest and writes only those the store does not hold yet (and a run's end
    compacts only once as many bytes of records came since the last one as its state
    took, and `compact_every_kb`): compactions stay within the records' bytes, and
    the log still folds into the session after every run."""
    journal = Journal(tmp_path / "sessions.db", reserve_mb=0, compact_every_kb=16)
    session = Session("s1", Agent(max_turns=50), "/tmp")
    written = _count_commits(journal)
    try:
        _chat(journal, IterationIO(journal, turns=2), session, 40)
        assert session.runs == 40
        records = sum(r for r, _ in written)
        compactions = sum(c for _, c in written)
        # Before: 8.6x the records' bytes (1.94 MB for 226 KB), growing with each run.
        assert compactions <= records / 2, (records, compactions)
    finally:
        journal.close()


def test_a_runs_end_compacts_only_once_compact_every_kb_of_records_came(tmp_path):
    """A run's end compacts by the long run's rule: once `compact_every_kb` of records
    (and as many as the last state took) came since the session's last compaction.
    Short runs (a busy host's sessions of a few turns) write none at their end, and
    a session loads from its last compaction and at most ~that many bytes of records.
    Before, every end with more records since than its state compacted: a 3-turn
    run's end cost a third more in commits than its records."""
    journal = Journal(tmp_path / "sessions.db", reserve_mb=0, compact_every_kb=24)
    session = Session("s1", Agent(max_turns=50), "/tmp")
    written = _count_commits(journal)
    try:
        _chat(journal, IterationIO(journal, turns=2), session, 30)
        since: list[int] = []  # bytes of records since the last compaction, at each one
        counted = 0
        for records, compactions in written:
            counted += records
            if compactions:
                since.append(counted)
                counted = 0
        # ~5 KB of records a run: a compaction every ~5 runs, never before 24 KB came.
        assert 3 <= len(since) <= 8, since
        assert all(n >= 24 * 1024 for n in since), since
        assert counted < 24 * 1024 + 8 * 1024, counted  # (what a load folds now)
    finally:
        journal.close()


def test_no_compaction_mid_run_when_turned_off(tmp_path):
    journal = Journal(tmp_path / "sessions.db", reserve_mb=0, compact_every_kb=0)
    io = IterationIO(journal, turns=10)
    session = Session("s1", Agent(max_turns=50), "/tmp")

    async def go() -> None:
        driver = RunDriver(session, io)
        driver.start("read it all")
        await driver.run()
        await asyncio.sleep(0)

    try:
        asyncio.run(go())
        assert io.compactions == []
    finally:
        journal.close()
