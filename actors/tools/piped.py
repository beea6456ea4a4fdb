"""`PipedProcess`: a child process whose output pipes the event loop reads, started
without asyncio's subprocess transport.

CPython 3.11's transport can hang for good when a start is cancelled in the same
sweep as the transport's own task that connects the pipes (asyncio.run ending with
an exception, an actor's stop: every task cancelled at once): its clean-up then
waits for pipes that will never be connected, so neither the start nor the loop's
end ever returns. Here the fork is `subprocess.Popen`, synchronous (the process
exists when it returns; no preexec_fn, so vfork); each pipe is connected with
`loop.connect_read_pipe` in the caller's own task; and the exit is watched through
a pidfd, reaping exactly this pid (asyncio's child watcher knows nothing of it).
Nothing waits on a task a cancellation may have ended.

Two steps, so a caller can note the pid before the first await (the sandbox does,
so its orphan sweep never takes a launcher of its own for an orphan):
`PipedProcess.start(...)`, then `await process.connect()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from .runtoend import run_to_end

log = logging.getLogger("oploop.tools")

PIPE = subprocess.PIPE
STDOUT = subprocess.STDOUT
DEVNULL = subprocess.DEVNULL

#: Without pidfds (Linux before 5.3) the exit is polled this often.
_POLL_S = 0.05
#: The status reported when another reaped the process first (asyncio's choice too).
_UNKNOWN_STATUS = 255


class PipedProcess:
    """A started process, with what `run_command` uses of it (`ChildProcess`): `pid`,
    `stdout` (and `stderr`) as streams once connected, `returncode`, `wait()`; and
    `kill()`, `close_stdout()`.

    It is reaped as soon as it exits, whether or not anyone waits (as asyncio's
    own processes are): a pid of ours is never left a zombie.
    """

    def __init__(self, popen: subprocess.Popen[bytes], *, leads_group: bool) -> None:
        self.pid = popen.pid
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None
        self.returncode: int | None = None
        self._popen = popen
        self._leads_group = leads_group
        self._pipes: list[asyncio.BaseTransport] = []
        #: The output pipes not handed to a transport yet: ours alone to close.
        self._unread = [f for f in (popen.stdout, popen.stderr) if f is not None]
        self._loop = asyncio.get_running_loop()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._watch_fd = _pidfd(self.pid)
        self._poll: asyncio.TimerHandle | None = None
        if self._watch_fd >= 0:
            self._loop.add_reader(self._watch_fd, self._reap)
        else:
            self._poll = self._loop.call_later(_POLL_S, self._reap)

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        cwd: str | Path,
        stdin: int,
        stdout: int,
        stderr: int,
        pass_fds: Sequence[int] = (),
        env: dict[str, str] | None = None,
        start_new_session: bool = False,
    ) -> PipedProcess:
        """Start `argv` now (on the loop's thread: a vfork and an exec, under a
        millisecond); raises OSError as `subprocess.Popen` does (e.g. no `cwd`),
        leaking nothing.

        `stdin`: DEVNULL or an fd (nothing here writes to a pipe). `stdout`, `stderr`:
        PIPE (read once `connect`ed), DEVNULL or an fd; `stderr` also STDOUT.
        `start_new_session`: the process leads a session and a group of its own, and
        an abandoned start kills that whole group.
        """
        if stdin == PIPE:
            raise ValueError("stdin cannot be a pipe: nothing would write to it")
        popen = subprocess.Popen(
            argv, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr, pass_fds=pass_fds,
            env=env, start_new_session=start_new_session, bufsize=0,
        )
        try:
            return cls(popen, leads_group=start_new_session)
        except BaseException:
            _abandon_popen(popen)
            raise

    async def connect(self) -> None:
        """Read the output pipes as `stdout` and `stderr` (those started as PIPE).

        Cancelled or failed meanwhile, the process runs and only this call knows
        of it: it is killed (with its group, if it leads one: what it started
        meanwhile must not outlive it), its pipes closed, and waited for until
        reaped, to the end even if cancelled again; then the error goes on.
        """
        try:
            self.stdout = await self._read(self._popen.stdout)
            self.stderr = await self._read(self._popen.stderr)
        except BaseException:
            self._abandon()
            await run_to_end(self.wait())
            raise

    def kill(self) -> None:
        """SIGKILL the process (through its pidfd: never a stranger with a reused pid);
        safe to repeat, and once it is reaped a no-op."""
        if self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, OSError):
            if self._watch_fd >= 0:
                signal.pidfd_send_signal(self._watch_fd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)  # not reaped yet: still ours

    def close_stdout(self) -> None:
        """Close our end of the output pipes (a detached process may hold theirs)."""
        for pipe in self._pipes:
            pipe.close()
        for file in self._unread:
            file.close()
        self._unread.clear()

    async def wait(self) -> int:
        """Wait until the process exited and is reaped; its returncode (negative: the
        signal that ended it). Cancelling a wait does not stop the watch."""
        return await asyncio.shield(self._exited)

    async def _read(self, pipe: IO[bytes] | None) -> asyncio.StreamReader | None:
        if pipe is None:
            return None
        # Handed over as a bare fd, not as Popen's file object (`PipeEnd` says why).
        fd = os.dup(pipe.fileno())  # (failing, the pipe is still `_unread`)
        self._unread.remove(pipe)
        pipe.close()
        reader, transport = await read_pipe(fd)
        self._pipes.append(transport)
        return reader

    def _abandon(self) -> None:
        if self._leads_group and self.returncode is None:
            # Not reaped yet, so its group id is still its own: no stranger is hit.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)
        self.kill()
        self.close_stdout()

    def _reap(self) -> None:
        """The pidfd is readable (or the poll is due): reap this process if it exited."""
        self._poll = None
        try:
            code = self._waited()
        except ChildProcessError:
            # (The sandbox's orphan sweep may have: a retired reader's launcher is no longer
            # counted as one once killed.)
            log.info("process %d was reaped by another: exit status unknown", self.pid)
            code = _UNKNOWN_STATUS
        if code is None:  # not yet (only a poll comes early)
            if self._watch_fd < 0:
                self._poll = self._loop.call_later(_POLL_S, self._reap)
            return
        self._exited_with(code)

    def _waited(self) -> int | None:
        """Reap the process if it exited: its returncode; None if it runs still.

        Through the pidfd where there is one: by pid, a process reaped by another
        (the orphan sweep) and its pid given to a new child of ours would be that
        child, whose exit would be taken for this one's (and its pidfd, readable for
        good, would wake the loop at every turn meanwhile).
        """
        if self._watch_fd < 0:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            return None if pid == 0 else os.waitstatus_to_exitcode(status)
        info = os.waitid(os.P_PIDFD, self._watch_fd, os.WEXITED | os.WNOHANG)
        if info is None:
            return None
        killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
        return -info.si_status if killed else info.si_status

    def _exited_with(self, code: int) -> None:
        self.returncode = code
        # Popen must know too: one it thinks running is polled (waitpid) at its
        # collection or at a later Popen's, and the pid may be another child's by then.
        self._popen.returncode = code
        if self._watch_fd >= 0:
            self._loop.remove_reader(self._watch_fd)
            os.close(self._watch_fd)
            self._watch_fd = -1
        if not self._exited.done():
            self._exited.set_result(code)


class PipeEnd:
    """A pipe's read end as a read transport takes it (`loop.connect_read_pipe`):
    `fileno()`, and `close()`, which closes the fd once, unless `disown`ed. Not a file
    object, which has a finalizer: run later, it would close whatever file got the
    number meanwhile (another call's pipe, a socket)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        """The fd (-1 once closed or disowned)."""
        return self._fd

    def close(self) -> None:
        """Close the fd, the first time only."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def disown(self) -> None:
        """Someone else closes the fd: `close()` leaves it."""
        self._fd = -1


async def read_pipe(fd: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    """A stream reading the pipe `fd`, taken over at once: the transport closes it, also
    when connecting fails or is cancelled (the caller must not close it then: the
    number may be another file's by that time)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    end = PipeEnd(fd)
    transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), end)
    if _closes_fds_itself(loop):
        # uvloop's transport (libuv) closes the fd, then calls `end.close()` expecting
        # EBADF: closing the number again there closed whatever another thread of the
        # process (a reader thread, libzmq's, a pool's) had just been given under it.
        end.disown()
    return reader, transport


def _closes_fds_itself(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop`'s pipe transports close the fd themselves (uvloop's, through
    libuv), not through the pipe object (asyncio's)."""
    return type(loop).__module__.partition(".")[0] == "uvloop"


def _pidfd(pid: int) -> int:
    """A pidfd of our unreaped child `pid`; -1 where the kernel has none (polled then)."""
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return -1


def _abandon_popen(popen: subprocess.Popen[bytes]) -> None:
    """Kill and reap a process started a moment ago, and close its pipes (a failure
    before the loop watched it: reaped here, blocking, as it is at most milliseconds)."""
    popen.kill()
    popen.wait()
    for file in (popen.stdout, popen.stderr):
        if file is not None:
            file.close()
