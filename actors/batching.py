"""Coalesce streamed text into batches: fewer events, no visible latency (the llm
callers' `TOKEN`/`THINKING` deltas, the executors' live tool output)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

#: Flush after this long since the first unflushed delta (`OPLOOP_TOKEN_BATCH_MS`) ...
FLUSH_INTERVAL_S = 0.02
#: ... or once this many characters are waiting.
FLUSH_CHARS = 512


class DeltaBatcher:
    """Buffers text per channel and calls `emit(channel, text)` by size or time.

    A change of channel flushes first, so text and thinking keep their order.
    """

    def __init__(
        self,
        emit: Callable[[str, str], None],
        interval_s: float = FLUSH_INTERVAL_S,
        max_chars: int = FLUSH_CHARS,
    ) -> None:
        self._emit = emit
        self._interval_s = interval_s
        self._max_chars = max_chars
        self._channel = ""
        self._parts: list[str] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, channel: str, text: str) -> None:
        """Queue `text` on `channel`."""
        if not text:
            return
        if channel != self._channel:
            self.flush()
            self._channel = channel
        self._parts.append(text)
        self._size += len(text)
        if self._size >= self._max_chars or self._interval_s <= 0:
            self.flush()
        elif self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval_s, self.flush)

    def flush(self) -> None:
        """Emit whatever is waiting."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._parts:
            text = "".join(self._parts)
            self._parts.clear()
            self._size = 0
            self._emit(self._channel, text)

    def discard(self) -> None:
        """Drop whatever is waiting (the attempt that produced it failed)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._parts.clear()
        self._size = 0
