"""The worker side of the work protocol, shared by llm callers and executors.

A worker connects a DEALER to the supervisor's `work` socket and another to its
`control` socket (served first). It says `Ready`, beats every second, runs each
job as its own task, and answers `Abort` by cancelling that task (or at once,
for a job it does not hold). Every job gets exactly one final reply: one that
cannot go on the wire is replaced by a `JobFailed` naming why, so no job holds
its slot in the supervisor for ever. When the
supervisor goes silent for three beats (or says `Disconnect`) it says `Ready`
again, which is how workers survive a supervisor restart. An llm caller then drops
the jobs it held (the supervisor makes those model calls again); an executor
(`adopts`) keeps its tool jobs running and lists them in that `Ready`, with the
results of those that ended meanwhile (kept, and sent again after it): the new
supervisor adopts what a resumed run still waits for and aborts the rest.

A worker on its way out (asked to stop, or its host died) never announces itself: a
`Ready` then would offer a supervisor jobs that are being torn down. A host's own
worker whose host died leaves without a word: that supervisor is stopping too, and
a goodbye would have it write off the calls in hand ("executor left") just before it
stops, where the next host's resume answers them "interrupted".
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import sys
import time
from abc import ABC, abstractmethod
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import zmq

from actors import runtime
from actors.machines import EXIT_MACHINE_REFUSED, EXIT_REFUSED
from actors.runtime import notify_ready
from bus.codec import MAX_FRAME_BYTES, encode
from bus.endpoints import Endpoints
from bus.errors import Backpressure, BadFrame, BusError
from bus.heartbeat import INTERVAL_S, Liveness
from bus.messages import (
    Abort,
    Body,
    ControlHello,
    Disconnect,
    ElicitAnswer,
    Envelope,
    ErrorReply,
    ForgetSessions,
    Heartbeat,
    JobFailed,
    LlmResult,
    PromptResult,
    Ready,
    SampleAnswer,
    ToolResult,
)
from bus.sockets import Reactor

log = logging.getLogger("oploop.worker")

_SUPERVISOR = "supervisor"

#: Final replies kept for another try while the work socket's queue is full; beyond
#: this many the oldest is given up (and logged): the supervisor times its job out.
MAX_UNSENT_REPLIES = 1024
#: Ids of jobs answered as aborted before they arrived (an Abort can overtake its job:
#: control and work are two sockets); such a job is refused when it comes.
MAX_ABORTED_UNSEEN = 4096
#: How much of a failed encoding's explanation a `JobFailed` repeats.
_DETAIL_CHARS = 300
#: A final reply of an adopting worker is kept until the supervisor has been heard
#: this long after it went (alive then, it read and journaled it): one that went to a
#: supervisor dying meanwhile is sent again to the next (`Ready.running`).
KEEP_S = 3 * INTERVAL_S
#: Final replies kept so at most, and their frames' bytes (the oldest go first, logged).
#: A busy executor answers ~600 calls a second: at 1,024, the replies of its last 1.7 s
#: were kept, under `KEEP_S`, and every reply logged one dropped.
MAX_KEPT = 8192
MAX_KEPT_BYTES = 64 << 20
#: Replies dropped from the kept ones are logged at most once in this many seconds.
KEPT_LOG_S = 10.0

_FINAL = (LlmResult, ToolResult, PromptResult, JobFailed)
#: What the supervisor sends for a job in flight (not a job): `Worker.job_message`.
JOB_MESSAGES = (ElicitAnswer, SampleAnswer)


#: How long a worker elsewhere waits for the host to accept its `Ready` before it
#: says it is ready anyway (the host may be down: libzmq keeps connecting).
ACCEPT_WAIT_S = 5.0


class WorkerRefused(Exception):
    """The host refused this worker: its key (at the handshake, `why` empty), or the
    machine it names (the supervisor's `ErrorReply`, `why` says): nothing it can do
    will be accepted."""

    def __init__(self, address: str, why: str = "") -> None:
        super().__init__(f"the host at {address} refused this worker: {why}" if why
                         else f"the host at {address} refused this worker's key")
        self.address = address
        self.why = why


class Worker(ABC):
    """A stateless, interchangeable worker of one `role`."""

    role: str = ""
    capacity: int = 1
    #: Whether its jobs outlive a supervisor: on announcing itself again it keeps
    #: them and reports them (`Ready.running`) instead of abandoning them. Executors
    #: do (a tool is never run twice: its call waits for this run's result); llm
    #: callers do not (a model call is simply made again).
    adopts: bool = False
    #: Largest final reply sent; a larger one is a `JobFailed("oversize")` instead.
    max_reply_bytes: int = MAX_FRAME_BYTES

    def __init__(self, endpoints: Endpoints) -> None:
        self.endpoints = endpoints
        #: The worker machine this worker runs on, said in `Ready` (`OPLOOP_MACHINE`;
        #: "" for the host's own workers). Set before `serve`.
        self.machine = ""
        self.worker_id = f"{self.role}-{os.getpid()}-{os.urandom(2).hex()}"
        self.reactor = Reactor()
        ident = self.worker_id.encode()
        self.control = self.reactor.add(
            zmq.DEALER, "control", self._on_control, connect=endpoints.address("control"),
            secure=endpoints.client_side("control"), priority=True, routing_id=ident + b".ctl",
        )
        #: Set when the host refuses this worker's key (a worker elsewhere, over CURVE),
        #: or the machine it names (`why`).
        self.refused = asyncio.Event()
        self.why = ""
        #: Set at the first word of the supervisor after a `Ready` that is no refusal.
        self.accepted = asyncio.Event()
        #: A worker elsewhere says it is ready once accepted (`ACCEPT_WAIT_S` at most).
        self._wait_accept = endpoints.remote
        # The handshakes are watched from before the connect: a refusal that came before
        # the watch began (libzmq's thread is quick, ours descheduled on a busy machine)
        # went unseen, and the refused worker retried forever instead of stopping.
        watch = self._on_handshake if endpoints.curve and endpoints.remote else None
        self.work = self.reactor.add(
            zmq.DEALER, "work", self._on_work, connect=endpoints.address("work"),
            secure=endpoints.client_side("work"), routing_id=ident, on_handshake=watch,
        )
        self.jobs: dict[str, asyncio.Task[None]] = {}
        #: The envelope of each job in hand (what `Ready.running` reports of it).
        self._job_envs: dict[str, Envelope] = {}
        #: An adopting worker's final replies not yet known to be read: job id ->
        #: (reply, the call it answers, when it went), oldest first (`KEEP_S`).
        self._kept: OrderedDict[str, tuple[Envelope, str, float, int]] = OrderedDict()
        self._kept_bytes = 0
        self._kept_dropped = 0  # (dropped since the last line that said so)
        self._kept_logged_at = -KEPT_LOG_S
        #: When the supervisor was last heard (time.monotonic()).
        self._heard_at = 0.0
        self._liveness: Liveness[str] = Liveness()
        self._aborted: set[str] = set()
        #: Jobs aborted before they arrived (see MAX_ABORTED_UNSEEN), oldest first.
        self._aborted_unseen: OrderedDict[str, None] = OrderedDict()
        #: Final replies the work socket refused for a full queue, retried every beat.
        self._unsent: deque[Envelope] = deque()
        #: What this turn of the loop sends on `work`, in order (`_post`).
        self._outbox: list[tuple[Envelope, bytes]] = []
        #: Every message on `work` is numbered (its envelope id); the supervisor's
        #: `Disconnect` carries the number of the message it answers.
        self._sent = itertools.count(1)
        self._ready_no = 0  # the number of our latest Ready
        self._group: asyncio.TaskGroup | None = None
        #: Whether this process is on its way out (asked to stop, or its host died:
        #: `runtime.stopping`); set `_leaving` too once `serve` unwinds.
        self.stopping: Callable[[], bool] = runtime.stopping
        self._leaving = False
        #: Whether the supervisor's host died: this worker's own host, for a worker of
        #: the host (`runtime.host_gone`); a worker elsewhere cannot tell (its parent is
        #: `oploop worker`), and its supervisor lives on when it goes.
        self.host_gone: Callable[[], bool] = (
            (lambda: False) if endpoints.remote else runtime.host_gone)

    # -- what a role provides ----------------------------------------------------------

    def tools(self) -> list[dict[str, Any]]:
        """Tool specs this worker advertises in `Ready` (executors only)."""
        return []

    async def prepare(self) -> None:
        """What must be done before the first `Ready` (an executor's MCP servers listing
        their tools); the reactor and the role's own tasks run meanwhile."""
        return None

    def job_message(self, env: Envelope) -> None:
        """A message from the supervisor for job `env.job` in flight (`JOB_MESSAGES`: an
        executor's answer to a server's question); none by default."""
        log.debug("%s: %s for job %s ignored", self.worker_id, env.kind, env.job)

    @abstractmethod
    async def perform(self, env: Envelope) -> Body:
        """Do the job in `env`; return the final reply body. May `self.progress(...)`."""

    def forget_sessions(self, sids: list[str]) -> None:
        """The supervisor holds the sessions `sids` no more (`ForgetSessions`): drop what
        is kept of them between jobs. Nothing, unless a role keeps something (the llm
        caller: their histories)."""
        return  # (nothing is kept between jobs by default)

    # -- protocol ----------------------------------------------------------------------

    def send(self, body: Body, job: str = "", sid: str = "") -> int:
        """Send `body` to the supervisor on the work socket; returns the message's number.

        A final reply (result or failure) is never dropped silently: one that cannot
        be encoded (a lone surrogate, a type msgpack refuses) or is over the frame
        limit goes as a `JobFailed` naming the cause, so the job's slot is freed; one
        refused for a full queue is retried every beat. Anything else that cannot go
        (a heartbeat, a delta) is logged and dropped.
        """
        number = next(self._sent)
        env = Envelope(body, id=str(number), job=job, sid=sid)
        try:
            frame = encode(env)
            if len(frame) > self.max_reply_bytes and isinstance(body, _FINAL):
                raise BadFrame("oversize", f"{len(frame)} bytes > {self.max_reply_bytes}",
                               body.KIND)
            self._keep(env, len(frame))
        except BadFrame as exc:
            log.error("%s: %s of job %s cannot be sent: %s", self.worker_id, body.KIND,
                      job or "-", exc)
            if isinstance(body, _FINAL):
                self._send_final(unsendable(body, exc), number, job, sid)
            return number
        self._post(env, frame)
        return number

    def _post(self, env: Envelope, frame: bytes) -> None:
        """Send `frame` (`env` encoded) with the others of this turn of the loop, once it
        is over: the replies of the jobs that ended in one turn go in one burst, which
        libzmq's I/O threads (here and the supervisor's) take in one wake-up."""
        self._outbox.append((env, frame))
        if len(self._outbox) == 1:
            try:
                asyncio.get_running_loop().call_soon(self._send_out)
            except RuntimeError:  # no loop running (a test, a stop): no turn to wait for
                self._send_out()

    def _send_out(self) -> None:
        """Send what `_post` holds, in order. A final reply the socket refuses (its queue
        full) is retried every beat; anything else that cannot go is logged and dropped."""
        out, self._outbox = self._outbox, []
        for env, frame in out:
            body = env.body
            try:
                self.work.send_frame(frame)
            except Backpressure as exc:
                if isinstance(body, _FINAL):
                    self._keep_unsent(env)
                else:
                    log.warning("%s: could not send %s: %s", self.worker_id, body.KIND, exc)
            except BusError as exc:
                log.warning("%s: could not send %s: %s", self.worker_id, body.KIND, exc)

    def _send_final(self, body: JobFailed, number: int, job: str, sid: str) -> None:
        """Send the `JobFailed` standing in for an unsendable reply (small: it encodes)."""
        env = Envelope(body, id=str(number), job=job, sid=sid)
        self._keep(env, 1024)  # (a JobFailed: small)
        self._post(env, encode(env))  # (after what went before it)

    def _keep(self, env: Envelope, size: int) -> None:
        """Keep an adopting worker's final reply to a call (`_kept`), in case the
        supervisor it goes to dies before journaling it (an abort's is not kept)."""
        body = env.body
        if not self.adopts or not isinstance(body, _FINAL) or not env.job or (
                isinstance(body, JobFailed) and body.error == "aborted"):
            return
        sent = self._job_envs.get(env.job)
        call = getattr(sent.body, "call_id", "") if sent is not None else ""
        if not call:
            return
        old = self._kept.pop(env.job, None)
        self._kept_bytes += size - (old[3] if old is not None else 0)
        self._kept[env.job] = (env, call, time.monotonic(), size)
        while len(self._kept) > MAX_KEPT or self._kept_bytes > MAX_KEPT_BYTES:
            lost, (_, _, _, lost_size) = self._kept.popitem(last=False)
            self._kept_bytes -= lost_size
            self._kept_dropped += 1
            now = time.monotonic()
            if now - self._kept_logged_at >= KEPT_LOG_S:  # (one line, not one per reply)
                log.warning("%s: %d repl%s no longer kept, the last for job %s (%d newer "
                            "ones, %d bytes, are)", self.worker_id, self._kept_dropped,
                            "y" if self._kept_dropped == 1 else "ies", lost,
                            len(self._kept), self._kept_bytes)
                self._kept_dropped, self._kept_logged_at = 0, now

    def _prune_kept(self) -> None:
        """Forget the kept replies the supervisor was alive to read (heard `KEEP_S`
        after they went)."""
        heard = self._heard_at
        while self._kept:
            jid, (_, _, sent_at, size) = next(iter(self._kept.items()))
            if sent_at + KEEP_S > heard:
                return
            del self._kept[jid]
            self._kept_bytes -= size

    def _running(self) -> list[dict[str, Any]]:
        """`Ready.running`: the calls in hand, and those whose kept reply follows."""
        running = [{"job": jid, "sid": env.sid, "call": getattr(env.body, "call_id", ""),
                    "done": False} for jid, env in self._job_envs.items()
                   if getattr(env.body, "call_id", "") and jid not in self._aborted]
        running += [{"job": jid, "sid": env.sid, "call": call, "done": True}
                    for jid, (env, call, _, _) in self._kept.items()
                    if jid not in self._job_envs]
        return running

    def _keep_unsent(self, env: Envelope) -> None:
        if len(self._unsent) >= MAX_UNSENT_REPLIES:
            lost = self._unsent.popleft()
            log.error("%s: reply to job %s given up: %d replies wait for the socket",
                      self.worker_id, lost.job, MAX_UNSENT_REPLIES)
        self._unsent.append(env)

    def _retry_unsent(self) -> None:
        """Send the replies a full queue refused, in order, until it refuses again."""
        while self._unsent:
            try:
                self.work.send(self._unsent[0])
            except Backpressure:
                return
            except BusError as exc:
                log.warning("%s: reply to job %s not sent: %s", self.worker_id,
                            self._unsent[0].job, exc)
            self._unsent.popleft()

    def progress(self, env: Envelope, body: Body) -> None:
        """Send an intermediate message (delta, retrying) for the job of `env`."""
        self.send(body, job=env.job, sid=env.sid)

    def leaving(self) -> bool:
        """Whether this worker is on its way out (`serve` unwinding, asked to stop, or
        its host died): then it never announces itself again."""
        return self._leaving or self.stopping()

    def _say_ready(self) -> None:
        if self.leaving():
            # Its jobs are being torn down with it (never to be adopted), and the
            # supervisor that would register it may be a new host's.
            log.info("%s: on its way out: not announcing itself", self.worker_id)
            return
        # The supervisor has written those jobs off already (an adopting worker's replies
        # to calls are kept: sent again after the Ready).
        dropped = [e for e in self._unsent if e.job not in self._kept]
        if dropped:
            log.warning("%s: %d unsent replies dropped: announcing again",
                        self.worker_id, len(dropped))
        self._unsent.clear()
        running = self._running() if self.adopts else []
        self._ready_no = self.send(Ready(self.role, self.capacity, self.tools(), self.machine,
                                         running))
        self._send_out()  # (now: the Ready goes before the kept replies sent after it)
        with contextlib.suppress(BusError):
            self.control.send(Envelope(ControlHello(self.worker_id)))
        if running:
            log.warning("%s: announced again with %d job(s) in hand", self.worker_id,
                        len(running))
            for env, _, _, _ in list(self._kept.values()):
                with contextlib.suppress(BusError):  # (kept: the next Ready sends it again)
                    self.work.send(env)
            self.announced_again()

    def announced_again(self) -> None:
        """After a `Ready` listing jobs in hand: what a role sends again for them (an
        executor's questions still waiting for an answer); nothing by default."""
        return None

    def _announce_again(self) -> None:
        """The supervisor does not know us (it restarted, or declared us dead): announce
        ourselves again. The jobs we hold are abandoned, unless we adopt: then they go
        on, reported in the `Ready` (the supervisor aborts those nobody waits for).
        Not on its way out (`leaving`): what it holds ends with it."""
        if self.leaving():
            log.info("%s: on its way out: not announcing itself again", self.worker_id)
            return
        if self.adopts:
            self._abandon_jobs(lambda env: not getattr(env.body, "call_id", ""))
        else:
            self._abandon_jobs()
        self._say_ready()

    def _on_handshake(self, refusal: str | None) -> None:
        if refusal is not None:
            log.error("%s: the host at %s %s: is OPLOOP_KEYS a folder issued for a worker "
                      "(oploop keys add NAME --role worker), and not revoked?",
                      self.worker_id, self.endpoints.address("work"), refusal)
            self.refused.set()

    async def _until_refused(self) -> None:
        await self.refused.wait()
        raise WorkerRefused(self.endpoints.address("work"), self.why)

    async def _notify_when_accepted(self) -> None:
        """Say ready once the host accepted us (a worker elsewhere), so that a refused
        one never looks as if it served; a host that does not answer yet (down, or
        the link) gets `ACCEPT_WAIT_S`, then we say ready and keep trying."""
        if self._wait_accept:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(ACCEPT_WAIT_S):
                    await self.accepted.wait()
            if self.refused.is_set():
                return
        notify_ready()

    def _on_control(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        self._liveness.heard(_SUPERVISOR)
        self._heard_at = time.monotonic()
        if isinstance(env.body, Abort):
            task = self.jobs.get(env.job)
            if task is not None:
                self._aborted.add(env.job)
                task.cancel()
            elif env.job and env.job not in self._aborted:
                self._acknowledge_unknown(env)

    def _acknowledge_unknown(self, env: Envelope) -> None:
        """Answer an Abort for a job we do not hold, so the supervisor frees its slot.

        The job is over here (its reply went, or was lost) or has not arrived yet
        (the Abort overtook it): remembered, so that it is refused if it comes.
        """
        self._aborted_unseen[env.job] = None
        if len(self._aborted_unseen) > MAX_ABORTED_UNSEEN:
            self._aborted_unseen.popitem(last=False)
        self.send(JobFailed("aborted", "job aborted (not running on this worker)"),
                  job=env.job, sid=env.sid)

    def _on_work(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        self._liveness.heard(_SUPERVISOR)
        self._heard_at = time.monotonic()
        body = env.body
        if isinstance(body, Abort):  # a job we reported that no run waits for
            self._on_control(peer, env, frame)
            return
        if isinstance(body, ErrorReply):
            if body.code == "refused":  # dispatch.REFUSED: the machine we name is not ours
                log.error("%s: the host refused this worker: %s", self.worker_id,
                          body.message)
                self.why = body.message
                self.refused.set()
            return
        if isinstance(body, Heartbeat):
            self.accepted.set()  # the supervisor beats only for workers it registered
            return
        if isinstance(body, Disconnect):
            if self._answers_an_old_message(env.id):
                # It was sent before our latest Ready reached the supervisor (we had
                # noticed its silence and announced ourselves meanwhile): that Ready is
                # the answer. Another would have it write off jobs it sends us meanwhile.
                return
            # The supervisor does not know us (it restarted, or declared us dead).
            self._announce_again()
            return
        self.accepted.set()
        if isinstance(body, ForgetSessions):
            self.forget_sessions(body.sessions)
            return
        if isinstance(body, JOB_MESSAGES):
            self.job_message(env)
            return
        if env.job in self.jobs:
            log.warning("%s: duplicate job %s ignored", self.worker_id, env.job)
            return
        if env.job in self._aborted_unseen:
            log.info("%s: job %s came after its Abort: not run", self.worker_id, env.job)
            return
        assert self._group is not None
        task = self._group.create_task(self._run_job(env), name=f"job-{env.job}")
        self.jobs[env.job] = task
        self._job_envs[env.job] = env
        task.add_done_callback(lambda done: self._job_done(env, done))

    def _job_done(self, env: Envelope, task: asyncio.Task[None]) -> None:
        """A job task that ended without answering: it was cancelled before its first
        step (an Abort right after the job), so `_run_job` never ran. Answer for it."""
        if self.jobs.get(env.job) is not task:
            return  # `_run_job` answered (and forgot the job) itself
        del self.jobs[env.job]
        self._job_envs.pop(env.job, None)
        if env.job in self._aborted:
            self._aborted.discard(env.job)
            self.send(JobFailed("aborted", "job aborted"), job=env.job, sid=env.sid)

    def _answers_an_old_message(self, answered: str) -> bool:
        """Whether a `Disconnect` answering our message number `answered` predates
        our latest Ready (no number: we cannot tell, so it does not)."""
        try:
            return int(answered) < self._ready_no
        except ValueError:
            return False

    def _abandon_jobs(self, which: Callable[[Envelope], bool] | None = None) -> None:
        """Cancel every job in hand (`which`: those it accepts), each ending as an
        aborted one."""
        jobs = [(jid, task) for jid, task in self.jobs.items()
                if which is None or which(self._job_envs[jid])]
        if jobs:
            log.warning("%s: abandoning %d job(s) the supervisor has forgotten",
                        self.worker_id, len(jobs))
        for jid, task in jobs:
            self._aborted.add(jid)
            task.cancel()

    async def _run_job(self, env: Envelope) -> None:
        try:
            reply = await self.perform(env)
        except asyncio.CancelledError:
            self.jobs.pop(env.job, None)
            self._job_envs.pop(env.job, None)
            if env.job not in self._aborted:
                raise  # the worker is shutting down
            # An Abort cancels this job only, not the worker: report and carry on.
            self._aborted.discard(env.job)
            self.send(JobFailed("aborted", "job aborted"), job=env.job, sid=env.sid)
            return
        except Exception as exc:  # the RPC edge: a failed job is a reply, never a crash
            log.exception("%s: job %s failed", self.worker_id, env.job)
            reply = JobFailed("internal", f"{type(exc).__name__}: {exc}")
        self.send(reply, job=env.job, sid=env.sid)  # (kept first, while the job is known)
        self.jobs.pop(env.job, None)
        self._job_envs.pop(env.job, None)

    async def _beat(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asleep = loop.time()
            await asyncio.sleep(INTERVAL_S)
            late = loop.time() - asleep - INTERVAL_S
            self.send(Heartbeat())
            self._retry_unsent()
            self._prune_kept()
            # After a stall of this process (its loop busy with a job's huge result, or
            # its cores with others) the supervisor's beats wait unread in the socket:
            # judge its silence only at a beat on time, once the reactor has read them.
            if late < INTERVAL_S and self._liveness.expired():
                log.info("%s: supervisor silent, announcing again", self.worker_id)
                self._liveness.heard(_SUPERVISOR)
                self._announce_again()  # it has declared us dead (or it restarted)

    async def serve(self) -> None:
        """Serve until cancelled; on the way out tell the supervisor and close."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                group.create_task(self.reactor.run(), name="reactor")
                await self.prepare()
                self._liveness.heard(_SUPERVISOR)
                self._say_ready()
                group.create_task(self._notify_when_accepted(), name="ready")
                group.create_task(self._beat(), name="heartbeat")
                group.create_task(self._until_refused(), name="refusal")
        except* WorkerRefused as refused:
            # A status of its own, so a supervising `oploop worker` stops (not restarts).
            print(f"oploop {self.role} worker: {refused.exceptions[0]}", file=sys.stderr,
                  flush=True)
            raise SystemExit(EXIT_MACHINE_REFUSED if self.why else EXIT_REFUSED) from None
        finally:
            self._leaving = True
            self._send_out()  # (what the last turn sent goes, as it would have at once)
            if self.host_gone():
                log.info("%s: the host died: leaving without a word", self.worker_id)
            else:  # (its calls in hand fail at once, "executor left", never run again)
                with contextlib.suppress(BusError):
                    self.work.send(Envelope(Disconnect()))
            self.reactor.close()


def unsendable(body: Body, exc: BadFrame) -> JobFailed:
    """The `JobFailed` sent instead of a reply that cannot go on the wire.

    `error` is the codec's reason (`unencodable`, `oversize`); the message says
    what was refused and why, so the model and the operator can tell.
    """
    # The detail may quote the offending text: keep it encodable, and short.
    detail = exc.detail[:_DETAIL_CHARS].encode("utf-8", "backslashreplace").decode("utf-8")
    what = "the tool's result" if isinstance(body, ToolResult) else f"the {body.KIND} reply"
    return JobFailed(exc.reason, f"{what} cannot be sent: {exc.reason}: {detail}")
