"""Session workspaces with bounded disk: a quota per session, a cap for the host,
and a free-space reserve checked before every launch.

The quota is a file system of its own per session: a sparse ext4 image under
`workspaces/.images/`, loop-mounted (nosuid, nodev, discard) on the session's
workspace directory. A shell writing until ENOSPC fills its own image, never the
disk under the journal. Why this mechanism (see `[workspaces]` in sandbox.toml):

- project quotas need a file system mounted with `prjquota` (the host's root
  file system here is not, and turning it on needs it unmounted);
- a tmpfs with a size bounds memory, not disk, and loses the workspace when it
  is unmounted (host restart);
- a loop-mounted image needs only root, `mkfs.ext4` and the loop driver, keeps
  the workspace across restarts (the image is remounted), and its size is a
  hard limit enforced by the kernel.

With `quota = "loop"` (the default) a machine that cannot do it refuses every
risky call with a clear error (fail closed); `quota = "off"` gives plain
directories. Images are sparse and mounted with `discard`, so the bytes they
hold on the disk are the bytes written (deleted files give theirs back): the
host-wide cap (`total_mb`) is on that sum. A running call can still write up to
its own quota past the cap: the overshoot is bounded by calls x `size_mb`,
which the reserve (`reserve_mb`) should cover.

A workspace stays mounted, across host restarts, until its session is removed
(`Workspaces.remove`): its files stay where an operator looks for them. After a
machine restart the next call of the session mounts its image again (one image
is never mounted twice: a lock per session, and the mount point is checked
under it). `release_all` unmounts every workspace of a home (tests, a home
being deleted). A workspace made before quotas moves into its new image on its
next call (refused, untouched, if it does not fit).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.digests import sha256
from actors.tools.process import ToolRefused

log = logging.getLogger("oploop.sandbox")

QUOTA_MODES = ("loop", "off")
IMAGES_DIR = ".images"
"""Under the workspaces directory: one `<session>.img` (and its lock) per session."""
_MB = 1024 * 1024
#: How long the measured total of the images is reused before it is measured again
#: (one stat per session's image; a launch must not cost that each time).
USAGE_TTL_S = 1.0
#: Bound on any one mkfs/mount/umount command (they take milliseconds).
COMMAND_TIMEOUT_S = 30.0
_MOUNT_OPTIONS = "loop,nosuid,nodev,noatime,discard"


class WorkspaceRefused(ToolRefused):
    """A call refused for disk reasons: no quota possible here, the session's
    workspace cannot be made, the host's cap is reached, or the disk is nearly full."""


@dataclass(frozen=True, slots=True)
class WorkspaceQuota:
    """The `[workspaces]` section of sandbox.toml."""

    quota: str = "loop"  # "loop": an ext4 image per session; "off": plain directories
    size_mb: int = 1024  # per session
    total_mb: int = 32 * 1024  # host-wide: bytes all workspaces may hold (0: no cap)
    reserve_mb: int = 1024  # refuse launches when the disk has less free than this

    def __post_init__(self) -> None:
        if self.quota not in QUOTA_MODES:
            raise ValueError(f"quota must be one of {', '.join(QUOTA_MODES)}, got {self.quota!r}")
        if self.size_mb < 8:
            raise ValueError(f"size_mb must be at least 8 (an ext4 image), got {self.size_mb}")
        if self.total_mb < 0 or self.reserve_mb < 0:
            raise ValueError("total_mb and reserve_mb must be >= 0")

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> WorkspaceQuota:
        """From the parsed `[workspaces]` table; unknown keys are errors."""
        unknown = set(table) - {"quota", "size_mb", "total_mb", "reserve_mb"}
        if unknown:
            raise ValueError(f"unknown key(s) {sorted(unknown)}")
        base = cls()
        return cls(
            quota=str(table.get("quota", base.quota)),
            size_mb=int(table.get("size_mb", base.size_mb)),
            total_mb=int(table.get("total_mb", base.total_mb)),
            reserve_mb=int(table.get("reserve_mb", base.reserve_mb)),
        )


NAME_MAX = 64
"""The longest session id used as is for its workspace's name (ASCII: bytes = chars)."""
_DIGEST_HEX = 16


