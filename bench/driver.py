"""Running sessions on a host and timing their turns from the event stream.

One SUB socket subscribed to every session collects `TURN_START`/`TURN_END`
and terminal events; their `ts` are stamped by the supervisor, so a turn's
time is the supervisor's own view: from one turn's start to the next one's
(the last turn: to its end).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from bus.client import Client
from bus.endpoints import Endpoints
from bus.messages import Envelope, Event
from bus.sockets import Reactor
from bus.vocab import TERMINAL


@dataclass
class Run:
    """What one run's events said."""

    starts: list[float] = field(default_factory=list)
    last_end: float = 0.0
    terminal: str = ""
    stop: str = ""
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def turn_s(self) -> list[float]:
        """Seconds each turn took."""
        marks = [*self.starts, self.last_end]
        return [b - a for a, b in zip(marks, marks[1:], strict=False)]


class Driver:
    """Starts runs on the host in `home` (or at `endpoints`: over TCP) and follows all of
    them on one subscription. `cwd`: the runs' working directory (None: this process's);
    a `BenchHost`'s is `host.dir`, where the file every turn reads lies: elsewhere the
    sandbox shows no /tmp of the host, and every read would fail."""

    def __init__(self, home: Path, endpoints: Endpoints | None = None,
                 cwd: Path | None = None) -> None:
        self.endpoints = endpoints or Endpoints.for_home(home)
        self.cwd = str(cwd) if cwd is not None else None
        self.runs: dict[str, Run] = {}
        self.turns_ended = 0
        #: A failed tool call's output, by session (the workload's reads must succeed:
        #: a benchmark of error results measures something else).
        self.tool_errors: dict[str, str] = {}
        #: Called with (session, event) for every event, before the driver's own handling.
        self.observers: list[Callable[[str, Event], None]] = []
        self._reactor = Reactor(zmq.Context.instance())
        self._reactor.add(
            zmq.SUB, "bench.events", self._on_event, connect=self.endpoints.address("events"),
            secure=self.endpoints.client_side("events"), subscribe=b"", hwm=10_000_000,
        )

    def _on_event(self, topic: bytes | None, env: Envelope, frame: bytes) -> None:
        ev = env.body
        if not isinstance(ev, Event):
            return
        for observe in self.observers:
            observe(env.sid, ev)
        run = self.runs.get(env.sid)
        if run is None:
            run = self.runs[env.sid] = Run()
        if ev.type == "TURN_START":
            run.starts.append(ev.ts)
        elif ev.type == "TOOL_END" and ev.data.get("is_error"):
            self.tool_errors[env.sid] = str(ev.data.get("output", ""))[:300]
        elif ev.type == "TURN_END":
            run.last_end = ev.ts
            self.turns_ended += 1
        elif ev.type in TERMINAL:
            run.terminal = ev.type
            run.stop = str(ev.data.get("stop", ev.data.get("error", "")))
            run.done.set()

    async def __aenter__(self) -> Driver:
        self._client_cm = Client.connect(endpoints=self.endpoints)
        self.client = await self._client_cm.__aenter__()
        self._task = asyncio.create_task(self._reactor.run(), name="bench-sub")
        await self._wait_subscribed()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._reactor.close()
        await self._client_cm.__aexit__(None, None, None)

    async def _wait_subscribed(self) -> None:
        """Run one-turn sessions until one is seen end: the subscription has landed."""
        for _ in range(50):
            started = await self.client.start("warm up", max_turns=1, cwd=self.cwd)
            try:
                await asyncio.wait_for(self._run(started.session).done.wait(), 1.0)
                return
            except TimeoutError:
                continue
        raise RuntimeError("never saw a run end on the event stream")

    def _run(self, session: str) -> Run:
        run = self.runs.get(session)
        if run is None:
            run = self.runs[session] = Run()
        return run

    async def run(self, turns: int, timeout: float = 120.0) -> Run:
        """One new session of `turns` tool turns, to its terminal event."""
        started = await self.client.start("read the file, again and again", max_turns=turns,
                                          cwd=self.cwd)
        run = self._run(started.session)
        await asyncio.wait_for(run.done.wait(), timeout)
        if run.terminal != "DONE" or len(run.starts) != turns:
            raise RuntimeError(f"run ended {run.terminal} {run.stop!r} after "
                               f"{len(run.starts)} turns")
        self.check_no_tool_errors([started.session])
        return run

    async def many(self, sessions: int, turns: int, timeout: float = 300.0) -> float:
        """`sessions` concurrent sessions of `turns` turns; turns per second overall."""
        before = self.turns_ended
        t0 = time.perf_counter()
        starts = await asyncio.gather(*(
            self.client.start("read the file, again and again", max_turns=turns, timeout=60,
                              cwd=self.cwd)
            for _ in range(sessions)
        ))
        runs = [self._run(s.session) for s in starts]
        await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in runs)), timeout)
        elapsed = time.perf_counter() - t0
        bad = [r for r in runs if r.terminal != "DONE"]
        if bad:
            raise RuntimeError(f"{len(bad)} of {sessions} runs ended {bad[0].terminal} "
                               f"{bad[0].stop!r}")
        self.check_no_tool_errors([s.session for s in starts])
        return (self.turns_ended - before) / elapsed

    def check_no_tool_errors(self, sessions: list[str]) -> None:
        """Raise if a tool call of `sessions` failed (the reads must succeed)."""
        failed = [self.tool_errors[s] for s in sessions if s in self.tool_errors]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(sessions)} runs had a tool call "
                               f"fail: {failed[0]}")
