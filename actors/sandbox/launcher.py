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
    seccomp → exec; or, for a file operation (`fileops`: write, read, list),
    the init locks itself down the same way and does it: no second fork.

A layer listed in the spec's `required` that fails stops the launch: the
reason goes to ERR_FD and the tool never runs (fail closed). The executor reads
ERR_FD after the launcher exits; an empty pipe means every required layer held.

Only the standard library, and only cheap parts of it: this file is on the
path of every sandboxed call, so it imports `ctypes` and builtins (`_signal`,
`marshal`), not `signal` (enum) or `json` (re), which cost 10–15 ms each.
"""

from __future__ import annotations

import _signal
import ctypes
import marshal
import os
import stat
import sys

# The file operations (actors/fileops.py). Run by the bootstrap, this file is a top-level
# module with actors/ on sys.path; imported by the executor, it is actors.sandbox.launcher.
if __package__:
    from actors import fileops
else:
    import fileops  # type: ignore[no-redef]

TYPE_CHECKING = False  # `typing` costs an import on every call; annotations only need it here
if TYPE_CHECKING:
    from typing import Any

# --- kernel constants (uapi headers; identical on every Linux architecture) ----------

PR_SET_PDEATHSIG = 1
PR_SET_SECCOMP = 22
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_MODE_FILTER = 2

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2

RLIMIT_NAMES = {"cpu": 0, "fsize": 1, "core": 4, "nproc": 6, "nofile": 7, "as": 9}

SIGKILL = 9
SIGTERM = 15
SIGPIPE = 13
SIGXFSZ = 25

# Landlock (linux/landlock.h). The syscall numbers are the same on all architectures.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REFER = 1 << 13  # ABI 2
FS_TRUNCATE = 1 << 14  # ABI 3
FS_IOCTL_DEV = 1 << 15  # ABI 5
FS_FILE_ONLY = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
FS_READ_ONLY = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
NET_BIND_TCP = 1  # ABI 4
NET_CONNECT_TCP = 2
SCOPE_ABSTRACT_UNIX_SOCKET = 1  # ABI 6
SCOPE_SIGNAL = 2

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = (
    ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p,
)


class LayerFailed(Exception):
    """A layer could not be applied; `layer` names it for the executor's error message."""

    def __init__(self, layer: str, reason: str) -> None:
        super().__init__(f"{layer}: {reason}")
        self.layer = layer


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _prctl(option: int, arg: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


# --- Landlock ---------------------------------------------------------------------------


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 when Landlock is absent or disabled."""
    ret = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(ret), 0)


def _handled_fs(abi: int) -> int:
    handled = (1 << 13) - 1
    if abi >= 2:
        handled |= FS_REFER
    if abi >= 3:
        handled |= FS_TRUNCATE
    if abi >= 5:
        handled |= FS_IOCTL_DEV
    return handled


def apply_landlock(ro: list[str], rw: list[str], deny_tcp: bool, scope: bool) -> int:
    """Allow reading (and exec) beneath `ro`, everything beneath `rw`, nothing else.

    `deny_tcp` also handles TCP bind/connect (no rule allows any port); `scope`
    stops abstract unix sockets and signals from reaching outside this domain.
    Paths that do not exist are skipped. Returns the ABI used.
    """
    abi = landlock_abi()
    if abi < 1:
        raise OSError(95, "Landlock is not supported by this kernel")
    handled = _handled_fs(abi)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if abi >= 4:
        size = 16
        attr.handled_access_net = (NET_BIND_TCP | NET_CONNECT_TCP) if deny_tcp else 0
    if abi >= 6:
        size = 24
        attr.scoped = (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if scope else 0
    ruleset = _check(
        _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), size, 0),
        "landlock_create_ruleset",
    )
    try:
        for paths, access in ((ro, FS_READ_ONLY), (rw, handled)):
            for path in paths:
                _add_path_rule(ruleset, path, access & handled)
        _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _add_path_rule(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= FS_FILE_ONLY  # the kernel refuses directory rights on a file
        rule = _PathBeneath(access, fd)
        _check(
            _libc.syscall(
                SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0
            ),
            f"landlock_add_rule({path})",
        )
    finally:
        os.close(fd)


# --- seccomp --------------------------------------------------------------------------


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def apply_seccomp(bpf: bytes) -> None:
    """Install a classic-BPF seccomp program (compiled by the executor with libseccomp)."""
    if not bpf or len(bpf) % 8:
        raise OSError(22, "seccomp program is empty or not whole instructions")
    buf = ctypes.create_string_buffer(bpf, len(bpf))
    prog = _SockFprog(len(bpf) // 8, ctypes.addressof(buf))
    _check(
        _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0),
        "prctl(PR_SET_SECCOMP)",
    )


# --- the other layers -----------------------------------------------------------------


def join_cgroup(spec: dict[str, Any]) -> None:
    """Create the call's cgroups, write their limits, and move this process into them."""
    for path in spec["mkdir"]:
        os.makedirs(path, exist_ok=True)
    for path, value in spec["limits"]:
        _write(path, value)
    pid = str(os.getpid())
    for procs in spec["procs"]:
        _write(procs, pid)


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def set_rlimits(limits: list[tuple[str, int, int]]) -> None:
    """Lower each rlimit (name, soft, hard); -1 means unlimited."""
    for name, soft, hard in limits:
        values = (ctypes.c_ulong * 2)(
            soft if soft >= 0 else ctypes.c_ulong(-1).value,
            hard if hard >= 0 else ctypes.c_ulong(-1).value,
        )
        _check(_libc.setrlimit(RLIMIT_NAMES[name], values), f"setrlimit({name})")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    def enc(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def setup_mounts(spec: dict[str, Any], new_proc: bool) -> None:
    """In a new mount namespace: hide host paths under tmpfs, bind the kept ones back, new /proc.

    A kept path (the workspace, what a read may see) that lies under a hidden
    one is bound back at its own place inside the tmpfs, through an fd opened
    before it disappeared: the tmpfs is traversable, so the tool uid reaches it
    even when the real parents are not (a home under a 0700 /root).
    """
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    kept = []
    for path in spec["keep"]:
        try:
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # absent (or unreachable): nothing to bind back
        if stat.S_ISLNK(os.fstat(fd).st_mode):  # swapped for a link since it was resolved
            os.close(fd)
            continue
        kept.append((path, fd))
    hidden: list[str] = []
    detach_hidden_mounts([p for p, _ in spec["hide"]], [p for p, _ in kept])
    for path, mode in spec["hide"]:
        if not os.path.isdir(path):  # absent, or already under a hidden path
            continue
        opts = f"size={spec['tmpfs_size']},mode={mode}"
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, opts)
        hidden.append(path.rstrip("/") + "/")
    for path, fd in kept:
        if any((path + "/").startswith(h) for h in hidden):
            _mount_point(path, stat.S_ISDIR(os.fstat(fd).st_mode))
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
        os.close(fd)
    if new_proc:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


def detach_hidden_mounts(hide: list[str], keep: list[str]) -> None:
    """Unmount, in this namespace, every mount under a hidden path but the kept ones.

    A tmpfs over a path hides its files, not the mounts beneath it from the mount
    table: /proc/self/mountinfo would list every session's workspace (its id, its
    home's path) of every home under /root, /home or /tmp. A kept path (the
    session's own workspace) and the mounts holding one stay: it is bound back.
    """
    hidden = [h.rstrip("/") + "/" for h in hide]
    kept = [k.rstrip("/") + "/" for k in keep]
    with open("/proc/self/mountinfo", "rb") as f:
        points = [_unescape(line.split(b" ", 5)[4]) for line in f]
    for point in sorted(set(points), key=len, reverse=True):  # the deepest first
        mark = point.rstrip("/") + "/"
        if not any(mark.startswith(h) and mark != h for h in hidden):
            continue
        if any(k.startswith(mark) for k in kept):
            continue
        _libc.umount2(point.encode("utf-8", "surrogateescape"), MNT_DETACH)  # gone: fine


def _unescape(field: bytes) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    if b"\\" in field:
        out, i = bytearray(), 0
        while i < len(field):
            if field[i:i + 1] == b"\\" and field[i + 1:i + 4].isdigit():
                out.append(int(field[i + 1:i + 4], 8))
                i += 4
            else:
                out += field[i:i + 1]
                i += 1
        field = bytes(out)
    return field.decode("utf-8", "surrogateescape")


def mount_view(spec: dict[str, Any], new_proc: bool) -> None:
    """The whole file system view of a call: hidden and kept paths, a new /proc, a
    private /run, and /sys and /proc/sys reduced (after the new /proc: it masks that)."""
    setup_mounts(spec, new_proc)
    private_run(spec["private_run"], spec["tmpfs_size"])
    mask_host_info(spec["mask"])


def private_run(paths: list[str], size: str) -> None:
    """An empty tmpfs over /run (and a real /var/run): no host daemon's socket inside."""
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   f"size={size},mode=0755")


