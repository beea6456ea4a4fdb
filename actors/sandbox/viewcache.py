"""Remembered views: a session's view decided once, then checked by a few `lstat`s.

A call's view (`modes.view_for`) resolves the working directory (`realpath`:
an `lstat` per component), stats it, checks access, and filters the agent's
`write_paths`: ~35 us, decided in a thread because the directory may be on a
file system that hangs, and the hop to the thread cost ~90 us of CPU more.
Sessions of one agent in one directory ask for the same view call after call.

So a view is remembered with the state of the file system it was decided from:
the type of every component of the working directory and of each write path
(a directory, absent, anything else), and the working directory's owner. A
later call gets the remembered view only when those are the same now, checked
on the loop (an `lstat` per component, one `access`), which is exactly when
`view_for` would decide the same view: with no link on the way, `realpath` of
the path is the path itself; a directory removed, replaced by a link or by a
file, remade under another owner, or a write path that appeared or went, is
a miss, decided afresh in the thread. Scratch views read nothing of the file
system once decided (their homes and hidden paths are kept by `modes`).

Checked on the loop only where that cannot hang: every mount on the way is a
local file system (`LOCAL_FS`: no NFS, FUSE, autofs, ...), as the mount table
said when the view was decided, and the mount table has not changed since (a
poll of `/proc/self/mountinfo`, which the kernel signals on any mount or
unmount: then everything remembered is forgotten). Paths with a link or `~user`
on the way, and any view decided from a state that changed meanwhile, are
never remembered: they are decided in the thread every time, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import stat
from collections.abc import Callable
from dataclasses import dataclass

from . import modes

log = logging.getLogger("oploop.sandbox")

#: File systems whose `lstat` never waits on a server or a daemon (mountinfo's names).
LOCAL_FS = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "bcachefs", "f2fs", "jfs", "reiserfs",
    "nilfs2", "zfs", "tmpfs", "ramfs", "overlay", "squashfs", "erofs", "vfat", "exfat",
    "hfsplus", "ntfs3", "iso9660", "udf",
})
#: Views remembered at most (the oldest forgotten first).
MAX_VIEWS = 256
_ABSENT = 0  # the recorded type of a path that does not exist (or cannot be looked at)

Decide = Callable[..., modes.WorkView]
Key = tuple[str, str, str, tuple[str, ...], tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Remembered:
    """A view and the file system state it was decided from."""

    key: Key
    view: modes.WorkView
    #: (path, file type as `lstat` said, 0: absent) of every component checked.
    kinds: tuple[tuple[str, int], ...]
    #: The working directory's (uid, gid); None for a scratch view.
    owner: tuple[int, int] | None
    generation: int


def _kind(path: str) -> int:
    try:
        return stat.S_IFMT(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return _ABSENT


def _components(path: str) -> list[str]:
    """Every prefix of the absolute, normalised `path` ("/a/b": "/a", "/a/b")."""
    parts = path.split("/")[1:]
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _canonical(path: str) -> bool:
    """Whether `path` is absolute and normalised (what `realpath` returns for it when no
    link is on the way), and not the root."""
    return (os.path.isabs(path) and os.path.normpath(path) == path and path != "/"
            and not path.startswith("//"))


def unescape_mount_point(field: str) -> str:
    """A mount point as mountinfo writes it (space, tab, newline, backslash octal-escaped)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounts(text: str) -> list[tuple[str, str]]:
    """(mount point, file system type) of each line of a mountinfo."""
    out = []
    for line in text.splitlines():
        fields = line.split(" ")
        with contextlib.suppress(ValueError, IndexError):
            dash = fields.index("-")
            out.append((unescape_mount_point(fields[4]), fields[dash + 1]))
    return out


def all_local(paths: list[str], table: list[tuple[str, str]]) -> bool:
    """Whether every mount at or above any of `paths` is of a `LOCAL_FS` type."""
    for point, fstype in table:
        prefix = point.rstrip("/") + "/"
        if fstype not in LOCAL_FS and any(p == point or p.startswith(prefix) for p in paths):
            return False
    return True


