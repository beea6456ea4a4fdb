"""The event log of every session as the broadcaster publishes it: the newest
events in memory, all of them in the supervisor's session log.

Appends land in memory (a viewer can replay them at once); the supervisor has
already journaled them, so nothing is written here. Memory is bounded: a
session keeps only its last `tail_events` frames, and only the
`memory_sessions` most recently appended sessions keep any; older events are
read from the session log (`EventStore`).
"""

from __future__ import annotations

import bisect
import logging
from collections import OrderedDict
from dataclasses import dataclass

from actors.broadcaster.store import EventStore, StoreError

log = logging.getLogger("oploop.broadcaster")

#: Frames kept in memory per session (after a flush).
TAIL_EVENTS = 4096
#: Sessions whose tail is kept in memory.
MEMORY_SESSIONS = 64
#: Bytes of frames kept in memory over all tails (tool outputs make frames large).
MEMORY_BYTES = 64 << 20


class SessionGone(StoreError):
    """The session's events are no longer in the log (deleted by retention or `oploop rm`)."""


@dataclass(frozen=True, slots=True)
class Appended:
    """What `EventLog.append` did: stored it, or refused it as a duplicate or a gap."""

    stored: bool
    reason: str = ""

    @property
    def gap(self) -> bool:
        """The event came early: events before it are missing."""
        return self.reason == "gap"


STORED = Appended(True)
DUPLICATE = Appended(False, "duplicate")
GAP = Appended(False, "gap")


class EventLog:
    """Frames per session, appended in `seq` order (1, 2, 3 …), read back by range."""

    def __init__(
        self,
        store: EventStore,
        *,
        tail_events: int = TAIL_EVENTS,
        memory_sessions: int = MEMORY_SESSIONS,
        memory_bytes: int = MEMORY_BYTES,
    ) -> None:
        self.store = store
        self.tail_events = tail_events
        self.memory_sessions = memory_sessions
        self.memory_bytes = memory_bytes
        self._bytes = 0  # of every frame in `_tails`
        # What is journaled counts as published at start: a viewer that missed some
        # of it live (in flight when a broadcaster died) refetches it from the log.
        self._heads: dict[str, int] = store.heads()
        self._tails: OrderedDict[str, list[tuple[int, bytes]]] = OrderedDict()

    # -- writing -----------------------------------------------------------------------

    def append(self, sid: str, seq: int, frame: bytes) -> Appended:
        """Log `frame` as event `seq` of `sid` if it is the next one."""
        last = self._heads.get(sid, 0)
        if seq <= last:
            return DUPLICATE
        if seq > last + 1:
            return GAP
        self._heads[sid] = seq
        tail = self._tails.get(sid)
        if tail is None:
            tail = self._tails[sid] = []
        else:
            self._tails.move_to_end(sid)
        tail.append((seq, frame))
        self._bytes += len(frame)
        if len(tail) > 2 * self.tail_events:  # trimmed in halves: amortised O(1)
            self._trim(tail, len(tail) - self.tail_events)
        while len(self._tails) > self.memory_sessions or (
                self._bytes > self.memory_bytes and len(self._tails) > 1):
            _, oldest = self._tails.popitem(last=False)
            self._bytes -= sum(len(f) for _, f in oldest)
        if self._bytes > self.memory_bytes:  # one session alone: keep its newer half
            self._trim(tail, max(1, len(tail) // 2))
        return STORED

    def _trim(self, tail: list[tuple[int, bytes]], n: int) -> None:
        """Drop the `n` oldest frames of `tail` from memory (the session log has them)."""
        self._bytes -= sum(len(f) for _, f in tail[:n])
        del tail[:n]

    def skip_to(self, sid: str, seq: int) -> int:
        """Give up on the events before `seq` (nobody has them): the next append may be
        `seq`. Returns how many were skipped."""
        last = self._heads.get(sid, 0)
        if seq <= last + 1:
            return 0
        self._heads[sid] = seq - 1
        return seq - 1 - last

    def forget(self, sids: list[str]) -> None:
        """Drop `sids` from memory (the store has already deleted them)."""
        for sid in sids:
            self._heads.pop(sid, None)
            tail = self._tails.pop(sid, None)
            self._bytes -= sum(len(f) for _, f in tail or ())

    # -- reading -----------------------------------------------------------------------

    def last_seq(self, sid: str) -> int | None:
        """The newest seq of `sid`, or None for a session never seen."""
        return self._heads.get(sid)

    def heads(self) -> dict[str, int]:
        """The newest seq of every session."""
        return dict(self._heads)

    def range(self, sid: str, from_seq: int, to_seq: int,
              max_bytes: int) -> tuple[list[bytes], bool]:
        """Frames `from_seq..to_seq` (inclusive, clipped to the log) up to `max_bytes`;
        and whether the answer was cut. The first frame always fits."""
        end = min(to_seq, self._heads.get(sid, 0))
        tail = self._tails.get(sid) or []
        memory_first = tail[0][0] if tail else end + 1
        out: list[bytes] = []
        size = 0
        if from_seq < memory_first:
            last = min(end, memory_first - 1)
            rows, cut = self.store.range(sid, from_seq, last, max_bytes)
            # The supervisor journals every event before it sends it: a hole in the log
            # is a session being deleted (retention), whose ForgetSessions is on its way.
            if last >= from_seq and (not rows or rows[0][0] != from_seq
                                     or (not cut and len(rows) != last - from_seq + 1)):
                raise SessionGone(f"events {from_seq}..{last} of {sid} are no longer logged")
            out = [frame for _, frame in rows]
            size = sum(len(f) for f in out)
            if cut:
                return out, True
        start = bisect.bisect_left(tail, max(from_seq, memory_first), key=lambda item: item[0])
        for seq, frame in tail[start:]:
            if seq > end:
                break
            if out and size + len(frame) > max_bytes:
                return out, True
            out.append(frame)
            size += len(frame)
        return out, False

    def statistics(self) -> dict[str, int]:
        """Sessions known, sessions and frames held in memory."""
        return {
            "sessions": len(self._heads),
            "memory_sessions": len(self._tails),
            "memory_events": sum(len(t) for t in self._tails.values()),
            "memory_bytes": self._bytes,
        }

    def __len__(self) -> int:
        return len(self._heads)
