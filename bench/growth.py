"""Growth: each actor's RSS before and after many finished sessions.

A host with the scripted model (so the figure is oploop's, not an SDK's) runs
`SESSIONS` trivial sessions (one `read_file` turn each), `BATCH` at a time, to
their end. RSS of every actor is read after a warm-up batch (one-off costs
paid) and again after all sessions; the goal (issue 13) is that no actor grows
by more than 5 MB over 10,000 sessions. The journal and event store sizes on
disk are reported beside it, per session. Retention runs as on a busy host (its
default `max_sessions`), every `RETENTION_EVERY` rather than every minute so that
a run of any speed includes several rounds of it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psutil
import uvloop

from bench.driver import Driver
from bench.host import BenchHost
from bench.stats import table as text_table

MB = 1024 * 1024
#: Finished sessions in the full run (the issue's figure) and in --quick.
SESSIONS, QUICK_SESSIONS = 10_000, 1_000
#: Sessions started together (each a single turn).
BATCH = 100
#: Goal: no actor grows more than this over SESSIONS sessions.
GOAL_MB = 5.0
#: How often the host applies retention during the run.
RETENTION_EVERY = "10s"


def actor_rss(host: BenchHost) -> dict[str, int]:
    """RSS of each long-lived host process, keyed by its name (`BenchHost.process_names`):
    the actors and the fork servers. What the sandbox forks per session or call
    (readers retired after seconds idle, running tools) is left out: it is not kept."""
    names = host.process_names()
    out = {}
    for proc in host.processes():
        name = names.get(proc.pid, "")
        if not name or name.startswith("sandbox:"):
            continue
        try:
            out[name] = proc.memory_info().rss
        except psutil.Error:
            continue
    return out


def disk_bytes(host: BenchHost) -> int:
    """Bytes of every SQLite file (and its -wal) in the host's home."""
    return sum(p.stat().st_size for p in host.home.glob("*.db*") if p.is_file())


async def _sessions(host: BenchHost, count: int) -> float:
    async with Driver(host.home, cwd=host.dir) as driver:
        started = time.perf_counter()
        for done in range(0, count, BATCH):
            await driver.many(min(BATCH, count - done), 1)
        return time.perf_counter() - started


def run(quick: bool) -> dict[str, Any]:
    """RSS per actor before and after the sessions; the delta in MB."""
    count = QUICK_SESSIONS if quick else SESSIONS
    with BenchHost(config=f'[retention]\nevery = "{RETENTION_EVERY}"\n') as host:
        uvloop.run(_sessions(host, BATCH))  # warm: the first sessions pay one-off costs
        before, disk0 = actor_rss(host), disk_bytes(host)
        elapsed = uvloop.run(_sessions(host, count))
        time.sleep(1.0)  # let the last writes and frees land
        after, disk1 = actor_rss(host), disk_bytes(host)
    return {
        "sessions": count,
        "sessions_s": elapsed,
        "before": before,
        "after": after,
        "delta_mb": {k: (after.get(k, 0) - v) / MB for k, v in before.items()},
        "disk_before": disk0,
        "disk_after": disk1,
        "disk_per_session": (disk1 - disk0) / count,
        "loadavg": list(os.getloadavg()),
    }


def table(result: dict[str, Any]) -> str:
    """RSS per actor before/after, and its growth."""
    rows = []
    for name, rss in result["before"].items():
        delta = result["delta_mb"][name]
        per_session = delta * MB / result["sessions"]
        rows.append([name, f"{rss / MB:.1f} MB", f"{result['after'].get(name, 0) / MB:.1f} MB",
                     f"{delta:+.1f} MB", f"{per_session:+,.0f} B",
                     "ok" if delta <= GOAL_MB else "over"])
    rows.append(["journal + event store on disk", f"{result['disk_before'] / MB:.1f} MB",
                 f"{result['disk_after'] / MB:.1f} MB",
                 f"{(result['disk_after'] - result['disk_before']) / MB:+.1f} MB",
                 f"{result['disk_per_session']:+,.0f} B", ""])
    load = " ".join(f"{x:.2f}" for x in result["loadavg"])
    headers = ["RSS", "before", f"after {result['sessions']} sessions", "delta",
               "per session", f"<= {GOAL_MB:g} MB"]
    return (f"{text_table(headers, rows)}\n({result['sessions']} one-turn sessions, "
            f"{BATCH} at a time, in {result['sessions_s']:.0f} s; load average {load})")
