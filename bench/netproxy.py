"""Network proxy benchmark: what the filtering proxy adds to a request to an allowed host.

From inside the sandbox (a `shell` call running a small HTTP client), each
request on a fresh connection to an HTTP server on the host's loopback:
directly (network "all": the host's namespace) and through the proxy (an
allowlist: the forwarder in the call's namespace, the unix socket, the proxy
process, its connection upstream), plus a CONNECT tunnel and one request in
it. Rounds alternate the two ways, so the machine's noise falls on both alike.
Also the cost of a call itself: `true` with the network "none" and proxied
(bringing up `lo`, the listener and the forwarder thread).

Goal (issue 26): the proxy adds ≤ 2 ms p50 to a request to an allowed host.
`run(quick)` returns the figures; `python -m bench.netproxy [--quick]` prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from actors.allowlist import socket_name
from actors.runtime import read_ready_line
from actors.sandbox import Policy, Sandbox, SandboxConfig, release_all
from actors.sandbox.network import NetAccess, Proxied
from actors.settings import READY_FD_ENV
from actors.tools.process import run_command

GOAL_ADDED_P50_MS = 2.0
PYTHON = "/usr/bin/python3"  # a system Python the sandbox can run
REPO = Path(__file__).resolve().parents[1]

_CLIENT = """
import http.client, socket, sys, time
port, n, via = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
out = []
for i in range(n):
    t0 = time.perf_counter()
    if via == "direct":
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/f")
    elif via == "proxy":
        c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=10)
        c.request("GET", f"http://127.0.0.1:{port}/f")
    else:  # a CONNECT tunnel, then the request in it
        c = http.client.HTTPConnection("127.0.0.1", 3128, timeout=10)
        c.set_tunnel("127.0.0.1", port)
        c.request("GET", "/f")
    body = c.getresponse().read()
    c.close()
    assert body == b"x" * 512, body[:200]
    out.append((time.perf_counter() - t0) * 1000)
print(" ".join(f"{t:.3f}" for t in out))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(argv: list[str], env: dict[str, str], ready: bool) -> subprocess.Popen[bytes]:
    if not ready:
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    rfd, wfd = os.pipe()
    proc = subprocess.Popen(argv, env={**env, READY_FD_ENV: str(wfd)}, pass_fds=(wfd,))
    os.close(wfd)
    try:
        if read_ready_line(rfd) != b"ready\n":
            raise RuntimeError(f"{argv} did not become ready")
    finally:
        os.close(rfd)
    return proc


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _summary(samples: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(samples), 3), "p99": round(_pct(samples, 0.99), 3),
            "n": len(samples)}


async def _client(sandbox: Sandbox, cwd: Path, port: int, n: int, via: str,
                  net: NetAccess) -> list[float]:
    res = await run_command(f"{PYTHON} -I -S client.py {port} {n} {via}", cwd, timeout_s=60,
                            cap=1 << 16, spawn=sandbox.spawner("shell", Policy(), net=net))
    if res.returncode != 0:
        raise RuntimeError(f"{via}: {res.refused or res.output[-500:]}")
    return [float(t) for t in res.output.split()]


async def _call(sandbox: Sandbox, cwd: Path, net: NetAccess) -> float:
    t0 = time.perf_counter()
    res = await run_command("true", cwd, timeout_s=30, cap=1024,
                            spawn=sandbox.spawner("shell", Policy(), net=net))
    if res.returncode != 0:
        raise RuntimeError(res.refused or res.output)
    return (time.perf_counter() - t0) * 1000


