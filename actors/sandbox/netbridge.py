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
import struct

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

PORT = 3128
"""Where the forwarder listens inside the call's network namespace (127.0.0.1)."""
MAX_CONNECTIONS = 32
"""Connections one call may hold through the forwarder at once; more are answered 503."""
_STACK = 256 * 1024
_CONNECT_S = 5.0  # a proxy that does not accept within this long counts as not running
_CLONE_FS = 0x00000200
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


class Bridge:
    """The forwarder of one call: the listening socket and the proxy socket's directory."""

    def __init__(self, conf: dict[str, Any]) -> None:
        self.name: str = conf["name"]
        self.missing = ""
        self.port: int = conf["port"]
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
        self._lock = _thread.allocate_lock()
        self._active = 0

    def close(self) -> None:
        """Close this process's copies (the outer launcher's, once the init has them)."""
        self.listener.close()
        if self.dirfd >= 0:
            os.close(self.dirfd)

    def serve(self) -> None:
        """Start the forwarder thread (in the init, once the tool is forked)."""
        _thread.stack_size(_STACK)
        _thread.start_new_thread(self._accept_loop, ())

    def _accept_loop(self) -> None:
        import ctypes  # (already loaded by the lockdown)

        libc = ctypes.CDLL(None, use_errno=True)
        # This thread's own cwd, the proxy's socket directory: connect by a short
        # relative name, through the hidden oploop home, whatever its path's length.
        if self.dirfd >= 0 and libc.unshare(_CLONE_FS) == 0:
            os.fchdir(self.dirfd)
        else:
            self.dirfd = -1
            self.missing = self.missing or "cannot enter its directory"
        while True:
            try:
                fd, _ = self.listener._accept()  # type: ignore[attr-defined]
            except OSError:
                continue
            client = _socket.socket(fileno=fd)
            with self._lock:
                busy = self._active >= MAX_CONNECTIONS
                if not busy:
                    self._active += 1
            if busy:
                _answer(client, f"{MAX_CONNECTIONS} connections through the proxy at once "
                                f"already: close one first")
                continue
            _thread.start_new_thread(self._forward, (client,))

    def _forward(self, client: _socket.socket) -> None:
        upstream = self._connect()
        if isinstance(upstream, str):
            _answer(client, upstream)
            with self._lock:
                self._active -= 1
            return
        left = [2]

        def done() -> None:  # each direction calls it once; the last closes the pair
            with self._lock:
                left[0] -= 1
                last = left[0] == 0
                if last:
                    self._active -= 1
            if last:
                client.close()
                upstream.close()

        _thread.start_new_thread(_pump, (upstream, client, done))
        _pump(client, upstream, done)

    def _connect(self) -> _socket.socket | str:
        """A connection to the proxy, or why there is none."""
        if self.dirfd < 0:
            return f"no network proxy on this machine ({self.missing})"
        sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        sock.settimeout(_CONNECT_S)
        try:
            sock.connect(self.name)
        except OSError as exc:
            sock.close()
            return (f"the network proxy is not running ({exc.strerror or exc}); the host "
                    f"restarts it: try again in a moment")
        sock.settimeout(None)
        return sock


def _pump(src: _socket.socket, dst: _socket.socket, done: Callable[[], None]) -> None:
    """Copy `src` to `dst` until EOF, then end `dst`'s writing side (a half-close the
    proxy passes on). On an error both sides are shut, which ends the other direction."""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
        dst.shutdown(_socket.SHUT_WR)
    except OSError:
        for sock in (src, dst):
            try:  # noqa: SIM105 (contextlib: an import more on the launcher's path)
                sock.shutdown(_socket.SHUT_RDWR)
            except OSError:
                pass
    finally:
        done()


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
