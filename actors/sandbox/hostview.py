"""What of the host a sandboxed tool sees: a private /run, and /sys and /proc/sys reduced.

`/run` holds the host daemons' unix sockets (D-Bus, the journal's `/dev/log`,
databases); inside it is an empty tmpfs. `/sys` names the NICs and shows the
whole cgroup tree (other calls', other hosts'); `/proc/sys` the kernel's
settings. Both become empty read-only tmpfs keeping only what ordinary tools
read, copied: the CPUs online (`os.cpu_count()`, `getconf`, `ps`), and a few
sysctls (`ps`: pid_max; `id`: ngroups_max; `top`: osrelease). The launcher
applies it in its mount namespace (`launcher.private_run`,
`launcher.mask_host_info`); `bwrap_args` says the same to bubblewrap, with
read-only binds of the same files.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

PRIVATE_RUN = ("/run", "/var/run")
"""Covered by an empty tmpfs (a /var/run symlink to /run needs nothing more)."""

SYS_KEEP = (
    "devices/system/cpu/online", "devices/system/cpu/possible", "devices/system/cpu/present",
)
PROC_SYS_KEEP = (
    "kernel/pid_max", "kernel/ngroups_max", "kernel/osrelease", "kernel/ostype",
    "vm/overcommit_memory",
)
_KEEP_CAP = 4096  # bytes kept of each file (they hold a line each)


@functools.cache
def host_info_masks() -> tuple[tuple[str, tuple[tuple[str, bytes], ...]], ...]:
    """Each masked tree and copies of the files kept in it, read once per executor:
    none of them changes while it runs."""
    out = []
    for root, keep in (("/sys", SYS_KEEP), ("/proc/sys", PROC_SYS_KEEP)):
        files = []
        for rel in keep:
            try:
                with open(os.path.join(root, rel), "rb") as f:
                    files.append((rel, f.read(_KEEP_CAP)))
            except OSError:
                continue  # not on this machine: the tools fall back
        out.append((root, tuple(files)))
    return tuple(out)


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
