"""One persistent reader (`readers.py` keeps them): a locked-down launcher serving reads
on a socketpair, or, once its first reply showed the lockdown held, a thread in that
lockdown (`readthreads.py`) while the process is retired."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from dataclasses import dataclass, field

from actors import fileops

from .child import SandboxedChild
from .readthreads import ReaderThread

Key = tuple[object, ...]
"""Everything a reader's lockdown was made of (`ReaderPool`)."""
_RECV = 64 * 1024  # bytes asked of the socket at least (a reply's first chunk: all of it)


def identity(paths: tuple[str, ...]) -> tuple[tuple[int, int] | None, ...]:
    """(device, inode) of each path (None: absent): a reader is made for these exact files."""
    out: list[tuple[int, int] | None] = []
    for path in paths:
        try:
            st = os.stat(path)
        except (OSError, ValueError):
            out.append(None)
        else:
            out.append((st.st_dev, st.st_ino))
    return tuple(out)


@dataclass(eq=False, slots=True)
class Reader:
    """One persistent reader: its launcher (a `SandboxedChild`) and our end of its socket."""

    key: Key
    paths: tuple[str, ...]  # whose identity the key holds (the workspace, the readable paths)
    child: SandboxedChild
    sock: socket.socket
    born: float = field(default_factory=time.monotonic)
    used: float = field(default_factory=time.monotonic)
    calls: int = 0
    #: It died, or sent what nobody asked for: every further call gets b"".
    gone: bool = False
    #: The thread that serves its calls since the process answered its first
    #: (`readthreads.py`); the process is then retired. None: the process serves.
    thread: ReaderThread | None = None
    # The call waiting for a reply, its cap, what of the reply is in, its size (-1: unknown).
    _waiter: asyncio.Future[bytes] | None = None
    _cap: int = 0
    _reply: bytearray = field(default_factory=bytearray)
    _size: int = -1
    _loop: asyncio.AbstractEventLoop | None = None

    @property
    def pid(self) -> int:
        """The reader's pid (as the executor sees it); a reader thread's own id."""
        return self.thread.tid if self.thread is not None else self.child.process.pid

    async def ask(self, request: bytes, cap: int) -> bytes:
        """Send one request; its framed reply (at most `cap` bytes), or b"" if the reader
        is gone (refused before it served, or died). Raises BadReply on nonsense.

        The request is sent at once (a few hundred bytes on an idle socketpair: never
        more than its buffer); the reply is read by `_readable`, called by the loop,
        on which the socket stays registered while the reader lives (asyncio's
        `sock_recv` registered it and took it off again for every call).
        """
        loop = asyncio.get_running_loop()
        self.calls += 1
        if self.gone:
            return b""
        if self.thread is not None:
            return await self.thread.ask(request, cap)
        try:
            sent = self.sock.send(request)
        except BlockingIOError:
            sent = 0
        except (BrokenPipeError, ConnectionResetError):
            return b""
        try:
            if sent < len(request):
                await loop.sock_sendall(self.sock, request[sent:])
        except (BrokenPipeError, ConnectionResetError):
            return b""
        self._watch(loop)
        self._cap = cap
        self._waiter = waiter = loop.create_future()
        try:
            return await waiter
        finally:
            self._waiter = None
            self._reply.clear()
            self._size = -1

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have `loop` call `_readable` whenever the socket is (once per loop)."""
        if self._loop is loop:
            return
        self._unwatch()
        loop.add_reader(self.sock.fileno(), self._readable)
        self._loop = loop

    def close_socket(self) -> None:
        """Close our end (the reader sees EOF), unwatched first: the loop must not watch
        a number that the next socket opened may get."""
        self._unwatch()
        self.sock.close()

    def _unwatch(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self.sock.fileno())
        self._loop = None

    def _readable(self) -> None:
        waiter = self._waiter
        want = fileops.REPLY_LEN_DIGITS + self._size if self._size >= 0 else 0
        try:
            chunk = self.sock.recv(max(want - len(self._reply), _RECV))
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if waiter is None or waiter.done() or not chunk:
            # EOF (it died), or bytes nobody asked for: it serves no more calls.
            self.gone = True
            self._unwatch()
            if waiter is not None and not waiter.done():
                waiter.set_result(b"")
            return
        self._reply += chunk
        try:
            reply = self._complete()
        except fileops.BadReply as exc:
            self.gone = True
            waiter.set_exception(exc)
            return
        if reply is not None:
            waiter.set_result(reply)

    def _complete(self) -> bytes | None:
        """The reply once all of it is in (None: not yet). Raises BadReply on nonsense."""
        digits = fileops.REPLY_LEN_DIGITS
        if self._size < 0:
            if len(self._reply) < digits:
                return None
            head = bytes(self._reply[:digits])
            if not head.isdigit():
                raise fileops.BadReply(f"sandboxed reader: unreadable reply {head!r}")
            size = int(head)
            if size > self._cap:
                raise fileops.BadReply(f"sandboxed reader: a {size}-byte reply "
                                       f"(cap {self._cap})")
            self._size = size
        end = digits + self._size
        if len(self._reply) < end:
            return None
        if len(self._reply) > end:
            raise fileops.BadReply("sandboxed reader: more bytes than its reply")
        return bytes(self._reply[digits:])

    def retire(self) -> int:
        """Kill it now (EOF on its socket, SIGKILL through its pidfd) and let go of its fds;
        its parent, the fork server, reaps it. A pidfd of it (-1: none), to see it gone.
        A reader thread is told to leave (after the read it is on, if any)."""
        self.gone = True
        if self.thread is not None:
            self.thread.stop()
        return self.retire_process()

    def retire_process(self) -> int:
        """`retire` for the process alone (its thread, if any, serves on); -1 if done."""
        if self.sock.fileno() < 0:
            return -1  # retired already (its thread took over)
        proc = self.child.process
        pidfd = -1
        own = getattr(proc, "_pidfd", -1)
        with contextlib.suppress(OSError):
            pidfd = os.dup(own) if own >= 0 else os.pidfd_open(proc.pid)
        self.close_socket()
        self.child.kill()
        close_fds = getattr(proc, "_close_fds", None)
        if close_fds is not None:
            close_fds()
        if self.child.errfd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.child.errfd)
            self.child.errfd = -1
            if self.child.on_close is not None:
                self.child.on_close(self.child)
        return pidfd
