"""Sandbox modes: where a session's tools act, as whom, and what they may write or see.

A session has one working directory; its agent's `sandbox` key says what the
tools may do there (`oploop.toml`, `[agents.NAME]`):

| mode | working directory | writable | tool user |
|---|---|---|---|
| `workspace-write` (default) | the session's cwd | it, `write_paths`, a private /tmp | its owner |
| `read-only` | the session's cwd | a private /tmp only | its owner |
| `scratch` | an empty per-session workspace | it, a private /tmp | the session's uid |

In the first two the rest of the file system is readable, as the tool user's
permissions allow, except what is hidden; in `scratch` only the system's paths
are. Hidden in every mode: the oploop home (other sessions' workspaces with
it), key folders, credential folders (`CREDENTIALS` under /root, the cwd
owner's home and the host user's home) and the agent's `deny_read`.

`view_for` decides a session's `WorkView` (the executor, per call);
`check_workdir` refuses a working directory that cannot be one (the CLI before
a start, the executor before every call). The executor hands the view to the
sandbox through `CURRENT` (a context variable: set for the job's own task).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import pwd
from collections.abc import Iterator
from dataclasses import dataclass, field

WORKSPACE_WRITE = "workspace-write"
READ_ONLY = "read-only"
SCRATCH = "scratch"
MODES = (WORKSPACE_WRITE, READ_ONLY, SCRATCH)
"""The values of an agent's `sandbox` key; the first is the default."""

CREDENTIALS = (
    ".ssh", ".aws", ".gnupg", ".config/gcloud", ".kube", ".docker", ".netrc",
    ".azure", ".config/gh", ".git-credentials", ".pgpass", ".npmrc", ".pypirc",
    ".password-store", ".vault-token", ".config/oploop", ".oploop",
)
"""Relative to a home: hidden from tools in every mode (`.oploop`: any oploop home in
its default place, another host's included)."""
SYSTEM_SECRETS = ("/etc/shadow", "/etc/gshadow", "/etc/shadow-", "/etc/gshadow-",
                  "/etc/ssl/private", "/etc/sudoers", "/etc/sudoers.d", "/etc/wireguard",
                  "/etc/NetworkManager/system-connections", "/etc/krb5.keytab",
                  "/etc/ipsec.secrets", "/etc/ppp/chap-secrets", "/etc/letsencrypt")
"""The system's own credentials: hidden too (a root-owned working directory runs the
tools as root, without capabilities, but owner of these)."""

SYSTEM_DIRS = frozenset({
    "/", "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/var",
    "/var/lib", "/var/log", "/var/cache", "/proc", "/sys", "/dev", "/boot", "/run", "/opt",
    "/home", "/srv", "/mnt", "/media", "/snap",
})
"""Never a writable working directory themselves."""
SYSTEM_TREES = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
                "/proc", "/sys", "/dev", "/boot", "/run")
"""Nothing beneath these is a writable working directory either."""
PRIVATE_PER_CALL = frozenset({"/tmp", "/var/tmp", "/dev/shm"})
"""Private to each call inside the sandbox: what a tool wrote there is gone after it."""


class WorkdirRefused(ValueError):
    """A working directory a session cannot have; the message is one line saying why."""


@dataclass(frozen=True, slots=True)
class WorkView:
    """What one session's tools see and may do: its mode, working directory, identity,
    the writable paths and the hidden ones (all resolved)."""

    mode: str
    cwd: str
    #: The tool's identity; -1: the session's own uid (scratch: `uids.py`).
    uid: int = -1
    gid: int = -1
    user: str = "sandbox"
    home: str = ""
    writable: tuple[str, ...] = ()
    hidden: tuple[str, ...] = ()
    #: Whether the host's /etc/passwd names `uid` (else the view gets an entry for it).
    user_known: bool = False
    #: (write path as configured, where it resolves) of each left out because a link is
    #: on the way: named by `allow_hint`.
    linked: tuple[tuple[str, str], ...] = ()
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        # Kept once computed: a view is part of a persistent reader's key, looked up at
        # every read, and its hundred-odd hidden paths made that hash a cost of its own.
        if not self._hash:
            object.__setattr__(self, "_hash", hash((
                self.mode, self.cwd, self.uid, self.gid, self.user, self.home, self.writable,
                self.hidden, self.user_known, self.linked)))
        return self._hash

    @property
    def confined(self) -> bool:
        """Whether the tools see only the system's paths (scratch), not the whole tree."""
        return self.mode == SCRATCH

    def allow_hint(self) -> str:
        """What would allow a write the sandbox refused, for the error the model reads."""
        if self.mode == READ_ONLY:
            return ("sandbox mode read-only: nothing is writable but a shell command's "
                    "private /tmp; the agent's `sandbox = \"workspace-write\"` allows the "
                    "working directory")
        if self.mode == SCRATCH:
            return (f"sandbox mode scratch: only the session workspace {self.cwd} is "
                    "writable; the agent's `sandbox = \"workspace-write\"` works in the "
                    "directory the session was started in")
        hint = (f"sandbox mode workspace-write: writable is {', '.join(self.writable)}; "
                "add the path to the agent's `write_paths` to allow it")
        for given, target in self.linked:
            hint += (f"; write_paths entry {given} resolves through a link to {target}, "
                     f"so it is not writable: name {target} itself to allow it")
        return hint


