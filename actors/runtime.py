"""What every actor process does the same way: logging, dying with the host,
readiness notification, uvloop, handing freed heap back to the OS, and a clean
exit on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable

from actors.config import ConfigError
from actors.settings import PARENT_PID_ENV, READY_FD_ENV, Settings, load_settings

__all__ = ["PARENT_PID_ENV", "READY_FD_ENV", "host_gone", "join_host", "notify_ready",
           "run_actor", "stop_now", "stopping", "until_signal"]

_PR_SET_PDEATHSIG = 1
#: Seconds between two `malloc_trim(0)` calls in every actor. glibc keeps what a burst
#: freed (a batch of sessions, a retention round, a thread's arena) resident for good
#: unless asked: an actor grew ~0.3-1 KB per finished session that way (issue 13).
#: A trim of an idle actor's heap takes well under a millisecond.
HEAP_TRIM_S = 10.0
#: Allocations (less frees) of container objects between two young-generation
#: collections (CPython's default: 700). An actor's turn allocates thousands of short-lived
#: dicts and tuples, nearly all freed by their counts: at 700 the collector ran several
#: times a turn, each pass walking whatever was young then (`docs/architecture.md`).
GC_YOUNG_THRESHOLD = 20_000
#: The ready pipe of this process (`Settings.ready_fd`), until `notify_ready` uses it.
_ready_fd: int | None = None
#: The pid of the host this actor dies with (`die_with_parent`), None if it dies with none.
_host_pid: int | None = None
#: Set once a SIGTERM/SIGINT asked this actor to stop (`until_signal`).
_stop_asked = False


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
    of a host that died before prctl ran, and is what `host_gone` compares with.
    """
    global _host_pid
    _host_pid = expected or None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if expected and os.getppid() != expected:
        sys.exit(0)


def host_gone() -> bool:
    """Whether the host this actor dies with has died (it has a new parent). True from
    the host's death on: the kernel re-parents all the host's children, in one pass as
    it exits, each before it sends it the death signal, so a sibling that acts on that
    signal (an executor saying goodbye) finds it true in the others already."""
    return _host_pid is not None and os.getppid() != _host_pid


def stopping() -> bool:
    """Whether this actor is on its way out: asked to stop (SIGTERM/SIGINT, handled or
    not yet unwound), or its host died (its SIGTERM is on its way). What it still says
    then must not look like news of a live process (a worker's `Ready`)."""
    return _stop_asked or host_gone()


def stop_now() -> None:
    """Stop this actor as its SIGTERM would (the same handler: `until_signal`)."""
    signal.raise_signal(signal.SIGTERM)


def notify_ready() -> None:
    """Tell whoever started us that we serve (a line on the inherited ready pipe)."""
    global _ready_fd
    settle_heap()
    fd, _ready_fd = _ready_fd, None
    os.environ.pop(READY_FD_ENV, None)  # not inherited by what this process starts
    if fd is None:
        return
    try:
        os.write(fd, b"ready\n")
        os.close(fd)
    except OSError:
        pass


def settle_heap() -> None:
    """Once start-up is over: what it made (modules, config, the loop's machinery) is
    moved out of the collector's sight (`gc.freeze`), so that no later full collection
    walks it again. (No collection first: a full one delayed readiness by tens of ms on
    a busy machine, for the few start-up cycles it would free.)"""
    gc.freeze()


def read_ready_line(fd: int) -> bytes:
    """The other end of `notify_ready`: one short line read from the ready pipe (b""
    when the child closed it, or died, without saying it). Blocking: run it in a thread."""
    out = b""
    while not out.endswith(b"\n"):
        chunk = os.read(fd, 64)
        if not chunk:
            break
        out += chunk
    return out


def heap_trimmer() -> Callable[[], int] | None:
    """glibc's `malloc_trim(0)` (every arena's free memory back to the OS), or None
    where there is no glibc."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return lambda: int(trim(0))


async def trim_heap(every_s: float = HEAP_TRIM_S) -> None:
    """Hand the freed heap back to the OS every `every_s`, until cancelled."""
    trim = heap_trimmer()
    if trim is None:
        return
    while True:
        await asyncio.sleep(every_s)
        trim()


async def _with_heap_trim(main: Awaitable[None], name: str = "",
                          memtrace_s: float = 0.0) -> None:
    helpers = [asyncio.create_task(trim_heap(), name="heap-trim")]
    if memtrace_s > 0:  # OPLOOP_MEMTRACE: a debugging switch
        from actors.memtrace import trace_memory

        helpers.append(asyncio.create_task(trace_memory(name, memtrace_s), name="memtrace"))
    try:
        await main
    finally:
        for helper in helpers:
            helper.cancel()


async def until_signal(name: str, main: Awaitable[None]) -> None:
    """Await `main`, cancelling it on SIGTERM/SIGINT (a cancel is a clean stop)."""
    task = asyncio.ensure_future(main)
    loop = asyncio.get_running_loop()

    def stop() -> None:
        global _stop_asked
        _stop_asked = True  # (at once: the cancel unwinds over the next iterations)
        task.cancel()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
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
              with_parent: bool = True, settings: Settings | None = None,
              fast_loop: bool = True) -> None:
    """Read the settings (unless given), then run `main(settings)` on uvloop until it
    returns or SIGTERM/SIGINT arrives. A bad setting exits 2 with the reason.

    `with_parent`: the actor dies with the host that started it (not the host itself).
    `fast_loop=False`: asyncio's own loop, for a process that only starts children and
    waits (the host): uvloop is ~2 MB resident, and buys nothing there.
    """
    if settings is None:
        try:
            settings = load_settings()
        except ConfigError as exc:
            print(f"oploop {name}: bad configuration: {exc}", file=sys.stderr)
            sys.exit(2)
    setup_logging(name, settings.log_level)
    join_host(settings, with_parent=with_parent)
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    actor = until_signal(name, _with_heap_trim(main(settings), name, settings.memtrace_s))
    if not fast_loop:
        asyncio.run(actor)
        return
    from actors.nossl import import_uvloop  # (with `ssl` kept out by some `__main__`s)

    import_uvloop().run(actor)
