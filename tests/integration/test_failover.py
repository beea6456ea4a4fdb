"""Failover between hosts on one PostgreSQL store: two hosts (separate homes, one
machine, one store). The owner of a running session is killed (-9, every process of
it at once, as a machine dying) or stopped (`oploop down`); the other host claims
the session when its lease lapses (or at once, handed over) and resumes it exactly
as after a restart: `RESUMED`, the started tool answered "interrupted", the model
called again. The table then holds no record of a stale epoch and no seq twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
from pathlib import Path

import psutil
import psycopg
import pytest
from homes import make_home, remove_home
from hostkit import (
    assert_one_run,
    host_pids,
    of_type,
    oploop,
    running_host,
    unique_mark,
    until,
    workspace,
)

from bus.client import Client

#: A guard only: a lease of 5 s to lapse, two hosts to start on 2 busy cores.
pytestmark = pytest.mark.timeout(300)

MARK = unique_mark()
OK = {"reply": "carried on", "stop_reason": "end_turn"}
SCRIPTS = {"tool": [{"reply": [{"type": "tool_use", "name": "shell",
                                "input": {"command": f"touch started; exec sleep {MARK}0"}}]},
                    OK]}


def marked() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if any(MARK in part for part in p.info["cmdline"] or ())]


@pytest.fixture
def two_homes(pg_url, tmp_path):
    """Two homes on the store, and the environment of each host: the first's model
    asks for the tool; the second's (each host has its own offline model, playing its
    script from the start) answers the resumed turn."""
    envs = []
    for name, script in (("a", SCRIPTS["tool"]), ("b", SCRIPTS["tool"][1:])):
        scenario = tmp_path / f"scenario-{name}.json"
        scenario.write_text(json.dumps({"scripts": {"tool": script}}))
        envs.append({"OPLOOP_STORE": pg_url, "OPLOOP_OFFLINE_SCENARIO": str(scenario)})
    homes = [make_home("opa-"), make_home("opb-")]
    yield homes, envs
    for home in homes:
        remove_home(Path(home))


async def start_and_wait_for_the_tool(home: str, cwd: Path) -> str:
    """Start `#tool go` on `home`'s host; its session once the tool runs."""
    async with Client.connect(Path(home)) as client:
        started = await client.start("#tool go", cwd=str(cwd))
        async for event in client.events(started.session, started.from_seq, stop_at="first"):
            if event["type"] == "TOOL_START":
                break
        else:
            raise AssertionError("the run ended before its tool started")
    started_file = workspace(home, started.session) / "started"
    await until(lambda: started_file.exists() and marked(), what="the tool")
    return started.session


async def watch_to_the_end(home: str, sid: str) -> list[dict]:
    """Every event of `sid` as a viewer of `home`'s host sees it (replay, then live)."""
    async with Client.connect(Path(home)) as client:
        return [e async for e in client.events(sid, 1, stop_at="last")]


def kill_host(home: str) -> float:
    """SIGKILL the host and every process under it at once; when (time.time())."""
    pids = set(host_pids(home))
    for pid in list(pids):
        with contextlib.suppress(psutil.Error):
            pids |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
    procs = [psutil.Process(p) for p in pids if psutil.pid_exists(p)]
    at = time.time()
    # Frozen first, then killed: none of them may notice another's death (an actor
    # is told of its host's by a signal it would handle, handing its sessions over).
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
    psutil.wait_procs(procs, timeout=10)
    for stale in (Path(home) / "run").glob("*"):  # (what a dead machine leaves behind)
        if stale.is_file() or stale.is_socket():
            stale.unlink()
    return at


