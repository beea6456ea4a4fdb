"""What a session's turn path need not redo every turn: the supervisor's memo.

Two costs grow with history length when done from scratch each turn:

- sanitising the history (`history.sanitize`, O(messages) with a large
  constant: ~1.7 ms at 400 messages here). `TurnCache.sanitized` remembers how
  far the history is known valid and checks only the messages appended since;
  anything else (a history replaced or shortened, a message found invalid)
  falls back to the full `sanitize`.
- sending the whole history to an llm caller, which encodes and decodes it
  again. `TurnCache.llm_job` builds a job that each caller receives as a delta
  against the message list it already holds (see `bus.messages.LlmJob`),
  falling back to a full send for a caller that holds nothing, or after a
  `history_miss` (`forget_callers`). The rest of the request (system prompt,
  tools: ~2 KB a turn) goes only when it changed since that caller's revision.

Both rely on how the loop treats a history: messages are never changed in
place (every edit builds a new dict), so an unchanged message is the same
object from one turn to the next and comparing by identity is exact; and a
session's history list only grows at its end (appended to, or its last message
replaced). Code that rewrites earlier messages must assign a new list to
`session.history`, which the memo then checks in full.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from actors.core.history import Message, sanitize, valid_from
from bus.messages import LlmJob

#: Callers whose copy of a session's history is tracked (older ones are forgotten).
MAX_CALLERS = 4


@dataclass(slots=True)
class _Held:
    """What one llm caller holds of a session: a revision and its message list."""

    rev: int
    messages: list[Message]
    rest: dict[str, Any]  # the request but its messages


@dataclass(frozen=True, slots=True)
class PreparedLlmJob:
    """One turn's llm job: in full, and as each caller should receive it."""

    full: LlmJob
    for_caller: Callable[[bytes], LlmJob]


class TurnCache:
    """The per-session memo of the turn path (one per `Session`)."""

    __slots__ = ("_valid_of", "_valid_len", "_valid_last", "_held", "_rev")

    def __init__(self) -> None:
        self._valid_of: list[Message] | None = None
        self._valid_len = 0
        self._valid_last: Message | None = None
        self._held: dict[bytes, _Held] = {}
        self._rev = 0

    # -- sanitising ---------------------------------------------------------------------

    def sanitized(self, history: list[Message]) -> list[Message]:
        """`sanitize(history)`, checking only what was appended since the last call."""
        n = len(history)
        known = self._valid_len
        same = (
            self._valid_of is history and 0 < known <= n
            and history[known - 1] is self._valid_last
        )
        # The last known message is re-checked: what follows it may (not) answer it.
        if same and valid_from(history, known - 1):
            self._remember(history)
            return list(history)
        out = sanitize(history)
        if out == history and valid_from(history, 0):
            self._remember(history)
        else:
            self._valid_of = None
        return out

    def _remember(self, history: list[Message]) -> None:
        self._valid_of = history
        self._valid_len = len(history)
        self._valid_last = history[-1] if history else None

    # -- history deltas -----------------------------------------------------------------

    def llm_job(self, key: str, request: dict[str, Any], stream: bool) -> PreparedLlmJob:
        """This turn's job; `for_caller(worker)` is what that worker is sent."""
        self._rev += 1
        rev = self._rev
        messages: list[Message] = request.get("messages") or []
        rest = {k: v for k, v in request.items() if k != "messages"}
        full = LlmJob(request, stream, history_key=key, rev=rev)

        def for_caller(worker: bytes) -> LlmJob:
            held = self._held.pop(worker, None)
            self._held[worker] = _Held(rev, messages, rest)  # newest last: the oldest goes first
            while len(self._held) > MAX_CALLERS:
                del self._held[next(iter(self._held))]
            if held is None:
                return full
            keep = _common_prefix(held.messages, messages)
            if keep == 0:
                return full
            # (Equal values are mostly the same objects: `build_request` memoises them.)
            if held.rest == rest:
                return LlmJob({"messages": messages[keep:]}, stream, history_key=key,
                              base_rev=held.rev, keep=keep, rev=rev, same_rest=True)
            tail = {**request, "messages": messages[keep:]}
            return LlmJob(tail, stream, history_key=key, base_rev=held.rev, keep=keep, rev=rev)

        return PreparedLlmJob(full, for_caller)

    def callers(self) -> list[bytes]:
        """The llm callers (worker ids) sent this session's history."""
        return list(self._held)

    def forget_callers(self) -> None:
        """Assume no caller holds anything (after a `history_miss`): send in full."""
        self._held.clear()


def _common_prefix(old: list[Message], new: list[Message]) -> int:
    """How many leading messages `old` and `new` share (by identity: never edited in place)."""
    n = min(len(old), len(new))
    i = 0
    while i < n and old[i] is new[i]:
        i += 1
    return i
