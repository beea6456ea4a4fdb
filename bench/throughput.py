"""Throughput: turns per second with many sessions at once.

oploop: a host with 2 llm callers and 2 executors, N sessions started together,
each of a few tool turns; the figure is turns ended over the time from the
first start to the last terminal event. Peers: `asyncio.gather` of N runs of
the same workload in one process.

On a busy machine (the bench keeps every core busy) turns per second follow CPU
per turn, which a shared machine disturbs far less: so oploop's figures also say
the CPU seconds per turn of every host process, by role (`cpu_ms_per_turn`:
the supervisor, the executors, the llm callers, ..., "sandbox" the fork servers
and the persistent readers, those retired meanwhile included; the driver itself not
included).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import psutil
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


def role(name: str) -> str:
    """A host process's role from its name in `BenchHost.process_names` ("executor-2" ->
    "executor"; a fork server or a reader -> "sandbox")."""
    if name.startswith("sandbox:") or name.endswith("fork server"):
        return "sandbox"
    return re.sub(r"-\d+$", "", name)


def cpu_by_role(host: BenchHost) -> dict[str, float]:
    """CPU seconds used so far by the host's processes, summed by role, each with the
    children it has reaped: a persistent reader retired meanwhile counts with the fork
    server that started it, as "sandbox"."""
    names = host.process_names()
    out: dict[str, float] = {}
    for proc in host.processes():
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        key = role(names.get(proc.pid, "sandbox:"))
        out[key] = out.get(key, 0.0) + t.user + t.system + t.children_user + t.children_system
    return out


def per_turn_ms(before: dict[str, float], after: dict[str, float], turns: int
                ) -> dict[str, float]:
    """Milliseconds of CPU per turn by role between two `cpu_by_role` readings, and "all"."""
    out = {k: (v - before.get(k, 0.0)) * 1e3 / turns for k, v in sorted(after.items())}
    out["all"] = sum(out.values())
    return out


async def _oploop(host: BenchHost, quick: bool, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with Driver(host.home, cwd=host.dir) as driver:
        await driver.many(10, 5)  # warm
        for n in CONCURRENCY:
            turns = _turns_for(n, quick)
            before = cpu_by_role(host)
            rates = [await driver.many(n, turns) for _ in range(repeats)]
            cpu = per_turn_ms(before, cpu_by_role(host), n * turns * repeats)
            out[str(n)] = {"turns_s": median(rates), "runs": rates, "cpu_ms_per_turn": cpu}
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
    text = text_table(["turns/s", *(f"{n} sessions" for n in CONCURRENCY)], rows)
    mine = result["systems"].get("oploop", {})
    if "error" in mine or "cpu_ms_per_turn" not in mine.get("100", {}):
        return text
    roles = list(mine["100"]["cpu_ms_per_turn"])
    cpu_rows = [[r, *(f"{mine[str(n)]['cpu_ms_per_turn'].get(r, 0.0):.3f}" for n in CONCURRENCY)]
                for r in roles]
    return text + "\n\n" + text_table(
        ["oploop CPU ms per turn", *(f"{n} sessions" for n in CONCURRENCY)], cpu_rows)
