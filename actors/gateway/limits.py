"""What one client, or many, may hold of the gateway: connections, time, descriptors.

- **Headers in time.** A connection must send a whole request head within
  `HEADER_S` of connecting (or of its previous response): aiohttp's keep-alive
  timer closes an idle or half-sent one then (`keepalive_timeout`), so a client
  sending one header line every 10 s (slowloris) holds a descriptor 10 s at most.
  A body must arrive within `BODY_S` (`api.read_object`): 408 otherwise.
- **Connections capped**, `MAX_CONNECTIONS` in all and `MAX_PER_ADDRESS` from one
  address (on loopback every local client is one address: the two are close).
  At a cap, a new connection first evicts the oldest connection of the same
  scope that has not finished sending its first request head: a flood of slow
  connections gives way to a client that sends its request at once. Only when
  every connection at the cap is serving a request (SSE streams) is the new one
  answered 503 and closed.
- **Descriptors**: the caps are cut to fit under the process's descriptor limit
  (`fitted`); a stream is refused (503) when fewer than `RESERVE_FDS` are left
  (`descriptors_left`), whatever else took them. A request that still fails for
  want of one (`EMFILE`, `ENFILE`, or zmq's "Too many open files") is a 503, or, in
  a stream already begun, the end of that stream (the browser reconnects); the
  gateway logs one line per `LOG_EVERY_S` saying how many there were, never a
  traceback per request (`Quiet`). The same holds for `accept()` failing (the
  loop's exception handler, `on_loop_exception`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import time
from collections import OrderedDict
from typing import Any, cast

from aiohttp import web

log = logging.getLogger("oploop.gateway")

#: Seconds a connection has to send a request head (aiohttp's keep-alive timeout).
HEADER_S = 10.0
#: Seconds a request has to send its body.
BODY_S = 30.0
#: Connections open at once, in all and from one address.
MAX_CONNECTIONS = 2_048
MAX_PER_ADDRESS = 1_024
#: Descriptors kept free: a stream is refused (503) with fewer left than this, and the
#: caps are cut to fit under the process's limit (`fitted`).
RESERVE_FDS = 64
#: Descriptors one SSE stream may hold: its connection, its zmq socket and the
#: socket's connection in libzmq's I/O thread, and some to spare.
STREAM_FDS = 4
#: At most one log line per kind of overload this often.
LOG_EVERY_S = 10.0
#: Errno values that mean "no descriptor left".
NO_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})

_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s")
_BODY = b'{"error":"unavailable","message":"too many connections"}'


class Quiet:
    """A log line per kind of trouble at most every `LOG_EVERY_S`, counting the rest."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def warn(self, kind: str, message: str) -> None:
        """Log `message` unless `kind` was logged less than `LOG_EVERY_S` ago."""
        now = time.monotonic()
        self._since[kind] = self._since.get(kind, 0) + 1
        if now - self._last.get(kind, -LOG_EVERY_S) < LOG_EVERY_S:
            return
        count, self._since[kind] = self._since[kind], 0
        self._last[kind] = now
        log.warning("%s (%d time(s) in the last %g s at most)", message, count, LOG_EVERY_S)


