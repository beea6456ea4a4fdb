"""Which sandbox layers this machine has: the fail-closed check and `oploop status`."""

from __future__ import annotations

import functools
import os

from . import bwrap, seccomp
from .cgroups import Hierarchies
from .launcher import landlock_abi
from .workspaces import loop_quota_missing

_NAMESPACES = ("mnt", "net", "ipc", "uts", "pid")


@functools.cache
def machine_layers() -> dict[str, str]:
    """Each layer of `policy.LAYERS` → "" when this machine has it, else why not.

    Checked once per process: none of it changes while an executor runs.
    """
    root = os.geteuid() == 0
    hier = Hierarchies.discover()
    limits = hier.limits_supported()
    missing_limits = [c for c in ("memory", "pids", "cpu") if c not in limits]
    out = {
        "cgroup": (
            f"no writable cgroup for {', '.join(missing_limits)}" if missing_limits else ""
        ),
        "cgroup_kill": "" if hier.can_kill() else "neither cgroup.kill (v2) nor a v1 freezer",
        "setsid": "",
        "pdeathsig": "",
        "rlimits": "",
        "namespaces": _namespaces_missing(root),
        "uid": "" if root else "the executor is not root, so it cannot switch uid",
        "no_new_privs": "",
        "landlock": "" if landlock_abi() > 0 else "Landlock is absent or disabled in this kernel",
        "seccomp": seccomp.available()[1],
    }
    return out


def _namespaces_missing(root: bool) -> str:
    absent = [n for n in _NAMESPACES if not os.path.exists(f"/proc/self/ns/{n}")]
    if absent:
        return f"kernel lacks namespace(s): {', '.join(absent)}"
    if not root:
        return "creating namespaces without a user namespace needs root"
    return ""


def describe(layer: str, reason: str) -> str:
    """The status text of one layer: "active" (with detail) or "missing: reason"."""
    if reason:
        return f"missing: {reason}"
    detail = _details().get(layer)
    return f"active ({detail})" if detail else "active"


@functools.cache
def _details() -> dict[str, str]:
    hier = Hierarchies.discover()
    limits = hier.limits_supported()
    return {
        "cgroup": ", ".join(f"{c} {v}" for c, v in sorted(limits.items())),
        "cgroup_kill": hier.can_kill(),
        "landlock": f"ABI {landlock_abi()}",
        "namespaces": "mount, net, ipc, uts, pid",
    }


def layers_report() -> dict[str, str]:
    """Layer → "active…" or "missing: reason", for every layer and for bubblewrap."""
    report = {name: describe(name, reason) for name, reason in machine_layers().items()}
    path, why = bwrap.find()
    report["bubblewrap"] = (
        f"available ({path}; used by policies with backend = \"bwrap\")" if path
        else f"missing: {why}"
    )
    quota = loop_quota_missing()
    report["workspace_quota"] = (
        f"missing: {quota}" if quota else "available (an ext4 image per session, loop-mounted)"
    )
    return report
