"""A host on a PostgreSQL store (`OPLOOP_STORE`): runs, replays and `oploop store copy`.

Real processes on a real server (the suite's throwaway cluster, `pg_cluster`): the
supervisor journals to PostgreSQL, the broadcaster replays from it, and a home's
SQLite sessions copied there read back the same on a host using the store.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import psycopg
import pytest
from hostkit import of_type, oploop, run, running_host, scripted_host, until

from bus.client import Client

#: A guard only: two host starts and a copy take ~60 s on 2 cores at load 14.
pytestmark = pytest.mark.timeout(240)


async def replay(home: str, sid: str) -> list[dict]:
    """Every event of `sid` as a late viewer gets it (the broadcaster's replay)."""
    async with Client.connect(Path(home)) as client:
        return [e async for e in client.events(sid, 1, stop_at="first")]


def test_a_host_on_postgresql_journals_and_replays_from_it(short_home, pg_url):
    env = {"OPLOOP_STORE": pg_url}
    with running_host(short_home, env):
        events = run(short_home, "hello")
        sid = events[0]["session"]
        assert asyncio.run(replay(short_home, sid)) == events
    with psycopg.connect(pg_url) as conn:
        seqs = [s for (s,) in conn.execute("SELECT seq FROM records WHERE sid = %s "
                                           "ORDER BY seq", (sid,))]
        assert seqs == [e["seq"] for e in events]
        assert conn.execute("SELECT running FROM sessions WHERE sid = %s",
                            (sid,)).fetchone() == (False,)
    # Nothing of it in the home's SQLite file (its tombstones of pruned sessions only).
    local = Path(short_home) / "sessions.db"
    if local.exists():
        with sqlite3.connect(local) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
        assert "records" not in tables, tables


def test_store_copy_moves_a_homes_sessions(short_home, pg_url):
    with running_host(short_home):  # on the SQLite file
        events = run(short_home, "hello")
    sid = events[0]["session"]
    copied = oploop(short_home, "store", "copy", "--to", pg_url)
    assert copied.returncode == 0, copied.stderr
    assert "1 session(s) copied" in copied.stdout
    again = oploop(short_home, "store", "copy", "--to", pg_url)
    assert "0 session(s) copied" in again.stdout and "1 already there" in again.stdout
    with running_host(short_home, {"OPLOOP_STORE": pg_url}):
        assert asyncio.run(replay(short_home, sid)) == events
        follow = run(short_home, "again", session=sid)
        assert follow[0]["seq"] == events[-1]["seq"] + 1


def test_store_copy_refuses_what_it_cannot_do(short_home, pg_url):
    bad = oploop(short_home, "store", "copy", "--to", "mysql://x")
    assert bad.returncode != 0 and "expected a postgresql:// URL" in bad.stderr
    with running_host(short_home):
        up = oploop(short_home, "store", "copy", "--to", pg_url)
        assert up.returncode != 0 and "stop it first" in up.stderr


async def restart_mid_tool(home: str, cluster, cwd: Path) -> list[dict]:
    """Start `#tool`, restart the server while the tool runs; the run's events."""
    async with Client.connect(Path(home)) as client:
        started = await client.start("#tool go", cwd=str(cwd))
        events = []
        async for event in client.events(started.session, started.from_seq, stop_at="first"):
            events.append(event)
            if event["type"] == "TOOL_START":
                await asyncio.to_thread(cluster.restart)
        return events


def test_the_server_restarted_mid_run_loses_nothing_and_the_run_goes_on(
        short_home, pg_cluster, pg_url, tmp_path):
    scripts = {"tool": [{"reply": [{"type": "tool_use", "name": "shell",
                                    "input": {"command": "sleep 3; echo slept"}}]},
                        {"reply": "carried on", "stop_reason": "end_turn"}]}
    with scripted_host(short_home, scripts, tmp_path, {"OPLOOP_STORE": pg_url}):
        events = asyncio.run(restart_mid_tool(short_home, pg_cluster, tmp_path))
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        (end,) = of_type(events, "TOOL_END")
        assert not end["data"]["is_error"] and "slept" in end["data"]["output"]
        assert events[-1]["type"] == "DONE" and not of_type(events, "RESUMED")
        log = Path(short_home) / "host.log"
        asyncio.run(until(lambda: "the store cannot be written" in log.read_text()
                          or "cannot renew" in log.read_text(), what="the outage logged"))
    with psycopg.connect(pg_url) as conn:
        assert [s for (s,) in conn.execute("SELECT seq FROM records ORDER BY seq")] == \
            [e["seq"] for e in events]
