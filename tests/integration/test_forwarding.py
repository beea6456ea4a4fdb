"""Forwarding when the owner changes mid-forward: the `Forwarder` of a real store sends
a cancel to the session's owner, which (a host that has just lost the lease) answers
`elsewhere`; the forwarder looks the owner up again and the new one answers. The two
owners are control sockets speaking the real protocol at the hosts' published addresses.
"""

from __future__ import annotations

import asyncio
import socket
import tempfile
from pathlib import Path
from typing import Any

import zmq

from actors import pgleases
from actors.logstore import open_store
from actors.peerhosts import control_address
from actors.supervisor.forwarding import ELSEWHERE, Forwarder
from actors.supervisor.ownership import Ownership
from bus.errors import RemoteError
from bus.messages import Cancel, CancelAck, Envelope
from bus.rpc import Requester
from bus.sockets import Reactor

SID = "0123456789ab"


def test_a_cancel_follows_the_lease_to_its_new_owner_once(pg_url, tmp_path):
    store: Any = open_store(tmp_path, pg_url)
    homes = [Path(tempfile.mkdtemp(prefix="ofw-", dir="/tmp")) for _ in range(2)]
    conn = store.connection()
    for n, home in enumerate(homes):
        (home / "run").mkdir(mode=0o700)
        pgleases.heartbeat(conn, f"h{n}", f"{socket.gethostname()}:{home}",
                           control=control_address(home), placeable=True)
    assert pgleases.acquire(conn, SID, "h0", 30.0) == 1
    ownership = Ownership(store, "me", "this", 30.0, claims=False, lost=lambda _: None,
                          claimed=lambda _: None)
    asked: list[tuple[str, str]] = []

    async def scenario() -> tuple[Any, dict[str, int]]:
        reactor = Reactor(zmq.Context.instance())
        serving = asyncio.create_task(reactor.run())
        tasks: set[asyncio.Task[None]] = set()

        def spawn(coro: Any, name: str) -> None:
            task = asyncio.create_task(coro, name=name)
            tasks.add(task)

        forwarder = Forwarder(ownership, reactor, spawn, tmp_path)

        def old_owner(peer: bytes | None, env: Envelope, frame: bytes) -> None:
            asked.append(("h0", env.body.by))
            # Its lease lapsed and h1 claimed the session before the request came.
            conn.execute("UPDATE leases SET owner = 'h1', epoch = epoch + 1 WHERE sid = %s",
                         (SID,))
            owners[0].reply_error(peer, env.id, ELSEWHERE, "session runs elsewhere")

        def new_owner(peer: bytes | None, env: Envelope, frame: bytes) -> None:
            asked.append(("h1", env.body.by))
            owners[1].reply(Envelope(CancelAck(SID, "cancelled"), id=env.id), peer)

        owners = [reactor.add(zmq.ROUTER, "owner0", old_owner, bind=control_address(homes[0])),
                  reactor.add(zmq.ROUTER, "owner1", new_owner, bind=control_address(homes[1]))]

        def here(peer: bytes | None, env: Envelope, frame: bytes) -> None:
            assert forwarder.forwards(control, peer, env, env.body, "alice")

        control = reactor.add(zmq.ROUTER, "here", here, bind="inproc://forward-here")
        caller = Requester(reactor, "caller", "inproc://forward-here")
        try:
            try:
                answer: Any = (await caller.request(Cancel(SID), timeout=10)).body
            except RemoteError as exc:
                answer = exc
            return answer, forwarder.statistics()
        finally:
            forwarder.close()
            for task in tasks:
                task.cancel()
            serving.cancel()
            reactor.close()

    try:
        answer, counts = asyncio.run(scenario())
    finally:
        ownership.close()
        store.close()
        for home in homes:
            for path in sorted(home.rglob("*"), reverse=True):
                path.unlink() if not path.is_dir() else path.rmdir()
            home.rmdir()
    assert isinstance(answer, CancelAck) and answer.state == "cancelled", answer
    assert asked == [("h0", "alice"), ("h1", "alice")]  # (who asked, carried along)
    assert counts["retried"] == 1 and counts["forwarded"] == 1
