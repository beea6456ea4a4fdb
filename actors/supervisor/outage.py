"""A shared store out of reach mid-run (PostgreSQL restarted, stopped, its link cut):
the sessions wait, say so, and go on when it returns.

An outage begins at the first commit that fails for another reason than a lost
lease, or at the first failed lease renewal (a session waiting on a long model call
commits nothing for a while):

- each session running here gets one `STORE_UNAVAILABLE` event `{error, since}` as
  its next event, in the log's order like any other;
- the dispatcher holds new jobs (model calls, tool calls) in its queues, so the
  sessions wait: what is in flight finishes, its events pending with the batch;
- the batch is tried again every `JOURNAL_RETRY_S` (`Supervisor._commit_failed`).

Nothing is published before its commit, during an outage too: a viewer then sees
nothing new (rather than events a host taking the session over could contradict),
and `oploop status` says since when the store is unavailable and which sessions
wait. When a commit succeeds again, `STORE_UNAVAILABLE` goes out with everything
that waited behind it, and each session still running gets `STORE_AVAILABLE`
`{since, down_s}` (a run that ended meanwhile has its terminal event as its
continuation: nothing of a run follows that). Nothing acknowledged is lost: a reply
that waits for a commit (`reply_committed`) waits for this one.

Past a lease without renewing, this host cannot tell whether another took its
sessions: `Ownership` stops them here (they leave the outage, their pending events
dropped, never acknowledged), and whichever host claims them once the store is back
resumes them from the store (`RESUMED`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from actors.core.session import Session
from bus.vocab import EventType

log = logging.getLogger("oploop.outage")

Emit = Callable[[Session, str, int, dict[str, Any]], None]


class Outage:
    """The store's outage as this supervisor lives it (at most one at a time)."""

    def __init__(self, emit: Emit, running: Callable[[], Iterable[Session]],
                 session: Callable[[str], Session | None], hold: Callable[[bool], None]) -> None:
        self._emit = emit
        self._running = running
        self._session = session
        self._hold = hold
        #: When the outage began (Unix time); None: the store is available.
        self.since: float | None = None
        self.error = ""
        #: Sessions told `STORE_UNAVAILABLE`, to be told `STORE_AVAILABLE`.
        self.waiting: set[str] = set()

    @property
    def active(self) -> bool:
        """Whether the store is unavailable now."""
        return self.since is not None

    def begin(self, error: str) -> None:
        """The store cannot be reached: tell every running session, hold new jobs
        (nothing if an outage is already under way)."""
        if self.since is not None:
            return
        self.since, self.error = time.time(), error
        for session in self._running():
            self._emit(session, EventType.STORE_UNAVAILABLE, session.run_turn,
                       {"error": error, "since": self.since})
            self.waiting.add(session.id)
        self._hold(True)
        log.error("the store is unavailable (%s): %d session(s) wait for it",
                  error, len(self.waiting))

    def end(self) -> None:
        """A commit went through (the `STORE_UNAVAILABLE` events with it): the sessions
        still running go on, each told `STORE_AVAILABLE`, their jobs released."""
        if self.since is None:
            return
        since, self.since = self.since, None
        down = time.time() - since
        for sid in sorted(self.waiting):
            session = self._session(sid)
            if session is not None and not session.run_over:
                self._emit(session, EventType.STORE_AVAILABLE, session.run_turn,
                           {"since": since, "down_s": round(down, 3)})
        log.warning("the store is available again after %.1f s: %d session(s) go on",
                    down, len(self.waiting))
        self.waiting.clear()
        self._hold(False)

    def forget(self, sids: set[str]) -> None:
        """`sids` stopped here (their leases lapsed): they are no longer waiting here."""
        self.waiting -= sids

    def overview(self) -> dict[str, Any]:
        """For `oploop status`: {} when the store is available, else since when, why,
        and the sessions waiting."""
        if self.since is None:
            return {}
        return {"since": self.since, "down_s": round(time.time() - self.since, 1),
                "error": self.error, "sessions": sorted(self.waiting)}
