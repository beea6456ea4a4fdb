"""History: what a turn costs as the session grows, with realistic tool output.

Every turn is one model reply asking for one `read_file` of a 20 KB file, and
its result going back into the history; sessions of 20 and of 200 turns, so
the 200th turn carries ~4 MB of history. Two settings:

- **in process**: oploop's llm caller plays the scripted model (no HTTP), the
  peers a local function model (as the `turns` section) — the framework's own
  cost of carrying the history;
- **over HTTP**: oploop's llm caller and pydantic-ai's `AnthropicModel` both
  call one local Messages-API server (the offline model, `bench.model`)
  through the `anthropic` SDK — the comparison a user makes; openai-agents
  calls the same server through its LiteLLM model (it has no route through
  that SDK that can share an environment with pydantic-ai: see `bench.peers`).

A turn is, for oploop, from one TURN_START to the next (the supervisor's
stamps); for a peer, between consecutive model calls (in process) or
consecutive `read_file` calls (over HTTP, where the model is not ours to
time). Each figure is the median over several sessions of each session's
per-turn p50. The goal (issue 13): oploop's 200-turn p50 at most 1.5x its
20-turn p50, and at most 0.5x the faster peer's at 200 turns.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import uvloop

from bench import peers
from bench.driver import Driver
from bench.host import BenchHost, target_text
from bench.model import OfflineModel, history_scenario
from bench.stats import median, ms, ratio
from bench.stats import table as text_table
from bench.turns import cpu_delta

LENGTHS = (20, 200)
#: The size of the file every turn reads.
FILE_BYTES = 20 * 1024
#: Turns of the warm-up session (imports, caches, connections).
WARM_TURNS = 5


def _sample(turn_s: list[float], turns: int, cpu_s: float) -> dict[str, float]:
    return {"p50_s": median(turn_s), "cpu_per_turn_s": cpu_s / turns}


def _summary(samples: list[dict[str, float]]) -> dict[str, Any]:
    return {**{k: median(s[k] for s in samples) for k in samples[0]}, "sessions": len(samples),
            "p50s_s": [s["p50_s"] for s in samples]}


async def _oploop(host: BenchHost, runs: dict[int, int], cwd: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with Driver(host.home, cwd=cwd) as driver:  # (where the file read lies)
        await driver.run(WARM_TURNS)
        for turns, count in runs.items():
            samples = []
            for _ in range(count):
                cpu0 = host.cpu_s()
                run = await driver.run(turns, timeout=600.0)
                samples.append(_sample(run.turn_s(), turns, cpu_delta(cpu0, host.cpu_s())))
            out[str(turns)] = _summary(samples)
    return out


async def _peer(run: Any, runs: dict[int, int]) -> dict[str, Any]:
    await run(WARM_TURNS)
    out: dict[str, Any] = {}
    for turns, count in runs.items():
        samples = []
        for _ in range(count):
            cpu0 = time.process_time()
            t = await run(turns)
            samples.append(_sample(t["turn_s"], turns, time.process_time() - cpu0))
        out[str(turns)] = _summary(samples)
    return out


async def _http_peer(name: str, url: str, target: Path, runs: dict[int, int]) -> dict[str, Any]:
    run, aclose = peers.http_runner(name, url, str(target))  # its client bound to this loop
    try:
        return await _peer(run, runs)
    finally:
        await aclose()


#: What this section measures is the cost of carrying the whole history (~4 MB, ~1M
#: tokens at turn 200), as the peers carry it: oploop's agent is told of a window that
#: holds it (else it compacts at 80% of 200k tokens and carries less than the peers), and
#: the offline model enforces none (else it refuses the peers' requests past 200k).
UNBOUNDED = "[agents.default]\ncontext_window = 100000000\n"


def _in_process(target: Path, runs: dict[int, int]) -> dict[str, Any]:
    systems: dict[str, Any] = {}
    with BenchHost(target_bytes=FILE_BYTES, config=UNBOUNDED) as host:
        systems["oploop"] = uvloop.run(_oploop(host, runs, host.dir))
    for name in peers.PEERS:
        try:
            # the peers on the default asyncio loop, as their users run them
            systems[name] = asyncio.run(_peer(peers.runner(name, str(target)), runs))
        except ImportError as exc:
            systems[name] = {"error": f"not installed ({exc.name}): ./scripts/bench installs it"}
    return systems


def _over_http(workdir: Path, target: Path, runs: dict[int, int]) -> dict[str, Any]:
    systems: dict[str, Any] = {}
    scenario = history_scenario(str(target), (WARM_TURNS, *LENGTHS))
    with OfflineModel(workdir, scenario, context=0) as model:
        with BenchHost(backend="http", base_url=model.url, config=UNBOUNDED) as host:
            systems["oploop"] = uvloop.run(_oploop(host, runs, target.parent))
        for name in peers.PEERS:
            if name not in peers.HTTP_PEERS:
                systems[name] = {"error": "no over-HTTP runner (see bench.peers)"}
                continue
            try:
                systems[name] = asyncio.run(_http_peer(name, model.url, target, runs))
            except ImportError as exc:
                systems[name] = {"error": f"not installed ({exc.name})"}
    return systems


def _verdict(systems: dict[str, Any]) -> dict[str, float]:
    """The ratios the goals are stated in."""
    mine = systems.get("oploop", {})
    if "error" in mine or not mine:
        return {}
    out = {"oploop 200/20": mine["200"]["p50_s"] / mine["20"]["p50_s"]}
    for name, figs in systems.items():
        if name == "oploop" or "error" in figs:
            continue
        out[f"{name} 200/20"] = figs["200"]["p50_s"] / figs["20"]["p50_s"]
        out[f"oploop/{name} @200"] = mine["200"]["p50_s"] / figs["200"]["p50_s"]
    return out


def run(quick: bool) -> dict[str, Any]:
    """oploop beside the peers, in process and over HTTP, at 20 and 200 turns."""
    runs = {20: 3, 200: 1} if quick else {20: 7, 200: 3}
    result: dict[str, Any] = {"workload": f"one read_file of {FILE_BYTES} bytes per turn",
                              "runs": {str(k): v for k, v in runs.items()},
                              "loadavg_start": list(os.getloadavg())}
    workdir = Path(tempfile.mkdtemp(prefix="oploop-bench-history-"))
    try:
        target = workdir / "target.txt"
        target.write_text(target_text(FILE_BYTES))
        result["in_process"] = _in_process(target, runs)
        result["http"] = _over_http(workdir, target, runs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result["ratios"] = {setting: _verdict(result[setting]) for setting in ("in_process", "http")}
    result["loadavg_end"] = list(os.getloadavg())
    return result


def _rows(setting: str, systems: dict[str, Any]) -> list[list[str]]:
    mine = systems.get("oploop", {})
    rows = []
    for name, figs in systems.items():
        if "error" in figs:
            rows.append([f"{setting}: {name}", figs["error"], "", "", "", "", ""])
            continue
        f20, f200 = figs["20"], figs["200"]
        rows.append([f"{setting}: {name}", ms(f20["p50_s"]), ms(f200["p50_s"]),
                     ms(f20["cpu_per_turn_s"]), ms(f200["cpu_per_turn_s"]),
                     ratio(f200["p50_s"], f20["p50_s"]),
                     "" if name == "oploop" or "error" in mine
                     else ratio(mine["200"]["p50_s"], f200["p50_s"])])
    return rows


def table(result: dict[str, Any]) -> str:
    """Per-turn p50 at 20 and 200 turns, the 200/20 ratio, and oploop/peer at 200."""
    headers = ["per turn (20 KB read each)", "20: p50", "200: p50", "20: CPU", "200: CPU",
               "200/20", "oploop/peer @200"]
    rows = _rows("in process", result["in_process"]) + _rows("HTTP", result["http"])
    load = " ".join(f"{x:.2f}" for x in result["loadavg_start"])
    load_end = " ".join(f"{x:.2f}" for x in result["loadavg_end"])
    runs = result["runs"]
    return (f"{text_table(headers, rows)}\n(medians of {runs['20']} sessions at 20 turns, "
            f"{runs['200']} at 200; load average {load} at the start, {load_end} at the end)")
