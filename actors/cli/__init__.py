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
from types import FrameType


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `oploop` console script."""
    # A Ctrl-C while the modules load (a second or more on a busy machine) ends the
    # command quietly, 130, as one later would: nothing has started yet. Python's own
    # handler would raise KeyboardInterrupt inside an import, and print a traceback.
    signal.signal(signal.SIGINT, _interrupted_while_loading)
    from actors.cli.app import main as app_main

    signal.signal(signal.SIGINT, signal.default_int_handler)
    app_main(argv)


def _interrupted_while_loading(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(130)
