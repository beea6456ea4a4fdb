"""When to restart a dead actor: exponential backoff, and a storm cap.

Kept apart from the process handling (as circus keeps flapping detection in a
plugin): it only consumes "it died at t" and answers "restart after s", or
"give up".
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass
class RestartPolicy:
    """Backoff from `base_s` doubling to `cap_s`; `storm` restarts within `window_s`
    mark the actor failed. A run longer than `stable_s` resets the backoff."""

    base_s: float = 0.1
    cap_s: float = 5.0
    storm: int = 5
    window_s: float = 30.0
    stable_s: float = 10.0
    _deaths: deque[float] = field(default_factory=deque)
    _streak: int = 0

    def on_death(self, now: float, ran_s: float) -> float | None:
        """Seconds to wait before restarting, or None: the actor has failed."""
        self._deaths.append(now)
        while self._deaths and self._deaths[0] < now - self.window_s:
            self._deaths.popleft()
        if len(self._deaths) >= self.storm:
            return None
        self._streak = 0 if ran_s >= self.stable_s else self._streak + 1
        return min(self.cap_s, self.base_s * 2.0 ** max(0, self._streak - 1))
