"""The worker machines a supervisor knows: what `oploop status` lists.

Kept beside the dispatcher (which owns the workers themselves) and fed by it:
a worker of machine M announced, was heard from, or went away. A machine stays
listed after its last worker goes, as `lost` (missed heartbeats, unreachable)
or `left` (its workers said goodbye), so that an operator sees what vanished;
the listing is bounded (`MAX_GONE` gone machines, oldest forgotten first).
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field
from typing import Any

from actors.machines import LOCAL, machine_name_error

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


def machine_problem(machine: str, user_id: str | None,
                     local_keys: frozenset[str] = frozenset()) -> str | None:
    """Why a worker may not serve as `machine`, or None. Over CURVE its key decides: a
    `worker:NAME` key may serve machine NAME, no other, so a key cannot take the tool
    calls aimed at another machine; nor, unnamed, the host's own (`local`) calls,
    unless the host lists the key in `[network] local_worker_keys`. The local key
    (the host's own workers) and plain ipc serve as `local`."""
    key_role, _, key_name = (user_id or "").partition(":")
    if not machine:
        if key_role == "worker" and key_name not in local_keys:
            return (f"its key {key_name!r} serves machine {key_name!r} only: start it with "
                    f"--machine {key_name} (or list the key in [network] local_worker_keys "
                    "to let it serve as the host's own)")
        return None
    problem = machine_name_error(machine)
    if problem is None and machine == LOCAL:
        problem = f"{LOCAL!r} is the host's own machine"
    if problem is None and key_role == "worker" and key_name != machine:
        problem = f"its key {key_name!r} may serve machine {key_name!r}, not {machine!r}"
    return problem


def ip_of(address: str | None) -> str:
    """A worker's address if it is an IP one (TCP); "" over ipc, whose Peer-Address is
    no address of a machine."""
    try:
        return str(ipaddress.ip_address(address or ""))
    except ValueError:
        return ""
