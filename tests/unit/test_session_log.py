"""The session log: constant bytes per event, a session as the fold of its log, faults.

The loop runs against a scripted model (no processes); its events are encoded
and journaled exactly as the supervisor does (`Journal.record` at emit time,
one commit per event), so that every prefix of the log is a state a killed
supervisor could have left. The cases on the log's semantics run against both
stores (`stores`: the SQLite file, and PostgreSQL on a throwaway cluster); a torn
WAL against the SQLite file alone. The file's layout, a full disk and its reserve
are in `test_session_file.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_machine import World

from actors.config import Agent, Config
from actors.core.compaction import apply_between_runs, compact_between_runs
from actors.core.driver import RunDriver
from actors.core.history import add_reply, add_user_text, is_valid, tool_use_ids
from actors.core.loopio import ModelError
from actors.core.machine import (
    TERMINAL,
    CallModel,
    Cancel,
    Delta,
    ModelReplied,
    Resume,
    RunToolCalls,
    Start,
    ToolFinished,
    ToolStarted,
)
from actors.core.session import Session
from actors.core.state import Phase
from actors.core.turn import ToolCall, ToolOutcome
from actors.logstore import open_store
from actors.sessionlog import (
    Compaction,
    SessionLog,
    SessionRow,
)
from actors.supervisor.fold import load_session
from actors.supervisor.journal import Journal
from bench import pgcluster
from bus.codec import encode
from bus.messages import Envelope, Event

SHELL = {"name": "shell", "description": "run", "input_schema": {"type": "object"},
         "tags": ["exec"], "core": False, "risky": True}
AGENT = Agent(max_turns=6, parallel_tools=False)

#: Fields a session's fold must reproduce.
FOLDED = ("history", "runs", "turns", "next_seq", "run_over", "last_end", "run_limit",
          "run_turn", "run_from_seq", "start_key", "deadline", "stop_request", "context")


def tool_reply(n: int, turn: int) -> dict[str, Any]:
    return {"role": "assistant", "stop_reason": "tool_use", "content": [
        {"type": "text", "text": f"calling {n}"},
        *({"type": "tool_use", "id": f"t{turn}-{i}", "name": "shell", "input": {"command": "x"}}
          for i in range(n))]}


def text_reply(text: str, stop: str = "end_turn") -> dict[str, Any]:
    return {"role": "assistant", "stop_reason": stop, "content": [{"type": "text", "text": text}]}


class LoggedIO:
    """A `LoopIO` that journals every event as the supervisor does, one commit each."""

    def __init__(self, journal: Journal, replies: list[Any]) -> None:
        self.config = Config()
        self.journal = journal
        self.replies = list(replies)
        self.events: list[tuple[int, str, str]] = []
        self.cancel_at_tool = False
        #: ("model" | "tool", mode): a cancel arriving while the model streams or a
        #: tool runs, from outside the run's task (the control socket, the deadline).
        self.interrupt: tuple[str, str] | None = None

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        seq = session.next_seq
        session.next_seq += 1
        frame = encode(Envelope(Event(seq, type_, turn, time.time(), data), sid=session.id))
        self.journal.record(session, type_, seq, frame)
        self.journal.commit()
        self.events.append((seq, type_, data.get("tool_use_id", "")))

    async def call_model(self, session: Session, request: dict[str, Any], *, stream: bool,
                         turn: int, progress: Any, route: bool = False,
                         compact: bool = False) -> dict[str, Any]:
        if compact:  # `oploop compact`'s summary call
            return text_reply(f"summary of {len(request['messages'][0]['content'])} blocks")
        reply = self.replies.pop(0) if self.replies else text_reply("done")
        for word in ("some ", "streamed ", "text"):
            progress(Delta(word))
        await self._maybe_interrupt(session, "model")
        if isinstance(reply, Exception):
            raise reply
        if reply == "tools":
            return tool_reply(2, turn)
        if reply == "pause":
            return text_reply("hm", "pause_turn")
        return text_reply(str(reply))

    async def run_tool(self, session: Session, call: ToolCall, *, timeout_s: float) -> ToolOutcome:
        if self.cancel_at_tool:
            session.driver.cancel("operation")
            self.journal.touch(session)
        await self._maybe_interrupt(session, "tool")
        return ToolOutcome("out", False, 1.0)

    async def _maybe_interrupt(self, session: Session, where: str) -> None:
        if self.interrupt is None or self.interrupt[0] != where:
            return
        mode = self.interrupt[1]
        self.interrupt = None
        asyncio.get_running_loop().call_soon(session.driver.feed, Cancel(mode))
        await asyncio.Event().wait()  # (the work in flight, until the cancel aborts it)

    def tool_catalogue(self, machine: str = "") -> list[dict[str, Any]]:
        return [SHELL]

    def tool_machine(self, session, tool=""):
        return ""

    async def count_tokens(self, session: Session, request: dict[str, Any]) -> int | None:
        return None


def compact_now(session: Session, io: LoggedIO) -> None:
    """`oploop compact` between runs: every result cleared, older turns summarised."""
    async def go() -> None:
        outcome = await compact_between_runs(session, io, "local")
        if outcome.compacted is not None:
            assert apply_between_runs(session, outcome.compacted, io.emit)

    asyncio.run(go())


def one_run(session: Session, io: LoggedIO, prompt: str = "go", *, resume: bool = False) -> None:
    async def go() -> None:
        driver = RunDriver(session, io)
        if resume:
            driver.resume("test")
        else:
            session.run_from_seq = session.next_seq  # (as the supervisor's `runs._begin`)
            driver.start(prompt)
        await driver.run()

    async def owner() -> None:  # the supervisor's task group: a cancelled run ends here
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.create_task(go())
    asyncio.run(owner())


def assert_invariants(history: list[dict[str, Any]], events: list[tuple[int, str, str]]) -> None:
    """One terminal event per run, seqs without gap, every tool_use answered, every
    TOOL_START ended by its TOOL_END within its run (viewers see each tool end)."""
    assert [seq for seq, _, _ in events] == list(range(1, len(events) + 1))
    kinds = [t for _, t, _ in events if t != "COMPACTED"]  # (also between runs)
    assert sum(t in TERMINAL for t in kinds) == kinds.count("SESSION_START")
    assert kinds[-1] in TERMINAL
    started: set[str] = set()
    for _, kind, call in events:
        if kind == "TOOL_START":
            started.add(call)
        elif kind == "TOOL_END":
            started.discard(call)
        elif kind in TERMINAL:
            assert not started, f"tools started, never ended: {started}"
    assert is_valid(history)
    for i, msg in enumerate(history):
        if tool_use_ids(msg):
            assert i + 1 < len(history)


class Stores:
    """Makes empty session logs of one kind ("sqlite" or "pg") for a test."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, tmp: Path) -> None:
        self.kind = kind
        self.tmp = tmp
        self.cluster = request.getfixturevalue("pg_cluster") if kind == "pg" else None
        self.opened: list[Journal] = []
        #: PostgreSQL stores given back, emptied (a new schema's tables take 0.25 s to
        #: create: the property test needs one per prefix of each example).
        self.free: list[str] = []

    def journal(self, name: str = "sessions", compact_every_kb: int = 0) -> Journal:
        """A journal on a new, empty store. It compacts a session at each run's end
        where due (`compact_every_kb` 0: as soon as as many bytes of records came as
        its state took), so that these tests' short runs write compactions: the
        default (256 KB) would leave them all to their records."""
        path = self.tmp / f"{name}-{len(self.opened)}.db"
        if self.cluster is None:
            journal = Journal(path, reserve_mb=0, compact_every_kb=compact_every_kb)
        else:
            url = self.free.pop() if self.free else pgcluster.fresh_schema(self.cluster)
            journal = Journal(path, reserve_mb=0, compact_every_kb=compact_every_kb,
                              store=open_store(self.tmp, url))
        self.opened.append(journal)
        return journal

    def recycle(self, journal: Journal) -> None:
        """Close `journal`; its store, emptied, serves a later `journal()`."""
        journal.close()
        if self.cluster is not None:
            with journal.log.connect() as conn:
                conn.execute("TRUNCATE records, sessions, compactions, starts, leases")
            self.free.append(journal.log.url)

    def raw(self, journal: Journal, sql: str) -> None:
        """Run `sql` on the journal's store, behind its back (a fault injected)."""
        if self.cluster is None:
            journal.log.db.execute(sql)
        else:
            with journal.log.connect() as conn:
                conn.execute(sql)

    def count(self, journal: Journal, table: str) -> int:
        """Rows of `table` in the journal's store."""
        sql = f"SELECT count(*) FROM {table}"  # noqa: S608 - a test's own table names
        if self.cluster is None:
            return int(journal.log.db.execute(sql).fetchone()[0])
        with journal.log.connect() as conn:
            return int(conn.execute(sql).fetchone()[0])

    def blob(self, data: bytes) -> str:
        """`data` as an SQL literal of the store's dialect."""
        return f"X'{data.hex()}'" if self.cluster is None else f"'\\x{data.hex()}'::bytea"

    def close(self) -> None:
        for journal in self.opened:
            journal.close()


