"""Dispatch by machine (issue 20 item 2), on the real `Dispatcher` over real (inproc)
sockets, with workers played by hand: DEALER sockets saying `Ready` with a machine.

Model calls go to any llm caller and are re-issued on another when theirs goes;
tool calls go only to their machine's executors, fail at once when it has none,
and end "machine NAME lost" (never re-run) when it goes mid-call.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable

import zmq
from hostkit import until

from actors.supervisor.dispatch import Dispatcher, Job
from actors.tools.spec import ToolSpec
from bus.codec import decode, encode
from bus.messages import Disconnect, Envelope, JobFailed, LlmJob, Ready, Retrying, ToolJob
from bus.sockets import Reactor

WAIT_S = 30.0  # a bound on waits that went wrong, never a timing under test


class HandWorker:
    """A worker played by the test: a DEALER on the dispatcher's work socket."""

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], address: str, role: str,
                 machine: str = "", capacity: int = 1,
                 tools: list[dict[str, object]] | None = None) -> None:
        self.id = f"{role}-{machine or 'local'}-{secrets.token_hex(2)}".encode()
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.ROUTING_ID, self.id)
        self.sock.connect(address)
        self.sock.send(encode(Envelope(Ready(role, capacity, tools or [], machine), id="1")))

    async def job(self) -> Envelope:
        """The next job sent to this worker."""
        while True:
            await until(lambda: self.sock.poll(0), "a job for this worker", WAIT_S)
            env = decode(self.sock.recv())
            if isinstance(env.body, LlmJob | ToolJob):
                return env

    def leave(self) -> None:
        self.sock.send(encode(Envelope(Disconnect(), id="2")))

    def close(self) -> None:
        self.sock.close()


async def with_dispatcher(body: Callable[[Dispatcher, Callable[..., HandWorker]],
                                         Awaitable[None]]) -> None:
    reactor = Reactor()
    address = f"inproc://work-{secrets.token_hex(4)}"
    box: list[Dispatcher] = []
    work = reactor.add(zmq.ROUTER, "work", lambda *a: box[0].handle_work(*a), bind=address)
    control = reactor.add(zmq.ROUTER, "control", None, bind=f"{address}-control")
    dispatcher = Dispatcher(work, control)
    box.append(dispatcher)
    workers: list[HandWorker] = []

    def worker(role: str, machine: str = "", capacity: int = 1,
               tools: list[dict[str, object]] | None = None) -> HandWorker:
        made = HandWorker(reactor.ctx, address, role, machine, capacity, tools)
        workers.append(made)
        return made

    serving = asyncio.get_running_loop().create_task(reactor.run())
    try:
        await body(dispatcher, worker)
    finally:
        serving.cancel()
        for made in workers:
            made.close()
        reactor.close()


async def registered(dispatcher: Dispatcher, *workers: HandWorker) -> None:
    await until(lambda: all(w.id in dispatcher.workers for w in workers), "Ready", WAIT_S)


def tool(dispatcher: Dispatcher, machine: str) -> Job:
    return dispatcher.submit("tool", ToolJob("shell", {"command": "true"}), sid="s",
                             deadline=0.0, on_progress=lambda env: None, machine=machine)


def test_tool_calls_go_to_their_machine_only():
    async def body(dispatcher, worker):
        e = worker("tool", "E")
        await registered(dispatcher, e)
        local_job = tool(dispatcher, "local")
        e_job = tool(dispatcher, "E")
        assert (await e.job()).job == e_job.id  # E's executor takes E's call ...
        assert not local_job.future.done() and local_job.worker is None  # ... not local's
        assert dispatcher.statistics()["jobs_waiting"]["tool"] == 1
        here = worker("tool")  # the host's own executor comes (back): the call goes there
        assert (await here.job()).job == local_job.id
        absent = tool(dispatcher, "F")  # no executor on F: failed at once, never elsewhere
        reply = absent.future.result()
        assert isinstance(reply.body, JobFailed)
        assert reply.body.message == "machine F has no executor connected"

    asyncio.run(with_dispatcher(body))


