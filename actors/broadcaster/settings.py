"""The broadcaster's settings, from the environment.

| variable | default | meaning |
|---|---|---|
| `OPLOOP_EVENT_RETENTION_SESSIONS` | 1000 | keep the event logs of this many most recently active sessions (0: no limit) |
| `OPLOOP_EVENT_RETENTION_DAYS` | 30 | delete the log of a session idle for this many days (0: no limit) |
| `OPLOOP_VIEWER_QUEUE` | 100000 | live events queued per viewer before a slow viewer's are dropped (it refetches them from the log) |
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

log = logging.getLogger("oploop.broadcaster")


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        log.error("%s=%r is not a number: using %g", name, raw, default)
        return default
    if value < 0:
        log.error("%s=%r is negative: using %g", name, raw, default)
        return default
    return value


DEFAULT_RETENTION_SESSIONS = 1000
DEFAULT_RETENTION_DAYS = 30.0


@dataclass(frozen=True, slots=True)
class Retention:
    """How many session logs the store keeps, and for how long."""

    sessions: int = DEFAULT_RETENTION_SESSIONS
    days: float = DEFAULT_RETENTION_DAYS

    @classmethod
    def from_env(cls) -> Retention:
        """Defaults overridden by `OPLOOP_EVENT_RETENTION_SESSIONS` / `_DAYS`."""
        return cls(
            sessions=int(_env_number("OPLOOP_EVENT_RETENTION_SESSIONS", DEFAULT_RETENTION_SESSIONS)),
            days=_env_number("OPLOOP_EVENT_RETENTION_DAYS", DEFAULT_RETENTION_DAYS),
        )

    @property
    def max_age_s(self) -> float:
        """`days` in seconds (0: no limit)."""
        return self.days * 86_400.0


#: Live events queued per viewer at the broadcaster (the XPUB's SNDHWM).
DEFAULT_VIEWER_QUEUE = 100_000


def viewer_queue() -> int:
    """`OPLOOP_VIEWER_QUEUE`, default `DEFAULT_VIEWER_QUEUE` (at least 1)."""
    return max(1, int(_env_number("OPLOOP_VIEWER_QUEUE", DEFAULT_VIEWER_QUEUE)))
