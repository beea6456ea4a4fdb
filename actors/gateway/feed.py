"""`GET /api/events`: what changes in the sessions list, as it happens.

While a stream is open, every event the gateway's live subscription sees (`Client.live`,
`Gateway.notices`) but the streamed
deltas (`TOKEN`, `THINKING`, `TOOL_OUTPUT`) becomes a notice `{session, seq, type, turn, ts}` for
each open stream; the page updates the row, or lists again for a new session.
Each stream has a bounded queue: one that falls `NOTICE_QUEUE` notices behind is
ended (its page reconnects and lists again), never holding the others back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

from bus.vocab import EventType

#: Notices queued for one stream before it is ended.
NOTICE_QUEUE = 1_000
DELTAS = frozenset({EventType.TOKEN, EventType.THINKING, EventType.TOOL_OUTPUT})

Notice = dict[str, Any]


class Feed:
    """The open `/api/events` streams and what is published to them."""

    def __init__(self) -> None:
        self._queues: set[asyncio.Queue[Notice | None]] = set()

    def publish(self, ev: dict[str, Any]) -> None:
        """Queue `ev`'s notice for every stream (deltas are not notices)."""
        if ev["type"] in DELTAS or not self._queues:
            return
        notice = {k: ev[k] for k in ("session", "seq", "type", "turn", "ts")}
        for queue in list(self._queues):
            try:
                queue.put_nowait(notice)
            except asyncio.QueueFull:  # too slow: ended after what it has (None)
                self._queues.discard(queue)
                queue.get_nowait()
                queue.put_nowait(None)

    @contextlib.contextmanager
    def watch(self) -> Iterator[asyncio.Queue[Notice | None]]:
        """A queue of notices for one stream, while the block runs; None ends it."""
        queue: asyncio.Queue[Notice | None] = asyncio.Queue(NOTICE_QUEUE)
        self._queues.add(queue)
        try:
            yield queue
        finally:
            self._queues.discard(queue)

    @property
    def streams(self) -> int:
        """Streams open."""
        return len(self._queues)
