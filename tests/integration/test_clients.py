"""Clients that misbehave: vanish mid-request, send half a greeting, ask too much,
or try to drive a session through a viewer's socket. The host keeps serving,
keeps no state for them, and refuses what it must with a clear error."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path
from typing import Any

import psutil
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


def _zmtp_prop(name: bytes, value: bytes) -> bytes:
    return bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value


#: A ZMTP 3.0 greeting (NULL mechanism, as client), and a DEALER's READY command.
GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32
_READY = b"\x05READY" + _zmtp_prop(b"Socket-Type", b"DEALER") + _zmtp_prop(b"Identity", b"")
HANDSHAKE = GREETING + b"\x04" + bytes([len(_READY)]) + _READY

#: What a client that vanishes mid-request may have written: nothing, part of the
#: greeting, part of the handshake, a frame cut short, a frame announcing 4 EiB.
HALF_REQUESTS = [
    b"",
    GREETING[:5],
    GREETING[:-7],
    HANDSHAKE[:-4],
    HANDSHAKE + b"\x00\xc8" + encode(Envelope(StartRun("cut short"), id="half"))[:20],
    HANDSHAKE + b"\x02" + (1 << 62).to_bytes(8, "big") + b"x" * 100,
]


def test_clients_that_send_half_a_request_and_vanish_leave_actors_serving(host):
    ends = Endpoints.for_home(Path(host))
    state = json.loads((Path(host) / "run" / "host.json").read_text())
    pids = {a["name"]: a["pid"] for a in state["actors"]}
    serving = [psutil.Process(pids[name]) for name in ("supervisor", "broadcaster")]

    async def scenario():
        async with Client.connect(Path(host)) as client:
            before = (await client.stats(), await client.broadcaster_stats())
            fds = [p.num_fds() for p in serving]  # with this client connected
            for name in ("api", "control", "replay", "work", "events", "ingest"):
                path = ends.address(name).removeprefix("ipc://")
                for garbage in HALF_REQUESTS:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                        raw.connect(path)
                        raw.sendall(garbage)
            # Each connection closed by the actor once it saw the peer go: no fd left.
            await wait_for(lambda: _fds(serving),
                           lambda now: all(n <= f for n, f in zip(now, fds, strict=True)),
                           what="the actors to close every half-open connection")
            after = (await client.stats(), await client.broadcaster_stats())
            started = await client.start("hello again")
            events = [e async for e in client.events(started.session, started.from_seq,
                                                    stop_at="first")]
            return before, after, events

    before, after, events = asyncio.run(scenario())
    assert after[0]["sessions"] == before[0]["sessions"]
    assert after[0]["workers"] == before[0]["workers"]
    assert after[1]["sessions"] == before[1]["sessions"]
    assert_one_run(events)
    assert events[-1]["type"] == "DONE"
    state = json.loads((Path(host) / "run" / "host.json").read_text())
    assert all(a["restarts"] == 0 and a["state"] == "running" for a in state["actors"])


async def _fds(procs: list[Any]) -> list[int]:
    return [p.num_fds() for p in procs]
