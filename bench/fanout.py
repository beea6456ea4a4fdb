"""Fan-out benchmark: one session, many viewers, a real broadcaster process.

A synthetic producer plays the supervisor: it produces token deltas at a fixed
rate, coalesces them with the llm caller's own `DeltaBatcher`, stamps `seq` and
pushes `TOKEN` events straight into the broadcaster's ingest socket, so what is
measured is the fan-out, not a model. Each viewer is its own process running
`Client.events()` (the code `oploop watch` runs) and reports:

- events (and deltas) delivered per second while the session streams;
- end-to-end latency p50/p99 from the production of a batch's *first* delta
  to the viewer (batching delay included), and from the push to the viewer;
- events lost after resync: the log's events the viewer never got (must be 0);
- a digest of its whole sequence, compared with the first viewer's.

Every configuration also runs a viewer attached at 50 % of the run, and the
"slow" runs add one viewer that reads ten times slower than events arrive
(while the session streams; afterwards it catches up through replay); the
other viewers' rate and latency are compared with the same run without it,
and with a control run whose extra viewer reads at full speed (which
separates the cost of one more subscriber from the cost of its slowness).

    python -m bench.fanout [--quick]         # prints the table
    from bench.fanout import run; run(quick=True) -> dict
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from actors.sandbox.workspaces import remove_home

RATE = 20_000  # token deltas per second
DELTA = "tok "  # ~ one token


# -- one viewer (in its own process) ----------------------------------------------------------


def _viewer(home: str, sid: str, pause_s: float, streaming_over: Any, results: Any,
            name: str, limit_s: float) -> None:
    import uvloop

    async def bounded() -> dict[str, Any]:
        # A viewer outlives a killed bench otherwise (it is the forkserver's child).
        async with asyncio.timeout(limit_s):
            return await _view(home, sid, pause_s, streaming_over)

    try:
        results.put((name, uvloop.run(bounded())))
    except TimeoutError:
        results.put((name, None))


async def _view(home: str, sid: str, pause_s: float, streaming_over: Any) -> dict[str, Any]:
    """Follow the session; with `pause_s`, pause that long after each event while it streams."""
    from bus.client import Client, Lag

    lat: list[float] = []
    push_lat: list[float] = []
    digest = hashlib.sha256()
    seqs = 0
    lags: list[Lag] = []
    first = last = 0.0
    deltas = 0
    gaps = 0
    expected = 1
    async with Client.connect(Path(home)) as client:
        async for ev in client.events(sid, 1, on_lag=lags.append):
            now = time.time()
            if ev["seq"] != expected:
                gaps += 1
            expected = ev["seq"] + 1
            seqs += 1
            digest.update(json.dumps(ev, sort_keys=True).encode())
            data = ev["data"]
            if ev["type"] == "TOKEN":
                first = first or now
                last = now
                deltas += len(data["text"]) // len(DELTA)
                lat.append(now - data["t0"])
                push_lat.append(now - ev["ts"])
            if pause_s and not streaming_over.is_set():
                time.sleep(pause_s)  # noqa: ASYNC251 - blocking on purpose: a slow viewer
    return {
        "events": seqs, "last_seq": expected - 1, "gaps": gaps, "digest": digest.hexdigest(),
        "token_events": len(lat), "deltas": deltas, "span_s": last - first,
        "lat": lat, "push_lat": push_lat,
        "missed_live": sum(lag.missed for lag in lags), "lost": sum(lag.lost for lag in lags),
    }


# -- the producer (in the bench process) ------------------------------------------------------


async def _produce(home: str, sid: str, seconds: float, batch_ms: float,
                   on_half: Any) -> int:
    """Stream `RATE` deltas/s for `seconds` through a `DeltaBatcher`; returns the last seq."""
    import zmq

    from actors.batching import DeltaBatcher
    from bus.codec import encode
    from bus.endpoints import Endpoints
    from bus.messages import Envelope, Event

    ctx: zmq.Context[Any] = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 1_000_000)
    push.setsockopt(zmq.LINGER, -1)  # a backlog is still delivered after the last send
    push.connect(Endpoints.for_home(Path(home)).address("ingest"))
    seq = 0
    batch_t0 = 0.0

    def emit(type_: str, data: dict[str, Any]) -> None:
        nonlocal seq
        seq += 1
        push.send(encode(Envelope(Event(seq, type_, 1, time.time(), data), sid=sid)))

    def on_batch(channel: str, text: str) -> None:
        nonlocal batch_t0
        emit("TOKEN", {"text": text, "t0": batch_t0})
        batch_t0 = 0.0

    batcher = DeltaBatcher(on_batch, interval_s=batch_ms / 1000)
    emit("SESSION_START", {})
    start = time.time()
    produced = 0
    total = int(RATE * seconds)
    half_done = False
    while produced < total:
        now = time.time()
        due = min(total, int((now - start) * RATE)) - produced
        for _ in range(due):
            if not batch_t0:
                batch_t0 = now
            batcher.add("text", DELTA)
        produced += due
        if not half_done and produced >= total // 2:
            half_done = True
            on_half()
        await asyncio.sleep(0.001)
    batcher.flush()
    emit("DONE", {"text": "", "turns": 1, "stop": "end_turn"})
    # Like the supervisor, stay until the broadcaster has everything (it may lag).
    from bus.client import Client

    async with Client.connect(Path(home)) as client:
        while (await client.last_seq(sid, timeout=30)) != seq:
            await asyncio.sleep(0.05)
    push.close()
    ctx.term()
    return seq


# -- one run ----------------------------------------------------------------------------------


@dataclass
class RunResult:
    """One configuration's figures (the counted viewers only: not the extra or late one)."""

    viewers: int
    extra: str  # "", "slow" or "normal": one more viewer, not counted
    batch_ms: float
    seconds: float
    events: int
    events_per_s: float
    deltas_per_s: float
    p50_ms: float
    p99_ms: float
    push_p50_ms: float
    push_p99_ms: float
    lost: int
    missed_live: int
    identical: bool
    late_identical: bool
    extra_identical: bool | None = None
    notes: list[str] = field(default_factory=list)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def _wait_viewers(home: str, n: int, timeout: float = 60) -> None:
    from bus.client import Client

    async with Client.connect(Path(home)) as client, asyncio.timeout(timeout):
        await client.broadcaster_stats(timeout=timeout)
        while (await client.broadcaster_stats())["viewers"] < n:
            await asyncio.sleep(0.02)


