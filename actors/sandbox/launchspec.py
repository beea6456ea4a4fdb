"""What a sandboxed call's launch spec is made of: namespaces, rlimits, hidden paths, masks.

The pieces `Sandbox` puts in the spec it hands the launcher (`launcher.py`),
computed in the executor: the namespaces to unshare, the rlimits, the paths
hidden under a tmpfs, the copies of /sys and /proc/sys a tool may read, and
the system paths a read may see.
"""

from __future__ import annotations

import functools
import os

from . import hostview
from . import launcher as launcher_mod
from .cgroups import Limits
from .policy import SYSTEM_RO_PATHS, Policy

_PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
TMPFS_SIZE = "64m"
"""The size of each private tmpfs (/tmp, /var/tmp, /dev/shm, /run): a fill stops there."""
_HOMES = ("/root", "/home")
"""Hidden from every tool (tmpfs): root's and the users' homes, whatever their modes."""
_SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _unshare_flags(offline: bool) -> int:
    flags = (
        launcher_mod.CLONE_NEWNS | launcher_mod.CLONE_NEWIPC | launcher_mod.CLONE_NEWUTS
        | launcher_mod.CLONE_NEWPID | launcher_mod.CLONE_NEWCGROUP
    )
    return flags | launcher_mod.CLONE_NEWNET if offline else flags


def _rlimits(policy: Policy, as_user: bool) -> list[tuple[str, int, int]]:
    limits = [
        # Soft: SIGXCPU a process can see; hard a second later: SIGKILL.
        ("cpu", policy.cpu_s, policy.cpu_s + 1),
        ("fsize", policy.file_bytes, policy.file_bytes),
        ("nofile", policy.nofile, policy.nofile),
        ("core", 0, 0),
    ]
    if as_user and policy.limits.pids > 0:
        # Counted per uid across the machine (root ignores it), and each session has
        # its own uid: it bounds the session's calls together, never another
        # session's; a backstop behind the cgroup's exact pids.max, hence the slack.
        limits.append(("nproc", policy.limits.pids * 4, policy.limits.pids * 4))
    if policy.address_space > 0:
        limits.append(("as", policy.address_space, policy.address_space))
    return limits


def _within(limits: Limits, cap: Limits) -> Limits:
    """A call's limits, none above the executor's caps (0: none of that kind). The
    parent bounds the call anyway, but v1 refuses a cpu quota above its parent's."""

    def lower(value: float, bound: float) -> float:
        if bound <= 0:
            return value
        return bound if value <= 0 else min(value, bound)

    return Limits(
        memory_bytes=int(lower(limits.memory_bytes, cap.memory_bytes)),
        pids=int(lower(limits.pids, cap.pids)),
        cpu=lower(limits.cpu, cap.cpu),
    )


@functools.cache
def _masks() -> list[tuple[str, list[tuple[str, bytes]]]]:
    # Built once: marshal takes lists, and the copies never change.
    return [(root, list(files)) for root, files in hostview.host_info_masks()]


@functools.cache
def _reads_system_ro() -> tuple[str, ...]:
    """The system paths a read may see, resolved and without those beneath another
    (/bin is /usr/bin on most systems) nor devices (a read refuses them): each
    Landlock rule costs a few syscalls on every call."""
    real = {os.path.realpath(p) for p in SYSTEM_RO_PATHS if not p.startswith("/dev/")}
    real = {p for p in real if os.path.isdir(p)}
    return tuple(sorted(p for p in real if not any(p.startswith(q + "/") for q in real)))


#: Devices a tool may read when the whole tree is readable (never a disk: its raw
#: blocks would bypass every hidden path).
_TREE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                 "/dev/tty", "/dev/pts")


@functools.cache
def _tree_ro() -> tuple[str, ...]:
    """Readable (and executable) in the modes that work on the user's files: every
    top-level directory but /dev, and the ordinary devices (Landlock cannot carve a
    path out of a rule, so / is listed entry by entry). Hidden paths are covered by
    the mount view; a directory made at / later is readable once the executor restarts."""
    out = []
    for name in sorted(os.listdir("/")):
        path = os.path.realpath("/" + name)
        if path == "/dev" or path.startswith("/dev/") or not os.path.isdir(path):
            continue
        out.append(path)
    out += [d for d in _TREE_DEVICES if os.path.exists(d)]
    return tuple(dict.fromkeys(out))