@pytest.fixture(params=["sqlite", "pg"])
def stores(request, tmp_path_factory):
    """Empty stores of each kind in turn (the pg one skips, saying why, without a server)."""
    made = Stores(request.param, request, tmp_path_factory.mktemp("store"))
    yield made
    made.close()


@pytest.fixture
def journal(stores):
    return stores.journal()


# -- constant work per event ------------------------------------------------------------


def _wchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("wchar"):
                return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def bytes_per_token_event(tmp: Path, turn: int, n: int = 50) -> float:
    """Bytes written (write(2) calls) per journaled TOKEN event, after `turn - 1` turns
    of a 20 KB tool result each."""
    journal = Journal(tmp / f"t{turn}.db", reserve_mb=0)
    session = Session("s1", AGENT, "/tmp")
    io = LoggedIO(journal, [])
    RunDriver(session, io).start("read the files")
    for t in range(1, turn):
        add_reply(session.history, tool_reply(1, t))
        session.history.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": f"t{t}-0", "content": "x" * 20_000}]})
        io.emit(session, "TURN_END", t, {"stop": "tool_use"})
    before = _wchar()
    for _ in range(n):
        io.emit(session, "TOKEN", turn, {"text": "hello world "})
    spent = (_wchar() - before) / n
    journal.close()
    return spent


