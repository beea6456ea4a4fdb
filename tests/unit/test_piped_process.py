"""Processes started with pipes (`actors.tools.piped`): a start cancelled at any point,
or ended with the whole event loop, kills and reaps what it started and leaks no fd.

CPython 3.11's subprocess transport hung for good when every task was cancelled at
once (asyncio.run ending with an exception, an actor stopping) while it connected a
new process's pipes; `spawn_local` and the sandbox's exec'd launcher were started with
it. The case that hung is run in a child interpreter with a bound, so that a
regression fails instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import uvloop
from prockit import processes_with, run_bounded, token

from actors.tools.piped import DEVNULL, PIPE, STDOUT, PipedProcess, read_pipe
from actors.tools.process import release, spawn_local

#: Bound on a child interpreter's whole run (start, imports, the scenario): it only
#: catches a hang; with every core busy an interpreter start alone can take seconds.
BOUND_S = 60.0


def open_fds() -> set[int]:
    """This process's open file descriptors."""
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def children() -> list[psutil.Process]:
    """This process's children, zombies included (one not reaped is a leak too)."""
    return psutil.Process().children()


# The run's main coroutine starts a shell call, waits (a loop turn at a time) until the
# shell is forked, then fails: asyncio.run cancels every task left at once, the start's
# own and, with asyncio's transport, the task connecting the new process's pipes.
ENDED_DURING_SPAWN = """
import asyncio, sys
from pathlib import Path
import psutil
from actors.tools.process import run_command

class Ended(Exception):
    pass

async def main(tok, cwd):
    task = asyncio.create_task(
        run_command(f"exec sleep 1000.{tok}", cwd, timeout_s=60, cap=1024))
    while not psutil.Process().children():
        assert not task.done(), task
        await asyncio.sleep(0)
    raise Ended

try:
    asyncio.run(main(sys.argv[1], Path(sys.argv[2])))
except Ended:
    print("ended; children left:", len(psutil.Process().children()))
"""


def test_a_run_ended_while_the_shell_starts_kills_it_and_returns(tmp_path: Path) -> None:
    """The loop's end cancels a `spawn_local` that forked and has not connected its
    pipes: the run ends at once (it hung on 3.11's transport), the shell is reaped."""
    tok = token()
    done = run_bounded(ENDED_DURING_SPAWN, tok, str(tmp_path), tok=tok, bound_s=BOUND_S,
                       hung="asyncio.run hung: a cancelled start never returned")
    assert done.stdout == "ended; children left: 0\n", done.stderr
    assert processes_with(tok) == []


async def start_group(cwd: Path, tok: str) -> object:
    """`spawn_local`'s start: stdout and stderr on two pipes, a group of its own."""
    return await spawn_local(f"exec sleep 1000.{tok}", cwd)


async def start_merged(cwd: Path, tok: str) -> object:
    """The sandbox's exec'd launcher's start: stderr with stdout, an fd passed."""
    passed = os.open("/dev/null", os.O_RDONLY)
    try:
        process = PipedProcess.start(
            ["/bin/sh", "-c", f"exec sleep 1000.{tok}"], cwd=cwd, stdin=DEVNULL,
            stdout=PIPE, stderr=STDOUT, pass_fds=(passed,), env={},
        )
    finally:
        os.close(passed)
    await process.connect()
    return process


async def end(started: object) -> None:
    """Kill and reap a start that was not cancelled."""
    if isinstance(started, PipedProcess):
        started.kill()
        started.close_stdout()
        await started.wait()
    else:
        started.kill()  # type: ignore[attr-defined]
        await release(started)  # type: ignore[arg-type]


# On asyncio's loop (the executor's) and on uvloop (the in-process API may run on a
# user's): the two close a pipe whose connection failed differently.
LOOPS = pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])