def test_a_machine_gone_mid_call_fails_its_calls_and_those_waiting_for_it():
    async def body(dispatcher, worker):
        e = worker("tool", "E", capacity=1)
        await registered(dispatcher, e)
        running, waiting = tool(dispatcher, "E"), tool(dispatcher, "E")
        await e.job()
        e.leave()
        lost = (await asyncio.wait_for(running.future, WAIT_S)).body
        assert isinstance(lost, JobFailed) and lost.error == "machine_lost"
        assert lost.message.startswith("machine E lost")
        never = (await asyncio.wait_for(waiting.future, WAIT_S)).body
        assert never.message == "machine E has no executor connected"
        [machine] = [m for m in dispatcher.statistics()["machines"] if m["name"] == "E"]
        assert machine["state"] == "left" and machine["workers"] == {}

    asyncio.run(with_dispatcher(body))


def test_a_model_call_on_a_lost_machine_is_reissued_on_another_llm_caller():
    async def body(dispatcher, worker):
        e = worker("llm", "E")
        await registered(dispatcher, e)
        progress: list[Envelope] = []
        job = dispatcher.submit("llm", LlmJob({"messages": []}, True), sid="s", deadline=0.0,
                                on_progress=progress.append)
        first = await e.job()
        here = worker("llm")
        await registered(dispatcher, here)
        e.leave()
        again = await here.job()
        assert again.job == job.id != first.job  # the same call, under a new id
        assert [type(p.body) for p in progress] == [Retrying]
        assert not job.future.done()

    asyncio.run(with_dispatcher(body))


def spec(name: str) -> dict[str, object]:
    return ToolSpec(name, name, {"type": "object", "properties": {}}, (), False, False).to_wire()


def test_each_machine_offers_its_own_executors_tools():
    """Each machine's executors read their own config (their MCP servers differ): a
    session is offered its machine's tools, not the union of every machine's."""
    async def body(dispatcher, worker):
        here = worker("tool", tools=[spec("shell"), spec("mcp__time__now")])
        there = worker("tool", "E", tools=[spec("shell"), spec("mcp__db__query")])
        await registered(dispatcher, here, there)
        names = {m: sorted(s["name"] for s in dispatcher.tool_specs(m)) for m in ("local", "E")}
        assert names == {"local": ["mcp__time__now", "shell"], "E": ["mcp__db__query", "shell"]}
        assert dispatcher.tool_specs("F") == []
        assert len(dispatcher.tool_specs()) == 3  # (any machine: the union)

    asyncio.run(with_dispatcher(body))


def test_a_session_s_jobs_go_back_to_the_worker_of_its_last_one_while_it_has_room():
    """Stickiness (issue 28): an executor keeps the session's sandboxed reader warm, an
    llm caller its history; another session, a parallel call of the same session, or a
    full worker, goes by free slots."""
    async def body(dispatcher, worker):
        a, b = worker("tool", capacity=2), worker("tool", capacity=2)
        await registered(dispatcher, a, b)

        def call(sid: str) -> Job:
            return dispatcher.submit("tool", ToolJob("shell", {"command": "true"}), sid=sid,
                                     deadline=0.0, on_progress=lambda env: None)

        def reply(job: Job) -> None:
            dispatcher.handle_work(job.worker, Envelope(JobFailed("x", "done"), job=job.id),
                                   b"")

        x = call("x")  # on a (both equally free: the first)
        first = call("s1")  # on b, the freer one
        home = first.worker
        assert (x.worker, home) == (a.id, b.id)
        reply(first)
        reply(x)
        for _ in range(3):  # both equally free: s1 goes where it went, each time
            again = call("s1")
            assert again.worker == home
            reply(again)
        held = call("s1")  # in flight on home: home has 1 free slot, the other 2
        assert held.worker == home
        # One reply's second call while the first runs on home: spread, not stacked
        # there (the idlest worker takes it, so parallel calls run in parallel).
        beside = call("s1")
        assert beside.worker not in (home, None)
        reply(held)
        reply(beside)
        # s1's last worker (the other one now) full: s1 goes to a worker with room.
        last = beside.worker
        fillers = [call(f"fill{n}") for n in range(4)]  # every slot of both taken
        assert all(w.free == 0 for w in dispatcher.workers.values())
        reply(next(f for f in fillers if f.worker != last))  # one free slot, not on `last`
        later = call("s1")
        assert later.worker not in (last, None)

    asyncio.run(with_dispatcher(body))
