"""Sandbox policies: what a risky tool may touch and use, and which layers it needs.

A policy is fail-closed: every layer in `LAYERS` is required unless the
configuration lowers it, either to `optional` (used where the machine has it)
or `off` (never applied). The configuration is `$OPLOOP_HOME/sandbox.toml`:

    [sandbox]
    backend = "launcher"        # or "bwrap": a hardened bubblewrap makes the namespaces
    uid = 64000                 # the unprivileged uid risky tools run as
    optional = ["landlock"]     # may be missing on this machine
    off = []                    # never applied (e.g. "uid" to run tools as root)
    ro_paths = ["/opt/tool"]    # extra read-only paths (a toolchain, say)

    [tools.shell]               # per tool; any Limits/Policy field
    network = "none"            # or "host"
    memory_mb = 512
    pids = 256
    cpu = 1.0                   # cores
    cpu_s = 60                  # CPU seconds per process (RLIMIT_CPU)
    file_mb = 256               # largest file (RLIMIT_FSIZE)
    nofile = 256
    timeout_s = 600

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

from .cgroups import Limits
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

DEFAULT_UID = 64000
"""The sandbox uid (and gid) when the configuration names none: owned by nobody else."""


class PolicyError(ValueError):
    """The sandbox configuration is malformed; the message names the key."""


@dataclass(frozen=True, slots=True)
class Policy:
    """How one risky tool runs: limits, network, timeout, and the layers it needs."""

    network: str = "none"  # "none": loopback-less net namespace, no inet sockets; "host"
    limits: Limits = field(default_factory=Limits)
    cpu_s: int = 60
    file_bytes: int = 256 * 1024 * 1024
    nofile: int = 256
    address_space: int = 0  # RLIMIT_AS; 0 = none (it breaks many runtimes' reservations)
    timeout_s: float = 600.0
    uid: int = DEFAULT_UID
    ro_paths: tuple[str, ...] = ()
    optional: frozenset[str] = frozenset()
    off: frozenset[str] = frozenset()
    backend: str = "launcher"  # "bwrap": bubblewrap replaces namespaces, mounts and Landlock

    def __post_init__(self) -> None:
        if self.network not in ("none", "host"):
            raise PolicyError(f"network must be 'none' or 'host', got {self.network!r}")
        if self.backend not in ("launcher", "bwrap"):
            raise PolicyError(f"backend must be 'launcher' or 'bwrap', got {self.backend!r}")
        for name in self.optional | self.off:
            if name not in LAYERS:
                raise PolicyError(f"unknown sandbox layer {name!r} (known: {', '.join(LAYERS)})")

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
    workspaces: WorkspaceQuota = field(default_factory=WorkspaceQuota)

    def policy(self, tool: str) -> Policy:
        """The policy of `tool` (the default one if it has none of its own)."""
        return self.tools.get(tool, self.default)

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
        base = _policy(Policy(), data.get("sandbox", {}), f"{where} [sandbox]", top=True)
        tools = {
            name: _policy(base, table, f"{where} [tools.{name}]", top=False)
            for name, table in data.get("tools", {}).items()
        }
        try:
            workspaces = WorkspaceQuota.from_table(data.get("workspaces", {}))
        except (TypeError, ValueError) as exc:
            raise PolicyError(f"{where} [workspaces]: {exc}") from exc
        return cls(base, tools, workspaces)


_MB = 1024 * 1024
_TOOL_KEYS = {
    "network", "memory_mb", "pids", "cpu", "cpu_s", "file_mb", "nofile", "as_mb", "timeout_s",
}
_TOP_KEYS = _TOOL_KEYS | {"uid", "optional", "off", "ro_paths", "backend"}


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
            limits=limits,
            cpu_s=int(table.get("cpu_s", base.cpu_s)),
            file_bytes=int(table.get("file_mb", base.file_bytes / _MB) * _MB),
            nofile=int(table.get("nofile", base.nofile)),
            address_space=int(table.get("as_mb", base.address_space / _MB) * _MB),
            timeout_s=float(table.get("timeout_s", base.timeout_s)),
            uid=int(table.get("uid", base.uid)),
            ro_paths=tuple(str(p) for p in table.get("ro_paths", base.ro_paths)),
            optional=frozenset(table.get("optional", base.optional)),
            off=frozenset(table.get("off", base.off)),
            backend=str(table.get("backend", base.backend)),
        )
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"{where}: {exc}") from exc
