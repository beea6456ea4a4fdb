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
from bus.errors import RemoteError
from bus.messages import Envelope, StartRun
from hostkit import assert_one_run, oploop, running_host, workspace


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


# -- limits ------------------------------------------------------------------------------


#: A script whose tool waits (in the session's workspace, where the sandbox lets it
#: look) until the test creates `gate` there: "running" is then a state, not a moment.
GATED = {"gated": [
    {"reply": [{"type": "tool_use", "name": "shell", "input": {
        "command": "while [ ! -e gate ]; do sleep 0.02; done; echo opened"}}]},
    {"reply": "through the gate", "stop_reason": "end_turn"},
]}


def open_gate(home: str, session: str) -> None:
    """Let the gated tool of `session` finish."""
    (workspace(home, session) / "gate").touch()


@pytest.fixture
def limited_host(short_home, tmp_path):
    """A host allowing prompts of 60 chars and 2 running sessions, playing `GATED`."""
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"scripts": GATED}))
    (Path(short_home) / "oploop.toml").write_text(
        "[limits]\nmax_prompt_chars = 60\nmax_running_sessions = 2\n")
    with running_host(short_home, {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}) as home:
        yield home


def one_line_error(run: Any) -> str:
    """The single stderr line of a CLI call that failed with exit status 1."""
    assert run.returncode == 1, (run.returncode, run.stdout, run.stderr)
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("oploop: "), run.stderr
    return lines[0]


def test_over_long_prompts_and_too_many_sessions_are_refused_clearly(limited_host):
    home = limited_host
    too_long = one_line_error(oploop(home, "run", "x" * 61))
    assert "61 chars" in too_long and "limit of 60" in too_long
    assert "limits.max_prompt_chars" in too_long

    async def scenario():
        async with Client.connect(Path(home)) as client:
            with pytest.raises(RemoteError) as refused:
                await client.start("y" * 61)
            assert refused.value.code == "too_large"
            runs = [await client.start(f"#gated {i}") for i in range(2)]
            views = [client.events(r.session, r.from_seq, stop_at="first") for r in runs]
            held: list[list[dict[str, Any]]] = [[], []]
            for view, seen in zip(views, held, strict=True):
                async for event in view:  # both running, held at the gate
                    seen.append(event)
                    if event["type"] == "TOOL_START":
                        break
            with pytest.raises(RemoteError) as busy:
                await client.start("hello")
            cli = await asyncio.to_thread(oploop, home, "run", "hello")
            sessions = await client.sessions()
            for r in runs:
                open_gate(home, r.session)
            for view, seen in zip(views, held, strict=True):
                seen += [e async for e in view]
            after = await client.start("hello again")  # the limit counts running ones only
            ended = [e async for e in client.events(after.session, after.from_seq,
                                                    stop_at="first")]
            return busy.value, cli, sessions, held, ended

    busy, cli, sessions, held, ended = asyncio.run(scenario())
    assert busy.code == "busy" and "limits.max_running_sessions = 2" in busy.message
    assert "limits.max_running_sessions" in one_line_error(cli)
    assert len(sessions) == 2  # the refused runs made no session
    for events in held:
        assert_one_run(events)
        assert events[-1]["type"] == "DONE"
        (tool,) = [e["data"] for e in events if e["type"] == "TOOL_END"]
        assert tool["output"].strip() == "opened" and not tool["is_error"]
    assert_one_run(ended)
    assert ended[-1]["type"] == "DONE"