def safe_name(session: str) -> str:
    """The directory name of `session`'s workspace: no separators, never empty, at most
    NAME_MAX + 17 bytes, and one per session (two ids never share a workspace).

    An id of ASCII letters, digits, `-` and `_` (oploop's own are hex) is its own name;
    any other is its safe characters, a dot (which no such id has) and a digest of the
    whole id: "a.b" and "ab", "../x" and "x", or ids too long for a file name once
    all mapped to one directory, or failed to be made.
    """
    kept = "".join(c for c in session if c.isascii() and (c.isalnum() or c in "-_"))
    if kept == session and 0 < len(session) <= NAME_MAX:
        return session
    digest = sha256(session.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{kept[:NAME_MAX] or 'session'}.{digest[:_DIGEST_HEX]}"


class Workspaces:
    """The workspaces under `root`, each bounded by `quota`."""

    def __init__(self, root: Path, quota: WorkspaceQuota | None = None) -> None:
        self.root = root
        self.quota = quota or WorkspaceQuota()
        self.images = root / IMAGES_DIR
        self._usage = (0, -USAGE_TTL_S)  # (bytes, monotonic time measured)

    # -- making and removing -------------------------------------------------------------

    def ensure(self, session: str) -> Path:
        """The session's workspace, created (and mounted on its image) if need be.

        Raises `WorkspaceRefused` when it cannot be bounded as configured.
        """
        path = self.root / safe_name(session)
        if self.quota.quota == "off":
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            return path
        if os.path.ismount(path):  # the common case: no lock, no command
            return path
        self._check_can_mount()
        self.images.mkdir(mode=0o700, parents=True, exist_ok=True)
        with self._locked(path.name):
            if not os.path.ismount(path):
                self._mount(path, self.images / f"{path.name}.img")
        return path

    def remove(self, session: str) -> None:
        """Unmount and delete the session's workspace and its image (the session is gone)."""
        path = self.root / safe_name(session)
        with self._locked(path.name):
            if os.path.ismount(path):
                _unmount(path)
            shutil.rmtree(path, ignore_errors=True)
            (self.images / f"{path.name}.img").unlink(missing_ok=True)
        (self.images / f"{path.name}.lock").unlink(missing_ok=True)

    def _mount(self, path: Path, image: Path) -> None:
        holds_files = path.is_dir() and any(path.iterdir())
        migrated = False
        if not image.exists():
            self.check_room()
            # A workspace made before quotas (files, no image): its files move in.
            _make_image(image, self.quota.size_mb, path if holds_files else None)
            migrated = holds_files
        if holds_files:
            # Never hidden under the mount. Copied into the image: deleted; else (written
            # while the image was unmounted, or a move that stopped half way) kept aside.
            aside = self.images / f"{path.name}.{time.time_ns()}.aside"
            os.rename(path, aside)
            if migrated:
                shutil.rmtree(aside, ignore_errors=True)
            else:
                log.warning("workspace %s: files outside its image kept in %s", path, aside)
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        _run(["mount", "-t", "ext4", "-o", _MOUNT_OPTIONS, str(image), str(path)],
             f"cannot mount the workspace image {image}")
        with contextlib.suppress(OSError):
            (path / "lost+found").rmdir()  # e2fsck makes it again if it needs it
        os.chmod(path, 0o700)
        log.info("workspace %s mounted (%d MB quota)", path, self.quota.size_mb)

    @contextlib.contextmanager
    def _locked(self, name: str) -> Iterator[None]:
        """Serialise making a session's workspace across threads and executors: two
        mounts of one image would corrupt it."""
        self.images.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.images / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _check_can_mount(self) -> None:
        why = loop_quota_missing()
        if why:
            raise WorkspaceRefused(
                f"no workspace quota possible here ({why}); "
                f"set quota = \"off\" under [workspaces] in sandbox.toml to run without one"
            )

    # -- the host's bounds ---------------------------------------------------------------

    def check_room(self) -> None:
        """Refuse (`WorkspaceRefused`) a launch when the disk is below the reserve or
        the workspaces hold more than the host-wide cap."""
        reserve = self.quota.reserve_mb * _MB
        if reserve:
            probe = self.root if self.root.exists() else self.root.parent
            st = os.statvfs(probe)
            free = st.f_bavail * st.f_frsize
            if free < reserve:
                raise WorkspaceRefused(
                    f"the disk is nearly full: {free // _MB} MB free under {self.root}, "
                    f"below the reserve of {self.quota.reserve_mb} MB kept for the journal "
                    f"(reserve_mb under [workspaces] in sandbox.toml)"
                )
        cap = self.quota.total_mb * _MB
        if cap and self.quota.quota == "loop":
            used = self.usage()
            if used >= cap:
                raise WorkspaceRefused(
                    f"the workspaces of this host hold {used // _MB} MB, at their cap of "
                    f"{self.quota.total_mb} MB (total_mb under [workspaces] in sandbox.toml): "
                    f"remove old sessions"
                )

    def usage(self) -> int:
        """Bytes the workspace images hold on the disk (measured at most every
        `USAGE_TTL_S`)."""
        used, when = self._usage
        now = time.monotonic()
        if now - when < USAGE_TTL_S:
            return used
        used = 0
        with contextlib.suppress(FileNotFoundError), os.scandir(self.images) as it:
            for entry in it:
                if entry.name.endswith(".img"):
                    with contextlib.suppress(FileNotFoundError):
                        used += entry.stat(follow_symlinks=False).st_blocks * 512
        self._usage = (used, now)
        return used


def loop_quota_missing() -> str:
    """Why this machine cannot bound workspaces with loop-mounted images ("" if it can)."""
    if os.geteuid() != 0:
        return "loop-mounting a workspace image needs root"
    if shutil.which("mkfs.ext4") is None or shutil.which("mount") is None:
        return "mkfs.ext4 or mount is not installed"
    if not os.path.exists("/dev/loop-control") and not os.path.exists("/dev/loop0"):
        return "no loop device driver (/dev/loop-control)"
    return ""


def release_all(root: Path) -> int:
    """Unmount every workspace mounted under `root` (images are kept, and mounted
    again by the next call of their session); returns how many mounts were detached
    at the top.

    Shallowest first, each detach recursive (`umount -l`), again until none is
    left: a mount stacked on another at one path is then taken too.
    """
    base = str(root.resolve()).rstrip("/")
    count = 0
    for _ in range(_RELEASE_ROUNDS):
        under = [p for p in _mount_points() if p == base or p.startswith(base + "/")]
        if not under:
            break
        top = [p for p in under if not any(p.startswith(q + "/") for q in under)]
        for point in sorted(set(top)):
            try:
                _run(["umount", "-l", point], f"cannot unmount {point}")
                count += 1
            except WorkspaceRefused as exc:
                log.error("%s", exc)
    return count


def remove_home(home: Path) -> None:
    """Delete an oploop home that is done with (a test's, a benchmark's): its
    workspaces unmounted first, or they would stay mounted, each holding a loop
    device, and the folder could not be removed."""
    release_all(home)
    shutil.rmtree(home, ignore_errors=True)


#: Release rounds at most: one per layer of mounts stacked at one path.
_RELEASE_ROUNDS = 8


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            # Octal escapes (\040 for a space) as the kernel writes them.
            points.append(_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), line.split(" ")[4]))
    return points


