"""The dispatcher's outbox (`jobstate.Outbox`): the jobs matched in one turn of the loop
are sent together once it is over, in order; a job aborted, or whose worker went, before
that is never sent (its slot freed, the job waiting again for another worker); a worker
found unreachable then is dropped and its unsent jobs go to the others."""

from __future__ import annotations

import asyncio

from actors.supervisor.dispatch import Dispatcher
from actors.supervisor.jobstate import Job
from bus.codec import decode
from bus.errors import Closed, PeerGone
from bus.messages import Abort, Disconnect, Envelope, Ready, ToolJob, ToolResult


class Pipe:
    """The sending side of a `bus.sockets.Port` as the dispatcher uses it; `gone`: the
    peers whose sends fail as unroutable."""

    user_id = None
    peer_address = None

    def __init__(self) -> None:
        self.sent: list[tuple[Envelope, bytes | None]] = []
        self.gone: set[bytes] = set()
        self.closed = False

    def send(self, env: Envelope, peer: bytes | None = None) -> None:
        self.sent.append((env, peer))

    def send_frame(self, frame: bytes, peer: bytes | None = None) -> None:
        if self.closed:
            raise Closed("port work is closed")
        if peer in self.gone:
            raise PeerGone(peer or b"")
        self.sent.append((decode(frame), peer))


def executor(dispatcher: Dispatcher, peer: bytes, slots: int = 4) -> None:
    dispatcher.handle_work(peer, Envelope(Ready("tool", slots, [], "", []), id="1"), b"")


def submit(dispatcher: Dispatcher, call: str, sid: str = "s1") -> Job:
    return dispatcher.submit("tool", ToolJob("read_file", {"path": "x"}, call_id=call),
                             sid=sid, deadline=0.0, on_progress=lambda env: None)


def jobs_to(pipe: Pipe, peer: bytes) -> list[str]:
    return [env.job for env, to in pipe.sent if to == peer and isinstance(env.body, ToolJob)]


def test_the_jobs_of_a_turn_go_together_once_it_is_over_in_order() -> None:
    async def main() -> None:
        work = Pipe()
        dispatcher = Dispatcher(work, Pipe())  # type: ignore[arg-type]
        executor(dispatcher, b"ex")
        jobs = [submit(dispatcher, f"c{i}", sid=f"s{i}") for i in range(3)]
        assert jobs_to(work, b"ex") == [] and dispatcher.workers[b"ex"].free == 1  # not sent yet
        await asyncio.sleep(0)
        assert jobs_to(work, b"ex") == [j.id for j in jobs]
        dispatcher.handle_work(b"ex", Envelope(ToolResult("ok", False, 1.0), job=jobs[1].id),
                               b"")
        assert jobs[1].future.result().body.output == "ok"

    asyncio.run(main())


def test_a_job_aborted_before_it_went_is_never_sent_and_frees_its_slot() -> None:
    async def main() -> None:
        work, control = Pipe(), Pipe()
        dispatcher = Dispatcher(work, control)  # type: ignore[arg-type]
        executor(dispatcher, b"ex", slots=1)
        first, second = submit(dispatcher, "c1"), submit(dispatcher, "c2", sid="s2")
        dispatcher.abort(first)
        assert first.future.cancelled() and first.id not in dispatcher.jobs
        await asyncio.sleep(0)
        assert jobs_to(work, b"ex") == [second.id]  # (the slot went to the next job)
        assert control.sent == []  # nothing to abort on the worker: it never had it

    asyncio.run(main())


def test_a_worker_gone_before_its_jobs_went_leaves_them_to_another() -> None:
    async def main() -> None:
        work = Pipe()
        dispatcher = Dispatcher(work, Pipe())  # type: ignore[arg-type]
        executor(dispatcher, b"ex1")
        job = submit(dispatcher, "c1")
        assert job.worker == b"ex1"
        dispatcher.handle_work(b"ex1", Envelope(Disconnect(), id="2"), b"")  # it leaves
        assert not job.future.done()  # a tool job never sent is not lost: it waits
        executor(dispatcher, b"ex2")
        await asyncio.sleep(0)
        assert jobs_to(work, b"ex1") == [] and jobs_to(work, b"ex2") == [job.id]

    asyncio.run(main())


def test_a_worker_found_unreachable_is_dropped_and_its_jobs_go_to_the_others() -> None:
    async def main() -> None:
        work = Pipe()
        dispatcher = Dispatcher(work, Pipe())  # type: ignore[arg-type]
        executor(dispatcher, b"ex1", slots=1)
        executor(dispatcher, b"ex2", slots=1)
        a, b = submit(dispatcher, "c1", sid="s1"), submit(dispatcher, "c2", sid="s2")
        to_a = a.worker
        assert {a.worker, b.worker} == {b"ex1", b"ex2"}
        work.gone.add(to_a)  # type: ignore[arg-type]
        await asyncio.sleep(0)  # a's worker refuses: dropped; b went
        assert to_a not in dispatcher.workers and not a.future.done()
        other = b.worker
        assert jobs_to(work, other) == [b.id]  # type: ignore[arg-type]
        dispatcher.handle_work(other, Envelope(ToolResult("ok", False, 1.0), job=b.id), b"")
        await asyncio.sleep(0)  # the freed slot takes a
        assert jobs_to(work, other) == [b.id, a.id]  # type: ignore[arg-type]

    asyncio.run(main())


def test_jobs_matched_when_the_dispatcher_is_held_wait_for_the_release() -> None:
    async def main() -> None:
        work = Pipe()
        dispatcher = Dispatcher(work, Pipe())  # type: ignore[arg-type]
        executor(dispatcher, b"ex")
        job = submit(dispatcher, "c1")
        dispatcher.hold(True)  # (the store out of reach, in the same turn)
        await asyncio.sleep(0)
        assert jobs_to(work, b"ex") == [] and job.worker is None
        assert dispatcher.workers[b"ex"].free == 4
        dispatcher.hold(False)
        await asyncio.sleep(0)
        assert jobs_to(work, b"ex") == [job.id]
        assert not [env for env, _ in work.sent if isinstance(env.body, Abort)]

    asyncio.run(main())


def test_jobs_left_unsent_by_a_closed_socket_wait_again_without_an_error() -> None:
    async def main() -> None:
        work = Pipe()
        dispatcher = Dispatcher(work, Pipe())  # type: ignore[arg-type]
        executor(dispatcher, b"ex")
        job = submit(dispatcher, "c1")
        work.closed = True  # (the supervisor stopping)
        await asyncio.sleep(0)
        assert job.worker is None and not job.future.done()
        assert [j for q in dispatcher.queues.values() for j in q] == [job]

    asyncio.run(main())
