"""A sandboxed call's launch spec: what it is made of, and `build_spec` that assembles it.

The spec `Sandbox` hands the launcher (`launcher.py`), computed in the executor
from the policy, the machine's layers and the call's view: the namespaces to
unshare, the rlimits, the paths hidden under a tmpfs, the copies of /sys and
/proc/sys a tool may read, the system paths a read may see, Landlock's rules,
the seccomp filter and the tool's environment; `Extra` adds what an MCP server
may use beyond its policy.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import bwrap, hostview, modes, seccomp
from . import launcher as launcher_mod
from .cgroups import CallCgroup, Hierarchies, Limits
from .policy import LAYERS, RW_DEVICES, SYSTEM_RO_PATHS, Policy
from .refusal import uses_bwrap

_PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
TMPFS_SIZE = "64m"
"""The size of each private tmpfs (/tmp, /var/tmp, /dev/shm, /run): a fill stops there."""
_HOMES = ("/root", "/home")
"""Hidden from every tool (tmpfs): root's and the users' homes, whatever their modes."""
#: The file operations that write (the others read): in the call's working directory.
WRITING_OPS = ("write", "memory")
_SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _unshare_flags(offline: bool) -> int:
    flags = (
        launcher_mod.CLONE_NEWNS | launcher_mod.CLONE_NEWIPC | launcher_mod.CLONE_NEWUTS
        | launcher_mod.CLONE_NEWPID | launcher_mod.CLONE_NEWCGROUP
    )
    return flags | launcher_mod.CLONE_NEWNET if offline else flags


def _rlimits(policy: Policy, as_user: bool) -> list[tuple[str, int, int]]:
    limits = [
        ("fsize", policy.file_bytes, policy.file_bytes),
        ("nofile", policy.nofile, policy.nofile),
        ("core", 0, 0),
    ]
    if policy.cpu_s > 0:  # 0: none (a long-lived MCP server; its cgroup caps the rate)
        # Soft: SIGXCPU a process can see; hard a second later: SIGKILL.
        limits.append(("cpu", policy.cpu_s, policy.cpu_s + 1))
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
#: blocks would bypass every hidden path; never /dev/pts: the terminals the user types
#: in, which a tool running as the user could read keystrokes from).
_TREE_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
                 "/dev/tty")


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


def pinned(writable: list[str], hidden: list[str]) -> list[str]:
    """The directories strictly between a writable path and a hidden path beneath it,
    the shallowest first: bound onto themselves in the call's view (`mounts.pin`), so
    that no tool renames a hidden path out from under its hiding."""
    out: set[str] = set()
    for root in (w.rstrip("/") for w in writable):
        for path in hidden:
            if not path.startswith(root + "/"):
                continue
            parent = root
            for part in path[len(root) + 1:].strip("/").split("/")[:-1]:
                parent = f"{parent}/{part}"
                out.add(parent)
    return sorted(out, key=lambda p: (p.count("/"), p))


def private_tmp(cwd: Path, view: modes.WorkView | None) -> list[str]:
    """The private temporary directories a command may write: in read-only mode never
    one holding the working directory (bound back inside it: a rule on it would make
    the working directory writable too)."""
    if view is None or view.mode != modes.READ_ONLY:
        return list(_PRIVATE_TMP)
    return [p for p in _PRIVATE_TMP if not cwd.is_relative_to(p)]


def build_spec(
    policy: Policy,
    cwd: Path,
    call: CallCgroup | None,
    call_uid: int,
    *,
    layers: dict[str, str],
    hier: Hierarchies,
    executor_limits: Limits,
    hide: tuple[str, ...],
    argv: list[str] | None,
    op: tuple[str, dict[str, Any]] | None,
    readable: tuple[str, ...] = (),
    view: modes.WorkView | None = None,
) -> dict[str, object]:
    """The launch spec of one call (`launcher.py` reads it): run `argv`, or the file
    operation `op`, under `policy` with the machine's `layers` (name -> "" when
    present), as `call_uid`, in `call`'s cgroup (capped by `executor_limits`),
    with the `hide` paths hidden, in the call's `view`."""
    on = {layer for layer in LAYERS if policy.applies(layer) and not layers.get(layer)}
    reading = op is not None and op[0] not in WRITING_OPS
    offline = policy.network == "none" or reading
    ns = "namespaces" in on
    uid = call_uid if "uid" in on else -1
    # The user's own files (workspace-write, read-only), or only the system's (scratch).
    tree = view is not None and not view.confined
    unshare = _unshare_flags(offline) if ns else 0
    if reading and ns:
        # A read needs no network, ipc or uts namespace (seccomp refuses it sockets):
        # only the mounts (what it may see) and the pid namespace (a fresh /proc).
        unshare = launcher_mod.CLONE_NEWNS | launcher_mod.CLONE_NEWPID
    # Only those present now (one made during the call is the call's own doing): each
    # costs the launcher a few stats and a pass over the mount table.
    hidden = [p for p in view.hidden if os.path.lexists(p)] if view is not None else []
    homes = [] if tree else list(_HOMES)
    spec: dict[str, object] = {
        # On the user's files these three hold the rest out of reach (`check_layers`): never
        # skipped when they fail at launch, whatever the policy says.
        "required": sorted({layer for layer in LAYERS if policy.requires(layer)}
                           | ({"namespaces", "landlock", "uid"} if tree else set())),
        "cgroup": (call.launch_spec(hier, _within(policy.limits, executor_limits))
                   if call else None),
        "pdeathsig": "pdeathsig" in on,
        "ppid": os.getpid(),
        # A session uid's RLIMIT_NPROC bounds that session alone; the user's own uid
        # counts all their processes on the machine: the call's cgroup bounds it.
        "rlimits": _rlimits(policy, uid >= 0 and not tree) if "rlimits" in on else [],
        "unshare": unshare,
        "hide": [(p, "0755") for p in homes] + [(p, "1777") for p in _PRIVATE_TMP]
        + [(p, "0755") for p in hide] + [(p, "0000") for p in hidden],
        "secret": list(hide) + hidden,
        "keep": [str(cwd)] + ([p for p in view.writable if p != str(cwd)] if tree else []),
        "readable": list(readable) if reading and not tree else [],
        "tmpfs_size": TMPFS_SIZE,
        "private_run": hostview.private_run(cwd) if ns else [],
        "mask": _masks() if ns else [],
        # A read takes absolute paths, and its session may have no workspace yet.
        "cwd": "/" if reading else str(cwd),
        "uid": uid,
        "gid": view.gid if tree and uid >= 0 else uid,
        "landlock": None,
        "seccomp": (seccomp.build(network=not offline, unix=policy.unix_sockets)
                    if "seccomp" in on else None),
    }
    if uid >= 0 and ns and (view is None or view.confined or not view.user_known):
        # The tool user has a name and a home in its view (`whoami`, `id -un`).
        name = view.user if view is not None else "sandbox"
        home = view.home if view is not None and view.home else str(cwd)
        gid = view.gid if tree and view is not None else uid
        spec["passwd"] = modes.passwd_lines(uid, gid, name, home)
    if "landlock" in on:
        rw: list[str] = []
        if op is None or op[0] in WRITING_OPS:
            rw += list(view.writable) if tree else [str(cwd)]
        if op is None:
            rw += list(RW_DEVICES) + (private_tmp(cwd, view) if ns else [])
        if tree:
            ro = list(_tree_ro()) + list(policy.ro_paths)
        else:
            system = (*_reads_system_ro(), *_PRIVATE_TMP) if reading else SYSTEM_RO_PATHS
            ro = list(system) + list(policy.ro_paths) + ([str(cwd)] if reading else [])
        # Listing is allowed everywhere in those modes (`ls /`): names only; files
        # under /dev stay unreadable, hidden paths are empty.
        spec["landlock"] = {"ro": ro, "rw": rw, "deny_tcp": offline,
                            "ls": ["/"] if tree else []}
    if op is not None:
        spec[op[0]] = op[1]
        return spec
    if ns:
        writable = list(view.writable) if tree else [str(cwd)]
        spec["pin"] = pinned(writable, [p for p, _ in spec["hide"]])  # type: ignore[misc]
        # Landlock leaves a file's mode, owner, times and xattrs to the mounts: on the
        # user's files, read-only but where the tool may write (`mounts.read_only_but`).
        spec["read_only_but"] = writable if tree else None
    user = view.user if view is not None and uid >= 0 else "sandbox"
    home = view.home if view is not None and view.home and uid >= 0 else str(cwd)
    env = {
        "PATH": _SANDBOX_PATH, "HOME": home, "TMPDIR": (private_tmp(cwd, view) or ["/tmp"])[0],
        "LANG": "C.UTF-8",
        "TERM": "dumb", "USER": user, "LOGNAME": user,
        "OPLOOP_SANDBOX": view.mode if view is not None else modes.SCRATCH,
        "OPLOOP_SANDBOX_ID": os.urandom(4).hex(),
    }
    spec["argv"] = argv or ["/bin/true"]
    spec["env"] = env
    if uses_bwrap(policy, writing=False):
        # bwrap makes the namespaces and the file system view; Landlock would
        # forbid the mounts it needs, and its own seccomp fd carries our filter.
        spec["unshare"] = 0
        spec["landlock"] = None
        spec["bwrap"] = bwrap.argv(bwrap.find()[0], policy, str(cwd), env, TMPFS_SIZE)
    return spec


@dataclass(frozen=True, slots=True)
class Extra:
    """What a launch may see and use beyond its policy (an MCP server's `[mcp.NAME]`):
    environment variables added to the sandbox's own, and paths bound into its mount
    view, read-only (`ro`) or writable (`rw`) under Landlock."""

    env: tuple[tuple[str, str], ...] = ()
    ro: tuple[str, ...] = ()
    rw: tuple[str, ...] = ()

    def apply(self, spec: dict[str, Any]) -> None:
        """Add these to a launch spec made by `build_spec` for an `argv`."""
        if "env" in spec:
            spec["env"] = {**spec["env"], **dict(self.env)}
        spec["keep"] = list(spec["keep"]) + [p for p in (*self.ro, *self.rw)
                                             if p not in spec["keep"]]
        landlock = spec.get("landlock")
        if landlock:
            landlock["ro"] = list(landlock["ro"]) + list(self.ro)
            landlock["rw"] = list(landlock["rw"]) + list(self.rw)
        if spec.get("read_only_but") is not None:  # (no view is given a server: never so)
            spec["read_only_but"] = list(spec["read_only_but"]) + list(self.rw)
