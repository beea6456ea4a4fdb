"""When a stream has stalled: three bounds, one watchdog, no phase without one.

A streamed reply goes through phases: the request is sent (before headers),
headers arrive, `message_start`, then content blocks (inside a block, between
blocks). A server may send `ping` events at any time; the SDK swallows them, so
the watchdog sees the bytes themselves (an `httpx` response hook wraps the body
stream of the call the watchdog is armed for, found through a context variable).

The bounds (`StreamBounds`, from `OPLOOP_STREAM_*_S`):

- `idle_s` (2 s, the seed's): nothing at all received — no event, no ping —
  for this long once headers have arrived. Each of its three phases (before the
  first event, between events, inside a tool's input) has its own value, and a
  retry after a stall doubles the one that fired, up to `WIDEST_S` (30 s): a slow
  but healthy server (a 5 s first event, a 3 s pause inside a tool input) gets
  through on a later attempt instead of failing six times the same way.
- `first_s` (60 s): no content this long after the request, pings or not. It is
  the only bound before headers, and a slow start (a long prompt) that pings
  is kept alive by pings until it.
- `pause_s` (30 s): no content this long after the last content while pings
  keep the connection alive (the API pauses inside tool input and thinking).

Content is every content event of the SDK (`CONTENT`), not `message_start`. A bound
of 0 is off. The watchdog is one `asyncio.timeout_at` rescheduled to the earliest
bound; the stall error names the bound that fired, its value, setting and phase
(`first` and `pause` double after their own stalls too, up to 30 s or their setting).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
from dataclasses import dataclass, replace
from typing import Any

from actors.llm_caller.failures import StreamStalled

#: The SDK's events that are content (progress); `message_start` and unknown ones are not.
CONTENT = frozenset({
    "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
    "message_stop", "text", "thinking", "signature", "input_json", "citation",
})

#: The variable naming each bound, for error messages and docs.
SETTING = {
    "idle": "OPLOOP_STREAM_IDLE_S",
    "first": "OPLOOP_STREAM_FIRST_S",
    "pause": "OPLOOP_STREAM_PAUSE_S",
}


#: How far a retry after a stall widens a bound (a larger setting is kept as it is).
WIDEST_S = 30.0

#: The phases of the idle bound: no event yet, between events, inside a tool's input.
IDLE_PHASES = ("first event", "between events", "inside a tool input")


@dataclass(frozen=True, slots=True)
class StreamBounds:
    """How long a stream may go without bytes (`idle_s`), without its first content
    (`first_s`) and without further content while pings flow (`pause_s`); 0 = off.
    `idle_first_s` and `idle_tool_s`, when set, replace `idle_s` before the first
    content and inside a tool's input (what `widened` sets after a stall there)."""

    idle_s: float = 2.0
    first_s: float = 60.0
    pause_s: float = 30.0
    idle_first_s: float | None = None
    idle_tool_s: float | None = None

    def seconds(self, bound: str, idle_phase: str = "between events") -> float:
        """The value of `bound` ("idle", "first", "pause"); the idle one of `idle_phase`."""
        if bound != "idle":
            return float(getattr(self, f"{bound}_s"))
        own = {"first event": self.idle_first_s,
               "inside a tool input": self.idle_tool_s}.get(idle_phase)
        return self.idle_s if own is None else own

    def widened(self, stall: StreamStalled) -> StreamBounds:
        """These bounds after `stall`: the bound that fired doubled (its idle phase's
        alone), up to `WIDEST_S`; a bound that is off or already wider stays."""
        now = self.seconds(stall.bound, stall.idle_phase)
        if now <= 0 or now >= WIDEST_S:
            return self
        wider = min(WIDEST_S, now * 2)
        if stall.bound != "idle":
            return replace(self, **{f"{stall.bound}_s": wider})
        field = {"first event": "idle_first_s", "inside a tool input": "idle_tool_s"}.get(
            stall.idle_phase, "idle_s")
        widened = replace(self, **{field: wider})
        if field == "idle_s":  # the other phases keep what they had
            widened = replace(widened, idle_first_s=self.seconds("idle", IDLE_PHASES[0]),
                              idle_tool_s=self.seconds("idle", IDLE_PHASES[2]))
        return widened


