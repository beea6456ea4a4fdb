"""Any host, any session: requests for a session another host of a shared store runs go
to that host, and new sessions go to the least-loaded host (or the one named).

Each host publishes in its `hosts` row where its control socket is (`Ownership.control`:
`ipc://HOME/run/control.sock`). A host receiving a `cancel`, `say`, `approve`/`deny`,
`compact` or an elicitation's answer for a session whose lease another host holds checks the
caller's rights as it always does (who may is unchanged), then sends the request on,
marked with who asked (`by`), to the owner's priority control socket, and relays the
answer. If the owner changed meanwhile (the lease moved: the owner answers
"elsewhere"; for a cancel, also no answer within `FORWARD_TIMEOUT_S`), it looks the
owner up again and tries once more; then the caller gets one clear error. A
forwarded request is never forwarded again.

A run goes to the host named (`StartRun.host`, an id or a name from `oploop status`);
else a new session (`StartRun` without a session) goes to the least-loaded host: the fewest
unexpired leases among this host and the others that take placed sessions (`oploop
up` hosts; not an embedded one), this host on a tie. It is sent to that host's api
socket with the target's id as `host`, so that host starts it without placing it again.

Trust (`actors.peerhosts`): a host on this machine is reached through its home's
runtime directory (0700, this user's: the local user's own access, the same as the CLI
there). A host on another machine is reached over TCP with CURVE at the control address
its row publishes, this host connecting with its local key, which the store publishes
and the other host admits (as `host:ID`, to its control socket only). A host that does
not listen on TCP cannot be reached from another machine: the caller is told so, with
the setting that fixes it. New sessions are placed on hosts of this machine only.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import psycopg

from actors import pgleases
from actors.peerhosts import HOST_FRESH_S, link, place_problem, reach_problem
from actors.pgleases import HostRow
from actors.sessionlog import JournalError
from actors.supervisor.ownership import Ownership
from bus.errors import BusError, RemoteError, RequestTimeout
from bus.messages import Body, Cancel, Envelope, StartRun
from bus.rpc import Requester
from bus.sockets import Port, Reactor

log = logging.getLogger("oploop.forwarding")

#: How long the owner may take to answer a forwarded request (one attempt).
FORWARD_TIMEOUT_S = 3.0
#: The error code of a request this host cannot serve because another holds the run.
ELSEWHERE = "elsewhere"


class Forwarder:
    """Sends requests on to the host that holds a session, and new sessions to the host
    that should run them."""

    def __init__(self, ownership: Ownership, reactor: Reactor,
                 spawn: Callable[[Coroutine[Any, Any, None], str], object],
                 home: Path) -> None:
        self.ownership = ownership
        self.reactor = reactor
        self._spawn = spawn
        #: This host's home (its local key is what it connects to other machines with).
        self.home = home
        #: (host id, socket name, address, server key) -> a requester kept for the next
        #: requests.
        self._requesters: dict[tuple[str, str, str, str], Requester] = {}
        self.counts = {"forwarded": 0, "retried": 0, "failed": 0, "placed": 0}

    # -- control verbs -------------------------------------------------------------------

    def forwards(self, port: Port, peer: bytes | None, env: Envelope, body: Any,
                 by: str) -> bool:
        """Serve `body` (a control verb naming `body.session`, the caller's rights
        already checked) if another host holds its session: sent on to that host,
        answered when it answers; True. False: this host serves it (it holds the
        session, or nobody does)."""
        sid = body.session
        if sid in self.ownership.fence.epochs:
            return False
        try:
            row = pgleases.holder_row(self.ownership.store.connection(), sid)
        except (psycopg.Error, JournalError):
            return False  # served here: the request says what it can (the store's state)
        if row is None or row.id == self.ownership.owner:
            return False
        if body.by:  # forwarded here by a host that believed us the owner: not again
            port.reply_error(peer, env.id, ELSEWHERE,
                             f"session {sid} is running on host {row.id} ({row.name})")
            return True
        forwarded = dataclasses.replace(body, by=by)
        self._spawn(self._forward(port, peer, env, forwarded, row), f"forward-{sid}")
        return True

    async def _forward(self, port: Port, peer: bytes | None, env: Envelope, body: Any,
                       row: HostRow) -> None:
        sid = body.session
        for attempt in (1, 2):
            problem = reach_problem(row)
            if problem:
                port.reply_error(peer, env.id, ELSEWHERE, problem)
                return
            try:
                reply = await self._request(row, "control", body, sid)
            except (RemoteError, RequestTimeout, BusError) as exc:
                # Sent again only where that cannot act twice: refused as not the owner's,
                # or a cancel (a second one changes nothing); a message or a decision
                # unanswered may still arrive.
                moved = exc.code == ELSEWHERE if isinstance(exc, RemoteError) \
                    else isinstance(body, Cancel)
                again = self._holder(sid) if moved and attempt == 1 else None
                if again is not None:  # the lease moved (or its host went quiet)
                    self.counts["retried"] += 1
                    row = again
                    continue
                self.counts["failed"] += 1
                if isinstance(exc, RemoteError):
                    port.reply_error(peer, env.id, exc.code, exc.message)
                else:
                    maybe = "" if isinstance(body, Cancel) else " (it may still arrive there)"
                    port.reply_error(peer, env.id, "unavailable",
                                     f"session {sid} runs on host {row.id}, which did not "
                                     f"answer ({exc}){maybe}")
                return
            self.counts["forwarded"] += 1
            port.reply(Envelope(reply.body, id=env.id, sid=reply.sid), peer)
            return

    def _holder(self, sid: str) -> HostRow | None:
        """The host holding `sid` now (this one included), or None (nobody, or the store
        out of reach)."""
        try:
            return pgleases.holder_row(self.ownership.store.connection(), sid)
        except (psycopg.Error, JournalError):
            return None

    # -- placement ---------------------------------------------------------------------

    def place(self, req: StartRun) -> HostRow | str | None:
        """Where a new session `req` runs: None here, a host's row, or why it cannot be
        placed (an unknown host name, one out of reach)."""
        if req.session and not req.host:
            return None  # a follow-up runs where it is asked for (its lease taken here)
        me = self.ownership.owner
        if req.host == me or req.host == self.ownership.name:
            return None
        try:
            hosts = pgleases.live_hosts(self.ownership.store.connection(), HOST_FRESH_S)
        except (psycopg.Error, JournalError):
            return None if not req.host else "the store cannot be reached to find the host"
        if req.host:
            named = [h for h in hosts if req.host in (h.id, h.name)]
            if not named:
                known = ", ".join(f"{h.id} ({h.name})" for h in hosts) or "none"
                return f"no host {req.host!r} is up on the store (hosts: {known})"
            return place_problem(named[0]) or named[0]
        mine = len(self.ownership.fence.epochs)
        best: HostRow | None = None
        for h in hosts:
            if h.id != me and h.placeable and not place_problem(h) and h.running < mine and \
                    (best is None or (h.running, h.id) < (best.running, best.id)):
                best = h
        return best

    @staticmethod
    def refuse(port: Port, peer: bytes | None, env: Envelope, why: str) -> None:
        """Answer a start that cannot be placed (`place` said why)."""
        code = "unknown_host" if why.startswith("no host") else "unavailable"
        port.reply_error(peer, env.id, code, why)

    def start_elsewhere(self, port: Port, peer: bytes | None, env: Envelope, req: StartRun,
                        row: HostRow) -> None:
        """Send the new session `req` to `row`'s host (as `host` = its id) and relay its
        `RunStarted` (or error)."""
        self._spawn(self._start(port, peer, env, dataclasses.replace(req, host=row.id), row),
                    f"place-{req.key}")

    async def _start(self, port: Port, peer: bytes | None, env: Envelope, req: StartRun,
                     row: HostRow) -> None:
        try:
            reply = await self._request(row, "api", req, "", traceparent=env.traceparent)
        except RemoteError as exc:
            port.reply_error(peer, env.id, exc.code, exc.message)
            return
        except RequestTimeout:
            # Not answered: the run may have started there. The client sends the start
            # again (the same key) and its resend finds that run, or starts it once.
            self.counts["failed"] += 1
            log.warning("host %s did not answer a start in %.0f s", row.id, FORWARD_TIMEOUT_S)
            return
        except BusError as exc:
            self.counts["failed"] += 1
            port.reply_error(peer, env.id, "unavailable",
                             f"host {row.id} ({row.name}) did not take the run ({exc}): "
                             "try again")
            return
        self.counts["placed"] += 1
        port.reply(Envelope(reply.body, id=env.id, sid=reply.sid), peer)

    # -- the other hosts' sockets ---------------------------------------------------------

    async def _request(self, row: HostRow, name: str, body: Body, sid: str,
                       traceparent: str = "") -> Envelope:
        address, secure = link(row, name, self.home)  # (BusError: cannot be used)
        key = (row.id, name, address, row.reach.server_key)
        requester = self._requesters.get(key)
        if requester is not None and requester.refusal is not None:
            # Refused (a host's key is admitted once the other has read the store; a
            # refused connection is never tried again): connect anew.
            self.reactor.remove(self._requesters.pop(key).port)
            requester = None
        if requester is None:
            try:
                requester = Requester(self.reactor, f"forward.{row.id}.{name}", address,
                                      secure)
            except OSError as exc:  # (an address or key the store holds that zmq refuses)
                raise BusError(f"cannot reach host {row.id} ({row.name}): {exc}") from exc
            self._requesters[key] = requester
        return await requester.request(body, sid=sid, timeout=FORWARD_TIMEOUT_S,
                                       traceparent=traceparent)

    def statistics(self) -> dict[str, int]:
        """Requests forwarded, retried after the owner changed, failed; sessions placed."""
        return dict(self.counts)

    def close(self) -> None:
        """Close the sockets to the other hosts."""
        for requester in self._requesters.values():
            self.reactor.remove(requester.port)
        self._requesters.clear()


