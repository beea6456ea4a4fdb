"""MCP servers' lifecycle as people meet it (issue 30, items 1, 4, 5): tools offered
from the first turn after `oploop up`, a server that never answers `initialize` said
so (in `up`'s output and `status`), a call past its timeout cancelled without the
server every session shares being killed, its stderr in `oploop logs mcp:NAME`,
clientInfo, task-required tools left out, progress as `TOOL_PROGRESS`, and content
meant for the user only kept from the model. The tests' own server
(`mcp_testserver.py`), in the executor's sandbox."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from importlib.metadata import version
from pathlib import Path

import psutil
import pytest
from homes import make_home
from hostkit import (
    host_pids,
    of_type,
    oploop,
    print_log_tail,
    processes_with,
    run,
    run_events,
    unique_mark,
    until,
)
from mcpkit import DONE, PYTHON, TEST_SERVER, call, history_of, tool_results

from actors.sandbox.workspaces import remove_home

#: In the test server's command line, so that the tests can find its processes.
MARK = unique_mark("oploop-mcp-lifecycle-test-")

#: (the module host waits for its servers at `up`)
pytestmark = pytest.mark.timeout(180)

SCRIPTS = {
    "echo": call("mcp__test__echo", text="first turn"),
    "who": call("mcp__test__who"),
    "progress": call("mcp__test__progress", steps=3),
    "for_user": call("mcp__test__for_user"),
    "chatter": call("mcp__test__chatter", text="hello-logs"),
    "slow": call("mcp__test__slow", seconds=600),
    "outlive": [{"reply": [{"type": "tool_use", "name": "mcp__test__outlive",
                            "input": {"name": "slow-cancelled"}}]}, DONE],
}


def config(marks: Path) -> str:
    tests = str(Path(TEST_SERVER).parent)
    return f"""
[agents.hasty]                    # its tool calls get 2 s
tool_timeout_s = 2

[mcp.test]
command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, "stdio", "{MARK}"]
env = {{ OPLOOP_TEST_MARKS = "{marks}" }}
start_timeout_s = 90              # (importing the SDK on busy cores: a minute)
[mcp.test.sandbox]
read_paths = ["{tests}"]
write_paths = ["{marks}"]

