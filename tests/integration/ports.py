"""Free TCP ports for the tests' hosts, picked where nothing else takes them.

A host listening on TCP binds a block of consecutive ports (`[network] listen` is its
first). Probing with port 0 picks from the kernel's ephemeral range, where every
outgoing connection of a busy machine (and its TIME_WAIT) competes for the same
ports, so under load a block found free was often taken again, or none was found.
Blocks are picked below that range instead, at random, and probed the way ZeroMQ
binds (SO_REUSEADDR), so a port in TIME_WAIT that the host could bind counts as free.
Under pytest-xdist each worker picks in a slice of that range of its own
(`PYTEST_XDIST_WORKER`), so two workers never probe, find free and then both bind
the same port.
"""

from __future__ import annotations

import os
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


def _worker_slice(low: int, high: int) -> tuple[int, int]:
    """This test process's part of [low, high): all of it, or under pytest-xdist the
    slice of worker N ("gwN") of `PYTEST_XDIST_WORKER_COUNT`."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    try:
        index = int(worker.removeprefix("gw"))
        workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    except (KeyError, ValueError):
        return low, high
    size = (high - low) // max(1, workers)
    return low + index * size, low + (index + 1) * size


def free_ports(host: str = "127.0.0.1", count: int = 5) -> int:
    """The first of `count` consecutive ports on `host` that nothing listens on now."""
    low, high = _worker_slice(_LOW, max(_ephemeral_floor(), _LOW + 1000))
    high -= count
    rng = random.Random()
    for _ in range(1000):
        base = rng.randrange(low, high)
        if all(_bindable(host, port) for port in range(base, base + count)):
            return base
    raise RuntimeError(f"no block of {count} free ports on {host} in {low}..{high}")


def free_port(host: str = "127.0.0.1") -> int:
    """One port on `host` that nothing listens on now."""
    return free_ports(host, 1)
