"""The `store` section's figures with real hosts on one store (`bench.store` runs them).

- turns/s with 1, 2 and 3 hosts on one PostgreSQL store, beside one host on its SQLite
  file: each host runs the same number of concurrent sessions of `read_file` turns
  with the scripted model (`bench.host`, `bench.driver`), all hosts at once;
- a graceful hand-over: `oploop down` of the host running sessions in a tool call,
  and the time from the start of `down` to each session's `RESUMED` on the other host;
- the timeline of one failover (kill -9 of the owner): the kill, the lease's lapse and
  its claim (the store's clock, from the claimer's log) and `RESUMED`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.driver import Driver
from bench.host import BenchHost

TURNS = 20


async def _drive(homes: list[Path], sessions: int, turns: int) -> float:
    """Every host runs `sessions` sessions of `turns` turns at once: turns/s in all."""
    async with contextlib.AsyncExitStack() as stack:
        drivers = [await stack.enter_async_context(Driver(h)) for h in homes]
        t0 = time.perf_counter()
        before = sum(d.turns_ended for d in drivers)
        await asyncio.gather(*(d.many(sessions, turns) for d in drivers))
        return (sum(d.turns_ended for d in drivers) - before) / (time.perf_counter() - t0)


def turns_per_s(url: str, hosts: int, sessions: int, turns: int = TURNS) -> float:
    """Turns/s of `hosts` hosts on the store at `url` ("": one host, its SQLite file)."""
    config = f'[store]\nurl = "{url}"\n' if url else ""
    started: list[BenchHost] = []
    try:
        for _ in range(hosts):
            host = BenchHost(config=config)
            started.append(host)
            host.start()
        return asyncio.run(_drive([h.home for h in started], sessions, turns))
    finally:
        for host in started:
            host.stop()


@contextlib.contextmanager
def two_homes(url: str, tool: dict[str, Any], ok: dict[str, Any]) -> Iterator[list[dict]]:
    """The environments of two hosts on `url` (offline model scenarios: the first's
    asks for `tool`, the second's answers the resumed turn with `ok`)."""
    work = Path(tempfile.mkdtemp(prefix="oploop-bench-store-"))
    envs = []
    for name, script in (("a", [tool, ok]), ("b", [ok])):
        scenario = work / f"{name}.json"
        scenario.write_text(json.dumps({"scripts": {"tool": script}}))
        envs.append({"OPLOOP_STORE": url, "OPLOOP_OFFLINE_SCENARIO": str(scenario)})
    try:
        yield envs
    finally:
        shutil.rmtree(work, ignore_errors=True)


def timeline(log: Path, killed_at: float, resumed_at: float) -> dict[str, float]:
    """A failover as it happened, in seconds after the kill: the lease's lapse and its
    claim (the store's clock, from the claimer's `host.log`) and `RESUMED`."""
    for line in log.read_text().splitlines():
        found = re.search(r"lapsed at ([\d.]+), claimed at ([\d.]+)", line)
        if found:
            lapsed, claimed = map(float, found.groups())
            return {"kill": 0.0, "lease lapsed": lapsed - killed_at,
                    "claimed": claimed - killed_at, "RESUMED": resumed_at - killed_at}
    return {}


def timeline_line(steps: dict[str, float]) -> str:
    """`kill 0.00 s, lease lapsed +4.52 s, ...`."""
    return ", ".join(f"{name} {at:+.2f} s" if at else f"{name} 0.00 s"
                     for name, at in steps.items())
