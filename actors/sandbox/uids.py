"""One uid per session, from a configured range: sessions cannot starve or signal each other.

RLIMIT_NPROC counts processes per uid across the whole machine, so with one
uid for every sandbox, one session holding processes made every other
session's `shell` fail with "Cannot fork". A uid per session confines that
(and signals, ptrace, /proc access) to the session itself.

The record of which session holds which uid is the owner of its workspace
directory: nothing else to keep in step, and it survives restarts. A new
session takes the uid its workspace path hashes to (blake2b, the same in every
process), or the next uid of the range that no other workspace owns (linear probing):
two live sessions hashing to the same uid get different ones. The choice is
made under an exclusive `flock` on the workspaces directory, so two executors
of one host assigning at once cannot pick the same uid. A range of a single
uid (`uid = N`) is the operator's explicit choice to share it.

Hosts on one machine do not see each other's workspaces: two homes sharing a
range only hash differently (the workspace path is hashed); give each home its
own `uid_range` where sessions of different hosts must never share a uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path


class UidsExhausted(Exception):
    """Every uid of the range already owns another session's workspace."""

    def __init__(self, first: int, last: int, workspaces: Path) -> None:
        super().__init__(
            f"every sandbox uid of [{first}, {last}] owns a session workspace in {workspaces}; "
            f"widen uid_range in sandbox.toml or remove old sessions"
        )
        self.first = first
        self.last = last


def preferred(workspaces: Path, name: str, first: int, last: int) -> int:
    """The uid the workspace `workspaces/name` hashes to in [first, last]: where its
    probe starts. The path, not the bare session id, so two homes sharing a range
    do not map their "default" sessions to one uid."""
    key = os.fsencode(str(workspaces.absolute() / name))
    digest = hashlib.blake2b(key, digest_size=8).digest()
    return first + int.from_bytes(digest, "big") % (last - first + 1)


def assign(workspaces: Path, name: str, first: int, last: int) -> tuple[Path, int]:
    """Create (0700) or find the workspace `workspaces/name`, owned by its session's uid.

    A workspace already owned by a uid of the range keeps it; one owned by
    anything else (made before, under another range) is given a uid and
    chowned, all of it. Raises UidsExhausted when no uid is free.
    """
    path = workspaces / name
    workspaces.mkdir(parents=True, exist_ok=True)
    with _locked(workspaces):
        try:
            owner = os.stat(path).st_uid
        except FileNotFoundError:
            owner = -1
        if first <= owner <= last:
            return path, owner
        uid = _free_uid(workspaces, name, first, last)
        if owner < 0:
            path.mkdir(mode=0o700)
            os.chown(path, uid, uid)
        else:
            _chown_tree(path, uid)
    return path, uid


def _free_uid(workspaces: Path, name: str, first: int, last: int) -> int:
    start = preferred(workspaces, name, first, last)
    if first == last:
        return first
    taken = _taken(workspaces, name)
    size = last - first + 1
    for step in range(size):
        uid = first + (start - first + step) % size
        if uid not in taken:
            return uid
    raise UidsExhausted(first, last, workspaces)


def _taken(workspaces: Path, name: str) -> set[int]:
    """The uids owning the other workspaces (read only when a session starts)."""
    taken: set[int] = set()
    with os.scandir(workspaces) as entries:
        for entry in entries:
            if entry.name != name and entry.is_dir(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    taken.add(entry.stat(follow_symlinks=False).st_uid)
    return taken


def _chown_tree(path: Path, uid: int) -> None:
    """Give a whole workspace to `uid` (once, when its session gets a new uid)."""
    os.lchown(path, uid, uid)
    for root, dirs, files in os.walk(path):
        for entry in (*dirs, *files):
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(root, entry), uid, uid)


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """Hold an exclusive flock on `directory` itself (no lock file among the workspaces)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the last fd releases the lock
