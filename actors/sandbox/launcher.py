"""The sandbox launcher: a small single-threaded process that locks itself down, then runs a tool.

The executor execs it as `python -I -S -c BOOTSTRAP SPEC_FD ERR_FD` (never as
a `preexec_fn`: the executor has threads); BOOTSTRAP imports this file as a
top-level module, so its bytecode comes from __pycache__ instead of being
compiled on every call as a script would be. It reads a `marshal`-ed spec from
SPEC_FD and applies, in order, every layer the spec asks for:

    cgroup (join the call's cgroup, limits already named) · setsid ·
    parent-death signal · rlimits · namespaces (mount, net, ipc, uts, pid) →
    fork the pid namespace's init: mounts (private /tmp and /run, hidden
    homes and host paths, kept paths bound back, /sys and /proc/sys reduced,
    new /proc) → fork the tool: unprivileged uid · no_new_privs · Landlock ·
    seccomp → exec; or, for a file operation (`fileops`: write, read, list, or
    `serve`: a persistent reader answering many reads and listings on its
    stdin/stdout socket), the init locks itself down the same way and does it:
    no second fork.

A layer listed in the spec's `required` that fails stops the launch: the
reason goes to ERR_FD and the tool never runs (fail closed). The executor reads
ERR_FD after the launcher exits; an empty pipe means every required layer held.

Only the standard library, and only cheap parts of it: this file is on the
path of every sandboxed call, so it imports `ctypes` and builtins (`_signal`,
`marshal`), not `signal` (enum) or `json` (re), which cost 10–15 ms each.
"""

from __future__ import annotations

import _signal
import marshal
import os
import sys

# The file operations (actors/fileops.py). Run by the bootstrap, this file is a top-level
# module with actors/ on sys.path; imported by the executor, it is actors.sandbox.launcher.
# The memory tool's commands (actors/memoryfs.py) likewise: imported before the lockdown,
# which leaves the source tree unreadable (the fork server has them loaded already).
if __package__:
    from actors import fileops, memoryfs
else:
    import fileops  # type: ignore[no-redef]
    import memoryfs  # type: ignore[no-redef]
# The lockdown primitives (lockdown.py) and the mount view (mounts.py), imported the same
# two ways. The star imports keep every public name of theirs importable from here, and
# `_x as _x` the private ones the executor and the zygote use.
if __package__:
    from actors.sandbox.lockdown import *  # noqa: F403
    from actors.sandbox.lockdown import (
        CLONE_NEWNS,
        CLONE_NEWPID,
        CLONE_NEWUTS,
        PR_SET_CHILD_SUBREAPER,
        PR_SET_NO_NEW_PRIVS,
        PR_SET_PDEATHSIG,
        SIGKILL,
        SIGPIPE,
        SIGTERM,
        SIGXFSZ,
        apply_landlock,
        apply_seccomp,
        drop_uid,
        join_cgroup,
        set_rlimits,
    )
    from actors.sandbox.lockdown import _check as _check
    from actors.sandbox.lockdown import _libc as _libc
    from actors.sandbox.lockdown import _prctl as _prctl
    from actors.sandbox.mounts import *  # noqa: F403
    from actors.sandbox.mounts import add_readable, mount_view
else:
    from lockdown import *  # noqa: F403
    from lockdown import (  # type: ignore[no-redef]
        CLONE_NEWNS,
        CLONE_NEWPID,
        CLONE_NEWUTS,
        PR_SET_CHILD_SUBREAPER,
        PR_SET_NO_NEW_PRIVS,
        PR_SET_PDEATHSIG,
        SIGKILL,
        SIGPIPE,
        SIGTERM,
        SIGXFSZ,
        apply_landlock,
        apply_seccomp,
        drop_uid,
        join_cgroup,
        set_rlimits,
    )
    from lockdown import _check as _check  # type: ignore[no-redef]
    from lockdown import _libc as _libc  # type: ignore[no-redef]
    from lockdown import _prctl as _prctl  # type: ignore[no-redef]
    from mounts import *  # noqa: F403
    from mounts import add_readable, mount_view  # type: ignore[no-redef]

TYPE_CHECKING = False  # `typing` costs an import on every call; annotations only need it here
if TYPE_CHECKING:
    from typing import Any


