"""Ctrl-C and SIGTERM in the commands that only talk to a host (watch, sessions, ...).

`asyncio.Runner` turns SIGINT into a cancel of the main task through a Python-level
handler, which runs only when the interpreter gets to it; on uvloop, with the loop
waiting in C, a Ctrl-C in `watch` was seen ignored for 30 s on a busy machine. The
loop's own signal handling (`add_signal_handler`, woken through its self-pipe) does
not depend on that: the first signal cancels the command, which then exits 130
(143 for SIGTERM); a second one, if the command is slow to unwind, exits at once.
`oploop run` has its own (`run.Interrupts`): there a Ctrl-C cancels the session first.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable
from typing import NoReturn

from actors.cli.errors import EXIT_CANCELLED, EXIT_TERMINATED, quiet_pipe

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _status(sig: int) -> int:
    return EXIT_TERMINATED if sig == signal.SIGTERM else EXIT_CANCELLED


async def interruptible(command: Awaitable[int]) -> int:
    """Await `command`; a SIGINT or SIGTERM meanwhile ends it with 130 or 143."""
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

    for sig in _SIGNALS:
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        return await command
    except asyncio.CancelledError:
        if caught and main.uncancel() == 0:
            print(file=sys.stderr)  # the terminal's "^C" ends its line
            return _status(caught[0])
        raise
    finally:
        for sig in _SIGNALS:
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
