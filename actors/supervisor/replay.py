"""The answer to a `ReplayRequest`: events the broadcaster lost, read back from the log.

A pure look-up over the session log and the events still waiting for a commit;
the supervisor commits what it has emitted first (`Supervisor.resend`), then
asks `replay_batch`.
"""

from __future__ import annotations

from collections.abc import Iterable

from actors.logstore import SessionStore
from actors.sessionlog import JournalError
from bus.messages import ErrorReply, ReplayBatch, ReplayRequest

#: Longest resend answer to the broadcaster, in bytes of events (it asks again).
RESEND_BATCH_BYTES = 1 << 20


def replay_batch(log: SessionStore, sid: str, req: ReplayRequest,
                 waiting: Iterable[tuple[str, int, bytes]]) -> ReplayBatch | ErrorReply:
    """Events `req` asks for from `log` (at most `RESEND_BATCH_BYTES` of them), or why
    not; `waiting`: (sid, seq, frame) of the events whose commit failed so far."""
    try:
        last = log.last_seq(sid)
        if last is None:
            return _not_kept(sid, req, waiting, f"no events kept for {sid!r}")
        to_seq = min(req.to_seq or last, last)
        rows, more = log.range(sid, req.from_seq, to_seq, RESEND_BATCH_BYTES)
    except JournalError as exc:
        return ErrorReply("unavailable", str(exc))
    if not rows:
        return _not_kept(sid, req, waiting,
                         f"events {req.from_seq}..{to_seq} of {sid} are not kept")
    return ReplayBatch([frame for _, frame in rows], last, more)


def _not_kept(sid: str, req: ReplayRequest, waiting: Iterable[tuple[str, int, bytes]],
              why: str) -> ErrorReply:
    """The log has none of what `req` asks for: "gone", unless they wait for a failing
    commit, "unavailable" (they are pushed once it succeeds: the broadcaster waits)."""
    if any(s == sid and seq >= req.from_seq for s, seq, _ in waiting):
        return ErrorReply("unavailable", f"events of {sid} from #{req.from_seq} wait for "
                                         "the session log to commit them")
    return ErrorReply("gone", why)
