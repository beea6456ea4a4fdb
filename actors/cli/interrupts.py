"""Ctrl-C and SIGTERM in the commands that talk to a host, and how the command takes them.

`asyncio.Runner` turns SIGINT into a cancel of the main task through a Python-level
handler, which runs only when the interpreter gets to it; on uvloop, with the loop
waiting in C, a Ctrl-C in `watch` was seen ignored for 30 s on a busy machine. The
loop's own signal handling (`add_signal_handler`, woken through its self-pipe) does
not depend on that: the first signal cancels the command, which then exits 130
(143 for SIGTERM); a second one, if the command is slow to unwind, exits at once.
`oploop run` has its own (`run.Interrupts`): there a Ctrl-C cancels the session first.

The hand-over, by construction: until then a Ctrl-C is start-up's quiet exit 130
(`actors.quiet_interrupt`: nothing is started yet, and no `KeyboardInterrupt` is raised
that a finaliser could swallow); from the start of the loop (asyncio's runner, whose
handler is then never installed) the signals are `held` (blocked: one that comes waits
in the kernel) until the command `take_over`s them; one that came meanwhile is handed
to it then (nothing of the command has started: it just exits). A SIGINT the command
was started with ignored (a background job of a script) stays ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import NoReturn

from actors.cli.errors import EXIT_CANCELLED, EXIT_TERMINATED, quiet_pipe

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _status(sig: int) -> int:
    return EXIT_TERMINATED if sig == signal.SIGTERM else EXIT_CANCELLED


@contextlib.contextmanager
def held() -> Iterator[None]:
    """SIGINT and SIGTERM blocked until the command's loop `take_over`s them (and the
    mask as it was again on the way out, when a signal still held goes to whoever
    handles it then).

    Between start-up's handler and the loop's, a signal would meet asyncio's runner
    handler (a cancel of a task that has not begun; the runner resets its count just
    after installing it) or the loop's Python-level one; blocked, it waits in the kernel
    for the command itself. Entering runs any signal already caught at the Python level,
    by the handler of the moment (CPython checks when the mask changes): start-up's quiet
    exit. Nothing of the command runs while held but the loop's start: a short wait.
    """
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def take_over(loop: asyncio.AbstractEventLoop,
              on_signal: Callable[[int], object]) -> tuple[list[int], list[int]]:
    """Make `on_signal(sig)`, called in `loop`, the handler of SIGINT and SIGTERM, then
    release what `held` kept. Returns (the signals taken, those of them that came while
    held, lowest first): the caller acts on the second at once, as no handler saw them.

    An ignored signal (a background job's SIGINT, from a shell without job control) is
    not taken: the user's Ctrl-C is meant for the job in the foreground.
    """
    taken = [s for s in _SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
    for sig in taken:
        loop.add_signal_handler(sig, on_signal, sig)
    came: list[int] = []
    # (Taken out of the kernel's pending set while still blocked: none can slip past.)
    while (info := signal.sigtimedwait(_SIGNALS, 0)) is not None:
        if info.si_signo in taken:
            came.append(info.si_signo)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    return taken, came


async def interruptible(command: Awaitable[int]) -> int:
    """Await `command`; a SIGINT or SIGTERM meanwhile (or held, `held`, until now) ends it
    with 130 or 143."""
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    caught: list[int] = []

    def on_signal(sig: int) -> None:
        if caught:  # asked twice: the first cancel is taking too long
            sys.stderr.flush()
            os._exit(_status(caught[0]))
        caught.append(sig)
        main.cancel()

    taken, came = take_over(loop, on_signal)
    try:
        if came:  # before the command began: it never runs
            if isinstance(command, Coroutine):
                command.close()
            print(file=sys.stderr)
            return _status(came[0])
        return await command
    except asyncio.CancelledError:
        if caught and main.uncancel() == 0:
            print(file=sys.stderr)  # the terminal's "^C" ends its line
            return _status(caught[0])
        raise
    finally:
        for sig in taken:
            loop.remove_signal_handler(sig)


def exit_with(status: int) -> NoReturn:
    """Exit with the command's `status`, whatever signal comes now.

    The command is over; a Ctrl-C pressed meanwhile (the second of a cancel, say)
    would otherwise land outside every handler, as an uncaught KeyboardInterrupt,
    which makes the interpreter kill itself with SIGINT (status -2, not 130), or
    during its finalisation, when its handlers are already the defaults. Blocked,
    such a signal stays pending until the process is gone. And the process goes at
    once: nothing is left to clean up (every command closes its own sockets), while
    finalisation would join worker threads, such as one still reading an approval
    answer from the terminal, which no blocked Ctrl-C could then interrupt.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        status = quiet_pipe()
    except (OSError, ValueError):
        pass
    os._exit(status)
