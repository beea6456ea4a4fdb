"""The worker machines a supervisor knows: what `oploop status` lists.

Kept beside the dispatcher (which owns the workers themselves) and fed by it:
a worker of machine M announced, was heard from, or went away. A machine stays
listed after its last worker goes, as `lost` (missed heartbeats, unreachable)
or `left` (its workers said goodbye), so that an operator sees what vanished;
the listing is bounded (`MAX_GONE` gone machines, oldest forgotten first).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from actors.machines import LOCAL

#: Machines with no worker left that stay listed (as lost or left), at most.
MAX_GONE = 256


@dataclass
class MachineState:
    """One worker machine as the supervisor sees it."""

    name: str
    #: The IP address its workers connect from (the last one to announce), or "".
    address: str = ""
    #: The key its workers present (`worker:NAME`), or "" (ipc, no CURVE).
    key: str = ""
    #: Live workers by role, counted by the dispatcher.
    workers: dict[str, int] = field(default_factory=dict)
    #: The ids of its live workers (`ROLE-PID-XXXX`: which processes serve).
    ids: set[str] = field(default_factory=set)
    #: Wall-clock time any of its workers was last heard from.
    last_heard: float = 0.0
    #: "up" while it has a worker; then "lost" or "left".
    state: str = "up"
    #: When it changed state last (wall clock).
    since: float = field(default_factory=time.time)

    def describe(self, now: float) -> dict[str, Any]:
        """The machine as `Stats` (and `oploop status --json`) report it."""
        return {
            "name": self.name, "address": self.address, "key": self.key,
            "workers": dict(self.workers), "worker_ids": sorted(self.ids), "state": self.state,
            "last_heartbeat": self.last_heard,
            "last_heartbeat_ago_s": round(now - self.last_heard, 3) if self.last_heard else None,
            "since": self.since,
        }


class Machines:
    """Every worker machine with a live worker, and the recently gone ones."""

    def __init__(self) -> None:
        self.known: dict[str, MachineState] = {}

    def joined(self, name: str, role: str, worker: str, address: str = "",
               key: str = "") -> None:
        """Worker `worker` of `role` on machine `name` announced itself."""
        machine = self.known.get(name)
        if machine is None or machine.state != "up":
            machine = self.known[name] = MachineState(name)
        machine.workers[role] = machine.workers.get(role, 0) + 1
        machine.ids.add(worker)
        machine.address = address or machine.address
        machine.key = key or machine.key
        machine.last_heard = time.time()

    def heard(self, name: str) -> None:
        """A message came from a worker of machine `name` (any message is life)."""
        machine = self.known.get(name)
        if machine is not None:
            machine.last_heard = time.time()

    def left(self, name: str, role: str, worker: str, how: str) -> None:
        """Worker `worker` of `role` on machine `name` is gone: `how` is "lost" or "left"."""
        machine = self.known.get(name)
        if machine is None or worker not in machine.ids:
            return
        machine.ids.discard(worker)
        count = machine.workers.get(role, 0) - 1
        if count > 0:
            machine.workers[role] = count
        else:
            machine.workers.pop(role, None)
        if not machine.workers:
            machine.state, machine.since = how, time.time()
            self._bound()

    def _bound(self) -> None:
        gone = [m for m in self.known.values() if m.state != "up"]
        for machine in sorted(gone, key=lambda m: m.since)[:max(0, len(gone) - MAX_GONE)]:
            del self.known[machine.name]

    def describe(self) -> list[dict[str, Any]]:
        """Every known machine, `local` first, then by name."""
        now = time.time()
        order = sorted(self.known.values(), key=lambda m: (m.name != LOCAL, m.name))
        return [m.describe(now) for m in order]
