"""What of the host a sandboxed tool sees: a private /run, and /sys and /proc/sys reduced.

`/run` holds the host daemons' unix sockets (D-Bus, the journal's `/dev/log`,
databases); inside it is an empty tmpfs. `/sys` names the NICs and shows the
whole cgroup tree (other calls', other hosts'); `/proc/sys` the kernel's
settings. Both become empty read-only tmpfs keeping only what ordinary tools
read: the CPUs (`nproc`, `os.cpu_count()`, `ps`, `lscpu`), the NUMA nodes
(`ps`, `top`), and a few sysctls (`ps`: pid_max; `id`: ngroups_max; `top`:
osrelease). The launcher applies it in its mount namespace
(`launcher.private_run`, `launcher.mask_host_info`); `bwrap_args` says the same
to bubblewrap.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

PRIVATE_RUN = ("/run", "/var/run")
"""Covered by an empty tmpfs (a /var/run symlink to /run needs nothing more)."""

SYS_KEEP = ("devices/system/cpu", "devices/system/node")
PROC_SYS_KEEP = (
    "kernel/pid_max", "kernel/ngroups_max", "kernel/osrelease", "kernel/ostype",
    "vm/overcommit_memory",
)
HOST_INFO_MASKS = (("/sys", SYS_KEEP), ("/proc/sys", PROC_SYS_KEEP))
"""Each masked tree and the entries (relative) kept in it, read-only."""


@functools.cache
def _real_run_dirs() -> tuple[str, ...]:
    return tuple(p for p in PRIVATE_RUN if os.path.isdir(p) and not os.path.islink(p))


def private_run(cwd: Path) -> list[str]:
    """The run directories to cover for a call in `cwd` (never one holding the workspace)."""
    return [p for p in _real_run_dirs() if not cwd.is_relative_to(p)]


def bwrap_args(tmpfs_size: str) -> list[str]:
    """bubblewrap options for the same view: its root has no /sys or /run at all, so
    this adds an empty private /run, the CPUs, and /proc/sys reduced."""
    args = ["--size", str(size_bytes(tmpfs_size)), "--tmpfs", "/run",
            "--symlink", "../run", "/var/run"]
    for rel in SYS_KEEP:
        args += ["--ro-bind-try", f"/sys/{rel}", f"/sys/{rel}"]
    args += ["--tmpfs", "/proc/sys"]
    for rel in PROC_SYS_KEEP:
        args += ["--ro-bind-try", f"/proc/sys/{rel}", f"/proc/sys/{rel}"]
    args += ["--remount-ro", "/proc/sys"]
    return args


def size_bytes(size: str) -> int:
    """A tmpfs size ("64m") in bytes, for bubblewrap's --size."""
    units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    unit = units.get(size[-1:].lower(), 1)
    return int(size[:-1] if unit > 1 else size) * unit
