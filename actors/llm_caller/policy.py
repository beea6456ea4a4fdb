"""How hard the llm caller tries: attempts, backoff, watchdog, fallback.

Defaults follow the reference loop: 6 attempts, exponential backoff from 0.5 s
doubling to a 32 s cap with jitter, a 2 s streaming idle watchdog. A server's
`retry-after` is honoured as sent up to `retry_after_cap_s` (120 s); a longer
one fails the call at once, saying so (retrying early would only be refused
again). The stream's bounds are `actors.llm_caller.stalls.StreamBounds`. Every
figure can be set from the environment (`actors.settings`) so that tests (and
impatient users) can shrink them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from actors.llm_caller.stalls import StreamBounds
from actors.settings import RetrySettings

#: The defaults, defined once (`actors.settings.RetrySettings`).
_DEFAULT = RetrySettings()


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry and streaming settings of one llm caller."""

    attempts: int = _DEFAULT.attempts
    base_s: float = _DEFAULT.base_s
    cap_s: float = _DEFAULT.cap_s
    idle_s: float = _DEFAULT.idle_s
    #: No content this long after the request (pings or not): stalled.
    first_s: float = _DEFAULT.first_s
    #: No content this long after the last content (pings flowing): stalled.
    pause_s: float = _DEFAULT.pause_s
    #: The longest `retry-after` honoured; a longer one fails the call.
    retry_after_cap_s: float = _DEFAULT.retry_after_cap_s
    #: A stream that dies with less than this left before the deadline is
    #: retried once without streaming, which cannot stall mid-way.
    fallback_window_s: float = 15.0
    #: Per-request timeout when the job carries no deadline.
    request_timeout_s: float = 600.0

    @classmethod
    def from_settings(cls, retry: RetrySettings) -> RetryPolicy:
        """The policy `OPLOOP_RETRY_ATTEMPTS`, `_BASE_S`, `_MAX_S`, `_AFTER_MAX_S` and
        `OPLOOP_STREAM_IDLE_S`, `_FIRST_S`, `_PAUSE_S` set (`Settings.retry`)."""
        return cls(attempts=retry.attempts, base_s=retry.base_s, cap_s=retry.cap_s,
                   idle_s=retry.idle_s, first_s=retry.first_s, pause_s=retry.pause_s,
                   retry_after_cap_s=retry.retry_after_cap_s)

    @property
    def bounds(self) -> StreamBounds:
        """The stream watchdog's bounds."""
        return StreamBounds(self.idle_s, self.first_s, self.pause_s)

    def backoff_s(self, failed_attempts: int, retry_after_s: float | None) -> float:
        """The wait before the next attempt, after `failed_attempts` failures.

        A server hint wins over the schedule (the caller has checked it against
        `retry_after_cap_s`); the schedule
        doubles from `base_s` and adds up to half a step of jitter so that many
        sessions hit by one outage do not retry in lockstep.
        """
        if retry_after_s is not None:
            return min(retry_after_s, self.retry_after_cap_s)
        step: float = self.base_s * 2.0 ** (failed_attempts - 1)
        return min(self.cap_s, step + random.uniform(0, step / 2))
