"""The event log of every session: the newest events in memory, all in the store.

Appends land in memory at once (a viewer can replay them immediately) and are
written to the `EventStore` in one transaction per `flush()`. Memory is
bounded: after each flush a session keeps only its last `tail_events` frames,
and only the `memory_sessions` most recently written sessions keep any; older
events are read back from SQLite.
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
    ) -> None:
        self.store = store
        self.tail_events = tail_events
        self.memory_sessions = memory_sessions
        self._heads: dict[str, int] = {s.sid: s.last_seq for s in store.sessions()}
        self._tails: OrderedDict[str, list[tuple[int, bytes]]] = OrderedDict()
        self._unsaved: list[tuple[str, int, bytes]] = []
        self._dirty: dict[str, int] = {}

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
        self._unsaved.append((sid, seq, frame))
        self._dirty[sid] = seq
        return STORED

    def skip_to(self, sid: str, seq: int) -> int:
        """Give up on the events before `seq` (nobody has them): the next append may be
        `seq`. Returns how many were skipped."""
        last = self._heads.get(sid, 0)
        if seq <= last + 1:
            return 0
        self._heads[sid] = seq - 1
        self._dirty[sid] = seq - 1
        return seq - 1 - last

    def flush(self) -> int:
        """Write what is unsaved, then trim memory to its bounds; returns events written.

        A failing store keeps everything in memory and is retried on the next flush.
        """
        if not self._dirty:
            return 0
        written = len(self._unsaved)
        try:
            self.store.write(self._unsaved, self._dirty)
        except StoreError as exc:
            log.error("event store: %s (keeping %d events in memory)", exc, written)
            return 0
        self._unsaved = []
        self._dirty = {}
        for tail in self._tails.values():
            if len(tail) > self.tail_events:
                del tail[: len(tail) - self.tail_events]
        while len(self._tails) > self.memory_sessions:
            self._tails.popitem(last=False)
        return written

    def forget(self, sids: list[str]) -> None:
        """Drop `sids` from memory (the store has already deleted them)."""
        for sid in sids:
            self._heads.pop(sid, None)
            self._tails.pop(sid, None)

    # -- reading -----------------------------------------------------------------------

    def last_seq(self, sid: str) -> int | None:
        """The newest seq of `sid`, or None for a session never seen."""
        return self._heads.get(sid)

    def heads(self) -> dict[str, int]:
        """The newest seq of every session."""
        return dict(self._heads)

    def range(self, sid: str, from_seq: int, to_seq: int, max_bytes: int) -> tuple[list[bytes], bool]:
        """Frames `from_seq..to_seq` (inclusive, clipped to the log) up to `max_bytes`;
        and whether the answer was cut. The first frame always fits."""
        end = min(to_seq, self._heads.get(sid, 0))
        tail = self._tails.get(sid) or []
        memory_first = tail[0][0] if tail else end + 1
        out: list[bytes] = []
        size = 0
        if from_seq < memory_first:
            rows, cut = self.store.range(sid, from_seq, min(end, memory_first - 1), max_bytes)
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

    @property
    def unsaved(self) -> int:
        """Events appended but not yet written to the store."""
        return len(self._unsaved)

    def statistics(self) -> dict[str, int]:
        """Sessions known, sessions and frames held in memory, frames not yet saved."""
        return {
            "sessions": len(self._heads),
            "memory_sessions": len(self._tails),
            "memory_events": sum(len(t) for t in self._tails.values()),
            "unsaved": len(self._unsaved),
        }

    def __len__(self) -> int:
        return len(self._heads)
