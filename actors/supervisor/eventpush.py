"""The supervisor's events on their way to the broadcaster (its `ingest`, a PUSH socket).

A commit's events go as `EventBatch`es, one message per commit where one per event
cost a send, a receive and I/O-thread wake-ups each. What the socket refuses (the
broadcaster away, its queue full) waits in an outbox, in order, and is pushed again
every `DRAIN_S`; past the outbox's bounds it is dropped from the push only: it is
journaled, and the broadcaster fetches what it misses from the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from bus.codec import encode
from bus.errors import Backpressure
from bus.messages import Envelope, EventBatch, ForgetSessions
from bus.sockets import Port

log = logging.getLogger("oploop.supervisor")

#: Events that could not be pushed wait here, up to this many messages and bytes.
MAX_OUTBOX = 1_000_000
MAX_OUTBOX_BYTES = 256 << 20
#: A batch holds at most this many bytes of frames: it stays far below a frame's limit,
#: and the broadcaster's `INGEST_RCVHWM` messages stay a modest memory.
BATCH_BYTES = 64 << 10
#: Seconds between two tries to push what waits in the outbox.
DRAIN_S = 0.05


class EventPush:
    """Pushes events to the broadcaster on `port`, in order, holding what it refuses."""

    def __init__(self, port: Port) -> None:
        self.port = port
        self.outbox: deque[bytes] = deque()
        self.outbox_bytes = 0

    def commit(self, events: list[tuple[str, int, bytes]]) -> None:
        """Push the events (session, seq, frame) of one commit as `EventBatch`es of at
        most `BATCH_BYTES` of frames each (one event, or one larger than that, goes as
        its own frame)."""
        batch: list[bytes] = []
        size = 0
        first = 0  # the index in `events` of the batch's first event
        for i, (_, _, frame) in enumerate(events):
            if batch and size + len(frame) > BATCH_BYTES:
                self._frames(batch, *events[first][:2])
                batch, size, first = [], 0, i
            batch.append(frame)
            size += len(frame)
        self._frames(batch, *events[first][:2])

    def _frames(self, frames: list[bytes], sid: str, seq: int) -> None:
        """Push `frames` (events, the first of which is `sid`#`seq`) as one message."""
        if len(frames) == 1:
            self.send(frames[0], sid, seq)
        else:
            self.send(encode(Envelope(EventBatch(frames))), sid, seq, len(frames))

    def send(self, frame: bytes, sid: str, seq: int, count: int = 1) -> None:
        """Push one message of `count` events (the first `sid`#`seq`), or queue it
        behind those the socket refused."""
        if self.outbox or not self._push(frame):
            if len(self.outbox) >= MAX_OUTBOX or self.outbox_bytes >= MAX_OUTBOX_BYTES:
                log.error("event outbox full: %d event(s) from %s#%d not pushed (journaled)",
                          count, sid, seq)
                return
            self._hold(frame)

    def forget(self, sids: list[str]) -> None:
        """Tell the broadcaster to drop the logs of `sids` (behind what waits)."""
        frame = encode(Envelope(ForgetSessions(list(sids))))
        if self.outbox or not self._push(frame):
            if len(self.outbox) >= MAX_OUTBOX:  # the next pruning finds those logs again
                log.error("event outbox full: the broadcaster keeps %d deleted log(s)", len(sids))
                return
            self._hold(frame)

    async def drain(self) -> None:
        """Push what waits in the outbox, as the socket takes it (runs until cancelled)."""
        while True:
            await asyncio.sleep(DRAIN_S)
            while self.outbox and self._push(self.outbox[0]):
                self.outbox_bytes -= len(self.outbox.popleft())

    def _hold(self, frame: bytes) -> None:
        self.outbox.append(frame)
        self.outbox_bytes += len(frame)

    def _push(self, frame: bytes) -> bool:
        try:
            self.port.send_frame(frame)
        except Backpressure:
            return False
        return True
