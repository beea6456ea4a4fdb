"""Helpers of the MCP tests: scenario turns that call a tool, a host's tool list."""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostkit import until
from ports import free_port

from bus.client import Client

#: The MCP server the tests wrote themselves (the SDK's MCPServer), run as
#: `python mcp_testserver.py stdio|http PORT`.
TEST_SERVER = str(Path(__file__).with_name("mcp_testserver.py"))
PYTHON = sys.executable
DONE = {"reply": "done", "stop_reason": "end_turn"}


def call(name: str, **tool_input: Any) -> list[dict[str, Any]]:
    """A scenario script: one turn calling `name` with `tool_input`, then a final answer."""
    return [{"reply": [{"type": "tool_use", "name": name, "input": tool_input}]}, DONE]


async def tools_of(home: str) -> dict[str, dict[str, Any]]:
    """The host's tools by name, as `oploop tools --json` lists them."""
    async with Client.connect(Path(home)) as client:
        return {t["name"]: t for t in await client.tools("")}


def wait_tools(home: str, names: set[str], timeout: float = 180.0) -> dict[str, dict[str, Any]]:
    """Wait until the host offers every tool of `names` (the executors list their MCP
    servers' tools after they start); the tools then. (The bound is generous: a server
    of thousands of tools, started beside other tests on busy cores, takes a while.)"""
    found: dict[str, dict[str, Any]] = {}

    async def listed() -> None:
        async def have() -> bool:
            found.update(await tools_of(home))
            return names <= found.keys()

        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while not await have():
            assert loop.time() < end, f"tools never listed: {sorted(names - found.keys())}"
            await asyncio.sleep(0.1)

    asyncio.run(listed())
    return found


async def history_of(home: str, session: str) -> list[dict[str, Any]]:
    """A session's stored history."""
    async with Client.connect(Path(home)) as client:
        return list((await client.inspect(session)).history)


def tool_results(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every tool_result block of a history."""
    return [b for m in history if isinstance(m.get("content"), list)
            for b in m["content"] if b.get("type") == "tool_result"]


#: Where npm packages the tests install are kept between runs (world-readable: the
#: sandboxed servers run as a uid of their own).
NPM_CACHE = Path(os.environ.get("OPLOOP_TEST_NPM_CACHE", "/tmp/oploop-test-cache/npm"))


def npm_package(spec: str, version: str = "") -> Path:
    """A folder whose `node_modules` holds the npm package `spec` (a name; `version`:
    that one, else the latest: `npm install` once, then kept); the test is skipped,
    saying why, when npm or its registry is not there."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed (apt-get install nodejs npm)")
    folder = NPM_CACHE / (spec.replace("/", "+").replace("@", "")
                          + (f"-{version}" if version else ""))
    manifest = folder / "node_modules" / spec
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (one install at a time, whoever runs tests)
        if not (manifest / "package.json").exists():
            done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix",
                                   str(folder), f"{spec}@{version}" if version else spec],
                                  capture_output=True, text=True,
                                  timeout=600, check=False)
            if done.returncode != 0:
                pytest.skip(f"npm install {spec} failed (no registry?): "
                            f"{done.stderr.strip()[-300:]}")
    for path in (NPM_CACHE.parent, NPM_CACHE, folder):
        path.chmod(0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
    return folder


#: Where the PyPI servers the tests install get a virtualenv each (kept between runs).
VENV_CACHE = NPM_CACHE.parent / "venvs"


def venv_server(package: str, *pins: str, setup: str = "") -> Path:
    """The program `package` installs, in a virtualenv of its own with `pins` (e.g.
    "mcp<2": its pins apart, as docs/mcp.md says to install a Python server), then
    `setup` (Python run by the virtualenv's interpreter: what the package would fetch
    at its first use, which the sandbox cannot): once, then kept; the test is skipped,
    saying why, when PyPI (or what `setup` fetches) is not there."""
    folder = VENV_CACHE / package
    program = folder / "bin" / package
    done_mark = folder / ".installed"
    VENV_CACHE.mkdir(parents=True, exist_ok=True)
    with open(VENV_CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (one install at a time, whoever runs tests)
        if not done_mark.exists():
            shutil.rmtree(folder, ignore_errors=True)
            python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
            for argv in ([python, "-m", "venv", str(folder)],
                         [str(folder / "bin" / "pip"), "install", "-q", package, *pins],
                         [str(folder / "bin" / "python"), "-c", setup or "pass"]):
                made = subprocess.run(argv, capture_output=True, text=True, timeout=600,
                                      check=False)
                if made.returncode != 0:
                    pytest.skip(f"{' '.join(argv[:3])} ... failed (no PyPI?): "
                                f"{made.stderr.strip()[-300:]}")
            done_mark.touch()
    for path in (VENV_CACHE.parent, VENV_CACHE):
        path.chmod(0o755)
    subprocess.run(["chmod", "-R", "a+rX", str(folder)], check=True)
    return program


__all__ = ["DONE", "NPM_CACHE", "PYTHON", "TEST_SERVER", "VENV_CACHE", "call", "free_port",
           "history_of", "npm_package", "tool_results", "tools_of", "until", "venv_server",
           "wait_tools"]
