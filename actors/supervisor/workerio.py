"""The supervisor's `LoopIO`: model calls and tool calls as jobs for its workers."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any, cast

from actors.ask.asker import Asker
from actors.ask.tool import NAME as ASK_TOOL
from actors.bounds import cut_result
from actors.config import Config
from actors.core import inputs
from actors.core.history import Message
from actors.core.loopio import EventSink, ModelError, Progress
from actors.core.machine import INTERRUPTED
from actors.core.session import Session
from actors.core.turn import ToolCall, ToolOutcome
from actors.images import accepted
from actors.machines import LOCAL
from actors.supervisor.dispatch import Dispatcher
from actors.supervisor.elicits import Elicits
from actors.supervisor.jobstate import Job, NoCapacity
from actors.supervisor.samples import Samples, llm_job, reply_of
from actors.tools.live import HostBound
from actors.usage import priced
from bus.mcpwire import Elicit, Sample
from bus.messages import (
    HISTORY_MISS,
    Delta,
    Envelope,
    JobFailed,
    LlmJob,
    LlmResult,
    Retrying,
    ToolJob,
    ToolOutput,
    ToolProgress,
    ToolResult,
)
from bus.vocab import EventType

log = logging.getLogger("oploop.supervisor")

#: `JobFailed` tags whose message says all: the call's machine is gone or absent.
MACHINE_ERRORS = ("machine_lost", "no_worker")

#: Longest a model call may take, retries included, when nothing tighter applies.
LLM_JOB_TIMEOUT_S = 900.0
#: A token count's limit (the llm caller's own is 10 s; the margin covers a busy one).
COUNT_JOB_TIMEOUT_S = 20.0
#: How finely a job's timeout is kept (seconds): it fires at most this much late (every
#: timeout here has a margin of 10 s or more over the worker's own).
EXPIRY_TICK_S = 0.5


def _model_reply(reply: Envelope) -> Message:
    """The message of an llm caller's answer; `ModelError` if the call failed."""
    body = reply.body
    if isinstance(body, LlmResult):
        return body.message
    if isinstance(body, JobFailed):
        raise ModelError(body.error, body.message, body.status)
    raise ModelError("internal", f"unexpected reply {reply.kind}")


#: What an expired job's future is given (`_Expiry`): never a worker's reply.
_EXPIRED = cast(Envelope, object())


class _Expiry:
    """Jobs' timeouts, in buckets of `EXPIRY_TICK_S`: one loop timer per bucket, not one
    per job (an `asyncio.timeout` per job was ~4% of the supervisor's CPU: its object,
    a timer made and cancelled). An expired job's future is given `_EXPIRED`; whoever
    awaits it ends the job. A job answered in time leaves its bucket."""

    __slots__ = ("_due",)

    def __init__(self) -> None:
        self._due: dict[int, dict[int, asyncio.Future[Envelope]]] = {}

    def add(self, future: asyncio.Future[Envelope], timeout_s: float) -> int:
        """Expire `future` in `timeout_s` (up to a tick later) unless done or removed;
        returns the key `remove` takes."""
        loop = asyncio.get_running_loop()
        tick = math.ceil((loop.time() + timeout_s) / EXPIRY_TICK_S)
        bucket = self._due.get(tick)
        if bucket is None:
            bucket = self._due[tick] = {}
            loop.call_at(tick * EXPIRY_TICK_S, self._expire, tick)
        bucket[id(future)] = future
        return tick

    def remove(self, tick: int, future: asyncio.Future[Envelope]) -> None:
        """`future` no longer expires (its job is over)."""
        bucket = self._due.get(tick)
        if bucket is not None:
            bucket.pop(id(future), None)

    def _expire(self, tick: int) -> None:
        for future in self._due.pop(tick, {}).values():
            if not future.done():
                future.set_result(_EXPIRED)


