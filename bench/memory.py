"""Memory: what an idle host holds, and what each idle session adds.

Measured with the scripted model (no offline model process, no SDK), and for
comparison with the default model set-up: idle (the llm callers import the SDK at
their first call), and after one short session (the SDK imported). RSS counts every
resident page of each process, shared or not; PSS divides a shared page among the
processes sharing it, the fairer sum for processes that share code. Both are summed
over the host and every process under it. Then 1000 sessions are opened (one short
run each, then idle) and the added RSS, over all processes, is divided by their
number: at once (what the burst left running counts: the executor's idle sandboxed
readers, up to `readers.MAX_IDLE` of ~9 MiB RSS each, retired within
`readers.IDLE_S`), and settled: both readings taken once those readers had time to
retire (the fork server, stopped after 30 s idle, is in both).
"""

from __future__ import annotations

import time
from typing import Any

import psutil
import uvloop

from bench.driver import Driver
from bench.host import BenchHost
from bench.stats import summarize
from bench.stats import table as text_table

#: Figures are printed in MiB (2**20 bytes, what `ps` and smaps count in) and, for the
#: totals the goals are stated in, MB (10**6 bytes).
MIB = 1024 * 1024
MB = 1000 * 1000
#: Seconds after the sessions for the settled figure: an idle reader's longest life
#: (`actors.sandbox.readers.IDLE_S`, 2 s) and a sweep (0.5 s), with a margin.
SETTLE_S = 3.0


def _usage(host: BenchHost) -> dict[str, Any]:
    names = host.process_names()
    per: dict[str, dict[str, float]] = {}
    for proc in host.processes():
        try:
            info = proc.memory_full_info()
        except psutil.Error:
            continue
        key = names.get(proc.pid) or f"pid {proc.pid}"
        per[key] = {"rss": info.rss, "pss": getattr(info, "pss", info.rss)}
    return {
        "rss": sum(p["rss"] for p in per.values()),
        "pss": sum(p["pss"] for p in per.values()),
        "processes": per,
    }


async def _open_sessions(host: BenchHost, count: int) -> None:
    async with Driver(host.home, cwd=host.dir) as driver:
        await driver.many(count, 1)


def one_session(host: BenchHost) -> None:
    """One short session (a tool turn, so two model calls): its imports then land."""
    # The offline model reads "the file" of the driver's prompt as a file named `file`
    # in the run's directory (the scripted model reads the host's target, which exists).
    (host.dir / "file").write_text(host.target.read_text())
    uvloop.run(_open_sessions(host, 1))


def _once(quick: bool) -> dict[str, float]:
    sessions = 200 if quick else 1000
    with BenchHost() as host:
        time.sleep(1.0)  # let start-up garbage settle
        idle = _usage(host)
        uvloop.run(_open_sessions(host, 20))  # the first sessions pay one-off costs
        before = _usage(host)
        time.sleep(SETTLE_S)
        before_settled = _usage(host)
        uvloop.run(_open_sessions(host, sessions))
        after = _usage(host)
        time.sleep(SETTLE_S)
        settled = _usage(host)
    return {
        "idle_rss": idle["rss"],
        "idle_pss": idle["pss"],
        "sessions": sessions,
        "per_session_rss": (after["rss"] - before["rss"]) / sessions,
        "per_session_rss_settled": (settled["rss"] - before_settled["rss"]) / sessions,
        "processes": len(idle["processes"]),
        **{f"rss.{k}": v["rss"] for k, v in idle["processes"].items()},
    }


def _default_setup() -> dict[str, float]:
    """Memory with the default model set-up: the offline model process, and llm callers
    on the SDK. Idle, as `oploop up` leaves it; then after one short session, once
    the SDK a model call imports is resident."""
    with BenchHost(backend="offline") as host:
        time.sleep(1.0)  # let start-up garbage settle
        idle = _usage(host)
        one_session(host)
        time.sleep(1.0)
        called = _usage(host)
    out = {"default_idle_rss": idle["rss"], "default_idle_pss": idle["pss"],
           "default_called_rss": called["rss"], "default_called_pss": called["pss"]}
    out.update({f"default.rss.{k}": v["rss"] for k, v in idle["processes"].items()})
    out.update({f"default_called.rss.{k}": v["rss"] for k, v in called["processes"].items()})
    return out


def run(quick: bool) -> dict[str, Any]:
    """Idle RSS/PSS of a host, and the RSS each idle session adds (median of runs)."""
    result = summarize([_once(quick) for _ in range(1 if quick else 3)])
    result.update(_default_setup())
    return result


def size(value: float) -> str:
    """`value` bytes in MiB, and in MB (the goals' unit)."""
    return f"{value / MIB:.1f} MiB = {value / MB:.1f} MB"


def table(result: dict[str, Any]) -> str:
    """Memory figures."""
    rows = [
        ["idle host, RSS of all processes", size(result["idle_rss"])],
        ["idle host, PSS of all processes", size(result["idle_pss"])],
        [f"added RSS per idle session ({result['sessions']:.0f} open)",
         f"{result['per_session_rss'] / 1024:.1f} KiB"],
        [f"  the same, {SETTLE_S:.0f} s later (idle readers retired)",
         f"{result['per_session_rss_settled'] / 1024:.1f} KiB"],
    ]
    rows += [[f"  RSS {k[4:]}", f"{v / MIB:.1f} MiB"]
             for k, v in result.items() if k.startswith("rss.")]
    rows += [
        ["idle host, default set-up (offline model, SDK backend), RSS",
         size(result["default_idle_rss"])],
        ["idle host, default set-up, PSS", size(result["default_idle_pss"])],
    ]
    rows += [[f"  RSS {k[12:]}", f"{v / MIB:.1f} MiB"]
             for k, v in result.items() if k.startswith("default.rss.")]
    if "default_called_rss" in result:
        rows += [
            ["default set-up after one session (SDK imported), RSS",
             size(result["default_called_rss"])],
            ["default set-up after one session, PSS", size(result["default_called_pss"])],
        ]
        rows += [[f"  RSS {k[19:]}", f"{v / MIB:.1f} MiB"]
                 for k, v in result.items() if k.startswith("default_called.rss.")]
    return text_table(["memory", "median"], rows)
