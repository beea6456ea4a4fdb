"""Stalled streams: how long from the stall to the `RETRY` event, per phase.

A real host whose llm caller talks (through the SDK, over HTTP) to an offline model
run by this process, so that the moment each stall begins is known here
(`OfflineServer.last_stall_at`). For each phase — before headers, after headers,
after `message_start`, pings forever, inside a block and between blocks, each with
and without pings — 20 sessions (5 with `quick`) run one after another; each's first
attempt stalls and the figure is its `RETRY` event's time minus the stall's start.
Goal: at most the bound that fires plus 100 ms.

The bounds are shrunk so that the section runs quickly (idle 0.2 s, first content
0.6 s, pause 0.4 s; the defaults are 2, 60 and 30 s): the figure of interest is the
overshoot past the bound, which does not depend on the bound's size.

    python -m bench.stalls [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
from typing import Any

from bench.host import BenchHost
from bench.stats import median, percentile
from bench.stats import table as render_table
from bus.client import Client
from bus.vocab import TERMINAL

BOUNDS = {"idle": 0.2, "first": 0.6, "pause": 0.4}
OK = {"reply": "all good", "stop_reason": "end_turn"}
TWO_BLOCKS = [{"type": "text", "text": "first block"}, {"type": "text", "text": "second"}]


def _stall(after: int | None, ping: float | None = None, reply: Any = "void words here") -> dict:
    turn: dict[str, Any] = {"fault": "stall", "seconds": 30, "reply": reply}
    if after is None:
        turn["before_headers"] = True
    else:
        turn["after_events"] = after
    if ping is not None:
        turn["ping_every_s"] = ping
    return turn


#: phase -> (its stall, the bound that ends it)
PHASES: dict[str, tuple[dict[str, Any], str]] = {
    "before headers": (_stall(None), "first"),
    "after headers": (_stall(0), "idle"),
    "after message_start": (_stall(1), "idle"),
    "pings forever": (_stall(1, ping=0.05), "first"),
    "inside a block": (_stall(4), "idle"),
    "inside a block, pings": (_stall(4, ping=0.05), "pause"),
    "between blocks": (_stall(6, reply=TWO_BLOCKS), "idle"),
    "between blocks, pings": (_stall(6, ping=0.05, reply=TWO_BLOCKS), "pause"),
}


def _tag(phase: str) -> str:
    return "p_" + "".join(c if c.isalnum() else "_" for c in phase)


class _Model:
    """The offline model on its own event loop in a thread."""

    def __init__(self, scenario: dict[str, Any]) -> None:
        from actors.offline_model.server import start_server

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            start_server(scenario=scenario), self.loop).result(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.aclose(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def _one(client: Client, model: _Model, phase: str) -> float:
    """One session of `phase`: seconds from the stall's start to its RETRY event."""
    started = await client.start(f"#{_tag(phase)} go")
    retry_ts = None
    async for event in client.events(started.session, started.from_seq, stop_at="first"):
        if event["type"] == "RETRY" and retry_ts is None:
            retry_ts = event["ts"]
        elif event["type"] in TERMINAL and (retry_ts is None or event["type"] != "DONE"):
            raise RuntimeError(f"{phase}: no retry, or the run ended {event['type']}")
    assert retry_ts is not None
    return float(retry_ts) - model.server.last_stall_at


def run(quick: bool) -> dict[str, Any]:
    """Per phase: p50 and p99 of stall → RETRY (ms), the bound, and the overshoot."""
    runs = 5 if quick else 20
    model = _Model({"scripts": {_tag(p): [turn, OK] for p, (turn, _) in PHASES.items()}})
    host = BenchHost(backend="http", base_url=f"http://127.0.0.1:{model.server.port}")
    host.env.update({
        "OPLOOP_STREAM_IDLE_S": str(BOUNDS["idle"]),
        "OPLOOP_STREAM_FIRST_S": str(BOUNDS["first"]),
        "OPLOOP_STREAM_PAUSE_S": str(BOUNDS["pause"]),
        "OPLOOP_RETRY_BASE_S": "0.01",
        "OPLOOP_RETRY_MAX_S": "0.05",
    })
    phases: dict[str, Any] = {}
    try:
        host.start()

        async def measure() -> None:
            async with Client.connect(host.home) as client:
                await _one(client, model, "after headers")  # warm-up: the SDK's import
                for phase, (_, bound) in PHASES.items():
                    times = [await _one(client, model, phase) for _ in range(runs)]
                    bound_ms = BOUNDS[bound] * 1000
                    p50, p99 = median(times) * 1000, percentile(times, 99) * 1000
                    phases[phase] = {
                        "bound": bound, "bound_ms": bound_ms, "p50_ms": p50, "p99_ms": p99,
                        "over_p50_ms": p50 - bound_ms, "over_p99_ms": p99 - bound_ms,
                        "runs": len(times),
                    }

        asyncio.run(measure())
    finally:
        host.stop()
        model.close()
    worst = max(p["over_p99_ms"] for p in phases.values())
    return {"bounds_s": BOUNDS, "phases": phases, "worst_over_p99_ms": worst,
            "goal_met": worst <= 100.0}


def table(result: dict[str, Any]) -> str:
    """The figures as a table."""
    rows = [(phase, f"{p['bound']} {p['bound_ms']:.0f}", f"{p['p50_ms']:.0f}",
             f"{p['p99_ms']:.0f}", f"{p['over_p99_ms']:+.0f}")
            for phase, p in result["phases"].items()]
    goal = "met" if result["goal_met"] else "NOT met"
    return (render_table(("stall phase", "bound ms", "p50 ms", "p99 ms", "p99 over bound"),
                         rows)
            + f"\ngoal (p99 <= bound + 100 ms): {goal}; runs per phase: "
            f"{next(iter(result['phases'].values()))['runs']}")


def main() -> None:
    """`python -m bench.stalls [--quick]`: print the table, then the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    result = run(parser.parse_args().quick)
    print(table(result))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
