"""Liveness: heartbeats both ways (a worker silent for three beats is dead, its jobs
fail over or fail cleanly), and the host's restart-storm cap."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from hostkit import (
    actor,
    assert_one_run,
    of_type,
    oploop,
    processes_with,
    running_host,
    scripted_host,
    unique_mark,
    until,
    wait_until,
    workspace,
)

from bus.client import Client

MARK = unique_mark()
OK = {"reply": "carried on", "stop_reason": "end_turn"}
WORDS = " ".join(f"w{i}" for i in range(300))
SCRIPTS = {
    "tool": [{"reply": [{"type": "tool_use", "name": "shell",
                         "input": {"command": f"echo ran >> started; exec sleep {MARK}0"}}]}, OK],
    "stream": [{"reply": WORDS, "delay_s": 0.02}, OK],
    "again": [{"reply": [{"type": "tool_use", "name": "shell",
                          "input": {"command": "echo used again"}}]}, OK],
}


def marked() -> list[int]:
    """The processes of this file's long-running tool."""
    return processes_with(MARK)


async def workers(client: Client) -> dict[str, int]:
    """Live workers by role, as the supervisor counts them."""
    return (await client.stats())["workers"]


@pytest.fixture
def host(short_home, tmp_path):
    """One llm caller and one executor: a worker declared dead has no stand-in."""
    with scripted_host(short_home, SCRIPTS, tmp_path, {"OPLOOP_EXECUTORS": "1"}) as home:
        yield home


def test_a_silent_executor_is_dead_its_tool_fails_and_it_comes_back(host, tmp_path):
    executor = actor(host, "executor-1")["pid"]

    async def scenario():
        async with Client.connect(Path(host)) as client:
            started = await client.start("#tool go", cwd=str(tmp_path))
            sid = started.session
            events: list[dict[str, Any]] = []
            view = client.events(sid, started.from_seq, stop_at="first")
            async for event in view:
                events.append(event)
                if event["type"] == "TOOL_START":
                    break
            await until(lambda: (workspace(host, sid) / "started").exists() and marked(),
                        "the tool to run")
            os.kill(executor, signal.SIGSTOP)  # alive, but silent
            try:
                events += [e async for e in view]
                dead = await workers(client)
            finally:
                os.kill(executor, signal.SIGCONT)
            # Back: it drops the job the supervisor has written off (killing its tool)
            # and announces itself again.
            await until(lambda: not marked(), "the abandoned tool to be killed")
            while (await workers(client))["tool"] != 1:
                await asyncio.sleep(0.02)
            again = await client.start("#again go", cwd=str(tmp_path))
            later = [e async for e in client.events(again.session, again.from_seq,
                                                    stop_at="first")]
            return sid, events, dead, later

    sid, events, dead, later = asyncio.run(scenario())
    assert_one_run(events)
    (end,) = of_type(events, "TOOL_END")
    assert end["data"]["is_error"] and "missed 3 heartbeats" in end["data"]["output"]
    assert events[-1]["type"] == "DONE" and events[-1]["data"]["text"] == "carried on"
    assert dead["tool"] == 0
    assert (workspace(host, sid) / "started").read_text() == "ran\n"  # never re-run
    assert_one_run(later)
    (end,) = of_type(later, "TOOL_END")
    assert not end["data"]["is_error"] and end["data"]["output"].strip() == "used again"
    me = actor(host, "executor-1")
    assert me["pid"] == executor and me["restarts"] == 0  # the same process, used again


def test_a_silent_llm_caller_is_dead_and_its_call_made_again(host, tmp_path):
    caller = actor(host, "llm-1")["pid"]

    async def scenario():
        async with Client.connect(Path(host)) as client:
            started = await client.start("#stream talk", cwd=str(tmp_path))
            events: list[dict[str, Any]] = []
            view = client.events(started.session, started.from_seq, stop_at="first")
            async for event in view:
                events.append(event)
                if event["type"] == "TOKEN":
                    break
            os.kill(caller, signal.SIGSTOP)
            try:
                async for event in view:
                    events.append(event)
                    if event["type"] == "RETRY":
                        break
                dead = await workers(client)
            finally:
                os.kill(caller, signal.SIGCONT)
            # The only caller: the call waits for it to come back, then goes to it.
            events += [e async for e in view]
            return events, dead

    events, dead = asyncio.run(scenario())
    assert_one_run(events)
    (retry,) = of_type(events, "RETRY")  # one: the caller came back announcing itself once
    assert "missed 3 heartbeats" in retry["data"]["error"]
    assert dead["llm"] == 0
    assert events[-1]["type"] == "DONE", events[-1]["data"]
    # The call made again streamed the answer; nothing the stalled one still sent leaked in.
    after = events[events.index(retry):]
    assert "".join(e["data"]["text"] for e in of_type(after, "TOKEN")) == "carried on"
    assert events[-1]["data"]["text"] == "carried on"
    me = actor(host, "llm-1")
    assert me["pid"] == caller and me["restarts"] == 0


def test_a_restart_storm_marks_the_actor_failed_and_the_host_goes_on(short_home):
    # Two executors: one fails, the other is killed once and comes back.
    with running_host(short_home, {"OPLOOP_EXECUTORS": "2"}) as home:
        kills = 0
        while actor(home, "executor-1")["state"] != "failed":
            assert kills < 12, "never marked failed"
            pid = actor(home, "executor-1")["pid"]
            os.kill(pid, signal.SIGKILL)
            kills += 1

            def restarted_or_failed(pid: int = pid) -> bool:
                now = actor(home, "executor-1")
                return now["state"] == "failed" or (
                    now["state"] == "running" and now["pid"] not in (None, pid))
            wait_until(restarted_or_failed, f"executor-1 back after kill {kills}")
        # The others are still looked after: one dies, it is restarted.
        other = actor(home, "executor-2")["pid"]
        os.kill(other, signal.SIGKILL)
        wait_until(lambda: actor(home, "executor-2")["restarts"] == 1
                   and actor(home, "executor-2")["state"] == "running", "executor-2 back")
        as_json = oploop(home, "status", "--json")
        as_text = oploop(home, "status")
        run = oploop(home, "run", "run `echo still serving`")

    assert kills >= 5  # the policy's storm: 5 deaths within 30 s (5 kills, unless slow)
    assert as_json.returncode == 0, as_json.stderr
    status = json.loads(as_json.stdout)
    assert status["state"] == "degraded"
    rows = {a["name"]: a for a in status["actors"]}
    assert rows["executor-1"]["state"] == "failed" and rows["executor-1"]["pid"] is None
    assert rows["executor-1"]["rss_mb"] is None and rows["executor-1"]["cpu_s"] is None
    assert rows["executor-1"]["restarts"] == kills - 1
    assert rows["executor-2"]["state"] == "running" and rows["executor-2"]["restarts"] == 1
    others = [a for name, a in rows.items() if name not in ("host", "executor-1", "executor-2")]
    assert all(a["state"] == "running" and a["restarts"] == 0 for a in others), others
    assert as_text.returncode == 0, as_text.stderr
    assert "degraded" in as_text.stdout.splitlines()[0]
    assert "executor-1 FAILED" in as_text.stdout
    assert run.returncode == 0, run.stderr
    assert "still serving" in run.stdout
