"""Clients that misbehave: vanish mid-request, send half a greeting, ask too much,
or try to drive a session through a viewer's socket. The host keeps serving,
keeps no state for them, and refuses what it must with a clear error."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import pytest
import zmq

from bus.client import Client
from bus.codec import encode
from bus.endpoints import Endpoints
from bus.messages import Envelope, StartRun
from hostkit import TERMINAL, assert_one_run, running_host


@pytest.fixture
def host(short_home):
    with running_host(short_home) as home:
        yield home


async def wait_for(probe: Any, accept: Any, timeout: float = 30.0, what: str = "") -> Any:
    """Call the async `probe` until `accept(result)`; the result (a timeout fails)."""
    result = None
    try:
        async with asyncio.timeout(timeout):
            while True:
                result = await probe()
                if accept(result):
                    return result
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}; last seen: {result!r}") from None


def send_and_vanish(address: str, frames: list[bytes], count: int) -> None:
    """`count` clients that each send `frames` on their own connection and close at
    once, without reading a reply (linger keeps the frames going out)."""
    ctx = zmq.Context()
    try:
        for _ in range(count):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 5000)
            sock.connect(address)
            for frame in frames:
                sock.send(frame)
            sock.close()
    finally:
        ctx.term()  # returns once every frame has been handed over


def test_clients_that_start_a_run_and_vanish_leave_nothing_stuck(host):
    clients = 20
    ends = Endpoints.for_home(Path(host))
    start = encode(Envelope(StartRun("hello there"), id="gone"))
    send_and_vanish(ends.address("api"), [start], clients)

    async def check():
        async with Client.connect(Path(host)) as client:
            # Every request read (the api counts what it received) ...
            await wait_for(client.stats, lambda s: s["ports"]["api"]["received"] >= clients,
                           what="the api to read every request")
            # ... and every session it made has ended, none stuck "running".
            sessions = await wait_for(
                client.sessions, lambda ss: all(s["state"] != "running" for s in ss),
                what="no running session")
            runs = {}
            for s in sessions:
                runs[s["session"]] = [e async for e in client.events(s["session"], 1,
                                                                    follow=False)]
            return sessions, runs, await client.stats()

    sessions, runs, stats = asyncio.run(check())
    # The clients were gone before their RunStarted: the case this test is about.
    assert stats["ports"]["api"]["undelivered"] > 0, stats["ports"]["api"]
    assert len(sessions) <= clients
    for s in sessions:
        assert s["last_end"] == "DONE", s
        assert_one_run(runs[s["session"]])
    assert "running" not in stats["sessions"], stats["sessions"]
    assert not stats["ports"]["api"]["rejected"].get("handler_error"), stats["ports"]["api"]
