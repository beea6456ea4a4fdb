"""The llm caller's side of history deltas: each session's last message list.

The supervisor sends a session's whole history once, then per turn only the
messages after a prefix the caller already holds (`LlmJob.keep` messages of
revision `base_rev`). This cache turns such a delta back into the complete
request. It is bounded (least recently used sessions go first); a session it
no longer holds, or holds at another revision, is a `HistoryMiss`, which the
supervisor answers by sending the job in full.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from bus.messages import HISTORY_MISS, LlmJob

#: Sessions whose history a caller keeps; a miss only costs one full send.
MAX_SESSIONS = 4096

__all__ = ["HISTORY_MISS", "BadHistory", "HistoryCache", "HistoryMiss"]


class HistoryMiss(Exception):
    """The job's delta is against a revision this caller does not hold."""

    def __init__(self, key: str, wanted: int, held: int | None) -> None:
        have = "nothing" if held is None else f"revision {held}"
        super().__init__(f"history of {key}: delta against revision {wanted}, caller holds {have}")
        self.key, self.wanted, self.held = key, wanted, held


class BadHistory(ValueError):
    """The job's `request["messages"]` is not a list of messages."""


class HistoryCache:
    """Message lists by session key, each at one revision, least recently used out first."""

    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._held: OrderedDict[str, tuple[int, list[Any]]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def resolve(self, job: LlmJob) -> dict[str, Any]:
        """The complete request of `job`, and remember its messages as `job.rev`."""
        request = job.request
        if not job.history_key:
            return request
        tail = request.get("messages") or []
        if not isinstance(tail, list):
            raise BadHistory(f"history of {job.history_key}: messages must be a list")
        if job.keep > 0:
            held = self._held.get(job.history_key)
            if held is None or held[0] != job.base_rev or len(held[1]) < job.keep:
                self.misses += 1
                raise HistoryMiss(job.history_key, job.base_rev, held[0] if held else None)
            self.hits += 1
            messages = held[1][: job.keep] + tail
            request = {**request, "messages": messages}
        else:
            messages = tail
        self._held[job.history_key] = (job.rev, messages)
        self._held.move_to_end(job.history_key)
        while len(self._held) > self.max_sessions:
            self._held.popitem(last=False)
        return request

    def __len__(self) -> int:
        return len(self._held)