class MountWatch:
    """Tells whether the mount table changed since the last look (the kernel marks
    an open `/proc/self/mountinfo` on any mount or unmount; a poll sees it once)."""

    def __init__(self, path: str = "/proc/self/mountinfo") -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._poll = select.poll()
        self._poll.register(self._fd, select.POLLPRI | select.POLLERR)

    def changed(self) -> bool:
        """Whether a mount or unmount happened since the last call (no wait)."""
        return bool(self._poll.poll(0))

    def table(self) -> list[tuple[str, str]]:
        """The mount table now (reads the file: in a thread)."""
        with open(self.path, encoding="utf-8", errors="surrogateescape") as f:
            return mounts(f.read())

    def close(self) -> None:
        """Let go of the file."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ViewCache:
    """The views of `decide` (`modes.view_for` with the sandbox's secrets), remembered.

    `lookup` on the loop (a remembered view still true, or None); on None,
    `decide` in a thread (the view, and what to remember of it), then `keep`
    on the loop. Without a mount `watch` (its opener) nothing is remembered.
    """

    def __init__(self, decide: Decide, secret: tuple[str, ...] = (),
                 watch: Callable[[], MountWatch] | None = MountWatch) -> None:
        self._decide = decide
        self._secret = secret
        #: Opened at the first lookup (a sandbox that decides no view holds no file).
        self._open_watch = watch
        self._watch: MountWatch | None = None
        self._views: dict[Key, Remembered] = {}
        self.generation = 0
        self.hits = 0
        self.misses = 0

    def _watching(self) -> MountWatch | None:
        if self._watch is None and self._open_watch is not None:
            opener, self._open_watch = self._open_watch, None
            try:
                self._watch = opener()
            except OSError as exc:  # no /proc: every view is decided in a thread
                log.info("views not remembered: %s", exc)
        return self._watch

    @staticmethod
    def key(mode: str, cwd: str, workspace: str, write_paths: tuple[str, ...] = (),
            deny_read: tuple[str, ...] = ()) -> Key:
        """What a view depends on besides the file system (the workspace only in scratch
        mode, or with no working directory: sessions of one agent in one directory
        share one view)."""
        scratch = mode == modes.SCRATCH or not cwd
        return (mode, cwd, workspace if scratch else "", tuple(write_paths), tuple(deny_read))

    def lookup(self, key: Key) -> modes.WorkView | None:
        """The remembered view of `key` if the file system still says the same, else None
        (on the loop: a poll, an `lstat` per component on local file systems)."""
        watch = self._watching()
        if watch is None:
            return None
        if watch.changed():
            self.generation += 1
            self._views.clear()
            return None
        found = self._views.get(key)
        if found is None or not self._still(found):
            self.misses += 1
            return None
        self.hits += 1
        return found.view

    def _still(self, found: Remembered) -> bool:
        cwd = found.view.cwd
        for path, kind in found.kinds:
            if path != cwd or found.owner is None:
                if _kind(path) != kind:
                    return False
                continue
            try:  # the working directory: its type and its owner in one look
                st = os.lstat(cwd)
            except (OSError, ValueError):
                return False
            if stat.S_IFMT(st.st_mode) != kind or (st.st_uid, st.st_gid) != found.owner:
                return False
        return found.owner is None or os.access(cwd, os.R_OK | os.X_OK)

    def decide(self, key: Key) -> tuple[modes.WorkView, Remembered | None]:
        """The view of `key`, and what to remember of it (None: nothing), in a thread.
        Raises what `decide` raises (WorkdirRefused)."""
        mode, cwd, workspace, write_paths, deny_read = key
        generation = self.generation
        if not cwd or mode == modes.SCRATCH:
            view = self._decide(mode, cwd, workspace, write_paths=write_paths,
                                deny_read=deny_read)
            return view, Remembered(key, view, (), None, generation)
        paths = self._paths(cwd, write_paths)
        before = _record(paths) if paths is not None else None
        view = self._decide(mode, cwd, workspace, write_paths=write_paths, deny_read=deny_read)
        if paths is None or before is None or self._watch is None:
            return view, None
        # Recorded before and after: a view decided while a path changed and changed
        # back is caught by `_agrees` (it is not what the recorded state gives).
        kinds = _record(paths)
        if kinds is None or kinds != before or not all_local(paths, self._watch.table()):
            return view, None
        owner = (view.uid, view.gid)
        try:
            st = os.lstat(cwd)
        except OSError:
            return view, None
        if (st.st_uid, st.st_gid) != owner or not self._agrees(view, cwd, write_paths, kinds):
            return view, None
        return view, Remembered(key, view, kinds, owner, generation)

    def close(self) -> None:
        """Forget everything; let go of the mount table."""
        self._views.clear()
        self._open_watch = None
        if self._watch is not None:
            self._watch.close()
            self._watch = None

    def keep(self, found: Remembered) -> None:
        """Remember a view `decide` returned (on the loop; one decided before the mount
        table changed is dropped)."""
        if found.generation != self.generation:
            return
        if len(self._views) >= MAX_VIEWS and found.key not in self._views:
            del self._views[next(iter(self._views))]
        self._views[found.key] = found

    @staticmethod
    def _paths(cwd: str, write_paths: tuple[str, ...]) -> list[str] | None:
        """Every component to check, or None when the view cannot be remembered (a path
        not in its canonical form, `~user`)."""
        if not _canonical(cwd):
            return None
        paths = _components(cwd)
        for path in write_paths:
            expanded = _expanded(path)
            if expanded is None or not _canonical(expanded):
                return None
            paths += [p for p in _components(expanded) if p not in paths]
        return paths

    def _agrees(self, view: modes.WorkView, cwd: str, write_paths: tuple[str, ...],
                kinds: tuple[tuple[str, int], ...]) -> bool:
        """Whether `view` is what `view_for` decides from the recorded `kinds` (it was
        not decided from a state that came and went meanwhile)."""
        kind = dict(kinds)
        if view.cwd != cwd or any(kind[p] != stat.S_IFDIR for p in _components(cwd)):
            return False
        if view.mode != modes.WORKSPACE_WRITE:
            return view.writable == ()
        writable = [cwd]
        for path in write_paths:
            expanded = _expanded(path)
            assert expanded is not None
            if (kind.get(expanded) == stat.S_IFDIR
                    and not modes._under(expanded, (*view.hidden, *self._secret))
                    and not modes.not_writable(expanded)):
                writable.append(expanded)
        # (no link on the way was recorded: none can have been left out for one)
        return view.writable == tuple(dict.fromkeys(writable)) and not view.linked


def _record(paths: list[str]) -> tuple[tuple[str, int], ...] | None:
    """The type of each path, or None if one is a link (`realpath` would follow it)."""
    kinds = tuple((p, _kind(p)) for p in paths)
    if any(k == stat.S_IFLNK for _, k in kinds):
        return None
    return kinds


def _expanded(path: str) -> str | None:
    """`path` with `~` expanded as `view_for` does (None for `~user`: a passwd lookup)."""
    if path == "~" or path.startswith("~/"):
        return os.path.expanduser(path)
    return None if path.startswith("~") else path
