"""Viewers on any host: the live events of sessions other hosts of a shared store run.

On a PostgreSQL store a session's events are published by the broadcaster of the host
running it. This host's broadcaster follows the others: one SUB socket per other host
(their rows in `hosts`, read again every `REFRESH_S`; on this machine over its ipc
events socket, on another over TCP with CURVE, `actors.peerhosts`), subscribed to
exactly the sessions this host's viewers subscribe to, and to their own events only
(the topic `sid + OWN`: what a host relays is not sent back to it). What comes in is logged and
published here like an event of this host's own supervisor (`Broadcaster.followed`):
in seq order, a hole filled from the store, a duplicate (one a replay already took
from the store) dropped. Which host runs the
session does not matter: every other host is followed, so a session moving to another
host (failover) keeps its live viewers without a lookup.

The same read of `hosts` tells this broadcaster's ZAP gate which keys are the other
hosts' (`admit`): they may follow its events (and replay), nothing else here.

A replay (`catch_up`) first brings this host's log of the session up to the store:
events written by another host since this broadcaster started are in the store, not
in its memory.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import zmq

from actors import pgleases
from actors.peerhosts import HOST_FRESH_S, admitted, link, local_home, reach_problem
from actors.pgleases import HostRow
from actors.pglog import PgSessionLog
from actors.sessionlog import JournalError
from bus.errors import BusError
from bus.sockets import Port, Reactor

log = logging.getLogger("oploop.broadcaster")

#: How often the hosts to follow are read again from the store (seconds).
REFRESH_S = 1.0
#: Live events queued from one other host (its events beyond are refetched by seq).
FOLLOW_HWM = 100_000


class Follower:
    """SUB sockets to the other hosts' broadcasters, subscribed to what viewers here want."""

    def __init__(self, reactor: Reactor, store: PgSessionLog, own_home: Path,
                 received: Callable[[list[bytes]], None], mark: bytes,
                 admit: Callable[[dict[bytes, str]], None] | None = None,
                 own_key: str = "") -> None:
        self.reactor = reactor
        self.store = store
        self.own_home = own_home
        self._received = received
        self._mark = mark
        #: Told the keys of the other hosts at each read (this broadcaster's gate), and
        #: this host's own key (never another's).
        self._admit = admit
        self._own_key = own_key
        #: (another host's id, where its events are, its server key) -> the SUB
        #: connected there.
        self.subs: dict[tuple[str, str, str], Port] = {}
        #: Those whose host refused this host's key (it had not read the store yet): a
        #: refused connection is never tried again, so they are connected anew.
        self.refused: set[tuple[str, str, str]] = set()
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
            return  # keep following whom we follow (and admitting whom we admit)
        if self._admit is not None:
            self._admit(admitted(rows, self._own_key))
        wanted = set()
        for row in rows:
            if self._is_me(row) or reach_problem(row):
                continue
            try:
                address, secure = link(row, "events", self.own_home)
            except BusError as exc:
                log.warning("cannot follow host %s: %s", row.id, exc)
                continue
            key = (row.id, address, row.reach.server_key)
            wanted.add(key)
            if key in self.refused:
                self._drop(key)
            if key not in self.subs:
                self._follow(key, address, secure)
        for key in set(self.subs) - wanted:
            self._drop(key)

    def _drop(self, key: tuple[str, str, str]) -> None:
        self.refused.discard(key)
        port = self.subs.pop(key, None)
        if port is not None:
            self.reactor.remove(port)

    def _is_me(self, row: HostRow) -> bool:
        if self._own_key and row.reach.client_key == self._own_key:
            return True
        return local_home(row) == self.own_home

    def _follow(self, key: tuple[str, str, str], address: str, secure: Any) -> None:
        try:
            watch = functools.partial(self._on_handshake, key) if secure is not None else None
            port = self.reactor.add(zmq.SUB, f"follow.{key[0]}", connect=address,
                                    secure=secure, hwm=FOLLOW_HWM,
                                    raw_handler=self._received, on_handshake=watch)
        except OSError as exc:
            log.warning("cannot follow host %s at %s: %s", key[0], address, exc)
            return
        for topic in self.topics:
            port.sock.setsockopt(zmq.SUBSCRIBE, topic + self._mark)
        self.subs[key] = port

    def _on_handshake(self, key: tuple[str, str, str], refusal: str | None) -> None:
        if refusal is None:
            self.refused.discard(key)
        elif key in self.subs:
            log.warning("host %s %s: following it again at the next read", key[0], refusal)
            self.refused.add(key)

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
