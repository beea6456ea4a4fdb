"""Clients that misbehave: vanish mid-request, send half a greeting, ask too much,
or try to drive a session through a viewer's socket. The host keeps serving,
keeps no state for them, and refuses what it must with a clear error."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest
import zmq
from hostkit import assert_one_run, oploop, ready_workspace, running_host, scripted_host

from bus.client import Client
from bus.codec import decode, encode
from bus.endpoints import Endpoints
from bus.errors import RemoteError
from bus.messages import (
    Cancel,
    Envelope,
    ErrorReply,
    InspectSession,
    ListSessions,
    StartRun,
)


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
                # Followed to the run's end: the supervisor says DONE once it committed
                # the run's last events, which may still be on their way to the
                # broadcaster, whose stored log a replay without `follow` ends at.
                runs[s["session"]] = [e async for e in client.events(s["session"], 1)]
            return sessions, runs, await client.stats()

    sessions, runs, stats = asyncio.run(check())
    # The case this test is about: clients gone before their RunStarted. Usually some
    # replies are undelivered; a host fast enough answers before a client's connection
    # has closed (the reply then goes to a closing socket). Either way, every session
    # the requests made must end, none stuck: what follows is checked in both cases.
    assert stats["ports"]["api"]["received"] >= clients, stats["ports"]["api"]
    assert len(sessions) <= clients
    for s in sessions:
        assert s["last_end"] == "DONE", s
        assert_one_run(runs[s["session"]])
    assert "running" not in stats["sessions"], stats["sessions"]
    assert not stats["ports"]["api"]["rejected"].get("handler_error"), stats["ports"]["api"]


def _zmtp_prop(name: bytes, value: bytes) -> bytes:
    return bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value


#: A ZMTP 3.0 greeting (NULL mechanism, as client).
GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x00" + b"NULL".ljust(20, b"\x00") + b"\x00" * 32


def zmtp_frame(body: bytes, more: bool = False, command: bool = False) -> bytes:
    """One ZMTP 3.0 frame (short or long form)."""
    flags = (1 if more else 0) | (4 if command else 0)
    if len(body) < 256:
        return bytes([flags, len(body)]) + body
    return bytes([flags | 2]) + len(body).to_bytes(8, "big") + body


def zmtp_handshake(socket_type: bytes) -> bytes:
    """What a peer of `socket_type` writes before its first message."""
    ready = b"\x05READY" + _zmtp_prop(b"Socket-Type", socket_type) + _zmtp_prop(b"Identity", b"")
    return GREETING + zmtp_frame(ready, command=True)


HANDSHAKE = zmtp_handshake(b"DEALER")


def zmtp_connect(path: str, socket_type: bytes) -> socket.socket:
    """A raw unix connection that has done the ZMTP handshake as `socket_type`: ready
    for messages (libzmq reads none before its own READY has gone out)."""
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.settimeout(10)
    raw.connect(path)
    raw.sendall(zmtp_handshake(socket_type))
    _read_exactly(raw, 64)  # its greeting ...
    flags, size = _read_exactly(raw, 2)
    assert flags == 4, flags  # ... and its READY command
    _read_exactly(raw, size)
    return raw


def _read_exactly(raw: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = raw.recv(n - len(data))
        assert chunk, "the peer closed the connection during the handshake"
        data += chunk
    return data

#: What a client that vanishes mid-request may have written: nothing, part of the
#: greeting, part of the handshake, ...
HALF_HANDSHAKES = [b"", GREETING[:5], GREETING[:-7], HANDSHAKE[:-4]]
#: ... or, after a whole handshake, a frame cut short, a frame announcing 4 EiB,
#: a message whose last frame never comes.
HALF_MESSAGES = [
    zmtp_frame(encode(Envelope(StartRun("cut short"), id="half")))[:20],
    b"\x02" + (1 << 62).to_bytes(8, "big") + b"x" * 100,
    zmtp_frame(encode(Envelope(StartRun("never sent"), id="half")), more=True),
]


def test_clients_that_send_half_a_request_and_vanish_leave_actors_serving(host):
    ends = Endpoints.for_home(Path(host))
    state = json.loads((Path(host) / "run" / "host.json").read_text())
    pids = {a["name"]: a["pid"] for a in state["actors"]}
    serving = [psutil.Process(pids[name]) for name in ("supervisor", "broadcaster")]

    async def scenario():
        async with Client.connect(Path(host)) as client:
            # A host is up before its workers have all said Ready (a fresh-clone run took
            # "before" with the llm caller not yet in): wait for them, then compare.
            await wait_for(client.stats,
                           lambda s: s["workers"].get("llm", 0) and s["workers"].get("tool", 0),
                           what="the host's llm caller and executor to register")
            before = (await client.stats(), await client.broadcaster_stats())
            paths = {ends.address(name).removeprefix("ipc://") for name in ABUSED}
            for name in ABUSED:
                path = ends.address(name).removeprefix("ipc://")
                for garbage in HALF_HANDSHAKES:
                    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as raw:
                        raw.connect(path)
                        raw.sendall(garbage)
                peer_type = {"events": b"SUB", "ingest": b"PUSH"}.get(name, b"DEALER")
                for garbage in HALF_MESSAGES:
                    with await asyncio.to_thread(zmtp_connect, path, peer_type) as raw:
                        raw.sendall(garbage)
            # Each connection closed by the actor once it saw the peer go: none of its
            # connections on the endpoints abused is left with its peer gone. (Counting
            # its fds would count what it opens meanwhile for other reasons: a worker
            # or the broadcaster connecting, seen in fresh-clone runs.)
            await wait_for(lambda: _all_half_open(serving, paths),
                           lambda now: not any(now),
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


#: The endpoints the test connects to and abandons.
ABUSED = ("api", "control", "replay", "work", "events", "ingest")


async def _all_half_open(procs: list[Any], paths: set[str]) -> list[Counter[str]]:
    return _half_open(procs, paths)


def _half_open(procs: list[psutil.Process], paths: set[str]) -> list[Counter[str]]:
    """Per process of `procs`: its connections on each of `paths` whose peer has closed
    its end (`ss` shows an accepted connection with its listener's path, and the peer's
    inode as 0 once the peer's socket is gone)."""
    listed = subprocess.run(["ss", "-xaH"], capture_output=True, text=True, check=True).stdout
    gone: dict[str, str] = {}  # the inode of a connection whose peer went -> its path
    for line in listed.splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[1] == "ESTAB" and fields[4] in paths and fields[-1] == "0":
            gone[fields[5]] = fields[4]
    out = []
    for proc in procs:
        held: Counter[str] = Counter()
        for fd in Path(f"/proc/{proc.pid}/fd").iterdir():
            try:
                target = fd.readlink().name
            except OSError:  # closed meanwhile
                continue
            inode = target.removeprefix("socket:[").removesuffix("]")
            if inode in gone:
                held[gone[inode]] += 1
        out.append(held)
    return out


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
    (ready_workspace(home, session) / "gate").touch()


@pytest.fixture
def limited_host(short_home, tmp_path):
    """A host allowing prompts of 60 chars and 2 running sessions, playing `GATED`."""
    (Path(short_home) / "oploop.toml").write_text(
        "[limits]\nmax_prompt_chars = 60\nmax_running_sessions = 2\n")
    with scripted_host(short_home, GATED, tmp_path) as home:
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


# -- viewers are read-only -----------------------------------------------------------------


@pytest.fixture
def gated_host(short_home, tmp_path):
    """A host playing `GATED` (no limits)."""
    with scripted_host(short_home, GATED, tmp_path) as home:
        yield home


def test_viewer_sockets_never_cancel_or_start_anything(gated_host):
    home = gated_host
    ends = Endpoints.for_home(Path(home))

    async def scenario():
        async with Client.connect(Path(home)) as client:
            run = await client.start("#gated watched")
            sid = run.session
            seen: list[dict[str, Any]] = []
            view = client.events(sid, run.from_seq, stop_at="first")
            async for event in view:
                seen.append(event)
                if event["type"] == "TOOL_START":
                    break
            verbs = [Cancel(sid, "ui"), Cancel(sid, "operation"), StartRun("evil"),
                     StartRun("evil", session=sid), ListSessions(), InspectSession(sid)]
            replies = await asyncio.to_thread(_ask_replay, ends.address("replay"), sid, verbs)
            viewers = (await client.broadcaster_stats())["viewers"]
            raw = await asyncio.to_thread(_spray_events, ends.address("events"), sid, verbs)
            try:
                # The subscription sent last is counted: the broadcaster has read
                # everything before it (one connection keeps its order), and the
                # unsubscriptions of nothing did not count.
                stats = await wait_for(client.broadcaster_stats,
                                       lambda s: s["viewers"] >= viewers + 1,
                                       what="the broadcaster to read what was sent on `events`")
                during = await client.sessions()
            finally:
                raw.close()
            open_gate(home, sid)
            seen += [e async for e in view]
            return replies, stats, during, seen, await client.sessions()

    replies, stats, during, seen, after = asyncio.run(scenario())
    assert [(type(r), r.code) for r in replies] == [(ErrorReply, "bad_request")] * len(replies)
    assert [(s["state"], s["runs"]) for s in during] == [("running", 1)]
    assert stats["viewers"] == 2, stats["viewers"]  # this test's client, and the raw one
    assert_one_run(seen)
    assert seen[-1]["type"] == "DONE" and not [e for e in seen if e["type"] == "CANCELLED"]
    assert [(s["state"], s["runs"]) for s in after] == [("idle", 1)]


def _ask_replay(address: str, sid: str, bodies: list[Any]) -> list[Any]:
    """Send each body on the replay socket as a request; the reply bodies."""
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.connect(address)
        replies = []
        for i, body in enumerate(bodies):
            sock.send(encode(Envelope(body, id=f"v{i}", sid=sid)))
            replies.append(decode(sock.recv()).body)
        sock.close()
        return replies
    finally:
        ctx.term()


def _spray_events(address: str, sid: str, bodies: list[Any]) -> socket.socket:
    """Send, upstream on the `events` XPUB as a raw XSUB peer (no libzmq to filter it),
    verbs, garbage and unsubscriptions of topics it never subscribed; then a
    subscription to `sid`, the one thing that may change the viewer count. Returns the
    connection, open (closing it ends that subscription)."""
    messages = [zmtp_frame(encode(Envelope(body, id="x", sid=sid))) for body in bodies]
    # (Not an unsubscription of `sid`: the XPUB does not say whose it is, so it would
    # uncount the real viewer of `sid`; the count is a statistic, never a permission.)
    messages += [zmtp_frame(b"\x00never-subscribed"), zmtp_frame(b"\x00"), zmtp_frame(b"\xc1"),
                 zmtp_frame(b"a", more=True) + zmtp_frame(b"\x01b", more=True) + zmtp_frame(b"c"),
                 zmtp_frame(b"\x02" + b"x" * 1000), zmtp_frame(b"\x01" + sid.encode())]
    raw = zmtp_connect(address.removeprefix("ipc://"), b"XSUB")
    raw.sendall(b"".join(messages))
    return raw
