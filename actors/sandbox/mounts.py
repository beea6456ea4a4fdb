"""The launcher's mount view: hidden host paths, kept paths bound back, /run, /sys, /proc.

Applied by the launcher (`launcher.py`) in the call's new mount namespace.
Imported both as a top-level module and as actors.sandbox.mounts, standard
library only (see launcher.py).
"""

from __future__ import annotations

import ctypes
import os
import stat

if __package__:
    from actors.sandbox.lockdown import (
        MNT_DETACH,
        MS_BIND,
        MS_NODEV,
        MS_NOEXEC,
        MS_NOSUID,
        MS_PRIVATE,
        MS_RDONLY,
        MS_REC,
        MS_REMOUNT,
        _check,
        _libc,
        open_without_links,
    )
else:
    from lockdown import (  # type: ignore[no-redef]
        MNT_DETACH,
        MS_BIND,
        MS_NODEV,
        MS_NOEXEC,
        MS_NOSUID,
        MS_PRIVATE,
        MS_RDONLY,
        MS_REC,
        MS_REMOUNT,
        _check,
        _libc,
        open_without_links,
    )

TYPE_CHECKING = False  # `typing` costs an import on every call; annotations only need it here
if TYPE_CHECKING:
    from typing import Any


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    def enc(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    _check(_libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def setup_mounts(spec: dict[str, Any], new_proc: bool) -> None:
    """In a new mount namespace: the tree read-only but the writable paths (on the
    user's files), hide host paths under tmpfs, bind the kept ones back, pin the hidden
    paths' parents, new /proc.

    A kept path (the workspace, what a read may see) that lies under a hidden
    one is bound back at its own place inside the tmpfs, through an fd opened
    before it disappeared: the tmpfs is traversable, so the tool uid reaches it
    even when the real parents are not (a home under a 0700 /root). The hidden
    paths inside it (a `deny_read` entry in a working directory under /tmp) were
    out of sight until then: they are hidden once it is back.
    """
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    if spec.get("read_only_but") is not None:
        read_only_but(spec["read_only_but"])
    kept = []
    for path in spec["keep"]:
        try:
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue  # absent (or unreachable): nothing to bind back
        if stat.S_ISLNK(os.fstat(fd).st_mode):  # swapped for a link since it was resolved
            os.close(fd)
            continue
        kept.append((path, fd))
    detach_hidden_mounts([p for p, _ in spec["hide"]], [p for p, _ in kept])
    hidden = _hide(spec["hide"], spec["tmpfs_size"])
    back = [mark for path, fd in kept if (mark := _bind_back(path, fd, hidden))]
    _hide([(p, mode) for p, mode in spec["hide"] if any(p.startswith(b) for b in back)],
          spec["tmpfs_size"])
    pin(spec.get("pin", ()))  # (last: each pin carries the mounts beneath it)
    if new_proc:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


def _hide(entries: list[tuple[str, str]], size: str) -> list[str]:
    """Cover each directory of `entries` (path, mode) with an empty tmpfs of that mode,
    each file with `/dev/null`; the directories covered, as `path/`. One out of sight
    (absent, or beneath one covered already) is left."""
    hidden: list[str] = []
    for path, mode in entries:
        if not os.path.isdir(path):  # absent, a file, or already under a hidden path
            if os.path.isfile(path) and not any((path + "/").startswith(h) for h in hidden):
                _hide_file(path)
            continue
        _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode={mode}")
        hidden.append(path.rstrip("/") + "/")
    return hidden


def _bind_back(path: str, fd: int, hidden: list[str]) -> str:
    """Bind the kept `path` (opened as `fd`, closed here) back at its place if it lies
    under one of `hidden`; `path/` if it was, else ""."""
    try:
        if not any((path + "/").startswith(h) for h in hidden):
            return ""
        _mount_point(path, stat.S_ISDIR(os.fstat(fd).st_mode))
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
        return path.rstrip("/") + "/"
    finally:
        os.close(fd)


#: mount_setattr(2) (linux/mount.h; the same number on every architecture). Since 5.12,
#: older than Landlock (5.13), which the modes on the user's files require anyway.
SYS_MOUNT_SETATTR = 442
AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 0x1


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64),
                ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


def _set_read_only(path: str, read_only: bool, recursive: bool) -> None:
    """Make the mount at `path` (a mount's root; `recursive`: and every mount beneath)
    read-only, or writable again."""
    attr = _MountAttr(MOUNT_ATTR_RDONLY if read_only else 0,
                      0 if read_only else MOUNT_ATTR_RDONLY, 0, 0)
    flags = AT_SYMLINK_NOFOLLOW | (AT_RECURSIVE if recursive else 0)
    _check(_libc.syscall(SYS_MOUNT_SETATTR, AT_FDCWD, path.encode("utf-8", "surrogateescape"),
                         flags, ctypes.byref(attr), ctypes.sizeof(attr)),
           f"mount_setattr {path}")


def _read_only_points() -> dict[str, bool]:
    """Each mount point of this namespace, and whether its visible (topmost) mount is
    read-only."""
    points = {}
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split(b" ", 6)
            points[_unescape(fields[4])] = b"ro" in fields[5].split(b",")
    return points


def _was_read_only(path: str, before: dict[str, bool]) -> bool:
    """Whether `path` was on a read-only mount in `before` (its deepest mount point's)."""
    while path not in before and path != "/":
        path = os.path.dirname(path)
    return before.get(path, True)


def read_only_but(writable: list[str]) -> None:
    """Every mount of the call's view read-only but the `writable` paths, each first
    bound onto itself (a mount of its own to leave writable).

    Landlock has no right for a file's mode, owner, times or extended attributes:
    without this, a tool running as the user could `chmod 777` any file of theirs
    outside the working directory, and one running as root (a root-owned project)
    `/etc/passwd`. A read-only mount refuses them all (EROFS), as it does a write.
    Only this namespace's copies of the mounts change, never the host's. Devices
    (/dev/null) are written through whatever their mount says. A mount that was
    read-only (one the user mounted so in the project) stays so.
    """
    before = _read_only_points()
    bound = [path for path in writable if _bind_onto_itself(path)]
    _set_read_only("/", True, recursive=True)
    marks = [b.rstrip("/") + "/" for b in bound]
    # The mounts now at or beneath a bound path: the binds themselves and the copies
    # they carried (MS_REC), at the paths the mounts beneath had before: no second read
    # of the mount table. By name: a link swapped in since is no mount's root (EINVAL:
    # the call is refused).
    beneath = [p for p in before if any((p.rstrip("/") + "/").startswith(b) for b in marks)]
    for point in dict.fromkeys((*bound, *beneath)):
        if not _was_read_only(point, before):
            _set_read_only(point, False, recursive=False)


def pin(paths: list[str] | tuple[str, ...]) -> None:
    """Bind each of `paths`, the directories between a writable path and a hidden path
    beneath it (`launchspec.pinned`), onto itself, the shallowest first.

    A hidden path is hidden by its name, each call: had a tool renamed one of its
    parents (`mv config cfg`), its next call would find `cfg/secrets` under no
    tmpfs. A mount point cannot be renamed (EBUSY), nor can one be moved away
    from beneath it; the hidden path itself is one already (its tmpfs).
    """
    for path in paths:
        _bind_onto_itself(path)


def _bind_onto_itself(path: str) -> bool:
    """Make the directory `path` a mount of its own (its mounts beneath kept); False
    when it is not one to bind (`_open_dir`)."""
    fd = _open_dir(path)
    if fd < 0:
        return False
    try:
        _mount(f"/proc/self/fd/{fd}", f"/proc/self/fd/{fd}", None, MS_BIND | MS_REC, None)
    finally:
        os.close(fd)
    return True


def _open_dir(path: str) -> int:
    """An O_PATH fd of the directory `path`, reached through no link; -1 for a link on
    the way, a file or nothing (nothing to bind there). The writable paths are resolved
    by the executor (a link on the way was swapped in since: the path stays read-only);
    a hidden path given through a link is pinned by its resolved twin (`credential_paths`
    lists both)."""
    try:
        fd = open_without_links(path)
    except OSError:
        return -1
    if not stat.S_ISDIR(os.fstat(fd).st_mode):
        os.close(fd)
        return -1
    return fd


def _hide_file(path: str) -> None:
    """Cover a hidden file (a credential file such as ~/.netrc) with /dev/null bound on
    it, remounted nodev and read-only: opening it fails (EACCES), as for a hidden folder."""
    _mount("/dev/null", path, None, MS_BIND, None)
    _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, None)


