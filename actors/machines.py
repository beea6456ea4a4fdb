"""Worker machines by name: what a name may be, and the name of the host's own.

A worker machine is a group of workers (`oploop worker --machine NAME`) that
connects to a host over TCP + CURVE. Its workers say the name in `Ready`; a
session whose agent has a `target_machine` runs its tools only on executors of
that machine. The host's own workers (and unnamed ones a host admits by key:
`[network] local_worker_keys`) are the machine `local`.
"""

from __future__ import annotations

import re

#: The machine of the host's own workers, and of any worker that names none.
LOCAL = "local"

#: The exit status of a worker whose key the host refused (EX_NOPERM): whoever
#: supervises it (`oploop worker`) stops restarting it and says why.
EXIT_REFUSED = 77
#: The exit status of a worker whose key the host admitted but not for the machine
#: it names (a worker key serves only its own machine; EX_CONFIG).
EXIT_MACHINE_REFUSED = 78

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def machine_name_error(name: str) -> str | None:
    """Why `name` cannot name a worker machine, or None if it can."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return (f"machine name {name!r}: 1-64 letters, digits, '_', '.', '-', "
                "starting with a letter or digit")
    return None


def machine_of(announced: str) -> str:
    """The machine a worker belongs to from the name it announced ("" is `LOCAL`)."""
    return announced or LOCAL
