"""The `oploop` command: the user's side of a host.

Every subcommand talks to the host through `bus.client.Client`, the same client
a program would embed. `run` (and `tools`) use the running host, or start an
embedded one in the background, shared by the runs of this home and stopped when
the last ends (`hosting`).

Modules: `app` (arguments, dispatch), `run` (`oploop run`: prompt, signals),
`commands` (watch, cancel, sessions, inspect, prune, rm, tools), `hostcmds` (up,
down, status, keys), `hosting` (which host; the embedded one; a dead host noticed),
`errors` (exit statuses; one line per error, no traceback).
"""

from __future__ import annotations

import signal

from actors import quiet_interrupt

__all__ = ["main", "quiet_interrupt"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `oploop` console script."""
    # (Already so when `actors` was imported as the command: see `actors/__init__.py`.)
    # The imports below take a noticeable part of a second. An ignored SIGINT (a
    # background job's) stays ignored.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, quiet_interrupt)
    from actors.cli.app import main as app_main

    app_main(argv)
