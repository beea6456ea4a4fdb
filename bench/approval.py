"""Approvals: time from the client's `approve` call to the tool's `TOOL_START`.

A real host with the offline model; an agent whose `shell` calls need approval
(`[agents.ops.permissions] shell = "ask"`). Each run's one call waits
(`APPROVAL_REQUESTED`) while 16 other viewers follow the session; then
`Client.approve` is called and the time to the `TOOL_START` the first viewer
receives is measured (p50/p99 over the runs; goal: p99 <= 10 ms).

    python -m bench.approval [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from actors.sandbox.workspaces import remove_home
from bus.client import Client

VIEWERS = 16
CONFIG = '[agents.ops.permissions]\nshell = "ask"\n'
SCENARIO = {"scripts": {"ask": [
    {"reply": [{"type": "tool_use", "name": "shell", "input": {"command": "true"}}]},
    {"reply": "done", "stop_reason": "end_turn"}]}}


def _cli(home: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    full.update(env, OPLOOP_HOME=home)
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], env=full,
                          capture_output=True, text=True, timeout=120, check=False)


async def _follow(client: Client, session: str, from_seq: int) -> None:
    async for _ in client.events(session, from_seq, stop_at="first"):
        pass


async def _one(client: Client, viewers: list[Client]) -> float:
    """One run: the approve call -> TOOL_START at the first viewer, in ms."""
    started = await client.start("#ask go", agent="ops")
    others = [asyncio.create_task(_follow(v, started.session, started.from_seq))
              for v in viewers]
    sent = 0.0
    seen = 0.0
    try:
        async for event in client.events(started.session, started.from_seq, stop_at="first"):
            if event["type"] == "APPROVAL_REQUESTED":
                sent = time.perf_counter()
                await client.approve(started.session, [event["data"]["call_id"]])
            elif event["type"] == "TOOL_START" and not seen:
                seen = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*others), 30)
    finally:
        for task in others:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if not (sent and seen):
        raise RuntimeError("the run did not ask, or its tool did not start")
    return (seen - sent) * 1000


async def _round(home: str, runs: int) -> list[float]:
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(Client.connect(Path(home)))
        viewers = [await stack.enter_async_context(Client.connect(Path(home)))
                   for _ in range(VIEWERS)]
        await _one(client, viewers)  # warm-up: the executor's first call, the sandbox
        return [await _one(client, viewers) for _ in range(runs)]


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 2), "p99": round(p99, 2),
            "max": round(ordered[-1], 2), "n": len(ordered)}


def run(quick: bool = False) -> dict[str, Any]:
    """The approval section: approve call -> TOOL_START with 16 viewers attached."""
    runs = 20 if quick else 100
    home = tempfile.mkdtemp(prefix="opb-", dir="/tmp")
    (Path(home) / "oploop.toml").write_text(CONFIG)
    scenario = Path(home) / "scenario.json"
    scenario.write_text(json.dumps(SCENARIO))
    env = {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}
    up = _cli(home, "up", "--detach", env=env)
    if up.returncode != 0:
        raise RuntimeError(f"oploop up failed: {up.stderr}")
    result: dict[str, Any] = {"runs": runs, "viewers": VIEWERS, "load_before": os.getloadavg()}
    try:
        result["approve_to_tool_start_ms"] = _summary(asyncio.run(_round(home, runs)))
    finally:
        _cli(home, "down", env=env)
        remove_home(Path(home))
    result["load_after"] = os.getloadavg()
    return result


def table(result: dict[str, Any]) -> str:
    """The section as a text table."""
    s = result["approve_to_tool_start_ms"]
    return "\n".join([
        f"approval: {result['runs']} runs, {result['viewers']} more viewers attached "
        f"(goal: p99 <= 10 ms)",
        f"{'measure':<28}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'n':>5}",
        f"{'approve → TOOL_START':<28}{s['p50']:>9}{s['p99']:>9}{s['max']:>9}{s['n']:>5}",
    ])


def main() -> None:
    """`python -m bench.approval [--quick]`."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(table(run(args.quick)))


if __name__ == "__main__":
    main()
