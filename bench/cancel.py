"""Cancellation under load: how fast a UI cancel is seen, and how fast the tool dies.

100 concurrent sessions (20 with `quick`) on a real host with the offline
model: half stream a long reply, half run a `shell` tool that sleeps and whose
grandchild double-forks and calls `setsid`. Each session is cancelled at a
random moment once it is under way. Measured per cancel: cancel sent →
`CANCELLED` received by that session's viewer, and cancel sent → every
process of the tool gone (the pids are read from the process table before
the cancel, then polled). Then the same with the cancel sent down the data
path (the api socket) instead of the priority control socket.

    python -m bench.cancel [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from actors.sandbox.workspaces import remove_home
from bus.client import Client

WORDS = " ".join(f"w{i}" for i in range(3000))


def _tool_command(mark: str) -> str:
    """Four processes, each with `mark` plus a digit on its command line."""
    # sleep | a double-forked, setsid'd grandchild with its own child | sleep
    return (f"sleep {mark}1 & (setsid sh -c 'sleep {mark}2 & exec sleep {mark}3' &) ; "
            f"exec sleep {mark}4")


def _scenario(sessions: int) -> dict[str, Any]:
    scripts = {}
    for i in range(sessions):
        if i % 2:
            turn = {"reply": [{"type": "tool_use", "name": "shell",
                               "input": {"command": _tool_command(f"9{i:03d}")}}]}
        else:
            turn = {"reply": WORDS, "delay_s": 0.01}  # ~30 s: still streaming when cancelled
        scripts[f"s{i}"] = [turn]
    return {"scripts": scripts}


def _cli(home: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    full.update(env, OPLOOP_HOME=home)
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], env=full,
                          capture_output=True, text=True, timeout=120, check=False)


def _tool_pids(marks: set[str]) -> dict[str, list[int]]:
    """The pids of every process whose command line carries one of `marks`."""
    found: dict[str, list[int]] = {m: [] for m in marks}
    for p in psutil.process_iter(["cmdline"]):
        for part in p.info["cmdline"] or ():
            mark = part[:-1]
            if mark in found:
                found[mark].append(p.pid)
                break
    return found


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class _Session:
    """One benchmark session: its viewer, and when its CANCELLED arrived."""

    def __init__(self, client: Client, index: int) -> None:
        self.client = client
        self.index = index
        self.tool = index % 2 == 1
        self.mark = f"9{index:03d}"
        self.under_way = asyncio.Event()
        self.cancelled: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.pids: list[int] = []
        self.viewer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        started = await self.client.start(f"#s{self.index} go")
        self.session = started.session
        self.viewer = asyncio.create_task(self._view(started.from_seq))

    async def _view(self, from_seq: int) -> None:
        async for event in self.client.events(self.session, from_seq, stop_at="first"):
            kind = event["type"]
            if kind == "TOKEN" or (kind == "TOOL_START" and self.tool):
                self.under_way.set()
            if kind == "CANCELLED" and not self.cancelled.done():
                self.cancelled.set_result(time.perf_counter())
            elif kind in ("DONE", "ERROR") and not self.cancelled.done():
                self.cancelled.set_exception(RuntimeError(f"session {self.index} ended {kind}"))

    async def cancel(self, via: str, delay_s: float) -> dict[str, float]:
        """Cancel after `delay_s`; the latencies in ms."""
        await asyncio.sleep(delay_s)
        sent = time.perf_counter()
        await self.client.cancel(self.session, via=via)
        out = {"to_cancelled_ms": (await asyncio.wait_for(self.cancelled, 10) - sent) * 1000}
        if self.tool:
            while any(_alive(p) for p in self.pids) and time.perf_counter() - sent < 5:
                await asyncio.sleep(0.001)
            out["to_tree_gone_ms"] = (time.perf_counter() - sent) * 1000
            survivors = [p for p in self.pids if _alive(p)]
            out["tree_survivors"] = len(survivors)
            for pid in survivors:  # killed here, never left behind
                with contextlib.suppress(psutil.Error):
                    psutil.Process(pid).kill()
        assert self.viewer is not None
        await self.viewer
        return out


async def _round(home: str, sessions: int, via: str) -> list[dict[str, float]]:
    """Start every session, wait until all are under way (streaming, or with the
    tool's four processes up), then cancel each at a random moment within 0.5 s."""
    rng = random.Random(7)
    async with Client.connect(Path(home)) as client:
        runs = [_Session(client, i) for i in range(sessions)]
        await asyncio.gather(*(r.start() for r in runs))
        await asyncio.wait_for(asyncio.gather(*(r.under_way.wait() for r in runs)), 60)
        tools = {r.mark: r for r in runs if r.tool}
        for _ in range(500):
            found = _tool_pids(set(tools))
            if all(len(pids) >= 4 for pids in found.values()):
                break
            await asyncio.sleep(0.02)
        for mark, pids in found.items():
            tools[mark].pids = pids
        return list(await asyncio.gather(*(r.cancel(via, rng.uniform(0, 0.5)) for r in runs)))


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 2), "p99": round(p99, 2),
            "max": round(ordered[-1], 2), "n": len(ordered)}


def run(quick: bool = False) -> dict[str, Any]:
    """The cancellation section: latencies by path (control vs api)."""
    sessions = 20 if quick else 100
    home = tempfile.mkdtemp(prefix="opb-", dir="/tmp")
    scenario = Path(home) / "scenario.json"
    scenario.write_text(json.dumps(_scenario(sessions)))
    env = {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}
    up = _cli(home, "up", "--detach", env=env)
    if up.returncode != 0:
        raise RuntimeError(f"oploop up failed: {up.stderr}")
    result: dict[str, Any] = {"sessions": sessions, "load_before": os.getloadavg()}
    try:
        for via in ("control", "api"):
            rows = asyncio.run(_round(home, sessions, via))
            result[via] = {
                "to_cancelled_ms": _summary([r["to_cancelled_ms"] for r in rows]),
                "to_tree_gone_ms": _summary([r["to_tree_gone_ms"] for r in rows
                                             if "to_tree_gone_ms" in r]),
                "trees_with_survivors": sum(1 for r in rows if r.get("tree_survivors")),
                "surviving_processes": sum(int(r.get("tree_survivors", 0)) for r in rows),
            }
    finally:
        _cli(home, "down", env=env)
        remove_home(Path(home))
    result["load_after"] = os.getloadavg()
    return result


def table(result: dict[str, Any]) -> str:
    """The section as a text table."""
    lines = [f"cancellation: {result['sessions']} concurrent sessions "
             f"(half streaming, half in a shell tree)",
             f"{'path':<9}{'measure':<22}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'n':>5}"]
    for via in ("control", "api"):
        for key, label in (("to_cancelled_ms", "cancel → CANCELLED"),
                           ("to_tree_gone_ms", "cancel → tree gone")):
            s = result[via][key]
            if s:
                lines.append(f"{via:<9}{label:<22}{s['p50']:>9}{s['p99']:>9}{s['max']:>9}"
                             f"{s['n']:>5}")
        survivors = result[via]['trees_with_survivors']
        lines.append(f"{via:<9}{'trees with survivors':<22}{survivors:>9}")
    return "\n".join(lines)


def main() -> None:
    """`python -m bench.cancel [--quick]`: print the table (and the JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = run(args.quick)
    print(json.dumps(result) if args.json else table(result))


if __name__ == "__main__":
    main()