def test_bytes_written_per_token_event_do_not_grow_with_the_history(tmp_path):
    at_1 = bytes_per_token_event(tmp_path, 1)
    at_200 = bytes_per_token_event(tmp_path, 200)
    # Before the session log: 12.6 KB at turn 1, 10.1 MB at turn 200 (a snapshot each).
    assert at_200 < 1.5 * at_1 + 1024, (at_1, at_200)


def test_a_long_history_is_read_from_the_compaction_not_from_every_delta(journal):
    session = Session("s1", AGENT, "/tmp")
    io = LoggedIO(journal, ["tools", "tools", "fine"])
    one_run(session, io)
    comp = journal.log.compaction("s1")
    assert comp is not None and comp.seq == session.next_seq - 1
    loaded = load_session(journal.log, "s1", {})
    assert loaded is not None
    assert {f: getattr(loaded, f) for f in FOLDED} == {f: getattr(session, f) for f in FOLDED}


# -- the fold equals the live session, and any prefix resumes ---------------------------

#: A cancel (ui or deadline) while the model streams or a tool runs, or none.
INTERRUPT = st.one_of(st.none(), st.tuples(st.sampled_from(["model", "tool"]),
                                           st.sampled_from(["ui", "deadline"])))
REPLY = st.one_of(st.just("tools"), st.just("pause"), st.text("abc ", min_size=1, max_size=5),
                  st.just(ModelError("overloaded_error", "Overloaded", 529)))


@pytest.mark.timeout(600)  # (PostgreSQL on a loaded machine: a store per prefix)
@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=st.lists(st.tuples(st.lists(REPLY, max_size=7), st.booleans(), INTERRUPT,
                               st.booleans()),
                     min_size=1, max_size=3))
