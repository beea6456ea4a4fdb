"""An MCP server over streamable HTTP (issue 18): the tests' own server, written with
the SDK's `MCPServer` (FastMCP's name in mcp 2), run in a process of its own; a host
whose executor reaches it by `url`. Tools listed; a session's call whose image
reaches the history; a cancel reaching the tool; a crash mid-call, then the server
back and found again; a server restarted between calls (our session unknown to it:
404) found again by the next call; a 401 said as such (issue 30)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from homes import make_home
from hostkit import assert_one_run, of_type, oploop, run, running_host, until, wait_until
from mcpkit import PYTHON, TEST_SERVER, call, free_port, history_of, tool_results, wait_tools

from actors.sandbox.workspaces import remove_home
from bus.client import Client

#: The token `/locked/mcp` takes; the host is configured with another.
TOKEN = "right-token"

SCRIPTS = {
    "echo": call("mcp__web__echo", text="over http"),
    "image": call("mcp__web__image"),
    "slow": call("mcp__web__slow", seconds=600),
    "crash": call("mcp__web__crash"),
}


class WebServer:
    """The test server on `port`, (re)started on demand."""

    def __init__(self, port: int, marks: Path) -> None:
        self.port = port
        self.marks = marks
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "OPLOOP_TEST_MARKS": str(self.marks)}
        # (`/locked/mcp` answers 401 to any other token than TOKEN)
        self.proc = subprocess.Popen([PYTHON, TEST_SERVER, "http", str(self.port), TOKEN],
                                     env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self.accepting, f"the MCP test server on port {self.port}")

    def accepting(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, "the test server died"
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def web() -> Iterator[WebServer]:
    marks = Path(tempfile.mkdtemp(prefix="opmw-", dir="/tmp"))
    server = WebServer(free_port(), marks)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(marks, ignore_errors=True)


@pytest.fixture
def host(web: WebServer) -> Iterator[str]:
    home = make_home("opmh-")
    Path(home, "oploop.toml").write_text(
        f'[mcp.web]\nurl = "http://127.0.0.1:{web.port}/mcp"\ntags = ["web"]\ntimeout_s = 30\n'
        '[mcp.web.headers]\nX-Oploop-Test = "yes"\n'
        f'[mcp.locked]\nurl = "http://127.0.0.1:{web.port}/locked/mcp"\n'
        '[mcp.locked.headers]\nAuthorization = "Bearer wrong-token"\n')
    scenario = Path(home, "scenario.json")
    scenario.write_text(json.dumps({"scripts": SCRIPTS}))
    try:
        with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}) as h:
            wait_tools(h, {"mcp__web__echo", "mcp__web__image", "mcp__web__slow"})
            yield h
    finally:
        remove_home(Path(home))


def tool_end(events: list[dict]) -> dict:
    (end,) = of_type(events, "TOOL_END")
    return end["data"]


def test_the_http_servers_tools_are_listed_and_a_call_reaches_the_history(host):
    tools = {t["name"]: t for t in map(json.loads,
                                       oploop(host, "tools", "--json").stdout.splitlines())}
    echo = tools["mcp__web__echo"]
    assert echo["server"] == "web" and echo["state"] == "ready" and echo["tags"] == ["web"]
    assert echo["risky"] is False  # a url server's default
    events = run(host, "#echo")
    end = tool_end(events)
    assert end == {**end, "is_error": False, "output": "echo: over http"}
    (result,) = tool_results(asyncio.run(history_of(host, events[0]["session"])))
    assert result["content"] == "echo: over http"


def test_an_image_reaches_the_history_as_an_image_block(host):
    events = run(host, "#image")
    end = tool_end(events)
    assert not end["is_error"], end["output"]
    (result,) = tool_results(asyncio.run(history_of(host, events[0]["session"])))
    blocks = result["content"]
    assert isinstance(blocks, list) and blocks[0]["type"] == "text"
    (image,) = [b for b in blocks if b["type"] == "image"]
    assert image["source"]["media_type"] == "image/png" and image["source"]["data"]
    assert events[-1]["type"] == "DONE"


async def cancelled_run(home: str, prompt: str, started: Path) -> list[dict]:
    async with Client.connect(Path(home)) as client:
        begun = await client.start(prompt)
        events: list[dict] = []

        async def follow() -> None:
            async for event in client.events(begun.session, begun.from_seq, stop_at="first"):
                events.append(event)

        follower = asyncio.create_task(follow())
        await until(started.exists, "the slow tool to start", 60)
        await client.cancel(begun.session, mode="ui")
        await asyncio.wait_for(follower, 30)
    assert_one_run(events, begun.from_seq)
    return events


def test_a_cancel_mid_call_reaches_the_http_servers_tool(host, web):
    events = asyncio.run(cancelled_run(host, "#slow", web.marks / "slow-started"))
    assert events[-1]["type"] == "CANCELLED"
    (end,) = of_type(events, "TOOL_END")
    assert end["data"]["is_error"]
    wait_until((web.marks / "slow-cancelled").exists, "notifications/cancelled to arrive")
    assert tool_end(run(host, "#echo"))["output"] == "echo: over http"


def test_a_crash_mid_call_fails_naming_the_server_and_it_is_found_again(host, web):
    end = tool_end(run(host, "#crash"))
    assert end["is_error"] and "MCP server web" in end["output"], end["output"]
    assert web.proc is not None
    web.proc.wait(10)
    web.start()  # back on the same port: the next call reconnects (after its backoff)
    again = tool_end(run(host, "#echo"))
    assert again["output"] == "echo: over http", again["output"]


def test_a_server_restarted_between_calls_is_found_again_by_the_next_call(host, web):
    assert tool_end(run(host, "#echo"))["output"] == "echo: over http"
    web.stop()
    web.start()  # a new process: our session id means nothing to it (404)
    again = tool_end(run(host, "#echo"))
    assert again == {**again, "is_error": False, "output": "echo: over http"}, again
    status = {s["name"]: s for s in json.loads(oploop(host, "status", "--json").stdout)["mcp"]}
    assert status["web"]["state"] == "ready", status["web"]


def test_a_401_is_said_with_its_status_and_what_to_do(host):
    status = {s["name"]: s for s in json.loads(oploop(host, "status", "--json").stdout)["mcp"]}
    error = status["locked"]["error"]
    assert "unauthorized: check headers or run `oploop mcp login locked`" in error, error
    assert "HTTP 401 Unauthorized" in error, error
    assert status["locked"]["state"] != "ready"
