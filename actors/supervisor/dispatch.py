"""Job dispatch to workers (Majordomo style) and their liveness (Paranoid Pirate).

Workers announce a role, a capacity and their machine with `Ready`; a job goes
to the worker that took the session's last job of that role while it has a free
slot (its warm sandboxed reader, its copy of the history), else to the live worker
of its role with the most free slots, or waits in a bounded queue. A job may be
bound to one machine (a session's `target_machine`: its tool calls run there and
nowhere else): it waits in that machine's queue, and fails at once when the machine
has no worker of its role connected. (The queues, the matching and the sending are
`jobqueues.py`'s `JobQueues`, the `Dispatcher`'s base.)
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
import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from actors.machines import LOCAL, machine_of
from actors.supervisor.adoption import adopt, reported
from actors.supervisor.catalogue import Catalogue, mcp_servers, valid_specs
from actors.supervisor.jobqueues import ROLES, JobQueues, no_worker, unassign
from actors.supervisor.jobstate import Job, WorkerState
from actors.supervisor.machines import Machines, ip_of, machine_problem
from bus.errors import Backpressure, BusError, PeerGone
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

#: A model call whose llm caller died is re-issued this many times, then failed: a
#: job that kills every worker it lands on must not go round them for ever. Six
#: attempts in all, as many as a model call gets for its own failures.
MAX_REDISPATCH = 5
#: Unknown peers remembered as already asked to re-announce (then forgotten: at
#: worst one of them is asked twice).
MAX_TOLD = 10_000

#: How often the supervisor looks for silent workers: a few times per heartbeat, so
#: that a lost machine is told within 3 heartbeats and a quarter, not 4.
EXPIRY_CHECKS_PER_BEAT = 4


class Dispatcher(JobQueues):
    """Owns the workers of the `work` socket and every job sent to them (queued,
    matched and sent as its base, `JobQueues`, does)."""

    def __init__(self, work: Port, control: Port, max_redispatch: int = MAX_REDISPATCH) -> None:
        super().__init__(work)
        self.control = control
        self.max_redispatch = max_redispatch
        self.machines = Machines()
        self.liveness: Liveness[bytes] = Liveness()
        self.catalogue = Catalogue()
        #: Set whenever the executors' tools change (`Catalogue.event`).
        self.catalogue_changed = self.catalogue.event
        self.aborts_acked = 0
        self._told: set[bytes] = set()  # unknown peers already asked to re-announce
        #: Names of worker keys that may serve unnamed, as `local` (`[network]
        #: local_worker_keys`); any other worker key serves only the machine it names.
        self.local_worker_keys: frozenset[str] = frozenset()
        #: Calls in flight that resumed runs wait to adopt: (session, call id) -> (the
        #: machine they ran on, the future the adopted job is given to).
        self.expected: dict[tuple[str, str], tuple[str, asyncio.Future[Job]]] = {}
        #: Whether the host we run under has died (`runtime.host_gone`; never, by
        #: default), and what to do then: stop, as its death signal will have us do.
        self.host_gone: Callable[[], bool] = lambda: False
        self.on_host_gone: Callable[[], None] = lambda: None
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
            unassign(job, worker)
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
            self._finish(job, Envelope(no_worker(role, machine), job=job.id))

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


def _lost(worker: WorkerState, reason: str) -> JobFailed:
    """The failure of a job whose worker went away while it ran (never re-run)."""
    if worker.machine != LOCAL:
        return JobFailed("machine_lost", f"machine {worker.machine} lost ({reason})")
    what = "executor" if worker.role == "tool" else "llm caller"
    return JobFailed("worker_died", f"{what} {reason}")
