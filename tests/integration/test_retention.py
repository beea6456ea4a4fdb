"""Retention on a real host: `oploop sessions prune`, `oploop rm`, pruned ids answered
clearly everywhere, a running session never touched, and the periodic pruning."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
from pathlib import Path

import pytest
from hostkit import actor, oploop, run, running_host, wait_until

from bus.client import Client
from bus.errors import RemoteError


def stored_sids(home: str) -> tuple[set[str], set[str]]:
    """Session ids in the session log: its session rows, and its records (read-only,
    beside the host)."""
    def ids(name: str, query: str) -> set[str]:
        db = sqlite3.connect(f"file:{Path(home) / name}?mode=ro", uri=True)
        try:
            return {row[0] for row in db.execute(query)}
        finally:
            db.close()
    return (ids("sessions.db", "SELECT sid FROM sessions"),
            ids("sessions.db", "SELECT DISTINCT sid FROM records"))


@pytest.fixture
def host(short_home):
    """A host whose periodic pruning waits an hour (a test prunes on demand)."""
    (Path(short_home) / "oploop.toml").write_text('[retention]\nevery = "1h"\n')
    with running_host(short_home) as home:
        yield home


def test_prune_and_rm_spare_the_running_session_and_pruned_ids_say_so(host):
    finished = [run(host, f"run `echo {i}`")[0]["session"] for i in range(3)]

    async def scenario() -> None:
        async with Client.connect(Path(host)) as client:
            # (a tool that outlives the checks however slow the machine: cancelled after)
            started = await client.start("run `sleep 3600`")
            running = started.session
            async for event in client.events(running, started.from_seq):
                if event["type"] == "TOOL_START":
                    break  # running: its tool is under way
            await asyncio.to_thread(check_with_a_run_under_way, running)
            await client.cancel(running)
            async for event in client.events(running, started.from_seq):
                if event["type"] == "CANCELLED":
                    break
            await asyncio.to_thread(check_rm_once_it_ended, running)

    def check_with_a_run_under_way(running: str) -> None:
        # Everything finished goes (--keep 0), the running one stays.
        pruned = oploop(host, "sessions", "prune", "--keep", "0", "--json")
        assert pruned.returncode == 0, pruned.stderr
        assert sorted(json.loads(pruned.stdout)["removed"]) == sorted(finished)
        listed = oploop(host, "sessions", "--json")
        assert [json.loads(line)["session"] for line in listed.stdout.splitlines()] == [running]
        # Gone from both stores (the broadcaster deletes its copy when told).
        wait_until(lambda: not (set(finished) & set().union(*stored_sids(host))),
                   "the pruned sessions to leave both stores")
        # Their workspaces (each a mounted image: `echo` ran in it) go too.
        spaces = Path(host) / "workspaces"
        wait_until(lambda: not any((spaces / sid).exists() or os.path.ismount(spaces / sid)
                                   or (spaces / ".images" / f"{sid}.img").exists()
                                   for sid in finished),
                   "the pruned sessions' workspaces and images to be deleted")
        assert (spaces / running).is_dir()  # the running one's stays
        # Every way of naming a pruned session says so.
        gone = finished[0]
        for args in (("watch", gone), ("cancel", gone), ("run", "--session", gone, "hi")):
            out = oploop(host, *args)
            assert out.returncode == 1, (args, out.stdout)
            assert f"no such session '{gone}' (pruned)" in out.stderr, (args, out.stderr)
        # rm refuses a running session (and says why), and an unknown or pruned one.
        rm = oploop(host, "rm", running, gone, "nosuchsession")
        assert rm.returncode == 1
        assert f"session {running} is running (cancel it first)" in rm.stderr
        assert "(pruned)" in rm.stderr and "no session 'nosuchsession'" in rm.stderr
        assert "deleted 0 session(s)" in rm.stdout

    def check_rm_once_it_ended(running: str) -> None:
        rm = oploop(host, "rm", running)
        assert rm.returncode == 0, rm.stderr
        assert f"deleted 1 session(s): {running}" in rm.stdout
        assert oploop(host, "sessions", "--json").stdout.strip() == ""
        wait_until(lambda: running not in set().union(*stored_sids(host)),
                   "the removed session to leave both stores")

    asyncio.run(scenario())

    async def inspect_and_replay(sid: str) -> tuple[str, int | None]:
        async with Client.connect(Path(host)) as client:
            with pytest.raises(RemoteError) as err:
                await client.inspect(sid)
            return err.value.message, await client.last_seq(sid)

    message, last_seq = asyncio.run(inspect_and_replay(finished[1]))
    assert message == f"no such session '{finished[1]}' (pruned)" and last_seq is None


def test_retention_applies_at_start_and_periodically(short_home):
    home = Path(short_home)
    (home / "oploop.toml").write_text('[retention]\nmax_sessions = 2\nevery = "1s"\n')
    with running_host(short_home):
        sids = [run(short_home, f"run `echo {i}`")[0]["session"] for i in range(4)]
        # Within a few rounds of `every`, only the two most recent are left.
        wait_until(lambda: stored_sids(short_home)[0] == set(sids[2:]),
                   "periodic pruning to keep the 2 newest")
        wait_until(lambda: stored_sids(short_home)[1] == set(sids[2:]),
                   "the broadcaster to drop the pruned logs")
        out = oploop(short_home, "watch", sids[0])
        assert "(pruned)" in out.stderr
        # The tombstones outlive the supervisor.
        old = actor(short_home, "supervisor")["pid"]
        os.kill(old, signal.SIGKILL)
        wait_until(lambda: actor(short_home, "supervisor")["pid"] not in (None, old)
                   and actor(short_home, "supervisor")["state"] == "running",
                   "the supervisor to be restarted")
        out = oploop(short_home, "run", "--session", sids[1], "hello again")
        assert f"no such session '{sids[1]}' (pruned)" in out.stderr, out.stderr
