"""Sandbox policies: what a risky tool may touch and use, and which layers it needs.

A policy is fail-closed: every layer in `LAYERS` is required unless the
configuration lowers it, either to `optional` (used where the machine has it)
or `off` (never applied). The configuration is `$OPLOOP_HOME/sandbox.toml`:

    [sandbox]
    backend = "launcher"        # or "bwrap": a hardened bubblewrap makes the namespaces
    uid_range = [1879048192, 1879113727]  # one uid per session from here (uids.py)
    # uid = 64000               # instead: every session as this one uid (no isolation)
    optional = ["landlock"]     # may be missing on this machine
    off = []                    # never applied (e.g. "uid" to run tools as root)
    ro_paths = ["/opt/tool"]    # extra read-only paths (a toolchain, say)
    executor_memory_mb = 4096   # caps over all calls of one executor; by default
    executor_pids = 4096        #   derived from the machine (cgroups.executor_limits)
    executor_cpu = 1.5          #   cores

    [tools.shell]               # per tool; any Limits/Policy field
    network = "none"            # or "host"; "none": no socket() at all, unix ones included
    unix_sockets = false        # true: AF_UNIX allowed offline (Python's forkserver, local
                                #   test servers); only sockets the tool can see: /run,
                                #   /tmp are private, but e.g. /var/lib's are reachable
    memory_mb = 512
    pids = 256
    cpu = 1.0                   # cores
    cpu_s = 60                  # CPU seconds per process (RLIMIT_CPU; 0: none)
    file_mb = 256               # largest file (RLIMIT_FSIZE)
    nofile = 256
    timeout_s = 600

    [tools.read_file]           # the confined reads (and [tools.list_dir]): same keys;
    ro_paths = ["/srv/logs"]    # by default the system paths, the session's cwd and
                                # workspace; never /root, /home, an oploop home or keys

    [workspaces]                # each session's disk (actors/sandbox/workspaces.py)
    quota = "loop"              # an ext4 image per session, loop-mounted; or "off"
    size_mb = 1024              # per session
    total_mb = 32768            # all workspaces together (0: no cap)
    reserve_mb = 1024           # refuse launches with less free on the disk
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .cgroups import Limits, executor_limits
from .workspaces import WorkspaceQuota

LAYERS = (
    "cgroup", "cgroup_kill", "setsid", "pdeathsig", "rlimits", "namespaces",
    "uid", "no_new_privs", "landlock", "seccomp",
)
"""Every layer the launcher applies, in order; all are required by default."""

SYSTEM_RO_PATHS = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
    "/proc", "/sys", "/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
)
"""Readable (and executable) in the sandbox: the system, not the users' homes."""

RW_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty")

READ_TOOLS = ("read_file", "list_dir")
"""Tools that only read: they run confined too, without a cgroup of their own by default
(the code in the sandbox is oploop's, with bounded memory, not the model's)."""

DEFAULT_UID_RANGE = (0x7000_0000, 0x7000_FFFF)
"""The sandbox uids (and gids) when the configuration names none: 65,536 uids above
every range systemd hands out (containers end at 0x6FFFFFFF) and below 2^31, which
some tools misread as negative; owned by no user or subordinate-uid range by default."""

_UID_MAX = 0xFFFF_FFFE  # (uid_t)-1 means "unchanged" to setresuid and chown


class PolicyError(ValueError):
    """The sandbox configuration is malformed; the message names the key."""


