"""The executor process: a worker of role `tool` over a tool catalogue.

Every built-in tool runs sandboxed (actors.sandbox): `shell` and `write_file`
go through the launcher under their policy, in the session's own workspace;
`read_file` and `list_dir` read from a launcher locked down the same way (the
tool uid, Landlock read-only, no other process's /proc, homes and oploop's
files hidden), kept per session as a persistent reader (actors/sandbox/readers.py).
A risky tool this executor has no sandboxed runner for is
refused, never run bare.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors import memorytool, nossl
from actors.batching import FLUSH_INTERVAL_S
from actors.config import Agent, Config
from actors.executor.views import FirstResolutions, Views
from actors.permissions import refusal_here
from actors.runtime import run_actor
from actors.sandbox import PolicyError, Sandbox, SandboxConfig, modes, readers
from actors.sandbox.network import NetAccess, access
from actors.settings import Settings
from actors.storage import private_files
from actors.tools import (
    Catalogue,
    ToolContext,
    invoke,
    make_list_dir,
    make_memory,
    make_read_file,
    make_shell,
    make_write_file,
)
from actors.tools.builtin import LIST_CAP, READ_CAP
from actors.tools.live import LiveOutput
from actors.tools.process import ToolRefused
from actors.worker import Worker
from bus.endpoints import Endpoints
from bus.messages import (
    Body,
    ElicitAnswer,
    Envelope,
    JobFailed,
    PromptJob,
    PromptResult,
    SampleAnswer,
    ToolJob,
    ToolOutput,
    ToolProgress,
    ToolResult,
    ToolsChanged,
)

if TYPE_CHECKING:
    from actors.mcp.hub import McpHub

log = logging.getLogger("oploop.executor")

#: What a shell command prints when the sandbox refused it a write: its result then
#: says which mode or key would allow it.
_DENIED_WRITE = re.compile(r"Permission denied|Read-only file system|Operation not permitted")

#: Tool calls one executor runs at once. One executor with many slots is the default
#: (`OPLOOP_EXECUTORS`=1): an idle executor costs ~30 MB whatever its slots, a slot
#: costs nothing until used, and every call is bounded by its own cgroup anyway.
SLOTS = 32
#: The longest progress message an MCP server's notification carries to viewers.
PROGRESS_MESSAGE_CHARS = 1000


#: The bound of a job that has none of its own (the tool's own still apply).
_UNBOUNDED = contextlib.nullcontext()


def _sooner(deadline: float, timeout_s: float | None) -> float | None:
    """The envelope's `deadline` for the tool's context (`registry.invoke` bounds the call
    by it), or None where the job's own timeout, started before, ends the call first
    (the supervisor's deadline is its timeout plus a margin): one timer less per call.
    A deadline already past is kept, so that the call is refused before it starts."""
    if not deadline:
        return None
    if timeout_s is not None and deadline - time.time() > timeout_s:
        return None
    return deadline


@functools.lru_cache(maxsize=256)
def _path(name: str) -> Path:
    """`Path(name)`, kept: a session's calls all work in the same directory."""
    return Path(name)


def sandboxed_catalogue(sandbox: Sandbox, net: NetAccess = "none") -> Catalogue:
    """The built-in tools, every one running inside `sandbox`; `shell` with the
    network `net` (actors/sandbox/network.py)."""
    return Catalogue([
        make_read_file(sandbox.file_reader(READ_CAP)),
        make_list_dir(sandbox.dir_lister(LIST_CAP)),
        make_write_file(sandbox.file_writer("write_file")),
        make_shell(sandbox.spawner("shell", net=net)),
        make_memory(sandbox.memory_runner()),
    ])


def default_sandbox(home: Path, keys: Path | None = None) -> Sandbox:
    """The sandbox of a host in `home`: its `sandbox.toml`, workspaces in `home/workspaces`.

    The whole home is hidden from the tools (runtime dir, sockets, the policy
    itself), and so is the key folder `keys` (a remote worker's `OPLOOP_KEYS`);
    only the session's workspace is bound back in.
    """
    hide = [home]
    if keys is not None and not keys.absolute().is_relative_to(home):
        hide.append(keys.absolute())
    return Sandbox(SandboxConfig.load(home), home / "workspaces", hide=tuple(hide))


class Executor(Worker):
    """Runs tool calls, each as its own task; `Abort` cancels one (killing its processes)."""

    role = "tool"
    capacity = SLOTS
    #: A call in flight outlives a supervisor restart: reported in the next `Ready`,
    #: adopted by the run that waits for it (`Worker.adopts`).
    adopts = True

    def __init__(
        self,
        endpoints: Endpoints,
        catalogue: Catalogue | None = None,
        sandbox: Sandbox | None = None,
        config: Config | None = None,
        batch_s: float = FLUSH_INTERVAL_S,
    ) -> None:
        super().__init__(endpoints)
        #: How long live tool output is batched (`OPLOOP_TOKEN_BATCH_MS`, as the model's).
        self.batch_s = batch_s
        #: The host's agents: their `deny` rules are enforced here too, whoever sent
        #: the job (a second layer: the supervisor refuses them first).
        self.config = config or Config()
        home = endpoints.run_dir.parent
        #: The host's home: the memory folders are in `home/memory` (`memorytool.folder`).
        self.home = home
        #: Serving a host on another machine (`OPLOOP_CONNECT`): its paths are not ours.
        self.remote = endpoints.remote
        self.sandbox = sandbox or default_sandbox(home, endpoints.keys)
        #: Each call's view: remembered, or decided in a thread (`views.py`).
        self.views = Views(self.sandbox.view_cache)
        self.resolutions = FirstResolutions()
        #: Never read or listed by the file tools (a second layer: the sandbox hides them):
        #: the keys, a remote worker's OPLOOP_KEYS (a secret read into a session's events
        #: would reach every viewer), the runtime dir, the journal and event store, the
        #: workspace images (every session's files).
        keys = [endpoints.keys] if endpoints.keys is not None else []
        self.private = tuple(p.resolve() for p in
                             (home / "keys", *keys, home / "run", *private_files(home),
                              self.sandbox.spaces.images))
        #: The proxy's sockets, for agents with a network allowlist (`network.access`).
        self.run_dir = endpoints.run_dir
        #: The built-in catalogue per agent network other than "none" (made on first use).
        self._net_catalogues: dict[NetAccess, Catalogue] | None = None
        if catalogue is None:
            catalogue = sandboxed_catalogue(self.sandbox)
            self.sandboxed = frozenset({"shell", "write_file", memorytool.NAME})
            self._net_catalogues = {}
        else:
            # A caller-supplied catalogue: its risky tools are refused unless the
            # caller says which of them it built around this sandbox.
            self.sandboxed = frozenset()
        self.catalogue = catalogue
        #: The MCP servers of `[mcp.NAME]` (None without any: the SDK is not even loaded).
        self.mcp: McpHub | None = None
        if self.config.mcp:
            # `__main__` keeps `ssl` out of an executor; the MCP SDK needs it (an HTTP
            # server may be https, and its client imports it anyway): let it load.
            nossl.let_in()
            from actors.mcp.elicitation import Elicitations
            from actors.mcp.hub import McpHub

            self.elicitations = Elicitations(self.progress)
            self.mcp = McpHub(self.config.mcp, self.sandbox, self._mcp_changed,
                              reserved=frozenset(self.catalogue), limits=self.config.limits,
                              run_dir=endpoints.run_dir, session_options=self._mcp_options)
            # Ready once the supervisor registered our tools (theirs among them), so
            # that the host's "ready" means a session's first turn offers them.
            self._wait_accept = True

    def catalogue_for(self, agent: Agent | None) -> Catalogue:
        """The tools a call of `agent` runs: `shell` with the agent's `network` (read
        from this executor's own configuration, whoever sent the job)."""
        setting = agent.network if agent is not None else "none"
        if self._net_catalogues is None or setting == "none" or agent is None:
            return self.catalogue
        net = access(setting, self.run_dir, "agent", agent.name)
        found = self._net_catalogues.get(net)
        if found is None:
            found = self._net_catalogues[net] = sandboxed_catalogue(self.sandbox, net)
        return found

    def tools(self) -> list[dict[str, Any]]:
        """The specs of every tool this executor runs (its MCP servers' included)."""
        specs = list(self.catalogue.specs())
        if self.mcp is not None:
            specs += self.mcp.specs()
        return [spec.to_wire() for spec in specs]

    def _mcp_options(self, server: str) -> dict[str, Any]:
        """What server `server`'s client answers for, through the session: elicitation;
        sampling if its `sampling = true`."""
        options = {"elicitation_callback": self.elicitations.callback(server)}
        if self.config.mcp[server].sampling:
            from actors.mcp import sampling

            options["sampling_callback"] = sampling.callback(self.elicitations, server)
        return options

    def job_message(self, env: Envelope) -> None:
        """An `ElicitAnswer` or `SampleAnswer` for a call in flight: to the request
        waiting for it."""
        if isinstance(env.body, ElicitAnswer | SampleAnswer) and self.mcp is not None:
            self.elicitations.answered(env.body)

    def announced_again(self) -> None:
        """Announced again with calls in hand: their servers' questions still waiting
        are asked again (the supervisor they went to is gone)."""
        if self.mcp is not None:
            again = self.elicitations.ask_again()
            if again:
                log.info("%s: %d question(s) of calls in flight asked again", self.worker_id,
                         again)

    def _mcp_changed(self) -> None:
        """An MCP server (re-)listed its tools or changed state: tell the supervisor,
        without a new `Ready` (which would lose the jobs in flight)."""
        if self.mcp is not None and self._ready_no:
            self.send(ToolsChanged(self.tools(), self.mcp.statuses()))

    def _say_ready(self) -> None:
        super()._say_ready()
        if not self.leaving():  # (no Ready went)
            self._mcp_changed()  # the servers' states, which `Ready` does not carry

    async def prepare(self) -> None:
        """Before the first `Ready`: every MCP server has listed its tools or failed to
        start once, so that `Ready` offers them and `oploop up` is ready with them (a
        session's first turn has them). The servers are started meanwhile by `serve`."""
        if self.mcp is not None:
            await self.mcp.settled.wait()

    async def _call_mcp(self, env: Envelope, job: ToolJob) -> ToolResult:
        """One MCP tool call: the server's own bound (`timeout_s`), the job's if shorter."""
        assert self.mcp is not None
        bounds = [b for b in (job.timeout_s if job.timeout_s > 0 else None,
                              env.deadline - time.time() if env.deadline else None)
                  if b is not None]
        async def progress(done: float, total: float | None, message: str | None) -> None:
            self.progress(env, ToolProgress(float(done), float(total or 0.0),
                                            (message or "")[:PROGRESS_MESSAGE_CHARS]))

        started = time.perf_counter()
        bound = self.mcp.bound(job.name, min(bounds) if bounds else None)
        with self.elicitations.calling(self.mcp.server_of(job.name), env, bound):
            outcome = await self.mcp.call(job.name, job.input, bound, progress)
        elapsed_ms = (time.perf_counter() - started) * 1000
        return ToolResult(outcome.output, outcome.is_error, round(elapsed_ms, 3), outcome.images,
                          outcome.shown)

    async def _get_prompt(self, job: PromptJob) -> Body:
        """`prompts/get` of one of its MCP servers (`oploop run --prompt`)."""
        if self.mcp is None:
            return JobFailed("mcp", f"MCP server {job.server}: no MCP server is configured")
        from actors.mcp.servers import McpServerError

        try:
            messages = await self.mcp.get_prompt(job.server, job.prompt, job.arguments)
        except McpServerError as exc:
            return JobFailed("mcp", str(exc))
        return PromptResult(messages)

    async def perform(self, env: Envelope) -> Body:
        """Run the tool of one `ToolJob`; a failing tool is a `ToolResult` with `is_error`."""
        job = env.body
        if isinstance(job, PromptJob):
            return await self._get_prompt(job)
        if not isinstance(job, ToolJob):
            return JobFailed("bad_job", f"an executor does not run {job.KIND}")
        agent = self.config.agent(job.agent) or self.config.agent("")
        found = self.catalogue.get(job.name)
        timeout_s = job.timeout_s if job.timeout_s > 0 else None
        sid = env.sid or "default"
        # The session's directory is a path of the host's machine: an executor serving
        # a host elsewhere works in the session's scratch workspace (or the agent's own
        # `cwd`, a path of this machine's configuration).
        start = job.cwd
        if self.remote:
            # (expanduser reads $HOME or one passwd entry: no wait worth a thread)
            start = (os.path.expanduser(agent.cwd)  # noqa: ASYNC240
                     if agent is not None and agent.cwd else "")
        risky = found is not None and found.spec.risky
        if self.mcp is not None and self.mcp.owns(job.name):
            if agent is not None and agent.permissions:
                refusal = refusal_here(agent.permissions, job.name, job.input,
                                       job.cwd or str(Path.cwd()))
                if refusal is not None:
                    return ToolResult(refusal, True, 0.0)
            return await self._call_mcp(env, job)
        if risky:
            if job.name not in self.sandboxed:
                return ToolResult(
                    f"{job.name}: refused: a risky tool with no sandboxed runner here", True, 0.0
                )
            policy = self.sandbox.config.policy(job.name)
            timeout_s = min(timeout_s or policy.timeout_s, policy.timeout_s)
        started = time.perf_counter()
        try:
            # The job's timeout bounds every tool, whatever the tool does itself;
            # cancelling a tool kills the processes it started.
            async with (asyncio.timeout(timeout_s) if timeout_s is not None
                        else _UNBOUNDED) as scope:
                # In a thread, inside the timeout: the user's directory may be on a file
                # system that hangs; the executor's loop keeps serving meanwhile. The
                # views of the calls started in one turn of the loop share a hop.
                mode = agent.sandbox_mode if agent is not None else modes.WORKSPACE_WRITE
                # (the workspace only where the view is of it: scratch, or no directory)
                workspace = (str(self.sandbox.workspace_path(sid))
                             if mode == modes.SCRATCH or not start else "")
                try:
                    view = await self.views.view(
                        mode, start, workspace,
                        write_paths=agent.write_paths if agent is not None else (),
                        deny_read=agent.deny_read if agent is not None else ())
                except modes.WorkdirRefused as exc:  # a directory that cannot be one
                    return ToolResult(f"{job.name}: refused: {exc}", True, 0.0)
                if start and not view.confined:  # (on the user's files)
                    moved = self.resolutions.refusal(sid, start, view.cwd)
                    if moved is not None:
                        return ToolResult(f"{job.name}: {moved}", True, 0.0)
                if agent is not None and agent.permissions:  # judged where the call will run
                    refusal = refusal_here(agent.permissions, job.name, job.input, view.cwd)
                    if refusal is not None:
                        return ToolResult(refusal, True, 0.0)
                if risky and view.confined and job.name != memorytool.NAME:
                    try:
                        await asyncio.to_thread(self.sandbox.workspace, sid)
                    except ToolRefused as exc:  # no quota possible, the disk full, ...
                        return ToolResult(f"{job.name}: refused: {exc}", True, 0.0)
                live = self._live(env)
                ctx = self._context(env, job, view, start, agent, live,
                                    _sooner(env.deadline, timeout_s))
                view_set = modes.CURRENT.set(view)  # (this job's own task: `modes.using`)
                # (the sandboxed reads this scope bounds need no timer of their own)
                bound_set = readers.BOUND_AT.set(scope.when() if scope is not None else None)
                try:
                    outcome = await invoke(self.catalogue_for(agent), job.name, job.input, ctx)
                finally:
                    readers.BOUND_AT.reset(bound_set)
                    modes.CURRENT.reset(view_set)
                    live.close()  # the last of it goes before the result
        except TimeoutError:
            elapsed_ms = (time.perf_counter() - started) * 1000
            return ToolResult(f"{job.name} timed out after {timeout_s:g} s", True, elapsed_ms)
        elapsed_ms = (time.perf_counter() - started) * 1000
        output = outcome.output
        if job.name == "shell" and outcome.is_error and _DENIED_WRITE.search(output):
            output += f"\n[{view.allow_hint()}]"
        return ToolResult(output, outcome.is_error, round(elapsed_ms, 3))

    def _live(self, env: Envelope) -> LiveOutput:
        """The live output of the job of `env`: `ToolOutput`s on the job's pipe, which
        the supervisor makes `TOOL_OUTPUT` events."""
        def emit(stream: str, text: str, cut: bool) -> None:
            self.progress(env, ToolOutput(stream, text, cut))

        return LiveOutput(emit, self.batch_s)

    def _context(self, env: Envelope, job: ToolJob, view: modes.WorkView,
                 start: str, agent: Agent | None, live: LiveOutput,
                 deadline: float | None) -> ToolContext[None]:
        """One working directory for every tool (the same relative path, the same file):
        the session's cwd, or in scratch mode its workspace. In scratch mode the reads
        also see the directory the session was started in, and the agent's `read_paths`.
        `memory`: the folder of the agent's `memory` name (by this executor's own
        configuration, whoever sent the job)."""
        cwd = _path(view.cwd)
        memory = (memorytool.folder(self.home, agent.memory)
                  if agent is not None and agent.memory else None)
        readable = (((start,) if start else ()) + tuple(job.read_paths)
                    if view.confined else ())
        return ToolContext(cwd=cwd, deadline=deadline, private=self.private,
                           workspace=cwd, read_paths=readable, hidden=self.sandbox.hidden(view),
                           kept=(view.cwd, *view.writable, *readable), mode=view.mode,
                           memory=memory, on_output=live.feed)

    async def serve(self) -> None:
        """Sweep what a dead executor left, adopt orphans, then serve; tidy up on the way out."""
        killed = await asyncio.to_thread(self.sandbox.start, subreaper=True)
        if killed:
            log.warning("killed %d process(es) left by a previous executor", killed)
        try:
            async with asyncio.TaskGroup() as group:
                if self.mcp is not None:
                    # Each server is started once to list its tools; until then (or if
                    # it cannot start) its tools are not offered.
                    group.create_task(self.mcp.start_all(), name="mcp-start")
                await super().serve()
        finally:
            if self.mcp is not None:
                await self.mcp.aclose()  # their trees killed before the sandbox closes
            self.sandbox.close()


async def _main(settings: Settings) -> None:
    endpoints = settings.endpoints()  # OPLOOP_CONNECT: a worker on another machine
    try:
        executor = Executor(endpoints, config=settings.config, batch_s=settings.token_batch_s)
    except PolicyError as exc:
        raise SystemExit(f"executor: bad sandbox configuration: {exc}") from exc
    executor.machine = settings.machine
    await executor.serve()


def main() -> None:
    """Entry point of `python -m actors.executor`."""
    run_actor("executor", _main)
