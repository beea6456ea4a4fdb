"""The floor: what oploop's own bus layer costs, so every other figure reads as a
multiple of it.

Two processes, as in a host: an echo server (a `Reactor` with a ROUTER that
sends every envelope back) and this process (a `Reactor` with a DEALER).
Measured: the round trip of one small envelope at a time (p50/p99), the
throughput of a stream of envelopes echoed back (msg/s, one way counted),
and the codec alone (encode + decode of a ~1 KB envelope, in process).
Raw pyzmq (blocking REQ/REP, no codec, no asyncio) is given beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil
import zmq

from bench.stats import median, percentile, summarize, us
from bench.stats import table as text_table
from bus.codec import decode, encode
from bus.messages import Envelope, Event
from bus.sockets import Reactor


def _serve(address: str) -> None:
    """The echo side (run as `python -m bench.floor ADDRESS`)."""
    import uvloop

    async def main() -> None:
        reactor = Reactor()
        port = None

        def echo(peer: bytes | None, env: Envelope, frame: bytes) -> None:
            assert port is not None
            port.send_frame(frame, peer)

        port = reactor.add(zmq.ROUTER, "echo", echo, bind=address)
        print("ready", flush=True)
        await reactor.run()

    uvloop.run(main())


def _raw_serve(address: str) -> None:
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.REP)
    sock.bind(address)
    print("ready", flush=True)
    while True:
        sock.send(sock.recv())


def _event(size: int) -> Envelope:
    return Envelope(Event(1, "TOKEN", 1, time.time(), {"text": "x" * size}), sid="s")


async def _reactor_figures(address: str, server_pid: int, quick: bool) -> dict[str, float]:
    reactor = Reactor()
    got: asyncio.Queue[None] = asyncio.Queue()
    counter = [0]
    done = asyncio.Event()
    target = [0]

    def on_reply(peer: bytes | None, env: Envelope, frame: bytes) -> None:
        counter[0] += 1
        if target[0]:
            if counter[0] >= target[0]:
                done.set()
        else:
            got.put_nowait(None)

    port = reactor.add(zmq.DEALER, "client", on_reply, connect=address)
    task = asyncio.create_task(reactor.run())
    me, peer = psutil.Process(), psutil.Process(server_pid)
    try:
        small = _event(16)
        rtts = []
        rounds = 200 if quick else 2000
        cpu0 = _cpu(me) + _cpu(peer)
        for i in range(rounds):
            t0 = time.perf_counter()
            port.send(small)
            await got.get()
            if i >= 20:
                rtts.append(time.perf_counter() - t0)
        rtt_cpu = (_cpu(me) + _cpu(peer) - cpu0) / rounds
        n = 20_000 if quick else 100_000
        counter[0] = 0
        target[0] = n
        frame = encode(small)
        cpu0 = _cpu(me) + _cpu(peer)
        t0 = time.perf_counter()
        sent = 0
        while sent < n:
            # a window below the HWM (10,000): a full queue would refuse the send
            while sent < n and sent - counter[0] < 4000:
                port.send_frame(frame)
                sent += 1
            await asyncio.sleep(0)
        await asyncio.wait_for(done.wait(), 60)
        rate = n / (time.perf_counter() - t0)
        echo_cpu = (_cpu(me) + _cpu(peer) - cpu0) / n
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        reactor.close()
    return {"rtt_p50_s": median(rtts), "rtt_p99_s": percentile(rtts, 99), "echo_msg_s": rate,
            "rtt_cpu_s": rtt_cpu, "echo_cpu_s": echo_cpu}


def _cpu(proc: psutil.Process) -> float:
    """CPU seconds a process has used: robust to a noisy machine, unlike wall time."""
    t = proc.cpu_times()
    return float(t.user + t.system)


def _raw_rtt(address: str, quick: bool) -> float:
    sock = zmq.Context.instance().socket(zmq.REQ)
    sock.connect(address)
    rtts = []
    for i in range(200 if quick else 2000):
        t0 = time.perf_counter()
        sock.send(b"x" * 64)
        sock.recv()
        if i >= 20:
            rtts.append(time.perf_counter() - t0)
    sock.close(linger=0)
    return median(rtts)


def _codec_s() -> float:
    env = _event(1000)
    n = 20_000
    t0 = time.perf_counter()
    for _ in range(n):
        decode(encode(env))
    return (time.perf_counter() - t0) / n


def _server(mode: str, address: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "bench.floor", mode, address],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc


def _once(quick: bool) -> dict[str, float]:
    import uvloop

    with tempfile.TemporaryDirectory(prefix="oploop-floor-") as tmp:
        out: dict[str, float] = {}
        address = f"ipc://{tmp}/echo.sock"
        server = _server("reactor", address)
        try:
            out.update(uvloop.run(_reactor_figures(address, server.pid, quick)))
        finally:
            server.kill()
            server.wait()
        raw_address = f"ipc://{tmp}/raw.sock"
        server = _server("raw", raw_address)
        try:
            out["raw_zmq_rtt_p50_s"] = _raw_rtt(raw_address, quick)
        finally:
            server.kill()
            server.wait()
    out["codec_1k_s"] = _codec_s()
    return out


def run(quick: bool) -> dict[str, Any]:
    """Median figures of the floor over several runs."""
    return summarize([_once(quick) for _ in range(3 if quick else 5)])


def table(result: dict[str, Any]) -> str:
    """The floor as a table."""
    rows = [
        ["bus round trip p50 (Reactor + codec, ipc)", us(result["rtt_p50_s"])],
        ["bus round trip p99", us(result["rtt_p99_s"])],
        ["bus round trip, CPU of both processes", us(result["rtt_cpu_s"])],
        ["bus echo throughput", f"{result['echo_msg_s']:,.0f} msg/s"],
        ["bus echo, CPU per message echoed", us(result["echo_cpu_s"])],
        ["raw pyzmq REQ/REP round trip p50", us(result["raw_zmq_rtt_p50_s"])],
        ["codec encode+decode, 1 KB event", us(result["codec_1k_s"])],
    ]
    return text_table(["the floor", "median"], rows)


if __name__ == "__main__":
    if sys.argv[1] == "reactor":
        _serve(sys.argv[2])
    else:
        _raw_serve(sys.argv[2])
