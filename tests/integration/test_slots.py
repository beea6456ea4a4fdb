"""No job can lose its slot (issue 15 item 2).

A real executor process, with tools whose results cannot go on the wire, serves a
test playing the supervisor on real sockets: every slot is filled with each
failure kind, each answered by a `JobFailed` naming the cause, and a normal job
runs afterwards. An Abort for a job the worker does not hold is acknowledged.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import zmq
from hostkit import WAIT_S, until

from actors.executor.actor import Executor
from actors.supervisor.dispatch import Dispatcher, Job
from bus.codec import MAX_FRAME_BYTES, decode, encode
from bus.endpoints import Endpoints
from bus.heartbeat import INTERVAL_S, MISSES
from bus.messages import (
    Abort,
    Body,
    ControlHello,
    Envelope,
    Heartbeat,
    JobFailed,
    Ready,
    ToolJob,
    ToolResult,
)
from bus.sockets import Reactor

HERE = Path(__file__).parent
SLOTS = Executor.capacity
WAIT_MS = int(WAIT_S * 1000)  # bound on any one reply; never a pass/fail timing
#: The jobs' own timeout: no case here tests it, so it must not fire first on a busy
#: machine (a slot's worth of huge results at once took over 10 s with every core busy).
JOB_TIMEOUT_S = WAIT_S


class FakeSupervisor:
    """The supervisor's two ROUTER sockets, driven by hand."""

    def __init__(self, home: Path) -> None:
        endpoints = Endpoints.for_home(home)
        endpoints.run_dir.mkdir(parents=True, exist_ok=True)
        self.ctx = zmq.Context()
        self.work = self._router(endpoints.address("work"))
        self.control = self._router(endpoints.address("control"))
        self.worker = b""
        self.hello = False
        self.beaten = 0.0  # when we last sent the worker a Heartbeat
        self.worker_pid = 0  # the executor process serving us

    def _router(self, address: str) -> zmq.Socket[bytes]:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, -1)
        sock.bind(address)
        return sock

    def close(self) -> None:
        self.work.close(0)
        self.control.close(0)
        self.ctx.term()

    def recv(self) -> Envelope:
        """The next message from the worker other than a heartbeat (we beat meanwhile,
        every `heartbeat.INTERVAL_S` as the supervisor does, busy or not: a worker that
        hears nothing for three beats takes its supervisor for dead and says Ready again)."""
        poller = zmq.Poller()
        poller.register(self.work, zmq.POLLIN)
        poller.register(self.control, zmq.POLLIN)
        end = time.monotonic() + WAIT_MS / 1000
        while time.monotonic() < end:
            if self.worker and time.monotonic() - self.beaten >= INTERVAL_S:
                self.send(Heartbeat())
                self.beaten = time.monotonic()
            ready = dict(poller.poll(250))
            if not ready:
                continue
            sock = self.work if self.work in ready else self.control
            peer, frame = sock.recv_multipart()
            env = decode(frame)
            if isinstance(env.body, ControlHello):
                self.hello = True
                continue
            if isinstance(env.body, Heartbeat):
                continue
            self.worker = peer
            return env
        raise AssertionError("no message from the worker in time")

    def beat_for(self, seconds: float) -> None:
        """Beat the worker for `seconds`, as a live supervisor does, however quiet it is."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.send(Heartbeat())
            time.sleep(min(INTERVAL_S / 2, max(0.0, end - time.monotonic())))

    def send(self, body: Body, job: str = "") -> None:
        self.work.send_multipart([self.worker, encode(Envelope(body, job=job, sid="s"))])

    def abort(self, job: str) -> None:
        self.control.send_multipart([self.worker + b".ctl", encode(Envelope(Abort(), job=job,
                                                                      sid="s"))])

    def replies(self, count: int) -> dict[str, Body]:
        """The final replies to `count` jobs, by job id."""
        out: dict[str, Body] = {}
        while len(out) < count:
            env = self.recv()
            assert env.job and env.job not in out, env
            out[env.job] = env.body
        return out


def start_executor(home: Path) -> subprocess.Popen[bytes]:
    """The badtools executor process, serving the host endpoints of `home`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), str(HERE)])}
    return subprocess.Popen([sys.executable, str(HERE / "badtools.py"), str(home)], env=env)