class WorkerIO:
    """`LoopIO` over the supervisor's workers and event stream: given the jobs'
    `dispatcher`, the `asker` of `ask_machine` and the event stream's `emit`, nothing
    more of the supervisor."""

    def __init__(self, config: Config, dispatcher: Dispatcher, asker: Asker,
                 emit: EventSink) -> None:
        self.config = config
        self.dispatcher = dispatcher
        self.asker = asker
        self.emit: EventSink = emit
        #: The trace context of a session's open run, or of one of its tool calls
        #: (`RunTracer.traceparent`), that its model calls and asks carry; None: not tracing.
        self.trace_context: Callable[[str, str], str] | None = None
        #: MCP servers' questions to the user, waiting for an answer.
        self.elicits = Elicits(dispatcher, emit)
        #: MCP servers' model calls (sampling).
        self.samples = Samples(self)
        #: Calls in flight at a restart that resumed runs wait for (`expect`): the
        #: future their job is given when an executor reports it, and until when (the
        #: loop's time) they wait before they are answered "interrupted".
        self._adopting: dict[tuple[str, str], tuple[asyncio.Future[Job], float]] = {}
        self._expiry = _Expiry()

    def tool_catalogue(self, machine: str) -> list[dict[str, Any]]:
        """What the executors of `machine` offer (each machine reads its own config: its
        MCP servers differ), and `ask_machine` when `[peers]` are configured. A worker
        machine with no executor connected yet is offered the host's own catalogue: its
        calls then fail at once, saying so, rather than the model being told of no tools."""
        specs = self.dispatcher.tool_specs(machine)
        if not specs and machine != LOCAL:
            specs = self.dispatcher.tool_specs(LOCAL)
        ask = self.asker.tool_spec()  # offered only when `[peers]` are configured
        return specs if ask is None else [*specs, ask]

    def tool_machine(self, session: Session, tool: str = "") -> str:
        """The agent's `target_machine` (for this session), else the host's own;
        `ask_machine` runs here, in the supervisor, wherever the session is aimed."""
        if tool == ASK_TOOL and self.asker.peers:
            return LOCAL
        return session.agent.target_machine or LOCAL

    async def call_model(self, session: Session, request: dict[str, Any], *, stream: bool,
                         turn: int, progress: Progress, route: bool = False,
                         compact: bool = False) -> Message:
        def on_progress(env: Envelope) -> None:
            body = env.body
            if isinstance(body, Delta):
                progress(inputs.Delta(body.text, body.channel))
            elif isinstance(body, Retrying):  # that attempt's text is void (see RETRY)
                progress(inputs.Retry(body.attempt, body.error, body.wait_s,
                                      body.stall_bound_s))

        if route:  # the router's small request, not the session's history: no delta
            router = self.config.router
            routed = LlmJob(request, stream, attempts=router.attempts, timeout_s=router.timeout_s)
            # Its reply is a word for the loop, not text for the user: no TOKEN events.
            reply = await self._job("llm", routed, session, router.timeout_s + 10.0,
                                    lambda env: None)
            return priced(_model_reply(reply), self.config.prices)  # its cost, by `[prices]`
        if compact:  # a summary request: not the session's history (no delta), no events
            summary = LlmJob(request, False)
            reply = await self._job("llm", summary, session, LLM_JOB_TIMEOUT_S, lambda env: None)
            return priced(_model_reply(reply), self.config.prices)
        job = session.turn_cache.llm_job(session.id, request, stream)
        reply = await self._job("llm", job.full, session, LLM_JOB_TIMEOUT_S, on_progress,
                                for_worker=job.for_caller)
        body = reply.body
        if isinstance(body, JobFailed) and body.error == HISTORY_MISS:
            session.turn_cache.forget_callers()  # that caller lost its copy: send in full
            reply = await self._job("llm", job.full, session, LLM_JOB_TIMEOUT_S, on_progress,
                                    for_worker=job.for_caller)
        return priced(_model_reply(reply), self.config.prices)  # its cost, by `[prices]`

    async def count_tokens(self, session: Session, request: dict[str, Any]) -> int | None:
        """The request's tokens as the model's server counts them (an llm caller's
        `count` job), or None if it cannot say (the caller keeps its estimate)."""
        try:
            reply = await self._job("llm", LlmJob(request, False, count=True), session,
                                    COUNT_JOB_TIMEOUT_S, lambda env: None)
            usage = _model_reply(reply).get("usage") or {}
        except ModelError:
            return None
        tokens = usage.get("input_tokens") if isinstance(usage, dict) else None
        return tokens if isinstance(tokens, int) and tokens > 0 else None

    async def run_tool(self, session: Session, call: ToolCall, *, timeout_s: float) -> ToolOutcome:
        if call.name == ASK_TOOL and self.asker.peers:
            return await self._ask(session, call)
        job = ToolJob(call.name, call.input, session.cwd, timeout_s,
                      list(session.agent.read_paths), session.agent.name, call.id)
        machine = self.tool_machine(session)
        # The executor enforces `timeout_s`; the margin covers a wedged executor.
        try:
            reply = await self._job("tool", job, session, timeout_s + 10.0,
                                    self._tool_messages(session, call), machine=machine)
        except ModelError as exc:
            return ToolOutcome(f"{exc.error}: {exc.message}", True, machine=machine)
        finally:
            self.elicits.call_over(session, call.id)
        return self._tool_outcome(call, reply, machine)

    def expect(self, session: Session, call: ToolCall, grace_s: float) -> None:
        """A resumed run waits for its call in flight at the restart: an executor that
        still runs it reports it within `grace_s` (`adopt_tool` takes it), else the
        call was interrupted. Called as the run resumes, before any worker is heard."""
        machine = self.tool_machine(session, call.name)
        if call.name == ASK_TOOL and self.asker.peers:
            return  # (run here, in the supervisor: it died with it)
        until = asyncio.get_running_loop().time() + grace_s
        self._adopting[(session.id, call.id)] = (
            self.dispatcher.expect(session.id, call.id, machine), until)

    async def adopt_tool(self, session: Session, call: ToolCall, *,
                         timeout_s: float) -> ToolOutcome:
        """The outcome of a call in flight at the restart, from the executor that still
        runs it (its progress, output and questions as before); "interrupted" if none
        reported it in time (never run again)."""
        machine = self.tool_machine(session, call.name)
        waiting = self._adopting.pop((session.id, call.id), None)
        if waiting is None:
            self.elicits.abandoned(session, call.id)
            return ToolOutcome(INTERRUPTED, True, machine=machine)
        adopted, until = waiting
        try:
            async with asyncio.timeout_at(until):
                job = await adopted
        except TimeoutError:
            log.warning("session %s: no executor reported call %s: interrupted", session.id,
                        call.id)
            self.elicits.abandoned(session, call.id)
            return ToolOutcome(INTERRUPTED, True, machine=machine)
        except BaseException:
            self.elicits.abandoned(session, call.id)  # (cancelled: the run has ended)
            raise
        finally:
            self.dispatcher.unexpect(session.id, call.id)
        on_message = self._tool_messages(session, call)
        for env in job.early or ():  # (what came with the report, before this ran)
            on_message(env)
        job.on_progress, job.early = on_message, None
        try:
            async with asyncio.timeout(timeout_s + 10.0):
                reply = await job.future
        except TimeoutError:
            self.dispatcher.abort(job)
            return ToolOutcome(f"timeout: no tool reply within {timeout_s + 10.0:g} s", True,
                               machine=machine)
        except BaseException:
            self.dispatcher.abort(job)  # cancelled: stop the executor's side too
            raise
        finally:
            self.elicits.call_over(session, call.id)
        return self._tool_outcome(call, reply, machine)

    def _tool_messages(self, session: Session, call: ToolCall) -> Callable[[Envelope], None]:
        """What becomes of the messages of a tool job in flight: an MCP server's questions
        and model calls, what a command prints, its progress."""
        progressed = self._tool_progress(session, call.id)
        output = self._tool_output(session, call)

        def on_progress(env: Envelope) -> None:
            if isinstance(env.body, Elicit):  # an MCP server asks the user
                self.elicits.requested(session, call.id, env)
            elif isinstance(env.body, Sample):  # an MCP server asks for a model call
                self.samples.requested(session, call.id, env)
            elif isinstance(env.body, ToolOutput):  # what a running command prints
                output(env)
            else:
                progressed(env)

        return on_progress

    def _tool_outcome(self, call: ToolCall, reply: Envelope, machine: str) -> ToolOutcome:
        """A tool job's final reply as the call's outcome."""
        body = reply.body
        if isinstance(body, ToolResult):
            images, dropped = accepted(body.images)  # checked: the history carries them
            output = "\n".join([body.output, *dropped]) if dropped else body.output
            output = cut_result(output, self.config.limits.max_result_chars)
            return ToolOutcome(output, body.is_error, body.duration_ms, images, machine,
                               cut_result(body.shown, self.config.limits.max_result_chars))
        if isinstance(body, JobFailed) and body.error in MACHINE_ERRORS:
            # "machine B lost ...", "machine B has no executor connected": said as is.
            return ToolOutcome(body.message, True, machine=machine)
        if isinstance(body, JobFailed):
            return ToolOutcome(f"{call.name} failed: {body.message}", True, machine=machine)
        return ToolOutcome(f"{call.name}: unexpected reply {reply.kind}", True, machine=machine)

    def _tool_progress(self, session: Session, call_id: str) -> Callable[[Envelope], None]:
        """A tool job's `ToolProgress` as the session's `TOOL_PROGRESS` event (only while
        the run that made the call is open: nothing may follow its terminal event)."""
        driver = session.driver

        def on_progress(env: Envelope) -> None:
            body = env.body
            if (isinstance(body, ToolProgress) and session.driver is driver
                    and driver is not None and not session.run_over):
                self.emit(session, EventType.TOOL_PROGRESS, session.run_turn, {
                    "call_id": call_id, "progress": body.progress,
                    "total": body.total or None, "message": body.message})

        return on_progress

    async def sample(self, session: Session, request: dict[str, Any],
                     wait_s: float) -> dict[str, Any]:
        """A model call an MCP server asked for, priced; raises `ModelError`."""
        reply = await self._job("llm", llm_job(request, wait_s), session, wait_s,
                                lambda env: None)
        return priced(reply_of(reply), self.config.prices)

    def _tool_output(self, session: Session, call: ToolCall) -> Callable[[Envelope], None]:
        """What becomes of a tool job's `ToolOutput`s: `TOOL_OUTPUT {call_id, stream, text}`
        events (`cut`: the last, past the call's bound), while the call's run is open."""
        driver = session.driver
        bound = HostBound()

        def on_progress(env: Envelope) -> None:
            body = env.body
            # Only while this run is open: nothing may follow its terminal event.
            if (not isinstance(body, ToolOutput) or driver is None
                    or session.driver is not driver or session.run_over):
                return
            admitted = bound.admit(body.stream, body.text, body.cut)
            if admitted is None:
                return
            text, cut = admitted
            data: dict[str, Any] = {"call_id": call.id, "stream": body.stream, "text": text}
            if cut:
                data["cut"] = True
            self.emit(session, EventType.TOOL_OUTPUT, session.run_turn, data)

        return on_progress

    async def _ask(self, session: Session, call: ToolCall) -> ToolOutcome:
        """`ask_machine`, run here (it talks to another host; nothing to sandbox): the
        remote run's events become `MACHINE_EVENT`s of this session as they come. Its
        timeout is the peer's `timeout_s`, not the agent's tool timeout."""
        driver = session.driver

        def emit(data: dict[str, Any]) -> None:
            # Only while this run is open: nothing may follow its terminal event.
            if session.driver is driver and driver is not None and not session.run_over:
                self.emit(session, EventType.MACHINE_EVENT, session.run_turn, data)

        # The asked host's run continues this call's trace (when both hosts trace).
        trace = self.trace_context
        traceparent = trace(session.id, call.id) if trace is not None else ""
        started = time.perf_counter()
        output, is_error = await self.asker.ask(call.input, call.id, emit, traceparent)
        return ToolOutcome(output, is_error, round((time.perf_counter() - started) * 1000, 3),
                           machine=LOCAL)

    async def _job(self, role: str, body: Any, session: Session, timeout_s: float,
                   progress: Any, for_worker: Any = None, machine: str | None = None) -> Envelope:
        dispatcher = self.dispatcher
        # The session's deadline bounds its jobs too, so workers can plan for it
        # (the llm caller falls back to a non-streaming call close to it).
        deadline = time.time() + timeout_s
        if session.deadline:  # (the run's own timer ends the run: no second timeout here)
            deadline = min(deadline, session.deadline)
        # A model call carries its span's context: the llm caller sends it to the model's
        # server (`traceparent`), so a traced gateway there joins the run's trace.
        trace = self.trace_context
        traceparent = trace(session.id, "") if trace is not None and role == "llm" else ""
        try:
            job = dispatcher.submit(role, body, sid=session.id, deadline=deadline,
                                    on_progress=progress, for_worker=for_worker,
                                    machine=machine, traceparent=traceparent)
        except NoCapacity as exc:
            raise ModelError("busy", str(exc)) from exc
        future = job.future
        tick = self._expiry.add(future, timeout_s)
        try:
            reply = await future
        except BaseException:
            dispatcher.abort(job)  # cancelled: stop the worker's side too
            raise
        finally:
            self._expiry.remove(tick, future)
        if reply is _EXPIRED:
            dispatcher.abort(job)
            raise ModelError("timeout", f"no {role} reply within {timeout_s:g} s")
        return reply
