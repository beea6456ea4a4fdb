"""The stdio transport of a sandboxed MCP server: the SDK's stream pair over a socket.

The SDK's own `stdio_client` spawns the server itself; a stdio server here runs
inside the sandbox instead (`Sandbox.launch` with an `argv` and a `duplex`
socket: the launcher's layers, then the server as its stdin and stdout), so this
module bridges that socket to the `(read_stream, write_stream)` pair a
`ClientSession` takes. It frames messages as the SDK's stdio transport does (one
JSON-RPC message per line) and parses them with the SDK's own validator
(`mcp_types.jsonrpc_message_adapter`): no JSON-RPC is written here.

What the server says on stderr is kept, bounded (`StderrTail`), for errors, and
written to the executor's log (`host.log`) line by line as `mcp:NAME[pid]`, so that
`oploop logs mcp:NAME` shows it (`StderrLog`, bounded in rate). A
line that is not a JSON-RPC message, or the end of its stdout, is a `Fault`:
the connection is over (`servers.py` restarts the server on its next use).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

import anyio
import mcp_types as types
from mcp.shared.message import SessionMessage

from actors.tools.piped import read_pipe
from actors.tools.process import release

if TYPE_CHECKING:
    from mcp.client._transport import TransportStreams

    from actors.sandbox.child import SandboxedChild

#: Longest line (one message) read from a server: a tool's result can be large (an
#: image), but a server that never ends its line must not take the executor's memory.
MAX_LINE = 32 * 1024 * 1024
#: How much of a server's stderr is kept for error messages.
STDERR_KEEP = 16 * 1024
#: How much of it an error quotes.
STDERR_QUOTE = 600

#: Lines of a server's stderr logged per `LOG_WINDOW_S` at most (the rest counted), and
#: the longest line logged: a chatty server must not fill host.log.
LOG_LINES = 200
LOG_WINDOW_S = 10.0
LOG_LINE_CHARS = 2000

Launch = Callable[[int, int], Awaitable["SandboxedChild"]]
"""Starts the sandboxed server: `(duplex socket fd, stderr fd) -> child`."""


class StderrLog:
    """Writes a server's stderr lines to this process's stderr (host.log) as
    `TIME mcp:NAME[pid] INFO line`, the shape `oploop logs ACTOR` picks out; at most
    `LOG_LINES` per `LOG_WINDOW_S`, then one line saying how many were not written."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pid = 0
        self._window = 0.0
        self._written = 0
        self._skipped = 0

    def line(self, text: str) -> None:
        """Log one line of the server's stderr (within the rate bound)."""
        now = time.monotonic()
        if now - self._window >= LOG_WINDOW_S:
            if self._skipped:
                self._write(f"[{self._skipped} line(s) of stderr not logged: over "
                            f"{LOG_LINES} in {LOG_WINDOW_S:g} s]")
            self._window, self._written, self._skipped = now, 0, 0
        if self._written >= LOG_LINES:
            self._skipped += 1
            return
        self._written += 1
        self._write(text[:LOG_LINE_CHARS])

    def _write(self, text: str) -> None:
        stamp = logging.Formatter().formatTime(logging.makeLogRecord({}))
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"{stamp} mcp:{self.name}[{self.pid}] INFO {text}\n")
            sys.stderr.flush()


