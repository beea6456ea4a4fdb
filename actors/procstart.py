"""When a process started, from /proc: with its pid, what tells it from a later process
given the same pid (pids wrap at 32,768 on many machines)."""

from __future__ import annotations


def start_ticks(pid: int | str) -> int | None:
    """When process `pid` ("self": this one) started, in clock ticks since boot (field
    22 of its /proc stat). None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rfind(b")") + 2:].split()[19])  # (comm may hold ')', spaces)
    except (OSError, ValueError, IndexError):
        return None
