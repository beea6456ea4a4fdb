"""An adopting worker's kept replies (`Worker._keep`): the oldest go beyond
`MAX_KEPT`, and their loss is logged once per `KEPT_LOG_S`, not once per reply (a busy
executor logged a line for every reply it sent: ~6% of its CPU)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from test_worker_outbox import Pipe

from actors import worker as worker_module
from actors.worker import Worker
from bus.endpoints import Endpoints
from bus.messages import Body, Envelope, ToolJob, ToolResult


class Adopting(Worker):
    role = "tool"
    adopts = True

    async def perform(self, env: Envelope) -> Body:
        return ToolResult("ok", False, 0.0)


def test_kept_replies_are_bounded_and_their_loss_is_logged_once_a_while(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(worker_module, "MAX_KEPT", 4)

    async def main() -> None:
        worker = Adopting(Endpoints.for_home(tmp_path))
        worker.work = Pipe()  # type: ignore[assignment]
        try:
            def answer(n: int) -> None:
                job = f"j{n}"
                worker._job_envs[job] = Envelope(ToolJob("read_file", {}, call_id=f"c{n}"),
                                                 job=job, sid="s")
                worker.send(ToolResult("done", False, 1.0), job=job, sid="s")
                del worker._job_envs[job]

            with caplog.at_level(logging.WARNING, logger=worker_module.log.name):
                for n in range(20):
                    answer(n)
                assert list(worker._kept) == ["j16", "j17", "j18", "j19"]
                lines = [r.getMessage() for r in caplog.records if "no longer kept" in r.message]
                assert len(lines) == 1 and "1 reply no longer kept" in lines[0], lines
                worker._kept_logged_at -= worker_module.KEPT_LOG_S  # (that long ago)
                answer(20)
                lines = [r.getMessage() for r in caplog.records if "no longer kept" in r.message]
                # The second line counts what went since the first: j1..j16.
                assert len(lines) == 2 and "16 replies no longer kept" in lines[1], lines
            await asyncio.sleep(0)
        finally:
            worker.reactor.close()

    asyncio.run(main())
