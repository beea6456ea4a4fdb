"""The driver (`supervisor/driver.py`) carrying out the machine's actions, under random
happenings: model replies, streamed text, retries, failures, tool outcomes (an executor
lost among them), cancels of every mode, stale and duplicate inputs, a bug, supervisor
restarts (resumed from the log's fold), follow-ups. After every happening the events
so far keep the invariants; at the end, the fold of *every* prefix of the log resumes
(or takes a follow-up) and keeps them too.

The fake IO implements the real `LoopIO` (the model and the tools are futures the
test resolves); events are journaled as the supervisor journals them (one commit
each), so the log is what a killed supervisor could leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.config import Agent, Config, RouterConfig
from actors.core.compaction import apply_between_runs, compact_between_runs
from actors.core.driver import RunDriver
from actors.core.history import Message, is_valid, tool_use_ids
from actors.core.loopio import ModelError, Progress
from actors.core.machine import (
    TERMINAL,
    Delta,
    ModelReplied,
    Retry,
    Routed,
    ToolFinished,
    ToolStarted,
    WorkerLost,
)
from actors.core.session import Session
from actors.core.turn import ToolCall, ToolOutcome
from actors.permissions import parse_rules
from actors.supervisor.fold import load_session
from actors.supervisor.journal import Journal
from bus.codec import decode, encode
from bus.messages import Envelope, Event

SHELL = {"name": "shell", "description": "run", "input_schema": {"type": "object"},
         "tags": ["exec"], "core": False, "risky": True}
#: What `WorkerIO.run_tool` answers when the dispatcher reports the executor died.
LOST = "shell failed: executor died (no heartbeat)"
#: Fields of a session its log's fold must reproduce.
FOLDED = ("history", "runs", "turns", "next_seq", "run_over", "last_end", "run_limit",
          "run_turn", "started_calls", "said", "approvals", "decided", "context")


def reply(kind: str, turn: int) -> Message:
    if kind.startswith("tools"):
        n = int(kind[-1])
        return {"role": "assistant", "stop_reason": "tool_use", "content": [
            {"type": "text", "text": f"calling {n}"},
            *({"type": "tool_use", "id": f"t{turn}-{i}", "name": "shell",
             "input": {"command": f"c{i}"}}
              for i in range(n))]}
    if kind == "hidden":
        return {"role": "assistant", "stop_reason": "tool_use", "content": [
            {"type": "tool_use", "id": f"h{turn}", "name": "secret", "input": {}}]}
    stop = {"pause": "pause_turn", "cut": "max_tokens"}.get(kind, "end_turn")
    return {"role": "assistant", "stop_reason": stop, "content": [{"type": "text", "text": kind}]}


class FakeIO:
    """`LoopIO` whose model calls and tool calls wait for the test to answer them."""

    def __init__(self, journal: Journal, events: list[tuple[int, str, dict[str, Any]]],
                 config: Config | None = None, auto: bool = False) -> None:
        self.config = config or Config()
        self.journal = journal
        self.events = events
        #: Answer every call at once ("done", tools "out"): a run that just finishes.
        self.auto = auto
        self.model: tuple[asyncio.Future[Message], Progress, int] | None = None
        self.tools: dict[str, asyncio.Future[ToolOutcome]] = {}
        self.ran: list[str] = []
        self.adopted: list[str] = []
        self.summaries = 0

    async def count_tokens(self, session: Session, request: dict[str, Any]) -> int | None:
        return None  # (the estimate stands)

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        seq = session.next_seq
        session.next_seq += 1
        frame = encode(Envelope(Event(seq, type_, turn, time.time(), data), sid=session.id))
        self.journal.record(session, type_, seq, frame)
        self.journal.commit()
        self.events.append((seq, type_, data))

    async def call_model(self, session: Session, request: dict[str, Any], *, stream: bool,
                         turn: int, progress: Progress, route: bool = False,
                         compact: bool = False) -> Message:
        if compact:  # a compaction's summary: answered at once
            self.summaries += 1
            return {"role": "assistant", "stop_reason": "end_turn",
                    "content": [{"type": "text", "text": f"summary {self.summaries}"}]}
        if not route:  # the request's view of the history is always one the API takes
            assert is_valid(request["messages"]), request["messages"]
        if self.auto:
            return reply("DIRECT" if turn == 0 else "done", turn)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.model = (future, progress, turn)
        try:
            return await future
        finally:
            self.model = None

    async def run_tool(self, session: Session, call: ToolCall, *, timeout_s: float) -> ToolOutcome:
        self.ran.append(call.id)
        if self.auto:
            return ToolOutcome("out", False, 1.0)
        future: asyncio.Future[ToolOutcome] = asyncio.get_running_loop().create_future()
        self.tools[call.id] = future
        try:
            return await future
        finally:
            self.tools.pop(call.id, None)

    async def adopt_tool(self, session: Session, call: ToolCall, *,
                         timeout_s: float) -> ToolOutcome:
        """A call in flight at a restart, still running on its executor: waited for as
        any (never run again: not in `ran`)."""
        self.adopted.append(call.id)
        future: asyncio.Future[ToolOutcome] = asyncio.get_running_loop().create_future()
        self.tools[call.id] = future
        try:
            return await future
        finally:
            self.tools.pop(call.id, None)

    def tool_catalogue(self, machine: str = "") -> list[dict[str, Any]]:
        return [SHELL]

    def tool_machine(self, session, tool=""):
        return ""


def check_events(events: list[tuple[int, str, dict[str, Any]]]) -> None:
    """Seqs without gap; runs that do not overlap, each with one terminal event and
    nothing after it; every `TOOL_END` after its `TOOL_START`, and every `TOOL_START`
    ended before its run's terminal event."""
    assert [e[0] for e in events] == list(range(1, len(events) + 1))
    open_run = False
    started: set[str] = set()
    for _, kind, data in events:
        if kind == "COMPACTED" and not open_run:  # (`oploop compact` between runs)
            continue
        if kind == "SESSION_START":
            assert not open_run, "a run began before the last one ended"
            open_run, started = True, set()
            continue
        assert open_run, f"{kind} outside a run"
        if kind == "TOOL_START":
            assert data["tool_use_id"] not in started
            started.add(data["tool_use_id"])
        elif kind == "TOOL_END":
            assert data["tool_use_id"] in started, f"TOOL_END of a tool never started: {data}"
            started.remove(data["tool_use_id"])
        elif kind in TERMINAL:
            assert not started, f"tools started, never ended: {started}"
            open_run = False


