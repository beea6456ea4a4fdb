"""The `store` section: the session log in PostgreSQL beside SQLite, and failover.

Against a throwaway local cluster (`bench.pgcluster`: unix socket, and `fsync=off`
as every test cluster here: figures of the client and server path, not of a disk):

- append latency: one commit of one event (a record with its delta), fenced (the
  lease's epoch checked in the transaction), p50/p99, beside SQLite's;
- events/s one writer appends with group commit: every event of a loop iteration
  goes in one commit (`Journal.commit`); batches of 1, 10 and 100 events;
- replay of a 10,000-event session: every frame read back in the broadcaster's
  1 MB batches (`PgSessionLog.range`);
- failover: two real hosts on one store (separate homes), N sessions each in a tool
  call on the first, which is frozen and killed (-9, every process at once); the
  time from the kill to each session's `RESUMED` on the other host, p50/p99, and the
  first kill's timeline (kill, lease lapsed, claimed, `RESUMED`);
- hand-over: the same with `oploop down` instead of the kill, from its start;
- turns/s with 1, 2, 3 hosts on one store beside SQLite (`bench.storehosts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench import pgcluster, storehosts
from bench.stats import percentile
from bench.stats import table as text_table

FRAME = b"f" * 180  # about a TOKEN event's frame
DELTA = b"d" * 40
EVENTS_10K = 10_000
MARK = "4545"
TOOL = {"reply": [{"type": "tool_use", "name": "shell",
                   "input": {"command": f"exec sleep {MARK}0"}}]}
OK = {"reply": "carried on", "stop_reason": "end_turn"}


def _records(sid: str, start: int, n: int) -> list[Any]:
    from actors.sessionlog import Record

    return [Record(sid, seq, FRAME, DELTA) for seq in range(start, start + n)]


def _fenced(url: str, tmp: Path, sids: list[str]) -> Any:
    """A PostgreSQL store whose writer holds the leases of `sids`, as a host does."""
    from actors.logstore import open_store
    from actors.pgleases import Fence, acquire

    store = open_store(tmp, url)
    store.fence = fence = Fence("bench", 600.0)
    for sid in sids:
        epoch = acquire(store.connection(), sid, "bench", 600.0)
        fence.epochs[sid] = epoch
    return store


def append_latency(store: Any, n: int) -> dict[str, float]:
    """p50/p99 (seconds) of committing one record, `n` times."""
    took = []
    for seq in range(1, n + 1):
        batch = _records("lat", seq, 1)
        t = time.perf_counter()
        store.commit(batch)
        took.append(time.perf_counter() - t)
    return {"p50": percentile(took, 50), "p99": percentile(took, 99)}


def events_per_s(store: Any, sid: str, batch: int, total: int) -> float:
    """Events appended per second in commits of `batch` events."""
    seq = 1
    t = time.perf_counter()
    while seq <= total:
        store.commit(_records(sid, seq, batch))
        seq += batch
    return (seq - 1) / (time.perf_counter() - t)


def replay_10k(store: Any) -> float:
    """Seconds to read every frame of a 10,000-event session in 1 MB batches."""
    for start in range(1, EVENTS_10K + 1, 1000):
        store.commit(_records("replay", start, 1000))
    t = time.perf_counter()
    seq, frames = 1, 0
    while True:
        got, more = store.range("replay", seq, EVENTS_10K, 1 << 20)
        frames += len(got)
        seq = got[-1][0] + 1 if got else seq
        if not more:
            break
    took = time.perf_counter() - t
    assert frames == EVENTS_10K, frames
    return took


def _oploop(home: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    full.update(env, OPLOOP_HOME=home, OPLOOP_HTTP_LISTEN="off", OPLOOP_SANDBOX="scratch")
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], env=full,
                          capture_output=True, text=True, timeout=120, check=False)


def _host_tree(home: str) -> list[psutil.Process]:
    state = json.loads((Path(home) / "run" / "host.json").read_text())
    procs = [psutil.Process(state["pid"])]
    procs += procs[0].children(recursive=True)
    return procs


async def _start_tools(home: str, n: int) -> list[str]:
    from bus.client import Client

    async with Client.connect(Path(home)) as client:
        async def one() -> str:
            started = await client.start("#tool go")
            async for event in client.events(started.session, started.from_seq,
                                             stop_at="first"):
                if event["type"] == "TOOL_START":
                    return started.session
            raise RuntimeError("a run ended before its tool started")
        return list(await asyncio.gather(*(one() for _ in range(n))))


async def _resumed_at(home: str, sids: list[str]) -> list[float]:
    from bus.client import Client

    async with Client.connect(Path(home)) as client:
        async def one(sid: str) -> float:
            async for event in client.events(sid, 1, stop_at="last"):
                if event["type"] == "RESUMED":
                    return float(event["ts"])
            raise RuntimeError(f"{sid} ended without RESUMED")
        return list(await asyncio.gather(*(one(s) for s in sids)))


def _kill(home: str) -> float:
    """Freeze, then kill -9, every process of the host in `home`; when (time.time())."""
    procs = _host_tree(home)
    killed_at = time.time()
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
    psutil.wait_procs(procs, timeout=10)
    return killed_at


def _terminate(home: str) -> float:
    """SIGTERM to the host in `home` (what `oploop down` sends), waited for; when."""
    host = _host_tree(home)[0]
    at = time.time()
    host.terminate()
    host.wait(timeout=30)
    return at


def failover(url: str, sessions: int, rounds: int, *,
             graceful: str = "") -> tuple[list[float], dict[str, float]]:
    """Kill -> RESUMED seconds of every session over `rounds` kills of the owner (with
    `graceful` "down": start of `oploop down` -> RESUMED; "sigterm": the host's SIGTERM
    -> RESUMED), and the first kill's timeline."""
    from actors.sandbox.workspaces import remove_home

    took: list[float] = []
    steps: dict[str, float] = {}
    with storehosts.two_homes(url, TOOL, OK) as envs:
        b = tempfile.mkdtemp(prefix="opsb-", dir="/tmp")
        try:
            up = _oploop(b, "up", "--detach", env=envs[1])
            if up.returncode:
                raise RuntimeError(f"host b: {up.stderr}")
            for _ in range(rounds):
                a = tempfile.mkdtemp(prefix="opsa-", dir="/tmp")
                try:
                    up = _oploop(a, "up", "--detach", env=envs[0])
                    if up.returncode:
                        raise RuntimeError(f"host a: {up.stderr}")
                    sids = asyncio.run(_start_tools(a, sessions))
                    if graceful == "down":
                        stopped_at = time.time()
                        _oploop(a, "down", env=envs[0])
                    elif graceful == "sigterm":
                        stopped_at = _terminate(a)
                    else:
                        stopped_at = _kill(a)
                    resumed = asyncio.run(_resumed_at(b, sids))
                    took += [at - stopped_at for at in resumed]
                    if not steps and not graceful:
                        steps = storehosts.timeline(Path(b) / "host.log", stopped_at,
                                                    min(resumed))
                finally:
                    remove_home(Path(a))
        finally:
            _oploop(b, "down", env=envs[1])
            remove_home(Path(b))
    return took, steps


