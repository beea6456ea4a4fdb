"""Any host, any session: two hosts (separate homes, one machine, one PostgreSQL store).
A session one host runs is cancelled, told something, approved and watched live through
the other; a new session goes to the host named (`--host`) or to the least-loaded one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import psycopg
import pytest
from homes import make_home, remove_home
from hostkit import events_of, oploop, running_host, unique_mark, until, workspace

from bench import pgcluster
from bus.client import Client

pytestmark = pytest.mark.timeout(400)

MARK = unique_mark()
CONFIG = """
[agents.ops]
approval_timeout_s = 600

[agents.ops.permissions]
shell = "ask"
"""


def shell(command: str) -> dict[str, Any]:
    return {"type": "tool_use", "name": "shell", "input": {"command": command}}


SCRIPTS = {
    # A tool that runs until cancelled.
    "sleep": [{"reply": [shell(f"exec sleep {MARK}0")]}, {"reply": "never"}],
    # A short tool (a boundary comes soon after it), then the answer to what was said.
    "talk": [{"reply": [shell("sleep 2")]}, {"reply": "heard you"}],
    # A call waiting for approval (agent ops asks for every shell call).
    "ask": [{"reply": [shell("echo approved")]}, {"reply": "ran it"}],
}


def marked() -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if any(MARK in part for part in p.info["cmdline"] or ())]


@pytest.fixture(scope="module")
def hosts(pg_cluster, tmp_path_factory):
    """Two hosts up on one store: (home a, home b, id a, id b, url)."""
    url = pgcluster.fresh_schema(pg_cluster)
    scenario = tmp_path_factory.mktemp("anyhost") / "scenario.json"
    scenario.write_text(json.dumps({"scripts": SCRIPTS}))
    env = {"OPLOOP_STORE": url, "OPLOOP_OFFLINE_SCENARIO": str(scenario),
           "OPLOOP_HTTP_LISTEN": "127.0.0.1:0"}
    homes = [make_home("oaa-"), make_home("oab-")]
    for home in homes:
        (Path(home) / "oploop.toml").write_text(CONFIG)
    try:
        with running_host(homes[0], env), running_host(homes[1], env):
            ids = [(Path(h) / "host-id").read_text().strip() for h in homes]
            yield homes[0], homes[1], ids[0], ids[1], url
    finally:
        for home in homes:
            remove_home(Path(home))


@contextlib.asynccontextmanager
async def clients(*homes: str) -> AsyncIterator[list[Client]]:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(Client.connect(Path(h))) for h in homes]


def owner_of(url: str, sid: str) -> str | None:
    with psycopg.connect(url) as conn:
        got = conn.execute("SELECT owner FROM leases WHERE sid = %s AND expires > now()",
                           (sid,)).fetchone()
    return None if got is None else got[0]


async def until_type(events: AsyncIterator[dict[str, Any]], kind: str,
                     seen: list[dict[str, Any]]) -> dict[str, Any]:
    async for event in events:
        seen.append(event)
        if event["type"] == kind:
            return event
    raise AssertionError(f"the run ended without {kind}: {[e['type'] for e in seen]}")


def test_cancel_and_watch_through_the_host_that_does_not_run_it(hosts, tmp_path):
    a, b, id_a, id_b, url = hosts

    async def scenario() -> list[dict[str, Any]]:
        async with clients(a, b) as (on_a, on_b):
            started = await on_a.start("#sleep go", cwd=str(tmp_path), host=id_a)
            assert owner_of(url, started.session) == id_a
            seen: list[dict[str, Any]] = []
            # Watched on b (replay from the store, then live from a's broadcaster): the
            # tool's start arrives while the tool still runs.
            events = on_b.events(started.session, 1, stop_at="first")
            await until_type(events, "TOOL_START", seen)
            await until(lambda: marked(), what="the tool")
            ack = await on_b.cancel(started.session)
            assert ack.state == "cancelled"
            seen += [e async for e in events]
            return seen

    seen = asyncio.run(scenario())
    assert seen[-1]["type"] == "CANCELLED", [e["type"] for e in seen]
    assert [e["seq"] for e in seen] == list(range(1, len(seen) + 1))
    asyncio.run(until(lambda: not marked(), what="the cancelled tool to be gone"))


async def say_and_approve_through(a: str, b: str, id_a: str, cwd: Path
                                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A `say` and an `approve` sent to host `b` for sessions host `a` (`id_a`) runs:
    the events each session's viewer on `b` saw."""
    async with clients(a, b) as (on_a, on_b):
        talk = await on_a.start("#talk go", cwd=str(cwd), host=id_a)
        told: list[dict[str, Any]] = []
        events = on_b.events(talk.session, 1, stop_at="first")
        await until_type(events, "TOOL_START", told)
        said = await on_b.say(talk.session, "also this")
        assert said.state == "queued"
        told += [e async for e in events]

        ask = await on_a.start("#ask go", agent="ops", cwd=str(cwd), host=id_a)
        asked: list[dict[str, Any]] = []
        events = on_b.events(ask.session, 1, stop_at="first")
        request = await until_type(events, "APPROVAL_REQUESTED", asked)
        decided = await on_b.approve(ask.session, [request["data"]["call_id"]])
        assert decided.by == "local"  # (B's local user: `by`, honoured from a host)
        asked += [e async for e in events]
        return told, asked


