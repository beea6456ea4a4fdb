"""MCP tool servers: what a call through oploop costs, and how fast a cancel lands.

- **Per-call overhead** (goal: <= 2 ms p50 above the direct call): a real host with
  the offline model and `[mcp.time]` (`mcp-server-time`, stdio, inside the
  sandbox, warm: one call made first). Each run makes one call of
  `get_current_time`, timed twice: in the executor (`TOOL_END`'s `duration_ms`:
  the call over the sandboxed server's socket, what MCP adds) and end to end
  (`TOOL_END.ts - TOOL_START.ts`, both stamped by the supervisor: also the job's
  hop to the executor and back, which every tool call pays). Beside them, the
  same call made directly with the SDK's `ClientSession` over its own
  `stdio_client` in this process (the server unsandboxed, no hop).
- **Cancel → CANCELLED** (goal: p99 <= 50 ms): a run calls the tests' MCP server's
  `slow` tool (tests/integration/mcp_testserver.py, stdio, sandboxed); once the
  tool has started (it writes a mark file), `Client.cancel` is called and the
  time until the client receives `CANCELLED` is measured.
- **HTTP server restart -> next call succeeds**: the tests' server over streamable HTTP
  (`[mcp.web]`), stopped and started again between two calls; the next call finds our
  session unknown (404), initializes a new one and is made again, and must succeed. Two
  figures: that call's `TOOL_START` -> `TOOL_END` (the supervisor's stamps), and the
  wall time from the restarted server accepting connections to the client receiving
  that `TOOL_END` (also the run's start and its first model turn).

    python -m bench.mcp [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from actors.sandbox.workspaces import remove_home
from bus.client import Client
from bus.vocab import CancelMode

TEST_SERVER = Path(__file__).resolve().parent.parent / "tests" / "integration" / "mcp_testserver.py"
DONE = {"reply": "done", "stop_reason": "end_turn"}


def _call(name: str, **tool_input: Any) -> list[dict[str, Any]]:
    return [{"reply": [{"type": "tool_use", "name": name, "input": tool_input}]}, DONE]


SCENARIO = {"scripts": {"time": _call("mcp__time__get_current_time", timezone="UTC"),
                        "slow": _call("mcp__slow__slow", seconds=600),
                        "web": _call("mcp__web__echo", text="again")}}


def _config(marks: Path, port: int) -> str:
    return f"""
[mcp.web]
url = "http://127.0.0.1:{port}/mcp"

[mcp.time]
command = ["mcp-server-time", "--local-timezone", "UTC"]

