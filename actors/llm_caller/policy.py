"""How hard the llm caller tries: attempts, backoff, watchdog, fallback.

Defaults follow the reference loop: 6 attempts, exponential backoff from 0.5 s
doubling to a 32 s cap with jitter, a server's `retry-after` honoured (capped),
a 2 s streaming idle watchdog. Every figure can be set from the environment
(`actors.settings`) so that tests (and impatient users) can shrink them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from actors.settings import RetrySettings


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retry and streaming settings of one llm caller."""

    attempts: int = 6
    base_s: float = 0.5
    cap_s: float = 32.0
    idle_s: float = 2.0
    #: A stream that dies with less than this left before the deadline is
    #: retried once without streaming, which cannot stall mid-way.
    fallback_window_s: float = 15.0
    #: Per-request timeout when the job carries no deadline.
    request_timeout_s: float = 600.0

    @classmethod
    def from_settings(cls, retry: RetrySettings) -> RetryPolicy:
        """The policy `OPLOOP_RETRY_ATTEMPTS`, `_BASE_S`, `_MAX_S` and
        `OPLOOP_STREAM_IDLE_S` set (`Settings.retry`)."""
        return cls(attempts=retry.attempts, base_s=retry.base_s, cap_s=retry.cap_s,
                   idle_s=retry.idle_s)

    def backoff_s(self, failed_attempts: int, retry_after_s: float | None) -> float:
        """The wait before the next attempt, after `failed_attempts` failures.

        A server hint wins over the schedule but is capped like it; the schedule
        doubles from `base_s` and adds up to half a step of jitter so that many
        sessions hit by one outage do not retry in lockstep.
        """
        if retry_after_s is not None:
            return min(retry_after_s, self.cap_s)
        step: float = self.base_s * 2.0 ** (failed_attempts - 1)
        return min(self.cap_s, step + random.uniform(0, step / 2))
