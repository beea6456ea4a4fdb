"""The filtering proxy: one unix socket per allowlist, HTTP and HTTPS CONNECT, asyncio.

Each socket (`run/net/agent-NAME.sock`, `run/net/mcp-NAME.sock`) serves one
allowlist: which socket a connection came in on says whose request it is, and
only that agent's (or MCP server's) sandboxed calls are given a way to it
(`actors/sandbox/netbridge.py`). A connection carries one request: an
absolute-form HTTP request (`GET http://host/path`), forwarded with
`Connection: close`, or a `CONNECT host:port` tunnel (HTTPS: the TLS stays
end to end). A host not in the list gets a 403 naming the host and the
setting to change; the proxy resolves names itself (the sandbox cannot).

The request head is parsed by h11 (already a dependency); after it, bytes are
relayed as they come. Bounded: `MAX_CONNECTIONS` at once, the head within
`HEAD_S` and 64 KiB, the upstream connect within `CONNECT_S`, `IDLE_S` without
a byte either way ends a connection. A failed request is a status line and one
line of text, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

import h11

from actors.config import Config

from .allowlist import Allowlist, BadEntry, normal_host, socket_name, split_host_port

log = logging.getLogger("oploop.netproxy")

MAX_CONNECTIONS = 256
HEAD_S = 10.0
HEAD_BYTES = 64 * 1024
CONNECT_S = 10.0
IDLE_S = 300.0
_HOP_BY_HOP = frozenset({
    b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization",
    b"proxy-authenticate", b"te", b"trailer", b"upgrade",
})


def allowlists(config: Config) -> dict[str, Allowlist]:
    """Every allowlist `config` sets, by the name of its socket: agents' `network`
    lists and MCP servers' (none: the host runs no proxy)."""
    out: dict[str, Allowlist] = {}
    for name, agent in config.agents.items():
        if isinstance(agent.network, tuple):
            out[socket_name("agent", name)] = Allowlist.of(
                agent.network, f"agent {name}", f"agents.{name}.network")
    for name, server in config.mcp.items():
        if isinstance(server.sandbox.network, tuple):
            out[socket_name("mcp", name)] = Allowlist.of(
                server.sandbox.network, f"MCP server {name}", f"mcp.{name}.network")
    return out


class Refused(Exception):
    """A request answered with an error status (`status`, one line of `reason`)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Target:
    """Where a request goes, and what to send there first (b"" for a tunnel)."""

    host: str
    port: int
    tunnel: bool
    head: bytes


def parse_request(head: bytes, allow: Allowlist) -> Target:
    """Decide one request from its head: where it goes, or `Refused` saying why."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_BYTES)
    conn.receive_data(head)
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError as exc:
        raise Refused(400, f"oploop: not an HTTP request the proxy understands: {exc}") from None
    if not isinstance(event, h11.Request):
        raise Refused(400, "oploop: not an HTTP request the proxy understands")
    target = event.target.decode("ascii", "replace")
    try:
        if event.method == b"CONNECT":
            host, port = split_host_port(target)
            if not port:
                raise Refused(400, f"oploop: CONNECT needs host:port, got {target!r}")
            host = normal_host(host)
        else:
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                raise Refused(400, "oploop: the proxy takes http://HOST/... requests and "
                                   f"CONNECT (for https), got {event.method.decode()} "
                                   f"{target[:200]!r}")
            host, port = normal_host(url.hostname), url.port or 80
    except (BadEntry, ValueError) as exc:
        raise Refused(400, f"oploop: bad host in {target[:200]!r}: {exc}") from None
    if not allow.allows(host, port):
        raise Refused(403, allow.refusal(host, port))
    if event.method == b"CONNECT":
        return Target(host, port, True, b"")
    return Target(host, port, False, _origin_head(event, url))


def _origin_head(event: h11.Request, url: SplitResult) -> bytes:
    """The request as the origin server takes it: origin-form target, no hop-by-hop
    headers, `Connection: close` (one request per connection)."""
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    version = event.http_version or b"1.1"
    lines = [event.method + b" " + path.encode() + b" HTTP/" + version]
    has_host = False
    for name, value in event.headers.raw_items():
        low = name.lower()
        if low in _HOP_BY_HOP:
            continue
        has_host = has_host or low == b"host"
        lines.append(name + b": " + value)
    if not has_host:
        lines.append(b"Host: " + url.netloc.encode())
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def status(code: int, reason: str) -> bytes:
    """A whole error response: the reason as the status line's text and as the body
    (a client that shows only one of them, as most do for CONNECT, still shows it)."""
    line = reason.replace("\r", " ").replace("\n", " ").encode("ascii", "replace")
    body = line + b"\n"
    return (b"HTTP/1.1 %d " % code + line + b"\r\nContent-Type: text/plain; charset=utf-8"
            b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)


