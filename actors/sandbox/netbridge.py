"""The launcher's way from a private network namespace to the host's filtering proxy.

A call whose network is an allowlist runs in a network namespace of its own,
as an offline call does, so no packet it makes can leave. The outer launcher
(root, before any lockdown, inside that namespace) brings up its `lo` and
listens on 127.0.0.1:`PORT`; the pid namespace's init (root, our code), once it
has forked the tool, runs a forwarder thread: each connection the tool makes
there is carried, byte for byte, to the proxy's unix socket for this call's
allowlist, which the tool
itself cannot see (the oploop home is hidden) nor open (seccomp: no AF_UNIX).
The proxy decides; this file only carries bytes.

The socket's directory is opened (O_PATH) before the init hides the oploop
home, and the thread connects relative to it (its own cwd: `unshare(CLONE_FS)`),
so a proxy restarted by the host, which binds its socket anew, is reached
again at once. While no proxy listens, every connection is answered with an
HTTP 503 that says so: a request never goes anywhere else.

Only the standard library's cheap parts (see launcher.py): imported by the
launcher only for a call that has a `netbridge` in its spec.
"""

from __future__ import annotations

import _socket
import _thread
import fcntl
import os
import select
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

PORT = 3128
"""Where the forwarder listens inside the call's network namespace (127.0.0.1)."""
MAX_CONNECTIONS = 32
"""Connections one call may hold through the forwarder at once; more are answered 503."""
_STACK = 256 * 1024
_CHUNK = 65536
_CLONE_FS = 0x00000200
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


