"""Worker machines (issue 20): a host in a hub network namespace, `oploop worker`
machines in namespaces of their own (`bench.netlink`), over TCP + CURVE.

- turns/s: 6 sessions at once, 10 `read_file` turns each (of /etc/os-release) (the scripted model in
  the host's llm caller), aimed round-robin at executors on 1, 2 and 3 machines;
  and the per-turn p50 of one session aimed at a machine against one on the
  host's own executor (the cost of the TCP + CURVE hop).
- link cut: a `shell` call sleeping on machine B, B's link taken down (`ip link
  set down`): seconds from the cut to the call's `TOOL_END` "machine B lost"
  (goal: within 3 heartbeats, <= 3.5 s); B is let back in between samples.
- 20 ms added latency: machine L reaches the host through `bench.delayrelay`, which
  holds every chunk 10 ms each way (the round trip +20 ms; this kernel has no
  sch_netem for `tc netem`): its per-turn p50 against B's (the overhead a turn pays
  on such a link), and, during a tool on L, a UI cancel to `CANCELLED` and to the
  tool's process gone (p50, p99).
Each figure the median of several runs; the load average is in the report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from bench.host import SCRIPT_TURNS, BenchHost
from bench.netlink import Lab, netem_unavailable, unavailable
from bench.stats import median, ms
from bench.stats import table as text_table
from bus.client import Client

PORT = 7600
#: Where machine L's relay listens (in the hub), and what it adds each way.
RELAY_PORT = 7700
ONE_WAY_MS = 10
CANCELS = 20
TURNS = 10
SESSIONS = 6
MARK = "oploop-bench-cut"
READ = "/etc/os-release"


class HubHost(BenchHost):
    """A `BenchHost` in the lab's hub namespace, listening on TCP + CURVE."""

    def __init__(self, lab: Lab) -> None:
        # The offline model (its scenarios pick a script by a prompt's #tag, which the
        # in-process scripted one does not): read_file every turn, or (#cut) one long
        # shell call then an answer.
        super().__init__(listen=f"tcp://0.0.0.0:{PORT}", executors=1, backend="offline")
        self.lab = lab
        self.env["OPLOOP_HTTP_LISTEN"] = "off"  # no gateway: one process less to share
        # A system file every machine's confined reader may read (the bench's own
        # directory is under /tmp, private to each call's sandbox).
        call = {"type": "tool_use", "name": "read_file", "input": {"path": READ}}
        cut = [{"reply": [{"type": "tool_use", "name": "shell",
                           "input": {"command": f"sleep 300; echo {MARK}"}}]},
               {"reply": "the machine went away"}]
        self.script.write_text(json.dumps({"turns": [{"reply": [call]}] * SCRIPT_TURNS,
                                           "scripts": {"cut": cut}}))
        self.env["OPLOOP_OFFLINE_SCENARIO"] = str(self.script)

    def oploop(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.lab.in_ns(self.lab.hub), sys.executable, "-m",
                               "actors.cli", *args], env=self.env, capture_output=True,
                              text=True, timeout=120, check=False)


class BenchMachine:
    """`oploop worker` for machine `name` (one executor), apart from the bench."""

    def __init__(self, lab: Lab, host: HubHost, name: str, port: int = PORT) -> None:
        machine = lab.machines[name]
        # Apart from the host's directory: its sandbox hides its own home from tools.
        self.home = Path(tempfile.mkdtemp(prefix=f"oploop-bench-{name}-"))
        keys = host.home / "keys" / "issued" / name
        issued = host.oploop("keys", "add", name, "--role", "worker")
        if issued.returncode != 0:
            raise RuntimeError(f"oploop keys add: {issued.stderr}")
        env = {k: v for k, v in host.env.items() if not k.startswith("OPLOOP_")}
        env.update(OPLOOP_HOME=str(self.home), LOG=str(self.home / "command.log"))
        started = subprocess.run(
            ["sh", "-c", 'setsid "$@" >>"$LOG" 2>&1 </dev/null & echo $!', "sh",
             *lab.in_ns(machine.ns), sys.executable, "-m", "actors.cli", "worker",
             "--connect", f"tcp://{machine.hub_address}:{port}", "--keys", str(keys),
             "--machine", name], env=env, capture_output=True, text=True, check=True)
        self.proc = psutil.Process(int(started.stdout.split()[0]))

    def stop(self) -> None:
        group = [self.proc, *self.proc.children(recursive=True)]
        with contextlib.suppress(psutil.Error):
            self.proc.terminate()
        _, alive = psutil.wait_procs(group, timeout=20)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()