_OCTAL = re.compile(r"\\([0-7]{3})")


def _make_image(image: Path, size_mb: int, files: Path | None = None) -> None:
    """A sparse ext4 image of `size_mb`: no reserved blocks, tables written lazily;
    holding a copy of the directory `files` if given (refused if they do not fit)."""
    tmp = image.with_suffix(".new")
    try:
        with open(tmp, "wb") as f:
            f.truncate(size_mb * _MB)
        _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-L", "oploop-ws",
              "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", str(tmp)],
             f"cannot make a workspace image {image}")
        if files is not None:
            _copy_into(tmp, files, size_mb)
        os.replace(tmp, image)  # an image exists only once it is whole
    finally:
        tmp.unlink(missing_ok=True)


def _copy_into(image: Path, files: Path, size_mb: int) -> None:
    """Copy the directory `files` (owners, modes, links kept) into the new `image`."""
    staging = image.with_suffix(".mnt")
    staging.mkdir(mode=0o700, exist_ok=True)
    try:
        _run(["mount", "-t", "ext4", "-o", _MOUNT_OPTIONS, str(image), str(staging)],
             f"cannot mount the new workspace image {image}")
        try:
            _run(["cp", "-a", f"{files}/.", f"{staging}/"],
                 f"the workspace {files} does not fit its quota of {size_mb} MB "
                 f"(size_mb under [workspaces] in sandbox.toml)")
        finally:
            _unmount(staging)
    finally:
        with contextlib.suppress(OSError):
            staging.rmdir()


def _unmount(path: Path) -> None:
    try:
        _run(["umount", str(path)], f"cannot unmount {path}")
    except WorkspaceRefused:
        # Busy (a process of ours still in it): detach now, the kernel finishes later.
        _run(["umount", "-l", str(path)], f"cannot unmount {path}")


#: Guards `_commands`: how many workspace commands (mkfs, mount, cp...) run now.
_COMMANDS_LOCK = threading.Lock()
_commands = 0


@contextlib.contextmanager
def commands_paused() -> Iterator[bool]:
    """While held, no workspace command starts; yields whether none is running.

    For the executor's orphan sweep (`Sandbox.sweep_orphans`): it kills every
    child that is not a launcher, and these commands are children of the
    executor too (a session's first call making its image while another call
    of it ends had its mkfs killed).
    """
    with _COMMANDS_LOCK:
        yield _commands == 0


@contextlib.contextmanager
def _counted() -> Iterator[None]:
    global _commands
    with _COMMANDS_LOCK:
        _commands += 1
    try:
        yield
    finally:
        with _COMMANDS_LOCK:
            _commands -= 1


def _run(argv: list[str], what: str) -> None:
    try:
        with _counted():
            done = subprocess.run(argv, capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT_S, check=False,
                                  stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise WorkspaceRefused(f"{what}: {exc}") from exc
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise WorkspaceRefused(f"{what}: {detail[-1] if detail else f'exit {done.returncode}'}")
