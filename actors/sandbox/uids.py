"""One uid per session, from a configured range: sessions cannot starve or signal each other.

RLIMIT_NPROC counts processes per uid across the whole machine, so with one
uid for every sandbox, one session holding processes made every other
session's `shell` fail with "Cannot fork". A uid per session confines that
(and signals, ptrace, /proc access) to the session itself.

The record of which session holds which uid is the owner of its workspace
directory, indexed by a claim per uid (`CLAIMS`) that is only trusted while
that workspace still exists with that owner: a removed session frees its uid.
A new session takes the uid its workspace path hashes to (blake2b, the same in
every process), or the next uid of the range no live workspace holds (linear
probing): two live sessions hashing to the same uid get different ones. The
choice is made under an exclusive `flock` on the workspaces directory, so two
executors of one host assigning at once cannot pick the same uid. A range of a single
uid (`uid = N`) is the operator's explicit choice to share it.

Hosts on one machine do not see each other's workspaces: two homes sharing a
range only hash differently (the workspace path is hashed); give each home its
own `uid_range` where sessions of different hosts must never share a uid.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from actors.digests import blake2b


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
    digest = blake2b(key, digest_size=8).digest()
    return first + int.from_bytes(digest, "big") % (last - first + 1)


CLAIMS = ".uids"
"""In the workspaces directory: one symlink per uid held, `<uid>` -> the workspace's
name, so a probe costs a readlink and a stat, not a scan of every workspace.
(Not a possible workspace name: those are letters, digits, '-' and '_'.)"""


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
        if first == last:  # one uid for all: the operator's choice, nothing to record
            uid = first
        elif first <= owner <= last:
            _claim(_claims(workspaces, first, last), owner, name)
            return path, owner
        else:
            uid = _free_uid(workspaces, name, first, last)
        if owner == uid:
            return path, uid
        if owner < 0:
            path.mkdir(mode=0o700)
            os.chown(path, uid, uid)
        else:
            _chown_tree(path, uid)
    return path, uid


def _free_uid(workspaces: Path, name: str, first: int, last: int) -> int:
    claims = _claims(workspaces, first, last)
    start = preferred(workspaces, name, first, last)
    size = last - first + 1
    for step in range(size):
        uid = first + (start - first + step) % size
        if _holder(claims, workspaces, uid, first, last) in (None, name):
            _claim(claims, uid, name)
            return uid
    raise UidsExhausted(first, last, workspaces)


def _holder(claims: Path, workspaces: Path, uid: int, first: int, last: int) -> str | None:
    """The workspace holding `uid`, or None (no claim, or a stale one: the workspace
    is gone, or has another uid of the range now). A workspace owned by a uid outside
    the range keeps its claim: an unmounted quota image's mount point, say."""
    try:
        name = os.readlink(claims / str(uid))
    except FileNotFoundError:
        return None
    try:
        owner = os.stat(workspaces / name, follow_symlinks=False).st_uid
    except FileNotFoundError:
        return None
    return None if owner != uid and first <= owner <= last else name


def _claim(claims: Path, uid: int, name: str) -> None:
    link = claims / str(uid)
    try:
        if os.readlink(link) == name:
            return
        os.unlink(link)  # stale: its workspace is gone or has another uid (checked)
    except FileNotFoundError:
        pass
    os.symlink(name, link)


def _claims(workspaces: Path, first: int, last: int) -> Path:
    """The claims directory; made from the workspaces' owners when missing (once)."""
    claims = workspaces / CLAIMS
    if claims.is_dir():
        return claims
    claims.mkdir(mode=0o700)
    with os.scandir(workspaces) as entries:
        for entry in entries:
            if entry.name == CLAIMS or not entry.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(FileNotFoundError):
                uid = entry.stat(follow_symlinks=False).st_uid
                if first <= uid <= last and _holder(claims, workspaces, uid, first, last) is None:
                    _claim(claims, uid, entry.name)
    return claims


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
