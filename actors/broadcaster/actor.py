"""The broadcaster process."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

import zmq

from actors.broadcaster.backfill import Backfill
from actors.broadcaster.log import Appended, EventLog, SessionGone
from actors.broadcaster.store import STORE_FILE, EventStore, StoreError
from actors.eventcounts import EventCounts
from actors.runtime import notify_ready, run_actor
from actors.settings import Settings
from bus.codec import decode, event_head
from bus.endpoints import Endpoints
from bus.errors import BadFrame, BusError
from bus.messages import (
    Envelope,
    Event,
    EventBatch,
    ForgetSessions,
    ReplayBatch,
    ReplayRequest,
    Stats,
    StatsReply,
    Subscribed,
)
from bus.rpc import Requester
from bus.sockets import Reactor

if TYPE_CHECKING:
    from actors.broadcaster.follow import Follower

log = logging.getLogger("oploop.broadcaster")

#: Replay answers in batches of at most this many bytes of events.
REPLAY_BATCH_BYTES = 1 << 20

#: Kept small on purpose: what waits beyond it stays in the supervisor's PUSH
#: queue, which survives a broadcaster restart, where this queue dies with it. In
#: messages: most are `EventBatch`es of a commit's events (up to the supervisor's
#: `BATCH_BYTES`), so this holds about as many events as 2,000 single ones did.
INGEST_RCVHWM = 500

#: Ends the topic of an event of this host's own supervisor on a shared store: another
#: host's follower subscribes to `sid + OWN` (a viewer's `sid` matches it too, a prefix).
OWN = b"\x00"

#: Live events queued per viewer (the XPUB's SNDHWM; `OPLOOP_VIEWER_QUEUE`).
DEFAULT_VIEWER_QUEUE = 100_000


class Broadcaster:
    """Logs sequenced events, publishes them in order, and replays any range on request."""

    def __init__(
        self, endpoints: Endpoints, store: EventStore, viewer_queue: int = DEFAULT_VIEWER_QUEUE,
    ) -> None:
        self.log = EventLog(store)
        self.reactor = Reactor()
        self.viewers = 0
        self._subscribed: Counter[bytes] = Counter()  # viewers per topic
        self.refused: dict[str, int] = {}
        #: What the events published add up to (the gateway's `/metrics` asks, `Stats`).
        self.counts = EventCounts()
        self.gate = endpoints.gate(self.reactor.ctx)  # admits CURVE clients; before any bind
        self.replay = self.reactor.add(
            zmq.ROUTER, "replay", self.handle_replay, bind=endpoints.binds("replay"),
            secure=endpoints.server_side("replay"), reply_errors=True,
        )
        self.events = self.reactor.add(
            zmq.XPUB, "events", bind=endpoints.binds("events"),
            secure=endpoints.server_side("events"),
            # PUB drops silently per subscriber at its high-water mark: high on
            # purpose, and seq + replay recover whatever is still dropped.
            raw_handler=self.handle_subscription, hwm=viewer_queue,
        )
        # Every (un)subscription reaches us, not only a topic's first and last, so
        # that `viewers` counts viewers rather than watched sessions.
        self.events.sock.setsockopt(zmq.XPUB_VERBOSER, 1)
        self.ingest = self.reactor.add(
            zmq.PULL, "ingest", self.handle_event, bind=endpoints.address("ingest"),
            hwm=INGEST_RCVHWM,
        )
        self.supervisor = Requester(self.reactor, "supervisor", endpoints.address("api"),
                                    endpoints.client_side("api"))
        self.backfill = Backfill(self.supervisor, self.log, self.accept)
        #: On a shared store: the live events of sessions other hosts run (`follow.py`).
        self.follower: Follower | None = None
        shared = store.shared
        if shared is not None:
            from actors.broadcaster.follow import Follower
            from actors.pglog import PgSessionLog

            assert isinstance(shared, PgSessionLog)
            from actors.peerhosts import reach_of

            home = endpoints.run_dir.parent
            # The other hosts may follow this one's events: its gate admits their keys.
            keyring = self.gate.keyring if self.gate is not None else None
            admit = functools.partial(setattr, keyring, "hosts") if keyring else None
            self.follower = Follower(self.reactor, shared, home, self.followed, OWN,
                                     admit, reach_of(home).client_key)

    # -- ingest ------------------------------------------------------------------------

    def handle_event(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        """Log an event from the supervisor and publish it, or hold it if it came early;
        the same for each event of an `EventBatch`, in order; or drop the logs of
        deleted sessions."""
        if isinstance(env.body, EventBatch):
            self._take_batch(env.body.frames)
            return
        if isinstance(env.body, ForgetSessions):
            self.forget(env.body.sessions)
            return
        if not isinstance(env.body, Event):
            self._refuse(f"ingest:{env.kind}")
            return
        self._ingest(env.sid, env.body.seq, frame, env.body.type, env.body.data)

    def _ingest(self, sid: str, seq: int, frame: bytes, kind: str,
                data: dict[str, Any]) -> None:
        """Log, publish and count event `seq` of `sid` from this host's supervisor, or
        hold it if it came early."""
        if not sid:
            self._refuse("no_session")
            return
        appended = self.accept(sid, seq, frame, own=True, kind=kind, data=data)
        if appended.stored:
            if sid in self.backfill.held:
                self.backfill.release(sid)
        elif appended.gap:
            self.backfill.hold(sid, seq, frame)
        elif self.follower is None or appended.reason != "duplicate":
            # (On a shared store a duplicate is expected: a replay caught this log up
            # from the store, or a followed host sent the event first.)
            self._refuse(appended.reason)

    def _take_batch(self, frames: list[bytes]) -> None:
        """The events of one commit: each taken as if it had come alone. One that does
        not decode is logged, counted (`refused`) and dropped; the rest go on (a
        session's later events then wait as a gap, which `Backfill` fetches)."""
        for frame in frames:
            env = None
            try:
                head = event_head(frame)  # (the usual: a plain event, only its head read)
                if head is None:
                    env = decode(frame)
            except BadFrame as exc:
                self._refuse(f"batch:{exc.reason}")
                total = sum(self.refused.values())
                if total <= 20 or total % 1000 == 0:  # (a flood does not flood the log)
                    log.warning("ingest: an event of a batch dropped (kind %s): %s: %s",
                                exc.kind or "?", exc.reason, exc.detail)
                continue
            if env is not None and isinstance(env.body, EventBatch):  # (one level only)
                self._refuse("batch:nested")
                continue
            try:
                if head is not None:
                    sid, seq, kind, data = head
                    self._ingest(sid, seq, frame, kind, data)
                else:
                    self.handle_event(None, env, frame)
            except Exception:  # as the port does for a message: one event, not the rest
                self._refuse("batch:handler_error")
                log.exception("ingest: an event of a batch failed (%s)",
                              head[0] if head is not None else env.sid if env else "?")

    def accept(self, sid: str, seq: int, frame: bytes, *, own: bool = False,
               kind: str | None = None, data: dict[str, Any] | None = None) -> Appended:
        """Append event `seq` of `sid` to the log and, if it was next, publish and count
        it. `own`: it came from this host's supervisor (on a shared store its topic then
        carries `OWN`, which the other hosts' followers subscribe to: they never get
        back what they relayed here). `kind`, `data`: the event's type and data, when
        the caller has them (else the frame is decoded here, for the counts: recovered
        events only)."""
        appended = self.log.append(sid, seq, frame)
        if not appended.stored:
            return appended
        self._count(frame, kind, data)
        topic = sid.encode() + (OWN if own and self.follower is not None else b"")
        try:
            self.events.send_frame(frame, topic)
        except BusError as exc:  # a PUB does not block; only a closed socket lands here
            log.warning("could not publish %s#%d: %s", sid, seq, exc)
        return appended

    def _count(self, frame: bytes, kind: str | None, data: dict[str, Any] | None) -> None:
        if kind is None or data is None:
            try:
                body = decode(frame).body
            except BadFrame:
                return  # (logged already: the supervisor journaled it)
            if not isinstance(body, Event):
                return
            kind, data = body.type, body.data
        try:
            self.counts.observe(kind, data)
        except (TypeError, ValueError) as exc:  # a strange event costs its count only
            log.warning("event not counted: %s", exc)

    def followed(self, frames: list[bytes]) -> None:
        """An event another host's broadcaster published (`follow.py`): logged and
        published here like one of this host's, a duplicate dropped quietly."""
        try:
            env = decode(frames[-1])
        except BadFrame:
            self._refuse("followed:malformed")
            return
        if not isinstance(env.body, Event) or not env.sid:
            return  # (another host's notices concern its own viewers)
        appended = self.accept(env.sid, env.body.seq, frames[-1], kind=env.body.type,
                               data=env.body.data)
        if appended.stored:
            if env.sid in self.backfill.held:
                self.backfill.release(env.sid)
        elif appended.gap:
            self.backfill.hold(env.sid, env.body.seq, frames[-1])

    # -- viewers -----------------------------------------------------------------------

    def handle_subscription(self, frames: list[bytes]) -> None:
        """Count viewers from XPUB (un)subscription notices; anything else a peer sends
        upstream on `events` is ignored (viewers only read)."""
        if len(frames) != 1 or frames[0][:1] not in (b"\x00", b"\x01"):
            return
        topic = frames[0][1:]
        if topic.endswith(OWN):
            return  # another host's follower (`follow.py`), not a viewer
        if frames[0][:1] == b"\x01":
            if not topic:
                self._confirm_all()
            self._subscribed[topic] += 1
            self.viewers += 1
            if self.follower is not None:
                self.follower.want(topic)
        elif self._subscribed[topic] > 0:
            # XPUB passes on an unsubscription of a topic nobody subscribed (a raw
            # client can send one): counted, it would make `viewers` lie, even negative.
            self._subscribed[topic] -= 1
            self.viewers -= 1
            if not self._subscribed[topic]:
                del self._subscribed[topic]
                if self.follower is not None:
                    self.follower.unwant(topic)

    def _confirm_all(self) -> None:
        """A viewer subscribed to every session (`Client.live`): tell it the subscription
        is in effect. Topic b"" reaches only such viewers (a topic matches the
        subscriptions that are its prefixes), and XPUB tells of a subscription once it
        is in its table, so what is published after this reaches the new viewer."""
        try:
            self.events.send(Envelope(Subscribed()), b"")
        except BusError as exc:
            log.warning("could not confirm a subscription to every session: %s", exc)

    def handle_replay(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        """Answer `ReplayRequest` (events of a session from a seq) and `Stats`."""
        body = env.body
        if isinstance(body, Stats):
            self.replay.reply(Envelope(StatsReply(self.statistics()), id=env.id), peer)
            return
        if not isinstance(body, ReplayRequest):
            self.replay.reply_error(peer, env.id, "bad_request",
                                    f"replay does not serve {env.kind}")
            return
        # What the supervisor published before it answered the asker (a run started,
        # a message taken) is in `ingest` by now, but the reactor serves `replay`
        # first: taken in before answering, a client that was told "started" and asks
        # for the session's events finds the new run, not the previous run's end.
        self.ingest.drain(INGEST_RCVHWM)
        if self.follower is not None:  # another host may have written more of it
            self.follower.catch_up(env.sid, self.log.last_seq(env.sid) or 0, self.accept)
            if env.sid in self.backfill.held:
                self.backfill.release(env.sid)
        last = self.log.last_seq(env.sid)
        if last is None:
            self.replay.reply_error(peer, env.id, "unknown_session", f"no events for {env.sid!r}")
            return
        problem = _range_problem(body, last)
        if problem:
            self.replay.reply_error(peer, env.id, "bad_seq", problem)
            return
        to_seq = min(body.to_seq or last, last)
        try:
            frames, more = self.log.range(env.sid, body.from_seq, to_seq, REPLAY_BATCH_BYTES)
        except SessionGone as exc:
            self.replay.reply_error(peer, env.id, "unknown_session", f"{exc} (deleted)")
            return
        except StoreError as exc:
            log.error("replay of %s failed: %s", env.sid, exc)
            self.replay.reply_error(peer, env.id, "unavailable", "the event store cannot be read")
            return
        self.replay.reply(Envelope(ReplayBatch(frames, last, more), id=env.id, sid=env.sid), peer)

    def _refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    # -- deleted sessions --------------------------------------------------------------

    def forget(self, sids: list[str]) -> None:
        """The supervisor deleted `sids` (retention, `oploop rm`) from the session log:
        drop what memory holds of them."""
        self.log.forget(sids)
        for sid in sids:
            self.backfill.held.pop(sid, None)
            # Its live viewers are told (on its topic), and stop following it.
            try:
                self.events.send(Envelope(ForgetSessions([sid]), sid=sid), sid.encode())
            except BusError as exc:
                log.warning("could not tell the viewers of %s it was removed: %s", sid, exc)

    # -- lifecycle ---------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        """Counters: sessions logged, viewers subscribed, refused/recovered/lost events,
        memory use of the log, per-port stats, and what the events published add up
        to (`counts`, `actors.eventcounts`)."""
        return {
            "sessions": len(self.log),
            "viewers": self.viewers,
            # of which of every session (`Client.live`: the gateway's `/api/events`)
            "viewers_of_all": self._subscribed.get(b"", 0),
            "refused": dict(self.refused),
            "recovered": self.backfill.recovered,
            "lost": self.backfill.lost,
            "held": sum(len(h) for h in self.backfill.held.values()),
            "log": self.log.statistics(),
            "ports": self.reactor.statistics(),
            "auth": self.gate.statistics() if self.gate else {},
            "counts": self.counts.snapshot(),
        }

    async def serve(self) -> None:
        """Serve until cancelled."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.reactor.run())
                notify_ready()
                # A restart may have lost what was in flight: ask the supervisor.
                group.create_task(self.backfill.reconcile())
                if self.follower is not None:
                    group.create_task(self.follower.run(), name="follow")
        finally:
            await self.backfill.aclose()
            if self.follower is not None:
                self.follower.close()
            self.reactor.close()
            if self.gate is not None:
                self.gate.stop()
            self.log.store.close()


def _range_problem(req: ReplayRequest, last: int) -> str:
    """Why `req` cannot be served from a log whose newest seq is `last` ("" if it can)."""
    if req.from_seq < 1 or req.from_seq > last + 1:
        return f"from_seq must be in 1..{last + 1} (got {req.from_seq})"
    if req.to_seq < 0 or (req.to_seq and req.to_seq < req.from_seq):
        return f"to_seq must be 0 (the end) or >= from_seq (got {req.to_seq})"
    return ""


async def _main(settings: Settings) -> None:
    store = EventStore(settings.home / STORE_FILE, settings.config.store.url)
    await Broadcaster(Endpoints.for_home(settings.home), store, settings.viewer_queue).serve()


def main() -> None:
    """Entry point of `python -m actors.broadcaster`."""
    run_actor("broadcaster", _main)

