"""An SSE client that stops reading is dropped, and costs the other viewers nothing.

A real broadcaster and a real gateway (no supervisor: the test pushes sequenced
events into the broadcaster's ingest, as the supervisor does). One client opens
the stream on a socket with a tiny receive buffer and never reads; another reads
everything. Megabytes of events later, the reader has them all and the gateway
has dropped the stalled client (after `api.SLOW_CLIENT_S` without progress).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
import zmq
from homes import make_home, remove_home
from prometheus_client.parser import text_string_to_metric_families

from actors.gateway.api import SLOW_CLIENT_S
from bus.client import Client
from bus.codec import encode
from bus.endpoints import Endpoints
from bus.messages import Envelope, Event

SID = "slowclient01"
EVENTS = 6_000
TEXT = "x" * 1_000  # 6 MB in all: more than a stalled socket's buffers take


@pytest.fixture
def gateway():
    home = Path(make_home("ops-"))
    env = {**os.environ, "OPLOOP_HOME": str(home), "OPLOOP_HTTP_LISTEN": "127.0.0.1:0"}
    env.pop("OPLOOP_PARENT_PID", None)
    Endpoints.for_home(home).prepare()
    procs = [subprocess.Popen([sys.executable, "-m", f"actors.{name}"], env=env)
             for name in ("broadcaster", "gateway")]
    try:
        url_file = home / "run" / "web.url"
        end = time.monotonic() + 30
        while not url_file.exists():
            assert time.monotonic() < end and all(p.poll() is None for p in procs)
            time.sleep(0.02)
        yield home, url_file.read_text().strip()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(10)
        remove_home(home)


def push(home: Path, first: int, last: int) -> None:
    """Events `first..last` of the session, as the supervisor would push them."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(Endpoints.for_home(home).address("ingest"))
    for seq in range(first, last + 1):
        kind = "SESSION_START" if seq == 1 else "DONE" if seq == EVENTS else "TOKEN"
        sock.send(encode(Envelope(Event(seq, kind, 1, time.time(), {"text": TEXT}), sid=SID)))
    sock.close(linger=-1)
    ctx.term()


def token_of(home: Path) -> str:
    return (home / "web.token").read_text().strip()


def dropped(url: str, token: str) -> float:
    import urllib.request

    request = urllib.request.Request(f"{url}metrics",
                                     headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "oploop_gateway_sse_dropped_total":
                return s.value
    return 0.0


def closed(sock: socket.socket) -> bool:
    """Whether the peer closed `sock` (EOF or reset once its data is read)."""
    try:
        while sock.recv(1 << 16):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True  # reset: the gateway aborted the connection
    return True


def test_a_stalled_sse_client_is_dropped_and_the_others_get_everything(gateway):
    home, url = gateway
    token = token_of(home)
    auth = {"Authorization": f"Bearer {token}"}
    push(home, 1, 1)

    async def main() -> None:
        async with Client.connect(home) as client:
            while await client.last_seq(SID) is None:  # noqa: ASYNC110 (another process)
                await asyncio.sleep(0.02)
        host, port = url.removeprefix("http://").rstrip("/").rsplit(":", 1)
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect((host, int(port)))
        stalled.sendall(f"GET /api/sessions/{SID}/events HTTP/1.1\r\nHost: {host}\r\n"
                        f"Authorization: Bearer {token}\r\n\r\n".encode())
        try:
            async with aiohttp.ClientSession(headers=auth) as http, http.get(
                    f"{url}api/sessions/{SID}/events", params={"stop_at": "last"}) as resp:
                await asyncio.to_thread(push, home, 2, EVENTS)
                seqs = []
                async for raw in resp.content:
                    line = raw.decode()
                    if line.startswith("data: "):
                        seqs.append(json.loads(line[6:])["seq"])
            assert seqs == list(range(1, EVENTS + 1))
            end = time.monotonic() + SLOW_CLIENT_S + 30
            while dropped(url, token) < 1:
                assert time.monotonic() < end, "the stalled client was never dropped"
                await asyncio.sleep(0.1)
            # Its connection is closed: what it has buffered, then the end.
            stalled.settimeout(10)
            assert closed(stalled)
        finally:
            stalled.close()

    asyncio.run(main())
