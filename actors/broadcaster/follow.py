"""Viewers on any host: the live events of sessions other hosts of a shared store run.

On a PostgreSQL store a session's events are published by the broadcaster of the host
running it. This host's broadcaster follows the others: one SUB socket per other host
on this machine (their rows in `hosts`, read again every `REFRESH_S`), subscribed to
exactly the sessions this host's viewers subscribe to, and to their own events only
(the topic `sid + OWN`: what a host relays is not sent back to it). What comes in is logged and
published here like an event of this host's own supervisor (`Broadcaster.followed`):
in seq order, a hole filled from the store, a duplicate (one a replay already took
from the store) dropped. Which host runs the
session does not matter: every other host is followed, so a session moving to another
host (failover) keeps its live viewers without a lookup.

A replay (`catch_up`) first brings this host's log of the session up to the store:
events written by another host since this broadcaster started are in the store, not
in its memory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import zmq

from actors import pgleases
from actors.peerhosts import HOST_FRESH_S, home_of, reach_problem
from actors.pglog import PgSessionLog
from actors.sessionlog import JournalError
from bus.endpoints import EndpointError, Endpoints
from bus.security import CredentialError
from bus.sockets import Port, Reactor

log = logging.getLogger("oploop.broadcaster")

#: How often the hosts to follow are read again from the store (seconds).
REFRESH_S = 1.0
#: Live events queued from one other host (its events beyond are refetched by seq).
FOLLOW_HWM = 100_000


class Follower:
    """SUB sockets to the other hosts' broadcasters, subscribed to what viewers here want."""

    def __init__(self, reactor: Reactor, store: PgSessionLog, own_home: Path,
                 received: Callable[[list[bytes]], None], mark: bytes) -> None:
        self.reactor = reactor
        self.store = store
        self.own_home = own_home
        self._received = received
        self._mark = mark
        #: The other hosts' homes -> the SUB connected to their broadcaster.
        self.subs: dict[Path, Port] = {}
        #: Topics this host's viewers subscribe to (b"": every session).
        self.topics: set[bytes] = set()

    def want(self, topic: bytes) -> None:
        """A viewer here subscribed to `topic`: follow it on every other host. Not the
        subscription to every session (`Client.live()`, the web list's feed): that one
        sees what this host publishes of its own sessions."""
        if not topic or topic in self.topics:
            return
        self.topics.add(topic)
        for port in self.subs.values():
            port.sock.setsockopt(zmq.SUBSCRIBE, topic + self._mark)

    def unwant(self, topic: bytes) -> None:
        """The last viewer of `topic` here left."""
        if topic not in self.topics:
            return
        self.topics.discard(topic)
        for port in self.subs.values():
            port.sock.setsockopt(zmq.UNSUBSCRIBE, topic + self._mark)

    async def run(self) -> None:
        """Follow the hosts on the store as they come and go, until cancelled."""
        while True:
            self.refresh()
            await asyncio.sleep(REFRESH_S)

    def refresh(self) -> None:
        """Connect to hosts that came up, drop those gone (the store read once)."""
        try:
            rows = pgleases.live_hosts(self.store.connection(), HOST_FRESH_S)
        except (psycopg.Error, JournalError) as exc:
            log.debug("cannot read the hosts to follow: %s", exc)
            return  # keep following whom we follow
        homes = set()
        for row in rows:
            home = home_of(row.control)
            if home is None or home == self.own_home or reach_problem(row):
                continue
            homes.add(home)
            if home not in self.subs:
                self._follow(home)
        for home in set(self.subs) - homes:
            self.reactor.remove(self.subs.pop(home))

    def _follow(self, home: Path) -> None:
        endpoints = Endpoints.for_home(home)
        try:  # that home's own key when it listens with CURVE (this user may read it)
            secure = endpoints.client_side("events")
            port = self.reactor.add(zmq.SUB, f"follow.{home.name}", connect=endpoints.address(
                "events"), secure=secure, hwm=FOLLOW_HWM, raw_handler=self._received)
        except (CredentialError, EndpointError, OSError) as exc:
            log.warning("cannot follow the host of %s: %s", home, exc)
            return
        for topic in self.topics:
            port.sock.setsockopt(zmq.SUBSCRIBE, topic + self._mark)
        self.subs[home] = port

    def catch_up(self, sid: str, head: int, accept: Callable[[str, int, bytes], Any]) -> None:
        """Log (and publish) the events of `sid` after `head` that the store has and this
        broadcaster never received (another host wrote them)."""
        try:
            last = self.store.last_seq(sid)
            while last is not None and head < last:
                rows, _ = self.store.range(sid, head + 1, last, 1 << 20)
                if not rows:
                    return
                for seq, frame in rows:
                    accept(sid, seq, frame)
                head = rows[-1][0]
        except JournalError as exc:
            log.warning("cannot catch %s up from the store: %s", sid, exc)

    def close(self) -> None:
        """Close every SUB."""
        for port in self.subs.values():
            self.reactor.remove(port)
        self.subs.clear()
