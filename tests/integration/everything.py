"""The reference MCP server `@modelcontextprotocol/server-everything` (npm), installed once
into a cache the tests share (`~/.cache/oploop-tests`, or `$OPLOOP_TEST_CACHE`): resources,
prompts, instructions, elicitation and sampling tools, written by the protocol's authors.
A test that needs it skips, saying why, when it cannot be installed (no npm, no network
and no cached copy)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "@modelcontextprotocol/server-everything"
#: Pinned: its tools' names and texts are what the tests check.
VERSION = "2026.8.31"


def cache_dir() -> Path:
    """Where the tests' downloads are kept between runs."""
    base = os.environ.get("OPLOOP_TEST_CACHE") or os.path.expanduser("~/.cache/oploop-tests")
    return Path(base)


def everything() -> Path:
    """The installed server's program (`node_modules/.bin/mcp-server-everything`); the
    test is skipped if it cannot be installed."""
    prefix = cache_dir() / f"server-everything-{VERSION}"
    program = prefix / "node_modules" / ".bin" / "mcp-server-everything"
    if program.exists():
        return program
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"{PACKAGE} needs npm to install it (apt-get install npm)")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(prefix.parent / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (two test processes: one installs)
        if not program.exists():
            done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix",
                                   str(prefix), f"{PACKAGE}@{VERSION}"],
                                  capture_output=True, text=True, timeout=600)
            if done.returncode != 0 or not program.exists():
                pytest.skip(f"{PACKAGE}@{VERSION} could not be installed with npm: "
                            f"{(done.stderr or done.stdout).strip()[-300:]}")
    return program


@contextlib.contextmanager
def serving(program: Path, port: int) -> Iterator[str]:
    """The server over streamable HTTP on `port` (its own process, stopped after);
    its URL."""
    from hostkit import wait_until

    log = Path(tempfile.mkstemp(prefix="opev-", suffix=".log", dir="/tmp")[1])
    with open(log, "wb") as err:
        proc = subprocess.Popen([str(program), "streamableHttp"],
                                env={**os.environ, "PORT": str(port)},
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        wait_until(lambda: f"listening on port {port}" in log.read_text(errors="replace")
                   or proc.poll() is not None, f"{PACKAGE} on port {port}", 60)
        assert proc.poll() is None, log.read_text(errors="replace")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.unlink(missing_ok=True)