@LOOPS
@pytest.mark.parametrize("start", [start_group, start_merged], ids=["group", "merged"])
def test_a_start_cancelled_at_any_loop_turn_leaves_nothing(tmp_path: Path, start, run) -> None:
    """Cancelled after 0, 1, 2... loop turns, before the fork, while each pipe is
    connected, or once started: no process, zombie or fd is left once it returned."""

    async def scenario() -> list[str]:
        # One whole start first: uvloop opens an fd of its own (/dev/null) at its first
        # pipe, once.
        await end(await start(tmp_path, token()))
        fds = open_fds()
        outcomes = []
        for turns in range(12):
            tok = token()
            task = asyncio.create_task(start(tmp_path, tok))
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            try:
                started = await task
            except asyncio.CancelledError:
                outcomes.append("cancelled")
            else:
                outcomes.append("started")
                await end(started)
            left = {"children": children(), "processes": processes_with(tok),
                    "fds": sorted(open_fds() - fds)}
            assert not any(left.values()), f"cancelled after {turns} turns, left {left}"
        return outcomes

    outcomes = run(scenario())
    # Every stage was reached: cancelled before the fork (0 turns) and after it, and
    # at the end a start that had finished.
    assert outcomes.count("cancelled") >= 3 and outcomes[-1] == "started", outcomes


def test_exit_status_and_merged_output(tmp_path: Path) -> None:
    async def scenario() -> tuple[bytes, int | None, int]:
        process = PipedProcess.start(
            ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], cwd=tmp_path,
            stdin=DEVNULL, stdout=PIPE, stderr=STDOUT,
        )
        await process.connect()
        assert process.stdout is not None and process.stderr is None
        output = await process.stdout.read()
        code = await process.wait()
        process.close_stdout()
        return output, process.returncode, code

    assert asyncio.run(scenario()) == (b"out\nerr\n", 3, 3)


@LOOPS
def test_a_killed_process_is_reaped_without_a_wait(tmp_path: Path, run) -> None:
    """Reaped as soon as it exits, whether anyone waits or not: no zombie is left."""

    async def scenario() -> int | None:
        fds = open_fds()
        process = PipedProcess.start(["sleep", "1000"], cwd=tmp_path, stdin=DEVNULL,
                                     stdout=DEVNULL, stderr=DEVNULL)
        await process.connect()
        process.kill()
        # Loop turns until the exit is seen (the kill is asynchronous), bounded.
        deadline = asyncio.get_running_loop().time() + BOUND_S
        while process.returncode is None:
            assert asyncio.get_running_loop().time() < deadline, "never reaped"
            await asyncio.sleep(0)
        assert children() == [] and open_fds() == fds
        process.kill()  # once reaped, a no-op: never a stranger's pid
        return process.returncode

    assert run(scenario()) == -9


@LOOPS
def test_a_process_reaped_by_another_first_ends_with_an_unknown_status(tmp_path: Path,
                                                                      run) -> None:
    """The sandbox's orphan sweep may reap a process of ours first: its exit is then
    told as 255 (the status is gone), at once, and its pidfd no longer watched."""

    async def scenario() -> int:
        fds = open_fds()
        process = PipedProcess.start(["true"], cwd=tmp_path, stdin=DEVNULL,
                                     stdout=DEVNULL, stderr=DEVNULL)
        await process.connect()
        os.waitpid(process.pid, 0)  # noqa: ASYNC222  (the sweep's reap, before the loop saw it)
        code = await asyncio.wait_for(process.wait(), BOUND_S)
        assert children() == [] and open_fds() == fds
        return code

    assert run(scenario()) == 255


def test_a_failed_start_leaks_no_fd(tmp_path: Path) -> None:
    async def scenario() -> None:
        fds = open_fds()
        with pytest.raises(FileNotFoundError):
            PipedProcess.start(["true"], cwd=tmp_path / "gone", stdin=DEVNULL,
                               stdout=PIPE, stderr=PIPE)
        assert open_fds() == fds and children() == []

    asyncio.run(scenario())


@contextlib.contextmanager
def stranger_pipe() -> Iterator[tuple[int, int]]:
    """A new pipe, which takes the lowest free numbers (those just freed): once the
    block is over and garbage collected, still open (nothing closed a stranger's file
    by a number it no longer owned); then closed."""
    stranger = os.pipe()
    try:
        yield stranger
        gc.collect()
        for fd in stranger:
            os.fstat(fd)  # EBADF: something else closed it
    finally:
        for fd in stranger:
            with contextlib.suppress(OSError):
                os.close(fd)


