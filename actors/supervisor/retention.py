"""Retention: which finished sessions to delete, decided by a pure function.

`select_prunable(overview, policy, now)` takes what the store says of every
session (`SessionOverview`), a `PrunePolicy` and the time, and returns the ids
to delete; the supervisor carries that out (`SessionStore.remove`, then the
broadcaster's copy, then a tombstone so the id is answered "no such session
(pruned)"). A running session is never selected, whatever the rules say.

The rules, each off when its limit is None:
  - age: a session whose last activity is older than `max_age_s`;
  - count: all but the `max_sessions` most recently active (running ones count
    among those kept: they are kept in any case);
  - bytes: the least recently active, until what is kept fits in `max_bytes`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from actors.config import Retention
from actors.sessionlog import SessionOverview


class SessionStore(Protocol):
    """The durable store as retention uses it (the journal today; the session log next)."""

    def sessions_overview(self) -> list[SessionOverview]:
        """Every stored session, cheaply (no history is decoded)."""

    def remove(self, sids: Collection[str]) -> int:
        """Delete `sids` and everything stored of them, in one transaction; returns how
        many of them the store held."""


@dataclass(frozen=True, slots=True)
class PrunePolicy:
    """The limits one pruning applies; None turns a rule off."""

    max_age_s: float | None = None
    max_sessions: int | None = None
    max_bytes: int | None = None

    @classmethod
    def configured(cls, retention: Retention, *, older_than_s: float | None = None,
                   keep: int | None = None) -> PrunePolicy:
        """`[retention]` (where 0 means no limit), with what a `prune` request overrides:
        `older_than_s` for the age, `keep` for the count (0 there keeps none)."""
        return cls(
            max_age_s=older_than_s if older_than_s is not None else retention.max_age_s or None,
            max_sessions=keep if keep is not None else retention.max_sessions or None,
            max_bytes=retention.max_bytes or None,
        )


def select_prunable(overview: Iterable[SessionOverview], policy: PrunePolicy,
                    now: float) -> list[str]:
    """The sessions `policy` deletes at `now`, least recently active first; never a
    running one."""
    newest_first = sorted(overview, key=lambda s: (s.last_activity, s.sid), reverse=True)
    doomed: set[str] = set()
    if policy.max_age_s is not None:
        cutoff = now - policy.max_age_s
        doomed.update(s.sid for s in newest_first if s.last_activity < cutoff and not s.running)
    if policy.max_sessions is not None:
        kept = sum(1 for s in newest_first if s.running)
        for s in newest_first:
            if s.sid in doomed or s.running:
                continue
            if kept < policy.max_sessions:
                kept += 1
            else:
                doomed.add(s.sid)
    if policy.max_bytes is not None:
        total = sum(s.bytes for s in newest_first if s.sid not in doomed)
        for s in reversed(newest_first):  # least recently active first
            if total <= policy.max_bytes:
                break
            if s.sid not in doomed and not s.running:
                doomed.add(s.sid)
                total -= s.bytes
    return [s.sid for s in reversed(newest_first) if s.sid in doomed]
