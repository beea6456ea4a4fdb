"""One MCP server as an executor holds it: started on first use, kept, restarted.

An `McpServer` owns one connection at a time: a runner task enters the
transport (the sandboxed stdio bridge, or the SDK's streamable HTTP client) and
a `ClientSession`, initializes it, lists the tools, and then waits until the
connection must end: the server faulted (exited, wrote garbage), a call found it
gone or hung, a cancelled call found it deaf, it idled `idle_s`, or the executor
stops. Ending the runner leaves the transport, which kills a stdio server's
whole tree (its cgroup and pid namespace). The next call starts it again, after
the backoff of `actors.restarts.RestartPolicy`, the actors' own; a crash loop
marks it `failed` for `FAILED_RETRY_S`, calls failing at once meanwhile.

Calls from many tasks share the session: they run concurrently as far as the
server allows. A cancelled call, or one past its timeout, leaves it to the SDK to
send `notifications/cancelled`; then, off the call's path, the server must answer
a ping within `CANCEL_GRACE_S`, or its tree is killed (and restarted on next use):
the other calls on it go on.

An HTTP server that lost our session (it restarted: "session not found", HTTP 404,
or 400 naming the session) gets a new one, and the call is made again, once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from actors.restarts import RestartPolicy

from .config import McpServerConfig
from .errors import HttpStatus, http_cause, lost_session
from .resources import Extras, discover
from .transport import Fault, StderrTail

if TYPE_CHECKING:
    from mcp.client._transport import TransportStreams

log = logging.getLogger("oploop.mcp")

#: After a cancelled call, the server must answer a ping within this long, or be killed.
CANCEL_GRACE_S = 0.5
#: How long stopping waits for a connection to close by itself before cancelling it.
STOP_S = 2.0
#: A server no call used for this long is stopped (started again by the next call).
IDLE_S = 600.0
#: A server marked failed (a crash loop) is tried again after this long.
FAILED_RETRY_S = 60.0

Opener = Callable[[Fault, StderrTail], AbstractAsyncContextManager["TransportStreams"]]
"""Opens a server's transport; a fault it sees goes to the `Fault`, stderr to the tail."""

Progress = Callable[[float, float | None, str | None], Awaitable[None]]
"""Told of a call's `notifications/progress`: `(progress, total, message)`."""


