"""The supervisor process: api, control and work sockets; sessions; events out."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import deque
from typing import Any

import zmq

from actors.runtime import notify_ready, run_actor
from actors.supervisor.agents import DEFAULT_AGENT, Agent
from actors.supervisor.catalogue import resolve_tools
from actors.supervisor.dispatch import Dispatcher, NoCapacity
from actors.supervisor.history import Message
from actors.supervisor.session import ModelError, Session, run_session
from actors.supervisor.turn import ToolCall, ToolOutcome
from bus.codec import encode
from bus.endpoints import Endpoints
from bus.errors import Backpressure, BusError
from bus.messages import (
    Cancel,
    CancelAck,
    ControlHello,
    Delta,
    HISTORY_MISS,
    Envelope,
    Event,
    InspectSession,
    JobFailed,
    ListSessions,
    ListTools,
    LlmResult,
    Retrying,
    RunStarted,
    SessionInfo,
    SessionList,
    StartRun,
    Stats,
    StatsReply,
    ToolJob,
    ToolList,
    ToolResult,
)
from bus.sockets import Port, Reactor

log = logging.getLogger("oploop.supervisor")

#: Longest a model call may take, retries included, when nothing tighter applies.
LLM_JOB_TIMEOUT_S = 900.0
#: How long a run waits for a first executor to announce its tools.
CATALOGUE_WAIT_S = 5.0
#: Refuse prompts longer than this (characters).
MAX_PROMPT_CHARS = 1_000_000
#: Events that could not be pushed (broadcaster away) wait here, in order.
MAX_OUTBOX = 1_000_000


class Supervisor:
    """Holds every session, runs their turn loops, and is the single writer of events."""

    def __init__(self, endpoints: Endpoints, agents: dict[str, Agent] | None = None) -> None:
        self.agents = agents or {DEFAULT_AGENT.name: DEFAULT_AGENT}
        self.sessions: dict[str, Session] = {}
        self.reactor = Reactor()
        self.control = self.reactor.add(
            zmq.ROUTER, "control", self.handle_control, bind=endpoints.address("control"),
            priority=True, reply_errors=True,
        )
        self.api = self.reactor.add(
            zmq.ROUTER, "api", self.handle_api, bind=endpoints.address("api"), reply_errors=True,
        )
        work = self.reactor.add(zmq.ROUTER, "work", None, bind=endpoints.address("work"))
        self.dispatcher = Dispatcher(work, self.control)
        work.handler = self.dispatcher.handle_work
        self.events: Port = self.reactor.add(
            zmq.PUSH, "events", connect=endpoints.address("ingest"), hwm=1_000_000,
        )
        self._outbox: deque[bytes] = deque()
        self._group: asyncio.TaskGroup | None = None
        self.io = _WorkerIO(self)

    # -- events ------------------------------------------------------------------------

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        """Stamp the next seq of `session` on an event and push it to the broadcaster."""
        seq = session.next_seq
        session.next_seq += 1
        env = Envelope(Event(seq, type_, turn, time.time(), data), sid=session.id)
        frame = encode(env)
        if self._outbox or not self._push(frame):
            if len(self._outbox) >= MAX_OUTBOX:
                log.error("event outbox full: dropping %s#%d", session.id, seq)
                return
            self._outbox.append(frame)

    def _push(self, frame: bytes) -> bool:
        try:
            self.events.send_frame(frame)
        except Backpressure:
            return False
        return True

    async def _drain_outbox(self) -> None:
        while True:
            await asyncio.sleep(0.05)
            while self._outbox and self._push(self._outbox[0]):
                self._outbox.popleft()

    # -- api ---------------------------------------------------------------------------

    def handle_api(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        """Requests of clients: start a run, list/inspect sessions, list tools, stats."""
        body = env.body
        port = self.api
        if isinstance(body, StartRun):
            self._start_run(peer, env, body)
        elif isinstance(body, ListSessions):
            port.send(Envelope(SessionList([s.summary() for s in self.sessions.values()]),
                               id=env.id), peer)
        elif isinstance(body, InspectSession):
            session = self.sessions.get(body.session)
            if session is None:
                port.reply_error(peer, env.id, "unknown_session", f"no session {body.session!r}")
                return
            port.send(Envelope(SessionInfo(session.summary(), session.history), id=env.id), peer)
        elif isinstance(body, ListTools):
            agent = self.agents.get(body.agent or DEFAULT_AGENT.name)
            if agent is None:
                port.reply_error(peer, env.id, "unknown_agent", f"no agent {body.agent!r}")
                return
            tools = self.dispatcher.tool_specs()
            first = {t["name"] for t in resolve_tools(tools, agent, 1)}
            later = {t["name"] for t in resolve_tools(tools, agent, 2)}
            listed = [dict(t, turn1=t["name"] in first, later=t["name"] in later) for t in tools]
            port.send(Envelope(ToolList(listed), id=env.id), peer)
        elif isinstance(body, Stats):
            port.send(Envelope(StatsReply(self.statistics()), id=env.id), peer)
        else:
            port.reply_error(peer, env.id, "bad_request", f"api does not serve {env.kind}")

    def _start_run(self, peer: bytes | None, env: Envelope, req: StartRun) -> None:
        port = self.api
        if not req.prompt.strip():
            port.reply_error(peer, env.id, "bad_request", "the prompt is empty")
            return
        if len(req.prompt) > MAX_PROMPT_CHARS:
            port.reply_error(peer, env.id, "too_large",
                             f"prompt of {len(req.prompt)} chars exceeds {MAX_PROMPT_CHARS}")
            return
        if req.max_turns < 0:
            port.reply_error(peer, env.id, "bad_request", "max_turns must be >= 0")
            return
        if req.session:
            session = self.sessions.get(req.session)
            if session is None:
                port.reply_error(peer, env.id, "unknown_session", f"no session {req.session!r}")
                return
            if session.state == "running":
                port.reply_error(peer, env.id, "busy", f"session {req.session} is running a turn")
                return
        else:
            agent = self.agents.get(req.agent or DEFAULT_AGENT.name)
            if agent is None:
                port.reply_error(peer, env.id, "unknown_agent", f"no agent {req.agent!r}")
                return
            session = Session(secrets.token_hex(6), agent, req.cwd)
            self.sessions[session.id] = session
        session.state = "running"  # taken now, so a second start is refused at once
        reply = RunStarted(session.id, session.runs + 1, session.next_seq)
        port.send(Envelope(reply, id=env.id, sid=session.id), peer)
        assert self._group is not None
        session.task = self._group.create_task(
            self._run(session, req.prompt, req.max_turns), name=f"session-{session.id}"
        )

    async def _run(self, session: Session, prompt: str, max_turns: int) -> None:
        if not self.dispatcher.tool_specs():
            try:
                async with asyncio.timeout(CATALOGUE_WAIT_S):
                    while not self.dispatcher.tool_specs():
                        self.dispatcher.catalogue_changed.clear()
                        await self.dispatcher.catalogue_changed.wait()
            except TimeoutError:
                log.warning("no executor announced tools; session %s runs without", session.id)
        await run_session(session, self.io, prompt, max_turns)

    # -- control -----------------------------------------------------------------------

    def handle_control(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        """Priority verbs: workers' control hellos, and cancels."""
        body = env.body
        if isinstance(body, ControlHello) and peer is not None:
            self.dispatcher.handle_control_hello(peer, body)
        elif isinstance(body, Cancel):
            self._cancel(peer, env, body)
        else:
            self.control.reply_error(peer, env.id, "bad_request", f"control does not serve {env.kind}")

    def _cancel(self, peer: bytes | None, env: Envelope, req: Cancel) -> None:
        session = self.sessions.get(req.session)
        if session is None:
            self.control.reply_error(peer, env.id, "unknown_session", f"no session {req.session!r}")
            return
        if session.state != "running" or session.task is None:
            self.control.reply_error(peer, env.id, "not_running",
                                     f"session {req.session} is {session.state}: nothing to cancel")
            return
        session.task.cancel()
        self.control.send(Envelope(CancelAck(session.id, session.state), id=env.id), peer)

    # -- running -----------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        """Sessions by state, workers, jobs, and per-port counters."""
        states: dict[str, int] = {}
        for s in self.sessions.values():
            states[s.state] = states.get(s.state, 0) + 1
        return {
            "sessions": states,
            "outbox": len(self._outbox),
            **self.dispatcher.statistics(),
            "ports": self.reactor.statistics(),
        }

    async def serve(self) -> None:
        """Serve until cancelled."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                group.create_task(self.reactor.run(), name="reactor")
                group.create_task(self.dispatcher.beat(), name="heartbeat")
                group.create_task(self._drain_outbox(), name="outbox")
                notify_ready()
        finally:
            self.reactor.close()


class _WorkerIO:
    """`LoopIO` over the supervisor's workers and event stream."""

    def __init__(self, sup: Supervisor) -> None:
        self.sup = sup

    def emit(self, session: Session, type_: str, turn: int, data: dict[str, Any]) -> None:
        self.sup.emit(session, type_, turn, data)

    def tool_catalogue(self) -> list[dict[str, Any]]:
        return self.sup.dispatcher.tool_specs()

    async def call_model(
        self, session: Session, request: dict[str, Any], *, stream: bool, turn: int
    ) -> Message:
        def progress(env: Envelope) -> None:
            body = env.body
            if isinstance(body, Delta):
                kind = "THINKING" if body.channel == "thinking" else "TOKEN"
                self.sup.emit(session, kind, turn, {"text": body.text})
            elif isinstance(body, Retrying):
                self.sup.emit(session, "RETRY", turn, {
                    "attempt": body.attempt, "error": body.error, "wait_s": body.wait_s,
                })

        job = session.turn_cache.llm_job(session.id, request, stream)
        reply = await self._job("llm", job.full, session, LLM_JOB_TIMEOUT_S, progress,
                                for_worker=job.for_caller)
        body = reply.body
        if isinstance(body, JobFailed) and body.error == HISTORY_MISS:
            session.turn_cache.forget_callers()  # that caller lost its copy: send in full
            reply = await self._job("llm", job.full, session, LLM_JOB_TIMEOUT_S, progress,
                                    for_worker=job.for_caller)
            body = reply.body
        if isinstance(body, LlmResult):
            return body.message
        if isinstance(body, JobFailed):
            raise ModelError(body.error, body.message, body.status)
        raise ModelError("internal", f"unexpected reply {reply.kind}")

    async def run_tool(self, session: Session, call: ToolCall, *, timeout_s: float) -> ToolOutcome:
        job = ToolJob(call.name, call.input, session.cwd, timeout_s)
        # The executor enforces `timeout_s`; the margin covers a wedged executor.
        try:
            reply = await self._job("tool", job, session, timeout_s + 10.0, lambda env: None)
        except ModelError as exc:
            return ToolOutcome(f"{exc.error}: {exc.message}", True)
        body = reply.body
        if isinstance(body, ToolResult):
            return ToolOutcome(body.output, body.is_error, body.duration_ms)
        if isinstance(body, JobFailed):
            return ToolOutcome(f"{call.name} failed: {body.message}", True)
        return ToolOutcome(f"{call.name}: unexpected reply {reply.kind}", True)

    async def _job(self, role: str, body: Any, session: Session, timeout_s: float,
                   progress: Any, for_worker: Any = None) -> Envelope:
        dispatcher = self.sup.dispatcher
        try:
            job = dispatcher.submit(role, body, sid=session.id, deadline=time.time() + timeout_s,
                                    on_progress=progress, for_worker=for_worker)
        except NoCapacity as exc:
            raise ModelError("busy", str(exc)) from exc
        try:
            async with asyncio.timeout(timeout_s):
                return await job.future
        except TimeoutError:
            dispatcher.abort(job)
            raise ModelError("timeout", f"no {role} reply within {timeout_s:g} s") from None
        except BaseException:
            dispatcher.abort(job)  # cancelled: stop the worker's side too
            raise


async def _main() -> None:
    await Supervisor(Endpoints.for_home()).serve()


def main() -> None:
    """Entry point of `python -m actors.supervisor`."""
    run_actor("supervisor", _main)
