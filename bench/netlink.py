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


class OtherMachine:
    """"Another machine" as far as one box allows, for hosts of one store: a network
    namespace joined to this one by a veth pair (this side `outer`, that side `inner`),
    and `prefix`, which starts a command in it with a host name of its own (UTS
    namespace) and its own mounts, in which the homes of this machine's hosts are
    covered by an empty tmpfs: only TCP reaches from one side to the other."""

    def __init__(self, hostname: str = "other-machine") -> None:
        tag = secrets.token_hex(3)
        self.hostname = hostname
        self.ns, self.outer_if, self.inner_if = f"opx{tag}", f"oxo{tag}", f"oxi{tag}"
        subnet = int(tag[:2], 16) % 250 + 1
        self.outer, self.inner = f"10.78.{subnet}.1", f"10.78.{subnet}.2"
        _ip("netns", "add", self.ns)
        try:
            _ip("link", "add", self.outer_if, "type", "veth", "peer", "name", self.inner_if)
            _ip("link", "set", self.inner_if, "netns", self.ns)
            _ip("addr", "add", f"{self.outer}/30", "dev", self.outer_if)
            _ip("link", "set", self.outer_if, "up")
            _ip("-n", self.ns, "addr", "add", f"{self.inner}/30", "dev", self.inner_if)
            _ip("-n", self.ns, "link", "set", self.inner_if, "up")
            _ip("-n", self.ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> OtherMachine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prefix(self, hidden: list[str]) -> list[str]:
        """The command prefix that runs a program on the other machine, `hidden` (this
        machine's homes) covered there."""
        return other_machine_prefix(self.ns, self.hostname, hidden)

    def close(self) -> None:
        """Kill what still runs there, delete the namespace (and the pair with it)."""
        _kill_all_in(self.ns)
        subprocess.run(["ip", "link", "del", self.outer_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


def other_machine_prefix(ns: str, hostname: str, hidden: list[str]) -> list[str]:
    """A command prefix: the program runs with host name `hostname` (a UTS namespace of
    its own), its own mounts with each of `hidden` covered by an empty tmpfs, and the
    network of namespace `ns` (`nsenter --net` alone, as `Lab.in_ns` says why)."""
    covers = "".join(f" && mount -t tmpfs -o size=1m none {path}" for path in hidden)
    script = f"hostname {hostname}{covers} && exec nsenter --net=/run/netns/{ns} \"$@\""
    return ["unshare", "--uts", "--mount", "--propagation", "private",
            "sh", "-c", script, "sh"]