def _run_one(viewers: int, extra: str, seconds: float, batch_ms: float) -> RunResult:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["bus.client", "uvloop", "zmq", "msgpack"])
    home = tempfile.mkdtemp(prefix="opb-", dir="/tmp")
    sid = "bench0000001"
    env = {**os.environ, "OPLOOP_HOME": home}
    env.pop("OPLOOP_PARENT_PID", None)
    # The slow viewer's pause per event: ten times the time between two events
    # (batches are cut at 512 characters long before the interval at this rate).
    events_per_s = RATE / (512 / len(DELTA)) if batch_ms else RATE
    slow_pause = 10 / events_per_s
    limit_s = 60 + seconds * 6
    from bus.endpoints import Endpoints

    Endpoints.for_home(Path(home)).prepare()
    broadcaster = subprocess.Popen([sys.executable, "-m", "actors.broadcaster"], env=env)
    results: Any = ctx.Queue()
    over = ctx.Event()
    procs = []
    try:
        names = [f"v{i}" for i in range(viewers)] + (["extra"] if extra else [])
        for name in names:
            pause = slow_pause if name == "extra" and extra == "slow" else 0.0
            p = ctx.Process(target=_viewer, args=(home, sid, pause, over, results, name, limit_s))
            p.start()
            procs.append(p)
        asyncio.run(_wait_viewers(home, len(names)))

        def attach_late() -> None:
            p = ctx.Process(target=_viewer, args=(home, sid, 0.0, over, results, "late", limit_s))
            p.start()
            procs.append(p)

        last_seq = asyncio.run(_produce(home, sid, seconds, batch_ms, attach_late))
        over.set()
        got: dict[str, dict[str, Any]] = {}
        deadline = time.time() + limit_s + 10
        while len(got) < len(names) + 1 and time.time() < deadline:
            with contextlib.suppress(Exception):
                name, res = results.get(timeout=1)
                if res is not None:
                    got[name] = res
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        broadcaster.send_signal(signal.SIGTERM)
        broadcaster.wait(10)
        remove_home(Path(home))
    counted = [got[n] for n in names if n != "extra" and n in got]
    first = got.get("v0", {})
    lat = [x for r in counted for x in r["lat"]]
    push = [x for r in counted for x in r["push_lat"]]
    lost = sum(last_seq - r["events"] for r in got.values()) + sum(r["lost"] for r in got.values())
    notes = [f"{n}: no result" for n in [*names, "late"] if n not in got]
    return RunResult(
        viewers=viewers, extra=extra, batch_ms=batch_ms, seconds=seconds, events=last_seq,
        events_per_s=statistics.median(r["token_events"] / r["span_s"] for r in counted)
        if counted else 0.0,
        deltas_per_s=statistics.median(r["deltas"] / r["span_s"] for r in counted)
        if counted else 0.0,
        p50_ms=_pct(lat, 0.5), p99_ms=_pct(lat, 0.99),
        push_p50_ms=_pct(push, 0.5), push_p99_ms=_pct(push, 0.99),
        lost=lost + len(notes),
        missed_live=sum(r["missed_live"] for r in got.values()),
        identical=bool(counted) and all(r["digest"] == first.get("digest") for r in counted),
        late_identical="late" in got and got["late"]["digest"] == first.get("digest"),
        extra_identical=("extra" in got and got["extra"]["digest"] == first.get("digest"))
        if extra else None,
        notes=notes,
    )


# -- the whole benchmark ----------------------------------------------------------------------


