"""Cancellation end to end: UI cancel mid-stream and mid-tool, operation cancel at a
boundary, deadlines, a cancel before the first turn, Ctrl-C in `oploop run`."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from pathlib import Path

import httpx2
import psutil
import pytest
import zmq
import zmq.asyncio
from homes import make_home
from hostkit import (
    OPLOOP,
    TERMINAL,
    WAIT_S,
    assert_one_run,
    of_type,
    running_host,
    unique_mark,
    until,
    workspace,
)

from actors.config import Config
from actors.core.history import is_valid
from actors.sandbox.workspaces import remove_home
from actors.supervisor.actor import Supervisor
from bus.client import Client
from bus.codec import decode
from bus.endpoints import Endpoints
from bus.errors import RemoteError

WORDS = " ".join(f"word{i}" for i in range(400))
OK = {"reply": "follow-up answered", "stop_reason": "end_turn"}
#: Marks the processes of the long tool so that the test can find every one of them.
MARK = unique_mark()


def shell(command: str) -> dict:
    return {"type": "tool_use", "name": "shell", "input": {"command": command}}


SCRIPTS = {
    "slowtext": [{"reply": WORDS, "delay_s": 0.05}, OK],
    "slowtool": [{"reply": [shell(f"sleep {MARK}1 & sh -c 'sleep {MARK}2' & sleep {MARK}3")]},
                 OK],
    "optool": [
        {"reply": [shell("touch started; until [ -e go ]; do sleep 0.01; done; echo finished")]},
        {"reply": [shell("echo never")]},
    ],
}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    home = make_home("opc-")
    files = tmp_path_factory.mktemp("cancel")
    (files / "scenario.json").write_text(json.dumps({"scripts": SCRIPTS}))
    try:
        with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(files / "scenario.json")}) as h:
            yield h
    finally:
        remove_home(Path(home))


def marked_processes() -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(MARK in part for part in p.info["cmdline"] or ()):
            found.append(p)
    return found


def offline_stats(home: str) -> dict:
    port = (Path(home) / "run" / "offline.port").read_text().strip()
    return httpx2.get(f"http://127.0.0.1:{port}/v1/offline/stats").json()


async def collect(client, started, on_event=None):
    events = []
    async for event in client.events(started.session, started.from_seq, stop_at="first"):
        events.append(event)
        if on_event is not None:
            await on_event(event)
    return events


async def no_jobs_left(client):
    stats = await client.stats()
    return stats["jobs_inflight"] == 0 and stats["jobs_aborting"] == 0


async def follow_up(client, sid):
    started = await client.start("and now?", session=sid)
    events = await collect(client, started)
    assert_one_run(events, started.from_seq)
    return events


def test_ui_cancel_mid_stream(host):
    abandoned_before = offline_stats(host)["abandoned"]

    async def scenario():
        async with Client.connect(Path(host)) as client:
            started = await client.start("#slowtext talk")
            cancelled = False

            async def on_event(event):
                nonlocal cancelled
                if event["type"] == "TOKEN" and not cancelled:
                    cancelled = True
                    ack = await client.cancel(started.session)
                    assert ack.state == "cancelled"

            events = await collect(client, started, on_event)
            await until(lambda: no_jobs_left(client), what="the llm job to be released")
            info = await client.inspect(started.session)
            return events, info, await follow_up(client, started.session)

    events, info, after = asyncio.run(scenario())
    assert_one_run(events)
    assert events[-1]["type"] == "CANCELLED" and events[-1]["data"]["mode"] == "ui"
    # The model's HTTP stream was closed, not left to run to its end.
    asyncio.run(until(lambda: _async(offline_stats(host)["abandoned"] > abandoned_before),
                      what="the offline model to see the stream abandoned"))
    assert is_valid(info.history)
    kept = info.history[-1]
    assert kept["role"] == "assistant" and "word0" in kept["content"][0]["text"]
    assert kept["content"][0]["text"].endswith("[reply interrupted: cancelled by the user]")
    assert after[-1]["type"] == "DONE" and after[-1]["data"]["text"] == "follow-up answered"


async def _async(value):
    return value


def test_ui_cancel_mid_tool_kills_the_whole_tree(host, tmp_path):
    async def scenario():
        async with Client.connect(Path(host)) as client:
            started = await client.start("#slowtool go", cwd=str(tmp_path))

            async def on_event(event):
                if event["type"] == "TOOL_START":
                    await until(lambda: _async(len(marked_processes()) >= 3),
                                what="the tool's processes")
                    await client.cancel(started.session)

            events = await collect(client, started, on_event)
            await until(lambda: _async(not marked_processes()),
                        what="every process of the tool to die")
            await until(lambda: no_jobs_left(client), what="the executor's acknowledgement")
            info = await client.inspect(started.session)
            return events, info, await follow_up(client, started.session)

    events, info, after = asyncio.run(scenario())
    assert_one_run(events)
    assert events[-1]["type"] == "CANCELLED"
    # The viewer sees the tool it saw start end, as cancelled (issue 14 item 4).
    (end,) = of_type(events, "TOOL_END")
    assert events[-2] is end and end["data"]["is_error"]
    assert end["data"]["output"] == "cancelled by the user"
    assert end["data"]["tool_use_id"] == of_type(events, "TOOL_START")[0]["data"]["tool_use_id"]
    assert is_valid(info.history)
    result = info.history[-1]["content"][0]
    assert result["type"] == "tool_result" and result["content"] == "cancelled by the user"
    assert after[-1]["type"] == "DONE"


def test_operation_cancel_lets_the_tool_finish_then_stops(host, tmp_path):
    async def scenario():
        async with Client.connect(Path(host)) as client:
            started = await client.start("#optool go", cwd=str(tmp_path))

            async def on_event(event):
                if event["type"] == "TOOL_START":
                    work = workspace(host, started.session)
                    await until(lambda: _async((work / "started").exists()),
                                what="the tool to start")
                    ack = await client.cancel(started.session, mode="operation")
                    assert ack.state == "stopping"
                    again = await client.cancel(started.session, mode="operation")
                    assert again.state == "stopping"
                    (work / "go").touch()

            return await collect(client, started, on_event)

    events = asyncio.run(scenario())
    assert_one_run(events)
    (end,) = of_type(events, "TOOL_END")
    assert not end["data"]["is_error"] and "finished" in end["data"]["output"]
    assert len(of_type(events, "TURN_START")) == 1
    assert events[-1]["type"] == "CANCELLED" and events[-1]["data"]["mode"] == "operation"


def test_deadline_cancels(host):
    async def scenario():
        async with Client.connect(Path(host)) as client:
            started = await client.start("#slowtext talk", deadline_s=0.5)
            events = await collect(client, started)
            info = await client.inspect(started.session)
            return events, info

    events, info = asyncio.run(scenario())
    assert_one_run(events)
    assert events[-1]["type"] == "CANCELLED" and events[-1]["data"]["mode"] == "deadline"
    assert events[0]["data"]["deadline_s"] == 0.5
    assert is_valid(info.history)


def test_deadline_mid_tool_ends_the_tool_as_cancelled(host, tmp_path):
    """The deadline passes while a tool runs: the viewer sees that tool end (is_error,
    "cancelled: deadline") before `CANCELLED`, and the tool's processes are stopped."""

    async def scenario():
        async with Client.connect(Path(host)) as client:
            # Long enough for the (offline, instant) model's reply to start the tool.
            started = await client.start("#slowtool go", cwd=str(tmp_path), deadline_s=4)
            events = await collect(client, started)
            await until(lambda: _async(not marked_processes()),
                        what="every process of the tool to die")
            await until(lambda: no_jobs_left(client), what="the executor's acknowledgement")
            return events, await client.inspect(started.session)

    events, info = asyncio.run(scenario())
    assert_one_run(events)
    assert events[-1]["type"] == "CANCELLED" and events[-1]["data"]["mode"] == "deadline"
    (start,) = of_type(events, "TOOL_START")
    (end,) = of_type(events, "TOOL_END")
    assert events[-2] is end and end["data"]["tool_use_id"] == start["data"]["tool_use_id"]
    assert end["data"]["is_error"] and end["data"]["output"] == "cancelled: deadline"
    assert is_valid(info.history)