def mask_host_info(masks: list[tuple[str, list[tuple[str, bytes]]]]) -> None:
    """Cover each masked tree (/sys, /proc/sys) with a small read-only tmpfs holding
    only copies of the few files ordinary tools read (the CPUs online, pid_max...).

    Copies, not binds: a tmpfs and a few writes cost ~0.1 ms, where detaching
    /sys and moving clones of the kept entries back cost several ms per call.
    """
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    for root, files in masks:
        if not os.path.isdir(root):
            continue
        _mount("tmpfs", root, "tmpfs", flags, "size=1m,mode=0555")
        for rel, data in files:
            target = os.path.join(root, rel)
            os.makedirs(os.path.dirname(target), mode=0o555, exist_ok=True)
            fd = os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o444)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        _mount(None, root, None, MS_REMOUNT | MS_RDONLY | flags, "size=1m,mode=0555")


def _mount_point(path: str, directory: bool) -> None:
    """Make an empty directory or file at `path` (in a tmpfs) to bind a kept path on."""
    if directory:
        os.makedirs(path, mode=0o755, exist_ok=True)
        return
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def add_readable(spec: dict[str, Any]) -> None:
    """Resolve the extra paths a read may see and add the safe ones to `keep` and Landlock.

    Never one that is, or contains, a hidden path (`/`, `/root`, the oploop
    home...), nor one inside the oploop home or a key folder (`secret`):
    resolved first, so a symbolic link cannot lead there.
    """
    hidden = [p.rstrip("/") + "/" for p, _ in spec["hide"]]
    secret = [p.rstrip("/") + "/" for p in spec["secret"]]
    for path in spec["readable"]:
        real = os.path.realpath(path)
        mark = real.rstrip("/") + "/"
        if any(h.startswith(mark) for h in hidden) or any(mark.startswith(s) for s in secret):
            continue
        spec["keep"].append(real)
        if spec.get("landlock"):
            spec["landlock"]["ro"].append(real)


def drop_uid(uid: int, gid: int) -> None:
    """Become `uid`/`gid` with no supplementary groups; the capabilities go with root."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)


# --- the launch -----------------------------------------------------------------------


class Launch:
    """One launch: the spec, the error pipe, and the fail-closed rule for each layer."""

    def __init__(self, spec: dict[str, Any], errfd: int) -> None:
        self.spec = spec
        self.errfd = errfd
        self.required = frozenset(spec["required"])

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
        alive_r, alive_w = os.pipe()
        status_r, status_w = os.pipe()
        init = os.fork()
        if init == 0:
            os.close(alive_w)
            os.close(status_r)
            self._init(alive_r, status_w)
        os.close(alive_r)
        os.close(status_w)
        os.close(self.errfd)
        _, wstatus = os.waitpid(init, 0)
        raw = os.read(status_r, 16)
        self._mirror(int(raw) if raw else wstatus)

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
                self.layer("landlock", apply_landlock, ll["ro"], ll["rw"], ll["deny_tcp"], True)
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
             ("list", fileops.run_lister))


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
