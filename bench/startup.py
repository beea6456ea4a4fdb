"""Start-up: `oploop up --detach` until it returns with the host ready.

Timed around the whole command (its own Python start included), with the
in-process scripted model (no offline model process) and with the default
model set-up (offline model and the SDK backend), each a median of runs.
"""

from __future__ import annotations

from typing import Any

from bench.host import BenchHost
from bench.stats import median
from bench.stats import table as text_table


def _time(backend: str) -> float:
    host = BenchHost(backend=backend)
    try:
        return host.start()
    finally:
        host.stop()


def run(quick: bool) -> dict[str, Any]:
    """Median seconds to ready, per model set-up."""
    repeats = 2 if quick else 8
    times: dict[str, list[float]] = {"scripted": [], "offline": []}
    for i in range(repeats):
        # interleaved, order alternating: on a shared machine a block of runs of one
        # set-up would catch a different load than the other's
        order = ("scripted", "offline") if i % 2 == 0 else ("offline", "scripted")
        for backend in order:
            times[backend].append(_time(backend))
    return {b: {"up_s": median(t), "runs": t} for b, t in times.items()}


def table(result: dict[str, Any]) -> str:
    """Start-up figures."""
    rows = [
        ["oploop up --detach (scripted model)", f"{result['scripted']['up_s']:.3f} s"],
        ["oploop up --detach (offline model + SDK)", f"{result['offline']['up_s']:.3f} s"],
    ]
    return text_table(["start-up", "median"], rows)