def descriptor_limit() -> int:
    """This process's soft limit on open descriptors."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def descriptors_left() -> int:
    """Descriptors this process may still open (a large number where it cannot tell)."""
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        return 1 << 30
    return descriptor_limit() - used


def out_of_descriptors(exc: BaseException) -> bool:
    """Whether `exc` says a descriptor (or a zmq socket) could not be had."""
    return getattr(exc, "errno", None) in NO_DESCRIPTORS or "Too many open files" in str(exc)


class _Guarded(asyncio.Protocol):
    """One connection: aiohttp's protocol behind the caps of `Limiter` (a wrapper, so
    that a refused connection never reaches aiohttp at all)."""

    def __init__(self, limiter: Limiter, inner: asyncio.Protocol) -> None:
        self.limiter = limiter
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.address = ""
        self.admitted = False  # handed to aiohttp
        self.counted = False  # counted in the limiter
        self._head: bytes | None = b""  # the last bytes seen, until a first request head ends

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # (uvloop's is no subclass)
        peer = transport.get_extra_info("peername")
        self.address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        if not self.limiter.admit(self):
            self.transport.write(_REFUSAL % (len(_BODY), _BODY))
            self.transport.close()
            return
        self.admitted = True
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if self._head is not None:
            self._head = (self._head + data)[-4096:]
            if b"\r\n\r\n" in self._head:
                self._head = None
                self.limiter.headed(self)
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.limiter.release(self)
        if self.admitted:
            self.admitted = False
            self.inner.connection_lost(exc)

    def evict(self) -> None:
        """Close a connection that has not sent its first request head yet."""
        if self.transport is not None:
            self.transport.abort()


def fitted(cap: int, per: int, limit: int | None = None) -> int:
    """`cap`, cut so that `cap` things of `per` descriptors each fit under `limit`
    (default: this process's) with `RESERVE_FDS` to spare; at least 1."""
    limit = descriptor_limit() if limit is None else limit
    return max(1, min(cap, (limit - RESERVE_FDS) // per))


class Limiter:
    """The connections open, by address, and which of them are still sending a head."""

    def __init__(self, total: int = MAX_CONNECTIONS, per_address: int = MAX_PER_ADDRESS) -> None:
        self.total = total
        self.per_address = per_address
        self.open: dict[str, int] = {}
        self.count = 0
        #: Connections without a complete first head yet, oldest first.
        self._pending: OrderedDict[_Guarded, None] = OrderedDict()
        self.quiet = Quiet()
        self.refused = 0
        self.evicted = 0

    def protocol_factory(self, server: web.Server) -> Any:
        """What `loop.create_server` calls for each connection."""
        return lambda: _Guarded(self, server())

    def admit(self, conn: _Guarded) -> bool:
        """Count `conn` in, evicting a slow one at a cap; False: refuse it. The caps are
        cut to the descriptor limit of the moment (`fitted`: it may be lowered live)."""
        limit = descriptor_limit()
        per_address = fitted(self.per_address, 2, limit)
        total = fitted(self.total, 2, limit)
        if self.open.get(conn.address, 0) >= per_address and not self._evict(conn.address):
            return self._refuse(f"{conn.address} holds {per_address} connections")
        if self.count >= total and not self._evict(None):
            return self._refuse(f"{total} connections open")
        self.open[conn.address] = self.open.get(conn.address, 0) + 1
        self.count += 1
        conn.counted = True
        self._pending[conn] = None
        return True

    def headed(self, conn: _Guarded) -> None:
        """`conn` sent a whole request head: no longer evictable."""
        self._pending.pop(conn, None)

    def release(self, conn: _Guarded) -> None:
        """`conn` is closed (or being closed): counted out, once."""
        if not conn.counted:
            return
        conn.counted = False
        self._pending.pop(conn, None)
        self.count -= 1
        left = self.open.get(conn.address, 1) - 1
        if left:
            self.open[conn.address] = left
        else:
            self.open.pop(conn.address, None)

    def _evict(self, address: str | None) -> bool:
        """Close the oldest pending connection (of `address`, or any); whether one was."""
        victim = next((c for c in self._pending if address is None or c.address == address),
                      None)
        if victim is None:
            return False
        self.release(victim)  # counted out now, closed below (aiohttp hears of it then)
        self.evicted += 1
        self.quiet.warn("evicted", "gateway at its connection cap: closed the oldest "
                        "connection still sending its request head")
        victim.evict()
        return True

    def _refuse(self, why: str) -> bool:
        self.refused += 1
        self.quiet.warn("refused", f"gateway refused a connection: {why}")
        return False


def on_loop_exception(quiet: Quiet) -> Any:
    """A loop exception handler that reports `accept()` out of descriptors in one line
    per interval, and passes anything else to the default handler."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if exc is not None and out_of_descriptors(exc):
            quiet.warn("accept", f"out of descriptors: {context.get('message', exc)}")
            return
        loop.default_exception_handler(context)

    return handle


class LimitedSite(web.SockSite):
    """A site on a listening socket whose connections go through a `Limiter`."""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, *,
                 limiter: Limiter, **kwargs: Any) -> None:
        super().__init__(runner, sock, **kwargs)
        self.limiter = limiter

    async def start(self) -> None:
        """Serve the socket (as `SockSite.start`, with the limiter's protocol factory)."""
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None
        self._server = await loop.create_server(
            self.limiter.protocol_factory(server), sock=self._sock,
            ssl=self._ssl_context, backlog=self._backlog)