class LayerFailed(Exception):
    """A layer could not be applied; `layer` names it for the executor's error message."""

    def __init__(self, layer: str, reason: str) -> None:
        super().__init__(f"{layer}: {reason}")
        self.layer = layer


# --- the launch -----------------------------------------------------------------------


class Launch:
    """One launch: the spec, the error pipe, and the fail-closed rule for each layer."""

    def __init__(self, spec: dict[str, Any], errfd: int) -> None:
        self.spec = spec
        self.errfd = errfd
        self.required = frozenset(spec["required"])
        self.bridge = None  # the forwarder to the network proxy (`netbridge.Bridge`)

    def layer(self, name: str, fn, *args) -> bool:  # type: ignore[no-untyped-def]
        """Apply one layer; a failure stops the launch if the layer is required."""
        try:
            fn(*args)
        except Exception as exc:  # any failure of a layer: report it, never run unprotected
            if name in self.required:
                raise LayerFailed(name, str(exc)) from exc
            return False
        return True

    def fail(self, message: str, code: int = 126) -> None:
        """Report `message` on the error pipe and end this process now."""
        try:
            os.write(self.errfd, message.encode()[:4000])
        finally:
            os._exit(code)

    def run(self) -> None:
        """The outer launcher: layers that hold for the whole tree, then the pid namespace."""
        spec = self.spec
        if spec.get("cgroup"):
            self.layer("cgroup", join_cgroup, spec["cgroup"])
        self.layer("setsid", os.setsid)
        if spec.get("pdeathsig"):
            self.layer("pdeathsig", self._die_with_executor, spec["ppid"])
        self.layer("rlimits", set_rlimits, spec["rlimits"])
        if spec.get("readable"):
            add_readable(spec)
        # Python ignores these two; a tool must start with the default dispositions.
        _signal.signal(SIGPIPE, _signal.SIG_DFL)
        _signal.signal(SIGXFSZ, _signal.SIG_DFL)
        if spec.get("bwrap"):
            self._exec_bwrap()
        flags = spec["unshare"]
        # Forked by the server as pid 1 of a new pid namespace (a file operation):
        # this process is the namespace's init and does the operation itself.
        as_init = bool(flags & CLONE_NEWPID) and os.getpid() == 1 and _file_op(spec) is not None
        if as_init:
            flags &= ~CLONE_NEWPID
        if flags:
            self.layer("namespaces", lambda: _check(_libc.unshare(flags), "unshare"))
        if as_init:
            self._as_init()
        self.bridge = self._network_bridge()
        alive_r, alive_w = os.pipe()
        status_r, status_w = os.pipe()
        init = os.fork()
        if init == 0:
            os.close(alive_w)
            os.close(status_r)
            self._init(alive_r, status_w)
        if self.bridge is not None:
            self.bridge.close()  # the init serves it
        os.close(alive_r)
        os.close(status_w)
        os.close(self.errfd)
        _, wstatus = os.waitpid(init, 0)
        raw = os.read(status_r, 16)
        self._mirror(int(raw) if raw else wstatus)

    def _network_bridge(self) -> Any:
        """The forwarder to the host's network proxy (`netbridge.py`), for a call whose
        network is an allowlist: set up here, in its new network namespace, before the
        init hides the oploop home (the init then serves it); None for any other call."""
        conf = self.spec.get("netbridge")
        if not conf:
            return None
        if __package__:
            from actors.sandbox import netbridge
        else:
            import netbridge  # type: ignore[no-redef]
        try:
            return netbridge.Bridge(conf)
        except OSError as exc:  # no loopback, the port taken: the tool would have no way out
            raise LayerFailed("network", f"proxy bridge: {exc}") from exc

    def _exec_bwrap(self) -> None:
        """The bubblewrap backend: become the tool uid, then exec a hardened bwrap.

        bwrap then makes the namespaces (user ns included, unprivileged), the
        minimal read-only root and the seccomp filter (passed by fd). Dropping
        root first matters: bwrap run by root would map the tool to host root.
        """
        spec = self.spec
        if spec["uid"] >= 0:
            self.layer("uid", drop_uid, spec["uid"], spec["gid"])
            if spec.get("pdeathsig"):  # a credential change cleared it
                self.layer("pdeathsig", self._die_with_executor, spec["ppid"])
        argv = list(spec["bwrap"])
        keep = [self.errfd]
        if spec.get("seccomp"):
            r, w = os.pipe()
            os.write(w, spec["seccomp"])
            os.close(w)
            os.set_inheritable(r, True)
            argv += ["--seccomp", str(r)]
            keep.append(r)
        argv += ["--", *spec["argv"]]
        try:
            _close_all_but(keep)
            os.execve(argv[0], argv, {})
        except OSError as exc:
            self.fail(f"bubblewrap: {argv[0]}: {exc.strerror or exc}", 127)

    def _die_with_executor(self, ppid: int) -> None:
        _prctl(PR_SET_PDEATHSIG, SIGKILL)
        # The executor died before prctl took effect (0: our parent is outside our pid
        # namespace, we are its init: the server forked us there).
        if os.getppid() not in (ppid, 0):
            os._exit(126)

    def _as_init(self) -> None:
        """Pid 1 of a pid namespace the server made: the mounts, then the file operation."""
        try:
            if self.spec["unshare"] & CLONE_NEWNS:
                self.layer("namespaces", mount_view, self.spec, True)
        except LayerFailed as exc:
            self.fail(str(exc))
        except Exception as exc:  # the init failed before the operation started
            self.fail(f"launcher: {exc}")
        self._tool(as_init=True)

    def _init(self, alive_r: int, status_w: int) -> None:
        """The pid namespace's init (or, without one, a subreaper): runs the tool, reaps.

        A file operation (write, read, list) is our code, not the model's: the
        init runs it itself after the lockdown, one process fewer per call.
        """
        inline = _file_op(self.spec) is not None
        try:
            spec = self.spec
            pidns = bool(spec["unshare"] & CLONE_NEWPID)
            if pidns:
                # Killing pid 1 kills the namespace: nothing else to do when the launcher dies.
                _prctl(PR_SET_PDEATHSIG, SIGKILL)
            else:
                # No namespace to take the tree down: catch the signal and kill it ourselves.
                _signal.signal(SIGTERM, _die_with_tree)
                _prctl(PR_SET_PDEATHSIG, SIGTERM)
                _prctl(PR_SET_CHILD_SUBREAPER, 1)
            if _gone(alive_r):  # the outer launcher is already gone
                os._exit(126)
            if not inline:
                os.close(alive_r)
            if spec["unshare"] & CLONE_NEWNS:
                self.layer("namespaces", mount_view, spec, pidns)
            if spec["unshare"] & CLONE_NEWUTS:
                _libc.sethostname(b"sandbox", 7)
        except LayerFailed as exc:
            self.fail(str(exc))
        except Exception as exc:  # the init failed before the tool started
            self.fail(f"launcher: {exc}")
        if inline:
            os.close(status_w)
            self._tool(alive_r)
        tool = os.fork()
        if tool == 0:
            os.close(status_w)
            self._tool()
        if self.bridge is not None:
            # A thread of the init: the outer launcher cannot have one (it unshared the
            # pid namespace), and the tool must not share its memory.
            self.bridge.serve()
        os.close(self.errfd)
        os.close(1)
        os.close(2)
        self._reap(tool, status_w, pidns)

    def _reap(self, tool: int, status_w: int, pidns: bool) -> None:
        """Reap everything until the tool exits, then end the rest and report its status."""
        while True:
            pid, wstatus = os.wait()
            if pid == tool:
                break
        os.write(status_w, str(wstatus).encode())
        if not pidns:
            _kill_descendants()
        # In a pid namespace, this exit makes the kernel kill every process left in it.
        os._exit(0)

    def _tool(self, alive_r: int = -1, as_init: bool = False) -> None:
        """The tool process: the per-process lockdown, then exec (or the file operation).

        `alive_r`: the init runs a file operation itself; the uid change cleared
        its parent-death signal, so it is set again, then the launcher checked.
        `as_init`: the launcher is the init (see `run`): the signal is set again;
        its parent, outside the namespace, cannot be checked (the operation is
        bounded, and the executor kills it through its pidfd).
        """
        spec = self.spec
        _signal.signal(SIGTERM, _signal.SIG_DFL)  # the init's handler is not the tool's
        try:
            os.chdir(spec["cwd"])
            if spec["uid"] >= 0:
                self.layer("uid", drop_uid, spec["uid"], spec["gid"])
            if as_init and spec.get("pdeathsig"):
                _prctl(PR_SET_PDEATHSIG, SIGKILL)
            if alive_r >= 0:
                _prctl(PR_SET_PDEATHSIG, SIGKILL)
                if _gone(alive_r):
                    os._exit(126)
                os.close(alive_r)
            self.layer("no_new_privs", _prctl, PR_SET_NO_NEW_PRIVS, 1)
            ll = spec.get("landlock")
            if ll:
                self.layer("landlock", apply_landlock, ll["ro"], ll["rw"], ll["deny_tcp"], True,
                           ll.get("tcp_connect", ()), ll.get("ls", ()))
            if spec.get("seccomp"):
                self.layer("seccomp", apply_seccomp, spec["seccomp"])
        except LayerFailed as exc:
            self.fail(str(exc))
        except OSError as exc:
            self.fail(f"launcher: {exc}")
        op = _file_op(spec)
        if op is not None:
            key, run = op
            os._exit(run(spec[key]))
        argv = spec["argv"]
        try:
            _close_all_but([self.errfd])
            os.execve(argv[0], argv, spec["env"])
        except OSError as exc:
            self.fail(f"exec: {argv[0]}: {exc.strerror or exc}", 127)

    def _mirror(self, wstatus: int) -> None:
        """End the way the tool ended: same exit code, or the same signal."""
        if os.WIFSIGNALED(wstatus):
            sig = os.WTERMSIG(wstatus)
            _signal.signal(sig, _signal.SIG_DFL)
            os.kill(os.getpid(), sig)
            os._exit(128 + sig)
        os._exit(os.WEXITSTATUS(wstatus) if os.WIFEXITED(wstatus) else 126)


