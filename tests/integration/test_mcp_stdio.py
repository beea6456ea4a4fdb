"""MCP stdio servers end to end (issue 18): real servers nobody here wrote
(`mcp-server-time`, `mcp-server-git` on a temporary repository) and the tests' own
(`mcp_testserver.py`), each inside the executor's sandbox, driven by sessions
whose offline model calls their tools; cancels, crashes, garbage, the sandbox's
walls, a re-listed tool set, and configurations `oploop up` refuses."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
from pathlib import Path

import psutil
import pytest
from homes import make_home
from hostkit import (
    assert_one_run,
    of_type,
    oploop,
    processes_with,
    run,
    running_host,
    unique_mark,
    until,
)
from mcpkit import DONE, PYTHON, TEST_SERVER, call, history_of, tool_results, wait_tools

from actors.sandbox.workspaces import remove_home
from bus.client import Client

#: In the test server's command line, so that the tests can find its processes.
MARK = unique_mark("oploop-mcp-stdio-test-")
HANG_MARK = unique_mark("oploop-mcp-hanging-test-")

#: (seven servers start before `up` is ready: on a busy machine a minute or more)
pytestmark = pytest.mark.timeout(240)

SCRIPTS = {
    "time": call("mcp__time__get_current_time", timezone="UTC"),
    "convert": call("mcp__time__convert_time", source_timezone="UTC", time="12:00",
                    target_timezone="Asia/Tokyo"),
    "git": call("mcp__git__git_status", repo_path="REPO"),
    "echo": call("mcp__test__echo", text="hello"),
    "slow": call("mcp__test__slow", seconds=600),
    "deaf": call("mcp__test__deaf"),
    "meet": [{"reply": [{"type": "tool_use", "name": "mcp__test__meet", "input": {"count": 3}}
                        for _ in range(3)]}, DONE],
    "crash": call("mcp__test__crash"),
    "hang": call("mcp__hang__slow", seconds=600),
    "garbage": call("mcp__test__garbage"),
    "add": call("mcp__test__add_tool"),
    "outside": call("mcp__test__write_to", path="OUTSIDE/file"),
    "inside": call("mcp__test__write_to", path="MARKS/file"),
    "offline": call("mcp__test__connect_to", port=0),
    "online": call("mcp__testnet__connect_to", port=0),
    "proxied-direct": call("mcp__testproxy__connect_to", port=0),
    "proxied-fetch": call("mcp__testproxy__fetch", url="http://127.0.0.1:WEB/hi"),
    "proxied-refused": call("mcp__testproxy__fetch", url="http://example.com/"),
}


def config(repo: Path, marks: Path, web: int = 0) -> str:
    tests = str(Path(TEST_SERVER).parent)
    test_server = f"""
command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, "stdio", "{MARK}"]
env = {{ OPLOOP_TEST_MARKS = "{marks}" }}
timeout_s = 30
start_timeout_s = 90
"""
    return f"""
[agents.guarded]
category_allowlist = ["time"]
[agents.guarded.permissions]
"mcp__time__convert_time" = "deny"

[mcp.time]                        # (start_timeout_s: seven servers import the SDK at
command = ["mcp-server-time", "--local-timezone", "UTC"]  # once: a busy machine's minute)
tags = ["time"]
start_timeout_s = 90

[mcp.git]
command = ["mcp-server-git", "--repository", "{repo}"]
start_timeout_s = 90
# git refuses a repository another uid owns, unless told it is safe
env = {{ GIT_CONFIG_COUNT = "1", GIT_CONFIG_KEY_0 = "safe.directory", GIT_CONFIG_VALUE_0 = "*" }}
[mcp.git.sandbox]
write_paths = ["{repo}"]

[mcp.test]
{test_server}
[mcp.test.sandbox]
read_paths = ["{tests}"]
write_paths = ["{marks}"]

[mcp.hang]
command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, "stdio", "{HANG_MARK}"]
timeout_s = 2
start_timeout_s = 90
[mcp.hang.sandbox]
read_paths = ["{tests}"]

[mcp.broken]                      # exits at once: a crash loop
command = ["/bin/false"]

[mcp.testnet]
command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, "stdio", "oploop-mcp-netted-test"]
start_timeout_s = 90
[mcp.testnet.sandbox]
network = true
read_paths = ["{tests}"]

