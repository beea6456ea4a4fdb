"""The host's event counters: what every published event adds up to.

Counted by the broadcaster (`Broadcaster.accept`), where every event already
passes decoded, and rendered by the gateway's `/metrics` (`actors.gateway.metrics`),
which asks for them at each scrape (`Stats`). Plain dicts, no Prometheus library:
the broadcaster stays small, and a count is a few dict operations per event.

They count since the broadcaster started: a gateway restart keeps them, a
broadcaster restart resets them (Prometheus' `rate()` and `increase()` handle that).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

from bus.vocab import TERMINAL, CancelMode, EventType

#: Distinct values kept for a label a model can choose (a tool's name, a retry's
#: cause); the rest are counted as "other", so a model cannot grow the scrape.
MAX_LABELS = 64
#: Tool call durations (seconds): the histogram's upper bounds.
TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
#: The kinds of a `usage` that are counted as tokens.
TOKEN_KINDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
               "cache_read_input_tokens")
# Plain values, looked up once: an enum's attribute costs a lookup at every event.
_ERROR, _CANCELLED = EventType.ERROR.value, EventType.CANCELLED.value
_MODES = frozenset(m.value for m in CancelMode)
_NUMBERS = (int, float)  # (exact types: a bool is no duration, count or cost)
_TOKEN_LABELS = tuple((k, k.removesuffix("_tokens")) for k in TOKEN_KINDS)


class _Labels:
    """At most `MAX_LABELS` distinct values; later new ones become "other"."""

    def __init__(self) -> None:
        self.seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self.seen:
            return value
        if len(self.seen) >= MAX_LABELS:
            return "other"
        self.seen.add(value)
        return value


def _bump(counts: dict[str, int], key: str, n: int = 1) -> None:
    counts[key] = counts.get(key, 0) + n


class EventCounts:
    """Counters of the events published: by type, runs, turns, tool calls, tokens..."""

    def __init__(self) -> None:
        self.events: dict[str, int] = {}
        # Known label values from the start, at 0: a rate over a series that appears
        # only with its first event misses that event (and a dashboard shows no line).
        self.runs: dict[str, int] = dict.fromkeys(sorted(str(t) for t in TERMINAL), 0)
        self.cancels: dict[str, int] = dict.fromkeys((m.value for m in CancelMode), 0)
        self.tokens: dict[str, int] = dict.fromkeys(
            (k.removesuffix("_tokens") for k in TOKEN_KINDS), 0)
        self.errors: dict[str, int] = {}
        self.turns = 0
        self.turn_ends: dict[str, int] = {}
        #: "tool\0outcome" -> calls (a str key: the wire's maps have str keys).
        self.tool_calls: dict[str, int] = {}
        #: tool -> [count per bucket of `TOOL_BUCKETS` (not cumulative), +Inf, sum].
        self.tool_seconds: dict[str, list[float]] = {}
        self.retries: dict[str, int] = {}
        self.cost = 0.0
        self._tool = _Labels()
        self._cause = _Labels()
        self._stop = _Labels()
        self._error = _Labels()
        #: The event types that add to more than `events` (the rest cost a dict update).
        self._detail: dict[str, Callable[[str, dict[str, Any]], None]] = {
            EventType.TURN_START.value: self._turn_start,
            EventType.TOOL_END.value: self._tool_end, EventType.RETRY.value: self._retry,
            EventType.TURN_END.value: self._turn_end,
            **{str(t): self._terminal for t in TERMINAL}}

    def observe(self, kind: str, data: dict[str, Any]) -> None:
        """Count one published event of type `kind` with its `data`."""
        events = self.events
        events[kind] = events.get(kind, 0) + 1
        detail = self._detail.get(kind)
        if detail is not None:  # (TOKEN and the like: nothing more to count)
            detail(kind, data)

    def _turn_start(self, kind: str, data: dict[str, Any]) -> None:
        self.turns += 1

    def _retry(self, kind: str, data: dict[str, Any]) -> None:
        cause = str(data.get("error", "")).partition(":")[0].strip() or "unknown"
        _bump(self.retries, self._cause(cause[:64]))

    def _terminal(self, kind: str, data: dict[str, Any]) -> None:
        _bump(self.runs, kind)
        if kind == _ERROR:
            _bump(self.errors, self._error(str(data.get("error", ""))[:64] or "none"))
        elif kind == _CANCELLED:
            mode = str(data.get("mode", ""))
            _bump(self.cancels, mode if mode in _MODES else "other")

    def _tool_end(self, kind: str, data: dict[str, Any]) -> None:
        tool = self._tool(str(data.get("name", "")))
        _bump(self.tool_calls, f"{tool}\0{'error' if data.get('is_error') else 'ok'}")
        duration = data.get("duration_ms")
        if type(duration) in _NUMBERS and duration >= 0:
            seconds = duration / 1000
            row = self.tool_seconds.get(tool)
            if row is None:
                row = self.tool_seconds[tool] = [0] * (len(TOOL_BUCKETS) + 2)
            row[bisect.bisect_left(TOOL_BUCKETS, seconds)] += 1  # (the last: +Inf)
            row[-1] += seconds

    def _turn_end(self, kind: str, data: dict[str, Any]) -> None:
        _bump(self.turn_ends, self._stop(str(data.get("stop", ""))[:64] or "none"))
        usage = data.get("usage")
        if type(usage) is not dict:
            return
        for name, label in _TOKEN_LABELS:
            n = usage.get(name)
            if type(n) is int and n > 0:
                _bump(self.tokens, label, n)
        cost = usage.get("cost_usd")
        if type(cost) in _NUMBERS and cost > 0:
            self.cost += cost

    def snapshot(self) -> dict[str, Any]:
        """Every counter, as plain msgpack-able values (`Stats`' answer carries it)."""
        return {
            "events": dict(self.events), "runs": dict(self.runs),
            "errors": dict(self.errors), "cancels": dict(self.cancels),
            "turns": self.turns, "turn_ends": dict(self.turn_ends),
            "tool_calls": dict(self.tool_calls),
            "tool_seconds": {k: list(v) for k, v in self.tool_seconds.items()},
            "retries": dict(self.retries), "tokens": dict(self.tokens), "cost": self.cost,
        }