async def _machine_up(client: Client, name: str, within_s: float = 120) -> None:
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        found = {m["name"]: m for m in (await client.stats())["machines"]}.get(name)
        if found and found["state"] == "up" and found["workers"].get("tool"):
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"machine {name} never came up")


async def _session(client: Client, cwd: str, machine: str, turns: int) -> list[dict[str, Any]]:
    started = await client.start("read the file, again and again", max_turns=turns,
                                 cwd=cwd, machine=machine, timeout=60)
    return [e async for e in client.events(started.session, stop_at="first")]


async def _throughput(client: Client, cwd: str, names: list[str]) -> float:
    """Turns/s of SESSIONS sessions at once, aimed round-robin at `names`."""
    t0 = time.perf_counter()
    runs = await asyncio.gather(*(_session(client, cwd, names[i % len(names)], TURNS)
                                  for i in range(SESSIONS)))
    elapsed = time.perf_counter() - t0
    ends = [e for events in runs for e in events if e["type"] == "TOOL_END"]
    failed = [e["data"]["output"] for e in ends if e["data"]["is_error"]]
    if failed:  # a figure of failing calls would not be one of turns
        raise RuntimeError(f"{len(failed)} tool call(s) failed, e.g. {failed[0]}")
    return len(ends) / elapsed


def _turn_p50(events: list[dict[str, Any]]) -> float:
    starts = [e["ts"] for e in events if e["type"] == "TURN_START"]
    return median(b - a for a, b in zip(starts, starts[1:], strict=False))


async def _cut_sample(client: Client, lab: Lab, cwd: str) -> float:
    """Seconds from cutting B's link under a running tool to that call's error."""
    started = await client.start("#cut sleep on B", cwd=cwd, machine="B", timeout=60)
    cut_at = 0.0
    lost_after = float("nan")
    try:
        async for event in client.events(started.session, stop_at="first"):
            if event["type"] == "TOOL_START":
                end = time.monotonic() + 60
                while not _running(MARK):
                    if time.monotonic() > end:
                        raise RuntimeError("the tool never ran on B")
                    await asyncio.sleep(0.02)
                cut_at = time.monotonic()
                lab.cut("B")
            elif event["type"] == "TOOL_END":
                lost_after = time.monotonic() - cut_at
                if not str(event["data"]["output"]).startswith("machine B lost"):
                    raise RuntimeError(f"unexpected end: {event['data']}")
    finally:
        lab.restore("B")
    await _machine_up(client, "B")
    end = time.monotonic() + 60
    # B stops it too (3 silent beats): a process to poll for, no event to wait on.
    while _running(MARK) and time.monotonic() < end:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return lost_after


