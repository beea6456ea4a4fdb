"""A worker's sends on `work` (`Worker._post`): what one turn of its loop sends goes
together once the turn is over, in the order it was sent; a final reply the socket
refuses is kept for the beat's retry, and one that cannot be encoded goes as a
`JobFailed` in its place, after what went before it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from actors.worker import Worker
from bus.codec import decode, encode
from bus.endpoints import Endpoints
from bus.errors import Backpressure
from bus.messages import Body, Envelope, JobFailed, ToolOutput, ToolResult


class Pipe:
    """The sending side of a DEALER `Port`; `full`: its queue refuses."""

    def __init__(self) -> None:
        self.sent: list[Envelope] = []
        self.full = False

    def send(self, env: Envelope, peer: bytes | None = None) -> None:
        self.send_frame(encode(env), peer)

    def send_frame(self, frame: bytes, peer: bytes | None = None) -> None:
        if self.full:
            raise Backpressure("work: send queue is full")
        self.sent.append(decode(frame))


class Echo(Worker):
    role = "tool"

    async def perform(self, env: Envelope) -> Body:
        return ToolResult("ok", False, 0.0)


def test_a_turns_sends_go_together_in_order_and_a_refused_reply_is_kept(
        tmp_path: Path) -> None:
    async def main() -> None:
        worker = Echo(Endpoints.for_home(tmp_path))
        pipe = Pipe()
        worker.work = pipe  # type: ignore[assignment]
        try:
            worker.send(ToolOutput("stdout", "a", False), job="j1", sid="s")
            worker.send(ToolResult("\ud800", False, 1.0), job="j1", sid="s")  # unencodable
            worker.send(ToolResult("done", False, 1.0), job="j2", sid="s")
            assert pipe.sent == []  # (the turn is not over)
            await asyncio.sleep(0)
            assert [(e.job, e.kind) for e in pipe.sent] == [
                ("j1", "tool_output"), ("j1", "job_failed"), ("j2", "tool_result")]
            assert isinstance(pipe.sent[1].body, JobFailed)
            assert pipe.sent[1].body.error == "unencodable"
            pipe.full = True
            worker.send(ToolResult("late", False, 1.0), job="j3", sid="s")
            await asyncio.sleep(0)
            assert [e.job for e in worker._unsent] == ["j3"]  # retried at the next beat
            pipe.full = False
            worker._retry_unsent()
            assert pipe.sent[-1].job == "j3" and not worker._unsent
        finally:
            worker.reactor.close()

    asyncio.run(main())
