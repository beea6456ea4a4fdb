"""A tool call in flight survives a supervisor restart (kill -9, the host restarts it):
the executor still running it reports it, and the resumed run adopts it: one
`TOOL_START`, one `TOOL_END` with the tool's real output, never a second run. Also a
call that ended while no supervisor was there (its result kept by the executor and
delivered at the reconnect), a cancel of an adopted call, and the honest
"interrupted" when the executor died too."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
import pytest
from hostkit import (
    actor,
    actors,
    assert_one_run,
    of_type,
    processes_with,
    scripted_host,
    unique_mark,
    until,
    workspace,
)

from bus.client import Client

MARK = unique_mark()
OK = {"reply": "carried on", "stop_reason": "end_turn"}
#: Waits for a file `go` in its directory (the test makes it), then prints.
WAIT = f"touch started; while [ ! -e go ]; do sleep 0.05; done; echo finished {MARK}"
SCRIPTS = {
    "wait": [{"reply": [{"type": "tool_use", "name": "shell", "input": {"command": WAIT}}]},
             OK],
}

Step = Callable[[Client, str, Path, dict[str, Any]], Awaitable[None]]


@pytest.fixture
def host(short_home, tmp_path):
    with scripted_host(short_home, SCRIPTS, tmp_path) as running:
        yield running


def marked() -> list[int]:
    return processes_with(MARK)


def executor_of_the_tool(home: str) -> int:
    """The pid of the executor whose sandbox runs the marked tool."""
    pids = {a["pid"] for a in actors(home)}
    return next(p.pid for p in psutil.Process(marked()[0]).parents() if p.pid in pids)


async def run_across_a_restart(home: str, cwd: Path, at_start: Step,
                               at_resume: Step | None = None
                               ) -> tuple[list[dict[str, Any]], Any]:
    """Run the waiting tool; once it runs, `at_start` (which kills the supervisor);
    at `RESUMED`, `at_resume` (each given the tool's directory). The run's events (one
    viewer throughout) and its session."""
    async with Client.connect(Path(home)) as client:
        started = await client.start("#wait go", cwd=str(cwd))
        work = workspace(home, started.session)  # (where the tool works)
        events: list[dict[str, Any]] = []
        async for event in client.events(started.session, started.from_seq, stop_at="first"):
            events.append(event)
            if event["type"] == "TOOL_START":
                await until(lambda: (work / "started").exists() and marked(), what="the tool")
                await at_start(client, started.session, work, event)
            elif event["type"] == "RESUMED" and at_resume is not None:
                await at_resume(client, started.session, work, event)
        await until(lambda: actor(home, "supervisor")["state"] == "running",
                    what="the supervisor back")
        return events, await client.inspect(started.session)


def kill_supervisor(home: str) -> Step:
    async def step(client: Client, session: str, cwd: Path, event: dict[str, Any]) -> None:
        os.kill(actor(home, "supervisor")["pid"], signal.SIGKILL)
    return step


async def go(client: Client, session: str, cwd: Path, event: dict[str, Any]) -> None:
    (cwd / "go").touch()


def the_tool_ended(events: list[dict[str, Any]], info: Any) -> str:
    """The one call's output, checked: started once, ended once, its result in the
    history as the model saw it."""
    assert_one_run(events)
    assert len(of_type(events, "TOOL_START")) == 1
    (end,) = of_type(events, "TOOL_END")
    result = info.history[2]["content"][0]
    assert result["content"] == end["data"]["output"]
    assert events[-1]["type"] == "DONE" and events[-1]["data"]["text"] == "carried on"
    return end["data"]["output"]


def test_a_tool_running_across_a_supervisor_restart_gives_its_real_result(host, tmp_path):
    events, info = asyncio.run(run_across_a_restart(host, tmp_path, kill_supervisor(host), go))
    assert of_type(events, "RESUMED")
    output = the_tool_ended(events, info)
    assert output.strip() == f"finished {MARK}", output
    (end,) = of_type(events, "TOOL_END")
    assert not end["data"]["is_error"]
    assert actor(host, "supervisor")["restarts"] == 1


def test_a_tool_that_ended_while_no_supervisor_was_there_gives_its_result(host, tmp_path):
    """The supervisor stopped (SIGSTOP) before the tool ends, so the result goes into a
    socket nobody reads; then killed: the executor kept the result and gives it to the
    next supervisor when it announces itself again."""

    async def at_start(client: Client, session: str, cwd: Path, event: dict[str, Any]) -> None:
        pid = actor(host, "supervisor")["pid"]
        os.kill(pid, signal.SIGSTOP)
        (cwd / "go").touch()
        await until(lambda: not marked(), what="the tool to end")
        os.kill(pid, signal.SIGKILL)

    events, info = asyncio.run(run_across_a_restart(host, tmp_path, at_start))
    output = the_tool_ended(events, info)
    assert output.strip() == f"finished {MARK}", output


def test_a_tool_whose_executor_died_too_is_interrupted_never_run_again(host, tmp_path):
    async def at_start(client: Client, session: str, cwd: Path, event: dict[str, Any]) -> None:
        # Both die together: the supervisor stopped first, so that it cannot see the
        # executor go and answer the call "executor unreachable" itself before its
        # own end (it did, once, on a busy machine, between the two kills).
        supervisor = actor(host, "supervisor")["pid"]
        os.kill(supervisor, signal.SIGSTOP)
        os.kill(executor_of_the_tool(host), signal.SIGKILL)
        os.kill(supervisor, signal.SIGKILL)

    events, info = asyncio.run(run_across_a_restart(host, tmp_path, at_start))
    output = the_tool_ended(events, info)
    assert output.startswith("interrupted: the supervisor restarted"), output
    asyncio.run(until(lambda: not marked(), what="the tool's tree to die with its executor"))


def test_an_adopted_tool_is_cancelled_like_any(host, tmp_path):
    """A UI cancel of a run whose call was adopted: `CANCELLED` at once, the call's end
    says so, and the executor kills the tool's processes."""

    async def at_resume(client: Client, session: str, cwd: Path, event: dict[str, Any]) -> None:
        async def adopted() -> bool:  # the restarted supervisor counts the job again
            return (await client.stats())["jobs_inflight"] >= 1

        await until(adopted, what="the job adopted")
        await client.cancel(session)

    events, _ = asyncio.run(run_across_a_restart(host, tmp_path, kill_supervisor(host),
                                                 at_resume))
    assert_one_run(events)
    (end,) = of_type(events, "TOOL_END")
    assert end["data"]["output"] == "cancelled by the user"
    assert events[-1]["type"] == "CANCELLED"
    asyncio.run(until(lambda: not marked(), what="the adopted tool killed"))
