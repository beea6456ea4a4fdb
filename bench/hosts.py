"""The `hosts` section: any host, any session, on one PostgreSQL store.

Two real hosts (separate homes, a throwaway local cluster: `bench.pgcluster`), first
on one machine, then with host b on "another machine" (`bench.netlink.OtherMachine`:
its own host name, mounts and network namespace; it reaches the store and host a over
TCP only, a's control socket and events with CURVE):

- cancel across hosts: a session runs a tool on host a; a client of host b cancels it
  (b sends it on to a's priority control socket, a cancels and answers once the cancel
  is committed); the client's round trip p50/p99, beside the same cancel sent to a;
- live events on the other host: sessions of a stream text (TOKENs); a viewer on a and
  one on b receive every event; each event's delay from its `ts` (emitted by a's
  supervisor) to each viewer, p50/p99, and what b adds over a, per event. A TOKEN's
  delay includes group commit (up to `TOKEN_COMMIT_S`, 0.2 s: nothing is published
  before it is committed), on both hosts alike; an event committed at once (the cancel
  rounds' `CANCELLED`) is measured apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import netlink, pgcluster
from bench.stats import percentile
from bench.stats import table as text_table

MARK = "4646"
SCRIPTS = {
    "sleep": [{"reply": [{"type": "tool_use", "name": "shell",
                          "input": {"command": f"exec sleep {MARK}0"}}]},
              {"reply": "never"}],
    "stream": [{"reply": " ".join(f"word{i}" for i in range(400)), "delay_s": 0.01}],
}


async def _cancels(a: str, b: str, id_a: str, rounds: int) -> dict[str, list[float]]:
    """Round trips of cancels sent to b (forwarded) and to a (the owner), alternating;
    and the delay from `ts` to a viewer on each host of `CANCELLED` (committed at once)."""
    from bus.client import Client

    took: dict[str, list[float]] = {"via other host": [], "via owner": [],
                                    "at once: owner": [], "at once: other": []}
    async with Client.connect(Path(a)) as on_a, Client.connect(Path(b)) as on_b:
        async def view(client: Client, sid: str, where: str, tool: asyncio.Event) -> None:
            async for event in client.events(sid, 1, stop_at="first"):
                if event["type"] == "CANCELLED":  # (both viewers wait for it: live)
                    took[f"at once: {where}"].append(time.time() - float(event["ts"]))
                if event["type"] == "TOOL_START":
                    tool.set()

        for i in range(rounds):
            started = await on_a.start("#sleep go", host=id_a)
            tools = (asyncio.Event(), asyncio.Event())
            viewers = [asyncio.create_task(view(on_a, started.session, "owner", tools[0])),
                       asyncio.create_task(view(on_b, started.session, "other", tools[1]))]
            await tools[0].wait()
            await tools[1].wait()
            via, client = ("via other host", on_b) if i % 2 == 0 else ("via owner", on_a)
            began = time.perf_counter()
            await client.cancel(started.session)
            took[via].append(time.perf_counter() - began)
            await asyncio.gather(*viewers)
    return took


async def _live(a: str, b: str, id_a: str, sessions: int) -> dict[str, list[float]]:
    """Delay of every event from its `ts` to a viewer on a and one on b; b minus a."""
    from bus.client import Client

    out: dict[str, list[float]] = {"owner": [], "other": [], "added": []}
    async with Client.connect(Path(a)) as on_a, Client.connect(Path(b)) as on_b:
        async def view(client: Client, sid: str, seen: dict[int, float]) -> None:
            async for event in client.events(sid, 1, stop_at="first"):
                seen[event["seq"]] = time.time() - float(event["ts"])

        async def one() -> None:
            started = await on_a.start("#stream go", host=id_a)
            arrivals: tuple[dict[int, float], dict[int, float]] = ({}, {})
            await asyncio.gather(view(on_a, started.session, arrivals[0]),
                                 view(on_b, started.session, arrivals[1]))
            live = [s for s in arrivals[1] if s > 3]  # (the first were replayed to both)
            out["owner"] += [arrivals[0][s] for s in live]
            out["other"] += [arrivals[1][s] for s in live]
            out["added"] += [arrivals[1][s] - arrivals[0][s] for s in live]

        await asyncio.gather(*(one() for _ in range(sessions)))
    return out


def _figures(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99)}


def run(quick: bool) -> dict[str, Any]:
    """Cancel across hosts and live events on the other host (two hosts, one store): both
    hosts on one machine, then the other host on "another machine" (when namespaces can
    be made here: `bench.netlink.OtherMachine`)."""
    why = pgcluster.unavailable()
    if why:
        raise RuntimeError(f"no PostgreSQL here: {why}")
    out: dict[str, Any] = {"loadavg_start": list(os.getloadavg())}
    out["one machine"] = _measure(quick, other=False)
    why = netlink.unavailable()
    out["two machines"] = {"skipped": why} if why else _measure(quick, other=True)
    out["loadavg_end"] = list(os.getloadavg())
    return out


def _measure(quick: bool, *, other: bool) -> dict[str, Any]:
    """The figures with host b on this machine, or (`other`) on another, where only TCP
    reaches: both then listen on TCP with CURVE, b reaches the store over TCP."""
    from actors.sandbox.workspaces import remove_home

    work = Path(tempfile.mkdtemp(prefix="oploop-bench-hosts-"))
    homes = [tempfile.mkdtemp(prefix=f"oph{n}-", dir="/tmp") for n in "ab"]
    out: dict[str, Any] = {"loadavg_start": list(os.getloadavg())}
    with contextlib.ExitStack() as stack:
        machine = stack.enter_context(netlink.OtherMachine()) if other else None
        cluster = pgcluster.PgCluster.start() if machine is None else \
            pgcluster.PgCluster.start(listen=machine.outer, port=_free_port(machine.outer))
        stack.callback(cluster.stop)
        stack.callback(shutil.rmtree, work, ignore_errors=True)
        for home in homes:
            stack.callback(remove_home, Path(home))
        scenario = work / "scenario.json"
        scenario.write_text(json.dumps({"scripts": SCRIPTS}))
        base = {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}
        envs = [{**base, "OPLOOP_STORE": pgcluster.fresh_schema(cluster)}] * 2
        prefixes: list[list[str]] = [[], []]
        if machine is not None:
            for home, address in zip(homes, (machine.outer, machine.inner), strict=True):
                port = _free_port(address) if address == machine.outer else 7400
                Path(home, "oploop.toml").write_text(
                    f'[network]\nlisten = "tcp://{address}:{port}"\n')
            envs = [{**base, "OPLOOP_STORE": cluster.url},
                    {**base, "OPLOOP_STORE": cluster.tcp_url}]
            prefixes[1] = machine.prefix([homes[0]])
        for home, env, prefix in zip(homes, envs, prefixes, strict=True):
            up = _cli(home, "up", "--detach", env=env, prefix=prefix)
            stack.callback(_cli, home, "down", env={})
            if up.returncode:
                raise RuntimeError(f"host {home}: {up.stderr}")
        a, b = homes
        id_a = (Path(a) / "host-id").read_text().strip()
        rounds, sessions = (10, 2) if quick else (60, 4)
        took = asyncio.run(_cancels(a, b, id_a, rounds))
        out["cancel"] = {k: _figures(v) for k, v in took.items() if k.startswith("via")}
        out["at_once"] = {k: _figures(v) for k, v in took.items() if k.startswith("at once")}
        live = asyncio.run(_live(a, b, id_a, sessions))
        out["live"] = {k: _figures(v) for k, v in live.items()}
        out["live_sessions"] = sessions
    out["loadavg_end"] = list(os.getloadavg())
    return out


def _cli(home: str, *args: str, env: dict[str, str],
         prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    """`oploop ARGS` for `home` (after `prefix`: on the other machine)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    full.update(env, OPLOOP_HOME=home, OPLOOP_HTTP_LISTEN="off", OPLOOP_SANDBOX="scratch")
    return subprocess.run([*(prefix or ()), sys.executable, "-m", "actors.cli", *args],
                          env=full, capture_output=True, text=True, timeout=120, check=False)


