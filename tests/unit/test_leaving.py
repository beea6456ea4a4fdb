"""Workers on their way out, and a supervisor whose host died.

A host's death reaches all its actors at once (each one's death signal): an executor
stopping then must neither announce itself (`Ready`, offering its torn-down jobs to
whichever supervisor hears it) nor say goodbye, and the supervisor must not write off
the calls of a worker that went with the host ("executor left", journaled just before
it stops, where the next host's resume answers them "interrupted")."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

from actors.host.children import Child, stop_all
from actors.supervisor.dispatch import Dispatcher
from actors.worker import Worker
from bus.codec import decode
from bus.endpoints import Endpoints
from bus.messages import Body, Disconnect, Envelope, LlmResult, Ready, ToolJob


class Pipe:
    """The sending side of a `bus.sockets.Port`: what went, in order (both ways a
    worker or the dispatcher send)."""

    user_id = None
    peer_address = None

    def __init__(self) -> None:
        self.sent: list[Envelope] = []

    def send(self, env: Envelope, peer: bytes | None = None) -> None:
        self.sent.append(env)

    def send_frame(self, frame: bytes, peer: bytes | None = None) -> None:
        self.sent.append(decode(frame))

    def kinds(self) -> list[type[Body]]:
        return [type(env.body) for env in self.sent]


class Caller(Worker):
    """A worker doing nothing, with its pipes replaced by `Pipe`s."""

    role = "llm"

    def __init__(self, home: Path, *, stopping: bool = False, host_gone: bool = False) -> None:
        super().__init__(Endpoints.for_home(home))
        self.work, self.control = Pipe(), Pipe()  # type: ignore[assignment]
        self.stopping = lambda: stopping
        self.host_gone = lambda: host_gone

    async def perform(self, env: Envelope) -> Body:
        return LlmResult([], "end_turn", {})


def test_a_worker_on_its_way_out_never_announces_itself(tmp_path):
    live, going = Caller(tmp_path), Caller(tmp_path, stopping=True)
    for worker in (live, going):  # the supervisor does not know it (a new one, say)
        worker._on_work(None, Envelope(Disconnect(), id="7"), b"")
        worker._say_ready()
    assert live.work.kinds() == [Ready, Ready]  # type: ignore[attr-defined]
    assert going.work.kinds() == []  # type: ignore[attr-defined]
    assert going.control.kinds() == []  # type: ignore[attr-defined]  (no ControlHello)


def test_a_host_worker_whose_host_died_leaves_without_a_word(tmp_path):
    async def serve_then_stop(worker: Caller, host_dies: bool) -> list[type[Body]]:
        task = asyncio.create_task(worker.serve())
        while not worker.work.kinds():  # type: ignore[attr-defined]  (its first Ready)
            await asyncio.sleep(0.001)
        if host_dies:  # (its death signal is what stops the worker: `runtime.host_gone`)
            worker.host_gone = lambda: True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert worker.leaving()
        return worker.work.kinds()  # type: ignore[attr-defined]

    assert asyncio.run(serve_then_stop(Caller(tmp_path), False)) == [Ready, Disconnect]
    assert asyncio.run(serve_then_stop(Caller(tmp_path), True)) == [Ready]


async def _dispatcher_with_a_call(host_gone: bool) -> tuple[Dispatcher, Any, list[int]]:
    dispatcher = Dispatcher(Pipe(), Pipe())  # type: ignore[arg-type]
    stops: list[int] = []
    dispatcher.host_gone = lambda: host_gone
    dispatcher.on_host_gone = lambda: stops.append(1)
    dispatcher.handle_work(b"ex", Envelope(Ready("tool", 4, [], "", []), id="1"), b"")
    job = dispatcher.submit("tool", ToolJob("shell", {}, call_id="c1"), sid="s1",
                            deadline=0.0, on_progress=lambda env: None)
    await asyncio.sleep(0)  # (sent once the loop's turn is over: the executor has it)
    assert job.worker == b"ex" and not dispatcher.outbox
    return dispatcher, job, stops


def test_an_executor_leaving_while_the_host_lives_ends_its_calls_at_once():
    async def main() -> None:
        dispatcher, job, stops = await _dispatcher_with_a_call(host_gone=False)
        dispatcher.handle_work(b"ex", Envelope(Disconnect(), id="2"), b"")
        failed = job.future.result().body
        assert (failed.error, failed.message) == ("worker_died", "executor left")
        assert stops == []

    asyncio.run(main())


def test_a_worker_going_after_the_host_died_leaves_its_calls_and_the_supervisor_stops():
    async def main() -> None:
        dispatcher, job, stops = await _dispatcher_with_a_call(host_gone=True)
        dispatcher.handle_work(b"ex", Envelope(Disconnect(), id="2"), b"")
        assert not job.future.done()  # left to the next host's resume: "interrupted"
        assert stops == [1]
        assert b"ex" not in dispatcher.workers
        dispatcher.abort(job)  # (the run unwinding as the supervisor stops)
        assert job.id not in dispatcher.jobs

    asyncio.run(main())


_ACTOR = """
import os, signal, sys, time
log = sys.argv[1]
def note(what):
    with open(log, "a") as f:
        f.write(f"{sys.argv[2]} {what}\\n")
def stop(*_):
    note("told")
    time.sleep(0.2)  # (a stop that takes a while: the supervisor journaling)
    note("gone")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
note("up")
while True:
    time.sleep(1)
"""


def test_a_host_stops_its_supervisor_before_the_workers(tmp_path):
    """`oploop down`: the supervisor is gone before any executor is told to stop, so it
    never hears one leave with its calls (they are the next start's to resume)."""
    log = tmp_path / "log"

    async def main() -> None:
        children = [Child(name, "") for name in ("broadcaster", "executor-1", "supervisor")]
        for child in children:
            child.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", _ACTOR, str(log), child.name)
        while len(log.read_text().splitlines() if log.exists() else ()) < 3:
            await asyncio.sleep(0.01)  # (each has its SIGTERM handler)
        await stop_all(children, first=("supervisor",))
        assert [c.state for c in children] == ["stopped"] * 3

    asyncio.run(main())
    notes = log.read_text().splitlines()[3:]
    assert notes[:2] == ["supervisor told", "supervisor gone"], notes
    assert sorted(notes[2:]) == ["broadcaster gone", "broadcaster told",
                                 "executor-1 gone", "executor-1 told"]