def check_history(history: list[Message]) -> None:
    """A history a follow-up can be sent on: valid, every `tool_use` answered."""
    assert is_valid(history), history
    for i, message in enumerate(history):
        if tool_use_ids(message):
            assert i + 1 < len(history), "a tool_use left unanswered"


HAPPENINGS = st.sampled_from([
    "reply", "reply", "reply", "reply", "delta", "thinking", "retry", "fail",
    "tool", "tool", "tool", "tool", "lost", "worker_lost", "bug",
    "cancel_ui", "cancel_operation", "cancel_deadline", "failed",
    "stale", "duplicate", "restart", "follow_up", "say", "say", "approve", "deny",
    "decide_unknown", "compact",
])
REPLIES = st.sampled_from(["tools1", "tools2", "tools3", "done", "pause", "cut", "hidden"])


class Harness:
    """One session, its log, its current driver and the task running it."""

    def __init__(self, path: Path, agent: Agent, config: Config) -> None:
        self.journal = Journal(path, reserve_mb=0)
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.config = config
        self.session = Session("s1", agent, "/tmp")
        self.io = FakeIO(self.journal, self.events, config)
        self.driver: RunDriver | None = None
        self.old: list[RunDriver] = []
        self.task: asyncio.Task[None] | None = None
        #: Messages said into an open run (each must arrive once, in order).
        self.said: list[str] = []

    async def settle(self) -> None:
        """Let the run go as far as it can without the test (the fakes do no I/O)."""
        for _ in range(20):
            await asyncio.sleep(0)

    def launch(self, driver: RunDriver) -> None:
        if self.driver is not None:
            self.old.append(self.driver)
        self.driver = driver
        self.task = asyncio.create_task(driver.run())

    async def start(self, prompt: str = "go") -> None:
        driver = RunDriver(self.session, self.io)
        driver.start(prompt)
        self.launch(driver)
        await self.settle()

    async def stop_task(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def restart(self, adopt: bool = False) -> None:
        """A supervisor killed and started again: the run goes on from the log's fold
        (`adopt`: its calls in flight still run on their executors)."""
        self.session.suspended = True  # (as `Runs.suspend`: left open for the next one)
        await self.stop_task()
        loaded = load_session(self.journal.log, "s1", {})
        assert loaded is not None
        assert {f: getattr(loaded, f) for f in FOLDED} == \
            {f: getattr(self.session, f) for f in FOLDED}
        self.session = loaded
        self.io = FakeIO(self.journal, self.events, self.config)
        if not loaded.run_over:
            driver = RunDriver(loaded, self.io)
            driver.resume("test", adopt=adopt)
            self.launch(driver)
        await self.settle()
        if adopt:  # only calls started before, never started again
            started = {d["tool_use_id"] for _, t, d in self.events if t == "TOOL_START"}
            assert set(self.io.adopted) <= started

    async def happen(self, what: str, draw: Any) -> None:
        io, driver = self.io, self.driver
        assert driver is not None
        running = not self.session.run_over
        if what == "reply" and io.model is not None:
            future, _, turn = io.model
            if turn == 0:
                future.set_result(reply(draw(st.sampled_from(["DIRECT", "AGENT"])), 0))
            else:
                future.set_result(reply(draw(REPLIES), turn))
        elif what in ("delta", "thinking") and io.model is not None:
            io.model[1](Delta(draw(st.sampled_from(["a ", "b", " "])),
                              "thinking" if what == "thinking" else "text"))
        elif what == "retry" and io.model is not None:
            io.model[1](Retry(2, "overloaded_error", 0.1))
        elif what == "fail" and io.model is not None:
            io.model[0].set_exception(ModelError("overloaded_error", "Overloaded", 529))
        elif what in ("tool", "lost", "bug") and io.tools:
            call_id = draw(st.sampled_from(sorted(io.tools)))
            future = io.tools[call_id]
            if what == "bug":
                future.set_exception(RuntimeError("a bug in a tool path"))
            else:
                future.set_result(ToolOutcome(LOST, True) if what == "lost"
                                  else ToolOutcome("out", False, 1.0))
        elif what == "worker_lost" and running:
            driver.feed(WorkerLost())
        elif what.startswith("cancel_") and running:
            driver.cancel(what.removeprefix("cancel_"))
        elif what == "failed" and running:
            driver.fail("disk_full", "the disk is full")
        elif what == "stale":
            # Whatever an older run's driver still reports touches nothing.
            for old in self.old[-2:]:
                old.feed(ModelReplied(reply("done", 1)))
                old.feed(ToolFinished("t1-0", ToolOutcome("late", False)))
        elif what == "duplicate" and running:
            state = driver.state
            for call_id, outcome in state.outcomes:
                driver.feed(ToolFinished(call_id, outcome))  # already finished
            for call_id in state.started:
                driver.feed(ToolStarted(call_id))  # already started
            driver.feed(ToolFinished("nobody", ToolOutcome("x", False)))
            driver.feed(Routed("DIRECT"))  # no router call in flight (if none is)
            if state.phase != "route" and state.phase != "model":
                driver.feed(ModelReplied(reply("done", state.turn)))
        elif what == "say" and running:
            text = f"said {len(self.said)}"
            self.said.append(text)
            driver.say(text, "local")
            self.journal.touch(self.session)  # as `Runs.say`: journaled, then acknowledged
            self.journal.commit()
        elif what in ("approve", "deny") and driver.state.asks:
            call_id = draw(st.sampled_from([a[0] for a in driver.state.asks]))
            assert driver.decide(call_id, what, "local", "test") is None
            again = driver.decide(call_id, "approve", "key")  # first decision wins
            assert again == f"call {call_id} was already decided by local ({what})"
        elif what == "decide_unknown" and running:
            before = len(self.events)
            assert driver.decide("nobody", "approve", "local") == \
                "no call nobody waits for approval in session s1"
            assert len(self.events) == before
        elif what == "compact" and running:
            driver.request_compaction("local")  # before the run's next model call
        elif what == "compact" and self.session.history:  # between runs: now
            outcome = await compact_between_runs(self.session, io, "local")
            if outcome.compacted is not None:
                assert apply_between_runs(self.session, outcome.compacted, io.emit)
        elif what == "restart":
            await self.restart(draw(st.booleans()))
            return
        elif what == "follow_up" and not running:
            await self.start("more")
            return
        await self.settle()

    async def finish(self) -> None:
        """End whatever is open (a ui cancel), and let the task unwind."""
        if self.driver is not None and not self.session.run_over:
            self.driver.cancel("ui")
        await self.settle()
        if self.task is not None:
            await asyncio.wait_for(self.task, 5)

    def check(self) -> None:
        check_events(self.events)
        if self.session.run_over:
            check_history(self.session.history)
            assert self.task is None or self.task.done()


def check_every_prefix(tmp: Path, journal: Journal, config: Config) -> None:
    """The log a supervisor killed after each of its records leaves: folded, its open
    run resumed (or a follow-up taken) to the end, keeping every invariant."""
    records, row = journal.log.records("s1"), journal.log.row("s1")
    assert row is not None
    frames = [(r.seq, r) for r in records]
    base = [(seq, t, d) for seq, t, d in _decoded(records)]
    for k in range(1, len(frames) + 1):
        copy = Journal(tmp / f"prefix{k}.db", reserve_mb=0)
        try:
            copy.log.commit(records[:k], [row])
            folded = load_session(copy.log, "s1", {})
            assert folded is not None and folded.next_seq == k + 1
            events = base[:k]
            io = FakeIO(copy, events, config, auto=True)
            driver = RunDriver(folded, io)
            follow_up = folded.run_over
            if follow_up:
                driver.start("again")
            else:
                driver.resume("test")
                for call_id, _ in driver.state.asks:  # still pending after RESUMED
                    assert driver.decide(call_id, "approve", "test") is None
            asyncio.run(driver.run())
            assert folded.run_over
            check_events(events)
            check_history(folded.history)
            # Never a tool run twice: a started one is ended "interrupted", not re-run.
            # (The open run's: this fake's call ids start again with each run, `t1-0`...;
            # a follow-up's calls are new calls.)
            run_from = max((i for i, (_, t, _) in enumerate(base[:k]) if t == "SESSION_START"),
                           default=0)
            started_before = {d["tool_use_id"] for _, t, d in base[run_from:k]
                              if t == "TOOL_START"}
            if follow_up:
                started_before = set()  # (a follow-up was started: all its calls are new)
            assert not started_before & set(io.ran)
        finally:
            copy.close()


def _decoded(records: list[Any]) -> list[tuple[int, str, dict[str, Any]]]:
    out = []
    for record in records:
        event = decode(record.frame).body
        out.append((event.seq, event.type, event.data))
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), parallel=st.booleans(), router=st.booleans(),
       limit=st.integers(1, 5), steps=st.integers(1, 40), ask=st.booleans(),
       window=st.sampled_from([0, 700]))
