"""The bubblewrap backend: a hardened `bwrap` command line for one call.

Chosen with `backend = "bwrap"` in a policy. The launcher still applies the
cgroup, setsid, parent-death signal and rlimits, drops to the tool uid, then
execs this; bwrap makes every namespace (an unprivileged user namespace
included), a minimal read-only root with only the workspace writable, private
/tmp, /var/tmp, /dev/shm and /run (each bounded), a new /dev, a new /proc with
/proc/sys reduced, of /sys only the CPUs (`hostview`), and loads the seccomp
filter from an fd.
"""

from __future__ import annotations

import functools
import shutil
import subprocess

from . import hostview
from .policy import Policy

# Bound read-only when present; everything else (/root, /home, /var, /srv, the
# oploop home, the host's /tmp and /run) simply does not exist inside.
_RO_ROOT = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt")


@functools.cache
def find() -> tuple[str, str]:
    """(path to bwrap, "") when usable here, else ("", why not)."""
    path = shutil.which("bwrap")
    if path is None:
        return "", "bwrap not installed"
    try:
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"bwrap does not run: {exc}"
    if "--disable-userns" not in out.stdout:
        return "", "bwrap too old: no --disable-userns (needs 0.8)"
    return path, ""


def argv(
    path: str, policy: Policy, cwd: str, env: dict[str, str], tmpfs_size: str = "64m"
) -> list[str]:
    """The bwrap options for one call (the launcher appends --seccomp FD, --, the command);
    `tmpfs_size` bounds each private tmpfs."""
    args = [
        path, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
        "--new-session", "--cap-drop", "ALL", "--clearenv", "--hostname", "sandbox",
    ]
    if policy.network == "host":
        args.append("--share-net")
    for ro in (*_RO_ROOT, *policy.ro_paths):
        args += ["--ro-bind-try", ro, ro]
    size = str(hostview.size_bytes(tmpfs_size))
    args += ["--proc", "/proc", "--dev", "/dev"]
    for tmp in ("/tmp", "/var/tmp", "/dev/shm"):
        args += ["--size", size, "--tmpfs", tmp]
    args += hostview.bwrap_args(tmpfs_size)
    args += ["--bind", cwd, cwd, "--chdir", cwd]
    for key, value in env.items():
        args += ["--setenv", key, value]
    return args