@dataclass(frozen=True, slots=True)
class Policy:
    """How one risky tool runs: limits, network, timeout, and the layers it needs."""

    network: str = "none"  # "none": loopback-less net namespace, no socket(); "host"
    unix_sockets: bool = False  # offline, still allow AF_UNIX sockets (see the example)
    limits: Limits = field(default_factory=Limits)
    cpu_s: int = 60
    file_bytes: int = 256 * 1024 * 1024
    nofile: int = 256
    address_space: int = 0  # RLIMIT_AS; 0 = none (it breaks many runtimes' reservations)
    timeout_s: float = 600.0
    uid_range: tuple[int, int] = DEFAULT_UID_RANGE  # each session one uid from here
    ro_paths: tuple[str, ...] = ()
    optional: frozenset[str] = frozenset()
    off: frozenset[str] = frozenset()
    backend: str = "launcher"  # "bwrap": bubblewrap replaces namespaces, mounts and Landlock
    #: What serves a persistent reader's calls (`read_file`, `list_dir`): "thread", a
    #: thread of the executor in the reader's lockdown (`readthreads.py`), or "process",
    #: the locked-down reader process itself (a hop more per read; an address space of
    #: its own).
    reader: str = "thread"

    def __post_init__(self) -> None:
        if self.network not in ("none", "host"):
            raise PolicyError(f"network must be 'none' or 'host', got {self.network!r}")
        if self.backend not in ("launcher", "bwrap"):
            raise PolicyError(f"backend must be 'launcher' or 'bwrap', got {self.backend!r}")
        if self.reader not in ("thread", "process"):
            raise PolicyError(f"reader must be 'thread' or 'process', got {self.reader!r}")
        first, last = self.uid_range
        if not 0 < first <= last <= _UID_MAX:
            raise PolicyError(f"uid_range must be [first, last] with 0 < first <= last "
                              f"<= {_UID_MAX}, got {list(self.uid_range)}")
        for name in self.optional | self.off:
            if name not in LAYERS:
                raise PolicyError(f"unknown sandbox layer {name!r} (known: {', '.join(LAYERS)})")

    @property
    def uid(self) -> int:
        """The first uid of the range (the uid of a call outside any session workspace)."""
        return self.uid_range[0]

    def applies(self, layer: str) -> bool:
        """Whether the launcher tries `layer` at all."""
        return layer not in self.off

    def requires(self, layer: str) -> bool:
        """Whether a missing `layer` refuses the call."""
        return layer not in self.off and layer not in self.optional

    def lowered(self, **changes: Any) -> Policy:
        """A copy with some fields changed (e.g. `off=frozenset({"uid"})`)."""
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """The whole configuration: the default policy and per-tool ones."""

    default: Policy = field(default_factory=Policy)
    tools: dict[str, Policy] = field(default_factory=dict)
    executor: Limits | None = None  # caps over all calls; None: derived from the machine
    workspaces: WorkspaceQuota = field(default_factory=WorkspaceQuota)

    def policy(self, tool: str) -> Policy:
        """The policy of `tool` (the default one if it has none of its own; for a read
        tool, the default one without the cgroup layers)."""
        found = self.tools.get(tool)
        if found is not None:
            return found
        return reading(self.default) if tool in READ_TOOLS else self.default

    @classmethod
    def load(cls, home: Path) -> SandboxConfig:
        """Read `home/sandbox.toml`; no file means the strict defaults."""
        path = home / "sandbox.toml"
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise PolicyError(f"{path}: {exc}") from exc
        return cls.from_dict(data, str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "sandbox config") -> SandboxConfig:
        """Build from the parsed TOML; unknown keys are errors, not silently ignored."""
        unknown = set(data) - {"sandbox", "tools", "workspaces"}
        if unknown:
            raise PolicyError(f"{where}: unknown section(s) {sorted(unknown)}")
        top = dict(data.get("sandbox", {}))
        executor = _executor_limits(top, f"{where} [sandbox]")
        base = _policy(Policy(), top, f"{where} [sandbox]", top=True)
        tools = {
            name: _policy(reading(base) if name in READ_TOOLS else base, table,
                          f"{where} [tools.{name}]", top=False)
            for name, table in data.get("tools", {}).items()
        }
        try:
            workspaces = WorkspaceQuota.from_table(data.get("workspaces", {}))
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"{where} [workspaces]: {exc}") from exc
        return cls(base, tools, executor, workspaces)


