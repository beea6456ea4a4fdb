"""A supervisor with its session log on disk, driven by hand: what the unit tests of the
commit order, the event batches, the backfill and the history forgets start from; and
the sending side of its sockets, recorded."""

from __future__ import annotations

import asyncio
from pathlib import Path

from actors.config import Agent, Config
from actors.core.session import Session
from actors.supervisor.actor import Supervisor
from actors.supervisor.journal import Journal
from bus.codec import decode
from bus.endpoints import Endpoints
from bus.messages import Envelope


def supervisor_on_disk(home: str) -> tuple[Endpoints, Journal, Supervisor]:
    """The endpoints of a fresh `home`, its session log and a supervisor on them (the
    caller closes `supervisor.reactor` and the journal)."""
    endpoints = Endpoints.for_home(Path(home))
    endpoints.prepare()
    journal = Journal(Path(home) / "sessions.db", reserve_mb=0)
    return endpoints, journal, Supervisor(endpoints, Config(), journal)


def add_session(supervisor: Supervisor, sid: str) -> Session:
    """A session of the default agent, held by `supervisor`."""
    session = Session(sid, Agent(), "/tmp")
    supervisor.sessions[sid] = session
    return session


class Pipe:
    """The sending side of a `bus.sockets.Port`, as the dispatcher (or a worker) uses it:
    what went to whom (ipc: no key, no address)."""

    user_id = None
    peer_address = None

    def __init__(self) -> None:
        self.sent: list[tuple[Envelope, bytes | None]] = []

    def send(self, env: Envelope, peer: bytes | None = None) -> None:
        self.sent.append((env, peer))

    def send_frame(self, frame: bytes, peer: bytes | None = None) -> None:
        self.sent.append((decode(frame), peer))


async def loop_turns(n: int = 3) -> None:
    """Let the loop turn `n` times (what a turn's end schedules runs: commits, sends)."""
    for _ in range(n):
        await asyncio.sleep(0)