[mcp.silent]                      # reads its stdin, never answers
command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, "stdio", "silent"]
start_timeout_s = 3
[mcp.silent.sandbox]
read_paths = ["{tests}"]
"""


@pytest.fixture(scope="module")
def marks():
    top = Path(tempfile.mkdtemp(prefix="opml-", dir="/tmp"))
    top.chmod(0o755)
    folder = top / "marks"
    folder.mkdir()
    folder.chmod(0o777)  # the server runs as a uid of its own
    yield folder
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def started(marks):
    """A host just up: `up`'s output, and the tools and a first session right after it
    (no wait for the servers: `up` is ready once each listed its tools or failed)."""
    home = make_home("opml-")
    Path(home, "oploop.toml").write_text(config(marks))
    scenario = Path(home, "scenario.json")
    scenario.write_text(json.dumps({"scripts": SCRIPTS}))
    env = {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}
    up = oploop(home, "up", "--detach", env=env, timeout=120)
    try:
        assert up.returncode == 0, up.stderr + up.stdout
        pids = host_pids(home)
        tools = oploop(home, "tools", "--json")
        first = run(home, "#echo")
        yield {"home": home, "up": up, "tools": tools, "first": first}
    except BaseException:
        print_log_tail(home)
        raise
    finally:
        down = oploop(home, "down")
        assert down.returncode == 0, down.stderr
        assert not [p for p in pids if psutil.pid_exists(p)
                    and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        remove_home(Path(home))


@pytest.fixture
def host(started):
    return started["home"]


def tool_end(events: list[dict]) -> dict:
    (end,) = of_type(events, "TOOL_END")
    return end["data"]


def servers(home: str) -> dict[str, dict]:
    status = json.loads(oploop(home, "status", "--json").stdout)
    return {s["name"]: s for s in status["mcp"]}


def test_the_tools_are_offered_from_the_first_turn_after_up(started):
    listed = {t["name"] for t in map(json.loads, started["tools"].stdout.splitlines())}
    assert "mcp__test__echo" in listed, sorted(listed)
    end = tool_end(started["first"])
    assert end == {**end, "is_error": False, "output": "echo: first turn"}, end


def test_a_server_that_never_answers_initialize_is_said_so_at_up_and_in_status(started):
    said = started["up"].stderr
    assert "MCP server silent is not ready" in said, said
    assert "no answer to initialize within 3 s" in said, said
    error = servers(started["home"])["silent"]["error"]
    assert error.startswith("no answer to initialize within 3 s"), error
    assert "exited" not in error.split(";")[0], error
    # its own words, on stderr, are in the log under its name
    logs = oploop(started["home"], "logs", "mcp:silent").stdout
    assert "silent on purpose" in logs, logs


def test_a_servers_stderr_is_in_oploop_logs_under_its_name(host):
    assert not tool_end(run(host, "#chatter"))["is_error"]

    def logged() -> bool:
        return "test server says: hello-logs" in oploop(host, "logs", "mcp:test").stdout

    asyncio.run(until(logged, "the server's stderr in the log", 30))
    assert "mcp:test[" not in oploop(host, "logs", "mcp:silent").stdout


def test_the_client_says_it_is_oploop_and_its_version(host):
    assert tool_end(run(host, "#who"))["output"] == f"oploop {version('oploop')}"


def test_a_tool_that_must_run_as_a_task_is_left_out_saying_why(host):
    listed = oploop(host, "tools", "--json").stdout
    assert "mcp__test__task_only" not in listed
    assert "mcp__test__echo" in listed
    (note,) = [n for n in servers(host)["test"]["left_out"] if n.startswith("task_only")]
    assert "taskSupport" in note and "required" in note, note


def test_progress_notifications_are_tool_progress_events_that_run_and_watch_show(host):
    events = run(host, "#progress")
    (start,) = of_type(events, "TOOL_START")
    progress = [e["data"] for e in of_type(events, "TOOL_PROGRESS")]
    call_id = start["data"]["tool_use_id"]
    assert progress == [{"call_id": call_id, "progress": float(n), "total": 3.0,
                         "message": f"step {n}"} for n in (1, 2, 3)], progress
    assert tool_end(events)["output"] == "done after 3 steps"
    watched = oploop(host, "watch", events[0]["session"], "--no-follow")
    assert "mcp__test__progress 1/3 step 1" in watched.stdout, watched.stdout


def test_content_for_the_user_only_is_shown_to_viewers_and_kept_from_the_model(host):
    events = run(host, "#for_user")
    end = tool_end(events)
    assert end["output"] == "for the model too", end
    assert end["for_user"] == "secret for the user only", end
    (result,) = tool_results(asyncio.run(history_of(host, events[0]["session"])))
    assert "secret" not in json.dumps(result), result
    watched = oploop(host, "watch", events[0]["session"], "--no-follow")
    assert "secret for the user only" in watched.stdout, watched.stdout


def live(mark: str) -> set[int]:
    pids = set()
    for pid in processes_with(mark):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                pids.add(pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def test_a_timeout_cancels_the_call_not_the_server_other_sessions_calls_go_on(host, marks):
    for name in ("outlive-started", "slow-cancelled"):
        (marks / name).unlink(missing_ok=True)
    assert not tool_end(run(host, "#echo"))["is_error"]
    before = live(MARK)
    assert before

    async def both() -> tuple[list[dict], list[dict]]:
        # another session's call, in flight until the timed-out call's cancel reached
        # the server (which a killed server never sees)
        other = asyncio.create_task(run_events(host, "#outlive"))
        await until((marks / "outlive-started").exists, "the other call to start", 60)
        hasty = await run_events(host, "#slow", agent="hasty")
        return hasty, await asyncio.wait_for(other, 60)

    hasty, other = asyncio.run(both())
    timed_out = tool_end(hasty)
    assert timed_out["is_error"], timed_out
    assert "MCP server test: no answer within 2 s: the call was cancelled" \
        in timed_out["output"], timed_out["output"]
    assert tool_end(other) == {**tool_end(other), "is_error": False,
                               "output": "outlived slow-cancelled"}, tool_end(other)
    assert live(MARK) == before  # the same server, not killed and started again
    assert servers(host)["test"]["state"] == "ready"


def test_watch_shows_a_tool_progress_line_in_json_too(host):
    events = run(host, "#progress")
    watched = oploop(host, "watch", events[0]["session"], "--no-follow", "--json")
    kinds = [json.loads(line)["type"] for line in watched.stdout.splitlines()]
    assert kinds.count("TOOL_PROGRESS") == 3, kinds


def test_oploop_logs_mcp_name_shows_nothing_of_other_actors(host):
    lines = oploop(host, "logs", "mcp:test").stdout.splitlines()
    assert lines and all(" mcp:test[" in line for line in lines), lines[:5]


def test_a_server_has_no_cpu_seconds_limit_that_would_end_it_after_a_minute_of_work(host):
    """A tool call's RLIMIT_CPU counts a process's whole life: a server living for
    hours would be killed after its 60th CPU second. Its cgroup caps its rate instead."""
    run(host, "#echo")
    pids = [p for p in processes_with(MARK) if psutil.Process(p).username() != "root"]
    assert pids, "the test server's processes"
    for pid in pids:
        limits = Path(f"/proc/{pid}/limits").read_text()
        (line,) = [x for x in limits.splitlines() if x.startswith("Max cpu time")]
        assert line.split()[3:5] == ["unlimited", "unlimited"], line