def test_any_prefix_of_the_log_folds_into_a_session_that_resumes(stores, runs):
    journal = stores.journal()
    session = Session("s1", AGENT, "/tmp")
    io = LoggedIO(journal, [])
    for replies, cancel, interrupt, compact in runs:
        io.replies, io.cancel_at_tool, io.interrupt = list(replies), cancel, interrupt
        one_run(session, io)
        if compact:  # `oploop compact` after the run: COMPACTED between runs
            compact_now(session, io)
    assert_invariants(session.history, io.events)
    loaded = load_session(journal.log, "s1", {})
    assert loaded is not None
    assert {f: getattr(loaded, f) for f in FOLDED} == {f: getattr(session, f) for f in FOLDED}
    records, row = journal.log.records("s1"), journal.log.row("s1")
    stores.recycle(journal)
    assert row is not None and len(records) == len(io.events)

    for k in range(1, len(records) + 1):
        # The log a supervisor killed after `k` records leaves (no compaction yet) ...
        copy = stores.journal(f"prefix{k}")
        copy.log.commit(records[:k], [row])
        prefix = load_session(copy.log, "s1", {})
        assert prefix is not None and prefix.next_seq == k + 1
        # The bare machine, from the same fold, does what the driver does.
        machine_events, machine_history = machine_resume(prefix)
        # ... resumes the open run, or takes a follow-up, keeping every invariant.
        again = LoggedIO(copy, [])
        again.events = io.events[:k]
        one_run(prefix, again, resume=not prefix.run_over)
        assert_invariants(prefix.history, again.events)
        loop_events = [(t, c) for _, t, c in again.events[k:] if t != "TOKEN"]
        assert machine_events == loop_events
        assert machine_history == prefix.history
        stores.recycle(copy)


def machine_resume(folded: Session) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """Drive `machine.step` from the fold of a log prefix as `one_run` drives the async
    loop (resume an open run, else a follow-up "go"; the model says "done"), checking
    the machine's invariants after every step; its events and the history it ends with."""
    world = World(state=folded.run, history=list(folded.history))
    if folded.run_over:
        actions = world.begin(Start("go", AGENT.max_turns, offered=frozenset({"shell"})))
    else:
        world.terminals_this_run = 0
        world.open_tools = set(folded.started_calls) - set(folded.outcomes)
        actions = world.begin(Resume("test", offered=frozenset({"shell"})))
    while world.state.running:
        call = next(a for a in actions if isinstance(a, CallModel | RunToolCalls))
        if isinstance(call, CallModel):
            # (what `LoggedIO.call_model` answers when its script is spent)
            actions = world.feed(ModelReplied(text_reply(str(text_reply("done")))))
            continue
        for job in call.jobs:
            world.feed(ToolStarted(job.call.id))
            actions = world.feed(ToolFinished(job.call.id, ToolOutcome("out", False, 1.0)))
    return [(t, d.get("tool_use_id", "")) for t, _, d in world.events], world.history


# -- faults -----------------------------------------------------------------------------


def test_a_torn_last_record_loads_up_to_the_last_whole_one(tmp_path):
    path = tmp_path / "sessions.db"
    journal = Journal(path, reserve_mb=0)
    session = Session("s1", AGENT, "/tmp")
    io = LoggedIO(journal, ["tools", "fine"])
    one_run(session, io)
    # The host killed mid-write: copy the files as they are, the WAL's last frame torn.
    torn = tmp_path / "torn"
    torn.mkdir()
    for suffix in ("", "-wal"):
        shutil.copy(f"{path}{suffix}", f"{torn / 'sessions.db'}{suffix}")
    journal.close()
    wal = torn / "sessions.db-wal"
    wal.write_bytes(wal.read_bytes()[:-100])
    log = SessionLog(torn / "sessions.db", reserve_mb=0)
    loaded = load_session(log, "s1", {})
    assert loaded is not None
    assert loaded.next_seq == len(io.events)  # the last record (the terminal one) is gone
    assert not loaded.run_over  # so the run is open: a supervisor resumes it
    again = LoggedIO(Journal(torn / "sessions.db", reserve_mb=0), [])
    again.events = io.events[:-1]
    one_run(loaded, again, resume=True)
    assert_invariants(loaded.history, again.events)
    log.close()


