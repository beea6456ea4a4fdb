"""Throughput: turns per second with many sessions at once.

oploop: a host with 2 llm callers and 2 executors, N sessions started together,
each of a few tool turns; the figure is turns ended over the time from the
first start to the last terminal event. Peers: `asyncio.gather` of N runs of
the same workload in one process.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvloop

from bench import peers
from bench.driver import Driver
from bench.host import BenchHost
from bench.stats import median
from bench.stats import table as text_table

CONCURRENCY = (1, 10, 100, 1000)


def _turns_for(sessions: int, quick: bool) -> int:
    """Turns per session: enough turns in all to time, few enough to stay short."""
    if sessions >= 1000:
        return 1 if quick else 3
    if sessions >= 100:
        return 5 if quick else 10
    return 10 if quick else 20


async def _oploop(host: BenchHost, quick: bool, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with Driver(host.home, cwd=host.dir) as driver:
        await driver.many(10, 5)  # warm
        for n in CONCURRENCY:
            rates = [await driver.many(n, _turns_for(n, quick)) for _ in range(repeats)]
            out[str(n)] = {"turns_s": median(rates), "runs": rates}
    return out


async def _peer(name: str, target: str, quick: bool, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    await peers.concurrent(name, target, 2, 3)  # warm
    for n in CONCURRENCY:
        rates = [await peers.concurrent(name, target, n, _turns_for(n, quick))
                 for _ in range(repeats)]
        out[str(n)] = {"turns_s": median(rates), "runs": rates}
    return out


def run(quick: bool) -> dict[str, Any]:
    """Turns per second at each concurrency, oploop and each installed peer."""
    repeats = 1 if quick else 3
    result: dict[str, Any] = {"llm_callers": 2, "executors": 2, "systems": {}}
    with BenchHost(llm_callers=2, executors=2) as host:
        result["systems"]["oploop"] = uvloop.run(_oploop(host, quick, repeats))
        target = str(host.target)
        for name in peers.PEERS:
            try:
                result["systems"][name] = asyncio.run(_peer(name, target, quick, repeats))
            except ImportError as exc:
                result["systems"][name] = {"error": f"not installed ({exc.name})"}
    return result


def table(result: dict[str, Any]) -> str:
    """Turns per second per concurrency, one row per system."""
    rows = []
    for name, figs in result["systems"].items():
        if "error" in figs:
            rows.append([name, figs["error"], "", "", ""])
            continue
        rows.append([name, *(f"{figs[str(n)]['turns_s']:,.0f}" for n in CONCURRENCY)])
    return text_table(["turns/s", *(f"{n} sessions" for n in CONCURRENCY)], rows)