@LOOPS
def test_a_connection_cancelled_leaves_no_file_object_to_close_a_stranger_s_fd(
        tmp_path: Path, run) -> None:
    """Cancelled while its stdout is connected: uvloop closes that pipe's fd itself and
    never tells the file object it was given, which, collected later, would close
    whatever file has that number by then (here a stranger's pipe)."""

    async def scenario() -> None:
        process = PipedProcess.start(["sleep", "1000"], cwd=tmp_path, stdin=DEVNULL,
                                     stdout=PIPE, stderr=PIPE)
        task = asyncio.create_task(process.connect())
        await asyncio.sleep(0)  # (connect now waits for stdout's transport)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert process.returncode == -9 and children() == []
        with stranger_pipe():  # (the numbers the pipes had)
            del process, task
            # Loop turns: the transport lets go of its pipe once its close is done.
            for _ in range(10):
                await asyncio.sleep(0)

    run(scenario())


@LOOPS
def test_a_pipe_read_whose_connection_is_cancelled_closes_it_once(run) -> None:
    """`read_pipe` (the sandbox's stderr, a forked launcher's stdout, an MCP server's
    stderr) takes the fd over at once: cancelled while it connects, the pipe is closed
    by the transport, and nothing later closes a stranger's file with its number."""

    async def scenario() -> None:
        theirs, ours = os.pipe()  # one pipe read first: uvloop's first keeps an fd (libuv's
        os.close(ours)            # reserve for running out of them) for the loop's life
        _, transport = await read_pipe(theirs)
        transport.close()
        await asyncio.sleep(0)
        fds = open_fds()
        theirs, ours = os.pipe()
        task = asyncio.create_task(read_pipe(theirs))
        await asyncio.sleep(0)  # (now waiting for the transport)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        os.close(ours)
        for _ in range(10):  # the transport's close is done within a few loop turns
            await asyncio.sleep(0)
        assert open_fds() == fds  # closed: by the transport, not by us
        with stranger_pipe():  # (the pipe's number among them)
            del task

    run(scenario())


# Three pipes read to their end through `read_pipe`, each transport closed; prints the
# pipes' read fds.
READ_PIPES = """
import asyncio, os, sys
from actors.tools.piped import read_pipe

async def main():
    for _ in range(3):
        theirs, ours = os.pipe()
        print(theirs, flush=True)
        reader, transport = await read_pipe(theirs)
        os.write(ours, b"x")
        os.close(ours)
        assert await reader.read() == b"x"
        transport.close()
        for _ in range(5):  # (the transport's close is done within a few loop turns)
            await asyncio.sleep(0)

if sys.argv[1] == "uvloop":
    import uvloop
    uvloop.run(main())
else:
    asyncio.run(main())
"""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_pipe_read_to_its_end_is_closed_once(tmp_path: Path, loop: str) -> None:
    """uvloop's transport closes the fd itself (libuv), then calls the pipe object's
    `close()` expecting EBADF: `read_pipe`'s pipe end closed the number a second time,
    in the executor whatever file another thread (a reader thread, libzmq's) had just
    been given under it. Seen here as a `close` of the pipe's number failing EBADF,
    under strace (deterministic: the harm itself needs a thread in between)."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (scripts/test installs it)")
    trace = tmp_path / "trace"
    done = subprocess.run(
        [strace, "-f", "-qq", "-e", "trace=close", "-o", str(trace),
         sys.executable, "-c", READ_PIPES, loop],
        capture_output=True, text=True, timeout=BOUND_S)
    assert done.returncode == 0, done.stderr[-2000:]
    fds = {int(fd) for fd in done.stdout.split()}
    closes = [m for m in re.finditer(r"close\((\d+)\)\s+= (.*)", trace.read_text())
              if int(m.group(1)) in fds]
    assert closes, "no close of the pipes traced"
    assert not [m.group(0) for m in closes if "EBADF" in m.group(2)]
