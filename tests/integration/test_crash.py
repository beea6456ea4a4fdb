"""kill -9 at awkward moments: the supervisor (journal and resume), an llm caller
mid-stream, an executor mid-tool, the host itself. (The supervisor mid-tool:
test_adopt.py.)"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from pathlib import Path

import psutil
import pytest
from hostkit import (
    WAIT_S,
    actor,
    actors,
    assert_one_run,
    of_type,
    oploop,
    processes_of_home,
    processes_with,
    run,
    running_host,
    scripted_host,
    unique_mark,
    until,
    wait_until,
    workspace,
)

from bus.client import Client

WORDS = " ".join(f"w{i}" for i in range(300))
OK = {"reply": "carried on", "stop_reason": "end_turn"}
MARK = unique_mark()
SCRIPTS = {
    "tool": [{"reply": [{"type": "tool_use", "name": "shell",
                         "input": {"command": f"touch started; exec sleep {MARK}0"}}]}, OK],
    "stream": [{"reply": WORDS, "delay_s": 0.02}, OK],
}


@pytest.fixture
def host(short_home, tmp_path):
    with scripted_host(short_home, SCRIPTS, tmp_path) as running:
        yield running


def marked() -> list[int]:
    return processes_with(MARK)


async def run_killing(home, prompt, cwd, name, when):
    """Run `prompt`, SIGKILL actor `name` at the first event `when` accepts, and
    collect the run's events (one viewer attached throughout)."""
    async with Client.connect(Path(home)) as client:
        started = await client.start(prompt, cwd=str(cwd))
        events, killed = [], None
        async for event in client.events(started.session, started.from_seq, stop_at="first"):
            events.append(event)
            if killed is None and await when(event):
                if name == "executor":  # whichever executor runs the tool
                    pids = {a["pid"]: a["name"] for a in actors(home)}
                    owner = next(p for p in psutil.Process(marked()[0]).parents()
                                 if p.pid in pids)
                    killed, name = owner.pid, pids[owner.pid]
                else:
                    killed = actor(home, name)["pid"]
                os.kill(killed, signal.SIGKILL)
        await until(lambda: actor(home, name)["pid"] not in (None, killed)
                    and actor(home, name)["state"] == "running", what=f"{name} restarted")
        info = await client.inspect(started.session)
        return events, info


def tool_started(home):
    async def when(event):
        if event["type"] != "TOOL_START":
            return False
        work = workspace(home, event["session"])
        await until(lambda: (work / "started").exists() and marked(), what="the tool")
        return True
    return when


async def first_token(event):
    return event["type"] == "TOKEN"


# A supervisor killed mid-tool: the call is adopted (its real result), or "interrupted"
# when its executor died too: tests/integration/test_adopt.py.


def test_supervisor_killed_mid_stream_calls_the_model_again(host, tmp_path):
    events, info = asyncio.run(run_killing(host, "#stream talk", tmp_path, "supervisor",
                                           first_token))
    assert_one_run(events)
    (resumed,) = of_type(events, "RESUMED")
    assert events[-1]["type"] == "DONE" and events[-1]["data"]["text"] == "carried on"
    assert [m["role"] for m in info.history] == ["user", "assistant"]


def test_llm_caller_killed_mid_stream_is_retried_elsewhere(host, tmp_path):
    events, _ = asyncio.run(run_killing(host, "#stream talk", tmp_path, "llm-1", first_token))
    assert_one_run(events)
    assert any("llm caller" in r["data"]["error"] for r in of_type(events, "RETRY"))
    assert events[-1]["type"] == "DONE"


def test_executor_killed_mid_tool_is_an_error_result_never_a_rerun(host, tmp_path):
    events, info = asyncio.run(run_killing(host, "#tool go", tmp_path, "executor",
                                           tool_started(host)))
    assert_one_run(events)
    (end,) = of_type(events, "TOOL_END")
    assert end["data"]["is_error"] and "executor" in end["data"]["output"]
    assert len(of_type(events, "TOOL_START")) == 1
    assert events[-1]["type"] == "DONE"
    asyncio.run(until(lambda: not marked(), what="the tool's tree to die with its executor"))


def test_host_killed_takes_every_actor_with_it(short_home):
    up = oploop(short_home, "up", "--detach")
    assert up.returncode == 0, up.stderr
    state = json.loads((Path(short_home) / "run" / "host.json").read_text())
    procs = [psutil.Process(a["pid"]) for a in state["actors"]]
    os.kill(state["pid"], signal.SIGKILL)
    try:
        # (each stops as for `oploop down`: with every core busy, seconds)
        gone, alive = psutil.wait_procs(procs, timeout=WAIT_S)
        # An exited actor nobody has reaped yet (a zombie, re-parented) is gone all the same.
        alive = [p for p in alive if _running(p)]
        assert not alive, [p.pid for p in alive]
    finally:  # a failure leaves no host behind for the tests after it
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    again = oploop(short_home, "up", "--detach")  # stale sockets and state cleaned
    assert again.returncode == 0, again.stderr
    assert oploop(short_home, "down").returncode == 0
    shutil.rmtree(short_home, ignore_errors=True)