def user_entries(spec: dict[str, Any]) -> None:
    """Bind the generated /etc/passwd and /etc/group (`modes.passwd_lines`) over the
    host's, from the private /run: the tool user has a name and a home."""
    entries = spec.get("passwd")
    if not entries or "/run" not in spec["private_run"]:
        return
    for data, name in zip(entries, ("passwd", "group"), strict=True):
        src = f"/run/.oploop-{name}"
        fd = os.open(src, os.O_CREAT | os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        target = f"/etc/{name}"
        _mount(src, target, None, MS_BIND, None)
        _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV,
               None)
        os.unlink(src)  # the mount holds the file: /run stays empty


def detach_hidden_mounts(hide: list[str], keep: list[str]) -> None:
    """Unmount, in this namespace, every mount under a hidden path but the kept ones.

    A tmpfs over a path hides its files, not the mounts beneath it from the mount
    table: /proc/self/mountinfo would list every session's workspace (its id, its
    home's path) of every home under /root, /home or /tmp. A kept path (the
    session's own workspace) and the mounts holding one stay: it is bound back.
    Each umount costs tens of microseconds: a call pays for every workspace
    mounted on the machine under a hidden path.
    """
    hidden = [h.rstrip("/") + "/" for h in hide]
    kept = [k.rstrip("/") + "/" for k in keep]
    with open("/proc/self/mountinfo", "rb") as f:
        points = [_unescape(line.split(b" ", 5)[4]) for line in f]
    for point in sorted(set(points), key=len, reverse=True):  # the deepest first
        mark = point.rstrip("/") + "/"
        if not any(mark.startswith(h) and mark != h for h in hidden):
            continue
        if any(k.startswith(mark) for k in kept):
            continue
        _libc.umount2(point.encode("utf-8", "surrogateescape"), MNT_DETACH)  # gone: fine


