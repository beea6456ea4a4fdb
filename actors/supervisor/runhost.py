"""`RunHost`: what the supervisor's request handlers (`runs.py`, `admission.py`,
`compacting.py`, `mcpasks.py`) need of the supervisor, and nothing more of it.

A module of its own so that those handlers name the supervisor without importing the
actor that imports them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from actors.config import Config
from actors.core.loopio import LoopIO
from actors.core.session import Session
from actors.sessionlog import Record
from actors.supervisor.dispatch import Dispatcher
from actors.supervisor.leases import Leases
from bus.messages import Envelope, RunStarted
from bus.security import Gate
from bus.sockets import Port

if TYPE_CHECKING:  # (psycopg is imported only on a shared store)
    from actors.supervisor.forwarding import Forwarder


class RunHost(Protocol):
    """What `Runs` needs of the supervisor, and nothing more of it (no private name)."""

    config: Config
    sessions: dict[str, Session]
    dispatcher: Dispatcher
    leases: Leases
    io: LoopIO
    api: Port
    control: Port
    #: The CURVE gate (its keyring binds each peer key to one agent); None over ipc.
    gate: Gate | None
    #: On a shared store: sends requests on to the host holding a session, and places
    #: new sessions (None: the store is this host's alone).
    forwarder: Forwarder | None

    def session(self, sid: str) -> Session | None:
        """The session `sid` (in memory, else folded from the log), or None."""
        ...

    def known(self, sid: str) -> bool:
        """Whether `sid` is a session in memory or in the log."""
        ...

    def no_session(self, sid: str) -> str:
        """What a request naming an unknown session is told."""
        ...

    def trace_parent(self, sid: str, traceparent: str) -> None:
        """The next run of `sid` continues the caller's trace (nothing when not tracing)."""
        ...

    def no_agent(self, name: str) -> str:
        """What a request naming an unknown agent is told."""
        ...

    def unwritable(self) -> str:
        """Why the session log cannot take more now (disk low, commits failing), or ""."""
        ...

    def started_by(self, key: str) -> RunStarted | None:
        """The run a `StartRun` with `key` already began (memory, else the log), or None."""
        ...

    def own(self, sid: str) -> tuple[str, str] | None:
        """Take `sid`'s lease on a shared store; None, or why not as (error, message)."""
        ...

    def open_in_log(self) -> list[str]:
        """The sessions whose run the session log has open (none without a log)."""
        ...

    def run_records(self, session: Session) -> list[Record]:
        """The records of `session`'s latest run in the log (none without a log)."""
        ...

    def elsewhere(self, session: Session) -> str:
        """Why `session`'s open run cannot be acted on here (another host of a shared
        store runs it), or ""."""
        ...

    def not_resumed(self, sid: str) -> None:
        """`sid`, open in the log, was not resumed (ended, or unreadable)."""
        ...

    def remember_start(self, key: str, started: RunStarted) -> None:
        """Remember the run a `StartRun` with `key` began (a resend gets it)."""
        ...

    def reply_committed(self, env: Envelope, peer: bytes | None,
                        port: Port | None = None) -> None:
        """Send `env` once what this iteration emitted is journaled."""
        ...

    def journal_later(self, session: Session) -> None:
        """Journal `session`'s row with this iteration's commit."""
        ...

    def forget_when_committed(self, session: Session) -> None:
        """`session`'s run has ended: it leaves memory once that end is committed."""
        ...

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A task of the supervisor's task group (cancelled with it)."""
        ...