_FILE_OPS = (("write", fileops.run_writer), ("read", fileops.run_reader),
             ("list", fileops.run_lister), ("serve", fileops.run_server),
             ("memory", memoryfs.run_memory))


def _file_op(spec: dict[str, Any]):  # type: ignore[no-untyped-def]
    """(spec key, runner) of the file operation this launch runs instead of a command;
    None for a command."""
    for key, run in _FILE_OPS:
        if key in spec:
            return key, run
    return None


def _gone(alive_r: int) -> bool:
    """Whether the outer launcher has exited (EOF on the pipe it holds open)."""
    os.set_blocking(alive_r, False)
    try:
        return os.read(alive_r, 1) == b""
    except BlockingIOError:
        return False


def _close_all_but(keep: list[int]) -> None:
    """Close every fd from 3 up except those in `keep` (the tool inherits nothing else)."""
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 16)


def _die_with_tree(signum: int, frame: object) -> None:
    """The init's parent-death handler without a pid namespace: take the tree along."""
    _kill_descendants()
    os._exit(128 + signum)


def _kill_descendants() -> None:
    """SIGKILL every descendant (without a pid namespace, orphans were reparented here)."""
    while True:
        kids = _children(os.getpid())
        if not kids:
            return
        todo = list(kids)
        while todo:
            pid = todo.pop()
            todo.extend(_children(pid))
            try:  # noqa: SIM105
                os.kill(pid, SIGKILL)
            except ProcessLookupError:
                pass
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            return


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(p) for p in f.read().split())
    except OSError:
        pass
    return out


def main(argv: list[str]) -> None:
    """`launcher.py SPEC_FD ERR_FD`: read the spec, lock down, run the tool."""
    spec_fd, errfd = int(argv[1]), int(argv[2])
    with os.fdopen(spec_fd, "rb") as f:
        spec = marshal.load(f)
    os.set_inheritable(errfd, False)
    launch = Launch(spec, errfd)
    try:
        launch.run()
    except LayerFailed as exc:
        launch.fail(str(exc))
    except Exception as exc:  # an unexpected launcher failure still never runs the tool
        launch.fail(f"launcher: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main(sys.argv)
