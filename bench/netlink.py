"""Machines on one box: network namespaces joined by veth pairs, for tests and the bench.

A `Lab` makes a hub namespace (where a host runs) and one namespace per worker
machine, each joined to the hub by its own veth pair on its own /24
(10.77.N.1 on the hub's side, 10.77.N.2 on the machine's): addresses that exist
only inside those namespaces, so nothing of the box's own network changes and
labs of concurrent runs do not meet. `cut`/`restore` take a machine's link down
and up (a real link loss: no RST, no FIN, packets just stop). `close` kills what
still runs in the namespaces and deletes them.

Needs root and `ip` (iproute2); `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

_SUBNET = "10.77"


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None or shutil.which("nsenter") is None:
        return "no `ip` (iproute2) or `nsenter` (util-linux) command"
    probe = f"oplprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` fails: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def netem_unavailable() -> str | None:
    """Why `tc qdisc ... netem` (added latency) cannot be used here (None: it can)."""
    if shutil.which("tc") is None:
        return "no `tc` command"
    with Lab() as lab:
        machine = lab.add_machine("probe")
        done = subprocess.run([*lab.in_ns(lab.hub), "tc", "qdisc", "add", "dev",
                               machine.hub_if, "root", "netem", "delay", "1ms"],
                              capture_output=True, text=True)
    if done.returncode != 0:
        return f"tc netem: {done.stderr.strip() or 'refused'} (the kernel lacks sch_netem?)"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass(frozen=True, slots=True)
class Machine:
    """One worker machine's namespace and its link to the hub."""

    name: str
    ns: str
    #: Its interface (in `ns`) and the hub's end of the pair (in the hub).
    iface: str
    hub_if: str
    #: Its address, and the hub's address on its link (what it connects to).
    address: str
    hub_address: str


class Lab:
    """A hub namespace and worker machine namespaces, deleted by `close`."""

    def __init__(self) -> None:
        self.tag = secrets.token_hex(3)
        self.hub = f"opl{self.tag}hub"
        self.machines: dict[str, Machine] = {}
        _ip("netns", "add", self.hub)
        _ip("-n", self.hub, "link", "set", "lo", "up")

    def __enter__(self) -> Lab:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_machine(self, name: str) -> Machine:
        """A namespace for machine `name`, linked to the hub (link up)."""
        n = len(self.machines) + 1
        ns = f"opl{self.tag}m{n}"
        iface, hub_if = f"m{self.tag}{n}", f"h{self.tag}{n}"
        machine = Machine(name, ns, iface, hub_if, f"{_SUBNET}.{n}.2", f"{_SUBNET}.{n}.1")
        _ip("netns", "add", ns)
        self.machines[name] = machine
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", self.hub, "link", "add", hub_if, "type", "veth", "peer", "name", iface,
            "netns", ns)
        _ip("-n", self.hub, "addr", "add", f"{machine.hub_address}/24", "dev", hub_if)
        _ip("-n", ns, "addr", "add", f"{machine.address}/24", "dev", iface)
        _ip("-n", self.hub, "link", "set", hub_if, "up")
        _ip("-n", ns, "link", "set", iface, "up")
        return machine

    def in_ns(self, ns: str) -> list[str]:
        """The command prefix that runs a program inside namespace `ns`: its network
        only (`nsenter`; `ip netns exec` would also remount /sys, hiding the cgroup
        file systems the sandbox needs)."""
        return ["nsenter", f"--net=/run/netns/{ns}", "--"]

    def cut(self, name: str) -> None:
        """Take machine `name`'s link down (both ends lose carrier)."""
        _ip("-n", self.machines[name].ns, "link", "set", self.machines[name].iface, "down")

    def restore(self, name: str) -> None:
        """Bring machine `name`'s link back up (its address and route come back)."""
        _ip("-n", self.machines[name].ns, "link", "set", self.machines[name].iface, "up")

    def close(self) -> None:
        """Kill whatever still runs in the lab's namespaces, then delete them."""
        for ns in [*(m.ns for m in self.machines.values()), self.hub]:
            _kill_all_in(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.machines.clear()


def _kill_all_in(ns: str) -> None:
    """SIGKILL every process of namespace `ns` (what a test left: normally nothing)."""
    for _ in range(50):
        listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        pids = [int(p) for p in listed.stdout.split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)  # (the kernel reaps asynchronously: look again)
