"""Running a shell command as one killable process tree, with bounded output.

Spawning is one small replaceable function (`Spawner`) returning a `Child`: the
process plus how to kill its whole tree and wait until that tree is gone. Its
stdout and stderr are two pipes, read as they come: each chunk goes to the
command's result (one `CappedOutput`, in the order the chunks arrive) and, for a
viewer, to `on_output` (live tool output).
`spawn_local` kills a process group; the sandbox (actors.sandbox) swaps in a
launcher whose tree lives in its own cgroup and pid namespace, and keeps the
waiting, capping and killing here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .piped import DEVNULL, PIPE, PipedProcess
from .runtoend import run_to_end


class ToolRefused(Exception):
    """A tool call was refused before it ran (e.g. a sandbox layer its policy needs)."""


class ChildProcess(Protocol):
    """What `run_command` uses of a process: a `PipedProcess` (`piped.py`), or a
    launcher forked by the sandbox's fork server."""

    @property
    def pid(self) -> int:
        """The process id."""

    @property
    def stdout(self) -> asyncio.StreamReader | None:
        """Its stdout (and its stderr too when the `Child` has no `stderr` apart)."""

    @property
    def returncode(self) -> int | None:
        """The exit status once known; negative: killed by that signal."""

    async def wait(self) -> int:
        """Wait for the exit; the returncode."""


class Child(Protocol):
    """A started command: its process (stdout piped), and how to end its whole tree."""

    @property
    def process(self) -> ChildProcess:
        """The process whose exit ends the command."""

    @property
    def stderr(self) -> asyncio.StreamReader | None:
        """The command's stderr, read apart from its stdout (None: it goes with stdout)."""

    def kill(self) -> None:
        """SIGKILL the command and everything it started; synchronous, safe to repeat."""

    async def aclose(self) -> str:
        """After the process exited: wait until the tree is gone, release what it held.

        Returns why the command never ran ("" when it did), e.g. a sandbox
        layer that a policy requires and that could not be applied. Safe to
        call again when a cancellation cut it short (`release` does).
        """


Spawner = Callable[[str, Path], Awaitable[Child]]
"""Starts `command` in `cwd`: stdout on the process's stdout pipe, stderr on the
child's `stderr` pipe (or with stdout)."""

OnOutput = Callable[[str, bytes], None]
"""Told each chunk a running command prints, as it comes: ("stdout" | "stderr", bytes)."""


@dataclass(slots=True)
class GroupChild:
    """An unsandboxed command that leads its own process group (`spawn_local`)."""

    process: PipedProcess

    @property
    def stderr(self) -> asyncio.StreamReader | None:
        """The shell's stderr pipe."""
        return self.process.stderr

    def kill(self) -> None:
        """SIGKILL the group (a member that called setsid escapes it: use the sandbox)."""
        # The leader may already be reaped: the kernel keeps its pgid reserved while
        # any member lives; with none left the id is free, and only a pid
        # wrap-around within these microseconds could hand it to a stranger.
        kill_group(self.process.pid)

    async def aclose(self) -> str:
        """Nothing to wait for beyond the group kill."""
        return ""

# After the shell exits and its group is killed, the pipe should hit EOF at once;
# only a process that left the group (setsid) can hold it open. Don't wait on that.
_DRAIN_S = 2.0
_READ_CHUNK = 64 * 1024