class NetProxy:
    """Serves every allowlist on its own unix socket in `socket_dir`."""

    def __init__(self, socket_dir: Path, lists: Mapping[str, Allowlist]) -> None:
        self.socket_dir = socket_dir
        self.lists = dict(lists)
        self.active = 0
        self._servers: list[asyncio.AbstractServer] = []

    async def start(self) -> None:
        """Bind every socket (a stale one from a dead proxy is replaced), then listen."""
        self.socket_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.socket_dir, 0o700)
        # Bound by name relative to the directory: a home's path may be longer than a
        # unix socket address takes (108 bytes).
        dirfd = os.open(self.socket_dir, os.O_PATH | os.O_DIRECTORY)
        try:
            for name, allow in self.lists.items():
                sock = _bind_in(dirfd, name)
                server = await asyncio.start_unix_server(
                    functools.partial(self.handle, allow=allow), sock=sock, limit=HEAD_BYTES)
                self._servers.append(server)
        finally:
            os.close(dirfd)

    async def aclose(self) -> None:
        """Stop listening (connections under way end with the process)."""
        for server in self._servers:
            server.close()
        self._servers.clear()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     allow: Allowlist) -> None:
        """One connection: one request, refused or relayed. The edge: nothing escapes."""
        self.active += 1
        try:
            if self.active > MAX_CONNECTIONS:
                writer.write(status(503, f"oploop: the network proxy holds {MAX_CONNECTIONS} "
                                         "connections already: try again"))
                return
            await self._serve(reader, writer, allow)
        except Exception as exc:  # the per-connection edge: one line, never a traceback
            log.warning("connection ended: %s: %s", type(exc).__name__, exc)
        finally:
            self.active -= 1
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     allow: Allowlist) -> None:
        try:
            async with asyncio.timeout(HEAD_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.LimitOverrunError, ValueError):
            writer.write(status(431, f"oploop: request head over {HEAD_BYTES} bytes"))
            return
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            return  # nothing to answer: no request came
        try:
            target = parse_request(head, allow)
        except Refused as exc:
            if exc.status == 403:
                log.info("%s", exc.reason)
            writer.write(status(exc.status, exc.reason))
            return
        try:
            async with asyncio.timeout(CONNECT_S):
                up_r, up_w = await asyncio.open_connection(target.host, target.port)
        except TimeoutError:
            writer.write(status(504, f"oploop: {target.host}:{target.port} did not answer "
                                     f"in {CONNECT_S:g} s"))
            return
        except OSError as exc:
            writer.write(status(502, f"oploop: cannot reach {target.host}:{target.port}: "
                                     f"{exc.strerror or exc}"))
            return
        try:
            if target.tunnel:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                up_w.write(target.head)
            await _relay(reader, writer, up_r, up_w)
        finally:
            up_w.close()


def _bind_in(dirfd: int, name: str) -> socket.socket:
    """A listening unix socket named `name` in the directory `dirfd` (a stale file of a
    dead proxy's replaced)."""
    path = f"/proc/self/fd/{dirfd}/{name}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dirfd)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(name, 0o600, dir_fd=dirfd)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


async def _relay(c_r: asyncio.StreamReader, c_w: asyncio.StreamWriter,
                 u_r: asyncio.StreamReader, u_w: asyncio.StreamWriter) -> None:
    """Copy both ways until both ends are done, or either is idle for `IDLE_S`."""
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(_copy(c_r, u_w))
            group.create_task(_copy(u_r, c_w))
    except* (OSError, TimeoutError):
        pass  # a reset or an idle end: the connection is closed by the caller


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    while True:
        async with asyncio.timeout(IDLE_S):
            data = await src.read(65536)
        if not data:
            break
        dst.write(data)
        async with asyncio.timeout(IDLE_S):
            await dst.drain()
    if dst.can_write_eof():
        with contextlib.suppress(OSError):
            dst.write_eof()