def test_an_undecodable_record_is_skipped_naming_its_session(stores, journal, caplog):
    for sid in ("bad", "good"):
        one_run(Session(sid, AGENT, "/tmp"), LoggedIO(journal, ["hello"]))
    stores.raw(journal, "DELETE FROM compactions")
    bad = "x'c1'" if stores.kind == "sqlite" else "'\\xc1'::bytea"
    stores.raw(journal, f"UPDATE records SET frame = {bad} WHERE sid = 'bad' AND seq = 3")
    with caplog.at_level(logging.ERROR, "oploop.journal"):
        bad = load_session(journal.log, "bad", {})
        good = load_session(journal.log, "good", {})
    assert "session bad: record #3 skipped" in caplog.text
    assert bad is not None and good is not None
    assert bad.next_seq == good.next_seq  # the skipped seq is never reused
    assert good.run_over and good.last_end == "DONE"


def test_overview_and_remove(stores, journal):
    for sid in ("a", "b"):
        one_run(Session(sid, AGENT, "/tmp"), LoggedIO(journal, ["hi"]))
    over = {o.sid: o for o in journal.log.sessions_overview()}
    assert set(over) == {"a", "b"} and not over["a"].running and over["a"].bytes > 0
    assert over["a"].last_activity >= over["a"].created
    assert journal.log.remove(["a", "nobody"]) == 1
    assert [o.sid for o in journal.log.sessions_overview()] == ["b"]
    assert journal.log.records("a") == [] and journal.log.compaction("a") is None
    assert journal.log.compaction("b") is not None and journal.log.compaction("b").parts
    assert journal.log.remove(["b"]) == 1
    assert journal.log.sessions_overview() == []
    assert stores.count(journal, "parts") == 0
    assert load_session(journal.log, "a", {}) is None


def test_a_compaction_writes_only_the_messages_the_store_does_not_hold(journal):
    """A compaction's history is the digests of its messages; each message is stored
    once per session (`parts`): the second run's compaction writes that run's
    messages, not the first run's again, and the log folds into the session."""
    session = Session("s1", AGENT, "/tmp")
    io = LoggedIO(journal, ["tools", "fine"])
    one_run(session, io, "first")
    first = journal.log.compaction("s1")
    assert first is not None and len(first.parts) == len(session.history) == 4
    written: list[Compaction] = []
    commit = journal.log.commit

    def keep(records, rows=(), compactions=(), starts=()):  # type: ignore[no-untyped-def]
        compactions = list(compactions)
        written.extend(compactions)
        commit(records, rows, compactions, starts)

    journal.log.commit = keep  # type: ignore[method-assign]
    io.replies = ["tools", "better"]
    one_run(session, io, "second")
    (end,) = written
    # This run's messages, but those equal to one of the first run's (its tool call
    # and results, the same here): stored once.
    new = [m for m in session.history[4:] if m not in session.history[:4]]
    assert [json_of(d) for _, d in end.parts] == new and len(new) == 2
    stored = journal.log.compaction("s1")
    assert stored is not None and len(stored.parts) == 6 and len(session.history) == 8
    loaded = load_session(journal.log, "s1", {})
    assert loaded is not None
    assert {f: getattr(loaded, f) for f in FOLDED} == {f: getattr(session, f) for f in FOLDED}


def json_of(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False)


def test_a_compaction_of_the_old_form_still_loads(stores, journal):
    """Compactions written before December hold the history itself."""
    session = Session("s1", AGENT, "/tmp")
    one_run(session, LoggedIO(journal, ["tools", "fine"]))
    comp = journal.log.compaction("s1")
    assert comp is not None
    state = msgpack.unpackb(comp.state, raw=False)
    del state["history_parts"]
    state["history"] = session.history
    old = Compaction("s1", comp.seq, msgpack.packb(state, use_bin_type=True))
    replace_compaction(stores, journal, old)
    loaded = load_session(journal.log, "s1", {})
    assert loaded is not None
    assert {f: getattr(loaded, f) for f in FOLDED} == {f: getattr(session, f) for f in FOLDED}