def check_the_table(pg_url: str, sid: str, events: list[dict]) -> list[int]:
    """Every record of `sid` once, in seq order, each written under the epoch its
    writer held then: epochs never go back, and every record from `RESUMED` on is
    the claimer's. The epochs in seq order."""
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute("SELECT seq, epoch FROM records WHERE sid = %s ORDER BY seq",
                            (sid,)).fetchall()
        (final,) = conn.execute("SELECT epoch FROM leases WHERE sid = %s", (sid,)).fetchone()
    seqs, epochs = [s for s, _ in rows], [e for _, e in rows]
    assert seqs == [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert epochs == sorted(epochs)
    (resumed,) = of_type(events, "RESUMED")
    assert set(epochs[resumed["seq"] - 1:]) == {final} and final > epochs[0]
    return epochs


def print_timeline(home: str, killed_at: float, resumed_at: float) -> None:
    """The failover as it happened: the kill, the lease's lapse and its claim (the
    store's clock, from the claimer's log), `RESUMED` (seconds after the kill)."""
    for line in (Path(home) / "host.log").read_text().splitlines():
        found = re.search(r"lapsed at ([\d.]+), claimed at ([\d.]+)", line)
        if found:
            lapsed, claimed = map(float, found.groups())
            print(f"timeline: kill 0.00 s, lease lapsed {lapsed - killed_at:+.2f} s, "
                  f"claimed {claimed - killed_at:+.2f} s, RESUMED {resumed_at - killed_at:+.2f} s")


def assert_resumed_as_after_a_restart(events: list[dict]) -> None:
    assert_one_run(events)
    (end,) = of_type(events, "TOOL_END")
    assert end["data"]["is_error"] and end["data"]["output"].startswith("interrupted")
    assert len(of_type(events, "TOOL_START")) == 1  # never run again
    assert events[-1]["type"] == "DONE" and events[-1]["data"]["text"] == "carried on"


def test_kill_9_of_the_owner_mid_tool_the_other_host_resumes(two_homes, pg_url, tmp_path):
    (a, b), (env_a, env_b) = two_homes
    up = oploop(a, "up", "--detach", env=env_a)
    assert up.returncode == 0, up.stderr
    try:
        with running_host(b, env_b):
            sid = asyncio.run(start_and_wait_for_the_tool(a, tmp_path))
            killed_at = kill_host(a)
            events = asyncio.run(watch_to_the_end(b, sid))
            assert_resumed_as_after_a_restart(events)
            (resumed,) = of_type(events, "RESUMED")
            took = resumed["ts"] - killed_at
            print(f"kill -9 -> RESUMED on the other host: {took:.2f} s")
            print_timeline(b, killed_at, resumed["ts"])
            assert took < 15, took  # (default lease 5 s, claimed within the next second)
            check_the_table(pg_url, sid, events)
    finally:
        kill_host(a) if (Path(a) / "run" / "host.json").exists() else None
    asyncio.run(until(lambda: not marked(), what="the killed host's tool to be gone"))


def test_oploop_down_hands_running_sessions_over(two_homes, pg_url, tmp_path):
    (a, b), (env_a, env_b) = two_homes
    with running_host(b, env_b):
        with running_host(a, env_a):
            sid = asyncio.run(start_and_wait_for_the_tool(a, tmp_path))
            # Any host's status lists the hosts on the store and who holds what.
            status = oploop(b, "status", "--json", env=env_b)
            assert status.returncode == 0, status.stderr
            store = json.loads(status.stdout)["store"]
            id_a, id_b = ((Path(h) / "host-id").read_text().strip() for h in (a, b))
            assert store["host"] == id_b
            assert {h["id"] for h in store["hosts"]} == {id_a, id_b}
            assert [(x["session"], x["owner"]) for x in store["leases"]] == [(sid, id_a)]
            assert f"{sid} held by {id_a}" in oploop(b, "status", env=env_b).stdout
            down_at = time.time()
        events = asyncio.run(watch_to_the_end(b, sid))
        assert_resumed_as_after_a_restart(events)
        (resumed,) = of_type(events, "RESUMED")
        print(f"oploop down -> RESUMED on the other host: {resumed['ts'] - down_at:.2f} s")
        check_the_table(pg_url, sid, events)


def test_a_frozen_owner_writes_nothing_once_its_lease_lapsed(two_homes, pg_url, tmp_path):
    """The owner frozen (SIGSTOP: a long GC pause, a suspended VM, a cut link) past its
    lease: the other host takes the session over; thawed, the old owner finds its lease
    gone, stops the session's work and has written nothing since."""
    (a, b), (env_a, env_b) = two_homes
    with running_host(b, env_b), running_host(a, env_a):
        sid = asyncio.run(start_and_wait_for_the_tool(a, tmp_path))
        frozen = [psutil.Process(p) for p in host_pids(a)]
        for proc in frozen:
            proc.send_signal(signal.SIGSTOP)
        try:
            events = asyncio.run(watch_to_the_end(b, sid))
        finally:
            for proc in frozen:
                proc.send_signal(signal.SIGCONT)
        assert_resumed_as_after_a_restart(events)
        log_a = Path(a) / "host.log"
        asyncio.run(until(lambda: "whose lease lapsed" in log_a.read_text(),
                          what="the thawed host to stop the session"))
        check_the_table(pg_url, sid, events)