def _bound(seconds: float) -> float:
    return seconds if seconds > 0 else math.inf


class StallWatch:
    """The watchdog of one streamed attempt: timestamps in, one deadline out."""

    def __init__(self, bounds: StreamBounds) -> None:
        self.bounds = bounds
        self.loop = asyncio.get_running_loop()
        self.start = self.loop.time()
        self.last_byte = self.start
        self.last_content: float | None = None
        self.in_tool = False  # inside a tool_use block (its input streaming)
        self.headers = False
        self.phase = "before headers"
        self.timeout = asyncio.timeout_at(self._deadline()[0])

    def _deadline(self) -> tuple[float, str]:
        """The earliest bound still running, and its name."""
        b = self.bounds
        candidates = []
        if self.last_content is None:
            candidates.append((self.start + _bound(b.first_s), "first"))
        else:
            candidates.append((self.last_content + _bound(b.pause_s), "pause"))
        if self.headers:
            idle = b.seconds("idle", self.idle_phase())
            candidates.append((self.last_byte + _bound(idle), "idle"))
        at, name = min(candidates)
        # asyncio.timeout_at takes None for "never", not infinity
        return at, name

    def _rearm(self) -> None:
        at = self._deadline()[0]
        self.timeout.reschedule(None if math.isinf(at) else at)

    def on_headers(self) -> None:
        """The response's headers arrived."""
        self.headers = True
        self.last_byte = self.loop.time()
        self.phase = "after headers"
        self._rearm()

    def on_bytes(self) -> None:
        """Bytes of the body arrived (an event, or only a ping)."""
        self.last_byte = self.loop.time()
        self._rearm()

    def idle_phase(self) -> str:
        """Which of `IDLE_PHASES` the idle bound is in now."""
        if self.last_content is None:
            return IDLE_PHASES[0]
        return IDLE_PHASES[2] if self.in_tool else IDLE_PHASES[1]

    def on_event(self, kind: str, block: str = "") -> None:
        """The SDK yielded an event of type `kind` (`block`: the type of the content
        block a `content_block_start` opens)."""
        if kind == "message_start":
            self.phase = "after message_start"
            return
        if kind not in CONTENT:
            return  # an event type this SDK does not know: ignored, as the SDK does
        if kind == "content_block_start":
            self.phase = "inside a block"
            self.in_tool = block in ("tool_use", "server_tool_use")
        elif kind == "content_block_stop":
            self.phase = "between blocks"
            self.in_tool = False
        elif kind == "message_delta":
            self.phase = "after the last block"
        self.last_content = self.loop.time()
        self._rearm()

    def stalled(self) -> StreamStalled:
        """The error for the bound that fired."""
        _, name = self._deadline()
        idle_phase = self.idle_phase()
        seconds = self.bounds.seconds(name, idle_phase)
        return StreamStalled(seconds, name, SETTING[name], self.phase, idle_phase)


#: The watch of the streamed attempt running in this task (None: not watched).
CURRENT: contextvars.ContextVar[StallWatch | None] = contextvars.ContextVar(
    "oploop_stall_watch", default=None)


def watched_client_hooks() -> dict[str, list[Any]]:
    """The `event_hooks` of the SDK's HTTP client that feed the current watch."""
    import httpx2  # the SDK's transport; imported with the SDK, off the event loop

    class Watched(httpx2.AsyncByteStream):
        """A response body that tells the watch whenever bytes arrive."""

        def __init__(self, inner: Any, watch: StallWatch) -> None:
            self.inner, self.watch = inner, watch

        async def __aiter__(self) -> Any:
            async for chunk in self.inner:
                self.watch.on_bytes()
                yield chunk

        async def aclose(self) -> None:
            await self.inner.aclose()

    async def on_response(response: Any) -> None:
        watch = CURRENT.get()
        if watch is not None:
            watch.on_headers()
            response.stream = Watched(response.stream, watch)

    return {"response": [on_response]}
