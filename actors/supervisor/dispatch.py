"""Job dispatch to workers (Majordomo style) and their liveness (Paranoid Pirate).

Workers announce a role, a capacity and their machine with `Ready`; a job goes
to the worker that took the session's last job of that role while it has a free
slot (its warm sandboxed reader, its copy of the history), else to the live worker
of its role with the most free slots, or waits in a bounded queue. A job may be
bound to one machine (a session's `target_machine`: its tool calls run there and
nowhere else): it waits in that machine's queue, and fails at once when the machine
has no worker of its role connected.
A worker missing three heartbeats (or one we cannot route to) is dead: its
llm jobs are re-issued (model calls are idempotent), its tool jobs fail with
"executor died", or "machine NAME lost" for a worker machine's (tools have side
effects: never run one twice). Not once our host has died: a worker going then goes
with that host, and its calls are left to the next host's resume ("interrupted"), the
supervisor stopping at once (`host_gone`, `on_host_gone`).

Adoption: an executor announcing itself again lists the tool jobs it still holds
(`Ready.running`). A run a restart resumed waits for its calls in flight (`expect`); a
reported job of that session, call and machine becomes that call's job again (its
result and progress go to the run as if nothing happened); the others are aborted (or,
already over, their results dropped), each with a log line. A job of a worker that
re-announced itself, reported by it, simply goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
from collections import deque
from collections.abc import Callable
from typing import Any

from actors.machines import LOCAL, machine_of
from actors.supervisor.adoption import adopt, reported
from actors.supervisor.catalogue import Catalogue, mcp_servers, valid_specs
from actors.supervisor.jobstate import Job, NoCapacity, OnProgress, Outbox, WorkerState
from actors.supervisor.machines import Machines, ip_of, machine_problem
from bus.codec import encode
from bus.errors import Backpressure, BadFrame, BusError, PeerGone
from bus.heartbeat import INTERVAL_S, Liveness
from bus.mcpwire import Elicit, Sample
from bus.messages import (
    Abort,
    Body,
    ControlHello,
    Delta,
    Disconnect,
    Envelope,
    ErrorReply,
    Heartbeat,
    JobFailed,
    LlmResult,
    PromptResult,
    Ready,
    Retrying,
    ToolOutput,
    ToolProgress,
    ToolResult,
    ToolsChanged,
)
from bus.sockets import Port

log = logging.getLogger("oploop.dispatch")

#: `ErrorReply.code` to a worker whose `Ready` the supervisor refuses (its key may not
#: serve the machine it names): it stops, and says why.
REFUSED = "refused"

#: Jobs waiting for a free worker, per role, before new ones are refused.
MAX_QUEUED = 100_000
#: A model call whose llm caller died is re-issued this many times, then failed: a
#: job that kills every worker it lands on must not go round them for ever. Six
#: attempts in all, as many as a model call gets for its own failures.
MAX_REDISPATCH = 5
#: Unknown peers remembered as already asked to re-announce (then forgotten: at
#: worst one of them is asked twice).
MAX_TOLD = 10_000

ROLES = ("llm", "tool")

#: (role, session) pairs whose last worker is remembered (the least recently used go first).
MAX_STICKY = 4_096

#: How often the supervisor looks for silent workers: a few times per heartbeat, so
#: that a lost machine is told within 3 heartbeats and a quarter, not 4.
EXPIRY_CHECKS_PER_BEAT = 4

class Dispatcher:
    """Owns the workers of the `work` socket and every job sent to them."""

    def __init__(self, work: Port, control: Port, max_redispatch: int = MAX_REDISPATCH) -> None:
        self.work = work
        self.control = control
        self.max_redispatch = max_redispatch
        self.workers: dict[bytes, WorkerState] = {}
        self.jobs: dict[str, Job] = {}
        #: Waiting jobs by (role, machine); machine None: any worker of the role.
        self.queues: dict[tuple[str, str | None], deque[Job]] = {
            (role, None): deque() for role in ROLES}
        self.machines = Machines()
        self.liveness: Liveness[bytes] = Liveness()
        self.catalogue = Catalogue()
        #: Set whenever the executors' tools change (`Catalogue.event`).
        self.catalogue_changed = self.catalogue.event
        self._ids = itertools.count(1)
        self.aborts_acked = 0
        self._told: set[bytes] = set()  # unknown peers already asked to re-announce
        #: Names of worker keys that may serve unnamed, as `local` (`[network]
        #: local_worker_keys`); any other worker key serves only the machine it names.
        self.local_worker_keys: frozenset[str] = frozenset()
        self._prefix = f"j{os.getpid():x}."
        #: (role, session) -> the worker that took the session's last job of that role.
        #: Its next job goes there again while that worker has a free slot and none of
        #: the session's jobs in flight (parallel calls of one reply spread): an executor
        #: keeps the session's sandboxed reader warm (a read on it ~0.1 ms, a fresh one
        #: a fork server round trip and ~3 ms), an llm caller holds the session's history
        #: as of its last call (the job is a delta against it, not against what the
        #: caller held two or more calls ago, nor a full send).
        self._sticky: dict[tuple[str, str], bytes] = {}
        #: New jobs wait in their queues, none sent (the store is out of reach: the
        #: sessions wait for it, `supervisor/outage.py`).
        self.held = False
        #: Jobs matched and encoded, sent together at the end of the loop's turn.
        self.outbox = Outbox()
        #: Whether events emitted wait for their commit (the supervisor's session log;
        #: never, by default): jobs other than model calls (and model calls sent with
        #: them) then wait in the outbox for `send_out(committed=True)`, which the commit
        #: makes (`Supervisor._flush`), and `commit_soon` is asked for it. A tool job never
        #: leaves before its `TOOL_START` is in the log, whatever the order of the loop's
        #: callbacks.
        self.uncommitted: Callable[[], bool] = lambda: False
        self.commit_soon: Callable[[], None] = lambda: None
        self._send_due = False  # (`_send_out` is scheduled)
        #: Calls in flight that resumed runs wait to adopt: (session, call id) -> (the
        #: machine they ran on, the future the adopted job is given to).
        self.expected: dict[tuple[str, str], tuple[str, asyncio.Future[Job]]] = {}
        #: Whether the host we run under has died (`runtime.host_gone`; never, by
        #: default), and what to do then: stop, as its death signal will have us do.
        self.host_gone: Callable[[], bool] = lambda: False
        self.on_host_gone: Callable[[], None] = lambda: None

    def hold(self, held: bool) -> None:
        """Hold every new job in its queue (`held`), or send what waits again."""
        self.held = held
        if held:
            self.send_out()  # (held: what the outbox holds waits again in its queues)
        else:
            for key in list(self.queues):
                self._send_jobs(key)

    # -- submitting --------------------------------------------------------------------

    def submit(self, role: str, body: Body, *, sid: str, deadline: float,
               on_progress: OnProgress,
               for_worker: Callable[[bytes], Body] | None = None,
               machine: str | None = None, traceparent: str = "") -> Job:
        """Queue a job for a worker of `role`; await `job.future` for the final reply.

        `for_worker(worker_id)`, if given, makes the body sent to that worker.
        `machine`: only a worker of that machine may take it; a worker machine
        with no worker of `role` connected fails it at once (never elsewhere), while
        `LOCAL` jobs wait for the host to (re)start its own. `traceparent`: the trace
        context the job's envelope carries ("": none)."""
        key = (role, machine)
        if len(self.queues.get(key, ())) >= MAX_QUEUED:
            raise NoCapacity(f"{MAX_QUEUED} {role} jobs already waiting")
        jid = f"{self._prefix}{next(self._ids):x}"
        env = Envelope(body, id=jid, sid=sid, job=jid, deadline=deadline,
                       traceparent=traceparent)
        job = Job(jid, role, env, asyncio.get_running_loop().create_future(), on_progress,
                  for_worker=for_worker, machine=machine)
        if machine not in (None, LOCAL) and not self._serves(role, machine):
            # (no queue made for it: a name no worker has costs nothing to remember)
            job.future.set_result(Envelope(_absent(role, machine), job=jid))
            return job
        self.jobs[jid] = job
        self.queues.setdefault(key, deque()).append(job)
        self._send_jobs(key)
        return job

    def expect(self, sid: str, call_id: str, machine: str) -> asyncio.Future[Job]:
        """A resumed run waits for its call `call_id`, in flight on `machine` when the
        supervisor restarted: the future is given the job when an executor of that
        machine reports it (`Ready.running`). `unexpect` when the wait is over."""
        future: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
        self.expected[(sid, call_id)] = (machine, future)
        return future

    def unexpect(self, sid: str, call_id: str) -> None:
        """No run waits for call `call_id` of `sid` any more (a report of it is aborted)."""
        self.expected.pop((sid, call_id), None)

    def _serves(self, role: str, machine: str) -> bool:
        """Whether machine `machine` has a live worker of `role`."""
        return any(w.role == role and w.machine == machine for w in self.workers.values())

    def abort(self, job: Job) -> None:
        """Ask the job's worker to stop it now, over its control pipe; do not wait.

        The job's waiter is released at once; the worker keeps the slot until it
        acknowledges (its reply to an aborted job), so `statistics()` shows what
        is still being torn down and the slot is not handed out too early.
        """
        if job.aborted or self.jobs.get(job.id) is not job:
            return
        if not job.future.done():
            job.future.cancel()
        worker = self.workers.get(job.worker) if job.worker else None
        if worker is not None and self.outbox.drop(job):  # matched, not sent: nothing runs it
            _unassign(job, worker)
            self.jobs.pop(job.id, None)
            self._pump_for(worker)  # (its slot is free again)
            return
        if worker is None:  # still queued (or its worker is gone): nothing runs it
            self.jobs.pop(job.id, None)
            queue = self.queues.get(job.queue)
            if queue is not None and job in queue:
                queue.remove(job)
            return
        job.aborted = True
        target = worker.control_id
        try:
            if target is None:
                raise PeerGone("no control pipe yet")
            self.control.send(Envelope(Abort(), job=job.id, sid=job.env.sid), target)
        except BusError as exc:
            log.info("abort of %s not delivered (%s): freeing its slot", job.id, exc)
            self._acknowledged(job, worker)

    def _pump(self, key: tuple[str, str | None]) -> list[tuple[Job, WorkerState]]:
        """Match the jobs waiting in queue `key` (role, machine) to workers with free
        slots, taking the slots: the sends to make, in order (no I/O: `_send_jobs`
        makes them)."""
        role, machine = key
        queue = self.queues.get(key)
        sends: list[tuple[Job, WorkerState]] = []
        if self.held:
            return sends
        sticky = self._sticky
        while queue:
            job = queue[0]
            at = (role, job.env.sid)
            last = self.workers.get(sticky.get(at, b""))
            if last is not None and last.free > 0 and last.role == role and (
                    machine is None or last.machine == machine) and not self._busy_with(
                    last, job.env.sid):
                worker = last
            else:
                worker = max(
                    (w for w in self.workers.values() if w.role == role and w.free > 0
                     and (machine is None or w.machine == machine)),
                    key=lambda w: w.free, default=None,
                )
                if worker is None:
                    break
            queue.popleft()
            job.worker = worker.id
            job.dispatches += 1
            worker.take(job)
            sends.append((job, worker))
            sticky.pop(at, None)  # (re-inserted last: the least recently used go first)
            sticky[at] = worker.id
            if len(sticky) > MAX_STICKY:
                del sticky[next(iter(sticky))]
        return sends

    def _busy_with(self, worker: WorkerState, sid: str) -> bool:
        """Whether `worker` runs a job of session `sid` now (then the session's next job,
        a parallel call of the same reply, goes to the idlest worker instead)."""
        return sid in worker.sessions

    def _send_jobs(self, key: tuple[str, str | None]) -> None:
        """Encode what `_pump` matches in queue `key` into the outbox (`_send_out` sends
        it once this turn of the loop is over). A job no worker can take fails."""
        for job, worker in self._pump(key):
            env = job.env
            if job.for_worker is not None:
                env = env.with_body(job.for_worker(worker.id))
            try:
                frame = encode(env)
            except BadFrame as exc:
                # Unencodable or over the frame limit (a 17 MB tool input, a history
                # too large): no worker can take it. It fails; no slot was taken.
                _unassign(job, worker)
                log.warning("%s job %s cannot be sent: %s", job.role, job.id, exc)
                self._finish(job, Envelope(JobFailed(
                    exc.reason, f"the {env.kind} cannot be sent to a worker: {exc.detail}",
                ), job=job.id))
                continue
            if not self._send_due:  # (the outbox may hold jobs waiting for a commit)
                self._send_due = True
                asyncio.get_running_loop().call_soon(self._send_out)
            self.outbox.add(job, worker, frame)

    def _send_out(self) -> None:
        """The outbox's turn (scheduled by the first job into it): what may go now."""
        self._send_due = False
        committed = not self.uncommitted()
        self.send_out(committed)
        if not committed and self.outbox:  # tool jobs wait for the commit: have it now
            self.commit_soon()

    def send_out(self, committed: bool = True) -> None:
        """Send the outbox, in order: all of it once this turn's events are `committed`,
        else only if it holds model calls alone (`Outbox.take`). A worker found
        unreachable is dropped, and its jobs not yet sent wait again, first in their
        queues, for the others. Held (the store out of reach), every job waits again."""
        out = self.outbox.take(early=not committed)
        if self.held:
            self._requeue([(job, worker) for job, worker, _ in out])
            return
        dropped: set[bytes] = set()
        for at, (_, worker, frame) in enumerate(out):
            if worker.id in dropped:
                continue
            try:
                self.work.send_frame(frame, worker.id)
            except (PeerGone, Backpressure) as exc:
                dropped.add(worker.id)
                self._requeue([(j, w) for j, w, _ in out[at:] if w is worker])
                log.warning("worker %r unreachable (%s): dropping it", worker.id, exc)
                self._worker_died(worker.id)  # (its jobs go to the workers left)
            except BusError as exc:  # the socket closed: the supervisor is stopping
                log.info("%d job(s) not sent: %s", len(out) - at, exc)
                self._requeue([(j, w) for j, w, _ in out[at:] if w.id not in dropped])
                return

    def _requeue(self, unsent: list[tuple[Job, WorkerState]]) -> None:
        """Matched jobs that were not sent: their slots freed, first in their queues again
        (in the order they had)."""
        for job, worker in reversed(unsent):
            _unassign(job, worker)
            self.queues.setdefault(job.queue, deque()).appendleft(job)

    def _pump_for(self, worker: WorkerState) -> None:
        """Send waiting jobs `worker` could take: its machine's, then anyone's."""
        self._send_jobs((worker.role, worker.machine))
        self._send_jobs((worker.role, None))

    # -- what workers send -------------------------------------------------------------

    def handle_work(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        """A message on `work` from worker `peer`."""
        if peer is None:
            return
        self.liveness.heard(peer)
        body = env.body
        if isinstance(body, Ready):
            self._register(peer, body)
            return
        worker = self.workers.get(peer)
        if worker is None:
            if not isinstance(body, Disconnect) and peer not in self._told:
                # We do not know it (we restarted, or declared it dead): ask it to
                # re-announce, once: its queued messages must not each draw a
                # Disconnect, or it would answer with as many Readys.
                if len(self._told) >= MAX_TOLD:
                    self._told.clear()
                self._told.add(peer)
                # Its number tells the worker whether this predates its latest Ready.
                self._send_quiet(peer, Disconnect(), answering=env.id)
            return
        self.machines.heard(worker.machine)
        handler = _WORK.get(type(body))
        if handler is not None:
            handler(self, worker, env)

    def _on_heartbeat(self, worker: WorkerState, env: Envelope) -> None:
        pass  # (heard: that is all it says)

    def _on_tools_changed(self, worker: WorkerState, env: Envelope) -> None:
        assert isinstance(env.body, ToolsChanged)
        self.handle_tools_changed(worker, env.body)

    def _on_disconnect(self, worker: WorkerState, env: Envelope) -> None:
        self._worker_died(worker.id, reason="left")

    def _on_progress(self, worker: WorkerState, env: Envelope) -> None:
        """A streamed batch, a retry, a tool's progress or output, an MCP server's
        question or model call, of a job in flight (`Delta`, `Retrying`, `ToolProgress`,
        `ToolOutput`, `Elicit`, `Sample`)."""
        job = self.jobs.get(env.job)
        if job is not None and job.worker == worker.id and not job.aborted:
            job.on_progress(env)

    def _on_reply(self, worker: WorkerState, env: Envelope) -> None:
        """A job's final reply (`LlmResult`, `ToolResult`, `JobFailed`); of an aborted
        one, the acknowledgement that frees its slot."""
        job = self.jobs.get(env.job)
        if job is None or job.worker != worker.id:
            return  # late news of an aborted or re-issued job
        if job.aborted:
            self._acknowledged(job, worker)
            return
        self._finish(job, env)
        worker.give(job)
        self._pump_for(worker)

    def abort_session(self, sid: str) -> int:
        """Abort every job of session `sid`; returns how many."""
        jobs = [j for j in self.jobs.values() if j.env.sid == sid and not j.aborted]
        for job in jobs:
            self.abort(job)
        return len(jobs)

    def _acknowledged(self, job: Job, worker: WorkerState) -> None:
        """An aborted job is over on its worker: free the slot."""
        self.jobs.pop(job.id, None)
        worker.give(job)
        self.aborts_acked += 1
        self._pump_for(worker)

    def handle_control_hello(self, peer: bytes, hello: ControlHello) -> None:
        """Remember the control pipe of a worker."""
        worker = self.workers.get(hello.worker.encode())
        if worker is not None:
            worker.control_id = peer

    def _register(self, peer: bytes, ready: Ready) -> None:
        if ready.role not in ROLES or ready.capacity < 1:
            log.warning("worker %r announced bad role/capacity %r/%r", peer, ready.role,
                        ready.capacity)
            return
        problem = machine_problem(ready.machine, self.work.user_id,
                                  self.local_worker_keys)
        if problem is not None:
            # Not registered, and told why: it stops (`oploop worker` exits saying so).
            log.warning("worker %r refused: %s", peer, problem)
            self._send_quiet(peer, ErrorReply(REFUSED, problem))
            return
        self._told.discard(peer)
        old = self.workers.get(peer)
        running = reported(peer, ready.running) if ready.role == "tool" else []
        going_on: list[str] = []
        if old is not None:
            # Re-announced (it lost us for a while): the jobs it reports in hand go on;
            # whatever else it ran is lost with its state.
            for entry in running:
                job = self.jobs.get(entry["job"])
                if entry["job"] in old.inflight and job is not None and job.worker == peer:
                    old.inflight.discard(job.id)
                    going_on.append(job.id)
            self._worker_died(peer, reason="re-announced")
        worker = self.workers[peer] = WorkerState(
            peer, ready.role, ready.capacity, valid_specs(peer, ready.tools),
            control_id=peer + b".ctl", machine=machine_of(ready.machine))
        worker.inflight.update(going_on)
        self._adopt(worker, [e for e in running if e["job"] not in going_on])
        self.machines.joined(worker.machine, worker.role, peer.decode(errors="replace"),
                             ip_of(self.work.peer_address), self.work.user_id or "")
        log.info("worker %s ready: %s x%d on %s", peer.decode(errors="replace"), ready.role,
                 ready.capacity, worker.machine)
        self._send_quiet(peer, Heartbeat())  # accepted: a worker elsewhere waits for word
        if ready.role == "tool":
            self.catalogue.changed()
        self._pump_for(worker)

    def _adopt(self, worker: WorkerState, reported: list[dict[str, Any]]) -> None:
        """The jobs `worker` reports in hand: adopted by the runs that wait for them,
        or aborted (`adoption.adopt`)."""
        adopt(self.jobs, self.expected, self.work, worker, reported)

    def handle_tools_changed(self, worker: WorkerState, body: ToolsChanged) -> None:
        """An executor's tools changed (its MCP servers): `Catalogue.tools_changed`."""
        self.catalogue.tools_changed(worker, body)

    def mcp_servers(self) -> list[dict[str, Any]]:
        """The MCP servers of the live executors (`catalogue.mcp_servers`)."""
        return mcp_servers(self.workers.values())

    def _finish(self, job: Job, env: Envelope) -> None:
        self.jobs.pop(job.id, None)
        if not job.future.done():
            job.future.set_result(env)

    def _worker_died(self, peer: bytes, reason: str = "died") -> None:
        """Forget a worker; re-issue its llm jobs, fail its tool jobs (unless our host
        died: `_host_died`)."""
        worker = self.workers.pop(peer, None)
        self.liveness.forget(peer)
        if worker is None:
            return
        self._requeue(self.outbox.take_worker(peer))  # (never sent: they wait for another)
        if self.host_gone():
            self._host_died(worker, reason)
            return
        level = logging.INFO if reason == "left" and not worker.inflight else logging.WARNING
        log.log(level, "worker %s (%s) %s with %d job(s)", peer.decode(errors="replace"),
                worker.machine, reason, len(worker.inflight))
        self.machines.left(worker.machine, worker.role, peer.decode(errors="replace"),
                           "left" if reason in ("left", "re-announced") else "lost")
        for jid in list(worker.inflight):
            job = self.jobs.get(jid)
            if job is None:
                continue
            job.worker = None
            if job.aborted:  # its process died with it: the abort is complete
                self.jobs.pop(jid, None)
                continue
            if worker.role == "llm" and job.dispatches <= self.max_redispatch:
                job.on_progress(Envelope(
                    Retrying(job.dispatches, f"llm caller {reason}", 0.0), sid=job.env.sid, job=jid,
                ))
                self._rename(job)
                self.queues.setdefault(job.queue, deque()).appendleft(job)
            else:
                self._finish(job, Envelope(_lost(worker, reason), job=jid))
        if worker.role == "tool":
            self.catalogue.changed()
        # (a worker announcing itself again is back at once: what waits for it, waits)
        if (worker.machine != LOCAL and reason != "re-announced"
                and not self._serves(worker.role, worker.machine)):
            self._fail_waiting((worker.role, worker.machine))
        self._pump_for(worker)

    def _host_died(self, worker: WorkerState, reason: str) -> None:
        """`worker` went after our host died: it went with the host (its executor
        saying goodbye as it stops, or silent), and so do we. Its calls are not written
        off: a `TOOL_END` "executor left" journaled now would stand where the next
        host's resume answers them "interrupted" (never run again). They wait; we stop
        now (`on_host_gone`), leaving every run to that resume, as on our own SIGTERM."""
        log.warning("worker %s %s with %d job(s) after our host died: stopping, its calls "
                    "left to the next host's resume", worker.id.decode(errors="replace"),
                    reason, len(worker.inflight))
        self.on_host_gone()

    def _fail_waiting(self, key: tuple[str, str | None]) -> None:
        """Fail the jobs waiting for machine `key[1]`, which has no worker of their role
        left: they must not wait for it (nor ever run elsewhere)."""
        queue = self.queues.pop(key, None)
        role, machine = key
        while queue:
            job = queue.popleft()
            assert machine is not None
            self._finish(job, Envelope(_absent(role, machine), job=job.id))

    def _rename(self, job: Job) -> None:
        """Give a job about to be re-issued a new id. A worker declared dead may be
        alive (stalled, then back) and the job may go to it again: what it still
        sends about the first dispatch (deltas, "aborted") names the old id and is
        ignored, instead of being taken for news of the second."""
        self.jobs.pop(job.id, None)
        job.id = f"{self._prefix}{next(self._ids):x}"
        job.env = dataclasses.replace(job.env, id=job.id, job=job.id)
        self.jobs[job.id] = job

    def _send_quiet(self, peer: bytes, body: Body, answering: str = "") -> None:
        with contextlib.suppress(BusError):
            self.work.send(Envelope(body, id=answering), peer)

    # -- liveness ----------------------------------------------------------------------

    async def beat(self) -> None:
        """Every second: a heartbeat to each worker; a few times a second: declare the
        silent ones dead."""
        for tick in itertools.count(1):
            await asyncio.sleep(INTERVAL_S / EXPIRY_CHECKS_PER_BEAT)
            for peer in self.liveness.expired():
                self._worker_died(peer, reason="missed 3 heartbeats")
            if tick % EXPIRY_CHECKS_PER_BEAT:
                continue
            for peer in list(self.workers):
                try:
                    self.work.send(Envelope(Heartbeat()), peer)
                except (PeerGone, Backpressure):
                    self._worker_died(peer, reason="unreachable")
                except BusError:
                    pass

    def tool_specs(self, machine: str | None = None) -> list[dict[str, Any]]:
        """The union of the tools live executors (of `machine`, or of any) offer, first
        announcer's spec per name (`Catalogue.specs`)."""
        return self.catalogue.specs(self.workers.values(), machine)

    def statistics(self) -> dict[str, Any]:
        """Workers by role, jobs in flight, jobs waiting."""
        by_role: dict[str, int] = {role: 0 for role in ROLES}
        for w in self.workers.values():
            by_role[w.role] += 1
        waiting = sum(len(q) for q in self.queues.values())
        aborting = sum(1 for j in self.jobs.values() if j.aborted)
        by_queue: dict[str, int] = {role: 0 for role in ROLES}
        for (role, _), queue in self.queues.items():
            by_queue[role] += len(queue)
        return {
            "workers": by_role,
            "jobs_inflight": len(self.jobs) - waiting - aborting,
            "jobs_aborting": aborting,
            "aborts_acked": self.aborts_acked,
            "jobs_waiting": by_queue,
            "machines": self.machines.describe(),
        }

    def session_jobs(self, sid: str) -> int:
        """Jobs of session `sid` that a worker still holds or that wait for one."""
        return sum(1 for j in self.jobs.values() if j.env.sid == sid)


#: What a registered worker sends on `work`: body type -> the `Dispatcher` method.
_WORK: dict[type[Body], Callable[[Dispatcher, WorkerState, Envelope], None]] = {
    Heartbeat: Dispatcher._on_heartbeat,
    ToolsChanged: Dispatcher._on_tools_changed,
    Disconnect: Dispatcher._on_disconnect,
    Delta: Dispatcher._on_progress,
    Retrying: Dispatcher._on_progress,
    ToolProgress: Dispatcher._on_progress,
    Elicit: Dispatcher._on_progress,
    Sample: Dispatcher._on_progress,
    ToolOutput: Dispatcher._on_progress,
    LlmResult: Dispatcher._on_reply,
    ToolResult: Dispatcher._on_reply,
    JobFailed: Dispatcher._on_reply,
    PromptResult: Dispatcher._on_reply,
}


def _unassign(job: Job, worker: WorkerState) -> None:
    """Undo `_pump`'s match of `job` to `worker` (it was not sent)."""
    job.worker = None
    job.dispatches -= 1
    worker.give(job)


def _absent(role: str, machine: str) -> JobFailed:
    """The failure of a job bound to a machine with no worker of its role."""
    what = "executor" if role == "tool" else "llm caller"
    return JobFailed("no_worker", f"machine {machine} has no {what} connected")


def _lost(worker: WorkerState, reason: str) -> JobFailed:
    """The failure of a job whose worker went away while it ran (never re-run)."""
    if worker.machine != LOCAL:
        return JobFailed("machine_lost", f"machine {worker.machine} lost ({reason})")
    what = "executor" if worker.role == "tool" else "llm caller"
    return JobFailed("worker_died", f"{what} {reason}")
