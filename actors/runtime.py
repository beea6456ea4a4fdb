"""What every actor process does the same way: logging, dying with the host,
readiness notification, uvloop, and a clean exit on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable

import uvloop

from actors.config import ConfigError
from actors.settings import PARENT_PID_ENV, READY_FD_ENV, Settings, load_settings

__all__ = ["PARENT_PID_ENV", "READY_FD_ENV", "join_host", "notify_ready", "run_actor",
           "until_signal"]

_PR_SET_PDEATHSIG = 1
#: The ready pipe of this process (`Settings.ready_fd`), until `notify_ready` uses it.
_ready_fd: int | None = None


def setup_logging(name: str, level: str = "WARNING") -> None:
    """Log to stderr as `name[pid] LEVEL message` at `level` (`OPLOOP_LOG_LEVEL`)."""
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(message)s",
        stream=sys.stderr,
    )


def die_with_parent(expected: int | None) -> None:
    """Ask the kernel to SIGTERM us when the host dies, and exit if it already has.

    Done in the child itself at start-up (not as `preexec_fn`, which is unsafe in
    a threaded parent). The parent pid the host passed (`expected`) closes the race
    of a host that died before prctl ran.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if expected and os.getppid() != expected:
        sys.exit(0)


def notify_ready() -> None:
    """Tell whoever started us that we serve (a line on the inherited ready pipe)."""
    global _ready_fd
    fd, _ready_fd = _ready_fd, None
    os.environ.pop(READY_FD_ENV, None)  # not inherited by what this process starts
    if fd is None:
        return
    try:
        os.write(fd, b"ready\n")
        os.close(fd)
    except OSError:
        pass


async def until_signal(name: str, main: Awaitable[None]) -> None:
    """Await `main`, cancelling it on SIGTERM/SIGINT (a cancel is a clean stop)."""
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        logging.getLogger("oploop").info("%s stopping", name)


def join_host(settings: Settings, *, with_parent: bool = True) -> None:
    """Take the host's handshake: the ready pipe `notify_ready` writes to, and (with
    `with_parent`) dying with the host."""
    global _ready_fd
    _ready_fd = settings.ready_fd
    if with_parent:
        die_with_parent(settings.parent_pid)


def run_actor(name: str, main: Callable[[Settings], Awaitable[None]], *,
              with_parent: bool = True, settings: Settings | None = None) -> None:
    """Read the settings (unless given), then run `main(settings)` on uvloop until it
    returns or SIGTERM/SIGINT arrives. A bad setting exits 2 with the reason.

    `with_parent`: the actor dies with the host that started it (not the host itself).
    """
    if settings is None:
        try:
            settings = load_settings()
        except ConfigError as exc:
            print(f"oploop {name}: bad configuration: {exc}", file=sys.stderr)
            sys.exit(2)
    setup_logging(name, settings.log_level)
    join_host(settings, with_parent=with_parent)
    uvloop.run(until_signal(name, main(settings)))
