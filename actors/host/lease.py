"""Who uses an embedded host: two file locks in the home's run dir.

An `oploop run` that finds no host starts one in the background (`python -m
actors.host` with `OPLOOP_EMBEDDED=1`); every CLI using it holds a shared lock
on `embedded.users`, taken before the host exists (so that it never finds itself
unused before its first user joined). The host checks every `POLL_S` whether it
can take that lock exclusively: then nobody uses it any more (the last user
exited, however it exited: the kernel drops a dead process's locks) and it stops.
`embedded.mutex` orders the two: a user joins, or a host decides to stop, only
while holding it, so no one joins a host that is stopping.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from pathlib import Path

MUTEX_FILE = "embedded.mutex"
USERS_FILE = "embedded.users"
#: How often a waiting side looks again (the locks are not waited on in a thread, which
#: would outlive a cancel).
POLL_S = 0.05


def _open(run_dir: Path, name: str) -> int:
    return os.open(run_dir / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def _try(fd: int, how: int) -> bool:
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def try_mutex(run_dir: Path) -> int | None:
    """The mutex's fd if it is free now (close it to release), else None."""
    fd = _open(run_dir, MUTEX_FILE)
    if _try(fd, fcntl.LOCK_EX):
        return fd
    os.close(fd)
    return None


async def mutex(run_dir: Path) -> int:
    """Wait for the mutex; its fd (close it to release)."""
    while True:
        fd = try_mutex(run_dir)
        if fd is not None:
            return fd
        await asyncio.sleep(POLL_S)


def join(run_dir: Path) -> int | None:
    """Become a user (a shared lock, held until the fd is closed or we exit), or None
    when the host is stopping (it holds the lock exclusively)."""
    fd = _open(run_dir, USERS_FILE)
    if _try(fd, fcntl.LOCK_SH):
        return fd
    os.close(fd)
    return None


def unused(run_dir: Path) -> int | None:
    """The users lock taken exclusively (nobody uses the host), or None."""
    fd = _open(run_dir, USERS_FILE)
    if _try(fd, fcntl.LOCK_EX):
        return fd
    os.close(fd)
    return None


async def until_unused(run_dir: Path, poll_s: float = 0.1) -> int:
    """Wait until no CLI uses the host; returns the mutex's fd, held so that no one
    joins while the host stops (close it once stopped)."""
    while True:
        await asyncio.sleep(poll_s)
        held = try_mutex(run_dir)
        if held is None:
            continue
        users = unused(run_dir)
        if users is not None:
            os.close(users)  # the mutex keeps newcomers out from here on
            return held
        os.close(held)