CURRENT: contextvars.ContextVar[WorkView | None] = contextvars.ContextVar(
    "oploop_work_view", default=None)
"""The view of the call the current task runs (None: a launch with no session view,
such as an MCP server: confined as in scratch mode)."""


@contextlib.contextmanager
def using(view: WorkView | None) -> Iterator[None]:
    """Run the calls made within under `view` (tests and embedders; the executor sets
    `CURRENT` in each job's own task)."""
    token = CURRENT.set(view)
    try:
        yield
    finally:
        CURRENT.reset(token)


def _under(path: str, roots: tuple[str, ...] | frozenset[str]) -> str:
    """The first of `roots` that is `path` or one of its parents ("" if none)."""
    for root in roots:
        if path == root or path.startswith(root.rstrip("/") + "/"):
            return root
    return ""


def credential_paths(homes: tuple[str, ...]) -> tuple[str, ...]:
    """The credential folders and files of each home, as given and resolved (whether
    they exist or not: one made later is hidden too once it exists)."""
    out: list[str] = []
    for home in homes:
        if not home or home == "/":
            continue
        for rel in CREDENTIALS:
            # Both: the resolved path, and the path itself (when it is a link made or
            # changed later, the mount on it follows it to wherever it leads then).
            given = os.path.join(home, rel)
            for path in (os.path.realpath(given), given):
                if path not in out:
                    out.append(path)
    return tuple(out)


def passwd_stamp() -> int:
    """When /etc/passwd last changed (0: unreadable): what the passwd lookups kept per
    uid are kept with, so that a user made, moved or removed since is seen at once (a
    uid given again to a new user with another home would otherwise keep the old one's
    home, and the new one's credential folders would go unhidden)."""
    try:
        return os.stat("/etc/passwd").st_mtime_ns
    except OSError:
        return 0


def homes_of(owner: int) -> tuple[str, ...]:
    """/root, the home of `owner` (the cwd's owner) and of the host's own user."""
    return _homes_of(owner, passwd_stamp())


@functools.lru_cache(maxsize=256)
def _homes_of(owner: int, stamp: int) -> tuple[str, ...]:
    # Kept: a passwd lookup per call would cost more than the launch's mounts.
    homes = ["/root"]
    for uid in (owner, os.getuid()):
        with contextlib.suppress(KeyError):
            homes.append(pwd.getpwuid(uid).pw_dir)
    env_home = os.environ.get("HOME", "")
    if env_home:
        homes.append(env_home)
    return tuple(dict.fromkeys(os.path.realpath(h) for h in homes if h))


def check_workdir(path: str, mode: str, secret: tuple[str, ...] = ()) -> str:
    """The resolved working directory `path` for a session in `mode`, or WorkdirRefused.

    `secret`: paths hidden from tools (the oploop home, key folders, credential
    folders, `deny_read`): never a working directory. In `workspace-write` the
    directory becomes writable: not `/`, a system directory, nor a directory
    each call gets a private copy of.
    """
    if mode not in MODES:
        raise WorkdirRefused(f"unknown sandbox mode {mode!r} (known: {', '.join(MODES)})")
    if not path or not os.path.isabs(path):
        raise WorkdirRefused(f"working directory {path!r}: expected an absolute path")
    real = os.path.realpath(path)
    if not os.path.exists(real):
        raise WorkdirRefused(f"working directory {path} does not exist")
    if not os.path.isdir(real):
        raise WorkdirRefused(f"working directory {path} is not a directory")
    if not os.access(real, os.R_OK | os.X_OK):
        raise WorkdirRefused(f"working directory {path}: the host cannot read it")
    hidden = _under(real, tuple(secret))
    if hidden:
        raise WorkdirRefused(f"working directory {path} is hidden from tools ({hidden}: the "
                             "oploop home, a key or credential folder, or deny_read)")
    if mode != WORKSPACE_WRITE:
        return real
    why = not_writable(real)
    if why:
        raise WorkdirRefused(f"working directory {path}: {why} (sandbox mode workspace-write); "
                             "start in a project directory, or use sandbox = \"read-only\"")
    return real


def not_writable(real: str) -> str:
    """Why the resolved path `real` may never be made writable for tools ("" if it may):
    `/`, a system directory, or one each call has a private copy of."""
    if real == "/":
        return "tools would be allowed to write anywhere"
    if real in SYSTEM_DIRS or _under(real, SYSTEM_TREES):
        return "a system directory, never writable by tools"
    if real in PRIVATE_PER_CALL:
        return "each tool call gets a private, empty one in the sandbox"
    return ""


