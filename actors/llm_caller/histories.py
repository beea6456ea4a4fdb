"""The llm caller's side of history deltas: each session's last message list.

The supervisor sends a session's whole history once, then per turn only the
messages after a prefix the caller already holds (`LlmJob.keep` messages of
revision `base_rev`), and the rest of the request (system prompt, tools) only
when it changed (`LlmJob.same_rest`). This cache turns such a delta back into
the complete request. It is bounded (least recently used sessions go first); a session it
no longer holds, or holds at another revision, is a `HistoryMiss`, which the
supervisor answers by sending the job in full.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from bus.messages import HISTORY_MISS, LlmJob

#: Sessions whose history a caller keeps (about the running ones: 1,000 by default);
#: a miss only costs one full send.
MAX_SESSIONS = 1_024
#: Approximate bytes of history a caller keeps over all sessions (the least recently
#: used go first): a count alone would let 1,024 long histories hold gigabytes.
MAX_BYTES = 256 << 20
#: What a message costs beyond its text (dict, blocks, ids), for the estimate.
MESSAGE_OVERHEAD = 128

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

    def __init__(self, max_sessions: int = MAX_SESSIONS, max_bytes: int = MAX_BYTES) -> None:
        self.max_sessions = max_sessions
        self.max_bytes = max_bytes
        #: key -> (revision, messages, cumulative approximate size after each message,
        #: the request but its messages)
        self._held: OrderedDict[str, tuple[int, list[Any], list[int], dict[str, Any]]] = (
            OrderedDict())
        self.bytes = 0
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
        if job.same_rest and (job.keep <= 0 or len(request) != 1):
            raise BadHistory(f"history of {job.history_key}: same_rest is a delta of "
                             "messages alone")
        if job.keep > 0:
            held = self._held.get(job.history_key)
            if held is None or held[0] != job.base_rev or len(held[1]) < job.keep:
                self.misses += 1
                raise HistoryMiss(job.history_key, job.base_rev, held[0] if held else None)
            self.hits += 1
            messages = held[1][: job.keep] + tail
            sizes = _sizes(held[2][: job.keep], tail)  # only the new messages are measured
            rest = held[3] if job.same_rest else _rest(request)
            request = {**rest, "messages": messages}
        else:
            messages = tail
            sizes = _sizes([], tail)
            rest = _rest(request)
        self._forget(job.history_key)
        self._held[job.history_key] = (job.rev, messages, sizes, rest)
        self.bytes += sizes[-1] if sizes else 0
        while len(self._held) > self.max_sessions or (self.bytes > self.max_bytes
                                                      and len(self._held) > 1):
            self._forget(next(iter(self._held)))
        return request

    def forget(self, keys: list[str]) -> list[Any]:
        """Drop the histories of `keys` (sessions the supervisor holds no more: no delta
        will build on them); the messages dropped."""
        dropped: list[Any] = []
        for key in keys:
            held = self._forget(key)
            if held is not None:
                dropped.extend(held[1])
        return dropped

    def _forget(self, key: str) -> tuple[int, list[Any], list[int], dict[str, Any]] | None:
        held = self._held.pop(key, None)
        if held is not None and held[2]:
            self.bytes -= held[2][-1]
        return held

    def __len__(self) -> int:
        return len(self._held)


def _rest(request: dict[str, Any]) -> dict[str, Any]:
    """The request but its messages (what a `same_rest` job leaves out)."""
    return {k: v for k, v in request.items() if k != "messages"}


def _sizes(kept: list[int], tail: list[Any]) -> list[int]:
    """Cumulative approximate sizes: `kept` (already measured) then each of `tail`."""
    out = list(kept)
    total = out[-1] if out else 0
    for message in tail:
        total += _approx_size(message)
        out.append(total)
    return out


def _approx_size(message: Any) -> int:
    """A message's size, roughly: its text and tool contents plus a fixed overhead."""
    if not isinstance(message, dict):
        return MESSAGE_OVERHEAD
    content = message.get("content")
    if isinstance(content, str):
        return MESSAGE_OVERHEAD + len(content)
    size = MESSAGE_OVERHEAD
    for block in content or ():
        if isinstance(block, dict):
            for value in block.values():
                if isinstance(value, str):
                    size += len(value)
                elif value is not None and not isinstance(value, bool | int | float):
                    size += len(str(value))  # tool inputs, nested result blocks: rare
    return size