def _unescape(field: bytes) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo.
    if b"\\" in field:
        out, i = bytearray(), 0
        while i < len(field):
            if field[i:i + 1] == b"\\" and field[i + 1:i + 4].isdigit():
                out.append(int(field[i + 1:i + 4], 8))
                i += 4
            else:
                out += field[i:i + 1]
                i += 1
        field = bytes(out)
    return field.decode("utf-8", "surrogateescape")


def mount_view(spec: dict[str, Any], new_proc: bool) -> None:
    """The whole file system view of a call: hidden and kept paths, a new /proc, a
    private /run, and /sys and /proc/sys reduced (after the new /proc: it masks that)."""
    setup_mounts(spec, new_proc)
    private_run(spec["private_run"], spec["tmpfs_size"])
    user_entries(spec)
    mask_host_info(spec["mask"])


def private_run(paths: list[str], size: str) -> None:
    """An empty tmpfs over /run (and a real /var/run): no host daemon's socket inside."""
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   f"size={size},mode=0755")


def mask_host_info(masks: list[tuple[str, list[tuple[str, bytes]]]]) -> None:
    """Cover each masked tree (/sys, /proc/sys) with a small read-only tmpfs holding
    only copies of the few files ordinary tools read (the CPUs online, pid_max...).

    Copies, not binds: a tmpfs and a few writes cost ~0.1 ms, where detaching
    /sys and moving clones of the kept entries back cost several ms per call.
    """
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    for root, files in masks:
        if not os.path.isdir(root):
            continue
        _mount("tmpfs", root, "tmpfs", flags, "size=1m,mode=0555")
        for rel, data in files:
            target = os.path.join(root, rel)
            os.makedirs(os.path.dirname(target), mode=0o555, exist_ok=True)
            fd = os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o444)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        _mount(None, root, None, MS_REMOUNT | MS_RDONLY | flags, "size=1m,mode=0555")


def _mount_point(path: str, directory: bool) -> None:
    """Make an empty directory or file at `path` (in a tmpfs) to bind a kept path on."""
    if directory:
        os.makedirs(path, mode=0o755, exist_ok=True)
        return
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))


def add_readable(spec: dict[str, Any]) -> None:
    """Resolve the extra paths a read may see and add the safe ones to `keep` and Landlock.

    Never one that is, or contains, a hidden path (`/`, `/root`, the oploop
    home...), nor one inside the oploop home or a key folder (`secret`):
    resolved first, so a symbolic link cannot lead there.
    """
    hidden = [p.rstrip("/") + "/" for p, _ in spec["hide"]]
    secret = [p.rstrip("/") + "/" for p in spec["secret"]]
    for path in spec["readable"]:
        real = os.path.realpath(path)
        mark = real.rstrip("/") + "/"
        if any(h.startswith(mark) for h in hidden) or any(mark.startswith(s) for s in secret):
            continue
        spec["keep"].append(real)
        if spec.get("landlock"):
            spec["landlock"]["ro"].append(real)