def assert_said_and_approved(told: list[dict[str, Any]], asked: list[dict[str, Any]]) -> None:
    """The message reached the run and the approval decided the call, once, by "local"."""
    (message,) = [e for e in told if e["type"] == "USER_MESSAGE"]
    assert message["data"]["text"] == "also this"
    assert told[-1]["type"] == "DONE" and told[-1]["data"]["text"] == "heard you"
    assert [e["type"] for e in asked if e["type"].startswith("APPROVAL")] == \
        ["APPROVAL_REQUESTED", "APPROVAL_DECIDED"]
    (decided,) = [e for e in asked if e["type"] == "APPROVAL_DECIDED"]
    assert decided["data"]["by"] == "local"
    assert asked[-1]["type"] == "DONE" and asked[-1]["data"]["text"] == "ran it"


def test_say_and_approve_through_the_other_host(hosts, tmp_path):
    a, b, id_a, _, _ = hosts
    assert_said_and_approved(*asyncio.run(say_and_approve_through(a, b, id_a, tmp_path)))


def test_host_places_and_an_unknown_host_is_one_line(hosts, tmp_path):
    a, b, id_a, id_b, url = hosts
    refused = oploop(a, "run", "--host", "nosuch", "#sleep go")
    assert refused.returncode == 1
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "no host 'nosuch'" in refused.stderr
    ran = oploop(a, "run", "--host", id_b, "--json", "#talk go", cwd=str(tmp_path))
    assert ran.returncode == 0, ran.stderr
    events = events_of(ran.stdout)
    assert events[-1]["type"] == "DONE" and events[-1]["data"]["text"] == "heard you"
    assert workspace(b, events[0]["session"]).exists()  # its tool ran on b
    assert not workspace(a, events[0]["session"]).exists()

    async def scenario() -> None:
        async with clients(a) as (on_a,):
            placed = await on_a.start("#sleep go", cwd=str(tmp_path), host=id_b)
            assert owner_of(url, placed.session) == id_b
            events = on_a.events(placed.session, 1, stop_at="first")
            await until_type(events, "TOOL_START", [])
            assert (await on_a.cancel(placed.session)).state == "cancelled"  # (via a)
            assert [e async for e in events][-1]["type"] == "CANCELLED"

    asyncio.run(scenario())
    asyncio.run(until(lambda: not marked(), what="the cancelled tool to be gone"))


def test_a_new_session_goes_to_the_least_loaded_host(hosts, tmp_path):
    a, b, id_a, id_b, url = hosts

    async def scenario() -> None:
        async with clients(a) as (on_a,):
            busy = await on_a.start("#sleep go", cwd=str(tmp_path))
            assert owner_of(url, busy.session) == id_a  # (a tie: the host asked)
            nxt = await on_a.start("#sleep go", cwd=str(tmp_path))
            assert owner_of(url, nxt.session) == id_b  # a runs one, b none
            for sid in (busy.session, nxt.session):
                assert (await on_a.cancel(sid)).state == "cancelled"

    asyncio.run(scenario())
    asyncio.run(until(lambda: not marked(), what="the cancelled tools to be gone"))


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    data = ""
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data:"):
            data = line[5:].strip()
        elif not line and data:
            yield json.loads(data)
            data = ""


def test_the_web_api_cli_watch_and_inspect_of_the_other_host(hosts):
    a, b, id_a, _, url = hosts
    web = (Path(b) / "run" / "web.url").read_text().strip()
    token = (Path(b) / "web.token").read_text().strip()

    async def scenario() -> tuple[str, list[dict[str, Any]]]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
            async with http.post(f"{web}api/sessions",
                                 json={"prompt": "#sleep go", "host": id_a}) as resp:
                assert resp.status == 201, await resp.text()
                sid = (await resp.json())["session"]
            assert owner_of(url, sid) == id_a
            async with http.post(f"{web}api/sessions", json={"prompt": "x", "host": "nosuch"}
                                 ) as resp:
                assert resp.status == 400 and "no host 'nosuch'" in await resp.text()
            seen: list[dict[str, Any]] = []
            async with http.get(f"{web}api/sessions/{sid}/events",
                                params={"stop_at": "first"}) as resp:
                events = sse_events(resp)
                await until_type(events, "TOOL_START", seen)  # live, from a's broadcaster
                async with http.post(f"{web}api/sessions/{sid}/cancel", json={}) as cancel:
                    assert cancel.status == 200, await cancel.text()
                seen += [e async for e in events]
            return sid, seen

    sid, seen = asyncio.run(scenario())
    assert seen[-1]["type"] == "CANCELLED"
    watched = oploop(b, "watch", sid, "--json", "--no-follow")
    assert watched.returncode == 130, watched.stderr  # (a cancelled run's status)
    assert [json.loads(line)["seq"] for line in watched.stdout.splitlines()] == \
        [e["seq"] for e in seen]
    inspected = oploop(b, "inspect", sid, "--json")
    assert inspected.returncode == 0, inspected.stderr
    summary = json.loads(inspected.stdout)["summary"]
    assert summary["session"] == sid and summary["state"] == "idle"  # (its run ended)
    asyncio.run(until(lambda: not marked(), what="the cancelled tool to be gone"))
