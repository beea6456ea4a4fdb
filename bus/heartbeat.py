"""Liveness by heartbeats (Paranoid Pirate): any message counts as life.

Peers beat every `INTERVAL_S`; a peer silent for `MISSES` intervals is dead.
"""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import Generic, TypeVar

INTERVAL_S = 1.0
MISSES = 3

K = TypeVar("K", bound=Hashable)


class Liveness(Generic[K]):
    """When each peer was last heard from, and which ones have gone silent."""

    def __init__(self, interval_s: float = INTERVAL_S, misses: int = MISSES) -> None:
        self.timeout_s = interval_s * misses
        self._seen: dict[K, float] = {}

    def heard(self, peer: K, now: float | None = None) -> None:
        """Record a sign of life from `peer`."""
        self._seen[peer] = time.monotonic() if now is None else now

    def forget(self, peer: K) -> None:
        """Stop tracking `peer`."""
        self._seen.pop(peer, None)

    def expired(self, now: float | None = None) -> list[K]:
        """Peers silent for longer than the timeout (they stay tracked until forgotten)."""
        limit = (time.monotonic() if now is None else now) - self.timeout_s
        return [p for p, t in self._seen.items() if t < limit]

    def __contains__(self, peer: object) -> bool:
        return peer in self._seen
