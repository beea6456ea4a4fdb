"""The run's driver: feeds what happens to `machine.step` and carries out its actions.

`machine.step` decides; this module does. A `RunDriver` holds one run's
`RunState`, turns each happening (a model reply, a streamed batch, a tool's
outcome, a cancel, a deadline, a bug) into an input, and carries out the
actions `step` returns: `Emit` (append the history additions, then publish
through `LoopIO.emit`), `CallModel` (build the request, call the model),
`RunToolCalls` (run the jobs, up to the agent's parallelism), `AbortJobs`
(cancel the task doing the run's work) and `End`. The supervisor (over its
workers, `supervisor/workerio.py`) and the in-process `Runner` (over a
backend and a tool catalogue, `actors/runner.py`) run every run through it.

The run's state is `Session.run`, one value: the driver steps it and puts the
new value back before carrying out any action, so the session log, which reads
the session when it journals an event, sees exactly the state the events fold to.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from typing import Any

from actors.bounds import cut_result
from actors.core.catalogue import resolve_tools
from actors.core.compaction import Build, budget, compact, request_builder
from actors.core.context import NEAR, result_cap, too_long
from actors.core.history import append_blocks
from actors.core.loopio import LoopIO, ModelError
from actors.core.machine import (
    AbortJobs,
    Begin,
    CallModel,
    Cancel,
    Decide,
    Emit,
    End,
    Failed,
    Input,
    ModelFailed,
    ModelReplied,
    Resume,
    Routed,
    RunState,
    RunToolCalls,
    Say,
    Start,
    ToolFinished,
    ToolJob,
    ToolStarted,
    step,
)
from actors.core.router import route_of, router_request
from actors.core.session import Session
from actors.core.state import Phase
from actors.core.turn import ToolCall
from actors.usage import of_reply
from bus.vocab import CancelMode

log = logging.getLogger("oploop.session")

#: (Bound once: a member looked up on its enum costs ~0.5 µs in Python 3.11.)
_READY, _TOOLS = Phase.READY, Phase.TOOLS

class RunDriver:
    """Drives one run of `session` through the machine (`start` or `resume`, then `run`).

    The driver of a session's open run is `session.driver` (cleared at the run's
    end); any other (a cancelled run still unwinding, a suspended one) is ignored:
    whatever it still reports cannot touch the session.
    """

    def __init__(self, session: Session, io: LoopIO) -> None:
        self.session = session
        self.io = io
        #: The run's state as this driver last stepped it: `session.run` while it is the
        #: session's driver (the same value, never a copy of its fields).
        self.state: RunState = session.run
        #: The work the machine asked for last (`CallModel`, `RunToolCalls`), not yet begun.
        self.work: CallModel | RunToolCalls | None = None
        #: The task carrying out the run's work (`run`), which `AbortJobs` cancels.
        self.task: asyncio.Task[Any] | None = None
        self._aborted = False
        self._timer: asyncio.TimerHandle | None = None
        #: Approvals: the timers of the calls waiting, the batch of tools running (new
        #: approved jobs join it), and the run loop waiting for a decision.
        self._ask_timers: dict[str, asyncio.TimerHandle] = {}
        self._batch: tuple[asyncio.TaskGroup, asyncio.Semaphore] | None = None
        self._wake: asyncio.Future[None] | None = None
        #: Who asked for a compaction before the next model call (`oploop compact`).
        self.compact_by = ""
        #: When each tool call in flight began (perf_counter): a cancel reports how
        #: long they ran.
        self._tool_t0: dict[str, float] = {}
        session.driver = self

    # -- inputs ------------------------------------------------------------------------

    def start(self, prompt: str, max_turns: int = 0, deadline_s: float = 0.0) -> None:
        """Open a run on `prompt`: `SESSION_START` goes out now, before any await (a run
        exists, and can be cancelled, from the moment it is accepted); its turns begin
        when `run` does."""
        session, config = self.session, self.io.config
        agent = session.agent
        deadline_s = deadline_s or agent.deadline_s
        # Before the event: the session log journals the absolute deadline with it.
        session.deadline = time.time() + deadline_s if deadline_s > 0 else 0.0
        self.feed(Start(prompt, max_turns or agent.max_turns, agent.name,
                        agent.model_id(config.aliases), deadline_s,
                        router=config.router.enabled, check=session.output_check,
                        rules=agent.permissions, approval_timeout_s=agent.approval_timeout_s,
                        cwd=session.cwd))

    def resume(self, reason: str, adopt: bool = False) -> None:
        """Go on with the open run a supervisor restart left (the session is its log's
        fold); `adopt`: its calls in flight may still run on their executors (waited
        for, `LoopIO.adopt_tool`, rather than interrupted)."""
        agent = self.session.agent
        self.feed(Resume(reason, router=self.io.config.router.enabled,
                         check=self.session.output_check, rules=agent.permissions,
                         approval_timeout_s=agent.approval_timeout_s, cwd=self.session.cwd,
                         adopt=adopt))

    def adopted_calls(self) -> list[ToolCall]:
        """The calls the run waits to adopt (after `resume` with `adopt`), not yet begun."""
        work = self.work
        if not isinstance(work, RunToolCalls):
            return []
        return [job.call for job in work.jobs if job.adopted]

    def cancel(self, mode: str, reason: str = "") -> None:
        """A cancel: "ui" and "deadline" end the run now, "operation" at the next boundary."""
        self.feed(Cancel(mode, reason))

    def say(self, text: str, by: str) -> None:
        """A user message into the open run: taken at its next boundary (`USER_MESSAGE`)."""
        self.feed(Say(text, by))
    def decide(self, call_id: str, decision: str, by: str, reason: str = "",
               always: bool = False) -> str | None:
        """Approve or deny the pending call `call_id` (`always`: and its tool's calls for
        the rest of the session); None if done, else why not (one line: decided
        already, or no such call waits)."""
        error = decision_error(self.session, self.state.asks, self.state.decided, call_id)
        if error is None:
            self.feed(Decide(call_id, decision, by, reason, always))
        return error

    def request_compaction(self, by: str) -> None:
        """Compact the session's view before the run's next model call (`oploop compact`
        while a run is open)."""
        self.compact_by = by

    def fail(self, error: str, message: str) -> None:
        """End the run now with `ERROR` (e.g. the session log cannot be written)."""
        self.feed(Failed(error, message))

    def feed(self, event: Input) -> None:
        """Step the machine on `event` and carry out its actions, in order."""
        session = self.session
        if session.driver is not self:
            return  # a newer run owns the session
        if isinstance(event, Cancel) and self._tool_t0 and not event.ran_ms:
            now = time.perf_counter()  # how long each call in flight has run, for its end
            event = dataclasses.replace(event, ran_ms=tuple(
                (cid, (now - t0) * 1000) for cid, t0 in self._tool_t0.items()))
        old = self.state
        state, actions = step(old, event)
        # First: the journal reads the session's run as the actions emit.
        self.state = session.run = state
        for action in actions:
            if isinstance(action, Emit):
                for role, added in action.added:
                    append_blocks(session.history, role, list(added))
                self.io.emit(session, action.type, action.turn, action.data)
            elif isinstance(action, RunToolCalls):
                self._queue(action)
            elif isinstance(action, CallModel):
                self.work = action
            elif isinstance(action, AbortJobs):
                self.work = None
                self._abort()
            elif isinstance(action, End):
                self.work = None
                self._disarm()
                self._abort()  # (from outside the run's task: nothing of it may go on)
                session.driver = None  # done: no cycle left for the collector
        if self.state.asks is not old.asks or self._ask_timers:
            self._arm_asks()

    def _queue(self, work: RunToolCalls) -> None:
        """Tool jobs to run: into the batch running now if there is one (an approved
        call need not wait for the others), else the run loop's next work."""
        if self._batch is not None:
            group, gate = self._batch
            try:
                for job in work.jobs:
                    group.create_task(self._gated(gate, job))
                return
            except RuntimeError:  # the batch has just finished: the loop runs them
                pass
        if isinstance(self.work, RunToolCalls):
            work = RunToolCalls(work.turn, self.work.jobs + work.jobs)
        self.work = work
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
    # -- carrying out ------------------------------------------------------------------

    async def run(self) -> None:
        """Carry out the run's work until its terminal event.

        Returns once the run has ended (an abort of its work included); a cancel of
        the calling task from outside ends the run as a "ui" cancel (unless the
        session is suspended: the next supervisor resumes it) and is re-raised.
        """
        self.task = asyncio.current_task()
        self._arm()
        self._arm_asks()
        try:
            if self.state.phase is _READY:
                self.feed(Begin())  # the turns (or the router) begin now
            while self.state.running and self.session.driver is self:
                work, self.work = self.work, None
                if work is None and self.state.asks:  # calls wait for a decision
                    self._wake = asyncio.get_running_loop().create_future()
                    try:
                        await self._wake
                    finally:
                        self._wake = None
                    continue
                if work is None:
                    raise RuntimeError(f"the run waits for nothing in phase {self.state.phase}")
                if isinstance(work, CallModel):
                    await self._call(work)
                else:
                    await self._tools(work)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._aborted and task is not None and task.uncancel() == 0:
                return  # only our own abort: the machine has ended the run
            if self.session.suspended:  # left open for the next supervisor: this driver
                self.session.driver = None  # is done (nothing late may add to the run)
            else:
                self.feed(Cancel(CancelMode.UI))
            raise
        except Exception as exc:  # the run's edge: a bug ends the run, not the host
            log.exception("session %s failed", self.session.id)
            self.feed(Failed("internal", f"{type(exc).__name__}: {exc}"))
        finally:
            self._disarm()
            self.task = None

    async def _call(self, work: CallModel) -> None:
        session, io = self.session, self.io
        config = io.config
        if work.route:  # the intent router: DIRECT (no tools) or AGENT
            request = router_request(session.history, config.router, session.id, config.aliases)
            try:
                reply = await io.call_model(session, request, stream=False, turn=0,
                                            progress=self.feed, route=True)
            except ModelError as exc:
                log.info("intent router failed (%s): AGENT", exc)
                self.feed(ModelFailed(exc.error, exc.message))
                return
            route, reason = route_of(reply)
            self.feed(Routed(route, of_reply(reply), reason))
            return
        agent = session.agent
        tools = [] if work.direct else resolve_tools(io.tool_catalogue(io.tool_machine(session)),
                                                     agent, work.turn,
                                                     config.hidden)
        build = request_builder(session, io, tools)
        sent = await self._fitted(build, work.turn)
        if sent is None:
            return  # (the run ended: it could not be made to fit)
        request, tokens = sent
        memo = session.context_memo
        try:
            memo.sent(session.history, self.state.context, tokens)
            reply = await io.call_model(session, request, stream=agent.streaming,
                                        turn=work.turn, progress=self.feed)
        except ModelError as exc:
            if not too_long(exc.error, exc.message, exc.status):
                self.feed(ModelFailed(exc.error, exc.message))
                return
            # Too long for the model after all (the estimate was short): compact and
            # try once more; a second refusal ends the run.
            log.info("session %s: %s: compacting and trying again", session.id, exc)
            real, allowed = _sizes_said(exc.message)
            sent = await self._compacted(build, real or tokens, "recovery", work.turn,
                                         scale=max(1.0, real / tokens) if real and tokens
                                         else 1.0, goal=allowed)
            if sent is None:
                return
            request, tokens = sent
            try:
                memo.sent(session.history, self.state.context, tokens)
                reply = await io.call_model(session, request, stream=agent.streaming,
                                            turn=work.turn, progress=self.feed)
            except ModelError as again:
                self.feed(ModelFailed(again.error, again.message))
                return
        memo.replied(reply.get("usage"))
        self.feed(ModelReplied(reply, frozenset([t["name"] for t in tools]), now=time.time()))

    async def _fitted(self, build: Build, turn: int) -> tuple[dict[str, Any], int] | None:
        """This turn's request and its size, compacted first if it reached the budget
        (or a compaction was asked for); None if the run ended instead."""
        session, io = self.session, self.io
        view = self.state.context
        request = build(view)
        tokens = session.context_memo.measure(session.history, view, request)
        limit = budget(session, io.config.aliases).limit
        if NEAR * limit <= tokens < limit:  # near: count exactly where the server can
            counted = await io.count_tokens(session, request)
            tokens = counted if counted else tokens
        by, self.compact_by = self.compact_by, ""
        if tokens < limit and not by:
            return request, tokens
        return await self._compacted(build, tokens, by or "budget", turn,
                                     summarise=bool(by))

    async def _compacted(self, build: Build, tokens: int, by: str, turn: int, *,
                         summarise: bool = False, scale: float = 1.0,
                         goal: int = 0) -> tuple[dict[str, Any], int] | None:
        """Compact (`COMPACTED`), then the request and its size; if it still does not fit
        the budget the run ends `ERROR` naming the sizes (never a second compaction). A
        recovery (`goal`: the size the API allows) may clear the latest results too."""
        session = self.session
        limits = budget(session, self.io.config.aliases)
        recovery = by == "recovery"
        goal = min(goal or limits.limit, limits.limit) if recovery else 0
        outcome = await compact(session, self.io, build, tokens, by=by,
                                keep=1 if recovery else 2, summarise=summarise or recovery,
                                turn=turn, scale=scale, goal=goal)
        if session.driver is not self or not self.state.running:
            return None
        if outcome.compacted is not None:
            self.feed(outcome.compacted)
        if outcome.tokens < (goal or limits.limit):
            return outcome.request, outcome.tokens
        why = f" ({outcome.note})" if outcome.note else ""
        self.feed(ModelFailed("context_full", (
            f"the request is still {outcome.tokens} tokens after compaction (from {tokens}): "
            f"over the budget of {limits.limit} ({session.agent.compact_at:g} of the "
            f"{limits.window}-token window){why}. The latest turn alone is too large: "
            f"`oploop compact {session.id}` clears every result and summarises the "
            "session, then a follow-up goes on from there")))
        return None

    async def _tools(self, work: RunToolCalls) -> None:
        agent = self.session.agent
        width = agent.max_parallel_tools if agent.parallel_tools else 1
        if (width <= 1 or len(work.jobs) == 1) and not self.state.asks:
            for job in work.jobs:
                await self._tool(job)
            return
        gate = asyncio.Semaphore(max(1, width))
        try:
            async with asyncio.TaskGroup() as group:
                self._batch = (group, gate)
                for job in work.jobs:
                    group.create_task(self._gated(gate, job))
        finally:
            self._batch = None

    async def _gated(self, gate: asyncio.Semaphore, job: ToolJob) -> None:
        async with gate:
            await self._tool(job)

    async def _tool(self, job: ToolJob) -> None:
        call = job.call
        if not job.adopted:  # (an adopted call started before the restart)
            self.feed(ToolStarted(call.id, self.io.tool_machine(self.session, call.name)))
        if self.state.phase is not _TOOLS or call.id not in self.state.started:
            return  # the run ended (or moved on): never start a tool for it
        self._tool_t0[call.id] = time.perf_counter()
        if job.refusal is not None:  # hidden or unknown: never run
            outcome = job.refusal
        elif job.adopted:
            outcome = await self.io.adopt_tool(self.session, call,
                                               timeout_s=self.session.agent.tool_timeout_s)
        else:
            outcome = await self.io.run_tool(self.session, call,
                                             timeout_s=self.session.agent.tool_timeout_s)
            cap = result_cap(budget(self.session, self.io.config.aliases).limit)
            if len(outcome.output) > cap:  # one result never fills the context alone
                outcome = dataclasses.replace(outcome, output=cut_result(outcome.output, cap))
        self._tool_t0.pop(call.id, None)
        self.feed(ToolFinished(call.id, outcome))

    def _abort(self) -> None:
        """Stop the run's work in flight: cancel the task doing it (not from inside it:
        there the run loop sees the run ended and returns)."""
        task = self.task
        if task is not None and not self._aborted and task is not asyncio.current_task():
            self._aborted = True
            task.cancel()

    def _arm(self) -> None:
        deadline = self.session.deadline
        if deadline and self.state.running and self._timer is None:
            loop = asyncio.get_running_loop()
            self._timer = loop.call_at(loop.time() + (deadline - time.time()), self._expired)

    def _expired(self) -> None:
        self._timer = None
        self.feed(Cancel(CancelMode.DEADLINE))

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for timer in self._ask_timers.values():
            timer.cancel()
        self._ask_timers.clear()

    def _arm_asks(self) -> None:
        """One timer per call waiting for approval (none once decided): at its
        `expires_at` it is denied, "approval timed out"."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # (armed when `run` begins)
        waiting = dict(self.state.asks) if self.state.running else {}
        for call_id in [c for c in self._ask_timers if c not in waiting]:
            self._ask_timers.pop(call_id).cancel()
        for call_id, expires in waiting.items():
            if call_id not in self._ask_timers:
                delay = max(0.0, expires - time.time())
                self._ask_timers[call_id] = loop.call_later(delay, self._ask_expired, call_id)

    def _ask_expired(self, call_id: str) -> None:
        self._ask_timers.pop(call_id, None)
        self.feed(Decide(call_id, "deny", "timeout", "approval timed out"))


def _sizes_said(message: str) -> tuple[int, int]:
    """The request's size and the model's maximum an API error names ("prompt is too
    long: N tokens > M maximum"), or zeros."""
    found = re.search(r"(\d+) tokens > (\d+)", message)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def decision_error(session: Session, asks: tuple[tuple[str, float], ...],
                   decided: tuple[tuple[str, str, str], ...] | list[Any],
                   call_id: str) -> str | None:
    """Why a decision on `call_id` cannot be taken (one line), or None if it waits."""
    if any(a[0] == call_id for a in asks):
        return None
    for d in decided:
        if d[0] == call_id:
            return f"call {call_id} was already decided by {d[2]} ({d[1]})"
    return f"no call {call_id} waits for approval in session {session.id}"


async def run_session(session: Session, io: LoopIO, prompt: str, max_turns: int = 0,
                      deadline_s: float = 0.0) -> None:
    """One run of `session` on `prompt`: every event from `SESSION_START` to the terminal one."""
    driver = RunDriver(session, io)
    driver.start(prompt, max_turns, deadline_s)
    await driver.run()