def view_for(mode: str, cwd: str, *, workspace: str, write_paths: tuple[str, ...] = (),
             deny_read: tuple[str, ...] = (), secret: tuple[str, ...] = ()) -> WorkView:
    """The view of a session in `mode` started in `cwd` (its scratch workspace is
    `workspace`); WorkdirRefused when `cwd` cannot be its working directory.

    `write_paths` that do not exist, or lie in a hidden path, are left out, and so
    are those with a symbolic link on the way (`linked`): a tool that replaced one
    by a link would otherwise make the link's target writable. A session with no working
    directory (one another host asked for: its start's path is dropped) works in
    its scratch workspace, whatever the mode.
    """
    if mode == SCRATCH or not cwd:
        owner = os.getuid()
        hidden = _hidden(homes_of(owner), deny_read)
        return WorkView(SCRATCH, workspace, user="sandbox", home=workspace,
                        writable=(workspace,), hidden=hidden)
    real = check_workdir(cwd, mode, secret)
    st = os.stat(real)
    hidden = _hidden(homes_of(st.st_uid), deny_read)
    inside = _under(real, hidden)
    if inside:
        raise WorkdirRefused(f"working directory {cwd} is hidden from tools ({inside})")
    known, user, home = _user_of(st.st_uid)
    if not known:  # an owner with no name: one for the tools' view (`passwd_lines`)
        home = real
    writable: tuple[str, ...] = ()
    linked: tuple[tuple[str, str], ...] = ()
    if mode == WORKSPACE_WRITE:
        extra, linked = _write_paths(write_paths, (*hidden, *secret), real)
        writable = tuple(dict.fromkeys((real, *extra)))
    return WorkView(mode, real, st.st_uid, st.st_gid, user, home, writable, hidden, known,
                    linked)


def _write_paths(paths: tuple[str, ...], hidden: tuple[str, ...], cwd: str
                 ) -> tuple[list[str], tuple[tuple[str, str], ...]]:
    """The `write_paths` that may be writable (existing directories, neither hidden nor
    system ones), and (path, target) of those left out for a link on the way that a
    tool could have made (`_tool_made_link`)."""
    writable: list[str] = []
    linked: list[tuple[str, str]] = []
    roots = (cwd, *(os.path.realpath(os.path.expanduser(p)) for p in paths))
    for path in paths:
        given = os.path.normpath(os.path.expanduser(path))
        if not os.path.isabs(given):  # `~user` with no such user
            continue
        resolved = os.path.realpath(given)
        if (not os.path.isdir(resolved) or _under(resolved, hidden)
                or not_writable(resolved)):
            continue
        if _tool_made_link(given, roots):
            linked.append((path, resolved))
        else:
            writable.append(resolved)
    return writable, tuple(linked)


def _tool_made_link(path: str, roots: tuple[str, ...]) -> bool:
    """Whether a symbolic link on the way to the absolute `path` lies in a directory a
    tool may write (one of `roots`, resolved: the working directory, the write paths):
    a call may have put it there to make its target writable. A link elsewhere (`/home`
    -> `/var/home`, made by whoever set the machine up) is followed as ever."""
    prefix = "/"
    for name in path.strip("/").split("/"):
        prefix = os.path.join(prefix, name)
        if os.path.islink(prefix) and _under(os.path.realpath(os.path.dirname(prefix)),
                                              roots):
            return True
    return False


def _user_of(uid: int) -> tuple[bool, str, str]:
    """(named?, name, home) of `uid` from the passwd database."""
    return _passwd_entry(uid, passwd_stamp())


@functools.lru_cache(maxsize=256)
def _passwd_entry(uid: int, stamp: int) -> tuple[bool, str, str]:
    # Kept: one lookup per uid while /etc/passwd is unchanged.
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return False, f"u{uid}", ""
    return True, entry.pw_name, entry.pw_dir


@functools.lru_cache(maxsize=256)
def _hidden(homes: tuple[str, ...], deny_read: tuple[str, ...]) -> tuple[str, ...]:
    # Kept: a folder made a link later is still hidden (the mount follows the link).
    denied = tuple(os.path.realpath(os.path.expanduser(p)) for p in deny_read)
    return tuple(dict.fromkeys((*SYSTEM_SECRETS, *_host_keys(), *credential_paths(homes),
                                *denied)))


@functools.lru_cache(maxsize=1)
def _host_keys() -> tuple[str, ...]:
    """The ssh server's private host keys (readable by root only)."""
    try:
        names = os.listdir("/etc/ssh")
    except OSError:
        return ()
    return tuple(f"/etc/ssh/{n}" for n in sorted(names)
                 if n.startswith("ssh_host_") and n.endswith("_key"))


@functools.lru_cache(maxsize=64)
def passwd_lines(uid: int, gid: int, user: str, home: str) -> tuple[bytes, bytes]:
    """An /etc/passwd and /etc/group for the tools' view when `uid` has no entry on the
    host (the scratch uid): the host's entries plus one for the tool user, so that
    `whoami`, `id -un`, `$USER` and `$HOME` agree."""
    def read(path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read(1 << 20)
        except OSError:
            return b""

    passwd = read("/etc/passwd").rstrip(b"\n") + b"\n"
    group = read("/etc/group").rstrip(b"\n") + b"\n"
    passwd += f"{user}:x:{uid}:{gid}:oploop sandbox:{home}:/bin/sh\n".encode()
    group += f"{user}:x:{gid}:\n".encode()
    return passwd, group