def test_random_happenings_keep_the_invariants_and_every_prefix_resumes(
        tmp_path_factory, data, parallel, router, limit, steps, ask, window):
    tmp = tmp_path_factory.mktemp("driver")
    rules = parse_rules({"shell(c0)": "allow", "shell": "ask"}) if ask else ()
    # (a 700-token window: the budget is reached within a few turns, and compacts)
    agent = Agent(max_turns=limit, parallel_tools=parallel, max_parallel_tools=2,
                  permissions=rules, context_window=window)
    config = Config(router=RouterConfig(enabled=True)) if router else Config()
    harness = Harness(tmp / "sessions.db", agent, config)

    async def scenario() -> None:
        await harness.start()
        harness.check()
        for _ in range(steps):
            await harness.happen(data.draw(HAPPENINGS), data.draw)
            harness.check()
        await harness.finish()
        harness.check()

    try:
        asyncio.run(scenario())
        kinds = [k for _, k, _ in harness.events]
        ran = [k for k in kinds if k != "COMPACTED"]  # (one may follow the last run)
        assert ran[-1] in TERMINAL
        # Every message said arrived once, in order, across restarts too.
        assert [d["text"] for _, k, d in harness.events if k == "USER_MESSAGE"] == harness.said
        assert sum(k in TERMINAL for k in kinds) == kinds.count("SESSION_START")
        loaded = load_session(harness.journal.log, "s1", {})
        assert loaded is not None
        assert {f: getattr(loaded, f) for f in FOLDED} == \
            {f: getattr(harness.session, f) for f in FOLDED}
        check_every_prefix(tmp, harness.journal, config)
    finally:
        harness.journal.close()


