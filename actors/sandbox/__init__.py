"""Sandboxed processes for risky tools: they cannot escape, and they always die.

`Sandbox` runs a tool call through `launcher.py`, a small single-threaded
process (never a `preexec_fn`): forked by the executor's launcher fork server
(`zygote.py`, exec'd once, so no interpreter starts per call), or exec'd per
call as the fallback. It applies, in order:
its own cgroup (memory, pids, cpu; killed whole by `cgroup.kill` or the v1
freezer), setsid, a parent-death signal, rlimits, new mount/net/ipc/uts/pid
namespaces (the pid namespace's init dies with the launcher), an unprivileged
uid with no_new_privs, Landlock and seccomp; then it execs the tool.

`Policy` says what each tool may use, fail-closed: a required layer that is
missing refuses the call (`SandboxRefused`) unless `sandbox.toml` lowers it.
`layers_report()` tells which layers this machine has (`oploop status`).
"""

from . import bwrap
from .cgroups import Limits
from .layers import layers_report, machine_layers
from .policy import LAYERS, Policy, PolicyError, SandboxConfig
from .sandbox import Sandbox, SandboxedChild, SandboxRefused, SandboxStatistics
from .workspaces import WorkspaceQuota, WorkspaceRefused, Workspaces, release_all

__all__ = [
    "bwrap",
    "LAYERS",
    "Limits",
    "Policy",
    "PolicyError",
    "Sandbox",
    "SandboxConfig",
    "SandboxRefused",
    "SandboxStatistics",
    "SandboxedChild",
    "WorkspaceQuota",
    "WorkspaceRefused",
    "Workspaces",
    "layers_report",
    "machine_layers",
    "release_all",
]
