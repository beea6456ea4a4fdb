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
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal

import zmq

from bus.codec import decode
from bus.endpoints import Endpoints
from bus.errors import BadFrame, RemoteError, RequestTimeout, SessionRemoved
from bus.mcpwire import AnswerElicitation, ElicitationAck, GetPrompt, PromptResult
from bus.messages import (
    Cancel,
    CancelAck,
    Compact,
    CompactAck,
    DecideAck,
    DecideCalls,
    Envelope,
    Event,
    ForgetSessions,
    InspectSession,
    ListSessions,
    ListTools,
    PruneSessions,
    RemoveSessions,
    Renew,
    RenewAck,
    ReplayBatch,
    ReplayRequest,
    RunStarted,
    Say,
    SayAck,
    SessionInfo,
    SessionList,
    SessionsRemoved,
    StartRun,
    Stats,
    StatsReply,
    Subscribed,
    ToolList,
)
from bus.rpc import Requester
from bus.sockets import Reactor
from bus.viewing import Lag, Subscription, View
from bus.vocab import TERMINAL, CancelMode

#: (the terminal set, `bus.vocab.TERMINAL`, under the name clients have used)
TERMINAL_TYPES = TERMINAL

#: A viewer that hears nothing live for this long re-asks the replay socket, so a
#: lost tail (dropped by PUB, or sent before the subscription took) is recovered.
RESYNC_IDLE_S = 0.5

#: Live events queued on the viewer's side (SUB RCVHWM); beyond it and the broadcaster's
#: own per-viewer queue, events are dropped and recovered by replay.
LIVE_HWM = 10_000

#: One replay request waits this long before it is sent again ...
REPLAY_TIMEOUT_S = 2.0
#: ... and a broadcaster silent for this long in all is an error (not a restart).
BROADCASTER_PATIENCE_S = 30.0

