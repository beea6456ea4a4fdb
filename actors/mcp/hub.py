"""The MCP servers of one executor: their tools under oploop's names, calls routed.

Tool names: a server `NAME`'s tool `tool` is offered as `mcp__NAME__tool`. The
Messages API takes `^[a-zA-Z0-9_-]{1,64}$`, so a character outside that set
becomes `_`, and a name over 64 characters is cut to 55 and ended with `_` and
8 hex digits of a hash of the full name (stable across restarts). A name that
still clashes (with a built-in, or an earlier tool: servers in configuration
order, tools in the server's order) is left out, and the server's status says
which. A tool whose input schema is not an object schema is left out likewise.

The catalogue is bounded (`[limits]`, `actors.bounds`): at most `max_tools` tools in
all (servers in configuration order; the rest left out, one line per server saying
how many), each description cut to `max_tool_description_chars` with a note, a tool
whose input schema is longer than `max_tool_schema_chars` (compact JSON) left out.
A result's text is cut to `max_result_chars` (`results.outcome_of`).

Stdio servers run in the executor's sandbox under `shell`'s policy (the network
as its `network` says: "none", "all", or hosts through the host's proxy), in a
workspace of their own
(`workspaces/mcp-NAME`, its own uid) unless `cwd` says where, seeing besides the
system's paths the program's own installation and `read_paths`, and writing
only there and in `write_paths`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from actors.bounds import cut_line, cut_text, schema_chars
from actors.configparts.limits import Limits
from actors.tools.spec import ToolSpec

from .config import McpServerConfig
from .errors import HttpStatus
from .resources import READ_RESOURCE, prompt_messages, read_outcome, reader_spec
from .results import McpOutcome, outcome_of
from .servers import McpServer, McpServerError, Opener, Progress
from .transport import Fault, StderrLog, StderrTail, sandboxed_stdio

if TYPE_CHECKING:
    from mcp.client._transport import TransportStreams

    from actors.sandbox.child import SandboxedChild
    from actors.sandbox.sandbox import Sandbox

log = logging.getLogger("oploop.mcp")

PREFIX = "mcp__"
MAX_NAME = 64
#: Tools left out named in a server's status (the rest are counted).
MAX_NOTES = 20
_BAD_CHARS = re.compile(r"[^a-zA-Z0-9_-]")


def public_name(server: str, tool: str) -> str:
    """The catalogue name of `server`'s `tool` (see the module's docstring)."""
    name = _BAD_CHARS.sub("_", f"{PREFIX}{server}__{tool}")
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(f"{server}\0{tool}".encode()).hexdigest()[:8]
        name = f"{name[:MAX_NAME - 9]}_{digest}"
    return name


class McpHub:
    """Every configured server of an executor, and the routes from tool names to them."""

    def __init__(self, configs: Mapping[str, McpServerConfig], sandbox: Sandbox | None,
                 on_change: Callable[[], None], reserved: frozenset[str] = frozenset(),
                 limits: Limits | None = None, run_dir: Path | None = None,
                 session_options: Callable[[str], dict[str, Any]] | None = None) -> None:
        """`session_options(name)`: more keyword arguments of server `name`'s
        `ClientSession` (the executor's elicitation and sampling callbacks)."""
        self.limits = limits or Limits()
        self.sandbox = sandbox
        #: The host's runtime dir: its `net/` holds the network proxy's sockets.
        self.run_dir = run_dir or Path("/nonexistent")
        self.reserved = reserved
        self._on_change = on_change
        self.servers: dict[str, McpServer] = {}
        for name, config in configs.items():
            status = HttpStatus()
            self.servers[name] = McpServer(config, self._opener(config, status),
                                           self._tools_changed, status)
            if session_options is not None:
                self.servers[name].session_options = session_options(name)
        #: Set once every server has listed its tools or failed to start once: what an
        #: executor waits for before it says ready (a session's first turn has them).
        self.settled = asyncio.Event()
        self.routes: dict[str, tuple[McpServer, str]] = {}
        #: The `mcp__NAME__read_resource` tools (`resources.reader_spec`): name -> server.
        self.readers: dict[str, McpServer] = {}
        self.left_out: dict[str, list[str]] = {}
        self._specs: list[ToolSpec] = []

    # -- the catalogue -----------------------------------------------------------------

    def specs(self) -> list[ToolSpec]:
        """The specs of every MCP tool known now (listed at least once)."""
        return list(self._specs)

    def owns(self, name: str) -> bool:
        """Whether `name` is an MCP tool of this executor."""
        return name in self.routes or name in self.readers

    def server_of(self, name: str) -> str:
        """The server of MCP tool `name` ("" if none)."""
        found = self._server(name)
        return found.name if found is not None else ""

    def bound(self, name: str, timeout_s: float | None) -> float | None:
        """How long a call of MCP tool `name` may take: its server's `timeout_s`, or
        `timeout_s` if shorter."""
        found = self._server(name)
        return timeout_s if found is None else self._bound(found, timeout_s)

    def _server(self, name: str) -> McpServer | None:
        return self.readers.get(name) or (self.routes[name][0] if name in self.routes
                                          else None)

    def statuses(self) -> list[dict[str, Any]]:
        """Each server's status, with the tools left out of the catalogue and why."""
        out = []
        for name, server in self.servers.items():
            status = server.status().to_wire()
            status["left_out"] = list(self.left_out.get(name, ()))
            extras = server.extras
            status.update(prompts=extras.prompts, resources=len(extras.resources),
                          instructions=bool(extras.instructions))
            out.append(status)
        return out

    def _tools_changed(self, server: McpServer) -> None:
        """A server (re-)listed its tools: rebuild the routes, tell the executor."""
        routes: dict[str, tuple[McpServer, str]] = {}
        readers: dict[str, McpServer] = {}
        specs: list[ToolSpec] = []
        left_out: dict[str, list[str]] = {}
        limits = self.limits
        for each in self.servers.values():
            first = len(specs)
            for n, tool in enumerate(each.tools):
                if len(specs) >= limits.max_tools:
                    left_out.setdefault(each.name, []).append(
                        f"{len(each.tools) - n} more tool(s): the catalogue holds at most "
                        f"{limits.max_tools} MCP tools (limits.max_tools)")
                    break
                name = public_name(each.name, tool.name)
                why = self._refusal(name, routes, tool.input_schema, tool.execution)
                if why:
                    left_out.setdefault(each.name, []).append(
                        f"{cut_line(tool.name, MAX_NAME)}: {why}")
                    continue
                try:
                    spec = ToolSpec(
                        name=name,
                        description=cut_line(tool.description or tool.title
                                             or f"{tool.name} (MCP server {each.name})",
                                             limits.max_tool_description_chars),
                        input_schema=dict(tool.input_schema),
                        tags=tuple(each.config.tags), risky=each.config.risky, core=False,
                        server=each.name)
                except ValueError as exc:
                    left_out.setdefault(each.name, []).append(
                        f"{cut_line(tool.name, MAX_NAME)}: {exc}")
                    continue
                routes[name] = (each, tool.name)
                specs.append(spec)
            self._add_extras(each, first, specs, routes, readers, left_out)
        for name, notes in left_out.items():
            if len(notes) > MAX_NOTES:  # (a server of 3,000 bad tools: its status stays small)
                notes[MAX_NOTES - 1:-1] = [f"and {len(notes) - MAX_NOTES} more"]
            log.warning("MCP server %s: tools left out: %s", name, "; ".join(notes))
        self.routes, self.readers = routes, readers
        self._specs, self.left_out = specs, left_out
        self._on_change()

    def _add_extras(self, server: McpServer, first: int, specs: list[ToolSpec],
                    routes: Mapping[str, Any], readers: dict[str, McpServer],
                    left_out: dict[str, list[str]]) -> None:
        """A server's `read_resource` tool (if it has resources), and its instructions
        on its first spec (with `include_instructions`)."""
        extras = server.extras
        if extras.has_resources:
            name = public_name(server.name, READ_RESOURCE)
            why = self._refusal(name, {**routes, **readers}, {"type": "object"})
            if why:
                left_out.setdefault(server.name, []).append(f"{READ_RESOURCE}: {why}")
            elif len(specs) < self.limits.max_tools:
                readers[name] = server
                specs.append(reader_spec(name, server.config, extras,
                                         self.limits.max_tool_description_chars))
        if server.config.include_instructions and extras.instructions and len(specs) > first:
            specs[first] = dataclasses.replace(specs[first], instructions=extras.instructions)

    def _refusal(self, name: str, routes: Mapping[str, Any], schema: Any,
                 execution: Any = None) -> str:
        if execution is not None and execution.task_support == "required":
            return ("it must be run as a task (execution.taskSupport \"required\"), "
                    "which oploop does not do")
        if name in self.reserved:
            return f"its name {name} is a built-in tool's"
        if name in routes:
            return f"its name {name} clashes with another tool's"
        if not isinstance(schema, dict) or schema.get("type") != "object":
            return "its input schema is not an object schema"
        size = schema_chars(schema)
        if size > self.limits.max_tool_schema_chars:
            return (f"its input schema is {size} chars of JSON, over "
                    f"{self.limits.max_tool_schema_chars} (limits.max_tool_schema_chars)")
        return ""

    # -- lifetime ----------------------------------------------------------------------

    async def start_all(self) -> None:
        """Start every server once to list its tools (concurrently). One that cannot
        start is tried again, with its backoff, until it has listed its tools once
        (its tools cannot be called before: the catalogue does not know them)."""

        waiting = len(self.servers)

        def tried() -> None:
            nonlocal waiting
            waiting -= 1
            if waiting == 0:
                self.settled.set()

        async def one(server: McpServer) -> None:
            first = True
            while True:
                try:
                    await server.session()
                    return
                except McpServerError as exc:
                    if first:
                        log.warning("MCP server %s could not start: %s (tried again in "
                                    "%.1f s)", server.name, exc.cause, server.retry_in())
                    self._on_change()  # the failure shows in its status
                finally:
                    if first:
                        first = False
                        tried()
                await asyncio.sleep(server.retry_in())

        if not self.servers:
            self.settled.set()
        await asyncio.gather(*(one(s) for s in self.servers.values()))

    async def aclose(self) -> None:
        """Stop every server (a stdio server's tree is killed)."""
        await asyncio.gather(*(s.aclose() for s in self.servers.values()))

    # -- calls -------------------------------------------------------------------------

    async def call(self, name: str, arguments: object, timeout_s: float | None,
                   progress: Progress | None = None) -> McpOutcome:
        """Run the MCP tool `name`; any failure is an error outcome naming the server.
        `progress` hears the call's progress notifications."""
        if name in self.readers:
            return await self.read_resource(name, arguments, timeout_s)
        server, tool = self.routes[name]
        if not isinstance(arguments, dict):
            return McpOutcome(f"{name}: input must be a JSON object", True)
        bound = server.config.timeout_s if timeout_s is None else min(timeout_s,
                                                                      server.config.timeout_s)
        try:
            result = await server.call(tool, arguments, bound, progress)
        except McpServerError as exc:
            self._on_change()  # its state changed
            # (the server's own error message may be of any size)
            return McpOutcome(cut_text(f"{name} failed: {exc}", self.limits.max_result_chars),
                              True)
        return outcome_of(result, self.limits.max_result_chars)

    async def read_resource(self, name: str, arguments: object,
                            timeout_s: float | None) -> McpOutcome:
        """`mcp__NAME__read_resource`: `resources/read` of `arguments["uri"]`."""
        server = self.readers[name]
        uri = arguments.get("uri") if isinstance(arguments, dict) else None
        if not isinstance(uri, str) or not uri:
            return McpOutcome(f"{name}: input must be {{\"uri\": \"...\"}}, a resource's URI",
                              True)
        try:
            result = await server.call(READ_RESOURCE, {}, self._bound(server, timeout_s),
                                       send=lambda session: session.read_resource(uri))
        except McpServerError as exc:
            self._on_change()
            return McpOutcome(cut_text(f"{name} failed: {exc}", self.limits.max_result_chars),
                              True)
        return read_outcome(result, self.limits.max_result_chars)

    async def get_prompt(self, server_name: str, prompt: str, arguments: Mapping[str, str],
                         timeout_s: float | None = None) -> list[dict[str, str]]:
        """`prompts/get` of `server_name`'s `prompt`: its messages as `{role, text}`;
        raises McpServerError (an unknown server, the server's refusal)."""
        server = self.servers.get(server_name)
        if server is None:
            known = ", ".join(self.servers) or "none"
            raise McpServerError(server_name, f"no such server here (configured: {known})")
        args = {str(k): str(v) for k, v in arguments.items()}
        result = await server.call(prompt, {}, self._bound(server, timeout_s),
                                   send=lambda session: session.get_prompt(prompt, args))
        return prompt_messages(result, self.limits.max_result_chars)

    @staticmethod
    def _bound(server: McpServer, timeout_s: float | None) -> float:
        limit = server.config.timeout_s
        return limit if timeout_s is None else min(timeout_s, limit)

    # -- transports --------------------------------------------------------------------

    def _opener(self, config: McpServerConfig, status: HttpStatus) -> Opener:
        if config.url:
            home = self.run_dir.parent
            return lambda fault, tail: _http(config, status, home)
        return self._stdio_opener(config)

    def _stdio_opener(self, config: McpServerConfig) -> Opener:
        sandbox = self.sandbox
        echo = StderrLog(config.name)

        async def launch(duplex: int, stderr: int) -> SandboxedChild:
            if sandbox is None:
                raise McpServerError(config.name, "no sandbox here: a stdio server runs only "
                                                  "in an executor's sandbox")
            from actors.sandbox.launchspec import Extra
            from actors.sandbox.network import access

            argv = resolved(config.command, config.name)
            # A server lives as long as the host: RLIMIT_CPU (a tool call's bound on
            # CPU seconds, summed over its life) would kill it after a minute of work
            # spread over hours. Its rate stays bounded by the cgroup's CPU cap.
            policy = dataclasses.replace(sandbox.config.policy("shell"), cpu_s=0)
            net = access(config.sandbox.network, self.run_dir, "mcp", config.name)
            if config.cwd:
                cwd = Path(config.cwd)
            else:
                cwd = await asyncio.to_thread(sandbox.workspace, f"mcp-{config.name}")
            extra = Extra(env=tuple(config.env.items()),
                          ro=runtime_paths(argv[0]) + tuple(config.sandbox.read_paths),
                          rw=tuple(config.sandbox.write_paths))
            given = ((config.cwd,) if config.cwd else ()) + config.sandbox.read_paths \
                + config.sandbox.write_paths  # (its own workspace is bound back on purpose)
            for path in given:
                if overlaps(path, sandbox.hide):
                    raise McpServerError(config.name, f"{path} is or holds what the sandbox "
                                                      f"hides (oploop's home, keys): refused")
            return await sandbox.launch(f"mcp.{config.name}", policy, cwd, argv=argv,
                                        duplex=duplex, stderr=stderr, extra=extra, net=net)

        def open_stdio(fault: Fault, tail: StderrTail
                       ) -> contextlib.AbstractAsyncContextManager[TransportStreams]:
            tail.echo = echo  # its lines in host.log: `oploop logs mcp:NAME`
            return sandboxed_stdio(launch, fault, tail)

        return open_stdio


@asynccontextmanager
async def _http(config: McpServerConfig, status: HttpStatus,
                home: Path) -> AsyncIterator[TransportStreams]:
    """The SDK's streamable HTTP client, with the configured headers, or OAuth's
    (`oauth.auth_for`: a server with no `Authorization` header of its own); its error
    statuses kept in `status` (the SDK's errors do not carry them)."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    from .oauth import auth_for

    timeout = httpx2.Timeout(30.0, read=config.timeout_s + 5.0)
    async with httpx2.AsyncClient(headers=dict(config.headers), timeout=timeout,
                                  auth=auth_for(config, home),
                                  event_hooks={"response": [status.hook]}) as client, \
            streamable_http_client(config.url, http_client=client) as streams:
        yield streams


def overlaps(path: str, hidden: tuple[str, ...]) -> bool:
    """Whether `path` is, holds or lies in one of `hidden` (the oploop home, a key
    folder): binding it into a server's view would show it what the sandbox hides."""
    real = Path(os.path.realpath(path))
    return any(real == h or real.is_relative_to(h) or h.is_relative_to(real)
               for h in (Path(os.path.realpath(x)) for x in hidden))


def resolved(command: tuple[str, ...], server: str) -> list[str]:
    """`command` with its program as an absolute path (found on the executor's PATH: the
    sandbox's own PATH is the system's only)."""
    found = shutil.which(command[0])
    if found is None:
        raise McpServerError(server, f"{command[0]!r} is not an executable on PATH")
    return [os.path.abspath(found), *command[1:]]


def runtime_paths(program: str) -> tuple[str, ...]:
    """What `program` needs to read besides the system's paths: its installation
    prefix (a virtualenv's `bin/..`), for a script its interpreter's prefix (a
    Python under /root/.pyenv, hidden from tools otherwise), and for a program of an
    npm package the outermost `node_modules` it lies in (where node finds its
    dependencies: `node_modules/.bin/X`, `/usr/bin/X -> /usr/lib/node_modules/...`)."""
    paths: list[str] = []
    real = Path(os.path.realpath(program))
    modules = [p for p in real.parents if p.name == "node_modules"]
    if modules:
        paths.append(str(modules[-1]))

    def add_prefix(path: str) -> None:
        real = os.path.realpath(path)
        for candidate in (path, real):
            prefix = str(Path(candidate).parent.parent)
            if prefix not in paths and prefix != "/":
                paths.append(prefix)

    add_prefix(program)
    head = b""
    with contextlib.suppress(OSError), open(program, "rb") as f:
        head = f.read(256)
    if head.startswith(b"#!"):
        interpreter = head[2:].split(b"\n", 1)[0].strip().split(b" ")[0].decode(errors="replace")
        if interpreter.startswith("/") and not interpreter.endswith("/env"):
            add_prefix(interpreter)
    if Path(sys.prefix) != Path(sys.base_prefix) and any(
            p == sys.prefix for p in paths):
        add_prefix(os.path.join(sys.base_prefix, "bin", "python3"))
    return tuple(paths)
