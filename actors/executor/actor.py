"""The executor process: a worker of role `tool` over a tool catalogue.

Risky tools run sandboxed (actors.sandbox): `shell` and `write_file` go through
the launcher under their policy, in the session's own workspace. A risky tool
this executor has no sandboxed runner for is refused, never run bare.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from actors.runtime import run_actor
from actors.sandbox import PolicyError, Sandbox, SandboxConfig
from actors.settings import Settings
from actors.storage import private_files
from actors.tools import (
    BUILTIN,
    Catalogue,
    ToolContext,
    invoke,
    make_shell,
    make_write_file,
)
from actors.worker import Worker
from bus.endpoints import Endpoints
from bus.messages import Body, Envelope, JobFailed, ToolJob, ToolResult

log = logging.getLogger("oploop.executor")


def sandboxed_catalogue(sandbox: Sandbox) -> Catalogue:
    """The built-in tools, with `shell` and `write_file` running inside `sandbox`."""
    return Catalogue([
        BUILTIN["read_file"],
        BUILTIN["list_dir"],
        make_write_file(sandbox.file_writer("write_file")),
        make_shell(sandbox.spawner("shell")),
    ])


def default_sandbox(home: Path) -> Sandbox:
    """The sandbox of a host in `home`: its `sandbox.toml`, workspaces in `home/workspaces`.

    The whole home is hidden from the tools (runtime dir, sockets, the policy
    itself); only the session's workspace is bound back in.
    """
    return Sandbox(SandboxConfig.load(home), home / "workspaces", hide=(home,))


class Executor(Worker):
    """Runs tool calls, each as its own task; `Abort` cancels one (killing its processes)."""

    role = "tool"
    capacity = 16

    def __init__(
        self,
        endpoints: Endpoints,
        catalogue: Catalogue | None = None,
        sandbox: Sandbox | None = None,
    ) -> None:
        super().__init__(endpoints)
        home = endpoints.run_dir.parent
        self.sandbox = sandbox or default_sandbox(home)
        #: Never read or listed by the unsandboxed tools: the keys (a secret read into a
        #: session's events would reach every viewer), the runtime dir, the journal and
        #: event store (every session's history).
        self.private = tuple(p.resolve() for p in
                             (home / "keys", home / "run", *private_files(home)))
        if catalogue is None:
            catalogue = sandboxed_catalogue(self.sandbox)
            self.sandboxed = frozenset({"shell", "write_file"})
        else:
            # A caller-supplied catalogue: its risky tools are refused unless the
            # caller says which of them it built around this sandbox.
            self.sandboxed = frozenset()
        self.catalogue = catalogue

    def tools(self) -> list[dict[str, Any]]:
        """The specs of every tool this executor runs."""
        return [spec.to_wire() for spec in self.catalogue.specs()]

    async def perform(self, env: Envelope) -> Body:
        """Run the tool of one `ToolJob`; a failing tool is a `ToolResult` with `is_error`."""
        job = env.body
        if not isinstance(job, ToolJob):
            return JobFailed("bad_job", f"an executor does not run {job.KIND}")
        found = self.catalogue.get(job.name)
        timeout_s = job.timeout_s if job.timeout_s > 0 else None
        cwd = Path(job.cwd) if job.cwd else Path.cwd()
        if found is not None and found.spec.risky:
            if job.name not in self.sandboxed:
                return ToolResult(
                    f"{job.name}: refused: a risky tool with no sandboxed runner here", True, 0.0
                )
            policy = self.sandbox.config.policy(job.name)
            cwd = await asyncio.to_thread(self.sandbox.workspace, env.sid or "default")
            timeout_s = min(timeout_s or policy.timeout_s, policy.timeout_s)
        ctx: ToolContext[None] = ToolContext(cwd=cwd, deadline=env.deadline or None,
                                             private=self.private)
        started = time.perf_counter()
        try:
            # The job's timeout bounds every tool, whatever the tool does itself;
            # cancelling a tool kills the processes it started.
            async with asyncio.timeout(timeout_s):
                outcome = await invoke(self.catalogue, job.name, job.input, ctx)
        except TimeoutError:
            elapsed_ms = (time.perf_counter() - started) * 1000
            return ToolResult(f"{job.name} timed out after {timeout_s:g} s", True, elapsed_ms)
        elapsed_ms = (time.perf_counter() - started) * 1000
        return ToolResult(outcome.output, outcome.is_error, round(elapsed_ms, 3))

    async def serve(self) -> None:
        """Sweep what a dead executor left, adopt orphans, then serve; tidy up on the way out."""
        killed = await asyncio.to_thread(self.sandbox.start, subreaper=True)
        if killed:
            log.warning("killed %d process(es) left by a previous executor", killed)
        try:
            await super().serve()
        finally:
            self.sandbox.close()


async def _main(settings: Settings) -> None:
    endpoints = settings.endpoints()  # OPLOOP_CONNECT: a worker on another machine
    try:
        executor = Executor(endpoints)
    except PolicyError as exc:
        raise SystemExit(f"executor: bad sandbox configuration: {exc}") from exc
    await executor.serve()


def main() -> None:
    """Entry point of `python -m actors.executor`."""
    run_actor("executor", _main)