@pytest.fixture
def supervised(short_home: str) -> Iterator[FakeSupervisor]:
    home = Path(short_home)
    sup = FakeSupervisor(home)
    proc = start_executor(home)
    sup.worker_pid = proc.pid
    try:
        ready = sup.recv()
        assert isinstance(ready.body, Ready) and ready.body.capacity == SLOTS
        if not sup.hello:  # its control pipe, for Aborts: known before the test sends any
            assert sup.control.poll(WAIT_MS), "no ControlHello"
            assert isinstance(decode(sup.control.recv_multipart()[1]).body, ControlHello)
        yield sup
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        sup.close()


def fill(sup: FakeSupervisor, tool: str, prefix: str, **data: object) -> dict[str, Body]:
    """Send one `tool` job per slot; their replies."""
    for n in range(SLOTS):
        sup.send(ToolJob(tool, dict(data), "/", JOB_TIMEOUT_S), job=f"{prefix}{n}")
    return sup.replies(SLOTS)


def assert_normal_call_runs(sup: FakeSupervisor, job: str) -> None:
    sup.send(ToolJob("echo", {"text": "still here"}, "/", JOB_TIMEOUT_S), job=job)
    reply = sup.replies(1)[job]
    assert isinstance(reply, ToolResult) and reply.output == "still here", reply


def test_unencodable_results_fail_their_jobs_and_free_every_slot(supervised) -> None:
    replies = fill(supervised, "surrogate", "u")
    for reply in replies.values():
        assert isinstance(reply, JobFailed) and reply.error == "unencodable", reply
        assert "the tool's result cannot be sent" in reply.message
        assert "surrogates not allowed" in reply.message
    assert_normal_call_runs(supervised, "after-unencodable")


def test_oversize_results_fail_their_jobs_and_free_every_slot(supervised) -> None:
    replies = fill(supervised, "huge", "o")
    for reply in replies.values():
        assert isinstance(reply, JobFailed) and reply.error == "oversize", reply
        assert "bytes >" in reply.message
    assert_normal_call_runs(supervised, "after-oversize")


def test_abort_of_a_job_the_worker_does_not_hold_is_acknowledged(supervised) -> None:
    # Jobs that are over (their reply went) and jobs never seen: every Abort answered.
    fill(supervised, "echo", "done", text="ok")
    for n in range(SLOTS):
        supervised.abort(f"done{n}")
        supervised.abort(f"never{n}")
    acks = supervised.replies(2 * SLOTS)
    assert all(isinstance(b, JobFailed) and b.error == "aborted" for b in acks.values())
    # A job its Abort overtook (two sockets) is not run when it comes: the normal
    # call sent after it is the next reply.
    supervised.send(ToolJob("echo", {"text": "must not run"}, "/", JOB_TIMEOUT_S), job="never0")
    assert_normal_call_runs(supervised, "after-aborts")


def test_aborted_running_jobs_are_acknowledged(supervised) -> None:
    for n in range(SLOTS):
        supervised.send(ToolJob("hang", {}, "/", JOB_TIMEOUT_S), job=f"h{n}")
        supervised.abort(f"h{n}")
    acks = supervised.replies(SLOTS)
    assert all(isinstance(b, JobFailed) and b.error == "aborted" for b in acks.values()), acks
    assert_normal_call_runs(supervised, "after-hang")


def test_a_worker_stalled_past_its_supervisors_silence_bound_carries_on(supervised) -> None:
    """A worker process stalled for longer than three beats (stopped here; starved of
    CPU on a busy machine) finds its supervisor's beats waiting in its socket when it
    resumes: it carries on, never taking the supervisor for dead (saying Ready again and
    abandoning every job in hand, as it did under load)."""
    os.kill(supervised.worker_pid, signal.SIGSTOP)
    try:  # (the stall is the subject: longer than the silence a worker tolerates)
        supervised.beat_for(MISSES * INTERVAL_S + 2)
    finally:
        os.kill(supervised.worker_pid, signal.SIGCONT)
    assert_normal_call_runs(supervised, "after-stall")  # its reply, no Ready before it


