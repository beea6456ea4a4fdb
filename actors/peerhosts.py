"""Where the other hosts of a shared store are reached: each publishes its control
socket's address in its `hosts` row; hosts on one machine reach each other there.

Used by the supervisor (forwarding control requests, placing new sessions) and by the
broadcaster (following other hosts' live events), so in neither's package.
"""

from __future__ import annotations

import socket
from pathlib import Path

from actors.pgleases import HostRow

#: A host unheard for this long is not a placement target (several missed renewals).
HOST_FRESH_S = 3.0


def control_address(home: Path) -> str:
    """What a host publishes as its control address: its runtime dir's control socket."""
    return f"ipc://{home / 'run' / 'control.sock'}"


def home_of(control: str) -> Path | None:
    """The home whose control socket `control` is, or None (not one `control_address`
    makes)."""
    if not control.startswith("ipc://") or not control.endswith("/run/control.sock"):
        return None
    return Path(control[len("ipc://"):]).parent.parent


def reach_problem(row: HostRow) -> str:
    """Why this host cannot reach `row`'s host, or "" (it can)."""
    machine = row.name.split(":", 1)[0]
    if machine != socket.gethostname():
        return (f"host {row.id} ({row.name}) is on another machine: send this to that "
                "host (OPLOOP_CONNECT), hosts reach each other on one machine only")
    if home_of(row.control) is None:
        return f"host {row.id} ({row.name}) has not said where it is reached (an older oploop?)"
    return ""
