"""The executor process: a worker of role `tool` over a tool catalogue."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from actors.runtime import run_actor
from actors.tools import BUILTIN, Catalogue, ToolContext, invoke
from actors.worker import Worker
from bus.endpoints import Endpoints
from bus.messages import Body, Envelope, JobFailed, ToolJob, ToolResult


class Executor(Worker):
    """Runs tool calls, each as its own task; `Abort` cancels one (killing its processes)."""

    role = "tool"
    capacity = 16

    def __init__(self, endpoints: Endpoints, catalogue: Catalogue = BUILTIN) -> None:
        super().__init__(endpoints)
        self.catalogue = catalogue

    def tools(self) -> list[dict[str, Any]]:
        """The specs of every tool this executor runs."""
        return [spec.to_wire() for spec in self.catalogue.specs()]

    async def perform(self, env: Envelope) -> Body:
        """Run the tool of one `ToolJob`; a failing tool is a `ToolResult` with `is_error`."""
        job = env.body
        if not isinstance(job, ToolJob):
            return JobFailed("bad_job", f"an executor does not run {job.KIND}")
        cwd = Path(job.cwd) if job.cwd else Path.cwd()
        ctx = ToolContext(cwd=cwd, deadline=env.deadline or None)
        started = time.perf_counter()
        try:
            # The job's timeout bounds every tool, whatever the tool does itself;
            # cancelling a tool kills the processes it started.
            async with asyncio.timeout(job.timeout_s if job.timeout_s > 0 else None):
                outcome = await invoke(self.catalogue, job.name, job.input, ctx)
        except TimeoutError:
            elapsed_ms = (time.perf_counter() - started) * 1000
            return ToolResult(f"{job.name} timed out after {job.timeout_s:g} s", True, elapsed_ms)
        elapsed_ms = (time.perf_counter() - started) * 1000
        return ToolResult(outcome.output, outcome.is_error, round(elapsed_ms, 3))


async def _main() -> None:
    await Executor(Endpoints.for_home()).serve()


def main() -> None:
    """Entry point of `python -m actors.executor`."""
    run_actor("executor", _main)
