"""The event log of every session: encoded frames indexed by seq."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Appended:
    """What `EventLog.append` did: stored it, or refused it as duplicate/out of order."""

    stored: bool
    reason: str = ""


class EventLog:
    """Frames per session, `seq` 1..n contiguous; the least recently written
    sessions are forgotten beyond `max_sessions`."""

    def __init__(self, max_sessions: int = 10_000) -> None:
        self.max_sessions = max_sessions
        self._logs: OrderedDict[str, list[bytes]] = OrderedDict()

    def append(self, sid: str, seq: int, frame: bytes) -> Appended:
        """Store `frame` as event `seq` of `sid` if it is the next one."""
        log = self._logs.get(sid)
        if log is None:
            log = self._logs[sid] = []
            while len(self._logs) > self.max_sessions:
                self._logs.popitem(last=False)
        else:
            self._logs.move_to_end(sid)
        expected = len(log) + 1
        if seq < expected:
            return Appended(False, "duplicate")
        if seq > expected:
            return Appended(False, f"gap: got {seq}, expected {expected}")
        log.append(frame)
        return Appended(True)

    def last_seq(self, sid: str) -> int | None:
        """The newest seq of `sid`, or None for a session never seen."""
        log = self._logs.get(sid)
        return None if log is None else len(log)

    def range(self, sid: str, from_seq: int, to_seq: int, max_bytes: int) -> tuple[list[bytes], bool]:
        """Frames `from_seq..to_seq` (inclusive, clipped) up to `max_bytes`; and whether cut."""
        log = self._logs.get(sid, [])
        end = min(to_seq, len(log))
        out: list[bytes] = []
        size = 0
        for i in range(from_seq - 1, end):
            frame = log[i]
            if out and size + len(frame) > max_bytes:
                return out, True
            out.append(frame)
            size += len(frame)
        return out, False

    def __len__(self) -> int:
        return len(self._logs)
