"""The shared PostgreSQL store out of reach mid-run (`actors/supervisor/outage.py`).

A real cluster of the test's own (the suite's is shared by the tests of a worker) is
stopped (`pg_ctl stop -m fast`: every connection cut) while a session's tool runs,
and started again: the session waits (said by `oploop status`), gets exactly one
`STORE_UNAVAILABLE` and one `STORE_AVAILABLE`, ends `DONE` on the same host (no
failover: the lease outlasts the outage), and the table holds every event once.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psycopg
import pytest
from homes import make_home, remove_home
from hostkit import assert_one_run, of_type, oploop, running_host, until, workspace

from bench import pgcluster
from bus.client import Client

pytestmark = pytest.mark.timeout(300)

SCRIPT = [{"reply": [{"type": "tool_use", "name": "shell",
                      "input": {"command": "touch started; while [ ! -e go ]; do sleep 0.05; "
                                           "done; echo slept"}}]},
          {"reply": "carried on", "stop_reason": "end_turn"}]


@pytest.fixture
def own_cluster():
    """A cluster this test may stop and start."""
    why = pgcluster.unavailable()
    if why:
        pytest.skip(f"PostgreSQL: {why}")
    cluster = pgcluster.PgCluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def home(tmp_path, own_cluster):
    """A home on the cluster's store, its lease long enough to outlast the outage on a
    busy machine (a shorter outage than the lease keeps the session on its host)."""
    made = make_home("ops-")
    (Path(made) / "oploop.toml").write_text("[store]\nlease_s = 60\n")
    scenario = tmp_path / "scenario.json"
    scenario.write_text(json.dumps({"scripts": {"tool": SCRIPT}}))
    yield made, {"OPLOOP_STORE": own_cluster.url, "OPLOOP_OFFLINE_SCENARIO": str(scenario)}
    remove_home(Path(made))


def status(home: str, env: dict[str, str]) -> dict:
    got = oploop(home, "status", "--json", env=env)
    assert got.returncode == 0, got.stderr
    return json.loads(got.stdout)["store"]


def test_postgresql_stopped_mid_run_the_session_waits_and_goes_on(home, own_cluster,
                                                                  tmp_path):
    home_, env = home
    with running_host(home_, env):
        async def started() -> tuple[str, list[dict]]:
            async with Client.connect(Path(home_)) as client:
                run = await client.start("#tool go", cwd=str(tmp_path))
                seen = []
                async for event in client.events(run.session, 1, stop_at="first"):
                    seen.append(event)
                    if event["type"] == "TOOL_START":
                        return run.session, seen
            raise AssertionError("the run ended before its tool started")

        sid, before = asyncio.run(started())
        asyncio.run(until(lambda: (workspace(home_, sid) / "started").exists(),
                          what="the tool"))
        own_cluster.halt()
        try:
            asyncio.run(until(lambda: status(home_, env).get("unavailable", {}).get("sessions")
                              == [sid], what="status to say the session waits"))
            said = oploop(home_, "status", env=env).stdout
            assert "the store is UNAVAILABLE" in said and sid in said, said
            # A message said now is refused, saying why (never taken, then lost).
            say = oploop(home_, "say", sid, "more", env=env)
            assert say.returncode != 0 and "store is unavailable" in say.stderr, say
        finally:
            # The tool ends only now (a `sleep 1` ended, and the run with it, before a
            # busy machine's outage had begun: no STORE_AVAILABLE); its next model
            # call waits for the store, the dispatcher holding new jobs.
            (workspace(home_, sid) / "go").touch()
            own_cluster.resume()

        async def to_the_end() -> list[dict]:
            async with Client.connect(Path(home_)) as client:
                return [e async for e in client.events(sid, 1, stop_at="last")]

        events = asyncio.run(to_the_end())
        assert "unavailable" not in status(home_, env)
    assert_one_run(events)
    assert events[:len(before)] == before  # what a viewer saw before is kept as it was
    assert [e["type"] for e in events].count("STORE_UNAVAILABLE") == 1
    (down,) = of_type(events, "STORE_UNAVAILABLE")
    (back,) = of_type(events, "STORE_AVAILABLE")
    assert down["seq"] < back["seq"] and back["data"]["down_s"] > 0
    # The sessions waited: no model call went out while the store was away (the next
    # reply's text comes after STORE_AVAILABLE).
    waited = [e["type"] for e in events[down["seq"]:back["seq"] - 1]]
    assert "TOKEN" not in waited and "DONE" not in waited, waited
    assert of_type(events, "TOKEN")[0]["seq"] > back["seq"]
    assert down["data"]["error"]
    assert not of_type(events, "RESUMED")  # waited on its host, not taken over
    (end,) = of_type(events, "TOOL_END")
    assert not end["data"]["is_error"] and "slept" in end["data"]["output"]
    assert len(of_type(events, "TOOL_START")) == 1
    assert events[-1]["type"] == "DONE" and events[-1]["data"]["text"] == "carried on"
    with psycopg.connect(own_cluster.url) as conn:
        rows = conn.execute("SELECT seq, epoch FROM records WHERE sid = %s ORDER BY seq",
                            (sid,)).fetchall()
    assert [s for s, _ in rows] == [e["seq"] for e in events] == list(range(1, len(events) + 1))
    # One owner throughout: never taken over (no RESUMED, above). Its epoch may rise once
    # without another owner: the host's first lease pass (which takes back this host id's
    # former leases, `mine`) now ends before it serves, but one that took over
    # `RENEW_WAIT_S` is answered later, and a run begun meanwhile is kept at the next
    # epoch (`_held_meanwhile`): CI saw {1, 2} under load before the pass came first.
    epochs = [e for _, e in rows]
    assert epochs == sorted(epochs) and epochs[-1] - epochs[0] <= 1, epochs


def test_a_restarted_hosts_take_back_is_asked_again_after_a_failed_first_pass(
        own_cluster, tmp_path):
    """A host restarted with the store down takes its former self's sessions back once
    the store is there again (its first pass failed: the leases, still unexpired, were
    renewed by the next passes and never resumed anywhere)."""
    import time

    from actors.logstore import open_store
    from actors.sessionlog import Record, SessionRow
    from actors.supervisor.ownership import Ownership

    former_store = open_store(tmp_path / "former", own_cluster.url)
    former = Ownership(former_store, "h", "host-h", 60.0, claims=True, lost=print,
                       claimed=print)
    assert former.acquire("old") == ""  # its run, when it died
    former_store.commit([Record("old", 1, b"x")], [SessionRow("old", 1.0, b"m", None, 1.0, True)])
    former.close()
    former_store.close()

    store = open_store(tmp_path / "again", own_cluster.url)
    claimed: list[dict] = []
    again = Ownership(store, "h", "host-h", 60.0, claims=True, lost=print,
                      claimed=claimed.append)
    try:
        own_cluster.halt()
        try:
            asyncio.run(again.tick(time.monotonic(), mine=True))
            assert again.failing and not again.took_back and claimed == []
        finally:
            own_cluster.resume()
        asyncio.run(again.tick(time.monotonic(), mine=not again.took_back))
        assert again.took_back and [list(c) for c in claimed] == [["old"]]
        assert again.fence.epochs == {"old": 2}
    finally:
        again.close()
        store.close()