# --- the supervisor's side: the real Dispatcher, the same executor ---------------------


async def with_dispatcher(home: Path, body: Callable[[Dispatcher], Awaitable[None]]) -> None:
    """Run `body(dispatcher)` with a real Dispatcher serving the badtools executor."""
    endpoints = Endpoints.for_home(home)
    endpoints.run_dir.mkdir(parents=True, exist_ok=True)
    reactor = Reactor()
    box: list[Dispatcher] = []
    work = reactor.add(zmq.ROUTER, "work", lambda *a: box[0].handle_work(*a),
                       bind=endpoints.address("work"))

    def on_control(peer: bytes | None, env: Envelope, frame: bytes) -> None:
        if peer is not None and isinstance(env.body, ControlHello):
            box[0].handle_control_hello(peer, env.body)

    control = reactor.add(zmq.ROUTER, "control", on_control, bind=endpoints.address("control"))
    dispatcher = Dispatcher(work, control)
    box.append(dispatcher)
    proc = start_executor(home)
    serving = asyncio.get_running_loop().create_task(reactor.run())
    beating = asyncio.get_running_loop().create_task(dispatcher.beat())
    try:
        await until(lambda: any(w.role == "tool" and w.control_id for w in
                                dispatcher.workers.values()), "the executor's Ready")
        await body(dispatcher)
    finally:
        serving.cancel()
        beating.cancel()
        proc.terminate()
        await asyncio.to_thread(proc.wait, 30)
        reactor.close()


def submit(dispatcher: Dispatcher, tool: str, **data: object) -> Job:
    return dispatcher.submit("tool", ToolJob(tool, dict(data), "/", JOB_TIMEOUT_S), sid="s",
                             deadline=0.0, on_progress=lambda env: None)


def test_jobs_the_supervisor_cannot_send_fail_and_take_no_slot(short_home: str) -> None:
    async def body(dispatcher: Dispatcher) -> None:
        kinds = {"oversize": {"text": "x" * (MAX_FRAME_BYTES + 1)},
                 "unencodable": {"text": "caf\udce9"}}
        for error, data in kinds.items():
            jobs = [submit(dispatcher, "echo", **data) for _ in range(2 * SLOTS)]
            for job in jobs:
                reply = await asyncio.wait_for(job.future, WAIT_MS / 1000)
                assert isinstance(reply.body, JobFailed) and reply.body.error == error
                assert "the tool_job cannot be sent to a worker" in reply.body.message
            assert dispatcher.statistics()["jobs_inflight"] == 0
            assert all(w.free == SLOTS for w in dispatcher.workers.values())
        normal = await asyncio.wait_for(submit(dispatcher, "echo", text="fine").future,
                                        WAIT_MS / 1000)
        assert isinstance(normal.body, ToolResult) and normal.body.output == "fine"

    asyncio.run(with_dispatcher(Path(short_home), body))


def test_aborted_jobs_free_their_slots_through_the_real_dispatcher(short_home: str) -> None:
    async def body(dispatcher: Dispatcher) -> None:
        jobs = [submit(dispatcher, "hang") for _ in range(SLOTS)]
        # (sent: a job matched to a worker leaves with the others at the end of the turn)
        await until(lambda: all(j.worker for j in jobs) and not dispatcher.outbox,
                    "every slot taken")
        for job in jobs:
            dispatcher.abort(job)
        await until(lambda: dispatcher.statistics()["jobs_aborting"] == 0, "every abort acked")
        assert dispatcher.aborts_acked == SLOTS
        normal = await asyncio.wait_for(submit(dispatcher, "echo", text="fine").future,
                                        WAIT_MS / 1000)
        assert isinstance(normal.body, ToolResult) and normal.body.output == "fine"

    asyncio.run(with_dispatcher(Path(short_home), body))
