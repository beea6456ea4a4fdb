"""Small statistics and formatting helpers of the benchmark (stdlib only)."""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0-100) of `values`, nearest-rank on the sorted values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[rank]


def median(values: Iterable[float]) -> float:
    """The median (nan when empty)."""
    data = list(values)
    return statistics.median(data) if data else math.nan


def median_of(runs: int, measure: Callable[[], dict[str, float]]) -> dict[str, Any]:
    """Run `measure` `runs` times; each figure's median, and every run's figures."""
    results = [measure() for _ in range(runs)]
    return summarize(results)


def summarize(results: list[dict[str, float]]) -> dict[str, Any]:
    """The median of each key over `results`, plus the runs themselves."""
    keys = results[0].keys() if results else ()
    return {**{k: median(r[k] for r in results if k in r) for k in keys}, "runs": results}


def machine() -> dict[str, Any]:
    """What the figures were measured on: cores, load, Python."""
    return {
        "cores": os.cpu_count(),
        "loadavg": list(os.getloadavg()),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }


def ms(seconds: float) -> str:
    """Seconds shown in milliseconds."""
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:.3f} ms"


def us(seconds: float) -> str:
    """Seconds shown in microseconds."""
    return "-" if math.isnan(seconds) else f"{seconds * 1e6:.1f} us"


def ratio(a: float, b: float) -> str:
    """`a / b` as "N.NNx" (what fraction of b a costs)."""
    if not b or math.isnan(a) or math.isnan(b):
        return "-"
    return f"{a / b:.2f}x"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table, columns padded, first column left-aligned."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])