[mcp.slow]
command = [{json.dumps(sys.executable)}, {json.dumps(str(TEST_SERVER))}, "stdio"]
env = {{ OPLOOP_TEST_MARKS = "{marks}" }}
[mcp.slow.sandbox]
read_paths = ["{TEST_SERVER.parent}"]
write_paths = ["{marks}"]
"""


def _cli(home: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    full.update(env, OPLOOP_HOME=home)
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], env=full,
                          capture_output=True, text=True, timeout=120, check=False)


async def _wait_tools(client: Client, names: set[str]) -> None:
    end = time.monotonic() + 60
    while not names <= {t["name"] for t in await client.tools("")}:
        if time.monotonic() > end:
            raise RuntimeError(f"the MCP tools {sorted(names)} were never listed")
        await asyncio.sleep(0.1)


async def _call_ms(client: Client, prompt: str = "#time") -> tuple[float, float]:
    """One run calling get_current_time (or the tool of `prompt`'s script): (in the
    executor, TOOL_START -> TOOL_END), ms."""
    inside, total, _ = await _call_timed(client, prompt)
    return inside, total


async def _call_timed(client: Client, prompt: str) -> tuple[float, float, float]:
    """`_call_ms`, and when the client received `TOOL_END` (`time.perf_counter`)."""
    started = await client.start(prompt)
    stamps: dict[str, float] = {}
    inside = received = 0.0
    async for event in client.events(started.session, started.from_seq, stop_at="first"):
        if event["type"] in ("TOOL_START", "TOOL_END"):
            stamps[event["type"]] = event["ts"]
        if event["type"] == "TOOL_END":
            if event["data"]["is_error"]:
                raise RuntimeError(f"the MCP call failed: {event['data']['output']}")
            inside = event["data"]["duration_ms"]
            received = time.perf_counter()
    return inside, (stamps["TOOL_END"] - stamps["TOOL_START"]) * 1000, received


async def _cancel_ms(client: Client, mark: Path) -> float:
    """One run on the slow tool, UI-cancelled once it runs: cancel -> CANCELLED, ms."""
    await asyncio.to_thread(mark.unlink, missing_ok=True)
    started = await client.start("#slow")
    sent = 0.0
    async for event in client.events(started.session, started.from_seq, stop_at="first"):
        if event["type"] == "TOOL_START":
            end = time.monotonic() + 30
            while not await asyncio.to_thread(mark.exists):
                if time.monotonic() > end:
                    raise RuntimeError("the slow tool never started")
                await asyncio.sleep(0.005)
            sent = time.perf_counter()
            await client.cancel(started.session, mode=CancelMode.UI)
        elif event["type"] == "CANCELLED":
            return (time.perf_counter() - sent) * 1000
    raise RuntimeError("the run ended without CANCELLED")


class _WebServer:
    """The tests' server over streamable HTTP on `port`, restarted on demand."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(TEST_SERVER), "http", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > end or self.proc.poll() is not None:
                    raise RuntimeError("the HTTP test server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


async def _restarts_ms(client: Client, web: _WebServer,
                       rounds: int) -> tuple[list[float], list[float]]:
    """Each round: a call, the server restarted, then the next call: its TOOL_START ->
    TOOL_END, and the server listening -> its TOOL_END received (ms)."""
    calls, walls = [], []
    for _ in range(rounds):
        await _call_ms(client, "#web")
        await asyncio.to_thread(web.stop)
        await asyncio.to_thread(web.start)
        listening = time.perf_counter()
        _, total, received = await _call_timed(client, "#web")
        calls.append(total)
        walls.append((received - listening) * 1000)
    return calls, walls


async def _through_oploop(home: str, calls: int, cancels: int, mark: Path, web: _WebServer,
                          rounds: int) -> tuple[list[tuple[float, float]], list[float],
                                                tuple[list[float], list[float]]]:
    async with Client.connect(Path(home)) as client:
        await _wait_tools(client, {"mcp__time__get_current_time", "mcp__slow__slow"})
        for _ in range(5):  # warm: the server started, the sandbox's fork server up
            await _call_ms(client)
        timed = [await _call_ms(client) for _ in range(calls)]
        cancel = [await _cancel_ms(client, mark) for _ in range(cancels)]
        restarts = await _restarts_ms(client, web, rounds)
    return timed, cancel, restarts


async def _direct(calls: int) -> list[float]:
    """The same call with the SDK's own client and stdio transport, in this process."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    program = shutil.which("mcp-server-time")
    if program is None:
        raise RuntimeError("mcp-server-time is not installed (the bench extra has it)")
    params = StdioServerParameters(command=program, args=["--local-timezone", "UTC"])
    out = []
    with open(os.devnull, "w") as quiet:  # noqa: ASYNC230 - /dev/null: nothing blocks
        async with stdio_client(params, errlog=quiet) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            await session.call_tool("get_current_time", {"timezone": "UTC"})  # warm
            for _ in range(calls):
                t0 = time.perf_counter()
                await session.call_tool("get_current_time", {"timezone": "UTC"})
                out.append((time.perf_counter() - t0) * 1000)
    return out


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 3), "p99": round(p99, 3),
            "max": round(ordered[-1], 3), "n": len(ordered)}


def run(quick: bool = False) -> dict[str, Any]:
    """The mcp section (see the module's docstring)."""
    calls, cancels, rounds = (30, 10, 3) if quick else (200, 50, 10)
    home = tempfile.mkdtemp(prefix="opbm-", dir="/tmp")
    marks = Path(tempfile.mkdtemp(prefix="opbmk-", dir="/tmp"))
    marks.chmod(0o777)  # the sandboxed server writes its mark as a uid of its own
    with socket.socket() as probe:  # a free port for the HTTP server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    web = _WebServer(port)
    (Path(home) / "oploop.toml").write_text(_config(marks, port))
    scenario = Path(home) / "scenario.json"
    scenario.write_text(json.dumps(SCENARIO))
    env = {"OPLOOP_OFFLINE_SCENARIO": str(scenario), "OPLOOP_HTTP_LISTEN": "off"}
    result: dict[str, Any] = {"calls": calls, "cancels": cancels,
                              "load_before": os.getloadavg()}
    result["direct_ms"] = _summary(asyncio.run(_direct(calls)))
    web.start()
    try:
        up = _cli(home, "up", "--detach", env=env)
        if up.returncode != 0:
            raise RuntimeError(f"oploop up failed: {up.stderr}")
        timed, cancel, restarts = asyncio.run(_through_oploop(
            home, calls, cancels, marks / "slow-started", web, rounds))
    finally:
        _cli(home, "down", env=env)
        web.stop()
        remove_home(Path(home))
        shutil.rmtree(marks, ignore_errors=True)
    result["executor_ms"] = _summary([inside for inside, _ in timed])
    result["oploop_ms"] = _summary([total for _, total in timed])
    direct = result["direct_ms"]["p50"]
    result["overhead_p50_ms"] = round(result["executor_ms"]["p50"] - direct, 3)
    result["end_to_end_overhead_p50_ms"] = round(result["oploop_ms"]["p50"] - direct, 3)
    result["cancel_ms"] = _summary(cancel)
    result["http_restart_next_call_ms"] = _summary(restarts[0])
    result["http_restart_listening_to_success_ms"] = _summary(restarts[1])
    result["load_after"] = os.getloadavg()
    return result


def table(result: dict[str, Any]) -> str:
    """The section as a text table."""
    rows = [("direct (SDK client, 1 process)", result["direct_ms"]),
            ("oploop, in the executor", result["executor_ms"]),
            ("oploop, TOOL_START→TOOL_END", result["oploop_ms"]),
            ("cancel → CANCELLED (slow tool)", result["cancel_ms"]),
            ("HTTP restart: next call's START→END", result["http_restart_next_call_ms"]),
            ("HTTP restart: listening → TOOL_END", result["http_restart_listening_to_success_ms"])]
    lines = [f"mcp: mcp-server-time get_current_time, warm stdio server; overhead p50 "
             f"{result['overhead_p50_ms']} ms in the executor, "
             f"{result['end_to_end_overhead_p50_ms']} ms end to end (goal <= 2 ms); cancel p99 "
             f"{result['cancel_ms']['p99']} ms (goal <= 50 ms); HTTP server restart -> next "
             f"call succeeds p50 {result['http_restart_next_call_ms']['p50']} ms (its "
             f"TOOL_START->TOOL_END); load "
             f"{' '.join(f'{x:.2f}' for x in result['load_before'])}",
             f"{'measure':<38}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'n':>5}"]
    for name, s in rows:
        lines.append(f"{name:<38}{s['p50']:>9}{s['p99']:>9}{s['max']:>9}{s['n']:>5}")
    return "\n".join(lines)


def main() -> None:
    """`python -m bench.mcp [--quick]`."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(table(run(args.quick)))


if __name__ == "__main__":
    main()
