"""The launcher's process lockdown: kernel constants, Landlock, seccomp, cgroup, rlimits, uid.

Primitives over `ctypes` that the launcher (`launcher.py`) applies to itself
before it runs a tool. Like the launcher, this file is imported both as a
top-level module (the bootstrap puts actors/sandbox on sys.path) and as
actors.sandbox.lockdown, so it imports only cheap parts of the standard
library (see launcher.py).
"""

from __future__ import annotations

import ctypes
import errno  # (built into the interpreter: no file to import)
import os
import stat

TYPE_CHECKING = False  # `typing` costs an import on every call; annotations only need it here
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
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
LANDLOCK_RULE_NET_PORT = 2  # ABI 4
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


class _NetPort(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64))


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


def apply_landlock(ro: list[str], rw: list[str], deny_tcp: bool, scope: bool,
                   tcp_connect: Sequence[int] = (),
                   ls: list[str] | tuple[str, ...] = ()) -> int:
    """Allow reading (and exec) beneath `ro`, everything beneath `rw`, listing
    directories beneath `ls`, nothing else.

    `deny_tcp` also handles TCP bind/connect (no rule allows any port but
    `tcp_connect`'s, for connect only: the forwarder to the network proxy);
    `scope` stops abstract unix sockets and signals from reaching outside this
    domain. Paths that do not exist are skipped, and so are writable ones with a
    symbolic link on the way, but for the working directory (`_open_writable`).
    Returns the ABI used.
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
        for paths, access, opener in ((ls, FS_READ_DIR, _open_any), (ro, FS_READ_ONLY, _open_any),
                                      (rw, handled, _open_writable)):
            for path in paths:
                _add_path_rule(ruleset, path, access & handled, opener)
        if abi >= 4 and deny_tcp:
            for port in tcp_connect:
                rule = _NetPort(NET_CONNECT_TCP, port)
                _check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ruleset, LANDLOCK_RULE_NET_PORT,
                                     ctypes.byref(rule), 0), f"landlock_add_rule(tcp {port})")
        _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _add_path_rule(ruleset: int, path: str, access: int,
                   opener: Callable[[str], int | None]) -> None:
    fd = opener(path)
    if fd is None:
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


def _open_any(path: str) -> int | None:
    """An O_PATH fd of `path`, links followed (None if it does not exist)."""
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return None


def _open_writable(path: str) -> int | None:
    """An O_PATH fd of the writable path `path` with no symbolic link on the way, or of
    the working directory; None if it does not exist, or if a link is on the way to
    anything else.

    The view made each path writable as it resolved then, with no link on the way
    (`modes.view_for`): a link there now was made since (by another call, say), and
    following it would make its target writable. The working directory, which the
    launcher has entered already, may be reached through a link as it was chosen.
    """
    try:
        return open_without_links(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
    fd = _open_any(path)
    if fd is not None and not os.path.samestat(os.fstat(fd), os.stat(".")):
        os.close(fd)
        return None
    return fd


def open_without_links(path: str) -> int:
    """An O_PATH fd of the absolute `path`, opened one component at a time from `/`,
    none followed; OSError ELOOP if one is a symbolic link (magic ones included)."""
    fd = os.open("/", os.O_PATH | os.O_CLOEXEC)
    try:
        for name in path.split("/"):
            if not name or name == ".":
                continue
            step = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = step
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise OSError(errno.ELOOP, f"{path}: a symbolic link on the way ({name})")
        opened, fd = fd, -1
        return opened
    finally:
        if fd >= 0:
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


def drop_uid(uid: int, gid: int) -> None:
    """Become `uid`/`gid` with no supplementary groups; the capabilities go with root.

    Staying uid 0 (a working directory owned by root) drops every capability
    explicitly, and locks the securebits so that no exec gives them back: the tool
    is then an ordinary owner of root's files, which Landlock keeps read-only.
    """
    if uid == 0:
        _prctl(PR_SET_SECUREBITS, _SECBITS_LOCKED_NOROOT)
        _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
        for cap in range(64):
            if _libc.prctl(PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) < 0:
                break  # past the kernel's last capability
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if uid == 0:
        _capset_none()


PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
#: noroot, no_setuid_fixup, no_cap_ambient_raise, each with its lock; and keep_caps
#: locked off (securebits.h).
_SECBITS_LOCKED_NOROOT = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
_CAP_VERSION_3 = 0x20080522


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32))


def _capset_none() -> None:
    """Clear the effective, permitted and inheritable capability sets."""
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), ctypes.byref(data)), "capset")
