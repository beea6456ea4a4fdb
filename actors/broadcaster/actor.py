"""The broadcaster process."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import zmq

from actors.broadcaster.log import EventLog
from actors.runtime import notify_ready, run_actor
from bus.endpoints import Endpoints
from bus.errors import BusError
from bus.messages import Envelope, Event, ReplayBatch, ReplayRequest, Stats, StatsReply
from bus.sockets import Reactor

log = logging.getLogger("oploop.broadcaster")

#: Replay answers in batches of at most this many bytes of events.
REPLAY_BATCH_BYTES = 1 << 20

#: PUB drops silently per subscriber at its high-water mark: set it high on
#: purpose, and let seq + replay recover whatever is still dropped.
EVENTS_SNDHWM = 100_000


class Broadcaster:
    """Logs sequenced events, publishes them, and replays any range on request."""

    def __init__(self, endpoints: Endpoints, log_: EventLog | None = None) -> None:
        self.log = log_ or EventLog()
        self.reactor = Reactor()
        self.viewers = 0
        self.refused: dict[str, int] = {}
        self.replay = self.reactor.add(
            zmq.ROUTER, "replay", self.handle_replay, bind=endpoints.address("replay"),
            reply_errors=True,
        )
        self.events = self.reactor.add(
            zmq.XPUB, "events", bind=endpoints.address("events"),
            raw_handler=self.handle_subscription, hwm=EVENTS_SNDHWM,
        )
        self.ingest = self.reactor.add(
            zmq.PULL, "ingest", self.handle_event, bind=endpoints.address("ingest"), hwm=100_000,
        )

    def handle_event(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        """Log an event from the supervisor and publish it."""
        if not isinstance(env.body, Event):
            self._refuse(f"ingest:{env.kind}")
            return
        appended = self.log.append(env.sid, env.body.seq, frame)
        if not appended.stored:
            self._refuse(appended.reason.split(":")[0])
            log.warning("event %s#%d not stored: %s", env.sid, env.body.seq, appended.reason)
            return
        try:
            self.events.send_frame(frame, env.sid.encode())
        except BusError as exc:  # a PUB does not block; only a closed socket lands here
            log.warning("could not publish %s#%d: %s", env.sid, env.body.seq, exc)

    def handle_subscription(self, frames: list[bytes]) -> None:
        """Count viewers from XPUB (un)subscription notices."""
        if len(frames) == 1 and frames[0][:1] in (b"\x00", b"\x01"):
            self.viewers += 1 if frames[0][:1] == b"\x01" else -1

    def handle_replay(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        """Answer `ReplayRequest` (events of a session from a seq) and `Stats`."""
        body = env.body
        if isinstance(body, Stats):
            self.replay.send(Envelope(StatsReply(self.statistics()), id=env.id), peer)
            return
        if not isinstance(body, ReplayRequest):
            self.replay.reply_error(peer, env.id, "bad_request", f"replay does not serve {env.kind}")
            return
        last = self.log.last_seq(env.sid)
        if last is None:
            self.replay.reply_error(peer, env.id, "unknown_session", f"no events for {env.sid!r}")
            return
        if body.from_seq < 1 or body.to_seq < 0 or body.from_seq > last + 1:
            self.replay.reply_error(
                peer, env.id, "bad_seq",
                f"from_seq must be in 1..{last + 1} and to_seq >= 0 (got {body.from_seq}, {body.to_seq})",
            )
            return
        to_seq = body.to_seq or last
        frames, more = self.log.range(env.sid, body.from_seq, to_seq, REPLAY_BATCH_BYTES)
        try:
            self.replay.send(Envelope(ReplayBatch(frames, last, more), id=env.id, sid=env.sid), peer)
        except BusError as exc:
            log.info("replay reply to %r dropped: %s", peer, exc)

    def _refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def statistics(self) -> dict[str, Any]:
        """Counters: sessions logged, viewers subscribed, refused events, per-port stats."""
        return {
            "sessions": len(self.log),
            "viewers": self.viewers,
            "refused": dict(self.refused),
            "ports": self.reactor.statistics(),
        }

    async def serve(self) -> None:
        """Serve until cancelled."""
        try:
            task = asyncio.ensure_future(self.reactor.run())
            notify_ready()
            await task
        finally:
            self.reactor.close()


async def _main() -> None:
    await Broadcaster(Endpoints.for_home()).serve()


def main() -> None:
    """Entry point of `python -m actors.broadcaster`."""
    run_actor("broadcaster", _main)