#: A start without a reply for this long is sent again (same key: started once).
START_RESEND_S = 2.0



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
        self._api, self._control, self._replay = (
            Requester(self._reactor, f"client.{name}", endpoints.address(name),
                      endpoints.client_side(name), watch=endpoints.remote)
            for name in ("api", "control", "replay")
        )
        self._task: asyncio.Task[None] | None = None
        # Live subscriptions still open (an abandoned `events()` iterator): closed
        # by `aclose()`, since the context cannot terminate while a socket lives.
        self._subs: set[Subscription] = set()

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, home: Path | None = None, *,
                      endpoints: Endpoints | None = None) -> AsyncIterator[Client]:
        """Connect to the host in `home`, or at `endpoints` (default: `OPLOOP_CONNECT`
        with `OPLOOP_KEYS` when set, else the host of `$OPLOOP_HOME`); closes on exit."""
        if endpoints is None:
            endpoints = Endpoints.for_home(home) if home is not None else Endpoints.from_env()
        client = cls(endpoints)
        client._task = asyncio.create_task(client._reactor.run(), name="client-reactor")
        try:
            yield client
        finally:
            await client.aclose()

    @classmethod
    def opened(cls, endpoints: Endpoints) -> Client:
        """A client serving from now on, in the running loop, for an owner that keeps it
        across many requests (and closes it with `aclose()`)."""
        client = cls(endpoints)
        client._task = asyncio.create_task(client._reactor.run(), name="client-reactor")
        return client

    async def aclose(self) -> None:
        """Stop serving and close every socket."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for sub in list(self._subs):
            sub.close()
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
        lease_s: float = 0.0,
        machine: str = "",
        traceparent: str = "",
        host: str = "",
    ) -> RunStarted:
        """Start a run (a new session, or a follow-up in `session`); `machine`: the
        session's tools run on that worker machine only.

        Sent again every `START_RESEND_S` without a reply, until `timeout`: a
        supervisor restarting loses what it had not answered. Every resend carries
        the same key, so the run starts once however many arrive. `lease_s` > 0: the
        run is cancelled unless `renew` keeps it, at least that often. `cwd`: the
        session's working directory (None: this process's; "": none of the client's
        choosing, the agent's `cwd` or the session's scratch workspace). `traceparent`:
        a W3C trace context; a host exporting traces makes the run's span its child.
        `host`: on a store several hosts share, the host (id or name, `oploop status`)
        to run a new session on ("": the least-loaded); an unknown one is refused.
        """
        body = StartRun(prompt, session, agent, max_turns, deadline_s,
                        os.getcwd() if cwd is None else cwd,
                        key=os.urandom(8).hex(), lease_s=lease_s, machine=machine,
                        host=host)
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            wait = min(START_RESEND_S, end - loop.time())
            try:
                reply = await self._api.request(body, timeout=wait, traceparent=traceparent)
                break
            except RequestTimeout:
                if loop.time() >= end - 0.001:
                    raise RequestTimeout(body.KIND, timeout) from None
        assert isinstance(reply.body, RunStarted)
        return reply.body

    async def sessions(self, timeout: float = 5.0) -> list[dict[str, Any]]:
        """Summaries of every session the supervisor holds."""
        reply = await self._api.request(ListSessions(), timeout=timeout)
        assert isinstance(reply.body, SessionList)
        return reply.body.sessions

    async def inspect(self, session: str, timeout: float = 5.0, *,
                      history: bool = True) -> SessionInfo:
        """One session's summary and stored history (`history=False`: the summary only,
        the reply's `history` empty: a long session's is megabytes)."""
        reply = await self._api.request(InspectSession(session, history), timeout=timeout)
        assert isinstance(reply.body, SessionInfo)
        return reply.body

    async def prune(self, older_than_s: float = -1.0, keep: int = -1,
                    timeout: float = 30.0) -> SessionsRemoved:
        """Delete finished sessions now by the host's retention rules; `older_than_s`
        and `keep` (>= 0) replace its age and count limits."""
        reply = await self._api.request(PruneSessions(older_than_s, keep), timeout=timeout)
        assert isinstance(reply.body, SessionsRemoved)
        return reply.body

    async def remove(self, sessions: list[str], timeout: float = 30.0) -> SessionsRemoved:
        """Delete `sessions` (a running one is refused, and named in the reply)."""
        reply = await self._api.request(RemoveSessions(sessions), timeout=timeout)
        assert isinstance(reply.body, SessionsRemoved)
        return reply.body

    async def tools(self, agent: str = "", timeout: float = 5.0) -> list[dict[str, Any]]:
        """The tool catalogue as `agent` sees it."""
        reply = await self._api.request(ListTools(agent), timeout=timeout)
        assert isinstance(reply.body, ToolList)
        return reply.body.tools

    async def prompt(self, server: str, prompt: str, arguments: dict[str, str] | None = None,
                     agent: str = "", timeout: float = 75.0) -> list[dict[str, str]]:
        """The messages (`{role, text}`) of MCP server `server`'s prompt `prompt` filled
        with `arguments` (`prompts/get`, run by an executor of `agent`'s machine).
        Raises `RemoteError` (an unknown server or prompt, the server's refusal)."""
        reply = await self._api.request(GetPrompt(server, prompt, dict(arguments or {}), agent),
                                        timeout=timeout)
        assert isinstance(reply.body, PromptResult)
        return reply.body.messages

    async def stats(self, timeout: float = 5.0) -> dict[str, Any]:
        """The supervisor's counters."""
        reply = await self._api.request(Stats(), timeout=timeout)
        assert isinstance(reply.body, StatsReply)
        return reply.body.counters

    async def cancel(
        self, session: str, mode: str = CancelMode.UI, reason: str = "", timeout: float = 5.0,
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

    async def renew(self, session: str, lease_s: float, timeout: float = 5.0) -> bool:
        """Keep the lease of a run started with `lease_s` for `lease_s` more seconds;
        False when the run has ended. On the priority control socket."""
        reply = await self._control.request(Renew(session, lease_s), timeout=timeout)
        assert isinstance(reply.body, RenewAck)
        return reply.body.running

    async def say(self, session: str, text: str, timeout: float = 5.0) -> SayAck:
        """Send a user message into `session`: a running one takes it at its next
        boundary (after the current tool results, before the next model call) as a
        `USER_MESSAGE` event; an idle one starts a run on it (`SayAck.state` says which).

        Sent once, not resent: the reply comes once the message is journaled, and a
        resend could deliver it twice. Refused (`RemoteError`): an unknown session, an
        empty text, one over `limits.max_prompt_chars`; a viewer key cannot connect.
        """
        reply = await self._control.request(Say(session, text), timeout=timeout)
        assert isinstance(reply.body, SayAck)
        return reply.body

    async def compact(self, session: str, timeout: float = 300.0) -> CompactAck:
        """Compact `session`'s requests: with no run open, every tool result cleared and
        the turns before the last summarised (a model call: `timeout` covers it), the
        reply once its `COMPACTED` is journaled; a running session compacts before its
        next model call (`state` "queued"). Sent once, on the control socket. Refused
        (`RemoteError`): an unknown session, nothing to compact, the summary failing."""
        reply = await self._control.request(Compact(session), timeout=timeout)
        assert isinstance(reply.body, CompactAck)
        return reply.body

    async def approve(self, session: str, call_ids: list[str] | None = None, *,
                      all: bool = False, always: bool = False,
                      timeout: float = 5.0) -> DecideAck:
        """Approve calls of `session` waiting for approval (`call_ids`, or `all` of them;
        `always`: their tools' calls for the rest of the session too). Raises
        `RemoteError` (nothing changed) for an unknown session or call, a call decided
        already ("already decided by ..."), or a key that may not decide."""
        return await self._decide(session, "approve", call_ids, all, "", timeout, always)

    async def deny(self, session: str, call_ids: list[str] | None = None, *,
                   all: bool = False, reason: str = "", timeout: float = 5.0) -> DecideAck:
        """Deny calls waiting for approval: each is answered with an error saying
        `reason`, and the model goes on. Errors as `approve`."""
        return await self._decide(session, "deny", call_ids, all, reason, timeout)

    async def answer(self, session: str, ask_id: str, content: dict[str, Any] | None = None,
                     *, action: str = "accept", timeout: float = 5.0) -> ElicitationAck:
        """Answer an MCP server's question `ask_id` of `session` (its
        `ELICITATION_REQUESTED`): `action` "accept" with `content` (the form's values;
        strings are read as the numbers or booleans the form wants), "decline" or
        "cancel". Raises `RemoteError` (nothing sent) for an unknown session or question,
        one answered already, content the form refuses, or a key that may not answer."""
        body = AnswerElicitation(session, ask_id, action, dict(content or {}))
        reply = await self._control.request(body, timeout=timeout)
        assert isinstance(reply.body, ElicitationAck)
        return reply.body

    async def _decide(self, session: str, decision: str, call_ids: list[str] | None,
                      all: bool, reason: str, timeout: float,
                      always: bool = False) -> DecideAck:
        body = DecideCalls(session, decision, list(call_ids or []), all, reason, always)
        reply = await self._control.request(body, timeout=timeout)
        assert isinstance(reply.body, DecideAck)
        return reply.body

    # -- events ------------------------------------------------------------------------

    async def last_seq(self, session: str, timeout: float = 5.0) -> int | None:
        """The newest seq the broadcaster holds for `session`, or None if it has none."""
        try:
            reply = await self._replay.request(ReplayRequest(1, 1), sid=session, timeout=timeout)
        except RemoteError as exc:
            if exc.code == "unknown_session":
                return None
            raise
        assert isinstance(reply.body, ReplayBatch)
        return reply.body.last_seq

    async def broadcaster_stats(self, timeout: float = 5.0) -> dict[str, Any]:
        """The broadcaster's counters (sessions, viewers, recovered and lost events, ...)."""
        reply = await self._replay.request(Stats(), timeout=timeout)
        assert isinstance(reply.body, StatsReply)
        return reply.body.counters

    async def events(
        self,
        session: str,
        from_seq: int = 1,
        *,
        follow: bool = True,
        stop_at: Literal["first", "last"] = "last",
        until_seq: int | None = None,
        on_lag: Callable[[Lag], None] | None = None,
        hwm: int = LIVE_HWM,
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield `session`'s events from `from_seq` in order, without gap or duplicate.

        With `follow`, goes on live and ends after a terminal event: the first one
        seen (`stop_at="first"`, one run) or one that is the newest in the log
        (`"last"`); with `until_seq` too, ends after that seq instead, terminal or
        not. Without `follow`, ends at the end of the broadcaster's stored log, which
        may lag the supervisor's by the events on their way to it: to have every
        event the supervisor has committed, follow `until_seq` its summary's
        `last_seq` (`oploop watch --no-follow` does).

        Live events are read only as fast as the caller iterates: a slow caller's
        backlog waits in zmq's queues (`hwm` on this side), the broadcaster drops
        what overflows them, and the gap is refetched from the log. `on_lag` is
        told each time that happens (at most once a second), and of events the
        broadcaster no longer has (never, unless something lost them).
        """
        # Subscribe before the first replay (Clone pattern): nothing published
        # after the replay's snapshot can then slip between the two.
        sub = None
        if follow:
            sub = Subscription(self._ctx, self.endpoints, session, hwm)
            self._subs.add(sub)
        try:
            view = View(from_seq, stop_at, on_lag, until_seq)
            live = False  # whether the subscription has delivered anything yet
            async for ev in self._fetch(session, view):
                yield ev
            while sub is not None and not view.finished:
                env = await sub.get(RESYNC_IDLE_S)
                if env is None:  # quiet: a tail lost live (or sent before we joined) comes back
                    async for ev in self._fetch(session, view, missed_live=live):
                        yield ev
                    continue
                if env.sid != session:
                    continue
                if isinstance(env.body, ForgetSessions):
                    raise SessionRemoved(session)
                if not isinstance(env.body, Event):
                    continue
                seq = env.body.seq
                was_live, live = live, True
                if seq < view.next_seq:
                    continue  # already seen through replay
                if seq > view.next_seq:  # dropped live: fetch what is missing, then this one
                    if was_live:  # before the first live event, a gap is only the join race
                        view.missed(seq - view.next_seq, time.time() - env.body.ts)
                    async for ev in self._fetch(session, view, to_seq=seq - 1):
                        yield ev
                    if view.finished or seq != view.next_seq:  # (`until_seq` reached)
                        continue
                ev = event_dict(env)
                view.accept(ev, newest=seq)
                yield ev
            view.report()
        finally:
            if sub is not None:
                sub.close()
                self._subs.discard(sub)

    async def live(self, hwm: int = LIVE_HWM, *,
                   on_subscribed: Callable[[], None] | None = None,
                   ) -> AsyncIterator[dict[str, Any]]:
        """Yield every session's events as they are published, with no replay: what
        PUB drops under load is not recovered (a gap shows in each session's seq).
        For counters and dashboards; a viewer of one session uses `events()`.
        `on_subscribed` is called once the broadcaster has the subscription (every
        event published after that call comes here), and again after each reconnect."""
        sub = Subscription(self._ctx, self.endpoints, "", hwm)
        self._subs.add(sub)
        try:
            while True:
                env = await sub.get(RESYNC_IDLE_S)
                if env is None:
                    continue
                if isinstance(env.body, Event):
                    yield event_dict(env)
                elif isinstance(env.body, Subscribed) and on_subscribed is not None:
                    on_subscribed()
        finally:
            sub.close()
            self._subs.discard(sub)

    async def _replay_request(self, body: ReplayRequest, session: str, timeout: float) -> Envelope:
        """One replay request, sent again while the broadcaster does not answer (it may be
        restarting; replay is idempotent) until `BROADCASTER_PATIENCE_S` have passed."""
        waited = 0.0
        while True:
            try:
                return await self._replay.request(body, sid=session, timeout=timeout)
            except RequestTimeout:
                waited += timeout
                if waited >= BROADCASTER_PATIENCE_S:
                    raise

    async def _fetch(
        self, session: str, view: View, to_seq: int = 0, *, missed_live: bool = False
    ) -> AsyncIterator[dict[str, Any]]:
        """Replay from `view.next_seq` (to `to_seq`, 0 = end), batch after batch.

        `missed_live`: whatever this brings should have come live (the subscription
        was working), so it counts as dropped live for `on_lag`.
        """
        while not view.finished:
            try:
                reply = await self._replay_request(
                    ReplayRequest(view.next_seq, to_seq), session, REPLAY_TIMEOUT_S
                )
            except RemoteError as exc:
                # unknown_session: not logged yet; bad_seq: a restarted broadcaster still
                # recovering what we have already seen. Live events or the next resync
                # bring the rest.
                if exc.code == "unknown_session" and view.seen:
                    # It had events, and the log holds none now: deleted meanwhile (the
                    # live notice of it may have come before this viewer subscribed).
                    raise SessionRemoved(session) from None
                if exc.code in ("unknown_session", "bad_seq"):
                    return
                raise
            batch = reply.body
            assert isinstance(batch, ReplayBatch)
            for i, frame in enumerate(batch.events):
                try:
                    env = decode(frame)
                except BadFrame:
                    continue
                if not isinstance(env.body, Event) or env.body.seq < view.next_seq:
                    continue
                if missed_live:  # tell before showing them: the rest of the batch is new
                    age = time.time() - env.body.ts
                    # Younger than the idle wait, it may just be on its way live.
                    if age >= RESYNC_IDLE_S:
                        view.missed(len(batch.events) - i, age)
                    missed_live = bool(batch.more)
                if env.body.seq > view.next_seq:  # a hole in the log itself
                    view.lost(env.body.seq - view.next_seq)
                ev = event_dict(env)
                view.accept(ev, newest=batch.last_seq)
                yield ev
                if view.finished:
                    return
            if not batch.more:
                return
