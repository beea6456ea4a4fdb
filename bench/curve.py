"""What turning TCP on costs: the same 20-turn sessions on a host serving ipc only,
and on a host that also listens on TCP with CURVE (so its own actors speak CURVE
over ipc too), driven locally and from a client over TCP with an issued key.

The workload is `turns`' (one `read_file` per turn, the scripted model). Both
hosts run at once and their sessions alternate, so that a shared machine's
noise falls on each alike. Per-turn p50 (supervisor timestamps) and CPU per
turn of all host processes; each figure the median over the sessions.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import uvloop

from bench.driver import Driver
from bench.host import BenchHost
from bench.stats import median, ms, ratio
from bench.stats import table as text_table
from bench.turns import cpu_delta
from bus.endpoints import Endpoints

TURNS = 20


def _free_base() -> int:
    """A port with four free ones after it (good enough for a benchmark)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base: int = probe.getsockname()[1]
        if base + 5 < 65535:
            return base
    raise RuntimeError("no free port")


async def _measure(drivers: dict[str, tuple[Driver, BenchHost]], sessions: int
                   ) -> dict[str, Any]:
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in drivers}
    for driver, _ in drivers.values():
        await driver.run(TURNS)  # warm
    for i in range(sessions):
        names = list(drivers) if i % 2 == 0 else list(reversed(drivers))
        for name in names:
            driver, host = drivers[name]
            cpu0 = host.cpu_s()
            run = await driver.run(TURNS)
            samples[name].append((median(run.turn_s()), cpu_delta(cpu0, host.cpu_s()) / TURNS))
    return {name: {"p50_s": median(p for p, _ in s), "cpu_per_turn_s": median(c for _, c in s),
                   "sessions": len(s)} for name, s in samples.items()}


async def _drive(plain: BenchHost, curve: BenchHost, listen: str, keys: Path,
                 sessions: int) -> dict[str, Any]:
    async with Driver(plain.home, cwd=plain.dir) as local_plain, \
            Driver(curve.home, cwd=curve.dir) as local_curve, \
            Driver(curve.home, Endpoints.elsewhere(listen, keys), cwd=curve.dir) as remote:
        return await _measure({"ipc": (local_plain, plain),
                               "ipc, CURVE on": (local_curve, curve),
                               "tcp + CURVE": (remote, curve)}, sessions)


def run(quick: bool) -> dict[str, Any]:
    """Per-turn p50 and CPU per turn, per set-up."""
    sessions = 4 if quick else 15
    listen = f"tcp://127.0.0.1:{_free_base()}"
    with BenchHost() as plain, BenchHost(listen=listen) as curve:
        issued = curve.oploop("keys", "add", "bench", "--role", "control")
        if issued.returncode != 0:
            raise RuntimeError(f"oploop keys add failed: {issued.stderr}")
        keys = curve.home / "keys" / "issued" / "bench"
        result = uvloop.run(_drive(plain, curve, listen, keys, sessions))
    return {"turns": TURNS, "setups": result}


def table(result: dict[str, Any]) -> str:
    """The set-ups side by side, each against ipc alone."""
    setups = result["setups"]
    base = setups["ipc"]
    rows = [[name, ms(f["p50_s"]), ms(f["cpu_per_turn_s"]),
             "" if name == "ipc" else ratio(f["p50_s"], base["p50_s"]),
             "" if name == "ipc" else ratio(f["cpu_per_turn_s"], base["cpu_per_turn_s"])]
            for name, f in setups.items()]
    return text_table([f"{result['turns']}-turn sessions", "turn p50", "CPU/turn",
                       "p50 / ipc", "CPU / ipc"], rows)
