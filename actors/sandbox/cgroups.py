"""Per-call cgroups: limits (memory, pids, cpu), and killing a whole tree at once.

Both cgroup versions are used where mounted, as on a hybrid host: v1 controllers
carry the limits (and the freezer), the v2 tree carries `cgroup.kill`. Every
call gets `<own cgroup>/oploop-sandbox/ex-<pid>-<start>/c<n>` in each hierarchy,
nested under the executor's own cgroup so every limit above still applies.
The executor-level directory names its owner, so a new executor can tell
leftovers of a dead one from the live calls of a sibling, and carries the
executor's own caps (`executor_limits`), above the per-call ones: 32 slots of
512 MB each cannot take the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from actors.procstart import start_ticks

log = logging.getLogger("oploop.sandbox")

ROOT_NAME = "oploop-sandbox"
CONTROLLERS = ("memory", "pids", "cpu", "freezer")
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True)
class Limits:
    """What one call may use; 0 means no limit of that kind."""

    memory_bytes: int = 512 * 1024 * 1024
    pids: int = 256
    cpu: float = 1.0  # cores (a CFS quota)


EXECUTOR_MEMORY_SHARE = 0.4
"""Of the machine's RAM, what one executor's calls may hold together (a host runs two)."""
EXECUTOR_CPU_SHARE = 0.75
"""Of the machine's cores, what one executor's calls may use together (at least one)."""
EXECUTOR_PIDS_MAX = 4096
"""Processes of one executor's calls together, at most (and at most pid_max / 4)."""


