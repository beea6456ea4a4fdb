"""Telling the llm callers which sessions' histories they may drop.

An llm caller keeps each session's message list, so that a model call is sent as a
delta against it (`llm_caller/histories.py`). Once a session leaves the supervisor's
memory (its run ended and that end is committed), no delta will ever build on what a
caller holds of it: the session's next run starts from a fresh `TurnCache` and sends
its first call in full. Until newer histories pushed it out, that history was dead
weight in the caller: 10.5 KB an ended one-turn session, up to `histories.MAX_BYTES`
(256 MiB) in all for long ones. Dropped, its memory serves the next sessions' (the
caller's RSS does not shrink: Python keeps its freed arenas; it stops growing).

The callers that hold such a history are told (`ForgetSessions` on `work`), in one
message per caller every `EVERY_S`: a message per ended run would add about one
message in ten to a busy host's. A model call of the session sent to that caller
meanwhile (a new run) cancels its pending forget: what that call sends replaces the
dead history, and must be kept.

Only the host's own llm callers are told. A worker machine may run an older oploop,
which would take the message for a job; its callers keep their bounds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

#: Seconds between the messages to one caller (forgetting is never urgent: the
#: caller's bounds hold meanwhile).
EVERY_S = 1.0


class HistoryForgets:
    """Sessions whose histories llm callers may drop, by caller, sent every `EVERY_S`."""

    def __init__(self, send: Callable[[bytes, list[str]], None]) -> None:
        #: `send(caller, sids)`: tell one caller (it checks the caller is still there).
        self._send = send
        self._pending: dict[bytes, set[str]] = {}
        self._timer: asyncio.TimerHandle | None = None

    def later(self, sid: str, callers: Iterable[bytes]) -> None:
        """`callers` hold a history of `sid`, which no call will build on again."""
        for caller in callers:
            self._pending.setdefault(caller, set()).add(sid)
        if self._pending and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(EVERY_S, self.flush)

    def used(self, caller: bytes, sid: str) -> None:
        """A model call of `sid` goes to `caller`: the history it makes there is alive."""
        pending = self._pending.get(caller)
        if pending is not None:
            pending.discard(sid)

    def flush(self) -> None:
        """Tell each caller what it may drop (what the timer does)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, {}
        for caller, sids in pending.items():
            if sids:
                self._send(caller, sorted(sids))

    def pending(self, caller: bytes) -> set[str]:
        """The sessions `caller` will be told of (a copy)."""
        return set(self._pending.get(caller, ()))

    def close(self) -> None:
        """Stop the timer; what is pending is not sent (the callers' bounds hold)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._pending.clear()
