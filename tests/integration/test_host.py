"""A real host: every actor a process, sessions over real sockets, the offline
model reached over HTTP through the real SDK."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import msgpack
import pytest
import zmq
from hostkit import OPLOOP, assert_one_run, events_of, oploop, running_host

from bus.client import Client
from bus.endpoints import Endpoints


@pytest.fixture
def host(short_home):
    """A running host in a fresh home, stopped (and checked for leftovers) after."""
    with running_host(short_home) as home:
        yield home


def test_session_through_every_actor(short_home, tmp_path):
    (tmp_path / "note.txt").write_text("hello from a file\n")
    os.chmod(tmp_path, 0o755)
    # The default mode: the tools act in the directory the run starts in.
    mode = {"OPLOOP_SANDBOX": "workspace-write"}
    with running_host(short_home, mode) as host:
        _through_every_actor(host, tmp_path, mode)


def _through_every_actor(host, tmp_path, mode):
    # Issue 28, idle RSS: a caller imports the SDK at its first call (~60 MiB resident),
    # so an idle host holds none of it, and the host loads no psutil (its stop's only)
    idle = {a["name"]: a["pid"] for a in json.loads(oploop(host, "status", "--json").stdout)
            ["actors"]}
    assert not _maps(idle["llm-1"], "_pydantic_core"), "the SDK was imported before a call"
    assert not _maps(idle["llm-1"], "libcrypto"), "OpenSSL was loaded before a call"
    assert not _maps(idle["host"], "_psutil_linux")
    run = subprocess.run(
        [*OPLOOP, "run", "--json", "read note.txt and run `echo hi`"],
        env={**os.environ, "OPLOOP_HOME": host, **mode}, cwd=tmp_path, capture_output=True,
        text=True, timeout=60,
    )
    assert run.returncode == 0, run.stderr
    events = events_of(run.stdout)
    assert_one_run(events)
    types = [e["type"] for e in events]
    assert types[0] == "SESSION_START" and types[-1] == "DONE"
    ends = {e["data"]["name"]: e["data"] for e in events if e["type"] == "TOOL_END"}
    assert "hello from a file" in ends["read_file"]["output"]
    assert "hi" in ends["shell"]["output"] and not ends["shell"]["is_error"]
    assert any(e["type"] == "TOKEN" for e in events)
    assert "hello from a file" in events[-1]["data"]["text"]

    status = oploop(host, "status", "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    names = {a["name"] for a in data["actors"]}
    assert {"host", "supervisor", "broadcaster", "llm-1", "executor-1", "offline-model"} <= names
    assert all(a["rss_mb"] for a in data["actors"])
    assert len(data["sessions"]) == 1

    # Issues 13 and 28, idle RSS: only the llm callers speak TLS (their SDK); no other
    # actor loads OpenSSL (~4.5 MiB each), the supervisor on uvloop included.
    pids = {a["name"]: a["pid"] for a in data["actors"]}
    for name in ("host", "executor-1", "supervisor", "broadcaster", "offline-model"):
        assert not _maps(pids[name], "libcrypto"), name
    assert _maps(pids["llm-1"], "libssl")
    # (the run's model calls went through the SDK, imported by then)
    assert pids["llm-1"] == idle["llm-1"] and _maps(pids["llm-1"], "_pydantic_core")


def _maps(pid: int, library: str) -> bool:
    """Whether process `pid` has a file whose name contains `library` mapped."""
    return library in Path(f"/proc/{pid}/maps").read_text()


def test_follow_up_in_the_same_session(host):
    first = oploop(host, "run", "--json", "run `echo one`")
    assert first.returncode == 0, first.stderr
    sid = events_of(first.stdout)[0]["session"]
    second = oploop(host, "run", "--json", "--session", sid, "run `echo two`")
    assert second.returncode == 0, second.stderr
    events = events_of(second.stdout)
    assert events[0]["seq"] == len(events_of(first.stdout)) + 1
    assert_one_run(events, events[0]["seq"])

    async def history():
        async with Client.connect(Path(host)) as client:
            return await client.inspect(sid)

    info = asyncio.run(history())
    assert info.summary["runs"] == 2
    texts = json.dumps(info.history)
    assert "echo one" in texts and "echo two" in texts and "Identity:" not in texts


def test_two_viewers_see_identical_sequences(host):
    async def scenario():
        async with Client.connect(Path(host)) as client:
            run = await client.start("list /tmp and read /etc/hostname, then run `uname -a`")
            late: list[dict] = []
            late_task = None
            early: list[dict] = []
            async for ev in client.events(run.session, 1):
                early.append(ev)
                if ev["type"] == "TOOL_START" and late_task is None:  # attach mid-session
                    async def view():
                        async for e in client.events(run.session, 1):
                            late.append(e)
                    late_task = asyncio.create_task(view())
            assert late_task is not None
            await late_task
            after: list[dict] = [e async for e in client.events(run.session, 1)]
            return early, late, after

    early, late, after = asyncio.run(scenario())
    assert_one_run(early)
    assert early == late == after


def test_watch_of_unknown_session_fails_clearly(host):
    watch = oploop(host, "watch", "000000000000")
    assert watch.returncode != 0
    assert watch.stderr.strip().count("\n") == 0 and "000000000000" in watch.stderr


def test_bad_frames_on_every_socket_leave_actors_serving(host):
    ends = Endpoints.for_home(Path(host))
    ctx = zmq.Context()
    garbage = [b"\xc1", msgpack.packb([1, "nope", "", "", "", 0, {}]),
               msgpack.packb([9, "start_run", "", "", "", 0, {"prompt": "x"}]),
               msgpack.packb([1, "start_run", "", "", "", 0, {"prompt": 3}]), b"x" * 100_000]
    try:
        for name, kind in (("api", zmq.DEALER), ("control", zmq.DEALER), ("work", zmq.DEALER),
                           ("replay", zmq.DEALER), ("ingest", zmq.PUSH)):
            sock = ctx.socket(kind)
            sock.setsockopt(zmq.LINGER, 1000)
            sock.connect(ends.address(name))
            for frame in garbage:
                sock.send(frame)
            sock.send_multipart([b"a", b"b", b"c"])
            sock.close()
    finally:
        ctx.term()

    async def counters():
        async with Client.connect(Path(host)) as client:
            # The api serves connections in turn: wait until it has read all the garbage.
            for _ in range(500):
                stats = await client.stats()
                if sum(stats["ports"]["api"]["rejected"].values()) >= 5:
                    return stats
                await asyncio.sleep(0.01)
            return stats

    stats = asyncio.run(counters())
    assert sum(stats["ports"]["api"]["rejected"].values()) >= 5
    run = oploop(host, "run", "--json", "run `echo still here`")
    assert run.returncode == 0, run.stderr
    assert "still here" in events_of(run.stdout)[-1]["data"]["text"]
    state = json.loads((Path(host) / "run" / "host.json").read_text())
    assert all(a["restarts"] == 0 for a in state["actors"])


def test_wrong_tool_arguments_are_an_error_result(short_home, tmp_path):
    scenario = tmp_path / "s.json"
    scenario.write_text(json.dumps([
        {"reply": [{"type": "tool_use", "name": "read_file", "input": {"pathh": "x"}}],
         "stop_reason": "tool_use"},
        {"reply": "the call failed, as it should", "stop_reason": "end_turn"},
    ]))
    run = oploop(short_home, "run", "--json", "read something",
                 env={"OPLOOP_OFFLINE_SCENARIO": str(scenario)})
    assert run.returncode == 0, run.stderr
    events = events_of(run.stdout)
    end = next(e for e in events if e["type"] == "TOOL_END")
    assert end["data"]["is_error"] and "path" in end["data"]["output"]
    assert events[-1]["type"] == "DONE"


def test_run_without_host_uses_an_embedded_one(short_home):
    run = oploop(short_home, "run", "run `echo embedded`")
    assert run.returncode == 0, run.stderr
    assert "embedded" in run.stdout and "done" in run.stdout
    assert "offline model" in run.stderr
    assert not Endpoints.for_home(Path(short_home)).socket_files()


def test_bad_config_fails_at_up_naming_the_key(short_home):
    (Path(short_home) / "oploop.toml").write_text("[agents.ops]\nmax_turnz = 3\n")
    up = oploop(short_home, "up", "--detach")
    assert up.returncode == 1
    assert "agents.ops.max_turnz: unknown key" in up.stderr
    assert not (Path(short_home) / "run" / "host.json").exists()


def test_intent_router_sends_no_tools_for_a_direct_question(short_home):
    env = {"OPLOOP_INTENT_ROUTER": "on"}
    run = oploop(short_home, "run", "--json", "what is a unix socket?", env=env)
    assert run.returncode == 0, run.stderr
    events = events_of(run.stdout)
    routes = [e["data"]["route"] for e in events if e["type"] == "ROUTE"]
    assert routes == ["DIRECT"]
    assert events[-1]["type"] == "DONE" and not [e for e in events if e["type"] == "TOOL_START"]
    tooly = oploop(short_home, "run", "--json", "run `echo routed`", env=env)
    events = events_of(tooly.stdout)
    assert [e["data"]["route"] for e in events if e["type"] == "ROUTE"] == ["AGENT"]
    assert "routed" in events[-1]["data"]["text"]