def test_offline_model_killed_mid_stream_comes_back_on_its_port(host, tmp_path):
    """The llm callers' base URL is fixed when they start: a restarted offline model
    must serve the port the dead one had, and the stream it dropped is retried."""
    port = (Path(host) / "run" / "offline.port").read_text()
    events, _ = asyncio.run(run_killing(host, "#stream talk", tmp_path, "offline-model",
                                        first_token))
    assert_one_run(events)
    assert of_type(events, "RETRY") and events[-1]["type"] == "DONE"
    assert (Path(host) / "run" / "offline.port").read_text() == port
    after = run(host, "run `echo back`", cwd=str(tmp_path))
    assert after[-1]["type"] == "DONE" and "back" in of_type(after, "TOOL_END")[0]["data"]["output"]
    assert actor(host, "offline-model")["restarts"] == 1


def test_start_lost_with_the_supervisor_is_sent_again_and_runs_once(host, tmp_path):
    """A supervisor killed with a `StartRun` unread loses it: the client sends it again
    (the same key), the restarted supervisor starts it, once."""

    async def main():
        async with Client.connect(Path(host)) as client:
            assert await client.sessions() == []  # the api connection is up
            pid = actor(host, "supervisor")["pid"]
            os.kill(pid, signal.SIGSTOP)
            start = asyncio.create_task(client.start("run `echo once`", cwd=str(tmp_path)))
            # The client's I/O thread writes the request into the stopped supervisor's
            # socket at once, to die with it; the assertions hold however long this is.
            await asyncio.sleep(0.2)
            os.kill(pid, signal.SIGKILL)
            started = await start
            events = [e async for e in client.events(started.session, started.from_seq,
                                                     stop_at="first")]
            return started, events, await client.sessions()

    started, events, sessions = asyncio.run(main())
    assert_one_run(events, started.from_seq)
    assert events[-1]["type"] == "DONE"
    assert [s["session"] for s in sessions] == [started.session]


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGKILL, the supervisor last", "oploop down"])
def test_host_stopped_mid_tool_then_up_again_resumes_the_session(short_home, tmp_path, stop):
    """The call in flight ends "interrupted" by the next host's resume, never by the
    stopping supervisor: not even one that takes its death signal last (held stopped
    while its executor, dying with the host, kills the tool and goes)."""
    scenario = tmp_path / "scenario.json"
    once = {"reply": [{"type": "tool_use", "name": "shell",
                       "input": {"command": f"echo ran >> started; exec sleep {MARK}0"}}]}
    scenario.write_text(json.dumps({"scripts": {"tool": [once, OK]}}))
    env = {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}
    up = oploop(short_home, "up", "--detach", env=env)
    assert up.returncode == 0, up.stderr
    state = json.loads((Path(short_home) / "run" / "host.json").read_text())
    procs = [psutil.Process(a["pid"]) for a in state["actors"]]
    assert {state["pid"], *(p.pid for p in procs)} <= set(processes_of_home(short_home))

    async def start_and_kill_the_host():
        async with Client.connect(Path(short_home)) as client:
            started = await client.start("#tool go", cwd=str(tmp_path))
            when = tool_started(short_home)
            async for event in client.events(started.session, started.from_seq):
                if await when(event):
                    break
            if stop == "SIGKILL":
                os.kill(state["pid"], signal.SIGKILL)
            elif stop == "SIGKILL, the supervisor last":
                supervisor = psutil.Process(actor(short_home, "supervisor")["pid"])
                supervisor.suspend()  # (SIGSTOP: its death signal waits until SIGCONT)
                try:
                    os.kill(state["pid"], signal.SIGKILL)
                    others = [p for p in procs if p.pid != supervisor.pid]
                    _, alive = psutil.wait_procs(others, timeout=WAIT_S)
                    assert not alive, [p.pid for p in alive]
                finally:
                    supervisor.resume()
            else:  # a deliberate stop journals the run too, and says it will resume
                down = oploop(short_home, "down")
                assert down.returncode == 0, down.stderr
                assert "1 running session(s) will resume" in down.stdout
                assert started.session in down.stdout
            return started.session

    sid = asyncio.run(start_and_kill_the_host())
    _, alive = psutil.wait_procs(procs, timeout=WAIT_S)
    assert not alive, [p.pid for p in alive]
    # Every process of the old host, not only those listed at `up` (an actor it
    # restarted since): none may still speak to the next host's supervisor.
    wait_until(lambda: not processes_of_home(short_home), what="the old host's processes")
    asyncio.run(until(lambda: not marked(), what="the tool to die with its executor"))
    # The next host's model is a new process: it plays on from the turn after the tool.
    scenario.write_text(json.dumps({"scripts": {"tool": [OK]}}))

    async def watch_it_end():
        async with Client.connect(Path(short_home)) as client:
            events = [e async for e in client.events(sid, 1, stop_at="first")]
            return events, await client.inspect(sid)

    with running_host(short_home, env):
        events, info = asyncio.run(watch_it_end())
    assert_one_run(events)
    assert [e["type"] for e in events].count("RESUMED") == 1
    assert events[-1]["type"] == "DONE" and events[-1]["data"]["text"] == "carried on"
    (start,) = of_type(events, "TOOL_START")
    (end,) = of_type(events, "TOOL_END")  # the viewer sees the tool end, interrupted
    assert end["data"]["tool_use_id"] == start["data"]["tool_use_id"]
    assert end["data"]["is_error"] and end["data"]["output"].startswith("interrupted")
    result = info.history[2]["content"][0]
    assert result["is_error"] and result["content"].startswith("interrupted")
    assert info.summary["state"] == "idle" and info.summary["runs"] == 1
    assert (workspace(short_home, sid) / "started").read_text() == "ran\n"  # run once, ever


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
