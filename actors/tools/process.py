"""Running a shell command as one killable process group, with bounded output.

Spawning is one small replaceable function (`Spawner`): a sandboxing launcher
swaps `spawn_local` for its own and keeps the waiting, capping and killing here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

Spawner = Callable[[str, Path], Awaitable[asyncio.subprocess.Process]]
"""Starts `command` in `cwd` as the leader of a new process group, output on stdout."""

# After the shell exits and its group is killed, the pipe should hit EOF at once;
# only a process that left the group (setsid) can hold it open. Don't wait on that.
_DRAIN_S = 2.0
_READ_CHUNK = 64 * 1024


async def spawn_local(command: str, cwd: Path) -> asyncio.subprocess.Process:
    """Start `/bin/sh -c command` in `cwd`, unsandboxed: stdin /dev/null, stderr into stdout."""
    return await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        command,
        cwd=cwd,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        # A new session makes the shell a process-group leader, so one killpg also
        # reaches its `cmd &` children. (No preexec_fn: it is unsafe with threads.)
        start_new_session=True,
    )


def kill_group(pgid: int) -> None:
    """SIGKILL every process in group `pgid`; a group already gone is fine."""
    # PermissionError: the group is gone and its id now belongs to someone else.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class CappedOutput:
    """Keeps the first and the last `cap // 2` bytes of a stream and counts the rest.

    Both ends matter for a command: the start says what ran, the end how it failed.
    """

    def __init__(self, cap: int) -> None:
        if cap < 2:
            raise ValueError(f"cap must be at least 2 bytes, got {cap}")
        self._half = cap // 2
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        """Take the next chunk of the stream."""
        self.total += len(chunk)
        room = self._half - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self._tail += chunk
            del self._tail[: -self._half]

    def text(self) -> str:
        """The kept bytes as text (utf-8, errors replaced), with a note where bytes were cut."""
        head = self._head.decode("utf-8", "replace")
        tail = self._tail.decode("utf-8", "replace")
        omitted = self.total - len(self._head) - len(self._tail)
        if omitted == 0:
            return head + tail
        return f"{head}\n[truncated: {omitted} bytes omitted]\n{tail}"


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How a command ended: its (capped) output, exit status, and whether it timed out.

    `returncode` is negative when a signal ended the shell (-9 after a timeout).
    """

    output: str
    returncode: int | None
    timed_out: bool


async def run_command(
    command: str,
    cwd: Path,
    *,
    timeout_s: float,
    cap: int,
    spawn: Spawner = spawn_local,
) -> CommandResult:
    """Run `command` to completion or `timeout_s`, then kill whatever it left behind.

    The process group is SIGKILLed in every case — normal exit (background
    children would outlive the call and hold the pipe open), timeout, and
    cancellation, after which CancelledError propagates.
    """
    proc = await spawn(command, cwd)
    assert proc.stdout is not None, "spawner must give the process a stdout pipe"
    out = CappedOutput(cap)
    # Owned here: awaited in _drain, or cancelled in the finally below.
    reader = asyncio.create_task(_pump(proc.stdout, out))
    finished = False
    try:
        timed_out = await _wait_exit(proc, timeout_s)
        finished = True
    finally:
        # Synchronous, so it happens even while this task is being cancelled.
        # The leader may already be reaped: the kernel keeps its pgid reserved while
        # any member lives; with none left the id is free, and only a pid
        # wrap-around within these microseconds could hand it to a stranger.
        kill_group(proc.pid)
        if not finished:
            reader.cancel()
    complete = await _drain(reader)
    if not complete:
        # asyncio's Process.wait() also waits for the pipes to close; a detached
        # process still holding stdout would keep it waiting, so close our end.
        transport = getattr(proc, "_transport", None)
        pipe = transport.get_pipe_transport(1) if transport is not None else None
        if pipe is not None:
            pipe.close()
    await proc.wait()
    output = out.text()
    if not complete:
        output += "\n[stopped reading: a detached process holds the output open]"
    return CommandResult(output=output, returncode=proc.returncode, timed_out=timed_out)


async def _pump(stream: asyncio.StreamReader, out: CappedOutput) -> None:
    # Keep reading past the cap: a child blocked on a full pipe would never exit.
    while chunk := await stream.read(_READ_CHUNK):
        out.feed(chunk)


async def _wait_exit(proc: asyncio.subprocess.Process, timeout_s: float) -> bool:
    """Wait for the shell itself to exit; True if `timeout_s` ran out first.

    Watches a pidfd rather than `proc.wait()`, which on CPython < 3.13 also waits
    for the output pipe to close: a background child holding it would make a
    finished command look like a hung one.
    """
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (OSError, AttributeError):
        pidfd = -1
    try:
        async with asyncio.timeout(timeout_s):
            if pidfd < 0:
                await proc.wait()
            else:
                exited = asyncio.get_running_loop().create_future()
                loop = asyncio.get_running_loop()
                loop.add_reader(pidfd, lambda: exited.done() or exited.set_result(None))
                try:
                    await exited
                finally:
                    loop.remove_reader(pidfd)
    except TimeoutError:
        return True
    finally:
        if pidfd >= 0:
            os.close(pidfd)
    return False


async def _drain(reader: asyncio.Task[None]) -> bool:
    """Let the reader reach EOF; False if it had to be stopped (it is cancelled then)."""
    try:
        async with asyncio.timeout(_DRAIN_S):
            await reader
    except TimeoutError:
        return False
    return True
