"""Turn overhead: what one turn costs oploop, beside the peers, same workload.

Every turn is one model reply asking for one `read_file` of a small file, and
the tool's result going back. oploop's model is the in-process scripted
backend of the llm caller (no HTTP), so a turn's time is oploop's own: the
supervisor's loop, the hops to the llm caller and to an executor, the event
stream. Sessions of 20 and of 200 turns; per-turn p50 and p99; each figure
the median over several sessions. "CPU" is the CPU time per turn of every
process involved (oploop: all host processes, the viewer not included; a
peer: its one process), which a noisy shared machine disturbs far less than
wall time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import uvloop

from bench import peers
from bench.driver import Driver
from bench.host import BenchHost
from bench.stats import median, ms, percentile, ratio
from bench.stats import table as text_table

LENGTHS = (20, 200)


def _figures(turn_s: list[float], wall_s: float, turns: int, cpu_s: float) -> dict[str, float]:
    return {
        "p50_s": median(turn_s),
        "p99_s": percentile(turn_s, 99),
        "wall_per_turn_s": wall_s / turns,
        "cpu_per_turn_s": cpu_s / turns,
    }


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> float:
    """CPU seconds spent between two `BenchHost.cpu_s()` readings."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


def _summary(samples: list[dict[str, float]]) -> dict[str, Any]:
    return {**{k: median(s[k] for s in samples) for k in samples[0]}, "sessions": len(samples)}


async def _oploop(host: BenchHost, runs: dict[int, int]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    loop = asyncio.get_running_loop()
    async with Driver(host.home, cwd=host.dir) as driver:
        await driver.run(20)  # warm: first sessions pay for imports and caches
        for turns, count in runs.items():
            samples = []
            for _ in range(count):
                cpu0 = host.cpu_s()
                t0 = loop.time()
                run = await driver.run(turns)
                elapsed = loop.time() - t0
                cpu = cpu_delta(cpu0, host.cpu_s())
                samples.append(_figures(run.turn_s(), elapsed, turns, cpu))
            out[str(turns)] = _summary(samples)
    return out


async def _peer(name: str, target: str, runs: dict[int, int]) -> dict[str, Any]:
    run = peers.runner(name, target)
    await run(5)  # warm
    out: dict[str, Any] = {}
    for turns, count in runs.items():
        samples = []
        for _ in range(count):
            cpu0 = time.process_time()
            t = await run(turns)
            samples.append(_figures(t["turn_s"], t["wall_s"], turns, time.process_time() - cpu0))
        out[str(turns)] = _summary(samples)
    return out


def run(quick: bool) -> dict[str, Any]:
    """oploop and each installed peer: per-turn figures at 20 and 200 turns."""
    runs = {20: 5, 200: 1} if quick else {20: 15, 200: 3}
    result: dict[str, Any] = {"workload": "one read_file per turn", "systems": {}}
    with BenchHost() as host:
        result["systems"]["oploop"] = uvloop.run(_oploop(host, runs))
        target = str(host.target)
        for name in peers.PEERS:
            try:
                # the peers on the default asyncio loop, as their users run them
                result["systems"][name] = asyncio.run(_peer(name, target, runs))
            except ImportError as exc:
                result["systems"][name] = {
                    "error": f"not installed ({exc.name}): ./scripts/bench installs it"}
    return result


def table(result: dict[str, Any]) -> str:
    """Per-turn figures side by side, with oploop's ratio to each peer."""
    systems = result["systems"]
    mine = systems["oploop"]
    rows = []
    for name, figs in systems.items():
        if "error" in figs:
            rows.append([name, figs["error"], "", "", "", "", "", "", ""])
            continue
        row = [name]
        for turns in LENGTHS:
            f = figs[str(turns)]
            row += [ms(f["p50_s"]), ms(f["p99_s"])]
        f20, f200 = figs["20"], figs["200"]
        row.append(ms(f20["cpu_per_turn_s"]))
        row.append(ratio(f200["p50_s"], f20["p50_s"]))
        row.append("" if name == "oploop" else ratio(mine["20"]["p50_s"], f20["p50_s"]))
        row.append("" if name == "oploop" else ratio(mine["200"]["p50_s"], f200["p50_s"]))
        rows.append(row)
    headers = ["per turn", "20: p50", "20: p99", "200: p50", "200: p99", "20: CPU", "200/20",
               "oploop/peer @20", "oploop/peer @200"]
    return text_table(headers, rows)