class StderrTail:
    """The last `STDERR_KEEP` bytes a server wrote on stderr; each line also to `echo`
    when set."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._partial = b""
        self.echo: StderrLog | None = None

    def add(self, data: bytes) -> None:
        """Keep `data`, dropping the oldest bytes beyond the bound."""
        self._buf += data
        if len(self._buf) > STDERR_KEEP:
            del self._buf[: len(self._buf) - STDERR_KEEP]
        if self.echo is not None:
            *lines, rest = (self._partial + data).split(b"\n")
            self._partial = rest[-LOG_LINE_CHARS * 4:]
            for raw in lines:
                text = raw.decode("utf-8", "replace").rstrip()
                if text:
                    self.echo.line(text)

    def flush(self) -> None:
        """Echo what is left of an unterminated last line (the server's end)."""
        if self.echo is not None and self._partial.strip():
            self.echo.line(self._partial.decode("utf-8", "replace").rstrip())
        self._partial = b""

    def quote(self) -> str:
        """The tail for an error message ("" when the server said nothing)."""
        text = self._buf.decode("utf-8", "replace").strip()
        if not text:
            return ""
        if len(text) > STDERR_QUOTE:
            text = "…" + text[-STDERR_QUOTE:]
        return f"; its stderr ends: {text}"


class Fault:
    """Why a connection ended (first cause wins), when, and when it was torn down;
    with the stderr tail of its server."""

    def __init__(self) -> None:
        self.cause = ""
        self.happened = asyncio.Event()
        self.closed = asyncio.Event()  # the connection's runner is over
        self.tail = StderrTail()

    def set(self, cause: str) -> None:
        """Record `cause` unless one is recorded already; wake whoever waits for it."""
        if not self.cause:
            self.cause = cause
        self.happened.set()


@asynccontextmanager
async def sandboxed_stdio(launch: Launch, fault: Fault, stderr: StderrTail
                          ) -> AsyncIterator[TransportStreams]:
    """Start a sandboxed server with `launch` and yield the SDK's stream pair to it.

    On the way out the server's whole tree is killed (its cgroup, its pid
    namespace) and waited for, whatever cancels the caller meanwhile.
    """
    ours, theirs = socket.socketpair()
    err_r, err_w = os.pipe()
    try:
        child = await launch(theirs.fileno(), err_w)
        if stderr.echo is not None:
            stderr.echo.pid = child.process.pid
    except BaseException:
        ours.close()
        os.close(err_r)
        raise
    finally:
        theirs.close()
        os.close(err_w)
    pumps: list[asyncio.Task[None]] = []
    try:
        reader, writer = await asyncio.open_connection(sock=ours, limit=MAX_LINE)
        # The pipe's transport owns it from the call on, closing it even if the
        # connection is cancelled: closed here as well, a number reused meanwhile would go.
        err_fd, err_r = err_r, -1
        err_reader, _ = await read_pipe(err_fd)
        to_session, from_server = anyio.create_memory_object_stream[SessionMessage | Exception](
            16)
        to_server, from_session = anyio.create_memory_object_stream[SessionMessage](16)
        pumps = [
            asyncio.create_task(_read_stdout(reader, to_session, fault, child)),
            asyncio.create_task(_write_stdin(writer, from_session)),
            asyncio.create_task(_read_stderr(err_reader, stderr)),
        ]
        async with to_session, from_server, to_server, from_session:
            yield from_server, to_server
    finally:
        child.kill()
        for task in pumps[:2]:
            task.cancel()
        refused = await release(child)  # to its end even if cancelled meanwhile
        if refused:
            fault.set(f"refused by the sandbox: {refused}")
        if pumps:
            # The tree is gone, so stderr ends: its last words are read (bounded).
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(pumps[2], 1.0)
        for task in pumps:
            with contextlib.suppress(BaseException):
                await task
        ours.close()
        if err_r >= 0:
            os.close(err_r)


async def _read_stdout(reader: asyncio.StreamReader,
                       to_session: anyio.abc.ObjectSendStream[SessionMessage | Exception],
                       fault: Fault, child: SandboxedChild) -> None:
    """Server → session, one message per line; garbage or EOF end the connection."""
    try:
        while True:
            try:
                line = await reader.readline()
            except ValueError:  # asyncio's LimitOverrunError, re-raised by readline
                fault.set(f"wrote a line over {MAX_LINE} bytes on stdout")
                break
            if not line:
                fault.set(_exited(child))
                break
            if not line.strip():
                continue
            try:
                message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
            except ValueError:
                shown = line[:120].decode("utf-8", "replace").rstrip()
                fault.set(f"wrote garbage on stdout: {shown!r}")
                break
            await to_session.send(SessionMessage(message))
    except ConnectionError:  # reset: it exited with our request unread
        fault.set(_exited(child))
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass  # the session is gone: we are closing
    finally:
        # The session's pending requests end with "Connection closed" at once.
        await to_session.aclose()


def _exited(child: SandboxedChild) -> str:
    status = child.process.returncode
    return "exited" if status is None else f"exited with status {status}"


async def _write_stdin(writer: asyncio.StreamWriter,
                       from_session: anyio.abc.ObjectReceiveStream[SessionMessage]) -> None:
    """Session → server, one message per line."""
    try:
        async for item in from_session:
            data = item.message.model_dump_json(by_alias=True, exclude_unset=True)
            writer.write(data.encode() + b"\n")
            await writer.drain()
    except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError, OSError):
        # The server stopped reading: it exited (the reader sees that and says so), or
        # it closed its stdin and lives on (its calls then end at their timeout).
        pass
    finally:
        writer.close()


async def _read_stderr(reader: asyncio.StreamReader, tail: StderrTail) -> None:
    try:
        while chunk := await reader.read(65536):
            tail.add(chunk)
    finally:
        tail.flush()