class Relay:
    """`bench.delayrelay` in the hub: RELAY_PORT.. -> the host's PORT.., delayed."""

    def __init__(self, lab: Lab) -> None:
        self.proc = subprocess.Popen(
            [*lab.in_ns(lab.hub), sys.executable, "-m", "bench.delayrelay", "0.0.0.0",
             str(RELAY_PORT), "127.0.0.1", str(PORT), "5", str(ONE_WAY_MS)],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError("the delay relay did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def _cancel_sample(client: Client, cwd: str, machine: str) -> tuple[float, float]:
    """Seconds from a UI cancel during a tool on `machine` to `CANCELLED`, and to the
    tool's process gone."""
    started = await client.start("#cut sleep there", cwd=cwd, machine=machine, timeout=60)
    sent = 0.0
    cancelled = float("nan")
    async for event in client.events(started.session, stop_at="first"):
        if event["type"] == "TOOL_START":
            end = time.monotonic() + 60
            while not _running(MARK):  # noqa: ASYNC110 (a process to poll for)
                if time.monotonic() > end:
                    raise RuntimeError(f"the tool never ran on {machine}")
                await asyncio.sleep(0.005)
            sent = time.monotonic()
            await client.cancel(started.session)
        elif event["type"] == "CANCELLED":
            cancelled = time.monotonic() - sent
    end = time.monotonic() + 60
    while _running(MARK) and time.monotonic() < end:  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    return cancelled, time.monotonic() - sent


def _running(mark: str) -> bool:
    return any(mark in " ".join(p.info["cmdline"] or ())
               for p in psutil.process_iter(["cmdline"]))


async def _measure(host: HubHost, lab: Lab, quick: bool) -> dict[str, Any]:
    rounds = 2 if quick else 5
    cwd = str(host.dir)
    out: dict[str, Any] = {}
    async with Client.connect(host.home) as client:
        for name in ("B", "C", "D"):
            await _machine_up(client, name)
        await _throughput(client, cwd, ["B"])  # warm: sandboxes, readers
        for n in (1, 2, 3):
            names = ["B", "C", "D"][:n]
            out[f"turns_per_s_{n}_machines"] = median(
                [await _throughput(client, cwd, names) for _ in range(rounds)])
        local = [_turn_p50(await _session(client, cwd, "", 20)) for _ in range(rounds)]
        remote = [_turn_p50(await _session(client, cwd, "B", 20)) for _ in range(rounds)]
        out["turn_p50_local_s"], out["turn_p50_machine_s"] = median(local), median(remote)
        await _machine_up(client, "L")
        slow = [_turn_p50(await _session(client, cwd, "L", 20)) for _ in range(rounds)]
        out["turn_p50_latency_s"] = median(slow)
        samples = [await _cancel_sample(client, cwd, "L") for _ in range(CANCELS)]
        out["latency_cancel_to_event_s"] = sorted(c for c, _ in samples)
        out["latency_cancel_to_gone_s"] = sorted(g for _, g in samples)
        cuts = [await _cut_sample(client, lab, cwd) for _ in range(3 if quick else 5)]
        out["cut_to_error_s"] = median(cuts)
        out["cut_to_error_max_s"] = max(cuts)
        out["cut_samples_s"] = cuts
    return out


def run(quick: bool) -> dict[str, Any]:
    """The figures above; a stated reason instead where namespaces are missing."""
    why = unavailable()
    if why is not None:
        return {"skipped": why}
    netem = netem_unavailable()
    load = list(Path("/proc/loadavg").read_text().split()[:3])
    with Lab() as lab:
        for name in ("B", "C", "D", "L"):
            lab.add_machine(name)
        with HubHost(lab) as host:
            relay = Relay(lab)
            machines = [BenchMachine(lab, host, name) for name in ("B", "C", "D")]
            machines.append(BenchMachine(lab, host, "L", port=RELAY_PORT))
            try:
                result = asyncio.run(_measure(host, lab, quick))
            finally:
                for machine in machines:
                    machine.stop()
                relay.stop()
                from actors.sandbox.workspaces import remove_home
                for machine in machines:
                    remove_home(machine.home)
    result["netem"] = netem or "available (measured with the relay all the same)"
    result["load_at_start"] = load
    result["load_at_end"] = list(Path("/proc/loadavg").read_text().split()[:3])
    return result


def table(result: dict[str, Any]) -> str:
    """Turns/s by machines, per-turn p50 local vs a machine, cut-to-error."""
    if "skipped" in result:
        return f"skipped: {result['skipped']}"
    rows = [[f"executors on {n} machine(s), {SESSIONS} sessions x {TURNS} turns",
             f"{result[f'turns_per_s_{n}_machines']:.1f} turns/s"] for n in (1, 2, 3)]
    rows += [["turn p50, the host's own executor", ms(result["turn_p50_local_s"])],
             ["turn p50, an executor on machine B (TCP + CURVE)",
              ms(result["turn_p50_machine_s"])],
             ["link cut -> 'machine B lost' (median; max)",
              f"{result['cut_to_error_s']:.2f} s; {result['cut_to_error_max_s']:.2f} s "
              "(goal <= 3.5 s)"],
             ["turn p50, machine L: round trip +20 ms (relay)",
              f"{ms(result['turn_p50_latency_s'])} "
              f"(+{ms(result['turn_p50_latency_s'] - result['turn_p50_machine_s'])} on B's)"],
             ["L: UI cancel -> CANCELLED, p50 / max of 20",
              f"{ms(median(result['latency_cancel_to_event_s']))} / "
              f"{ms(result['latency_cancel_to_event_s'][-1])}"],
             ["L: UI cancel -> its tool process gone, p50 / max",
              f"{ms(median(result['latency_cancel_to_gone_s']))} / "
              f"{ms(result['latency_cancel_to_gone_s'][-1])}"],
             ["tc netem", result["netem"]],
             ["load average at start / end",
              f"{' '.join(result['load_at_start'])} / {' '.join(result['load_at_end'])}"]]
    return text_table(["machines", "figure"], rows)
