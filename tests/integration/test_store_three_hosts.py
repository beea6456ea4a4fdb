"""Three hosts on one PostgreSQL store, 300 sessions, one host killed (-9, mid-tool).

Host A runs 100 sessions that each call a long tool (32 at once: one executor's
slots; the rest wait for a slot); B and C run 100 short ones each. A is killed
while its tools run; B and C claim its sessions (`FOR UPDATE SKIP LOCKED`: each
taken by one of them) and resume them. Then every session has exactly one run, one
terminal event (`DONE`), at most one `RESUMED`, no tool run twice; and what a viewer
sees of it on its owner (a viewer subscribed once the claims are made: replay, then
live) is the store's log event for event, as is what a viewer of every surviving host
sees of every session once they ended.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import psutil
import psycopg
import pytest
from homes import make_home, remove_home
from hostkit import assert_one_run, of_type, running_host, unique_mark, until
from test_failover import kill_host

from bus.client import Client, event_dict
from bus.codec import decode

pytestmark = pytest.mark.timeout(600)

PER_HOST = 100
MARK = unique_mark()
OK = {"reply": "carried on", "stop_reason": "end_turn"}
TOOL = {"reply": [{"type": "tool_use", "name": "shell",
                   "input": {"command": f"exec sleep {MARK}0"}}]}


def marked() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if any(MARK in part for part in p.info["cmdline"] or ())]


@pytest.fixture
def homes(pg_url, tmp_path):
    """Three homes on the store. A's model asks for the tool; B's and C's answer a
    resumed turn (and their own `#quick` sessions) at once."""
    made, envs = [], []
    for name, scripts in (("a", {"tool": [TOOL, OK]}),
                          ("b", {"tool": [OK], "quick": [OK]}),
                          ("c", {"tool": [OK], "quick": [OK]})):
        scenario = tmp_path / f"scenario-{name}.json"
        scenario.write_text(json.dumps({"scripts": scripts}))
        made.append(make_home(f"op3{name}-"))
        envs.append({"OPLOOP_STORE": pg_url, "OPLOOP_OFFLINE_SCENARIO": str(scenario)})
    yield made, envs
    for home in made:
        remove_home(Path(home))


async def start(home: str, prompt: str, n: int, cwd: Path) -> list[str]:
    """`n` sessions on `home`'s host (named: else new sessions go to the least loaded)."""
    here = (Path(home) / "host-id").read_text().strip()
    async with Client.connect(Path(home)) as client:
        runs = await asyncio.gather(*(client.start(prompt, cwd=str(cwd), timeout=120,
                                                   host=here) for _ in range(n)))
    return [r.session for r in runs]


async def streams(home: str, sids: list[str]) -> dict[str, list[dict]]:
    """Every event of each of `sids` as a viewer of `home`'s host sees it, to its end."""
    async with Client.connect(Path(home)) as client:
        async def one(sid: str) -> list[dict]:
            return [e async for e in client.events(sid, 1, stop_at="last")]
        got = await asyncio.gather(*(one(s) for s in sids))
    return dict(zip(sids, got, strict=True))


def logged(pg_url: str) -> dict[str, list[dict]]:
    """The store's log of every session, its events decoded as a viewer gets them."""
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT sid, seq, frame FROM records ORDER BY sid, seq").fetchall()
    out: dict[str, list[dict]] = {}
    for sid, seq, frame in rows:
        event = event_dict(decode(bytes(frame)))
        assert event["seq"] == seq
        out.setdefault(sid, []).append(event)
    return out


def claimed_by(home: str) -> set[str]:
    """The sessions `home`'s host claimed (its log says each)."""
    return set(re.findall(r"claimed session (\w+) ", (Path(home) / "host.log").read_text()))


def test_three_hosts_300_sessions_one_host_killed(homes, pg_url, tmp_path):
    (a, b, c), (env_a, env_b, env_c) = homes
    with running_host(b, env_b), running_host(c, env_c):
        with running_host(a, env_a):
            of_a = asyncio.run(start(a, "#tool go", PER_HOST, tmp_path))
            of_b = asyncio.run(start(b, "#quick go", PER_HOST, tmp_path))
            of_c = asyncio.run(start(c, "#quick go", PER_HOST, tmp_path))
            asyncio.run(until(lambda: len(marked()) >= 16, what="A's tools to run"))
            killed_at = kill_host(a)
        # Once every session of A is claimed, watch each on its owner: replay, then live.
        asyncio.run(until(lambda: set(of_a) <= claimed_by(b) | claimed_by(c),
                          what="B and C to claim A's sessions", timeout=120))
        by_b, by_c = claimed_by(b), claimed_by(c)
        assert not by_b & by_c  # each taken by one host
        on_b = [s for s in of_a if s in by_b] + of_b
        on_c = [s for s in of_a if s in by_c] + of_c
        live = {**asyncio.run(streams(b, on_b)), **asyncio.run(streams(c, on_c))}
        took = time.time() - killed_at
        log = logged(pg_url)
        everywhere = [asyncio.run(streams(h, of_a + of_b + of_c)) for h in (b, c)]
    assert len(live) == 3 * PER_HOST
    resumed = 0
    for sid, events in live.items():
        assert events == log[sid], sid  # the owner's stream is the log
        assert all(seen[sid] == events for seen in everywhere), sid  # and every host's
        assert_one_run(events)
        assert [e["type"] for e in events].count("DONE") == 1
        assert events[-1]["type"] == "DONE" and events[-1]["data"]["text"] == "carried on"
        assert len(of_type(events, "TOOL_START")) <= 1  # never run again
        resumed += len(of_type(events, "RESUMED"))
    assert resumed == PER_HOST  # every session of A, once; none of B's nor C's
    print(f"{3 * PER_HOST} sessions on 3 hosts, A killed: all {3 * PER_HOST} ended, "
          f"{resumed} resumed on B ({len(on_b) - PER_HOST}) and C ({len(on_c) - PER_HOST}); "
          f"kill -> every stream ended {took:.1f} s")
    asyncio.run(until(lambda: not marked(), what="the killed host's tools to be gone"))
