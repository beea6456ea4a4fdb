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
from hostkit import oploop, run, running_host

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