[mcp.testproxy]                   # a network allowlist: through the host's proxy only
command = [{json.dumps(PYTHON)}, {json.dumps(TEST_SERVER)}, "stdio", "oploop-mcp-proxied-test"]
network = ["127.0.0.1:{web}"]
start_timeout_s = 90
[mcp.testproxy.sandbox]
read_paths = ["{tests}"]
"""


@pytest.fixture(scope="module")
def files():
    """A repository, a marks folder the test server may write, a folder it may not."""
    top = Path(tempfile.mkdtemp(prefix="opmf-", dir="/tmp"))
    top.chmod(0o755)
    repo, marks, outside = top / "repo", top / "marks", top / "outside"
    for folder in (repo, marks, outside):
        folder.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.email=t@example.org", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "notes.txt").write_text("hello\n")
    subprocess.run([*git, "add", "notes.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "first"], check=True)
    # Writable by any uid: only the sandbox may stop the server (the server runs as a
    # uid of its own, not as the repository's owner).
    subprocess.run(["chmod", "-R", "a+rwX", str(repo), str(marks), str(outside)], check=True)
    yield {"repo": repo, "marks": marks, "outside": outside}
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture(scope="module")
def listener():
    """A TCP port on loopback that accepts connections (for the network probes)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


class _Hi(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        self.send_response(200)
        self.send_header("Content-Length", "3")
        self.end_headers()
        self.wfile.write(b"hi\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def web():
    """An HTTP server on loopback: the host an MCP server's allowlist names."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def host(files, listener, web):
    home = make_home("opms-")
    Path(home, "oploop.toml").write_text(config(files["repo"], files["marks"], web))
    scripts = json.loads(json.dumps(SCRIPTS).replace("REPO", str(files["repo"]))
                         .replace("127.0.0.1:WEB", f"127.0.0.1:{web}")
                         .replace("OUTSIDE", str(files["outside"]))
                         .replace("MARKS", str(files["marks"])))
    for name in ("offline", "online", "proxied-direct"):
        scripts[name][0]["reply"][0]["input"]["port"] = listener
    scenario = Path(home, "scenario.json")
    scenario.write_text(json.dumps({"scripts": scripts}))
    try:
        with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}) as h:
            wait_tools(h, {"mcp__time__get_current_time", "mcp__git__git_status",
                           "mcp__test__echo", "mcp__testnet__connect_to", "mcp__hang__slow",
                           "mcp__testproxy__fetch"}, timeout=120)
            yield h
    finally:
        remove_home(Path(home))


def tool_end(events: list[dict]) -> dict:
    (end,) = of_type(events, "TOOL_END")
    return end["data"]


def test_the_servers_tools_are_listed_with_their_server_and_state(host):
    listed = oploop(host, "tools", "--json")
    assert listed.returncode == 0, listed.stderr
    tools = {t["name"]: t for t in map(json.loads, listed.stdout.splitlines())}
    time_tool = tools["mcp__time__get_current_time"]
    assert time_tool["server"] == "time" and time_tool["state"] == "ready"
    assert time_tool["tags"] == ["time"] and time_tool["risky"] is True
    assert "timezone" in time_tool["input_schema"]["properties"]
    assert time_tool["description"]
    assert tools["mcp__git__git_log"]["server"] == "git"
    plain = oploop(host, "tools")
    assert "(MCP time: ready)" in plain.stdout
    status = oploop(host, "status", "--json")
    servers = {s["name"]: s for s in json.loads(status.stdout)["mcp"]}
    assert servers["time"]["transport"] == "stdio" and servers["time"]["tools"] == 2


def test_allowlists_and_permission_rules_apply_to_mcp_tools(host):
    listed = oploop(host, "tools", "--agent", "guarded", "--json")
    tools = {t["name"]: t for t in map(json.loads, listed.stdout.splitlines())}
    assert tools["mcp__time__get_current_time"]["turn1"]  # tagged "time"
    assert not tools["mcp__test__echo"]["turn1"] and tools["mcp__test__echo"]["later"]
    assert tools["mcp__time__convert_time"]["rule"] == "deny"
    denied = tool_end(run(host, "#convert", agent="guarded"))
    assert denied["is_error"] and "denied" in denied["output"], denied["output"]
    # not tagged "time": not offered on turn 1, and refused if called there anyway
    hidden = tool_end(run(host, "#git status", agent="guarded"))
    assert hidden["is_error"] and "not available" in hidden["output"], hidden["output"]
    allowed = tool_end(run(host, "#convert"))  # the default agent has no such rule
    assert not allowed["is_error"] and "Asia/Tokyo" in allowed["output"], allowed["output"]


def test_a_session_calls_mcp_server_time_and_the_result_reaches_the_history(host):
    events = run(host, "#time what time is it?")
    end = tool_end(events)
    assert not end["is_error"], end["output"]
    assert json.loads(end["output"])["timezone"] == "UTC"
    (result,) = tool_results(asyncio.run(history_of(host, events[0]["session"])))
    assert result["content"] == end["output"] and result["is_error"] is False


def test_mcp_server_git_reads_a_temporary_repository(host):
    end = tool_end(run(host, "#git status please"))
    assert not end["is_error"], end["output"]
    assert "working tree clean" in end["output"]


def test_a_re_listed_tool_set_reaches_the_catalogue(host):
    end = tool_end(run(host, "#add a tool"))
    assert not end["is_error"], end["output"]
    tools = wait_tools(host, {"mcp__test__extra"})
    assert tools["mcp__test__extra"]["server"] == "test"


def test_parallel_calls_to_one_server_run_concurrently(host):
    # three calls of one turn that each return only when all three are in the server
    ends = of_type(run(host, "#meet three times"), "TOOL_END")
    assert [e["data"]["output"] for e in ends] == ["met 3"] * 3, ends


def test_the_sandbox_keeps_a_stdio_server_to_its_paths_and_off_the_network(host, files):
    outside = tool_end(run(host, "#outside write"))
    assert outside["output"].startswith("refused"), outside["output"]
    assert not (files["outside"] / "file").exists()
    inside = tool_end(run(host, "#inside write"))
    assert inside["output"].startswith("wrote"), inside["output"]
    assert (files["marks"] / "file").exists()
    offline = tool_end(run(host, "#offline connect"))
    assert offline["output"].startswith("refused"), offline["output"]
    online = tool_end(run(host, "#online connect"))  # `network = true` lets it through
    assert online["output"] == "connected", online["output"]


def test_a_stdio_server_with_an_allowlist_goes_through_the_proxy(host, web):
    direct = tool_end(run(host, "#proxied-direct connect"))
    assert direct["output"].startswith("refused"), direct["output"]
    fetched = tool_end(run(host, "#proxied-fetch go"))
    assert fetched["output"] == "status 200: hi\n", fetched["output"]
    refused = tool_end(run(host, "#proxied-refused go"))
    assert refused["output"] == (
        "status 403: oploop: host example.com (port 80) is not in MCP server testproxy's "
        f'network allowlist (mcp.testproxy.network = ["127.0.0.1:{web}"] in oploop.toml)'
    ), refused["output"]


async def cancelled_run(home: str, prompt: str, started: Path) -> list[dict]:
    """Start `prompt`, UI-cancel it once the tool has `started` (a mark file the server
    writes, which the caller removed first), and return its events to the terminal one."""
    async with Client.connect(Path(home)) as client:
        begun = await client.start(prompt)
        events: list[dict] = []

        async def follow() -> None:
            async for event in client.events(begun.session, begun.from_seq, stop_at="first"):
                events.append(event)

        follower = asyncio.create_task(follow())
        await until(started.exists, f"the tool to write {started.name}", 60)
        await client.cancel(begun.session, mode="ui")
        await asyncio.wait_for(follower, 30)
    assert_one_run(events, begun.from_seq)
    return events


def live(mark: str) -> set[int]:
    """The pids of the live (not zombie) processes whose command line holds `mark`."""
    pids = set()
    for pid in processes_with(mark):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                pids.add(pid)
        except psutil.NoSuchProcess:
            pass
    return pids


def server_pids() -> set[int]:
    return live(MARK)


def test_a_cancel_reaches_a_slow_tool_and_the_server_serves_on(host, files):
    (files["marks"] / "slow-started").unlink(missing_ok=True)
    events = asyncio.run(cancelled_run(host, "#slow", files["marks"] / "slow-started"))
    assert events[-1]["type"] == "CANCELLED"
    # notifications/cancelled reached the server: its tool saw the cancel
    asyncio.run(until((files["marks"] / "slow-cancelled").exists, "slow-cancelled", 30))
    end = tool_end(run(host, "#echo"))
    assert end["output"].startswith("echo: hello"), end["output"]


def test_a_cancel_kills_a_server_that_does_not_answer_and_it_restarts_on_next_use(host, files):
    tool_end(run(host, "#echo"))  # the server is up
    before = server_pids()
    assert before
    (files["marks"] / "deaf-started").unlink(missing_ok=True)
    events = asyncio.run(cancelled_run(host, "#deaf", files["marks"] / "deaf-started"))
    assert events[-1]["type"] == "CANCELLED"
    # it answered no ping after the cancel: its whole tree is killed
    asyncio.run(until(lambda: not (server_pids() & before), "the deaf server's end", 30))
    end = tool_end(run(host, "#echo"))
    assert end["output"].startswith("echo: hello"), end["output"]
    assert server_pids() - before


def test_a_crash_mid_call_fails_the_call_naming_the_server_and_its_last_words(host):
    end = tool_end(run(host, "#crash"))
    assert end["is_error"]
    assert "MCP server test" in end["output"], end["output"]
    assert "exited" in end["output"] and "crashing on purpose" in end["output"], end["output"]
    again = tool_end(run(host, "#echo"))  # restarted (after its backoff) on next use
    assert again["output"].startswith("echo: hello"), again["output"]
    status = {s["name"]: s for s in json.loads(oploop(host, "status", "--json").stdout)["mcp"]}
    assert status["test"]["restarts"] >= 1 and status["time"]["state"] == "ready"


def test_a_call_past_timeout_s_fails_and_the_server_that_answers_a_ping_is_kept(host):
    pids = live(HANG_MARK)
    assert pids  # started at the executor's start, to list its tools
    end = tool_end(run(host, "#hang"))
    assert end["is_error"], end["output"]
    assert "MCP server hang: no answer within 2 s: the call was cancelled" in end["output"], \
        end["output"]
    # cancelled (notifications/cancelled), then a ping it answers: not killed
    again = tool_end(run(host, "#hang"))
    assert "no answer within 2 s" in again["output"], again["output"]
    assert live(HANG_MARK) == pids


def test_a_server_in_a_crash_loop_is_marked_failed_and_the_others_go_on(host):
    def broken() -> dict:
        status = json.loads(oploop(host, "status", "--json").stdout)
        return {s["name"]: s for s in status["mcp"]}["broken"]

    asyncio.run(until(lambda: broken()["state"] == "failed", "the crash loop", 60))
    assert "exited" in broken()["error"] and broken()["restarts"] >= 5
    assert "broken" in oploop(host, "status").stdout.split("MCP servers:")[1]
    assert tool_end(run(host, "#echo"))["output"].startswith("echo: hello")


def test_garbage_on_stdout_fails_the_call_and_the_server_restarts(host):
    end = tool_end(run(host, "#garbage"))
    assert end["is_error"] and "garbage on stdout" in end["output"], end["output"]
    again = tool_end(run(host, "#echo"))
    assert again["output"].startswith("echo: hello"), again["output"]


@pytest.mark.parametrize(("table", "named"), [
    ('[mcp.x]\ncommand = []\n', "mcp.x.command"),
    ('[mcp.x]\ncommand = ["no-such-mcp-server-here"]\n', "mcp.x.command[0]"),
    ('[mcp.x]\nurl = "ftp://example.org"\n', "mcp.x.url"),
    ('[mcp.x]\ncommand = ["mcp-server-time"]\nurl = "http://127.0.0.1:1/mcp"\n', "mcp.x"),
    ('[mcp.x]\ncommand = ["mcp-server-time"]\n[mcp.x.sandbox]\nnetwork = "yes"\n',
     "mcp.x.sandbox.network"),
    ('[mcp.x]\ncommand = ["mcp-server-time"]\ntimeout = 5\n', "mcp.x.timeout"),
    ('[mcp.x_y]\ncommand = ["mcp-server-time"]\n', "mcp.x_y"),
])
def test_oploop_up_refuses_a_bad_mcp_table_naming_the_key(table, named):
    home = make_home("opmb-")
    try:
        Path(home, "oploop.toml").write_text(table)
        up = oploop(home, "up", "--detach")
        assert up.returncode != 0
        assert f"{named}:" in up.stderr, up.stderr
        assert not Path(home, "run", "host.json").exists() or not os.listdir(Path(home, "run"))
    finally:
        remove_home(Path(home))