def test_a_ui_cancel_mid_tool_ends_the_tool_and_stops_it():
    """The driver's abort reaches the tool in flight (its await is cancelled), and the
    viewer sees the tool end as cancelled before `CANCELLED`."""

    async def scenario(tmp: Path) -> tuple[Harness, bool]:
        harness = Harness(tmp / "sessions.db", Agent(), Config())
        await harness.start()
        future, _, turn = harness.io.model  # type: ignore[misc]
        future.set_result(reply("tools1", turn))
        await harness.settle()
        tool = harness.io.tools["t1-0"]
        assert harness.driver is not None
        harness.driver.cancel("ui", "enough")
        await harness.settle()
        return harness, tool.cancelled()

    with tempfile.TemporaryDirectory() as tmp:
        harness, tool_cancelled = asyncio.run(scenario(Path(tmp)))
        harness.journal.close()
    assert tool_cancelled and harness.task is not None and harness.task.done()
    assert not harness.task.cancelled()  # our own abort: the run's task just returns
    kinds = [(k, d.get("output")) for _, k, d in harness.events]
    assert kinds[-2:] == [("TOOL_END", "cancelled by the user"), ("CANCELLED", None)]
    end = harness.events[-1][2]
    assert (end["mode"], end["reason"]) == ("ui", "enough")
    check_history(harness.session.history)


