"""A supervisor with its session log on disk, driven by hand: what the unit tests of the
commit order, the event batches and the backfill start from."""

from __future__ import annotations

from pathlib import Path

from actors.config import Agent, Config
from actors.core.session import Session
from actors.supervisor.actor import Supervisor
from actors.supervisor.journal import Journal
from bus.endpoints import Endpoints


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
