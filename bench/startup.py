"""Start-up: `oploop up --detach` until it returns with the host ready.

Timed around the whole command (its own Python start included), with the
in-process scripted model (no offline model process) and with the default
model set-up (offline model and the SDK backend), each a median of runs. Then, on
the scripted host, the web view's first request: from connecting to its answer
(`GET /api/sessions`), which includes starting the gateway process when the host
starts it at the first connection.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.host import BenchHost
from bench.stats import median
from bench.stats import table as text_table


def _time(backend: str) -> tuple[float, float]:
    """Seconds to ready; and (scripted) to the first web request's answer."""
    host = BenchHost(backend=backend)
    try:
        up = host.start()
        return up, _first_request(host.home) if backend == "scripted" else 0.0
    finally:
        host.stop()


def _first_request(home: Path) -> float:
    """Seconds from connecting to the web view to the answer of `GET /api/sessions`."""
    url = (home / "run" / "web.url").read_text().strip()
    token = (home / "web.token").read_text().strip()
    request = urllib.request.Request(f"{url}api/sessions",
                                     headers={"Authorization": f"Bearer {token}"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(request, timeout=60) as resp:
        resp.read()
        if resp.status != 200:
            raise RuntimeError(f"the web view answered {resp.status}")
    return time.perf_counter() - t0


def run(quick: bool) -> dict[str, Any]:
    """Median seconds to ready, per model set-up."""
    repeats = 2 if quick else 8
    times: dict[str, list[float]] = {"scripted": [], "offline": []}
    first: list[float] = []
    for i in range(repeats):
        # interleaved, order alternating: on a shared machine a block of runs of one
        # set-up would catch a different load than the other's
        order = ("scripted", "offline") if i % 2 == 0 else ("offline", "scripted")
        for backend in order:
            up, web = _time(backend)
            times[backend].append(up)
            if backend == "scripted":
                first.append(web)
    return {**{b: {"up_s": median(t), "runs": t} for b, t in times.items()},
            "web_first": {"first_request_s": median(first), "runs": first}}


def table(result: dict[str, Any]) -> str:
    """Start-up figures."""
    rows = [
        ["oploop up --detach (scripted model)", f"{result['scripted']['up_s']:.3f} s"],
        ["oploop up --detach (offline model + SDK)", f"{result['offline']['up_s']:.3f} s"],
        ["first web request after up (connect to answer)",
         f"{result['web_first']['first_request_s']:.3f} s"],
    ]
    return text_table(["start-up", "median"], rows)
