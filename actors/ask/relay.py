"""Which of a remote run's events reach the caller's session, and in what shape.

A remote run may stream thousands of `TOKEN` batches; each forwarded event is one
more event in the caller's log, for every viewer of it. So the relay, a pure
object fed the remote events, coalesces streamed text into one event per
`TEXT_EVERY_S`, leaves out live tool output (`TOOL_OUTPUT`), cuts long
fields, and forwards at most `MAX_EVENTS` per ask; past that only the remote
run's terminal event still goes, saying how many were left out. The caller's
log grows by a bounded amount whatever the remote does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bus.vocab import TERMINAL, EventType

#: Events one ask may add to the caller's session (its terminal event always goes).
MAX_EVENTS = 400
#: Streamed text is forwarded at most this often (one event per interval).
TEXT_EVERY_S = 0.25
#: A forwarded string field longer than this is cut (the full text stays in the remote log).
MAX_FIELD_CHARS = 2000

_STREAMED = (EventType.TOKEN, EventType.THINKING)


@dataclass
class Relay:
    """The forwarding state of one ask: `feed` remote events, emit what it returns."""

    machine: str
    tool_use_id: str
    session: str = ""
    max_events: int = MAX_EVENTS
    sent: int = 0
    dropped: int = 0
    #: Streamed text waiting: (type, turn, first seq, text); flushed on time or change.
    _text: list[Any] = field(default_factory=list)
    _text_at: float = 0.0

    def feed(self, ev: dict[str, Any], now: float) -> list[dict[str, Any]]:
        """The payloads (`MACHINE_EVENT` data) to emit now for remote event `ev`."""
        kind = ev.get("type")
        if kind == EventType.TOOL_OUTPUT:
            # The remote tools' live output stays in the remote log: forwarded, it would
            # spend this ask's events on what its `TOOL_END` carries anyway.
            return []
        out: list[dict[str, Any]] = []
        if kind in _STREAMED:
            text = str((ev.get("data") or {}).get("text", ""))
            if self._text and (self._text[0] != kind or self._text[1] != ev.get("turn")):
                out += self._flush()
            if not self._text:
                self._text = [kind, ev.get("turn", 0), ev.get("seq", 0), ""]
                self._text_at = now
            self._text[3] += text
            if now - self._text_at >= TEXT_EVERY_S:
                out += self._flush()
            return out
        out += self._flush()
        out += self._one(ev, terminal=kind in TERMINAL)
        return out

    def tick(self, now: float) -> list[dict[str, Any]]:
        """Streamed text whose interval is up (called while the remote is quiet)."""
        if self._text and now - self._text_at >= TEXT_EVERY_S:
            return self._flush()
        return []

    def _flush(self) -> list[dict[str, Any]]:
        if not self._text:
            return []
        kind, turn, seq, text = self._text
        self._text = []
        return self._one({"type": kind, "turn": turn, "seq": seq, "data": {"text": text}})

    def _one(self, ev: dict[str, Any], terminal: bool = False) -> list[dict[str, Any]]:
        if self.sent >= self.max_events and not terminal:
            self.dropped += 1
            return []
        self.sent += 1
        payload: dict[str, Any] = {
            "machine": self.machine,
            "session": self.session,
            "tool_use_id": self.tool_use_id,
            "event": {"seq": ev.get("seq", 0), "type": ev.get("type", ""),
                      "turn": ev.get("turn", 0), "data": _cut(ev.get("data") or {})},
        }
        if terminal and self.dropped:
            payload["dropped"] = self.dropped
        return [payload]


def _cut(value: Any, depth: int = 0) -> Any:
    """`value` with long strings cut and deep nesting flattened to text."""
    if isinstance(value, str):
        if len(value) > MAX_FIELD_CHARS:
            return value[:MAX_FIELD_CHARS] + f"… [{len(value) - MAX_FIELD_CHARS} chars cut]"
        return value
    if depth > 4:
        return _cut(repr(value), depth)
    if isinstance(value, dict):
        return {str(k): _cut(v, depth + 1) for k, v in list(value.items())[:50]}
    if isinstance(value, list | tuple):
        return [_cut(v, depth + 1) for v in value[:50]]
    if value is None or isinstance(value, bool | int | float):
        return value
    return _cut(repr(value), depth)
