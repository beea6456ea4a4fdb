"""Web benchmark: the gateway's SSE fan-out, its RSS, and the /metrics scrape.

1. **SSE fan-out.** A real broadcaster and a real gateway process (no supervisor: the
   synthetic producer of `bench.fanout` plays it, pushing sequenced `TOKEN` events
   made from 20k deltas/s through the llm caller's `DeltaBatcher` straight into the
   broadcaster's ingest). 16 SSE clients (aiohttp, in one client process) follow the
   session through `GET /api/sessions/{id}/events`; each reports events lost (the
   log's events it never got: goal 0) and the latency from the push to its receipt
   (p50/p99: goal p99 <= 50 ms). The gateway's RSS idle and after the run.
2. **Scrape.** A real host (scripted model) with N finished sessions; the median time
   of `GET /metrics` over 20 scrapes (goal <= 50 ms at 1,000 sessions).
3. **Page.** A finished session of 10,000 events (one TOKEN per delta) opened in
   headless Chromium: the time until its terminal event is rendered, and the longest
   gap between two animation frames meanwhile (skipped without chromium/playwright).

    python -m bench.web [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from actors.sandbox.workspaces import remove_home
from bench.fanout import _pct, _produce

CLIENTS = 16
SID = "benchweb0001"


def _auth(home: Path) -> dict[str, str]:
    return {"Authorization": f"Bearer {(home / 'web.token').read_text().strip()}"}


async def _follow(url: str, auth: dict[str, str], out: dict[str, Any]) -> None:
    """One SSE client: every event of the session to its terminal one."""
    import aiohttp

    lat: list[float] = []
    seqs: list[int] = []
    async with aiohttp.ClientSession(headers=auth) as http, http.get(
            f"{url}api/sessions/{SID}/events", params={"stop_at": "last"},
            timeout=aiohttp.ClientTimeout(total=None, sock_read=60)) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode()
            if line.startswith("data: "):
                now = time.time()
                ev = json.loads(line[6:])
                seqs.append(ev["seq"])
                if ev["type"] == "TOKEN":
                    lat.append(now - ev["ts"])
    out["seqs"] = seqs
    out["lat"] = lat


def _gateway_rss(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


async def _wait_url(home: Path, proc: subprocess.Popen[bytes]) -> str:
    url_file = home / "run" / "web.url"
    for _ in range(1500):
        if url_file.exists():
            return url_file.read_text().strip()
        if proc.poll() is not None:
            raise RuntimeError("the gateway exited")
        await asyncio.sleep(0.02)
    raise RuntimeError("the gateway did not write its url")


async def _wait_viewers(home: str, n: int) -> None:
    from bus.client import Client

    async with Client.connect(Path(home)) as client, asyncio.timeout(60):
        # another process's counter: nothing to wait on but a poll
        while (await client.broadcaster_stats(timeout=30))["viewers"] < n:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


def fanout(seconds: float) -> dict[str, Any]:
    """16 SSE clients on one session at 20k deltas/s through a real gateway."""
    home = Path(tempfile.mkdtemp(prefix="opbw-", dir="/tmp"))
    env = {**os.environ, "OPLOOP_HOME": str(home), "OPLOOP_HTTP_LISTEN": "127.0.0.1:0"}
    env.pop("OPLOOP_PARENT_PID", None)
    from bus.endpoints import Endpoints

    Endpoints.for_home(home).prepare()
    broadcaster = subprocess.Popen([sys.executable, "-m", "actors.broadcaster"], env=env)
    gateway = subprocess.Popen([sys.executable, "-m", "actors.gateway"], env=env)
    try:
        async def main() -> dict[str, Any]:
            url = await _wait_url(home, gateway)
            await asyncio.sleep(1.0)  # let it settle before reading its idle RSS
            idle = _gateway_rss(gateway.pid)
            # The session exists for the gateway once the broadcaster has an event of it.
            import zmq

            from bus.codec import encode
            from bus.messages import Envelope, Event

            ctx: zmq.Context[Any] = zmq.Context()
            push = ctx.socket(zmq.PUSH)
            push.connect(Endpoints.for_home(home).address("ingest"))
            push.send(encode(Envelope(Event(1, "SESSION_START", 0, time.time(), {}), sid=SID)))
            push.close(linger=-1)
            ctx.term()
            from bus.client import Client

            async with Client.connect(home) as client:
                while await client.last_seq(SID) is None:  # noqa: ASYNC110 (a poll, as above)
                    await asyncio.sleep(0.02)
            outs: list[dict[str, Any]] = [{} for _ in range(CLIENTS)]
            tasks = [asyncio.create_task(_follow(url, _auth(home), o)) for o in outs]
            await _wait_viewers(str(home), CLIENTS + 1)  # + the gateway's metrics stream
            # `_produce` numbers from 1 again: the first event is sent once more, by it.
            last_seq = await asyncio.to_thread(
                lambda: asyncio.run(_produce(str(home), SID, seconds, 20.0, lambda: None)))
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
            busy = _gateway_rss(gateway.pid)
            return {"outs": outs, "last_seq": last_seq, "idle_rss_mb": idle,
                    "rss_after_mb": busy}

        res = asyncio.run(main())
    finally:
        for p in (gateway, broadcaster):
            p.send_signal(signal.SIGTERM)
            p.wait(10)
        remove_home(home)
    outs, last_seq = res["outs"], res["last_seq"]
    lat = [x for o in outs for x in o["lat"]]
    lost = sum(len(set(range(1, last_seq + 1)) - set(o["seqs"])) for o in outs)
    dups = sum(len(o["seqs"]) - len(set(o["seqs"])) for o in outs)
    return {"clients": CLIENTS, "seconds": seconds, "events": last_seq, "lost": lost,
            "duplicates": dups, "p50_ms": _pct(lat, 0.5), "p99_ms": _pct(lat, 0.99),
            "gateway_idle_rss_mb": res["idle_rss_mb"],
            "gateway_rss_after_mb": res["rss_after_mb"]}


def scrape(sessions: int) -> dict[str, Any]:
    """The median time of GET /metrics on a host holding `sessions` finished sessions."""
    from bench.host import BenchHost

    host = BenchHost()
    host.env["OPLOOP_HTTP_LISTEN"] = "127.0.0.1:0"
    with host:
        async def main() -> dict[str, Any]:
            import aiohttp

            from bus.client import Client

            async with Client.connect(host.home) as client:
                for i in range(0, sessions, 50):
                    runs = [await client.start("go", max_turns=1)
                            for _ in range(min(50, sessions - i))]
                    for r in runs:
                        async for _ in client.events(r.session, r.from_seq, stop_at="first"):
                            pass
            url = (host.home / "run" / "web.url").read_text().strip()
            times = []
            async with aiohttp.ClientSession(headers=_auth(host.home)) as http:
                for _ in range(21):
                    t = time.perf_counter()
                    async with http.get(f"{url}metrics") as resp:
                        body = await resp.read()
                    times.append(time.perf_counter() - t)
            return {"sessions": sessions, "scrape_ms": statistics.median(times[1:]) * 1000,
                    "bytes": len(body)}

        return asyncio.run(main())


#: Records the longest gap between two animation frames (the page's responsiveness).
FRAME_GAPS = """
window.__maxGap = 0;
(function tick(last) {
  requestAnimationFrame((now) => {
    if (last) window.__maxGap = Math.max(window.__maxGap, now - last);
    tick(now);
  });
})(0);
"""


def page(words: int) -> dict[str, Any]:
    """Open a finished session of `words` + a few events (one TOKEN event per delta) in
    headless Chromium: the time to render it all, and the longest frame gap meanwhile."""
    import shutil

    chromium = shutil.which("chromium")
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        return {"skipped": "playwright is not installed"}
    if chromium is None:
        return {"skipped": "no chromium binary"}
    from bench.host import BenchHost

    host = BenchHost(backend="offline")
    scenario = host.dir / "scenario.json"
    text = " ".join(f"w{i}" for i in range(words))
    scenario.write_text(json.dumps({"scripts": {"big": [{"reply": text, "delay_s": 0}]}}))
    host.env.update(OPLOOP_HTTP_LISTEN="127.0.0.1:0", OPLOOP_TOKEN_BATCH_MS="0",
                    OPLOOP_OFFLINE_SCENARIO=str(scenario))
    with host:
        async def main() -> dict[str, Any]:
            from bus.client import Client

            async with Client.connect(host.home) as client:
                started = await client.start("#big")
                events = [e async for e in client.events(started.session, stop_at="first")]
            url = (host.home / "run" / "web.url").read_text().strip()
            async with async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=chromium,
                                                   args=["--no-sandbox", "--disable-gpu"])
                try:
                    tab = await browser.new_page()
                    await tab.add_init_script(FRAME_GAPS)
                    t0 = time.perf_counter()
                    token = (host.home / "web.token").read_text().strip()
                    await tab.goto(f"{url}s/{started.session}?token={token}")
                    await tab.wait_for_selector(".terminal.DONE", timeout=120_000)
                    render_s = time.perf_counter() - t0
                    gap = await tab.evaluate("window.__maxGap")
                finally:
                    await browser.close()
            return {"events": len(events), "render_s": render_s, "max_frame_gap_ms": gap}

        return asyncio.run(main())


def run(quick: bool) -> dict[str, Any]:
    """The web section (`quick`: a 2 s stream and 100 sessions)."""
    out = {"sse": fanout(2.0 if quick else 10.0),
           "scrape": scrape(100 if quick else 1000),
           "page": page(2_000 if quick else 10_000), "load": os.getloadavg()}
    out["table"] = table(out)
    return out


def table(result: dict[str, Any]) -> str:
    """The section's lines."""
    s, m = result["sse"], result["scrape"]
    load = " ".join(f"{x:.1f}" for x in result["load"])
    return "\n".join([
        f"web (load {load})",
        f"  SSE: {s['clients']} clients, 20k deltas/s for {s['seconds']:g} s, "
        f"{s['events']} events: lost {s['lost']}, duplicates {s['duplicates']}, "
        f"push->client p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms (goal <= 50)",
        f"  gateway RSS: {s['gateway_idle_rss_mb']:.1f} MB idle, "
        f"{s['gateway_rss_after_mb']:.1f} MB after the stream",
        f"  /metrics with {m['sessions']} sessions: {m['scrape_ms']:.1f} ms median "
        f"({m['bytes']} bytes; goal <= 50 ms at 1,000)",
        _page_line(result["page"]),
    ])


def _page_line(p: dict[str, Any]) -> str:
    if "skipped" in p:
        return f"  page: skipped ({p['skipped']})"
    return (f"  page: a session of {p['events']} events rendered in {p['render_s']:.2f} s "
            f"(headless Chromium), longest frame gap {p['max_frame_gap_ms']:.0f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    print(run(parser.parse_args().quick)["table"])
