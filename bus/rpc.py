"""Request/reply over a DEALER port: replies are matched to requests by message id."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time

import zmq

from bus.endpoints import Secure
from bus.errors import AccessDenied, Backpressure, RemoteError, RequestTimeout
from bus.messages import Body, Envelope, ErrorReply
from bus.sockets import Port, Reactor

_ids = itertools.count(1)
#: How long a request whose send found no connection waits for the monitor to say the
#: peer refused our handshake (it does within milliseconds when it did).
VERDICT_S = 2.0


def new_id(prefix: str = "") -> str:
    """A message id unique within this process (and, with the pid, across a host)."""
    return f"{prefix}{os.getpid():x}.{next(_ids):x}"


class Requester:
    """Sends requests on one DEALER and resolves each with the reply carrying its id.

    A late reply to a request that already timed out is dropped.
    """

    def __init__(self, reactor: Reactor, name: str, address: str,
                 secure: Secure | None = None, *, watch: bool = False) -> None:
        self._pending: dict[str, asyncio.Future[Envelope]] = {}
        self.address = address
        #: Why the peer refuses our handshake, while it does (CURVE only).
        self.refusal: str | None = None
        # (`watch`: a peer that may want CURVE from us; watched from before the connect)
        watched = self._on_handshake if secure is not None or watch else None
        self.watched = watched is not None
        self.port: Port = reactor.add(zmq.DEALER, name, self._on_reply, connect=address,
                                      secure=secure, on_handshake=watched)

    def _on_handshake(self, refusal: str | None) -> None:
        self.refusal = refusal
        if refusal is None:
            return
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(AccessDenied(self.address, refusal))

    async def _verdict(self, fut: asyncio.Future[Envelope], timeout: float) -> None:
        """After a send refused for want of a connection: raise `AccessDenied` if the
        peer refused our handshake. libzmq drops a refused connection at once, and its
        monitor tells us a moment later: a send in between (this thread descheduled on a
        busy machine) finds no connection, which is no full queue. Returns if no refusal
        is told within `VERDICT_S` (or the handshakes are not watched)."""
        if not self.watched:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(timeout, VERDICT_S)):
                await fut  # (`_on_handshake` fails it with AccessDenied)

    def _on_reply(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        fut = self._pending.pop(env.id, None)
        if fut is not None and not fut.done():
            fut.set_result(env)

    async def request(
        self, body: Body, *, sid: str = "", job: str = "", timeout: float = 5.0,
        traceparent: str = "",
    ) -> Envelope:
        """Send `body` (with the trace context `traceparent`, if any), await its reply;
        raises `RemoteError` on an `ErrorReply`, `AccessDenied` when the peer refuses
        our key, `RequestTimeout` without a reply."""
        if self.refusal is not None:
            raise AccessDenied(self.address, self.refusal)
        mid = new_id("r")
        fut: asyncio.Future[Envelope] = asyncio.get_running_loop().create_future()
        self._pending[mid] = fut
        try:
            try:
                self.port.send(
                    Envelope(body, id=mid, sid=sid, job=job, deadline=time.time() + timeout,
                             traceparent=traceparent)
                )
            except Backpressure:
                await self._verdict(fut, timeout)  # AccessDenied if it was a refusal
                raise
            async with asyncio.timeout(timeout):
                reply = await fut
        except TimeoutError:
            raise RequestTimeout(body.KIND, timeout) from None
        finally:
            self._pending.pop(mid, None)
        if isinstance(reply.body, ErrorReply):
            raise RemoteError(reply.body.code, reply.body.message)
        return reply
