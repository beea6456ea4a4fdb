"""ask_machine: time from a UI cancel of the asking session to the end of the remote
run's tool, across two hosts on loopback TCP with CURVE.

Host B listens on 127.0.0.2 and issued host A a peer key; A's `[peers.b]` uses it.
Each run: A's model asks B, B's model runs `shell sleep 120`; once B's `TOOL_START`
has reached A's session (relayed), the client cancels A's session ("ui"), and the
time to B's `TOOL_END` of that tool (its timestamp, stamped by B's supervisor: the
same clock) is measured. Goal: <= 1 link round trip + 50 ms. The link's round trip is
measured too (a request on B's priority control socket over the peer's connection).
Idle, then loaded (one busy process per core next to both hosts); `os.getloadavg()`
before and after each.

    python -m bench.ask [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from actors.sandbox.workspaces import remove_home
from bus.client import Client
from bus.endpoints import Endpoints
from bus.errors import RemoteError
from bus.vocab import TERMINAL, CancelMode

REMOTE = {"scripts": {"slow": [
    {"reply": [{"type": "tool_use", "name": "shell", "input": {"command": "sleep 120"}}]},
    {"reply": "never"}]}}
CALLER = {"scripts": {"askb": [
    {"reply": [{"type": "tool_use", "name": "ask_machine",
                "input": {"machine": "b", "prompt": "#slow wait"}}]},
    {"reply": "never"}]}}


def _cli(home: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    full.update(env, OPLOOP_HOME=home, OPLOOP_HTTP_LISTEN="off")
    return subprocess.run([sys.executable, "-m", "actors.cli", *args], env=full,
                          capture_output=True, text=True, timeout=120, check=False)


def _free_port(host: str) -> int:
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((host, 0))
            base = probe.getsockname()[1]
        try:
            for port in range(base, base + 5):
                with socket.socket() as s:
                    s.bind((host, port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no free ports on {host}")


async def _one(a: Client, b: Client) -> float:
    """One run: cancel of A -> B's TOOL_END, in ms."""
    started = await a.start("#askb")
    remote = ""
    async for ev in a.events(started.session, started.from_seq, stop_at="first"):
        if ev["type"] == "MACHINE_EVENT" and ev["data"]["event"]["type"] == "TOOL_START":
            remote = ev["data"]["session"]
            break
        if ev["type"] in TERMINAL:
            raise RuntimeError(f"A's run ended before B's tool started: {ev}")
    sent = time.time()
    await a.cancel(started.session, CancelMode.UI)
    async for ev in b.events(remote, stop_at="first"):
        if ev["type"] == "TOOL_END":
            return (ev["ts"] - sent) * 1000
    raise RuntimeError("B's run ended without a TOOL_END")


async def _round_trips(peer: Client, n: int) -> list[float]:
    """Requests on B's control socket over the peer's own connection (an unknown
    session: answered at once, with an error)."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        with contextlib.suppress(RemoteError):
            await peer.renew("0" * 12, 1.0)
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def _measure(homes: dict[str, str], listen: str, keys: Path,
                   runs: int) -> dict[str, Any]:
    async with Client.connect(Path(homes["a"])) as a, Client.connect(Path(homes["b"])) as b, \
            Client.connect(endpoints=Endpoints.elsewhere(listen, keys)) as peer:
        await _one(a, b)  # warm-up: the connections, the sandbox's first call
        cancels = [await _one(a, b) for _ in range(runs)]
        rtts = await _round_trips(peer, 50)
    return {"cancel_to_remote_tool_end_ms": _summary(cancels),
            "link_round_trip_ms": _summary(rtts)}


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50": round(statistics.median(ordered), 2), "p99": round(p99, 2),
            "max": round(ordered[-1], 2), "n": len(ordered)}


@contextlib.contextmanager
def _busy(n: int):
    """`n` processes spinning (one per core: the load of the loaded round)."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def run(quick: bool = False) -> dict[str, Any]:
    """The ask section: cancel across an ask_machine, idle and loaded."""
    runs = 10 if quick else 40
    homes = {n: tempfile.mkdtemp(prefix=f"opa{n}-", dir="/tmp") for n in "ab"}
    listen = f"tcp://127.0.0.2:{_free_port('127.0.0.2')}"
    result: dict[str, Any] = {"runs": runs}
    started: list[str] = []
    try:
        Path(homes["b"], "oploop.toml").write_text(f'[network]\nlisten = "{listen}"\n')
        Path(homes["b"], "scenario.json").write_text(json.dumps(REMOTE))
        issued = _cli(homes["b"], "keys", "add", "host-a", "--role", "peer", env={})
        if issued.returncode != 0:
            raise RuntimeError(f"oploop keys add failed: {issued.stderr}")
        keys = Path(homes["b"]) / "keys" / "issued" / "host-a"
        Path(homes["a"], "oploop.toml").write_text(
            f'[peers.b]\nconnect = "{listen}"\nkeys = "{keys}"\n')
        Path(homes["a"], "scenario.json").write_text(json.dumps(CALLER))
        for name in ("b", "a"):
            env = {"OPLOOP_OFFLINE_SCENARIO": str(Path(homes[name], "scenario.json"))}
            up = _cli(homes[name], "up", "--detach", env=env)
            if up.returncode != 0:
                raise RuntimeError(f"oploop up ({name}) failed: {up.stderr}")
            started.append(name)
        for label, busy in (("idle", 0), ("loaded", os.cpu_count() or 2)):
            with _busy(busy):
                before = os.getloadavg()
                figures = asyncio.run(_measure(homes, listen, keys, runs))
                result[label] = {**figures, "busy_processes": busy, "load_before": before,
                                 "load_after": os.getloadavg()}
    finally:
        for name in started:
            _cli(homes[name], "down", env={})
        for home in homes.values():
            remove_home(Path(home))
    return result


def table(result: dict[str, Any]) -> str:
    """The section as a text table."""
    lines = [f"ask: cancel of the asking session -> the remote tool's end, {result['runs']} "
             "runs each (goal: <= 1 link round trip + 50 ms)",
             f"{'measure':<40}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'n':>5}  load (1 min)"]
    for label in ("idle", "loaded"):
        r = result[label]
        load = f"{r['load_before'][0]:.2f} → {r['load_after'][0]:.2f}"
        for key, name in (("cancel_to_remote_tool_end_ms", "cancel → remote TOOL_END"),
                          ("link_round_trip_ms", "link round trip")):
            s = r[key]
            lines.append(f"{f'{name} ({label})':<40}{s['p50']:>9}{s['p99']:>9}{s['max']:>9}"
                         f"{s['n']:>5}  {load}")
    return "\n".join(lines)


def main() -> None:
    """`python -m bench.ask [--quick]`."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print(table(run(args.quick)))


if __name__ == "__main__":
    main()
