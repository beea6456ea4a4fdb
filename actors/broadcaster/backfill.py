"""Filling holes in the ingest stream from the supervisor's session log.

An event lost between the supervisor and the broadcaster shows as one that
comes early (seq > last + 1), or, for a session that went quiet, as a
supervisor whose `last_seq` is ahead of the broadcaster's. In both cases the
broadcaster asks the supervisor's `api` socket for the missing range
(`ReplayRequest`, answered from the session log), publishes what comes back in
order, then the events it held back. Viewers therefore never see the hole:
events are published only in seq order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from actors.broadcaster.log import Appended, EventLog
from bus.codec import decode
from bus.errors import AccessDenied, BadFrame, BusError, RemoteError, RequestTimeout
from bus.messages import Event, ListSessions, ReplayBatch, ReplayRequest, SessionList
from bus.rpc import Requester

#: How long the start-up reconcile waits for the supervisor's session list.
RECONCILE_S = 5.0

log = logging.getLogger("oploop.broadcaster")

#: Early events held per session while the hole before them is fetched.
MAX_HELD = 100_000
#: How long one resend request may take before it is sent again.
REQUEST_TIMEOUT_S = 2.0
#: A supervisor that does not answer this many times running is given up on (for now).
MAX_TIMEOUTS = 5

#: Logs and publishes one event; what `EventLog.append` said.
Accept = Callable[[str, int, bytes], Appended]


class Backfill:
    """Holds early events per session and fetches the hole before them."""

    def __init__(self, supervisor: Requester, log_: EventLog, accept: Accept) -> None:
        self.supervisor = supervisor
        self.log = log_
        self.accept = accept
        self.held: dict[str, dict[int, bytes]] = {}
        self.recovered = 0
        self.lost = 0
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def hold(self, sid: str, seq: int, frame: bytes) -> None:
        """Keep an early event of `sid` and make sure the hole before it is being filled."""
        held = self.held.setdefault(sid, {})
        if len(held) < MAX_HELD:  # beyond, the fetch brings those too (the log has them)
            held[seq] = frame
        self.want(sid, seq - 1)

    def want(self, sid: str, upto: int) -> None:
        """Fetch events of `sid` up to `upto` unless a fetch for it is already running."""
        if sid not in self._tasks and (self.log.last_seq(sid) or 0) < upto:
            self._tasks[sid] = asyncio.create_task(self._fill(sid, upto), name=f"backfill-{sid}")

    def release(self, sid: str) -> None:
        """Log and publish the held events of `sid` that are now next in line."""
        held = self.held.get(sid)
        while held:
            nxt = (self.log.last_seq(sid) or 0) + 1
            frame = held.pop(nxt, None)
            if frame is None:
                # drop what is already logged; stop at the first event still early
                for seq in [s for s in held if s < nxt]:
                    del held[seq]
                break
            self.accept(sid, nxt, frame)
        if not held:
            self.held.pop(sid, None)

    async def reconcile(self) -> None:
        """Compare every session the supervisor holds with the log; fetch what is missing
        (the supervisor's list within `RECONCILE_S`, the request's own deadline)."""
        try:
            reply = await self.supervisor.request(ListSessions(), timeout=RECONCILE_S)
        except BusError as exc:
            log.info("no session list from the supervisor (%s): nothing to reconcile", exc)
            return
        assert isinstance(reply.body, SessionList)
        for summary in reply.body.sessions:
            sid, last = summary.get("session"), summary.get("last_seq")
            if isinstance(sid, str) and isinstance(last, int):
                self.want(sid, last)

    async def _fill(self, sid: str, upto: int) -> None:
        timeouts = 0
        try:
            while True:
                last = self.log.last_seq(sid) or 0
                held = self.held.get(sid)
                target = max(upto, min(held) - 1 if held else 0)
                if last >= target:
                    return
                try:
                    reply = await self.supervisor.request(
                        ReplayRequest(last + 1, target), sid=sid, timeout=REQUEST_TIMEOUT_S
                    )
                except RequestTimeout:
                    timeouts += 1
                    if timeouts >= MAX_TIMEOUTS:
                        log.error("supervisor does not answer: events %d..%d of %s wait",
                                  last + 1, target, sid)
                        return
                    continue
                except RemoteError as exc:
                    if exc.code != "gone":
                        # Not lost: the supervisor cannot give them now ("unavailable").
                        # Waiting for a failing commit, they are pushed once it succeeds;
                        # from a log it cannot read, a later hole asks again.
                        log.warning("events %d..%d of %s wait: %s", last + 1, target, sid,
                                    exc.message)
                        return
                    self._give_up(sid, last, target, exc.message)
                    continue
                except AccessDenied as exc:  # our own host refusing our key: set up wrong
                    log.error("cannot ask the supervisor for events of %s: %s", sid, exc)
                    return
                timeouts = 0
                batch = reply.body
                assert isinstance(batch, ReplayBatch)
                self._take(sid, batch.events)
                # Lost only if nothing came, from the answer or meanwhile from ingest:
                # the supervisor pushes what it resends too, and whatever of the answer
                # ingest brought first is a duplicate here, not a sign of loss (a cut
                # answer taken that way would otherwise skip the rest of `target`).
                if (self.log.last_seq(sid) or 0) <= last:
                    self._give_up(sid, last, target, "the supervisor sent none of them")
        finally:
            self._tasks.pop(sid, None)
            self.release(sid)

    def _take(self, sid: str, frames: list[bytes]) -> None:
        """Accept resent frames in order."""
        for frame in frames:
            try:
                env = decode(frame)
            except BadFrame:
                continue
            if env.sid == sid and isinstance(env.body, Event):
                seq = env.body.seq
                skipped = self.log.skip_to(sid, seq)  # the log did not reach back so far (removed)
                if skipped:
                    self.lost += skipped
                    log.error("%d events of %s before #%d are lost (not kept by the supervisor)",
                              skipped, sid, seq)
                if self.accept(sid, seq, frame).stored:
                    self.recovered += 1
        self.release(sid)

    def _give_up(self, sid: str, last: int, target: int, why: str) -> None:
        """Nobody has events last+1..target: record the hole and go on after it."""
        skipped = self.log.skip_to(sid, target + 1)
        self.lost += skipped
        log.error("events %d..%d of %s are lost (%s)", last + 1, target, sid, why)
        self.release(sid)

    async def aclose(self) -> None:
        """Stop every fetch."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