def test_cancel_of_unknown_or_finished_session_changes_nothing(host):
    async def scenario():
        async with Client.connect(Path(host)) as client:
            with pytest.raises(RemoteError) as unknown:
                await client.cancel("nosuchsession")
            started = await client.start("run `echo quick`")
            events = await collect(client, started)
            with pytest.raises(RemoteError) as finished:
                await client.cancel(started.session)
            with pytest.raises(RemoteError) as bad_mode:
                await client.cancel(started.session, mode="sideways")
            after = await collect(client, started)  # the log, replayed: nothing was added
            return unknown.value, finished.value, bad_mode.value, events, after

    unknown, finished, bad_mode, events, after = asyncio.run(scenario())
    assert unknown.code == "unknown_session"
    assert finished.code == "not_running" and "DONE" in finished.message
    assert bad_mode.code == "bad_request"
    assert after == events


def test_ctrl_c_in_run_cancels_and_exits_130(host):
    proc = subprocess.Popen([*OPLOOP, "run", "--json", "#slowtext talk"],
                            env={"OPLOOP_HOME": host, "PATH": "/usr/bin:/bin"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        events = []
        for line in proc.stdout:
            events.append(json.loads(line))
            if events[-1]["type"] == "TOKEN" and len(of_type(events, "TOKEN")) == 1:
                proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=WAIT_S) == 130
    finally:
        proc.kill()
        proc.wait()
    assert_one_run(events)
    assert events[-1]["type"] == "CANCELLED" and events[-1]["data"]["mode"] == "ui"


def test_cancel_before_the_first_turn_is_honoured(short_home):
    """A supervisor with no workers yet: the run waits for a tool catalogue, and a
    cancel in that window ends it with one terminal event (and no model call)."""

    async def scenario():
        endpoints = Endpoints.for_home(Path(short_home))
        endpoints.prepare()
        ctx = zmq.asyncio.Context.instance()
        ingest = ctx.socket(zmq.PULL)
        ingest.bind(endpoints.address("ingest"))
        supervisor = Supervisor(endpoints, Config())
        serving = asyncio.create_task(supervisor.serve())
        try:
            async with Client.connect(Path(short_home)) as client:
                started = await client.start("hello")
                ack = await client.cancel(started.session)
                with pytest.raises(RemoteError) as second:
                    await client.cancel(started.session)
                events = []
                while not events or events[-1]["type"] not in TERMINAL:
                    env = decode(await ingest.recv())
                    events.append({"seq": env.body.seq, "type": env.body.type,
                                   "data": env.body.data})
                return ack, second.value, events
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            ingest.close(0)

    ack, second, events = asyncio.run(scenario())
    assert ack.state == "cancelled" and second.code == "not_running"
    assert [e["type"] for e in events] == ["SESSION_START", "CANCELLED"]