async def _measure(sandbox: Sandbox, cwd: Path, port: int, net: Proxied,
                   quick: bool) -> dict[str, Any]:
    rounds, per = (4, 25) if quick else (10, 50)
    samples: dict[str, list[float]] = {"direct": [], "proxy": [], "connect": []}
    ways: dict[str, NetAccess] = {"direct": "all", "proxy": net, "connect": net}
    for via in samples:  # warm: the fork server, the proxy's first upstream connection
        await _client(sandbox, cwd, port, 3, via, ways[via])
    for _ in range(rounds):
        for via in samples:
            samples[via] += await _client(sandbox, cwd, port, per, via, ways[via])
    calls: dict[str, list[float]] = {"none": [], "proxied": []}
    for _ in range(rounds * 3):
        calls["none"].append(await _call(sandbox, cwd, "none"))
        calls["proxied"].append(await _call(sandbox, cwd, net))
    requests = {via: _summary(ts) for via, ts in samples.items()}
    added = round(requests["proxy"]["p50"] - requests["direct"]["p50"], 3)
    return {
        "requests_ms": requests,
        "calls_ms": {k: _summary(v) for k, v in calls.items()},
        "goals": {"added_p50_ms": added, "goal_ms": GOAL_ADDED_P50_MS,
                  "met": added <= GOAL_ADDED_P50_MS},
    }


def run(quick: bool) -> dict[str, Any]:
    """Measure and return the figures (milliseconds); `quick` takes fewer samples."""
    home = Path(tempfile.mkdtemp(prefix="opbn-", dir="/tmp"))
    os.chmod(home, 0o711)
    procs: list[subprocess.Popen[bytes]] = []
    sandbox = Sandbox(SandboxConfig(), home / "workspaces", hide=(home,))
    try:
        files = home / "files"
        files.mkdir()
        (files / "f").write_bytes(b"x" * 512)
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPLOOP_")}
        procs.append(_start([sys.executable, "-m", "http.server", "--bind", "127.0.0.1",
                             "--directory", str(files), str(port)], env, ready=False))
        _wait_listening(port)
        (home / "oploop.toml").write_text(f'[agents.bench]\nnetwork = ["127.0.0.1:{port}"]\n')
        (home / "run").mkdir(mode=0o700)
        procs.append(_start([sys.executable, "-m", "actors.netproxy"],
                            {**env, "OPLOOP_HOME": str(home), "PYTHONPATH": str(REPO)},
                            ready=True))
        sandbox.start()
        cwd = sandbox.workspace("bench")
        script = cwd / "client.py"
        script.write_text(_CLIENT)
        os.chmod(script, 0o644)
        net = Proxied(str(home / "run" / "net"), socket_name("agent", "bench"))
        load_before = os.getloadavg()[0]
        result = asyncio.run(_measure(sandbox, cwd, port, net, quick))
        result["machine"] = {"cpus": os.cpu_count(), "load_1m_before": round(load_before, 2),
                             "load_1m_after": round(os.getloadavg()[0], 2)}
        return result
    finally:
        sandbox.close()
        for proc in procs:
            proc.kill()
            proc.wait()
        release_all(home)
        shutil.rmtree(home, ignore_errors=True)


def table(result: dict[str, Any]) -> str:
    """The figures of `run` as a printable table."""
    m = result["machine"]
    lines = [f"network proxy benchmark — {m['cpus']} cpus, load(1m) {m['load_1m_before']} → "
             f"{m['load_1m_after']}", "",
             f"{'one request, fresh connection, from the sandbox':48} {'p50 ms':>8} {'p99 ms':>8}"]
    names = {"direct": "direct (network \"all\")", "proxy": "through the proxy (http://)",
             "connect": "CONNECT tunnel + request in it"}
    for via, s in result["requests_ms"].items():
        lines.append(f"{names[via]:48} {s['p50']:8.3f} {s['p99']:8.3f}")
    lines += ["", f"{'a call of `true`':48} {'p50 ms':>8} {'p99 ms':>8}"]
    for net, s in result["calls_ms"].items():
        lines.append(f"{'network ' + net:48} {s['p50']:8.3f} {s['p99']:8.3f}")
    g = result["goals"]
    lines += ["", f"the proxy adds {g['added_p50_ms']:.3f} ms p50 to a request (goal ≤ "
                  f"{g['goal_ms']:g}): {'met' if g['met'] else 'NOT met'}"]
    return "\n".join(lines)


def main() -> None:
    """`python -m bench.netproxy [--quick]`: measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    print(table(run(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
