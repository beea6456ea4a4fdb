"""Idle RSS per actor: what each process of an idle host holds, and the total.

Two set-ups: the scripted model (no offline model process, no SDK: oploop
alone), and the default one (the offline model, llm callers that have
imported the SDK at their first call). Read 1 s after `oploop up --detach` returned (start-up
garbage settled) and after one short session (so lazy imports on the first
turn's path have landed), and again once the idle executor has stopped its sandbox
fork server (`forkserver.IDLE_S` after its last launcher ended) and every actor has
then handed its freed heap back to the OS (`runtime.HEAP_TRIM_S`): "settled", what a
host idle for more than about 45 s holds. The goal (issue 13): the scripted host at most
150 MB in all — an actor imports only what its role uses (see
`python -X importtime -m actors.<role>` for what each one loads).
"""

from __future__ import annotations

import os
import time
from typing import Any

from actors.runtime import HEAP_TRIM_S
from actors.sandbox.forkserver import IDLE_S as FORK_IDLE_S
from bench.host import BenchHost
from bench.memory import MB, _usage, one_session
from bench.stats import median
from bench.stats import table as text_table

#: Goal for the scripted host's RSS summed over its processes.
GOAL_MB = 150.0


def _once(backend: str) -> dict[str, float]:
    with BenchHost(backend=backend) as host:
        one_session(host)
        # (the session's model call has imported the SDK in the llm caller that served it)
        time.sleep(1.0)
        usage = _usage(host)
        # The fork server stops once idle; then a trim round in every actor.
        deadline = time.monotonic() + FORK_IDLE_S + 15
        while time.monotonic() < deadline and any(
                k.endswith("fork server") for k in _usage(host)["processes"]):
            time.sleep(0.5)
        time.sleep(HEAP_TRIM_S)
        settled = _usage(host)
    return {"rss": usage["rss"], "pss": usage["pss"],
            "settled.rss": settled["rss"], "settled.pss": settled["pss"],
            **{f"rss.{k}": v["rss"] for k, v in usage["processes"].items()},
            **{f"pss.{k}": v["pss"] for k, v in usage["processes"].items()}}


def run(quick: bool) -> dict[str, Any]:
    """Idle RSS/PSS per actor and in all, scripted and default set-ups (medians)."""
    repeats = 1 if quick else 3
    out: dict[str, Any] = {"loadavg": list(os.getloadavg())}
    for backend in ("scripted", "offline"):
        samples = [_once(backend) for _ in range(repeats)]
        keys = [k for k in samples[0] if all(k in s for s in samples)]
        out[backend] = {k: median(s[k] for s in samples) for k in keys}
    return out


def table(result: dict[str, Any]) -> str:
    """Per actor RSS and PSS, per set-up."""
    rows = []
    for backend, label in (("scripted", "scripted model"), ("offline", "default set-up")):
        figs = result[backend]
        rows.append([f"{label}: total", f"{figs['rss'] / MB:.1f} MB", f"{figs['pss'] / MB:.1f} MB"])
        if "settled.rss" in figs:
            rows.append([f"{label}: total, settled", f"{figs['settled.rss'] / MB:.1f} MB",
                         f"{figs['settled.pss'] / MB:.1f} MB"])
        for key, rss in figs.items():
            if key.startswith("rss."):
                name = key[4:]
                rows.append([f"  {name}", f"{rss / MB:.1f} MB",
                             f"{figs.get('pss.' + name, 0) / MB:.1f} MB"])
    load = " ".join(f"{x:.2f}" for x in result["loadavg"])
    scripted = result["scripted"]
    ok = "met" if scripted.get("settled.rss", scripted["rss"]) / MB <= GOAL_MB else "not met"
    return (text_table(["idle", "RSS", "PSS"], rows)
            + f"\n(goal: scripted host settled <= {GOAL_MB:g} MB RSS: {ok}; "
            f"load average {load})")
