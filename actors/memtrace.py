"""`OPLOOP_MEMTRACE=SECONDS`: find what makes an actor grow (a debugging switch).

Every actor started with it traces its Python allocations (`tracemalloc`, which
slows an actor down and costs memory of its own: not for production) and, every
SECONDS, logs at WARNING the source lines whose allocated size grew the most
since the previous report. A host passes its environment on, so setting it for
`oploop up` traces every actor; `./scripts/bench --section growth` then shows
which lines keep what.
"""

from __future__ import annotations

import asyncio
import logging
import tracemalloc

log = logging.getLogger("oploop.memtrace")

#: Frames kept per allocation: the line that allocated and its caller.
TRACE_FRAMES = 2
#: Lines named per report.
TOP_LINES = 10


def growth_report(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot,
                  top: int = TOP_LINES) -> list[str]:
    """The `top` lines whose allocations grew the most from `before` to `after`."""
    stats = after.compare_to(before, "lineno")
    grown = [s for s in stats if s.size_diff > 0][:top]
    return [f"{s.size_diff / 1024:+.1f} KiB ({s.count_diff:+d} blocks, "
            f"{s.size / 1024:.1f} KiB in all) at {s.traceback[0].filename}:"
            f"{s.traceback[0].lineno}" for s in grown]


async def trace_memory(name: str, every_s: float) -> None:
    """Trace allocations and log their growth every `every_s`, until cancelled."""
    if not tracemalloc.is_tracing():
        tracemalloc.start(TRACE_FRAMES)
    previous = tracemalloc.take_snapshot()
    while True:
        await asyncio.sleep(every_s)
        snapshot = tracemalloc.take_snapshot()
        current, peak = tracemalloc.get_traced_memory()
        lines = growth_report(previous, snapshot)
        log.warning("%s: %.1f MiB traced (peak %.1f MiB); grown most since the last "
                    "report:\n  %s", name, current / 2**20, peak / 2**20,
                    "\n  ".join(lines) or "(nothing)")
        previous = snapshot