def test_a_deadline_cancels_through_the_drivers_timer():
    async def scenario(tmp: Path) -> Harness:
        harness = Harness(tmp / "sessions.db", Agent(), Config())
        driver = RunDriver(harness.session, harness.io)
        driver.start("go", deadline_s=0.01)
        harness.launch(driver)
        await asyncio.wait_for(harness.task, 5)  # type: ignore[arg-type]
        return harness

    with tempfile.TemporaryDirectory() as tmp:
        harness = asyncio.run(scenario(Path(tmp)))
        harness.journal.close()
    assert harness.events[-1][1] == "CANCELLED"
    assert harness.events[-1][2]["mode"] == "deadline"


def test_a_tool_in_flight_at_a_restart_is_adopted_its_outcome_ends_it():
    """A restart with `adopt` while a call runs: the resumed driver waits for that call
    (`adopt_tool`), never starts it again, and its outcome is the call's result; the
    fold of the log then resumes a finished turn."""

    async def scenario(tmp: Path) -> Harness:
        harness = Harness(tmp / "sessions.db", Agent(), Config())
        await harness.start()
        future, _, turn = harness.io.model  # type: ignore[misc]
        future.set_result(reply("tools1", turn))
        await harness.settle()
        assert harness.io.ran == ["t1-0"]
        await harness.restart(adopt=True)
        assert harness.io.adopted == ["t1-0"] and harness.io.ran == []
        harness.io.tools["t1-0"].set_result(ToolOutcome("real", False, 3.0))
        await harness.settle()
        future, _, turn = harness.io.model  # type: ignore[misc]
        future.set_result(reply("done", turn))
        await harness.settle()
        return harness

    with tempfile.TemporaryDirectory() as tmp:
        harness = asyncio.run(scenario(Path(tmp)))
        harness.journal.close()
    kinds = [k for _, k, _ in harness.events]
    assert kinds.count("TOOL_START") == 1 and kinds.count("TOOL_END") == 1
    assert kinds.index("RESUMED") < kinds.index("TOOL_END") and kinds[-1] == "DONE"
    (end,) = [d for _, k, d in harness.events if k == "TOOL_END"]
    assert (end["output"], end["is_error"]) == ("real", False)
    check_events(harness.events)
    check_history(harness.session.history)