def replace_compaction(stores: Stores, journal: Journal, comp: Compaction) -> None:
    """Put `comp`'s state in place of the session's compaction, its parts gone."""
    stores.raw(journal, f"DELETE FROM parts WHERE sid = '{comp.sid}'")
    stores.raw(journal, f"UPDATE compactions SET state = {stores.blob(comp.state)} "
                        f"WHERE sid = '{comp.sid}'")


def test_a_compaction_missing_a_part_folds_every_record_instead(stores, journal, caplog):
    session = Session("s1", AGENT, "/tmp")
    one_run(session, LoggedIO(journal, ["tools", "fine"]))
    comp = journal.log.compaction("s1")
    assert comp is not None
    replace_compaction(stores, journal, comp)  # (the same state, its parts gone)
    loaded = load_session(journal.log, "s1", {})
    assert loaded is not None
    assert {f: getattr(loaded, f) for f in FOLDED} == {f: getattr(session, f) for f in FOLDED}
    assert "compaction at #" in caplog.text and "folding every record instead" in caplog.text


def test_a_user_text_merge_is_logged_as_added_blocks(journal):
    session = Session("s1", AGENT, "/tmp")
    io = LoggedIO(journal, [])
    add_user_text(session.history, "one")
    io.emit(session, "SESSION_START", 0, {"run": 1, "max_turns": 3})
    add_user_text(session.history, "two")  # joins the last user message
    io.emit(session, "TURN_START", 1, {})
    loaded = load_session(journal.log, "s1", {}) if journal.log.row("s1") else None
    assert loaded is not None and loaded.history == session.history
    assert loaded.history == [{"role": "user", "content": [
        {"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]


def test_records_are_sqlite_rows_per_event(tmp_path):
    journal = Journal(tmp_path / "sessions.db", reserve_mb=0)
    one_run(Session("s1", AGENT, "/tmp"), LoggedIO(journal, ["hi"]))
    n = journal.log.db.execute("SELECT count(*) FROM records WHERE sid = 's1'").fetchone()[0]
    assert n == journal.log.last_seq("s1")
    assert isinstance(journal.log.db, sqlite3.Connection)
    journal.close()


def test_messages_waiting_fold_from_the_row_once_and_old_rows_still_load(journal):
    """Messages said and not yet taken are the row's `stop` column: a fold restores
    them for the open run, a `USER_MESSAGE` that takes them rewrites it (never twice),
    and a row written before they existed (`[run, mode]`) still loads."""
    session = Session("s1", AGENT, "/tmp")
    io = LoggedIO(journal, [])
    add_user_text(session.history, "go")
    session.run = session.run._replace(phase=Phase.MODEL, runs=1)
    io.emit(session, "SESSION_START", 0, {"run": 1, "max_turns": 3})
    session.run = session.run._replace(said=(("first", "local"), ("second", "control")))
    journal.touch(session)
    journal.commit()
    loaded = load_session(journal.log, "s1", {})
    assert loaded is not None and loaded.said == session.said
    assert loaded.run.said == (("first", "local"), ("second", "control"))
    session.run = session.run._replace(said=())
    add_user_text(session.history, "first")
    add_user_text(session.history, "second")
    io.emit(session, "USER_MESSAGE", 1, {"text": "first", "by": "local"})
    loaded = load_session(journal.log, "s1", {})
    assert loaded is not None and loaded.said == [] and loaded.history == session.history
    row = journal.log.row("s1")
    assert row is not None
    old = SessionRow(row.sid, row.created, row.meta, row.summary, row.updated, row.running,
                     msgpack.packb([1, "operation"]))
    journal.log.commit([], [old], [], [])
    loaded = load_session(journal.log, "s1", {})
    assert loaded is not None and loaded.stop_request == "operation" and loaded.said == []