def _free_port(address: str) -> int:
    """A port free on `address`, with four free after it (good enough for a bench)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind((address, 0))
            port: int = probe.getsockname()[1]
        if port + 5 < 65535:
            return port
    raise RuntimeError("no free port")


def table(result: dict[str, Any]) -> str:
    """Cancel round trips and live-event delays, the other host beside the owner, with
    the other host on this machine and on another."""
    parts = []
    for where in ("one machine", "two machines"):
        part = result[where]
        if "skipped" in part:
            parts.append(f"{where}: skipped ({part['skipped']})")
            continue
        parts.append(_table(where, part))
    return "\n\n".join(parts)


def _table(where: str, result: dict[str, Any]) -> str:
    c, live, o = result["cancel"], result["live"], result["at_once"]
    ms = lambda v: f"{v * 1e3:.1f} ms"  # noqa: E731
    rows = [
        [f"cancel round trip p50 ({c['via other host']['n']} / {c['via owner']['n']})",
         ms(c["via other host"]["p50"]), ms(c["via owner"]["p50"])],
        ["cancel round trip p99", ms(c["via other host"]["p99"]), ms(c["via owner"]["p99"])],
        [f"event ts -> viewer p50 ({live['other']['n']} events, "
         f"{result['live_sessions']} streams)", ms(live["other"]["p50"]),
         ms(live["owner"]["p50"])],
        ["event ts -> viewer p99", ms(live["other"]["p99"]), ms(live["owner"]["p99"])],
        [f"CANCELLED ts -> viewer p50 ({o['at once: other']['n']} events)",
         ms(o["at once: other"]["p50"]), ms(o["at once: owner"]["p50"])],
        ["CANCELLED ts -> viewer p99", ms(o["at once: other"]["p99"]),
         ms(o["at once: owner"]["p99"])],
        ["added by the other host, per event: p50", ms(live["added"]["p50"]), "-"],
        ["added by the other host, per event: p99", ms(live["added"]["p99"]), "-"],
    ]
    load = " ".join(f"{x:.2f}" for x in result["loadavg_start"])
    end = " ".join(f"{x:.2f}" for x in result["loadavg_end"])
    how = ("local cluster on a unix socket" if where == "one machine" else
           "the other host in its own UTS, mount and network namespaces: TCP + CURVE to "
           "the owner, TCP to the cluster")
    return (text_table([f"two hosts, one store, {where}", "other host", "owner host"], rows)
            + f"\n({how}; load average {load} at start, {end} at end)")
