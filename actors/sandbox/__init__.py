"""Sandboxed processes for every tool: they cannot escape, and they always die.

`Sandbox` runs a tool call through `launcher.py`, a small single-threaded
process (never a `preexec_fn`): forked by the executor's launcher fork server
(`zygote.py`, exec'd once, so no interpreter starts per call), or exec'd per
call as the fallback. It applies, in order:
its own cgroup (memory, pids, cpu; killed whole by `cgroup.kill` or the v1
freezer), nested in the executor's cgroup whose caps hold all calls together;
setsid, a parent-death signal, rlimits, new mount/net/ipc/uts/pid namespaces
(the pid namespace's init dies with the launcher; /root, /home, the oploop
home hidden, the workspace bound back; private /tmp, /var/tmp, /dev/shm and
/run, /sys and /proc/sys reduced to what ordinary tools read: `hostview.py`),
the session's own unprivileged uid (`uids.py`: one per session from a range,
so sessions cannot starve, signal or trace each other) with no_new_privs,
Landlock and seccomp (offline: no `socket()` at all, so no host unix socket
either); then it execs the tool (`shell`), or does the file operation itself
(`fileops`: `write_file` in the workspace; `read_file`, `list_dir` read-only
on the system's paths, the session's cwd and workspace and the agent's
`read_paths`, with only the mount and pid namespaces, no cgroup, and no
socket at all). A read or a listing goes to its session's persistent reader
(`readers.py`): a launcher locked down once the same way that answers many
calls on a socketpair, killed when a call fails, when idle, or with its session.

`Policy` says what each tool may use, fail-closed: a required layer that is
missing refuses the call (`SandboxRefused`) unless `sandbox.toml` lowers it.
`layers_report()` tells which layers this machine has (`oploop status`).
"""

from . import bwrap
from .cgroups import Limits
from .child import SandboxedChild
from .layers import layers_report, machine_layers
from .policy import LAYERS, Policy, PolicyError, SandboxConfig
from .refusal import SandboxRefused
from .sandbox import Sandbox, SandboxStatistics
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
