"""Many viewers on one session: every one sees the same contiguous sequence.

Two set-ups, both real processes on real sockets:
- a real host (`oploop up`) running a session that waits at a gate (a shell
  tool polling for a file) so that "mid-session" is a state, not a moment;
- a real broadcaster process fed by a fake supervisor that implements the
  supervisor's side of the interface (a real session log it commits each event
  to before pushing it, ingest PUSH, `api` ROUTER answering `ListSessions` and
  `ReplayRequest` from that log), so that tests can lose events in flight or
  flood viewers at will.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import psutil
import pytest
import zmq
from hostkit import OPLOOP, TERMINAL, WAIT_S, cli_env, ready_workspace
from hostkit import oploop as kit_oploop

from actors.sessionlog import Record, SessionLog, SessionRow
from bus.client import Client, Lag
from bus.codec import decode, encode
from bus.endpoints import Endpoints
from bus.messages import (
    Envelope,
    ErrorReply,
    Event,
    ListSessions,
    ReplayBatch,
    ReplayRequest,
    SessionList,
    StartRun,
)
from bus.sockets import Reactor

#: The model's variables and every `OPLOOP_*` of this process are left out.
CLEAN = ("ANTHROPIC_", "OPLOOP_")


def clean_env(home: str, **extra: str) -> dict[str, str]:
    return cli_env(home, extra, drop=CLEAN)


def oploop(home: str, *args: str, env: dict[str, str] | None = None, timeout: float = 60):
    return kit_oploop(home, *args, env=env, timeout=timeout, drop=CLEAN)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def assert_contiguous_to_one_terminal(events: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [e["type"] in TERMINAL for e in events].count(True) == 1
    assert events[-1]["type"] in TERMINAL


# -- a real host, a session held at a gate -------------------------------------------------


def gated_scenario(tmp_path: Path) -> Path:
    """A scenario whose first turn streams text, then runs a shell tool that waits for
    a file `gate` to exist in its workspace (the only place of the host's the sandbox
    lets it see); the second turn streams more text and ends."""
    words = " ".join(f"word{i}" for i in range(150))
    scenario = tmp_path / "gated.json"
    scenario.write_text(json.dumps([
        {"reply": [
            {"type": "text", "text": f"first turn: {words}"},
            {"type": "tool_use", "name": "shell", "input": {
                "command": "while [ ! -e gate ]; do sleep 0.02; done; echo opened",
                "timeout_s": 50}},
        ]},
        {"reply": f"second turn: {words}", "stop_reason": "end_turn"},
    ]))
    return scenario


@pytest.fixture
def gated_host(short_home, tmp_path):
    """A host whose sessions stop at a gate; yields (home, a function opening the gate
    of a session)."""
    scenario = gated_scenario(tmp_path)
    # One event per streamed word: a few hundred events per session.
    env = {"OPLOOP_OFFLINE_SCENARIO": str(scenario), "OPLOOP_TOKEN_BATCH_MS": "0"}
    up = oploop(short_home, "up", "--detach", env=env)
    assert up.returncode == 0, up.stderr

    def open_gate(session: str) -> None:
        # The executor makes the workspace as the tool starts (TOOL_START may come first).
        (ready_workspace(short_home, session) / "gate").touch()

    yield short_home, open_gate
    down = oploop(short_home, "down")
    assert down.returncode == 0, down.stderr
    assert not Endpoints.for_home(Path(short_home)).socket_files()


def actors_of(home: str) -> dict[str, dict[str, Any]]:
    state = json.loads((Path(home) / "run" / "host.json").read_text())
    return {a["name"]: a for a in state["actors"]}


async def collect_until(agen: AsyncIterator[dict[str, Any]], out: list[dict[str, Any]],
                        type_: str) -> None:
    """Append events of `agen` to `out` until one of `type_` has been appended."""
    async for ev in agen:
        out.append(ev)
        if ev["type"] == type_:
            return
    raise AssertionError(f"stream ended before a {type_} event")


def watch_process(home: str, session: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*OPLOOP, "watch", "--json", "--until-idle", *args, session],
                            env=clean_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_late_restarted_and_after_the_end_viewers_see_one_sequence(gated_host):
    home, open_gate = gated_host

    async def scenario():
        async with Client.connect(Path(home)) as client:
            run = await client.start("go")
            first: list[dict[str, Any]] = []
            stream = client.events(run.session, 1)
            await collect_until(stream, first, "TOOL_START")  # now held at the gate

            late: list[dict[str, Any]] = []
            late_stream = client.events(run.session, 1)
            await collect_until(late_stream, late, "TOOL_START")

            # A CLI viewer killed mid-session, restarted from where it stood.
            doomed = watch_process(home, run.session)
            seen: list[dict[str, Any]] = []
            while not seen or seen[-1]["type"] != "TOOL_START":
                seen.append(json.loads(await asyncio.to_thread(doomed.stdout.readline)))
            doomed.kill()
            doomed.communicate()
            resumed = watch_process(home, run.session, "--from-seq", str(seen[-1]["seq"] + 1))

            open_gate(run.session)
            async for ev in stream:
                first.append(ev)
            async for ev in late_stream:
                late.append(ev)
            out, err = await asyncio.to_thread(resumed.communicate, timeout=WAIT_S)
            assert resumed.returncode == 0, err
            assert "behind" not in err  # a viewer that kept up is not told it fell behind
            after = [ev async for ev in client.events(run.session, 1)]
            return first, late, seen + json_lines(out), after, run.session

    first, late, restarted, after, sid = asyncio.run(scenario())
    assert_contiguous_to_one_terminal(first)
    assert first[-1]["type"] == "DONE" and len(first) > 300
    (tool,) = [e["data"] for e in first if e["type"] == "TOOL_END"]
    assert tool["output"].strip() == "opened"  # the gate opened: no timeout
    assert late == first and restarted == first and after == first
    no_follow = oploop(home, "watch", "--json", "--no-follow", sid)
    assert no_follow.returncode == 0, no_follow.stderr
    assert json_lines(no_follow.stdout) == first


def test_broadcaster_killed_mid_session_loses_nothing(gated_host):
    home, open_gate = gated_host

    async def scenario():
        async with Client.connect(Path(home)) as client:
            run = await client.start("go")
            seen: list[dict[str, Any]] = []
            stream = client.events(run.session, 1)
            await collect_until(stream, seen, "TOOL_START")
            broadcaster = actors_of(home)["broadcaster"]["pid"]
            os.kill(broadcaster, signal.SIGKILL)
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(broadcaster).wait(10)
            open_gate(run.session)  # the second turn streams while the broadcaster is away
            async for ev in stream:
                seen.append(ev)
            stats = await client.broadcaster_stats()
            return seen, stats, run.session

    seen, stats, sid = asyncio.run(scenario())
    assert_contiguous_to_one_terminal(seen)
    assert seen[-1]["type"] == "DONE"
    # The host counts the restart once the new broadcaster said ready, which may
    # come a moment after it served this viewer.
    deadline = time.monotonic() + 10
    while actors_of(home)["broadcaster"]["restarts"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert actors_of(home)["broadcaster"]["restarts"] == 1
    assert stats["lost"] == 0
    # The restarted broadcaster serves the whole session, the part before the kill
    # from its store: a finished session can still be watched.
    again = oploop(home, "watch", "--json", "--no-follow", sid)
    assert again.returncode == 0, again.stderr
    assert json_lines(again.stdout) == seen


# -- a real broadcaster fed by a fake supervisor ---------------------------------------------


class FakeSupervisor:
    """The supervisor's side of the broadcaster's interface, with events to lose at will."""

    def __init__(self, endpoints: Endpoints, home: str) -> None:
        self.log = SessionLog(Path(home) / "sessions.db", reserve_mb=0)
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.reactor = Reactor(self.ctx)
        self.api = self.reactor.add(zmq.ROUTER, "api", self.handle_api,
                                    bind=endpoints.address("api"), reply_errors=True)
        self.push = self.reactor.add(zmq.PUSH, "push", connect=endpoints.address("ingest"),
                                     hwm=1_000_000)
        self.last: dict[str, int] = {}
        #: Frames journaled but not pushed (`deliver=False`), for `release`.
        self.held: list[bytes] = []
        self.resend_requests = 0
        #: Set once a broadcaster's start-up reconcile had its session list.
        self.listed = asyncio.Event()

    def emit(self, sid: str, type_: str = "TOKEN", data: dict[str, Any] | None = None, *,
             deliver: bool = True) -> int:
        """Stamp the next seq of `sid`, journal it, push it unless `deliver` is False
        (an event lost in flight)."""
        seq = self.last[sid] = self.last.get(sid, 0) + 1
        env = Envelope(Event(seq, type_, 1, time.time(), data or {"text": "x"}), sid=sid)
        frame = encode(env)
        row = [SessionRow(sid, 0.0, b"", None, 0.0, True)] if seq == 1 else []
        self.log.commit([Record(sid, seq, frame)], row)
        if deliver:
            self.push.send_frame(frame)
        else:
            self.held.append(frame)
        return seq

    def release(self) -> None:
        """Push the frames held back so far: late, not lost."""
        for frame in self.held:
            self.push.send_frame(frame)
        self.held.clear()

    def handle_api(self, peer: bytes | None, env: Envelope, frame: bytes) -> None:
        if isinstance(env.body, ListSessions):
            sessions = [{"session": s, "last_seq": n} for s, n in self.last.items()]
            self.api.send(Envelope(SessionList(sessions), id=env.id), peer)
            self.listed.set()
        elif isinstance(env.body, ReplayRequest):
            self.resend_requests += 1
            req = env.body
            last = self.last.get(env.sid, 0)
            rows, more = self.log.range(env.sid, req.from_seq, min(req.to_seq or last, last),
                                        1 << 20)
            body = (ReplayBatch([f for _, f in rows], last, more) if rows
                    else ErrorReply("gone", "none kept"))
            self.api.send(Envelope(body, id=env.id), peer)
        else:
            self.api.reply_error(peer, env.id, "bad_request", env.kind)


class Rig:
    """A broadcaster process, its fake supervisor, and a client."""

    def __init__(self, home: str, env: dict[str, str]) -> None:
        self.home = home
        self.env = clean_env(home, **env)
        self.endpoints = Endpoints.for_home(Path(home))
        self.proc: subprocess.Popen[bytes] | None = None

    def start_broadcaster(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "actors.broadcaster"], env=self.env)

    def kill_broadcaster(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.proc = None


@contextlib.asynccontextmanager
async def rig(home: str, **env: str) -> AsyncIterator[tuple[Rig, FakeSupervisor, Client]]:
    r = Rig(home, env)
    r.endpoints.prepare()
    sup = FakeSupervisor(r.endpoints, home)
    serving = asyncio.create_task(sup.reactor.run())
    r.start_broadcaster()
    try:
        async with Client.connect(Path(home)) as client:
            await client.broadcaster_stats(timeout=WAIT_S)  # answered once it serves
            # Its start-up reconcile done: an event emitted before it asked would be
            # fetched from the log (counted `recovered`) if its push came in later.
            await asyncio.wait_for(sup.listed.wait(), WAIT_S)
            yield r, sup, client
    finally:
        if r.proc is not None:
            r.proc.send_signal(signal.SIGTERM)
            r.proc.wait(10)
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        sup.reactor.close()
        sup.ctx.term()
        sup.log.close()


async def wait_viewers(client: Client, n: int) -> None:
    """Until the broadcaster counts `n` subscribed viewers (an observable state)."""
    async with asyncio.timeout(20):
        while (await client.broadcaster_stats())["viewers"] < n:
            await asyncio.sleep(0.01)


def test_slow_viewers_fall_behind_catch_up_and_are_told(short_home):
    sid = "slow00000001"
    text = "t" * 500
    n_tokens = 15_000  # far beyond every queue between the broadcaster and a viewer

    async def scenario():
        # A queue of 50 events per viewer at the broadcaster.
        async with rig(short_home, OPLOOP_VIEWER_QUEUE="50") as (_, sup, client):
            sup.emit(sid, "SESSION_START", {})
            fast_stream = client.events(sid)
            fast = [await anext(fast_stream)]
            lags: list[Lag] = []
            # Slow: a 10-event queue on its side, and it reads nothing until the fast
            # viewer has seen the end.
            slow_stream = client.events(sid, hwm=10, on_lag=lags.append)
            slow = [await anext(slow_stream)]
            # Slow too: a CLI viewer whose stdout pipe nobody reads yet.
            cli = watch_process(short_home, sid)
            await wait_viewers(client, 3)
            for i in range(n_tokens):
                sup.emit(sid, "TOKEN", {"text": text})
                if i % 500 == 0:
                    await asyncio.sleep(0)  # let the fast viewer read meanwhile
            sup.emit(sid, "DONE", {"text": "", "turns": 1, "stop": "end_turn"})
            async for ev in fast_stream:
                fast.append(ev)
            async for ev in slow_stream:
                slow.append(ev)
            out, err = await asyncio.to_thread(cli.communicate, timeout=WAIT_S)
            assert cli.returncode == 0, err
            stats = await client.broadcaster_stats()
            return fast, slow, lags, json_lines(out), err, stats

    fast, slow, lags, cli_events, cli_err, stats = asyncio.run(scenario())
    assert len(fast) == n_tokens + 2
    assert_contiguous_to_one_terminal(fast)
    assert slow == fast and cli_events == fast
    assert lags and sum(lag.missed for lag in lags) > 0 and not any(lag.lost for lag in lags)
    assert "fell" in cli_err and "behind the live stream" in cli_err
    assert stats["lost"] == 0


def test_broadcaster_refills_events_lost_in_flight_and_after_a_restart(short_home):
    async def scenario():
        async with rig(short_home) as (r, sup, client):
            for _ in range(10):
                sup.emit("a")
            for _ in range(4):
                sup.emit("a", deliver=False)  # lost between supervisor and broadcaster
            for _ in range(5):
                sup.emit("a")
            sup.emit("a", "DONE", {"text": "", "turns": 1, "stop": "end_turn"})
            a = [ev async for ev in client.events("a")]
            before = await client.broadcaster_stats()

            # A session the broadcaster never heard of, and a restart: the new broadcaster
            # serves all of "b" from the session log, where the supervisor put it.
            for _ in range(4):
                sup.emit("b", deliver=False)
            sup.emit("b", "DONE", {"text": "", "turns": 1, "stop": "end_turn"}, deliver=False)
            r.kill_broadcaster()
            r.start_broadcaster()
            b = [ev async for ev in client.events("b")]
            a_again = [ev async for ev in client.events("a", follow=False)]
            stats = await client.broadcaster_stats()
            return a, b, a_again, before, stats

    a, b, a_again, before, after = asyncio.run(scenario())
    assert_contiguous_to_one_terminal(a)
    assert len(a) == 20 and a_again == a
    assert_contiguous_to_one_terminal(b)
    assert len(b) == 5
    assert before["recovered"] == 4 and before["held"] == 0
    # Nothing to fetch after the restart: what was journaled is read from the log.
    assert after["recovered"] == 0 and after["lost"] == before["lost"] == 0


def test_a_replay_until_a_seq_waits_for_what_the_log_has_not_got_yet(short_home):
    """`until_seq`, as `oploop watch --no-follow` asks with the supervisor's `last_seq`:
    every event committed by then, though the broadcaster's log is behind (a run that
    just ended, its last events still on their way), and nothing after it."""
    async def scenario():
        async with rig(short_home) as (_, sup, client):
            for _ in range(3):
                sup.emit("a")
            first = [ev async for ev in client.events("a", until_seq=3)]
            for _ in range(3):
                sup.emit("a", deliver=False)  # committed, not yet pushed
            stored = [ev async for ev in client.events("a", follow=False)]
            replay = asyncio.ensure_future(_collect(client.events("a", until_seq=6)))
            await asyncio.sleep(0)  # (its replay may come before the release or after it)
            sup.release()
            sup.emit("a")  # 7: after what was asked for
            until_6 = await asyncio.wait_for(replay, WAIT_S)
            none = [ev async for ev in client.events("a", 8, until_seq=7)]
            return first, stored, until_6, none

    first, stored, until_6, none = asyncio.run(scenario())
    assert [e["seq"] for e in first] == [1, 2, 3]
    assert stored == first  # the broadcaster's log alone stops short
    assert [e["seq"] for e in until_6] == [1, 2, 3, 4, 5, 6]  # no terminal event: ended at 6
    assert none == []


async def _collect(stream: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [ev async for ev in stream]


def test_bad_replay_requests_get_error_replies_and_others_are_served(short_home):
    def request(sock: zmq.Socket[bytes], body: Any, sid: str) -> Envelope:
        sock.send(encode(Envelope(body, id="q", sid=sid)))
        return decode(sock.recv())

    async def scenario():
        async with rig(short_home) as (_, sup, client):
            for _ in range(3):
                sup.emit("good")
            sup.emit("good", "DONE", {"text": "", "turns": 1, "stop": "end_turn"})
            sock = client._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.RCVTIMEO, 5000)
            sock.connect(Endpoints.for_home(Path(short_home)).address("replay"))
            codes: list[str] = []
            try:
                # wait until "good" is logged: its replay answers a batch
                while not isinstance(request(sock, ReplayRequest(1, 0), "good").body, ReplayBatch):
                    await asyncio.sleep(0.01)
                for sid, from_seq, to_seq in (("nobody", 1, 0), ("good", 0, 0), ("good", -5, 0),
                                              ("good", 2**64 - 1, 0), ("good", -(2**63), 0),
                                              ("good", 1, -1), ("good", 3, 2), ("", 1, 0)):
                    reply = request(sock, ReplayRequest(from_seq, to_seq), sid)
                    assert isinstance(reply.body, ErrorReply)
                    codes.append(reply.body.code)
                reply = request(sock, StartRun("x"), "good")
                codes.append(reply.body.code)  # type: ignore[union-attr]
                for garbage in ([b"\xc1"], [msgpack.packb([1, "replay_request", "", "good", "",
                                                            0, {"from_seq": "one"}])],
                                [b"a", b"b", b"c"], [b"x" * 100_000]):
                    sock.send_multipart(garbage)
                    body = decode(sock.recv()).body
                    assert isinstance(body, ErrorReply)
                    codes.append(body.code)
                ok = request(sock, ReplayRequest(2, 3), "good").body
            finally:
                sock.close()
            events = [ev async for ev in client.events("good")]
            return codes, ok, events

    codes, ok, events = asyncio.run(scenario())
    assert codes == ["unknown_session", "bad_seq", "bad_seq", "bad_seq", "bad_seq",
                     "bad_seq", "bad_seq", "unknown_session", "bad_request",
                     "bad_frame", "bad_frame", "bad_frame", "bad_frame"]
    assert isinstance(ok, ReplayBatch) and [decode(f).body.seq for f in ok.events] == [2, 3]
    assert_contiguous_to_one_terminal(events)
