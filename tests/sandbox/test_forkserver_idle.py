"""An idle fork server is stopped, and the next call starts it again.

The fork server (a pre-imported interpreter, ~10 MB) is what an idle host need not
hold (`forkserver.IDLE_S`). It must never be stopped under a live launcher (a
persistent reader, a running tool: their parent-death signal watches it).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from sbhelp import BOUND_S, Host
from test_escape_read import tools

from actors.tools import ToolContext, invoke


async def _read(host: Host, path: str) -> tuple[str, bool]:
    ctx: ToolContext[None] = ToolContext(cwd=host.workspace, workspace=host.workspace)
    out = await invoke(tools(host.sandbox), "read_file", {"path": path}, ctx)
    return out.output, out.is_error


async def _until(check, what: str) -> None:  # type: ignore[no-untyped-def]
    """Wait (bounded) for an observable condition."""
    end = time.monotonic() + BOUND_S
    while not check():
        assert time.monotonic() < end, f"not within {BOUND_S} s: {what}"
        await asyncio.sleep(0.02)


def test_an_idle_fork_server_is_stopped_and_started_again_by_the_next_call(host: Host) -> None:
    if host.backend != "launcher":
        pytest.skip("the bubblewrap backend execs its own launcher: no fork server")
    sandbox = host.sandbox
    sandbox.readers.idle_s = 0.1  # the reader goes first; then nothing of the server is alive
    sandbox.readers.sweep_s = 0.05
    sandbox.fork_idle_s = 0.2

    async def scenario() -> None:
        out, is_error = await _read(host, "/etc/passwd")
        assert not is_error and "root:" in out, out
        first = sandbox._fork.running_pid() if sandbox._fork is not None else None
        assert first is not None, "a call runs through the fork server"
        await _until(lambda: sandbox._fork.running_pid() is None, "the idle server stopped")
        assert not sandbox._launchers  # stopped only with nothing of it alive
        out, is_error = await _read(host, "/etc/passwd")
        assert not is_error and "root:" in out, out
        second = sandbox._fork.running_pid()
        assert second is not None and second != first

    asyncio.run(scenario())


def test_a_live_reader_keeps_the_fork_server(host: Host) -> None:
    if host.backend != "launcher":
        pytest.skip("the bubblewrap backend execs its own launcher: no fork server")
    sandbox = host.sandbox
    sandbox.readers.idle_s = sandbox.readers.max_age_s = 3600.0  # the reader stays alive
    sandbox.readers.threads = False  # (a reader thread's process is retired at once)
    sandbox.fork_idle_s = 0.05

    async def scenario() -> None:
        out, is_error = await _read(host, "/etc/passwd")
        assert not is_error, out
        pid = sandbox._fork.running_pid() if sandbox._fork is not None else None
        assert pid is not None and sandbox._launchers  # the reader is a live launcher
        sandbox._retire_fork()  # as its timer would, however long it has been idle
        assert sandbox._fork.running_pid() == pid
        out, is_error = await _read(host, "/etc/hostname")  # the same reader serves it
        assert not is_error, out

    asyncio.run(scenario())


def test_the_loop_serves_other_work_while_the_fork_server_answers(host: Host) -> None:
    """The request to the fork server waits on a thread of its own: a server slow to
    answer (here: stopped) holds up that one launch, not everything on the loop."""
    if host.backend != "launcher":
        pytest.skip("the bubblewrap backend execs its own launcher: no fork server")
    sandbox = host.sandbox

    async def scenario() -> None:
        out, is_error = await _read(host, "/etc/passwd")  # the server is up
        assert not is_error, out
        sandbox.readers.close()  # the next read needs a fork
        pid = sandbox._fork.running_pid() if sandbox._fork is not None else None
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            read = asyncio.create_task(_read(host, "/etc/hostname"))
            ticks = 0
            while ticks < 20:  # the loop turns while the launch waits on the stopped server
                await asyncio.sleep(0.01)
                ticks += 1
            assert not read.done()
        finally:
            os.kill(pid, signal.SIGCONT)
        out, is_error = await read
        assert not is_error, out

    asyncio.run(scenario())