def run(quick: bool) -> dict[str, Any]:
    """Run the fan-out benchmark; `quick` shortens the runs (2 s each) for a smoke pass.

    Returns {"runs": [RunResult dicts], "checks": {...}, "table": str}.
    """
    seconds = 2.0 if quick else 10.0
    plan: list[tuple[int, str, float, float]] = []
    for n in (1, 4, 16):
        plan += [(n, extra, 20.0, seconds) for extra in ("", "slow", "normal")]
    if quick:
        plan = [(1, "", 20.0, seconds), (4, "", 20.0, seconds), (16, "", 20.0, seconds),
                (16, "slow", 20.0, seconds), (16, "normal", 20.0, seconds)]
    else:
        # No batching, one event per delta: a viewer process cannot take 20k events/s,
        # so these runs are short; they show what batching buys.
        plan += [(1, "", 0.0, 2.0), (4, "", 0.0, 2.0)]
    runs = [_run_one(n, extra, secs, batch) for n, extra, batch, secs in plan]
    checks = _checks(runs)
    out = {"runs": [asdict(r) for r in runs], "checks": checks, "load": os.getloadavg()}
    out["table"] = table(out)
    return out


def _checks(runs: list[RunResult]) -> dict[str, Any]:
    by = {(r.viewers, r.batch_ms, r.extra): r for r in runs}
    slow_vs_base = []
    for r in runs:
        if r.extra != "slow":
            continue
        for against in ("", "normal"):
            b = by.get((r.viewers, r.batch_ms, against))
            if b is not None:
                slow_vs_base.append({
                    "viewers": r.viewers, "against": against or "without",
                    "rate_change_pct": 100 * (r.events_per_s / b.events_per_s - 1),
                    "p50_change_pct": 100 * (r.p50_ms / b.p50_ms - 1),
                    "p99_change_pct": 100 * (r.p99_ms / b.p99_ms - 1),
                })
    return {
        "lost_total": sum(r.lost for r in runs),
        "all_identical": all(r.identical and r.late_identical and r.extra_identical is not False
                             for r in runs),
        "slow_vs_base": slow_vs_base,
        "slow_within_10pct": all(abs(c["rate_change_pct"]) <= 10 and c["p50_change_pct"] <= 10
                                 for c in slow_vs_base),
    }


def table(result: dict[str, Any]) -> str:
    """The benchmark's printable table."""
    rows = [RunResult(**r) for r in result["runs"]]
    lines = [
        f"fan-out: 1 session, {RATE} token deltas/s, real broadcaster, viewers as processes "
        f"(load {result['load'][0]:.2f})",
        f"{'viewers':>7} {'extra':>6} {'batch':>6} {'events':>7} {'ev/s/viewer':>11} "
        f"{'deltas/s/viewer':>15} {'p50 ms':>7} {'p99 ms':>7} {'push p50/p99 ms':>16} "
        f"{'lost':>4} {'missed live':>11} {'same seq':>8} {'late@50%':>8}",
    ]
    for r in rows:
        same = "yes" if r.identical and r.extra_identical is not False else "NO"
        lines.append(
            f"{r.viewers:>7} {r.extra or '-':>6} {f'{r.batch_ms:g}ms':>6} {r.events:>7} "
            f"{r.events_per_s:>11.0f} {r.deltas_per_s:>15.0f} {r.p50_ms:>7.2f} {r.p99_ms:>7.2f} "
            f"{f'{r.push_p50_ms:.2f}/{r.push_p99_ms:.2f}':>16} {r.lost:>4} {r.missed_live:>11} "
            f"{same:>8} {'yes' if r.late_identical else 'NO':>8}"
        )
        lines += [f"    note: {n}" for n in r.notes]
    c = result["checks"]
    for s in c["slow_vs_base"]:
        lines.append(
            f"with a 10x slower viewer, {s['viewers']} viewer(s), against the run "
            f"{'without it' if s['against'] == 'without' else 'with a full-speed extra viewer'}: "
            f"rate {s['rate_change_pct']:+.1f}%, "
            f"p50 {s['p50_change_pct']:+.1f}%, p99 {s['p99_change_pct']:+.1f}%"
        )
    lines.append(
        f"lost after resync: {c['lost_total']} (must be 0); all sequences identical: "
        f"{'yes' if c['all_identical'] else 'NO'}; slow viewer within 10%: "
        f"{'yes' if c['slow_within_10pct'] else 'NO'}"
    )
    lines.append("p50/p99: first delta of a batch produced -> viewer (batching delay included); "
                 "push: event pushed to the broadcaster -> viewer. The extra viewer is not "
                 "counted in the "
                 "figures; 'missed live' counts events a viewer got from replay instead.")
    return "\n".join(lines)


def main() -> None:
    """`python -m bench.fanout [--quick] [--json]`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 s runs, fewer configurations")
    parser.add_argument("--json", action="store_true", help="print the result dict as JSON")
    args = parser.parse_args()
    result = run(quick=args.quick)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "table"}, indent=1))
    else:
        print(result["table"])


if __name__ == "__main__":
    main()
