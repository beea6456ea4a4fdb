"""The executor's side of the launcher fork server (`zygote.py`).

`ForkServer.launch` hands the server a spec and three pipes and gets a pid
back (one blocking round trip of ~1 ms: a fork, several on a busy machine; made
on a thread of its own, so the executor's loop serves other calls meanwhile);
`ServedProcess` then looks
like an asyncio subprocess to `run_command`: a stdout stream, `pid`,
`returncode`, `wait()` (the exit status arrives on the status pipe, written by
the server when it reaps the launcher), and a kill through a pidfd, so a pid
reused after the reap can never be hit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from actors.tools.piped import read_pipe
from actors.tools.runtoend import run_to_end

_DIR = str(Path(__file__).resolve().parent)
_SHARED_DIR = str(Path(_DIR).parent)  # actors/: the launcher the zygote imports needs `fileops`
BOOTSTRAP = (
    f"import sys; sys.path[:0] = [{_DIR!r}, {_SHARED_DIR!r}]; import zygote; "
    "zygote.serve(*map(int, sys.argv[1:]))"
)
_REPLY_S = 5.0


class ForkServerGone(Exception):
    """The fork server died or answered nonsense; the caller falls back to exec."""


class ServedProcess:
    """A launcher forked by the server, with the parts of asyncio's Process that we use."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.stdout: asyncio.StreamReader | None = None  # set by connect_stdout
        self.returncode: int | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._status_fd = status_fd
        self._status = b""
        try:
            self._pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._pidfd = -1

    async def connect_stdout(self, fd: int) -> None:
        """Read the launcher's output from the pipe `fd` (taken over: closed even on failure)."""
        self.stdout, self._transport = await read_pipe(fd)

    def close_stdout(self) -> None:
        """Close our end of the output pipe."""
        if self._transport is not None:
            self._transport.close()

    def kill(self) -> None:
        """SIGKILL the launcher (through its pidfd: never a stranger with a reused pid)."""
        if self._pidfd >= 0 and self.returncode is None:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    async def wait(self) -> int:
        """Wait for the exit status from the server; the returncode as asyncio reports it."""
        if self.returncode is not None:
            return self.returncode
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def readable() -> None:
            try:
                chunk = os.read(self._status_fd, 64)
            except BlockingIOError:
                return
            if chunk:
                self._status += chunk
            elif not done.done():
                done.set_result(None)

        os.set_blocking(self._status_fd, False)
        loop.add_reader(self._status_fd, readable)
        try:
            await done
        finally:
            loop.remove_reader(self._status_fd)
        # No status at all: the server died before reaping; report a SIGKILL.
        status = int(self._status) if self._status.strip().isdigit() else 9
        self.returncode = os.waitstatus_to_exitcode(status)
        self._close_fds()
        return self.returncode

    def _close_fds(self) -> None:
        for fd in (self._status_fd, self._pidfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._status_fd = self._pidfd = -1


#: A fork server that has forked nothing for this long, with nothing it forked still
#: alive, is stopped (`stop_if_idle`): it is a pre-imported interpreter (~10 MB) an idle
#: host need not hold. The next call starts it again (one interpreter start, ~30 ms,
#: against the model call of seconds that comes before a tool call).
IDLE_S = 30.0


class ForkServer:
    """One fork server process, started on first use and stopped by `close` (or when
    idle, `stop_if_idle`)."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._used = 0.0  # time.monotonic() of the last fork asked for
        # Requests wait for the server's answer here, one at a time (they would queue on
        # `_lock` anyway), never in the loop's default pool where other calls' work runs.
        self._requests = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="fork-server")

    @property
    def pid(self) -> int:
        """The server's pid (its children's parent)."""
        self._used = time.monotonic()
        self._ensure()
        assert self._proc is not None
        return self._proc.pid

    def running_pid(self) -> int | None:
        """The server's pid if it is running now (without starting it)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _ensure(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        self.close()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", BOOTSTRAP, str(theirs.fileno()),
                 str(os.getpid())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, env={}, cwd="/",
            )
        finally:
            theirs.close()
        ours.settimeout(_REPLY_S)
        self._sock = ours

    async def launch(self, spec_fd: int, *, pid_ns: bool = False,
                     duplex: int = -1, stderr: int = -1) -> tuple[ServedProcess, int]:
        """Fork a launcher for the spec in `spec_fd`; the process and its error-pipe fd.

        `pid_ns`: fork it as pid 1 of a new pid namespace (a file operation: the
        launcher is then its own init, one fork fewer; see `zygote`).
        `duplex`: a socket fd that is both the launcher's stdin and stdout (a
        persistent reader: the caller keeps the other end; no stdout stream here).
        `stderr`: where the launched program's stderr goes (-1: with its stdout).
        """
        if duplex >= 0:
            out_r, out_w = -1, os.dup(duplex)
        else:
            out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        st_r, st_w = os.pipe()
        kind = (b"P" if pid_ns else b"L") + (b"D" if duplex >= 0 else b"")
        fds = [spec_fd, out_w, err_w, st_w]
        if stderr >= 0:
            kind += b"E"
            fds.append(stderr)
        request = asyncio.get_running_loop().run_in_executor(
            self._requests, self._request, fds, kind)
        try:
            # To its end even if cancelled: the server reads the fds until it answers.
            pid = await run_to_end(request)
        except BaseException:
            for fd in (out_w, err_w, st_w):  # (first: the status pipe's EOF needs ours shut)
                os.close(fd)
            if request.done() and not request.cancelled() and request.exception() is None:
                # Cancelled once the fork was made: kill the launcher, wait until reaped.
                forked = ServedProcess(request.result(), st_r)
                st_r = -1  # (closed by its wait)
                forked.kill()
                await run_to_end(forked.wait())
            for fd in (out_r, err_r, st_r):
                if fd >= 0:
                    os.close(fd)
            raise
        for fd in (out_w, err_w, st_w):
            os.close(fd)
        served = ServedProcess(pid, st_r)
        if out_r < 0:
            return served, err_r
        try:
            await served.connect_stdout(out_r)
        except BaseException:
            # Cancelled after the fork: the launcher runs, and only this call knows it.
            # Kill it, and wait (whatever else is cancelled) until the server reaped it.
            os.close(err_r)
            served.kill()
            await run_to_end(served.wait())
            raise
        return served, err_r

    def stop_if_idle(self, idle_s: float = IDLE_S) -> bool:
        """Stop the server if it has forked nothing for `idle_s` (the caller knows that
        nothing it forked is alive: a launcher's parent-death signal watches the
        server). True if it is not running now."""
        with self._lock:
            if self._proc is None:
                return True
            if time.monotonic() - self._used < idle_s:
                return False
            self.close()
            return True

    def _request(self, fds: list[int], kind: bytes) -> int:
        with self._lock:
            self._used = time.monotonic()
            self._ensure()
            assert self._sock is not None
            try:
                socket.send_fds(self._sock, [kind], fds)
                reply = self._sock.recv(64)
            except OSError as exc:
                self.close()
                raise ForkServerGone(f"fork server: {exc}") from exc
        if not reply.isdigit():
            self.close()
            raise ForkServerGone(f"fork server answered {reply[:40]!r}")
        return int(reply)

    def close(self) -> None:
        """Stop the server (EOF on its socket) and reap it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
