"""Context: a session far longer than the model's context window (issue 29).

One session of 1,000 turns (200 with `--quick`), each a `shell` call printing 20 KB,
on the offline model with a 100k-token window (`OPLOOP_OFFLINE_CONTEXT`) and an agent
that knows it (`context_window = 100000`, `compact_at` 0.8). Without compaction the
session would hit the window within ~20 turns (today's main ends `ERROR` there).

Figures: whether it finishes `DONE`; whether any request exceeded the window (the
offline model's refusals, and the largest request it answered); the per-turn p50 over
the 50 turns up to turn 100 and up to the last turn, and their ratio (the goal: within
1.5x: a turn costs the same however long the session); compactions, and their time
(from the turn's `TURN_START` to its `COMPACTED`: the estimate, clearing, the summary
call) p50 and max. And one compacted request as the model received it, cut, for the
record (`excerpt`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from pathlib import Path
from typing import Any

from actors.core.context import cleared_block
from bench.host import BenchHost
from bench.stats import median, ms, percentile
from bench.stats import table as text_table
from bus.client import Client

WINDOW = 100_000
RESULT_BYTES = 20 * 1024
LINE = "the quick brown fox jumps over the lazy dog, line after line of a file"
#: Per-turn p50 over this many turns up to turn 100 and up to the last.
SPAN = 50


def _scenario(turns: int) -> dict[str, Any]:
    command = f"yes '{LINE}' | head -c {RESULT_BYTES}"
    turn = {"reply": [{"type": "text", "text": "Reading the next part."},
                      {"type": "tool_use", "name": "shell", "input": {"command": command}}]}
    return {"description": "20 KB of shell output per turn (bench context)",
            "scripts": {"ctx": [*([turn] * turns),
                                {"reply": "all parts read", "stop_reason": "end_turn"}]}}


def _offline_stats(home: Path) -> dict[str, Any]:
    port = int((home / "run" / "offline.port").read_text())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/offline/stats") as answer:
        stats: dict[str, Any] = json.loads(answer.read())
    return stats


async def _session(home: Path, turns: int) -> dict[str, Any]:
    starts: dict[int, float] = {}
    compactions: list[dict[str, Any]] = []
    async with Client.connect(home) as client:
        started = await client.start("#ctx read every part", agent="ctx", max_turns=turns + 1)
        end: dict[str, Any] = {}
        async for ev in client.events(started.session, started.from_seq, stop_at="first"):
            kind = ev["type"]
            if kind == "TURN_START":
                starts[ev["turn"]] = ev["ts"]
            elif kind == "COMPACTED":
                compactions.append({**ev["data"], "s": ev["ts"] - starts[ev["turn"]],
                                    "turn": ev["turn"]})
            elif kind in ("DONE", "ERROR", "CANCELLED"):
                end = {"type": kind, **ev["data"]}
    last = max(starts)
    per_turn = {t: starts[t + 1] - starts[t] for t in starts if t + 1 in starts}
    return {"session": started.session, "end": end, "turns": last, "per_turn": per_turn,
            "compactions": compactions}


def _p50(per_turn: dict[int, float], upto: int) -> float:
    return median(per_turn[t] for t in range(upto - SPAN, upto) if t in per_turn)


def _excerpt(compactions: list[dict[str, Any]]) -> str:
    """What a request after a summary began with: the summary, then a cleared result."""
    with_summary = [c for c in compactions if c.get("summary")]
    if not with_summary:
        return ""
    c = with_summary[-1]
    return (f"[user] {c['summary'][:600]}\n"
            f"(then the turns from history message {c['summarised']} on; tool results "
            f"before message {c['cleared']} as markers)")


def run(quick: bool) -> dict[str, Any]:
    """One long session on the offline model; the figures of the module doc."""
    turns = 200 if quick else 1000
    config = (f"[agents.ctx]\nmax_turns = {turns + 1}\ncontext_window = {WINDOW}\n")
    host = BenchHost(backend="offline", config=config)
    scenario = host.dir / "context-scenario.json"
    scenario.write_text(json.dumps(_scenario(turns)))
    host.env.update(OPLOOP_OFFLINE_SCENARIO=str(scenario), OPLOOP_OFFLINE_CONTEXT=str(WINDOW))
    load_start = os.getloadavg()
    try:
        host.start()
        started = time.perf_counter()
        session = asyncio.run(_session(host.home, turns))
        wall_s = time.perf_counter() - started
        stats = _offline_stats(host.home)
    finally:
        host.stop()
    per_turn, done = session["per_turn"], session["compactions"]
    at_100, at_end = _p50(per_turn, 100), _p50(per_turn, session["turns"])
    times = [c["s"] for c in done]
    return {
        "turns": session["turns"], "end": session["end"].get("type"),
        "end_detail": {k: v for k, v in session["end"].items() if k != "usage"},
        "refused_over_window": stats["too_long"], "largest_request_tokens":
            stats["largest_prompt"], "window": WINDOW,
        "p50_at_100_s": at_100, "p50_at_end_s": at_end, "ratio": at_end / at_100,
        "p50_every_100_s": [_p50(per_turn, t) for t in range(100, session["turns"] + 1, 100)],
        "compactions": len(done), "summaries": sum(1 for c in done if c["summarised_turns"]),
        "compaction_p50_s": median(times) if times else 0.0,
        "compaction_p90_s": percentile(times, 90) if times else 0.0,
        "compaction_max_s": max(times, default=0.0),
        "after_tokens_max": max((c["after_tokens"] for c in done), default=0),
        "before_tokens_max": max((c["before_tokens"] for c in done), default=0),
        "wall_s": wall_s, "excerpt": _excerpt(done), "marker": _marker(),
        "loadavg_start": load_start, "loadavg_end": os.getloadavg(),
    }


def _marker() -> str:
    """One of this session's cleared results as the model reads it (`cleared_block`, the
    function the request view uses, on one turn's call and result)."""
    command = _scenario(1)["scripts"]["ctx"][0]["reply"][1]
    result = {"type": "tool_result", "tool_use_id": "t", "content": "x" * RESULT_BYTES}
    return str(cleared_block(result, command)["content"])


def table(result: dict[str, Any]) -> str:
    """Finished, over-window refusals, per-turn p50 at 100 and at the end, compactions."""
    headers = ["context (20 KB/turn, 100k window)", "end", "refused", "largest req",
               "p50 @100", f"p50 @{result['turns']}", "ratio", "compactions",
               "compaction p50", "max"]
    rows = [["oploop", str(result["end"]), str(result["refused_over_window"]),
             f"{result['largest_request_tokens']:,}", ms(result["p50_at_100_s"]),
             ms(result["p50_at_end_s"]), f"{result['ratio']:.2f}x",
             f"{result['compactions']} ({result['summaries']} summ.)",
             ms(result["compaction_p50_s"]), ms(result["compaction_max_s"])]]
    load = " ".join(f"{x:.2f}" for x in result["loadavg_start"])
    load_end = " ".join(f"{x:.2f}" for x in result["loadavg_end"])
    return (f"{text_table(headers, rows)}\n(one session, {result['wall_s']:.0f} s; load "
            f"average {load} at the start, {load_end} at the end)")
