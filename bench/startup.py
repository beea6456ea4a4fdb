"""Start-up: `oploop up --detach` until it returns with the host ready.

Timed around the whole command (its own Python start included), with the
in-process scripted model (no offline model process) and with the default
model set-up (offline model and the SDK backend), each a median of runs.
"""

from __future__ import annotations

from typing import Any

from bench.host import BenchHost
from bench.stats import median, table as text_table


def _time(backend: str) -> float:
    host = BenchHost(backend=backend)
    try:
        return host.start()
    finally:
        host.stop()


def run(quick: bool) -> dict[str, Any]:
    """Median seconds to ready, per model set-up."""
    repeats = 2 if quick else 7
    out: dict[str, Any] = {}
    for backend in ("scripted", "offline"):
        times = [_time(backend) for _ in range(repeats)]
        out[backend] = {"up_s": median(times), "runs": times}
    return out


def table(result: dict[str, Any]) -> str:
    """Start-up figures."""
    rows = [
        ["oploop up --detach (scripted model)", f"{result['scripted']['up_s']:.3f} s"],
        ["oploop up --detach (offline model + SDK)", f"{result['offline']['up_s']:.3f} s"],
    ]
    return text_table(["start-up", "median"], rows)
