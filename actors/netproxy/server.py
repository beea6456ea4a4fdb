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
relayed as they come. Bounded: `MAX_CONNECTIONS` at once (`MAX_PER_LIST` of them
for one allowlist), the head within `HEAD_S` and 64 KiB, the upstream connect
within `CONNECT_S`, `IDLE_S` without a byte either way ends a connection. A failed
request is a status line and one line of text, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import SplitResult, urlsplit

import h11

from actors.allowlist import Allowlist, BadEntry, normal_host, split_host_port

log = logging.getLogger("oploop.netproxy")

MAX_CONNECTIONS = 256
#: Of those, at most this many for one allowlist: one agent's calls cannot take them all.
MAX_PER_LIST = 128
HEAD_S = 10.0
HEAD_BYTES = 64 * 1024
CONNECT_S = 10.0
IDLE_S = 300.0
SWEEP_S = 5.0
_HOP_BY_HOP = frozenset({
    b"connection", b"proxy-connection", b"keep-alive", b"proxy-authorization",
    b"proxy-authenticate", b"te", b"trailer", b"upgrade",
})


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
        #: Connections open now (each client's, its upstream's counted with it).
        self.connections: set[_Client] = set()
        #: Connections open now per allowlist (by its socket's `Allowlist`).
        self.per_list: dict[int, int] = {}
        #: The tasks opening an upstream connection: owned here, cancelled at close.
        self.opening: set[asyncio.Task[None]] = set()
        self._servers: list[asyncio.AbstractServer] = []
        self._sweeper: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        """Bind every socket (a stale one from a dead proxy is replaced), then listen."""
        self.socket_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.socket_dir, 0o700)
        loop = asyncio.get_running_loop()
        # Bound by name relative to the directory: a home's path may be longer than a
        # unix socket address takes (108 bytes).
        dirfd = os.open(self.socket_dir, os.O_PATH | os.O_DIRECTORY)
        try:
            for name, allow in self.lists.items():
                sock = _bind_in(dirfd, name)
                server = await loop.create_unix_server(
                    functools.partial(_Client, self, allow), sock=sock)
                self._servers.append(server)
        finally:
            os.close(dirfd)
        self._sweeper = loop.call_later(SWEEP_S, self._sweep)

    async def aclose(self) -> None:
        """Stop listening; end every connection and every upstream connect under way."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        for server in self._servers:
            server.close()
        self._servers.clear()
        for task in list(self.opening):
            task.cancel()
        for conn in list(self.connections):
            conn.close()

    def _sweep(self) -> None:
        """End connections idle (no byte either way) for `IDLE_S`, or without a whole
        request head after `HEAD_S`; look again in `SWEEP_S`."""
        now = time.monotonic()
        for conn in list(self.connections):
            if now - conn.last > (HEAD_S if conn.upstream is None else IDLE_S):
                conn.close()
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_S, self._sweep)


class _Upstream(asyncio.Protocol):
    """The connection to the host a request goes to: what comes back goes to the client."""

    def __init__(self, client: _Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.client.last = time.monotonic()
        self.client.transport.write(data)

    def eof_received(self) -> bool:
        self.eof = True
        if self.client.eof:
            return False  # both ways ended: close
        if self.client.transport.can_write_eof():
            self.client.transport.write_eof()
        return True  # half-closed: the client may still be sending

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()

    def pause_writing(self) -> None:  # the client is slow to send: stop reading from it
        self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        self.client.transport.resume_reading()


class _Client(asyncio.Protocol):
    """One connection from a sandbox's forwarder: its request head, then a relay.

    Protocol callbacks rather than streams and a copy task per direction: the
    proxy's own work per request is what it adds to every request."""

    def __init__(self, proxy: NetProxy, allow: Allowlist) -> None:
        self.proxy = proxy
        self.allow = allow
        self.head = bytearray()
        self.upstream: _Upstream | None = None
        self.last = time.monotonic()
        self.eof = False
        self.transport: asyncio.Transport = None  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.proxy.connections.add(self)
        mine = self.proxy.per_list[id(self.allow)] = self.proxy.per_list.get(id(self.allow), 0) + 1
        if len(self.proxy.connections) > MAX_CONNECTIONS:
            self.answer(503, f"oploop: the network proxy holds {MAX_CONNECTIONS} connections "
                             "already: try again")
        elif mine > MAX_PER_LIST:
            self.answer(503, f"oploop: {self.allow.owner} holds {MAX_PER_LIST} connections "
                             "through the network proxy already: close some first")

    def data_received(self, data: bytes) -> None:
        self.last = time.monotonic()
        if self.upstream is not None:
            if self.upstream.transport is not None:
                self.upstream.transport.write(data)
            return
        self.head += data
        end = self.head.find(b"\r\n\r\n")
        if end < 0:
            if len(self.head) > HEAD_BYTES:
                self.answer(431, f"oploop: request head over {HEAD_BYTES} bytes")
            return
        self.transport.pause_reading()  # until the upstream connection is made
        head, rest = bytes(self.head[:end + 4]), bytes(self.head[end + 4:])
        self.head = bytearray()
        try:
            target = parse_request(head, self.allow)
        except Refused as exc:
            if exc.status == 403:
                log.info("%s", exc.reason)
            self.answer(exc.status, exc.reason)
            return
        task = asyncio.get_running_loop().create_task(self._open(target, rest))
        self.proxy.opening.add(task)
        task.add_done_callback(self.proxy.opening.discard)

    async def _open(self, target: Target, rest: bytes) -> None:
        loop = asyncio.get_running_loop()
        upstream = _Upstream(self)
        try:
            async with asyncio.timeout(CONNECT_S):
                await loop.create_connection(lambda: upstream, target.host, target.port)
        except TimeoutError:
            self.answer(504, f"oploop: {target.host}:{target.port} did not answer in "
                             f"{CONNECT_S:g} s")
            return
        except OSError as exc:
            self.answer(502, f"oploop: cannot reach {target.host}:{target.port}: "
                             f"{exc.strerror or exc}")
            return
        assert upstream.transport is not None
        if self.transport.is_closing():  # the client went away meanwhile
            upstream.transport.close()
            return
        self.upstream = upstream
        if target.tunnel:
            self.transport.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            upstream.transport.write(target.head)
        if rest:
            upstream.transport.write(rest)
        self.transport.resume_reading()

    def eof_received(self) -> bool:
        self.eof = True
        up = self.upstream.transport if self.upstream is not None else None
        if up is None or self.upstream.eof:  # type: ignore[union-attr]
            return False  # no request (yet), or both ways ended: close
        if up.can_write_eof():
            up.write_eof()
        return True  # half-closed: the answer may still be coming

    def pause_writing(self) -> None:  # the client reads slowly: stop reading upstream
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.proxy.connections:
            self.proxy.connections.discard(self)
            self.proxy.per_list[id(self.allow)] -= 1
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def answer(self, code: int, reason: str) -> None:
        """Answer with an error status and close (after the answer is sent)."""
        self.transport.write(status(code, reason))
        self.close()

    def close(self) -> None:
        """End this connection and its upstream one."""
        self.transport.close()
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()


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