def reading(base: Policy) -> Policy:
    """The policy of a read tool derived from `base`: no cgroup (a call holds at most
    its cap in memory, and its launcher's death takes it down). Kept per `base` object
    (asked for at every read, of the same policy; by identity: hashing a policy costs
    more than the lookup should)."""
    found = _READING.get(id(base))
    if found is not None and found[0] is base:  # (it holds `base`: its id is not reused)
        return found[1]
    made = base.lowered(off=base.off | {"cgroup", "cgroup_kill"})
    if len(_READING) >= 16:
        _READING.clear()
    _READING[id(base)] = (base, made)
    return made


_READING: dict[int, tuple[Policy, Policy]] = {}


_MB = 1024 * 1024
_TOOL_KEYS = {
    "network", "unix_sockets", "memory_mb", "pids", "cpu", "cpu_s", "file_mb", "nofile",
    "as_mb", "timeout_s", "reader",
}
_TOP_KEYS = _TOOL_KEYS | {"uid", "uid_range", "optional", "off", "ro_paths", "backend"}
_EXECUTOR_KEYS = ("executor_memory_mb", "executor_pids", "executor_cpu")


def _executor_limits(top: dict[str, Any], where: str) -> Limits | None:
    """Take the executor_* keys out of `top`; None when none is given (machine defaults)."""
    given = {key: top.pop(key) for key in _EXECUTOR_KEYS if key in top}
    if not given:
        return None
    default = executor_limits()  # the machine's defaults fill what is not given
    try:
        limits = Limits(
            memory_bytes=int(given.get("executor_memory_mb", default.memory_bytes / _MB) * _MB),
            pids=int(given.get("executor_pids", default.pids)),
            cpu=float(given.get("executor_cpu", default.cpu)),
        )
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{where}: {exc}") from exc
    if min(limits.memory_bytes, limits.pids, limits.cpu) <= 0:
        raise PolicyError(f"{where}: executor_* limits must be positive, got {given}")
    return limits


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    return value


def _uid_range(table: dict[str, Any], base: Policy) -> tuple[int, int]:
    if "uid" in table and "uid_range" in table:
        raise ValueError("give uid (one uid for every session) or uid_range, not both")
    if "uid" in table:
        return int(table["uid"]), int(table["uid"])
    if "uid_range" in table:
        first, last = table["uid_range"]
        return int(first), int(last)
    return base.uid_range


def _policy(base: Policy, table: dict[str, Any], where: str, *, top: bool) -> Policy:
    allowed = _TOP_KEYS if top else _TOOL_KEYS | {"optional", "off", "ro_paths", "backend"}
    unknown = set(table) - allowed
    if unknown:
        raise PolicyError(f"{where}: unknown key(s) {sorted(unknown)}")
    try:
        limits = Limits(
            memory_bytes=int(table.get("memory_mb", base.limits.memory_bytes / _MB) * _MB),
            pids=int(table.get("pids", base.limits.pids)),
            cpu=float(table.get("cpu", base.limits.cpu)),
        )
        return Policy(
            network=str(table.get("network", base.network)),
            unix_sockets=_bool(table.get("unix_sockets", base.unix_sockets), "unix_sockets"),
            limits=limits,
            cpu_s=int(table.get("cpu_s", base.cpu_s)),
            file_bytes=int(table.get("file_mb", base.file_bytes / _MB) * _MB),
            nofile=int(table.get("nofile", base.nofile)),
            address_space=int(table.get("as_mb", base.address_space / _MB) * _MB),
            timeout_s=float(table.get("timeout_s", base.timeout_s)),
            uid_range=_uid_range(table, base),
            ro_paths=tuple(str(p) for p in table.get("ro_paths", base.ro_paths)),
            optional=frozenset(table.get("optional", base.optional)),
            off=frozenset(table.get("off", base.off)),
            backend=str(table.get("backend", base.backend)),
            reader=str(table.get("reader", base.reader)),
        )
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{where}: {exc}") from exc
