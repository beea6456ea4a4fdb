"""One viewer of one session, as `Client.events()` keeps it: its live subscription,
where it stands in the session's sequence, and what it is told when it falls behind.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from bus.codec import decode
from bus.endpoints import Endpoints
from bus.errors import BadFrame
from bus.messages import Envelope
from bus.vocab import TERMINAL

#: A viewer that keeps falling behind is told at most this often.
LAG_NOTICE_S = 1.0


@dataclass(frozen=True, slots=True)
class Lag:
    """What a viewer is told when it fell behind.

    `missed`: live events that were dropped before it read them (it got them
    from the log instead); `behind_s`: how old the live stream was when it
    noticed; `lost`: events the broadcaster no longer has (skipped).
    """

    missed: int
    behind_s: float
    lost: int = 0

    def describe(self) -> str:
        """One line for a person."""
        parts = []
        if self.missed:
            parts.append(f"this viewer fell {self.behind_s:.1f} s behind the live stream: "
                         f"{self.missed} events were dropped before it read them and were "
                         "fetched again from the log")
        if self.lost:
            parts.append(f"{self.lost} events are missing from the log and cannot be shown")
        return "; ".join(parts)


class Subscription:
    """A SUB socket read only when the viewer asks for its next event.

    Not served by the client's reactor on purpose: the reactor drains eagerly,
    which would move a slow viewer's backlog into this process without bound.
    Here the backlog stays in zmq's queues, bounded by the HWMs, and what
    overflows them is dropped by the broadcaster's PUB and refetched by seq.
    """

    def __init__(self, ctx: zmq.Context[Any], endpoints: Endpoints, session: str,
                 hwm: int) -> None:
        sock: zmq.Socket[bytes] = ctx.socket(zmq.SUB)
        secure = endpoints.client_side("events")
        if secure is not None:
            secure(sock)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, hwm)
        # Reconnect fast after a broadcaster restart (the default backs off to 100 ms).
        sock.setsockopt(zmq.RECONNECT_IVL, 20)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
        sock.setsockopt(zmq.SUBSCRIBE, session.encode())
        address = endpoints.address("events")
        if address.startswith("tcp://["):
            sock.setsockopt(zmq.IPV6, 1)
        sock.connect(address)
        self.sock = sock
        self._fd = sock.getsockopt(zmq.FD)
        self._readable = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self._readable.set)

    async def get(self, within_s: float) -> Envelope | None:
        """The next live event, or None when none came within `within_s` seconds."""
        deadline = self._loop.time() + within_s
        while True:
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                pass
            else:
                if len(frames) == 2:
                    try:
                        return decode(frames[1])
                    except BadFrame:
                        pass
                continue
            # The fd is edge-triggered: reading ZMQ_EVENTS re-arms it, then wait.
            self._readable.clear()
            if self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                continue
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return None
            try:
                async with asyncio.timeout(remaining):
                    await self._readable.wait()
            except TimeoutError:
                return None

    def close(self) -> None:
        """Unsubscribe and close the socket (again: nothing)."""
        if not self.sock.closed:
            self._loop.remove_reader(self._fd)
            self.sock.close(linger=0)


class View:
    """Where one viewer stands in a session's sequence, whether it is done, and how
    far behind it fell (told to `on_lag` at most once per `LAG_NOTICE_S`)."""

    def __init__(self, from_seq: int, stop_at: str, on_lag: Callable[[Lag], None] | None,
                 until_seq: int | None = None) -> None:
        self.next_seq = max(1, from_seq)
        self.stop_at = stop_at
        #: Done once this seq is accepted, whatever it is (None: at a terminal event).
        self.until_seq = until_seq
        self.finished = until_seq is not None and self.next_seq > until_seq
        #: Whether any event was accepted (then an unknown session is a deleted one).
        self.seen = False
        self._on_lag = on_lag
        self._missed = 0
        self._lost = 0
        self._behind_s = 0.0
        self._told_at = -LAG_NOTICE_S

    def missed(self, count: int, behind_s: float) -> None:
        self._missed += count
        self._behind_s = max(self._behind_s, behind_s)
        self._maybe_tell()

    def lost(self, count: int) -> None:
        self._lost += count
        self._maybe_tell(now=True)

    def _maybe_tell(self, now: bool = False) -> None:
        if now or time.monotonic() - self._told_at >= LAG_NOTICE_S:
            self.report()

    def report(self) -> None:
        """Tell `on_lag` what has not been told yet."""
        if self._on_lag is not None and (self._missed or self._lost):
            self._on_lag(Lag(self._missed, self._behind_s, self._lost))
        self._missed = self._lost = 0
        self._behind_s = 0.0
        self._told_at = time.monotonic()

    def accept(self, ev: dict[str, Any], newest: int) -> None:
        self.seen = True
        self.next_seq = ev["seq"] + 1
        if self.until_seq is not None:
            self.finished = ev["seq"] >= self.until_seq
        elif ev["type"] in TERMINAL and (self.stop_at == "first" or ev["seq"] >= newest):
            self.finished = True
