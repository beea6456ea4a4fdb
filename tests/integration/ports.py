"""Free TCP ports for the tests' hosts, picked where nothing else takes them.

A host listening on TCP binds a block of consecutive ports (`[network] listen` is its
first). Probing with port 0 picks from the kernel's ephemeral range, where every
outgoing connection of a busy machine (and its TIME_WAIT) competes for the same
ports, so under load a block found free was often taken again, or none was found.
Blocks are picked below that range instead, at random, and probed the way ZeroMQ
binds (SO_REUSEADDR), so a port in TIME_WAIT that the host could bind counts as free.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_LOW = 20000  # above the well-known and registered ports most services use


def _ephemeral_floor() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(host: str = "127.0.0.1", count: int = 5) -> int:
    """The first of `count` consecutive ports on `host` that nothing listens on now."""
    high = max(_ephemeral_floor(), _LOW + 1000) - count
    rng = random.Random()
    for _ in range(1000):
        base = rng.randrange(_LOW, high)
        if all(_bindable(host, port) for port in range(base, base + count)):
            return base
    raise RuntimeError(f"no block of {count} free ports on {host} in {_LOW}..{high}")


def free_port(host: str = "127.0.0.1") -> int:
    """One port on `host` that nothing listens on now."""
    return free_ports(host, 1)