async def spawn_local(command: str, cwd: Path) -> GroupChild:
    """Start `/bin/sh -c command` in `cwd`, unsandboxed: stdin /dev/null, stdout and
    stderr on two pipes.

    Not with asyncio's subprocess transport, which can hang when cancelled
    (`piped.py`). A cancellation while the pipes are connected kills the whole
    group: the shell runs from the fork on, and may have started children already.
    """
    process = PipedProcess.start(
        ["/bin/sh", "-c", command],
        cwd=cwd,
        stdin=DEVNULL,
        stdout=PIPE,
        stderr=PIPE,
        # A new session makes the shell a process-group leader, so one killpg also
        # reaches its `cmd &` children. (No preexec_fn: it is unsafe with threads.)
        start_new_session=True,
    )
    await process.connect()
    return GroupChild(process)


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
    `refused` says why the command never ran (a sandbox layer missing), else "".
    """

    output: str
    returncode: int | None
    timed_out: bool
    refused: str = ""


async def run_command(
    command: str,
    cwd: Path,
    *,
    timeout_s: float,
    cap: int,
    spawn: Spawner = spawn_local,
    on_output: OnOutput | None = None,
) -> CommandResult:
    """Run `command` to completion or `timeout_s`, then kill whatever it left behind.

    The tree is SIGKILLed in every case — normal exit (background children would
    outlive the call and hold the pipe open), timeout, and cancellation — and
    waited for until it is gone; after a cancellation CancelledError propagates.
    `on_output` is told every chunk of stdout and stderr as it is read (the result
    has them too, in the order they arrived: two pipes, so writes close together on
    both may come out of the order they were made in).
    """
    child = await spawn(command, cwd)
    proc = child.process
    assert proc.stdout is not None, "spawner must give the process a stdout pipe"
    out = CappedOutput(cap)
    streams = [("stdout", proc.stdout)]
    if child.stderr is not None:
        streams.append(("stderr", child.stderr))
    # Owned here: awaited in _drain, or cancelled in the finally below.
    readers = [asyncio.create_task(_pump(stream, name, out, on_output))
               for name, stream in streams]
    complete = False
    try:
        try:
            timed_out = await _wait_exit(proc, timeout_s)
        finally:
            # Synchronous, so it happens at once even while this task is being cancelled.
            child.kill()
        complete = await _drain(readers)
    finally:
        if not complete:
            for reader in readers:
                reader.cancel()
        # Cancelled or not, here or while draining, even cancelled again meanwhile:
        # wait (bounded) until the tree is gone and release its cgroup, so "the call
        # returned" means "nothing of it runs or remains".
        refused = await release(child)
    output = out.text()
    if not complete:
        output += "\n[stopped reading: a detached process holds the output open]"
    return CommandResult(output, proc.returncode, timed_out, refused)


async def release(child: Child) -> str:
    """After `child.kill()`: wait until its tree is gone and release what it held (the
    sandbox's call cgroup); why it never ran ("" if it did).

    A cancellation meanwhile does not cut this short: the release is finished,
    then the cancellation goes on. The usual call costs nothing for it: only a
    cancelled one redoes the release (each step may be repeated) in a task of
    its own.
    """
    try:
        return await _reap(child)
    except asyncio.CancelledError:
        await run_to_end(_reap(child))
        raise


async def _reap(child: Child) -> str:
    proc = child.process
    # Close our end of the output pipes first: the reader has all it will get, and a
    # detached process that holds theirs open must not keep ours.
    _close_stdout(proc)
    await proc.wait()
    return await child.aclose()


def _close_stdout(proc: ChildProcess) -> None:
    """Close our end of the output pipes, where the process has them (`close_stdout`)."""
    close = getattr(proc, "close_stdout", None)
    if close is not None:
        close()


async def _pump(stream: asyncio.StreamReader, name: str, out: CappedOutput,
                on_output: OnOutput | None) -> None:
    # Keep reading past the cap: a child blocked on a full pipe would never exit.
    while chunk := await stream.read(_READ_CHUNK):
        out.feed(chunk)
        if on_output is not None:
            on_output(name, chunk)


async def _wait_exit(proc: ChildProcess, timeout_s: float) -> bool:
    """Wait for the shell itself to exit; True if `timeout_s` ran out first.

    Watches a pidfd rather than `proc.wait()`: a `Spawner` may return an asyncio
    subprocess (this module's own and the sandbox's do not), whose wait on CPython <
    3.13 also waits for the output pipe to close, and a background child holding it
    would make a finished command look like a hung one.
    """
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return False  # already exited and reaped: a fast command, not a hung one
    except (OSError, AttributeError):
        pidfd = -1
    try:
        async with asyncio.timeout(timeout_s):
            if pidfd < 0:
                await proc.wait()
            else:
                loop = asyncio.get_running_loop()
                exited: asyncio.Future[None] = loop.create_future()

                def on_exit() -> None:
                    if not exited.done():
                        exited.set_result(None)

                loop.add_reader(pidfd, on_exit)
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


async def _drain(readers: list[asyncio.Task[None]]) -> bool:
    """Let the readers reach EOF; False if one had to be stopped (the caller cancels it)."""
    done, pending = await asyncio.wait(readers, timeout=_DRAIN_S)
    for reader in done:
        reader.result()  # a reader's failure is the command's
    return not pending
