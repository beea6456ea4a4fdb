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

READY_FD_ENV = "OPLOOP_READY_FD"
PARENT_PID_ENV = "OPLOOP_PARENT_PID"

_PR_SET_PDEATHSIG = 1


def setup_logging(name: str) -> None:
    """Log to stderr as `name[pid] LEVEL message`; `OPLOOP_LOG_LEVEL` sets the level."""
    level = os.environ.get("OPLOOP_LOG_LEVEL", "WARNING").upper()
    logging.basicConfig(
        level=getattr(logging, level, logging.INFO),
        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(message)s",
        stream=sys.stderr,
    )


def die_with_parent() -> None:
    """Ask the kernel to SIGTERM us when the host dies, and exit if it already has.

    Done in the child itself at start-up (not as `preexec_fn`, which is unsafe in
    a threaded parent). The parent pid from the environment closes the race of
    a host that died before prctl ran.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    expected = os.environ.get(PARENT_PID_ENV)
    if expected and os.getppid() != int(expected):
        sys.exit(0)


def notify_ready() -> None:
    """Tell whoever started us that we serve (a line on the inherited ready pipe)."""
    fd = os.environ.pop(READY_FD_ENV, None)
    if fd is None:
        return
    try:
        os.write(int(fd), b"ready\n")
        os.close(int(fd))
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


def run_actor(name: str, main: Callable[[], Awaitable[None]], *, with_parent: bool = True) -> None:
    """Run `main()` on uvloop until it returns or SIGTERM/SIGINT arrives.

    `with_parent`: the actor dies with the host that started it (not the host itself).
    """
    setup_logging(name)
    if with_parent:
        die_with_parent()
    uvloop.run(until_signal(name, main()))