class Bridge:
    """The forwarder of one call: the listening socket and the proxy socket's directory."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.name: str = conf["name"]
        self.port: int = conf["port"]
        self.missing = ""
        try:
            self.dirfd = os.open(conf["dir"], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:  # no proxy ever started here: every connection gets a 503
            self.dirfd = -1
            self.missing = f"{conf['dir']}: {exc.strerror}"
        _loopback_up()
        self.listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        self.listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.listener.listen(MAX_CONNECTIONS)

    def close(self) -> None:
        """Close this process's copies (the outer launcher's, once the init has them)."""
        self.listener.close()
        if self.dirfd >= 0:
            os.close(self.dirfd)

    def serve(self) -> None:
        """Start the forwarder thread (in the init, once the tool is forked)."""
        _thread.stack_size(_STACK)
        _thread.start_new_thread(self._run, ())

    def _run(self) -> None:
        import ctypes  # (already loaded by the lockdown)

        libc = ctypes.CDLL(None, use_errno=True)
        # This thread's own cwd, the proxy's socket directory: connect by a short
        # relative name, through the hidden oploop home, whatever its path's length.
        if self.dirfd >= 0 and libc.unshare(_CLONE_FS) == 0:
            os.fchdir(self.dirfd)
        elif self.dirfd >= 0:
            self.dirfd = -1
            self.missing = "cannot enter its directory"
        _Loop(self).run()

    def connect(self) -> _socket.socket | str:
        """A connection to the proxy (non-blocking), or why there is none."""
        if self.dirfd < 0:
            return f"no network proxy on this machine ({self.missing})"
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(self.name)  # a listening unix socket accepts at once, or refuses
        except OSError as exc:
            sock.close()
            return (f"the network proxy is not running ({exc.strerror or exc}); the host "
                    f"restarts it: try again in a moment")
        return sock


class _Pipe:
    """One direction of a connection: bytes read from `src` not yet written to `dst`."""

    __slots__ = ("src", "dst", "pending", "eof", "done")

    def __init__(self, src: _socket.socket, dst: _socket.socket) -> None:
        self.src = src
        self.dst = dst
        self.pending = b""
        self.eof = False
        self.done = False


class _Loop:
    """The forwarder: one thread, one epoll, every connection of the call (no thread
    per connection: starting one costs more than the proxy's own work)."""

    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge
        self.poll = select.epoll()
        self.listener = bridge.listener
        self.listener.setblocking(False)
        self.poll.register(self.listener.fileno(), select.EPOLLIN)
        #: fd -> the directions it takes part in: (reads from it, writes to it).
        self.by_fd: dict[int, tuple[_Pipe, _Pipe]] = {}

    def run(self) -> None:
        while True:
            for fd, _ in self.poll.poll():
                if fd == self.listener.fileno():
                    self._accept()
                elif fd in self.by_fd:
                    self._step(fd)

    def _accept(self) -> None:
        try:
            fd, _ = self.listener._accept()  # type: ignore[attr-defined]
        except OSError:
            return
        client = _socket.socket(fileno=fd)
        if len(self.by_fd) >= 2 * MAX_CONNECTIONS:
            _thread.start_new_thread(_answer, (client, f"{MAX_CONNECTIONS} connections "
                                     "through the proxy at once already: close one first"))
            return
        upstream = self.bridge.connect()
        if isinstance(upstream, str):  # answered off the loop: it reads the request first
            _thread.start_new_thread(_answer, (client, upstream))
            return
        # Replies come in pieces (a head, then a body): each goes out at once.
        client.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
        client.setblocking(False)
        out, back = _Pipe(client, upstream), _Pipe(upstream, client)
        self.by_fd[client.fileno()] = (out, back)
        self.by_fd[upstream.fileno()] = (back, out)
        for sock in (client, upstream):
            self.poll.register(sock.fileno(), select.EPOLLIN)

    def _step(self, fd: int) -> None:
        reading, writing = self.by_fd[fd]
        try:
            for pipe in (writing, reading):  # flush what waits for this fd, then read it
                self._move(pipe)
        except OSError:
            self._drop(reading)
            return
        if reading.done and writing.done:
            self._drop(reading)
            return
        for sock in (reading.src, reading.dst):
            self.poll.modify(sock.fileno(), self._interest(sock))

    def _move(self, pipe: _Pipe) -> None:
        if pipe.pending:
            sent = pipe.dst.send(pipe.pending)
            pipe.pending = pipe.pending[sent:]
        if not pipe.pending and not pipe.eof:
            try:
                data = pipe.src.recv(_CHUNK)
            except BlockingIOError:
                data = None
            if data == b"":
                pipe.eof = True
            elif data:
                try:
                    sent = pipe.dst.send(data)
                except BlockingIOError:
                    sent = 0
                pipe.pending = data[sent:]
        if pipe.eof and not pipe.pending and not pipe.done:
            pipe.done = True
            pipe.dst.shutdown(_socket.SHUT_WR)  # a half-close the proxy passes on

    def _interest(self, sock: _socket.socket) -> int:
        reading, writing = self.by_fd[sock.fileno()]
        mask = 0  # (a hang-up or an error is reported whatever the mask: then recv says)
        if not reading.eof and not reading.pending:
            mask |= select.EPOLLIN
        if writing.pending:
            mask |= select.EPOLLOUT
        return mask

    def _drop(self, pipe: _Pipe) -> None:
        for sock in (pipe.src, pipe.dst):
            self.by_fd.pop(sock.fileno(), None)
            try:  # noqa: SIM105 (contextlib: an import more on the launcher's path)
                self.poll.unregister(sock.fileno())
            except OSError:
                pass
            sock.close()


def _answer(client: _socket.socket, reason: str) -> None:
    """Answer one connection with a 503 naming `reason`, then close it. The request is
    read first (up to its head, 2 s at most): a reply before it is read may be lost."""
    body = f"oploop: {reason}. Nothing left this sandbox.\n".encode()
    try:
        client.settimeout(2.0)
        seen = b""
        while b"\r\n\r\n" not in seen and len(seen) < 65536:
            chunk = client.recv(65536)
            if not chunk:
                break
            seen += chunk
        head = (f"HTTP/1.1 503 {body.decode().strip()}\r\nContent-Type: text/plain; "
                f"charset=utf-8\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        client.sendall(head.encode() + body)
        client.shutdown(_socket.SHUT_WR)
    except OSError:
        pass
    finally:
        client.close()


def _loopback_up() -> None:
    """Bring up `lo` in this (new) network namespace: 127.0.0.1 and ::1 exist only then."""
    sock = _socket.socket(_socket.AF_INET, _socket.SOCK_DGRAM)
    try:
        ifreq = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))
    finally:
        sock.close()
