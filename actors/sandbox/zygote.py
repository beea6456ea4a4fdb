"""The launcher's fork server: one single-threaded process per executor that forks launches.

Starting an interpreter and importing ctypes costs ~20 ms; a fork of this
already-loaded process costs ~1 ms. The executor execs it once (`python -I -S
-c BOOTSTRAP SOCK_FD EXECUTOR_PID`); it has no threads, so fork is safe here.

Protocol over a SOCK_SEQPACKET socketpair: the executor sends b"L" with four
fds (spec memfd, stdout write end, error pipe write end, status pipe write
end), or b"P" for a launcher forked as pid 1 of a new pid namespace (a file
operation: the launcher is its own init, which saves a fork, ~1 ms here; as
root only, else it is forked as for b"L" and makes the namespace itself);
either followed by b"D" (duplex: the stdout fd is a socket, also the child's
stdin: a persistent reader takes its requests there);
the server forks a child that runs exactly what a freshly exec'd launcher
runs (`launcher.Launch`), answers with the child's pid, and when the child
exits writes its wait status to the status pipe and closes it. EOF on the
socket (the executor closed it or died) ends the server; the parent-death
signal ends it if the executor is SIGKILLed, and its children follow.
"""

from __future__ import annotations

import contextlib
import marshal
import os
import select
import socket
import sys

import launcher  # top-level: the bootstrap puts this directory first on sys.path

_NFDS = 4


def serve(sock_fd: int, executor: int) -> None:
    """Serve launch requests until the executor goes away."""
    launcher._prctl(launcher.PR_SET_PDEATHSIG, launcher.SIGKILL)
    if os.getppid() != executor:
        os._exit(0)
    sock = socket.socket(fileno=sock_fd)
    poller = select.poll()
    poller.register(sock_fd, select.POLLIN)
    children: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, status fd)
    try:  # to go back to our own pid namespace for children after a b"P" fork
        own_ns = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        own_ns = -1
    while True:
        for fd, _ in poller.poll():
            if fd == sock_fd:
                msg, fds, _, _ = socket.recv_fds(sock, 16, _NFDS + 1)
                if not msg:
                    os._exit(0)
                # b"...E": the launched program's stderr apart, a fifth fd (an MCP server)
                if len(fds) != _NFDS + msg.endswith(b"E"):
                    for extra in fds:
                        os.close(extra)
                    sock.send(b"E bad request")
                    continue
                pid = _fork_launch(fds, sock_fd, children, msg[:1] == b"P" and own_ns >= 0,
                                   own_ns, duplex=msg[1:2] == b"D")
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, fds[3])
                poller.register(pidfd, select.POLLIN)
                for f in fds[:3] + fds[4:]:
                    os.close(f)
                sock.send(str(pid).encode())
            else:
                pid, status_fd = children.pop(fd)
                poller.unregister(fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # the executor stopped waiting for it
                    os.write(status_fd, str(status).encode())
                os.close(status_fd)
                os.close(fd)


def _own_pid_ns(own_ns: int) -> None:
    """Fork our next children in our own pid namespace again (after a b"P" fork)."""
    if launcher._libc.setns(own_ns, launcher.CLONE_NEWPID) != 0:
        os._exit(1)  # never fork a later launcher into another one's namespace


def _fork_launch(fds: list[int], sock_fd: int, children: dict[int, tuple[int, int]],
                 pid_ns: bool = False, own_ns: int = -1, *, duplex: bool = False) -> int:
    # unshare(CLONE_NEWPID) places our next child, not us, in a new namespace; setns
    # back to our own is then needed before the next call (only once per namespace).
    new_ns = pid_ns and launcher._libc.unshare(launcher.CLONE_NEWPID) == 0
    try:
        pid = os.fork()
    except OSError:
        if new_ns:
            _own_pid_ns(own_ns)
        raise
    if pid:
        if new_ns:
            _own_pid_ns(own_ns)
        return pid
    try:
        spec_fd, out_w, err_w, status_w = fds[:4]
        stderr_w = fds[4] if len(fds) > 4 else out_w
        # Nothing of the server or of other calls may stay open in this tree.
        os.close(sock_fd)
        os.close(status_w)
        for pidfd, (_, other_status) in children.items():
            os.close(pidfd)
            os.close(other_status)
        if own_ns >= 0:
            os.close(own_ns)
        null = os.open("/dev/null", os.O_RDONLY)
        os.dup2(out_w if duplex else null, 0)
        os.dup2(out_w, 1)
        os.dup2(stderr_w, 2)
        os.close(null)
        os.close(out_w)
        if stderr_w != out_w:
            os.close(stderr_w)
        with os.fdopen(spec_fd, "rb") as f:
            spec = marshal.load(f)
        os.set_inheritable(err_w, False)
    except BaseException:
        os._exit(126)
    launch = launcher.Launch(spec, err_w)
    try:
        launch.run()
    except launcher.LayerFailed as exc:
        launch.fail(str(exc))
    except BaseException as exc:  # a forked child must never return into the server loop
        launch.fail(f"launcher: {type(exc).__name__}: {exc}")
    os._exit(126)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