def _client_info() -> types.Implementation:
    """Who we are in `initialize`: oploop and its version (not the SDK's default)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return types.Implementation(name="oploop", version=version("oploop"))
    except PackageNotFoundError:  # (run from a checkout that was never installed)
        return types.Implementation(name="oploop", version="0+unknown")


CLIENT_INFO = _client_info()


class McpServerError(Exception):
    """A call to server `server` failed for `cause` (the message names both)."""

    def __init__(self, server: str, cause: str) -> None:
        super().__init__(f"MCP server {server}: {cause}")
        self.server = server
        self.cause = cause


@dataclass(frozen=True, slots=True)
class ServerStatus:
    """What `oploop status` and `oploop tools` show of a server."""

    name: str
    transport: str
    state: str  # "stopped" | "starting" | "ready" | "backoff" | "failed"
    restarts: int
    tools: int
    error: str

    def to_wire(self) -> dict[str, Any]:
        """A plain, msgpack-able dict."""
        return {"name": self.name, "transport": self.transport, "state": self.state,
                "restarts": self.restarts, "tools": self.tools, "error": self.error}


class McpServer:
    """One configured server: its connection, its tools, its health."""

    def __init__(self, config: McpServerConfig, opener: Opener,
                 on_tools: Callable[[McpServer], None],
                 http_status: HttpStatus | None = None) -> None:
        """`on_tools` is told whenever its tools were (re-)listed or its state changed;
        `http_status` is what an HTTP server's transport last answered with an error."""
        self.config = config
        self.http_status = http_status or HttpStatus()
        self.name = config.name
        self.tools: list[types.Tool] = []
        #: Its instructions, resources and prompts (`resources.discover`).
        self.extras = Extras()
        self.state = "stopped"
        self.error = ""
        self.restarts = 0
        self.idle_s = IDLE_S
        #: More keyword arguments of its `ClientSession` (what the client answers for:
        #: elicitation, sampling callbacks), set by the hub.
        self.session_options: dict[str, Any] = {}
        self._open = opener
        self._on_tools = on_tools
        self._policy = RestartPolicy(base_s=0.5, cap_s=10.0, storm=5, window_s=60.0,
                                     stable_s=30.0)
        self._not_before = 0.0
        self._session: ClientSession | None = None
        self._fault: Fault | None = None
        self._runner: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._inflight = 0
        self._used = time.monotonic()
        self._tasks: set[asyncio.Task[None]] = set()  # re-listings, post-cancel checks

    # -- looking -----------------------------------------------------------------------

    def status(self) -> ServerStatus:
        """Its state now."""
        return ServerStatus(self.name, self.config.transport, self.state, self.restarts,
                            len(self.tools), self.error)

    def retry_in(self) -> float:
        """Seconds until a start may be tried again (its backoff, or a failed one's wait)."""
        return max(0.1, self._not_before - time.monotonic())

    # -- the connection ----------------------------------------------------------------

    async def session(self) -> ClientSession:
        """The live session, started (and tools listed) if there is none; the caller
        bounds the wait. Raises McpServerError."""
        if self._session is not None:
            return self._session
        async with self._lock:
            if self._session is not None:
                return self._session
            now = time.monotonic()
            if self.state == "failed":
                if now < self._not_before:
                    raise McpServerError(self.name, f"failed (a crash loop): {self.error}")
                self._policy = RestartPolicy(self._policy.base_s, self._policy.cap_s,
                                             self._policy.storm, self._policy.window_s,
                                             self._policy.stable_s)
            if now < self._not_before:
                self.state = "backoff"
                await asyncio.sleep(self._not_before - now)
            await self._start()
        assert self._session is not None
        return self._session

    async def _start(self) -> None:
        fault = Fault()
        self.http_status.forget()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.state = "starting"
        self._fault = fault
        self._runner = asyncio.create_task(self._run(fault, fault.tail, ready),
                                           name=f"mcp-{self.name}")
        # A caller that gives up meanwhile (its timeout, a cancel) leaves the start to
        # finish (bounded by start_timeout_s) for the next call.
        await asyncio.shield(ready)

    async def _run(self, fault: Fault, tail: StderrTail, ready: asyncio.Future[None]) -> None:
        """The connection's life: open, initialize, list, wait for its end, close."""
        started = time.monotonic()
        cause = ""
        try:
            async with self._open(fault, tail) as (read, write), ClientSession(
                    read, write, message_handler=self._on_message,
                    client_info=CLIENT_INFO, **self.session_options) as session:
                tools = await self._handshake(session, fault)
                extras = await self._within("resources/list and prompts/list",
                                            discover(session), fault)
                self.tools = tools
                self.extras = extras
                self._session = session
                self.state = "ready"
                self.error = ""
                self._used = time.monotonic()
                ready.set_result(None)
                self._on_tools(self)
                await self._wait_end(fault)
                if self._fault is fault:
                    self._session = None  # no new call on it while it is torn down
        except Exception as exc:  # refused, or the transport's own failure (spawn, HTTP)
            cause = self._start_failure(exc)
        except asyncio.CancelledError:  # the executor stopping: no caller may wait on
            if not ready.done():
                ready.set_exception(McpServerError(self.name, "stopped"))
            raise
        finally:
            if self._fault is fault:
                self._session = None
            fault.closed.set()
        cause = fault.cause or cause or "connection closed"
        if self._fault is not fault and ready.done():
            return  # a newer connection (a lost session's) owns the state by now
        self._ended(cause, tail, time.monotonic() - started, ready)
        self._on_tools(self)  # its state changed: `oploop status` shows it

    def _start_failure(self, exc: BaseException) -> str:
        """Why a start failed: the server's refusal (with its HTTP status), or the
        transport's error (anyio's task groups wrap either)."""
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        if isinstance(exc, MCPError):
            return f"initialize failed: {http_cause(exc.error, self.http_status, self.name)}"
        return describe(exc)

    async def _handshake(self, session: ClientSession, fault: Fault) -> list[types.Tool]:
        """`initialize`, then `tools/list`, each bounded by `start_timeout_s`."""
        await self._within("initialize", session.initialize(), fault)
        return await self._within("tools/list", _list_tools(session), fault)

    async def _within(self, step: str, work: Awaitable[Any], fault: Fault) -> Any:
        """`work` within `start_timeout_s`; a server that does not answer is said to be
        silent, not to have exited (its end, when we kill it for that, is ours)."""
        bound = self.config.start_timeout_s
        try:
            async with asyncio.timeout(bound):
                return await work
        except TimeoutError:
            fault.set(f"no answer to {step} within {bound:g} s")
            raise McpServerError(self.name, fault.cause) from None

    async def _wait_end(self, fault: Fault) -> None:
        """Until a fault ends the connection, or it idled `idle_s` (nothing in flight)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(self.idle_s, 5.0)):
                    await fault.happened.wait()
            if fault.happened.is_set():
                return
            if self._inflight == 0 and time.monotonic() - self._used >= self.idle_s:
                fault.set("idle")
                return

    def _ended(self, cause: str, tail: StderrTail, ran_s: float,
               ready: asyncio.Future[None]) -> None:
        """Book the end of a connection: expected (idle, stopping, a cancel's kill) or a
        failure counted toward the crash loop."""
        expected = cause in ("idle", "stopping", "session lost") \
            or cause.startswith("killed after a cancel")
        if not ready.done():
            ready.set_exception(McpServerError(self.name, cause + tail.quote()))
            expected = False
        if expected:
            self.state = "stopped"
            return
        self.error = cause + tail.quote()
        self.restarts += 1
        now = time.monotonic()
        delay = self._policy.on_death(now, ran_s)
        if delay is None:
            self.state = "failed"
            self._not_before = now + FAILED_RETRY_S
            log.error("MCP server %s failed (a crash loop): %s", self.name, self.error)
        else:
            self.state = "backoff"
            self._not_before = now + delay
            log.warning("MCP server %s: %s (restart in %.1f s on next use)", self.name,
                        self.error, delay)

    def end(self, cause: str) -> None:
        """End the current connection now (a stdio server's tree is killed)."""
        self._end_fault(self._fault, cause)

    async def aclose(self) -> None:
        """Stop the server and every task of ours (bounded: a runner still starting,
        which a fault does not interrupt, is cancelled after `STOP_S`)."""
        self.end("stopping")
        for task in list(self._tasks):
            task.cancel()
        runner = self._runner
        if runner is not None and not runner.done():
            done, _ = await asyncio.wait({runner}, timeout=STOP_S)
            if not done:
                runner.cancel()
        for task in [*self._tasks, *([runner] if runner else [])]:
            with contextlib.suppress(BaseException):
                await task

    # -- calls -------------------------------------------------------------------------

    async def call(self, tool: str, arguments: dict[str, Any], timeout_s: float,
                   progress: Progress | None = None,
                   send: Callable[[ClientSession], Awaitable[Any]] | None = None) -> Any:
        """Call `tool` (the server's own name); raises McpServerError for anything but the
        tool's own result (whose `is_error` says how the tool fared). An HTTP server
        that lost our session is given a new one and the call made again, once (the
        server refused it unseen). `progress` hears its progress notifications. `send`,
        if given, is the request made instead of `tools/call` (a resource read, a
        prompt), with the same bounds and handling of faults."""
        scope = asyncio.timeout(timeout_s)
        try:
            async with scope:
                try:
                    return await self._call_once(tool, arguments, progress, send)
                except _SessionLost as lost:
                    log.warning("MCP server %s: %s: a new session, and the call again",
                                self.name, lost)
                    return await self._call_once(tool, arguments, progress, send)
        except TimeoutError:
            if not scope.expired():
                raise
            raise McpServerError(self.name, f"no answer within {timeout_s:g} s: the call was "
                                 f"cancelled (the server goes on if it answers a ping)"
                                 ) from None
        except _SessionLost as lost:
            raise McpServerError(self.name, f"{lost} (again, with a new session)") from None

    async def _call_once(self, tool: str, arguments: dict[str, Any], progress: Progress | None,
                         send: Callable[[ClientSession], Awaitable[Any]] | None) -> Any:
        """One attempt of `call`. A call cancelled (its session's cancel, or its timeout)
        is followed by `notifications/cancelled` (the SDK's) and a ping (ours, off the
        caller's path): only a server that does not answer it is killed."""
        fault: Fault | None = None  # the connection the call went to
        try:
            session = await self.session()
            fault = self._fault
            self._inflight += 1
            try:
                if send is not None:
                    return await send(session)
                return await session.call_tool(tool, arguments, progress_callback=progress)
            except asyncio.CancelledError:
                self._after_cancel(session, fault)
                raise
            finally:
                self._inflight -= 1
                self._used = time.monotonic()
        except MCPError as exc:
            gone = fault
            if exc.error.code == types.CONNECTION_CLOSED or (gone is not None and gone.cause):
                self._end_fault(gone, "connection closed")
                raise McpServerError(self.name, await self._why_gone(gone)) from None
            if self.config.url and lost_session(exc.error, self.http_status):
                self._end_fault(gone, "session lost")
                raise _SessionLost(http_cause(exc.error, self.http_status)) from None
            raise McpServerError(self.name, self._error_text(exc.error)) from None
        except McpServerError:
            raise
        except Exception as exc:  # the transport's (HTTP: connection refused, reset)
            gone = fault or self._fault
            self._end_fault(gone, describe(exc))
            raise McpServerError(self.name, await self._why_gone(gone)) from None

    def _error_text(self, error: types.ErrorData) -> str:
        """A JSON-RPC error as a call's failure: an HTTP server's with the HTTP status
        and reason it came with."""
        if self.config.url:
            return http_cause(error, self.http_status, self.name)
        return f"error {error.code}: {error.message}"

    async def _why_gone(self, fault: Fault | None) -> str:
        """Why the connection ended, with the server's last words: waits (bounded) for
        its runner, which reads the rest of its stderr and any refusal by the sandbox."""
        if fault is None:
            return "connection closed"
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(2.0):
                await fault.closed.wait()
        return (fault.cause or "connection closed") + fault.tail.quote()

    def _end_fault(self, fault: Fault | None, cause: str) -> None:
        """End the connection `fault` belongs to (if it is still the current one, no new
        call may take its session meanwhile)."""
        if fault is not None:
            fault.set(cause)
            if fault is self._fault:
                self._session = None

    def _after_cancel(self, session: ClientSession, fault: Fault | None) -> None:
        """A call was cancelled: check, in a task of ours, that the server still answers."""
        task = asyncio.get_running_loop().create_task(self._settle(session, fault))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, session: ClientSession, fault: Fault | None) -> None:
        try:
            async with asyncio.timeout(CANCEL_GRACE_S):
                await session.send_ping()
        except Exception:  # no answer in time, or the connection broke meanwhile
            log.warning("MCP server %s did not answer within %.1f s of a cancel: killed",
                        self.name, CANCEL_GRACE_S)
            self._end_fault(fault, f"killed after a cancel: no answer within "
                                   f"{CANCEL_GRACE_S:g} s")

    # -- notifications -----------------------------------------------------------------

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.PromptListChangedNotification
                      | types.ResourceListChangedNotification):
            self._spawn(self._rediscover())
        elif isinstance(message, types.ToolListChangedNotification):
            task = asyncio.get_running_loop().create_task(self._relist())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif isinstance(message, Exception):
            log.warning("MCP server %s: transport: %s", self.name, message)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _rediscover(self) -> None:
        """Its prompts or resources changed: learn them again (`resources.discover`)."""
        session = self._session
        if session is None:
            return
        try:
            async with asyncio.timeout(self.config.start_timeout_s):
                self.extras = await discover(session)
        except Exception as exc:
            log.warning("MCP server %s: re-listing its resources and prompts failed: %s",
                        self.name, exc)
            return
        self._on_tools(self)

    async def _relist(self) -> None:
        session = self._session
        if session is None:
            return
        try:
            async with asyncio.timeout(self.config.start_timeout_s):
                self.tools = await _list_tools(session)
        except Exception as exc:
            log.warning("MCP server %s: re-listing its tools failed: %s", self.name, exc)
            return
        self._on_tools(self)


class _SessionLost(Exception):
    """An HTTP server does not know our session any more (it restarted)."""


def describe(exc: BaseException) -> str:
    """`Type: message` of the first leaf of an exception (anyio's task groups wrap the
    transport's real error in groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, McpServerError):
        return exc.cause
    return f"{type(exc).__name__}: {exc}"


async def _list_tools(session: ClientSession) -> list[types.Tool]:
    """Every tool of the server, following pagination (bounded: 100 pages)."""
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(100):
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        tools.extend(result.tools)
        cursor = result.next_cursor
        if not cursor:
            break
    return tools
