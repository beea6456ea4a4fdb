"""The async client of a host: what the CLI itself uses, and what programs embed.

    async with Client.connect() as client:
        run = await client.start("list /tmp")
        async for event in client.events(run.session, from_seq=run.from_seq, stop_at="first"):
            print(event)

`events()` follows the ZeroMQ guide's Clone pattern: subscribe to the session's
topic first, fetch the log from `from_seq` through the replay socket, then
merge live events, dropping duplicates by `seq` and re-fetching any gap. Every
viewer therefore sees the same contiguous sequence.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import zmq

from bus.codec import decode
from bus.endpoints import Endpoints
from bus.errors import BadFrame, RemoteError
from bus.messages import (
    Cancel,
    CancelAck,
    Envelope,
    Event,
    InspectSession,
    ListSessions,
    ListTools,
    ReplayBatch,
    ReplayRequest,
    RunStarted,
    SessionInfo,
    SessionList,
    StartRun,
    Stats,
    StatsReply,
    ToolList,
)
from bus.rpc import Requester
from bus.sockets import Reactor

TERMINAL_TYPES = frozenset({"DONE", "ERROR", "CANCELLED"})

#: A viewer that hears nothing live for this long re-asks the replay socket, so a
#: lost tail (dropped by PUB, or sent before the subscription took) is recovered.
RESYNC_IDLE_S = 0.5

#: Live events buffered per viewer before the oldest are dropped (recovered by replay).
LIVE_QUEUE = 10_000


def event_dict(env: Envelope) -> dict[str, Any]:
    """The public JSON form of an `Event` envelope (DESIGN.md §4)."""
    ev = env.body
    assert isinstance(ev, Event)
    return {
        "session": env.sid,
        "seq": ev.seq,
        "type": ev.type,
        "turn": ev.turn,
        "ts": ev.ts,
        "data": ev.data,
    }


class Client:
    """A connection to one host's supervisor and broadcaster."""

    def __init__(self, endpoints: Endpoints, ctx: zmq.Context[Any] | None = None) -> None:
        self.endpoints = endpoints
        self._own_ctx = ctx is None
        self._ctx = ctx or zmq.Context()
        self._reactor = Reactor(self._ctx)
        self._api = Requester(self._reactor, "client.api", endpoints.address("api"))
        self._control = Requester(self._reactor, "client.control", endpoints.address("control"))
        self._replay = Requester(self._reactor, "client.replay", endpoints.address("replay"))
        self._task: asyncio.Task[None] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, home: Path | None = None) -> AsyncIterator[Client]:
        """Connect to the host in `home` (default `$OPLOOP_HOME`); closes on exit."""
        client = cls(Endpoints.for_home(home))
        client._task = asyncio.create_task(client._reactor.run(), name="client-reactor")
        try:
            yield client
        finally:
            await client.aclose()

    async def aclose(self) -> None:
        """Stop serving and close every socket."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._reactor.close()
        if self._own_ctx:
            self._ctx.term()

    # -- requests ----------------------------------------------------------------------

    async def start(
        self,
        prompt: str,
        *,
        session: str = "",
        agent: str = "",
        max_turns: int = 0,
        deadline_s: float = 0.0,
        cwd: str | None = None,
        timeout: float = 10.0,
    ) -> RunStarted:
        """Start a run (a new session, or a follow-up in `session`)."""
        body = StartRun(prompt, session, agent, max_turns, deadline_s, cwd or os.getcwd())
        reply = await self._api.request(body, timeout=timeout)
        assert isinstance(reply.body, RunStarted)
        return reply.body

    async def sessions(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Summaries of every session the supervisor holds."""
        reply = await self._api.request(ListSessions(), timeout=timeout)
        assert isinstance(reply.body, SessionList)
        return reply.body.sessions

    async def inspect(self, session: str, timeout: float = 5.0) -> SessionInfo:
        """One session's summary and stored history."""
        reply = await self._api.request(InspectSession(session), timeout=timeout)
        assert isinstance(reply.body, SessionInfo)
        return reply.body

    async def tools(self, agent: str = "", timeout: float = 5.0) -> list[dict[str, Any]]:
        """The tool catalogue as `agent` sees it."""
        reply = await self._api.request(ListTools(agent), timeout=timeout)
        assert isinstance(reply.body, ToolList)
        return reply.body.tools

    async def stats(self, timeout: float = 5.0) -> dict[str, Any]:
        """The supervisor's counters."""
        reply = await self._api.request(Stats(), timeout=timeout)
        assert isinstance(reply.body, StatsReply)
        return reply.body.counters

    async def cancel(
        self, session: str, mode: str = "ui", reason: str = "", timeout: float = 5.0,
        via: Literal["control", "api"] = "control",
    ) -> CancelAck:
        """Cancel `session` (`ui`: now; `operation`: at the next loop boundary).

        `via="api"` sends it down the data path instead of the priority control
        socket: the same effect, slower under load (the benchmark's comparison).
        """
        requester = self._control if via == "control" else self._api
        reply = await requester.request(Cancel(session, mode, reason), timeout=timeout)
        assert isinstance(reply.body, CancelAck)
        return reply.body

    # -- events ------------------------------------------------------------------------

    async def events(
        self,
        session: str,
        from_seq: int = 1,
        *,
        follow: bool = True,
        stop_at: Literal["first", "last"] = "last",
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield `session`'s events from `from_seq` in order, without gap or duplicate.

        With `follow`, goes on live and ends after a terminal event: the first one
        seen (`stop_at="first"`, one run) or one that is the newest in the log
        (`"last"`). Without `follow`, ends at the end of the stored log.
        """
        live: asyncio.Queue[Envelope] = asyncio.Queue(LIVE_QUEUE)

        def on_live(topic: bytes | None, env: Envelope, frame: bytes) -> None:
            if live.full():
                live.get_nowait()  # drop the oldest: the gap is refetched from replay
            live.put_nowait(env)

        sub = self._reactor.add(
            zmq.SUB,
            f"client.events.{session}",
            on_live,
            connect=self.endpoints.address("events"),
            subscribe=session.encode(),
            hwm=100_000,
        )
        try:
            view = _View(from_seq, stop_at)
            async for ev in self._fetch(session, view):
                yield ev
            if view.finished or not follow:
                return
            while not view.finished:
                try:
                    async with asyncio.timeout(RESYNC_IDLE_S):
                        env = await live.get()
                except TimeoutError:
                    async for ev in self._fetch(session, view):
                        yield ev
                    continue
                if env.sid != session or not isinstance(env.body, Event):
                    continue
                seq = env.body.seq
                if seq < view.next_seq:
                    continue  # already seen through replay
                if seq > view.next_seq:  # a gap: fetch what is missing, then this one
                    async for ev in self._fetch(session, view, to_seq=seq - 1):
                        yield ev
                    if seq != view.next_seq:
                        continue
                ev = event_dict(env)
                view.accept(ev, newest=seq)
                yield ev
        finally:
            self._reactor.remove(sub)

    async def _fetch(
        self, session: str, view: _View, to_seq: int = 0
    ) -> AsyncIterator[dict[str, Any]]:
        """Replay from `view.next_seq` (to `to_seq`, 0 = end), batch after batch."""
        while not view.finished:
            try:
                reply = await self._replay.request(
                    ReplayRequest(view.next_seq, to_seq), sid=session, timeout=10.0
                )
            except RemoteError as exc:
                if exc.code == "unknown_session":
                    return  # not logged yet: live events or the next resync bring it
                raise
            batch = reply.body
            assert isinstance(batch, ReplayBatch)
            for frame in batch.events:
                try:
                    env = decode(frame)
                except BadFrame:
                    continue
                if not isinstance(env.body, Event) or env.body.seq != view.next_seq:
                    continue
                ev = event_dict(env)
                view.accept(ev, newest=batch.last_seq)
                yield ev
                if view.finished:
                    return
            if not batch.more:
                return


class _View:
    """Where one viewer stands in a session's sequence, and whether it is done."""

    def __init__(self, from_seq: int, stop_at: str) -> None:
        self.next_seq = max(1, from_seq)
        self.stop_at = stop_at
        self.finished = False

    def accept(self, ev: dict[str, Any], newest: int) -> None:
        self.next_seq = ev["seq"] + 1
        if ev["type"] in TERMINAL_TYPES and (self.stop_at == "first" or ev["seq"] >= newest):
            self.finished = True
