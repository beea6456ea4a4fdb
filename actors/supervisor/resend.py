"""The last events of every session, kept so that a restarted broadcaster loses none.

Events the broadcaster had received but not yet written to its store when it
was killed (its socket queue, its last unflushed batch) exist nowhere else.
The broadcaster notices the hole — a seq that comes early, or a session whose
`last_seq` is ahead of its log — and asks for the range on the supervisor's
`api` socket with a `ReplayRequest`, answered from here.
"""

from __future__ import annotations

from collections import deque

from bus.messages import Body, ErrorReply, ReplayBatch, ReplayRequest

#: Events kept per session: far more than a broadcaster can have in flight (its
#: ingest queue holds a few thousand, its store is written every few ms).
RESEND_EVENTS = 20_000
#: Longest resend answer, in bytes of events; the broadcaster asks again for the rest.
RESEND_BATCH_BYTES = 1 << 20


class ResendRing:
    """Encoded events per session, the newest `per_session` of each."""

    def __init__(self, per_session: int = RESEND_EVENTS) -> None:
        self.per_session = per_session
        self._rings: dict[str, deque[tuple[int, bytes]]] = {}

    def add(self, sid: str, seq: int, frame: bytes) -> None:
        """Keep event `seq` of `sid` (already encoded)."""
        ring = self._rings.get(sid)
        if ring is None:
            ring = self._rings[sid] = deque(maxlen=self.per_session)
        ring.append((seq, frame))

    def forget(self, sid: str) -> None:
        """Drop the events of `sid` (the session was deleted)."""
        self._rings.pop(sid, None)

    def answer(self, sid: str, req: ReplayRequest) -> Body:
        """A `ReplayBatch` of `from_seq..to_seq` — starting later than `from_seq` when the
        ring no longer reaches back that far —, or an `ErrorReply` (`gone`) when it holds
        none of them."""
        ring = self._rings.get(sid)
        if not ring:
            return ErrorReply("gone", f"no events kept for {sid!r}")
        first, last = ring[0][0], ring[-1][0]
        to_seq = min(req.to_seq or last, last)
        if req.from_seq > to_seq or to_seq < first:
            return ErrorReply(
                "gone", f"events {req.from_seq}..{to_seq} of {sid} are not kept (ring {first}..{last})"
            )
        frames: list[bytes] = []
        size = 0
        for seq, frame in ring:  # seq order; a ring of 20k is cheap to walk on a rare resend
            if seq < req.from_seq:
                continue
            if seq > to_seq:
                break
            if frames and size + len(frame) > RESEND_BATCH_BYTES:
                return ReplayBatch(frames, last, True)
            frames.append(frame)
            size += len(frame)
        return ReplayBatch(frames, last, False)
