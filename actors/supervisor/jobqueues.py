"""The dispatcher's jobs: queued, matched to a worker's free slot, and sent.

A job goes to the worker that took the session's last job of that role while it has
a free slot (its warm sandboxed reader, its copy of the history), else to the live
worker of its role with the most free slots, or waits in a bounded queue (per role
and machine). Matching is plain state change (`_pump`); the sends it returns are
encoded into the `Outbox` and go out together once the loop's turn is over
(`send_out`), tool jobs only once the events emitted with them are committed.

Apart from `dispatch.py`, whose `Dispatcher` is these queues plus the workers' side:
their announcements, replies, aborts, heartbeats and deaths. `JobQueues` knows the
workers only as the slots they offer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import os
from collections import deque
from collections.abc import Callable

from actors.machines import LOCAL
from actors.supervisor.forgets import HistoryForgets
from actors.supervisor.jobstate import Job, NoCapacity, OnProgress, Outbox, WorkerState
from bus.codec import encode
from bus.errors import Backpressure, BadFrame, BusError, PeerGone
from bus.messages import Body, Envelope, ForgetSessions, JobFailed
from bus.sockets import Port

log = logging.getLogger("oploop.dispatch")

#: Jobs waiting for a free worker, per role, before new ones are refused.
MAX_QUEUED = 100_000

#: The roles a worker announces: llm callers (model calls) and executors (tool calls).
ROLES = ("llm", "tool")

#: (role, session) pairs whose last worker is remembered (the least recently used go first).
MAX_STICKY = 4_096


class JobQueues:
    """The jobs waiting for workers of the `work` socket, matched and sent (the
    `Dispatcher` adds the workers themselves: it keeps `workers` up to date)."""

    def __init__(self, work: Port) -> None:
        self.work = work
        self.workers: dict[bytes, WorkerState] = {}
        self.jobs: dict[str, Job] = {}
        #: Waiting jobs by (role, machine); machine None: any worker of the role.
        self.queues: dict[tuple[str, str | None], deque[Job]] = {
            (role, None): deque() for role in ROLES}
        self._ids = itertools.count(1)
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
        #: Sessions whose histories llm callers may drop (`forgets.py`).
        self.forgets = HistoryForgets(self._tell_forget)

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
            job.future.set_result(Envelope(no_worker(role, machine), job=jid))
            return job
        self.jobs[jid] = job
        self.queues.setdefault(key, deque()).append(job)
        self._send_jobs(key)
        return job

    def _serves(self, role: str, machine: str) -> bool:
        """Whether machine `machine` has a live worker of `role`."""
        return any(w.role == role and w.machine == machine for w in self.workers.values())

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
            if job.role == "llm":  # (a new run's call: what it sends there is kept)
                self.forgets.used(worker.id, env.sid)
            if job.for_worker is not None:
                env = env.with_body(job.for_worker(worker.id))
            try:
                frame = encode(env)
            except BadFrame as exc:
                # Unencodable or over the frame limit (a 17 MB tool input, a history
                # too large): no worker can take it. It fails; no slot was taken.
                unassign(job, worker)
                log.warning("%s job %s cannot be sent: %s", job.role, job.id, exc)
                self._finish(job, Envelope(JobFailed(
                    exc.reason, f"the {env.kind} cannot be sent to a worker: {exc.detail}",
                ), job=job.id))
                continue
            if not self._send_due:  # (the outbox may hold jobs waiting for a commit)
                self._send_due = True
                asyncio.get_running_loop().call_soon(self._send_out)
            self.outbox.add(job, worker, frame)

    def forget_history(self, sid: str, callers: list[bytes]) -> None:
        """Session `sid` left memory: `callers` may drop its history (`forgets.py`)."""
        if callers:
            self.forgets.later(sid, callers)

    def _tell_forget(self, caller: bytes, sids: list[str]) -> None:
        """Send `ForgetSessions(sids)` to `caller` if it is still one of the host's own llm
        callers; a caller that cannot be reached keeps its bounds."""
        worker = self.workers.get(caller)
        if worker is None or worker.role != "llm" or worker.machine != LOCAL:
            return
        try:
            self.work.send_frame(encode(Envelope(ForgetSessions(sids))), caller)
        except BusError as exc:
            log.info("llm caller %r not told to forget %d session(s): %s", caller,
                     len(sids), exc)

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
            unassign(job, worker)
            self.queues.setdefault(job.queue, deque()).appendleft(job)

    def _pump_for(self, worker: WorkerState) -> None:
        """Send waiting jobs `worker` could take: its machine's, then anyone's."""
        self._send_jobs((worker.role, worker.machine))
        self._send_jobs((worker.role, None))

    def _finish(self, job: Job, env: Envelope) -> None:
        self.jobs.pop(job.id, None)
        if not job.future.done():
            job.future.set_result(env)

    def _rename(self, job: Job) -> None:
        """Give a job about to be re-issued a new id. A worker declared dead may be
        alive (stalled, then back) and the job may go to it again: what it still
        sends about the first dispatch (deltas, "aborted") names the old id and is
        ignored, instead of being taken for news of the second."""
        self.jobs.pop(job.id, None)
        job.id = f"{self._prefix}{next(self._ids):x}"
        job.env = dataclasses.replace(job.env, id=job.id, job=job.id)
        self.jobs[job.id] = job

    def session_jobs(self, sid: str) -> int:
        """Jobs of session `sid` that a worker still holds or that wait for one."""
        return sum(1 for j in self.jobs.values() if j.env.sid == sid)

    def _worker_died(self, peer: bytes, reason: str = "died") -> None:
        """Forget worker `peer`, found unreachable by `send_out`, and settle its jobs
        (the `Dispatcher` does: the workers' side is its)."""
        raise NotImplementedError


def unassign(job: Job, worker: WorkerState) -> None:
    """Undo `_pump`'s match of `job` to `worker` (it was not sent)."""
    job.worker = None
    job.dispatches -= 1
    worker.give(job)


def no_worker(role: str, machine: str) -> JobFailed:
    """The failure of a job bound to a machine with no worker of its role."""
    what = "executor" if role == "tool" else "llm caller"
    return JobFailed("no_worker", f"machine {machine} has no {what} connected")