def run(quick: bool) -> dict[str, Any]:
    """The store's figures (PostgreSQL beside SQLite) and failover's."""
    from actors.logstore import open_store

    why = pgcluster.unavailable()
    if why:
        raise RuntimeError(f"no PostgreSQL here: {why}")
    n = 500 if quick else 2000
    cluster = pgcluster.PgCluster.start()
    tmp = Path(tempfile.mkdtemp(prefix="oploop-bench-store-"))
    out: dict[str, Any] = {"loadavg_start": list(os.getloadavg())}
    try:
        sqlite = open_store(tmp, reserve_mb=0)
        pg = _fenced(pgcluster.fresh_schema(cluster), tmp, ["lat", "g1", "g10", "g100",
                                                             "replay"])
        out["append"] = {"pg": append_latency(pg, n), "sqlite": append_latency(sqlite, n)}
        out["events_per_s"] = {
            f"batch {b}": {"pg": events_per_s(pg, f"g{b}", b, n * b // 10 or b),
                           "sqlite": events_per_s(sqlite, f"g{b}", b, n * b // 10 or b)}
            for b in (1, 10, 100)}
        out["replay_10k_s"] = {"pg": replay_10k(pg), "sqlite": replay_10k(sqlite)}
        pg.close()
        sqlite.close()
        sessions, rounds = (4, 1) if quick else (10, 2)
        took, steps = failover(pgcluster.fresh_schema(cluster), sessions, rounds)
        out["failover"] = {"sessions": sessions, "rounds": rounds,
                           "p50": percentile(took, 50), "p99": percentile(took, 99),
                           "max": max(took), "timeline": steps}
        rounds = 3 if quick else 6
        out["handover"] = {"rounds": rounds}
        for how in ("down", "sigterm"):
            took, _ = failover(pgcluster.fresh_schema(cluster), 1, rounds, graceful=how)
            out["handover"][how] = {"p50": percentile(took, 50), "max": max(took)}
        sessions = 4 if quick else 8
        out["turns_per_s"] = {"sessions per host": sessions, "turns": storehosts.TURNS,
                              "sqlite": storehosts.turns_per_s("", 1, sessions)}
        for hosts in (1, 2, 3):
            out["turns_per_s"][f"pg {hosts}"] = storehosts.turns_per_s(
                pgcluster.fresh_schema(cluster), hosts, sessions)
    finally:
        cluster.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out["loadavg_end"] = list(os.getloadavg())
    return out


def table(result: dict[str, Any]) -> str:
    """Append latency, group commit, replay and failover, PostgreSQL beside SQLite."""
    a = result["append"]
    rows = [["append, 1 event per commit: p50", f"{a['pg']['p50'] * 1e3:.3f} ms",
             f"{a['sqlite']['p50'] * 1e3:.3f} ms"],
            ["append, 1 event per commit: p99", f"{a['pg']['p99'] * 1e3:.3f} ms",
             f"{a['sqlite']['p99'] * 1e3:.3f} ms"]]
    for name, figs in result["events_per_s"].items():
        rows.append([f"events/s, {name} per commit", f"{figs['pg']:,.0f}",
                     f"{figs['sqlite']:,.0f}"])
    r = result["replay_10k_s"]
    rows.append(["replay of 10,000 events", f"{r['pg'] * 1e3:.0f} ms",
                 f"{r['sqlite'] * 1e3:.0f} ms"])
    f = result["failover"]
    rows.append([f"kill -9 -> RESUMED ({f['sessions']} sessions x {f['rounds']}): p50",
                 f"{f['p50']:.2f} s", "-"])
    rows.append(["kill -9 -> RESUMED: p99", f"{f['p99']:.2f} s", "-"])
    h = result.get("handover")
    if h:
        for how, what in (("down", "start of `oploop down`"), ("sigterm", "host's SIGTERM")):
            rows.append([f"{what} -> RESUMED ({h['rounds']} runs): p50 / max",
                         f"{h[how]['p50']:.2f} / {h[how]['max']:.2f} s", "-"])
    t = result.get("turns_per_s")
    if t:
        for hosts in (1, 2, 3):
            rows.append([f"turns/s, {hosts} host(s) x {t['sessions per host']} sessions",
                         f"{t[f'pg {hosts}']:,.0f}", f"{t['sqlite']:,.0f}" if hosts == 1
                         else "-"])
    load = " ".join(f"{x:.2f}" for x in result["loadavg_start"])
    steps = f.get("timeline")
    line = f"\nfailover timeline: {storehosts.timeline_line(steps)}" if steps else ""
    return (text_table(["store", "PostgreSQL", "SQLite"], rows) + line
            + f"\n(local cluster on a unix socket, fsync=off; load average at start {load})")
