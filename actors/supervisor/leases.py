"""Leases of runs another host asked for: such a run ends when its asker goes silent.

A host that asks this one's agent (`ask_machine`, `actors/ask/`) starts the run with
`StartRun.lease_s` and renews it every second (`Renew`). If the link is cut, or the
asking host dies, no renewal comes, and the run is cancelled when its lease runs out:
nothing keeps running here for a caller that is gone. Leases live in memory only: a
supervisor restart forgets them (the resumed run then runs to its own end).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger("oploop.supervisor")

#: The longest lease a caller may ask for (a bound on how long a run outlives it).
MAX_LEASE_S = 600.0
#: The lease of a peer's run that asked for none: a run another host started always
#: ends when that host goes silent, whatever its client sent.
PEER_DEFAULT_LEASE_S = 10.0


class Leases:
    """Lease expiry times by session; `expire(sid)` is called when one runs out."""

    def __init__(self, expire: Callable[[str], None]) -> None:
        self._expire = expire
        #: session -> (lease length, wall-clock expiry)
        self._until: dict[str, tuple[float, float]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    def grant(self, sid: str, lease_s: float) -> None:
        """Give (or renew) `sid` a lease of `lease_s` seconds from now."""
        lease_s = min(max(lease_s, 0.1), MAX_LEASE_S)
        self._until[sid] = (lease_s, time.monotonic() + lease_s)
        if sid not in self._timers:
            self._arm(sid, lease_s)

    def holds(self, sid: str) -> bool:
        """Whether `sid` runs under a lease."""
        return sid in self._until

    def renew(self, sid: str, lease_s: float) -> bool:
        """Extend the lease of `sid`; False when it has none (ended, or never leased)."""
        if sid not in self._until:
            return False
        self.grant(sid, lease_s)
        return True

    def drop(self, sid: str) -> None:
        """Forget `sid`'s lease (its run ended)."""
        self._until.pop(sid, None)
        timer = self._timers.pop(sid, None)
        if timer is not None:
            timer.cancel()

    def _arm(self, sid: str, delay: float) -> None:
        loop = asyncio.get_running_loop()
        self._timers[sid] = loop.call_later(delay, self._check, sid)

    def _check(self, sid: str) -> None:
        # One timer per lease, re-armed to the current expiry: a renewal costs a dict
        # write, not a timer, and the timer fires at most once per lease length.
        self._timers.pop(sid, None)
        held = self._until.get(sid)
        if held is None:
            return
        left = held[1] - time.monotonic()
        if left > 0:
            self._arm(sid, left)
            return
        self.drop(sid)
        log.warning("session %s: its lease ran out (the asking host went silent)", sid)
        try:
            self._expire(sid)
        except Exception:  # a timer callback: a bug here must not stop the loop
            log.exception("ending session %s at its lease's end", sid)

    def close(self) -> None:
        """Cancel every timer (the supervisor stops)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        self._until.clear()