@functools.cache
def executor_limits() -> Limits:
    """The default caps over all calls of one executor, derived from this machine."""
    try:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    except (OSError, ValueError):
        pid_max = 32768
    # (the RAM psutil.virtual_memory().total reports, MemTotal, from the same sysinfo)
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    memory = int(total * EXECUTOR_MEMORY_SHARE)
    cpu = max(1.0, round((os.cpu_count() or 1) * EXECUTOR_CPU_SHARE, 2))
    return Limits(memory_bytes=memory, pids=min(EXECUTOR_PIDS_MAX, pid_max // 4), cpu=cpu)


@dataclass(frozen=True, slots=True)
class Hierarchies:
    """Where this process's cgroups are: the v2 dir and each v1 controller's dir."""

    v2: Path | None
    v2_controllers: frozenset[str]
    v1: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def discover(cls) -> Hierarchies:
        """Read /proc/self/cgroup and mountinfo; keep only hierarchies we can write."""
        mounts = _cgroup_mounts()
        v2: Path | None = None
        v1: dict[str, Path] = {}
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError:
            lines = []
        for line in lines:
            hid, ctrls, rel = line.split(":", 2)
            if hid == "0" and "cgroup2" in mounts:
                v2 = Path(mounts["cgroup2"] + rel)
                continue
            for ctrl in ctrls.split(","):
                if ctrl in CONTROLLERS and ctrl in mounts:
                    v1[ctrl] = Path(mounts[ctrl] + rel)
        if v2 is not None and not _writable(v2):
            v2 = None
        v1 = {c: p for c, p in v1.items() if _writable(p)}
        v2_ctrls: frozenset[str] = frozenset()
        if v2 is not None:
            with contextlib.suppress(OSError):
                v2_ctrls = frozenset((v2 / "cgroup.controllers").read_text().split())
        return cls(v2, v2_ctrls, v1)

    def can_kill(self) -> str:
        """How a tree can be killed at once: "cgroup.kill", "freezer", or "" (no way)."""
        # A root cgroup has no cgroup.kill file, but its children do (kernel >= 5.14).
        if self.v2 is not None and (
            (self.v2 / "cgroup.kill").exists() or _kernel_at_least(5, 14)
        ):
            return "cgroup.kill"
        return "freezer" if "freezer" in self.v1 else ""

    def limits_supported(self) -> dict[str, str]:
        """For each limit: the hierarchy that enforces it ("v1"/"v2"), missing if absent."""
        out: dict[str, str] = {}
        for ctrl in ("memory", "pids", "cpu"):
            if self.v2 is not None and ctrl in self.v2_controllers:
                out[ctrl] = "v2"
            elif ctrl in self.v1:
                out[ctrl] = "v1"
        return out


def _cgroup_mounts() -> dict[str, str]:
    """Mount points: "cgroup2" → path, and each v1 controller → path."""
    out: dict[str, str] = {}
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        parts = right.split()
        if len(fields) < 5 or len(parts) < 3:
            continue
        fstype, opts = parts[0], parts[2]
        point = fields[4]
        if fstype == "cgroup2":
            out.setdefault("cgroup2", point)
        elif fstype == "cgroup":
            for opt in opts.split(","):
                if opt in CONTROLLERS:
                    out.setdefault(opt, point)
    return out


def _writable(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def _read(path: Path, default: str) -> str:
    try:
        return path.read_text()
    except OSError:
        return default


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        parts = os.uname().release.split(".")
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (ValueError, IndexError):
        return False


@dataclass(frozen=True, slots=True)
class CallCgroup:
    """The cgroup directories of one call, and how to kill everything in them."""

    dirs: tuple[Path, ...]  # one per hierarchy (v2 first when present)
    v2: Path | None
    freezer: Path | None

    def launch_spec(self, hier: Hierarchies, limits: Limits) -> dict[str, object]:
        """What the launcher does to join: the dirs to make, limit files, procs files."""
        files: list[tuple[str, str]] = []
        supported = hier.limits_supported()
        for ctrl, where in supported.items():
            base = self.v2 if where == "v2" else self._dir_of(hier, ctrl)
            if base is None:
                continue
            files.extend(_limit_files(ctrl, where, base, limits))
        return {
            "mkdir": [str(d) for d in self.dirs],
            "limits": files,
            "procs": [str(d / "cgroup.procs") for d in self.dirs],
        }

    def _dir_of(self, hier: Hierarchies, ctrl: str) -> Path | None:
        root = hier.v1.get(ctrl)
        return next((d for d in self.dirs if root is not None and d.is_relative_to(root)), None)

    def pids(self) -> list[int]:
        """Every process in the call's cgroups now."""
        found: set[int] = set()
        for d in self.dirs:
            text = _read(d / "cgroup.procs", "")
            found.update(int(p) for p in text.split())
        return sorted(found)

    def kill(self) -> None:
        """SIGKILL every process in the call's cgroups, at once where the kernel can."""
        if self.v2 is not None and (self.v2 / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (self.v2 / "cgroup.kill").write_text("1")
                return
        if self.freezer is not None and self.freezer.exists():
            # Frozen processes cannot fork, so a tree cannot outrun the kill loop.
            state = self.freezer / "freezer.state"
            with contextlib.suppress(OSError):
                state.write_text("FROZEN")
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                state.write_text("THAWED")
            return
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def empty(self) -> bool:
        """True when no process is left in any of the call's cgroups."""
        return not self.pids()

    async def wait_empty(self, timeout_s: float) -> bool:
        """Wait until empty (killing again meanwhile); False if `timeout_s` passed first."""
        deadline = time.monotonic() + timeout_s
        delay = 0.0005
        while not self.empty():
            if time.monotonic() > deadline:
                return False
            self.kill()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)
        return True

    def remove(self) -> bool:
        """Remove the (empty) directories; False if one is still busy."""
        ok = True
        for d in self.dirs:
            try:
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                ok = False
        return ok


def _limit_files(ctrl: str, where: str, base: Path, limits: Limits) -> list[tuple[str, str]]:
    if ctrl == "memory" and limits.memory_bytes > 0:
        name = "memory.max" if where == "v2" else "memory.limit_in_bytes"
        files = [(str(base / name), str(limits.memory_bytes))]
        if where == "v2":
            files.append((str(base / "memory.swap.max"), "0"))
        return files
    if ctrl == "pids" and limits.pids > 0:
        return [(str(base / "pids.max"), str(limits.pids))]
    if ctrl == "cpu" and limits.cpu > 0:
        quota = max(1000, int(limits.cpu * _CPU_PERIOD_US))
        if where == "v2":
            return [(str(base / "cpu.max"), f"{quota} {_CPU_PERIOD_US}")]
        return [
            (str(base / "cpu.cfs_period_us"), str(_CPU_PERIOD_US)),
            (str(base / "cpu.cfs_quota_us"), str(quota)),
        ]
    return []


class CgroupTree:
    """This executor's cgroup subtree: one directory per call, leftovers swept at start."""

    def __init__(self, hier: Hierarchies, pid: int | None = None) -> None:
        self.hier = hier
        pid = os.getpid() if pid is None else pid
        self.owner = f"ex-{pid}-{_start_time(pid)}"
        self._next = 0
        self._roots = self._hierarchy_roots()

    def _hierarchy_roots(self) -> list[Path]:
        roots = []
        if self.hier.v2 is not None:
            roots.append(self.hier.v2 / ROOT_NAME)
        for ctrl in sorted(set(self.hier.v1)):
            root = self.hier.v1[ctrl] / ROOT_NAME
            if root not in roots:
                roots.append(root)
        return roots

    def available(self) -> bool:
        """Whether any writable hierarchy exists."""
        return bool(self._roots)

    def new_call(self) -> CallCgroup:
        """Directories for the next call (created by the launcher when it joins)."""
        self._next += 1
        name = f"c{self._next}"
        dirs = tuple(root / self.owner / name for root in self._roots)
        v2 = dirs[0] if self.hier.v2 is not None else None
        freezer = None
        if "freezer" in self.hier.v1:
            freezer = self.hier.v1["freezer"] / ROOT_NAME / self.owner / name
        return CallCgroup(dirs, v2, freezer)

    def calls(self) -> list[Path]:
        """The call directories of this executor present now, in every hierarchy."""
        found: list[Path] = []
        for root in self._roots:
            with contextlib.suppress(OSError):
                found.extend(d for d in (root / self.owner).iterdir() if d.is_dir())
        return found

    def prepare(self, limits: Limits | None = None) -> None:
        """Create this executor's directories (the launcher only makes the call's own)
        and write its caps over all calls (`limits`) where each controller lives.

        Raises OSError if a cap cannot be written: the calls would run uncapped.
        """
        for root in self._roots:
            (root / self.owner).mkdir(parents=True, exist_ok=True)
        if limits is None:
            return
        for path, value in self.limit_files(limits):
            Path(path).write_text(value)

    def limit_files(self, limits: Limits) -> list[tuple[str, str]]:
        """The (file, value) pairs that cap this executor's directory at `limits`."""
        files: list[tuple[str, str]] = []
        for ctrl, where in self.hier.limits_supported().items():
            if where == "v2" and self.hier.v2 is not None:
                base = self.hier.v2 / ROOT_NAME / self.owner
            else:
                base = self.hier.v1[ctrl] / ROOT_NAME / self.owner
            files.extend(_limit_files(ctrl, where, base, limits))
        return files

    def sweep_leftovers(self) -> int:
        """Kill what executors that are gone left behind, and remove their dirs; count killed."""
        killed = 0
        owners: set[str] = set()
        for root in self._roots:
            with contextlib.suppress(OSError):
                owners.update(p.name for p in root.iterdir() if p.is_dir())
        for owner in sorted(owners):
            if owner == self.owner or _owner_alive(owner):
                continue
            killed += self._sweep_owner(owner)
        return killed

    def _sweep_owner(self, owner: str) -> int:
        calls: set[str] = set()
        for root in self._roots:
            with contextlib.suppress(OSError):
                calls.update(p.name for p in (root / owner).iterdir() if p.is_dir())
        killed = 0
        for name in sorted(calls):
            dirs = tuple(r / owner / name for r in self._roots if (r / owner / name).exists())
            v2 = self.hier.v2 / ROOT_NAME / owner / name if self.hier.v2 is not None else None
            fz = None
            if "freezer" in self.hier.v1:
                fz = self.hier.v1["freezer"] / ROOT_NAME / owner / name
            call = CallCgroup(dirs, v2 if v2 in dirs else None, fz if fz in dirs else None)
            left = call.pids()
            killed += len(left)
            if left:
                log.warning("killing %d process(es) left by executor %s", len(left), owner)
            deadline = time.monotonic() + 2
            while not call.empty() and time.monotonic() < deadline:
                call.kill()
                time.sleep(0.002)
            call.remove()
        for root in self._roots:
            with contextlib.suppress(OSError):
                (root / owner).rmdir()
        return killed

    def close(self) -> None:
        """Remove this executor's directories, with any call's still there (its processes
        killed first): a call whose clean-up never ran (its task cancelled mid-way) must
        not outlive the executor, as only a later executor's sweep would remove it."""
        self._sweep_owner(self.owner)


# An executor's start and existence are read from /proc, not through psutil: these are
# all an executor asked of it, at its start, and psutil cost every executor ~0.9 MiB
# resident. The start is the value psutil's `Process(pid).create_time() * 100` gives,
# computed alike, so the directories of executors started before this code still match.


def _start_time(pid: int) -> int:
    """`pid`'s start in hundredths of a second since the epoch (0: no such process)."""
    ticks = start_ticks(pid)
    if ticks is None:
        return 0
    try:
        return int((ticks / os.sysconf("SC_CLK_TCK") + _boot_time()) * 100)
    except (OSError, ValueError):
        return 0


@functools.cache
def _boot_time() -> float:
    with open("/proc/stat", "rb") as f:
        for line in f:
            if line.startswith(b"btime"):
                return float(line.split()[1])
    raise ValueError("no btime line in /proc/stat")


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's: it exists)
        return True
    return True


def _owner_alive(owner: str) -> bool:
    try:
        _, pid, start = owner.split("-")
        return _start_time(int(pid)) == int(start) and _exists(int(pid))
    except ValueError:
        return False
