"""ask_machine between hosts: host A's session asks host B's agent; B's events stream
into A's session for every viewer of A; B's answer is A's tool result; a cancel of A
cancels B's run; asks to two machines run at once; and a peer's key can do no more
than its role allows, B's own hidden sets and rules applying to what it asks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
import zmq.asyncio
from homes import make_home
from hostkit import TERMINAL, assert_one_run, of_type, oploop
from peerkit import (
    ask,
    free_ports,
    issue_peer_key,
    network_config,
    peer_config,
    running_host,
    tool_use,
    write_home,
)

from actors.sandbox.workspaces import remove_home
from bus.client import Client
from bus.endpoints import Endpoints
from bus.errors import RemoteError
from bus.security import ClientKeys

# A guard only: three hosts start with the module's first test (~20 s in all here).
pytestmark = pytest.mark.timeout(300)

#: A directory of B's machine outside any home, named before the scenarios are written:
#: the hosts' sessions run in scratch mode (tests/conftest.py), where the file tools
#: read the directory a run was started in by its path (relative paths are the
#: session's workspace's).
FLAG_DIR = Path(f"/tmp/askflag-{os.getpid()}")

#: What B's and C's agents do, by the `#name` of the prompt A's model sends them.
REMOTE = {
    "echo": [{"reply": [tool_use("shell", command="echo from-the-remote")]},
             {"reply": "the remote says hello"}],
    "slow": [{"reply": [tool_use("shell", command="sleep 120")]}, {"reply": "never"}],
    "hidden": [{"reply": [tool_use("write_file", path="x.txt", content="no")]},
               {"reply": [tool_use("shell", command="echo denied-ran > y.txt")]},
               {"reply": "could not"}],
    "readflag": [{"reply": [tool_use("read_file", path=f"{FLAG_DIR}/flag.txt")]},
                 {"reply": "read"}],
}

#: What A's agent does.
CALLER = {
    "askb": [{"reply": [ask("b", "#echo say hello")]}, {"reply": "A is done"}],
    "slowb": [{"reply": [ask("b", "#slow wait")]}, {"reply": "never"}],
    "both": [{"reply": [ask("b", "#slow wait"), ask("c", "#slow wait")]}, {"reply": "never"}],
    "nowhere": [{"reply": [ask("zz", "#echo hi")]}, {"reply": "A goes on"}],
    "locked": [{"reply": [ask("b-locked", "#hidden try")]}, {"reply": "A goes on"}],
    "impatient": [{"reply": [ask("b-quick", "#slow wait")]}, {"reply": "A goes on"}],
}

#: B's second agent, which the `b-locked` peer entry asks: write_file hidden, shell denied.
LOCKED = """
[agents.locked]
mode = "locked"

[agents.locked.permissions]
shell = "deny"

[hidden.local]
locked = ["write_file"]
"""


@pytest.fixture(scope="module")
def hosts():
    """A (no network, peers b, c and b-locked), B on 127.0.0.2, C on 127.0.0.3."""
    homes = {name: make_home(f"ask{name}-") for name in "abc"}
    listen = {"b": f"tcp://127.0.0.2:{free_ports('127.0.0.2')}",
              "c": f"tcp://127.0.0.3:{free_ports('127.0.0.3')}"}
    try:
        env_b = write_home(homes["b"], REMOTE, network_config(listen["b"]) + LOCKED)
        env_c = write_home(homes["c"], REMOTE, network_config(listen["c"]))
        keys = {m: issue_peer_key(homes[m], "host-a") for m in "bc"}
        # B binds each peer key to one agent: a second key for its `locked` agent.
        keys["b-locked"] = issue_peer_key(homes["b"], "host-a-locked", agent="locked")
        env_a = write_home(homes["a"], CALLER,
                           peer_config("b", listen["b"], keys["b"])
                           + peer_config("c", listen["c"], keys["c"])
                           + peer_config("b-locked", listen["b"], keys["b-locked"],
                                         agent="locked")
                           + peer_config("b-quick", listen["b"], keys["b"], timeout_s=2))
        env_a["OPLOOP_HTTP_LISTEN"] = "127.0.0.1:0"  # A's web view (one test looks)
        with running_host(homes["b"], env_b), running_host(homes["c"], env_c), \
                running_host(homes["a"], env_a):
            yield {**homes, "listen": listen, "keys": keys}
    finally:
        for home in homes.values():
            remove_home(Path(home))


async def follow(home: str, session: str, from_seq: int = 1) -> list[dict[str, Any]]:
    """Every event of `session`'s run on the host in `home`, to its terminal one."""
    async with Client.connect(Path(home)) as client:
        return [e async for e in client.events(session, from_seq, stop_at="first")]


def machine_events(events: list[dict[str, Any]], machine: str) -> list[dict[str, Any]]:
    """The remote events of `machine` relayed into a session (their inner events)."""
    return [e["data"]["event"] for e in events
            if e["type"] == "MACHINE_EVENT" and e["data"]["machine"] == machine]


async def wait_remote_tool(client: Client, session: str, machines: set[str]) -> None:
    """Until each of `machines` has relayed a TOOL_START of its run into `session`."""
    seen: set[str] = set()
    async for ev in client.events(session, stop_at="first"):
        if ev["type"] == "MACHINE_EVENT" and ev["data"]["event"]["type"] == "TOOL_START":
            seen.add(ev["data"]["machine"])
            if seen >= machines:
                return
        assert ev["type"] not in TERMINAL, f"the run ended first: {ev}"


def remote_session(events: list[dict[str, Any]], machine: str) -> str:
    sessions = {e["data"]["session"] for e in events
                if e["type"] == "MACHINE_EVENT" and e["data"]["machine"] == machine}
    assert len(sessions) == 1, sessions
    return sessions.pop()


def test_a_asks_b_and_b_streams_into_as_session(hosts):
    async def scenario() -> None:
        async with Client.connect(Path(hosts["a"])) as a:
            started = await a.start("#askb")
            # A second viewer of A, attached while it runs, sees the same stream.
            other = asyncio.ensure_future(follow(hosts["a"], started.session))
            events = [e async for e in a.events(started.session, stop_at="first")]
            assert await other == events
        assert_one_run(events)
        assert events[-1]["type"] == "DONE"
        (end,) = [e for e in of_type(events, "TOOL_END") if e["data"]["name"] == "ask_machine"]
        assert not end["data"]["is_error"], end
        assert end["data"]["output"] == "the remote says hello"
        relayed = machine_events(events, "b")
        kinds = [e["type"] for e in relayed]
        assert kinds[0] == "SESSION_START" and kinds[-1] == "DONE", kinds
        assert "TOOL_START" in kinds and "TOOL_END" in kinds
        tool_end = next(e for e in relayed if e["type"] == "TOOL_END")
        assert "from-the-remote" in tool_end["data"]["output"]
        # Relayed as they happened: between A's TOOL_START and TOOL_END of the call.
        seqs = [e["seq"] for e in events if e["type"] == "MACHINE_EVENT"]
        start = next(e["seq"] for e in of_type(events, "TOOL_START"))
        assert start < min(seqs) and max(seqs) < end["seq"]
        # Tagged with B's session, which is B's own record of the run.
        b_events = await follow(hosts["b"], remote_session(events, "b"))
        assert b_events[-1]["type"] == "DONE"
        by_seq = {e["seq"]: e for e in b_events}
        assert all(by_seq[r["seq"]]["type"] == r["type"] for r in relayed), relayed

    asyncio.run(scenario())


def test_watch_shows_the_remote_events_indented(hosts):
    run = oploop(hosts["a"], "run", "#askb")
    assert run.returncode == 0, run.stderr
    assert "  [b] → shell" in run.stdout, run.stdout
    assert "  [b] — done" in run.stdout


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary (Debian package `chromium`)")
def test_the_web_view_shows_the_remote_events(hosts):
    playwright = pytest.importorskip("playwright.async_api", reason="the test extra")
    events = asyncio.run(run_on(hosts["a"], "#askb"))
    url = (Path(hosts["a"]) / "run" / "web.url").read_text().strip()
    token = (Path(hosts["a"]) / "web.token").read_text().strip()

    async def main() -> str:
        async with playwright.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM,
                                               args=["--no-sandbox", "--disable-gpu"])
            try:
                page = await browser.new_page()
                page.set_default_timeout(30_000)
                await page.goto(f"{url}s/{events[0]['session']}?token={token}")
                await page.wait_for_selector(".terminal.DONE")
                return str(await page.inner_text("#log"))
            finally:
                await browser.close()

    text = asyncio.run(main())
    assert "[b] ⚙ shell" in text and "from-the-remote" in text, text
    assert "[b] DONE — the remote says hello" in text, text


def test_a_cancel_of_a_cancels_bs_run(hosts):
    async def scenario() -> None:
        async with Client.connect(Path(hosts["a"])) as a:
            started = await a.start("#slowb")
            await wait_remote_tool(a, started.session, {"b"})
            await a.cancel(started.session, "ui")
            events = await follow(hosts["a"], started.session)
        assert_one_run(events)
        assert events[-1]["type"] == "CANCELLED"
        b_events = await follow(hosts["b"], remote_session(events, "b"))
        assert_one_run(b_events)
        assert b_events[-1]["type"] == "CANCELLED", b_events[-1]
        assert of_type(b_events, "TOOL_END")[0]["data"]["is_error"]

    asyncio.run(scenario())


def test_asks_to_two_machines_run_at_once(hosts):
    async def scenario() -> None:
        async with Client.connect(Path(hosts["a"])) as a:
            started = await a.start("#both")
            # Both remote tools (each sleeps two minutes) are running at the same time.
            await wait_remote_tool(a, started.session, {"b", "c"})
            await a.cancel(started.session, "ui")
            events = await follow(hosts["a"], started.session)
        assert events[-1]["type"] == "CANCELLED"
        for machine in "bc":
            remote = await follow(hosts[machine], remote_session(events, machine))
            assert remote[-1]["type"] == "CANCELLED", (machine, remote[-1])

    asyncio.run(scenario())


def test_an_unknown_machine_is_an_error_naming_the_peers(hosts):
    events = asyncio.run(run_on(hosts["a"], "#nowhere"))
    (end,) = of_type(events, "TOOL_END")
    assert end["data"]["is_error"]
    assert "unknown machine 'zz'" in end["data"]["output"]
    assert "configured peers: b, b-locked, b-quick, c" in end["data"]["output"]
    assert events[-1]["type"] == "DONE"


def test_an_ask_past_the_peers_timeout_ends_and_is_cancelled_there(hosts):
    async def scenario() -> None:
        events = await run_on(hosts["a"], "#impatient")
        (end,) = of_type(events, "TOOL_END")
        assert end["data"]["is_error"]
        assert "no answer within 2 s (peers.b-quick.timeout_s)" in end["data"]["output"]
        assert events[-1]["type"] == "DONE"
        remote = await follow(hosts["b"], remote_session(events, "b-quick"))
        assert remote[-1]["type"] == "CANCELLED", remote[-1]

    asyncio.run(scenario())


def test_ask_machine_is_offered_only_with_peers(hosts):
    a = oploop(hosts["a"], "tools", "--json")
    b = oploop(hosts["b"], "tools", "--json")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert "ask_machine" in a.stdout
    assert "ask_machine" not in b.stdout


async def run_on(home: str, prompt: str, **start: Any) -> list[dict[str, Any]]:
    async with Client.connect(Path(home)) as client:
        started = await client.start(prompt, **start)
        return [e async for e in client.events(started.session, started.from_seq,
                                               stop_at="first")]


# -- security ----------------------------------------------------------------------------


def test_the_remote_hosts_hidden_sets_and_rules_apply(hosts):
    events = asyncio.run(run_on(hosts["a"], "#locked"))
    relayed = machine_events(events, "b-locked")
    ends = {e["data"]["name"]: e["data"] for e in relayed if e["type"] == "TOOL_END"}
    assert ends["write_file"]["is_error"] and ends["shell"]["is_error"], ends
    assert "denied" in ends["shell"]["output"]
    b_session = remote_session(events, "b-locked")
    assert not (Path(hosts["b"]) / "workspaces" / b_session / "x.txt").exists()
    assert not (Path(hosts["b"]) / "workspaces" / b_session / "y.txt").exists()
    assert events[-1]["type"] == "DONE"


def test_a_peer_key_starts_runs_on_its_own_agent_only(hosts):
    """The agent is the asked host's to say, per key: `host-a` (issued for B's default
    agent) cannot ask for `locked`, nor `host-a-locked` for the default one."""

    async def start_as(keys: Path, agent: str) -> str:
        peer = Endpoints.elsewhere(hosts["listen"]["b"], keys)
        async with Client.connect(endpoints=peer) as client:
            try:
                started = await client.start("#echo hi", agent=agent)
            except RemoteError as exc:
                return f"{exc.code}: {exc.message}"
        await follow(hosts["b"], started.session)
        return "started"

    async def scenario() -> None:
        refused = await start_as(hosts["keys"]["b"], "locked")
        assert refused == ("forbidden: this peer key may start runs on agent 'default' "
                           "only, not 'locked'"), refused
        refused = await start_as(hosts["keys"]["b-locked"], "")
        assert refused.startswith("forbidden: this peer key may start runs on agent "
                                  "'locked' only"), refused
        assert await start_as(hosts["keys"]["b"], "") == "started"
        assert await start_as(hosts["keys"]["b-locked"], "locked") == "started"

    asyncio.run(scenario())


def test_a_peer_key_cannot_choose_the_directory(hosts):
    # A directory of B's machine, outside any home: a run there may read flag.txt ...
    place = FLAG_DIR
    place.mkdir()
    try:
        (place / "flag.txt").write_text("the flag")
        place.chmod(0o755)  # (tools read as a uid of their own, not as the host's user)
        (place / "flag.txt").chmod(0o644)
        local = asyncio.run(run_on(hosts["b"], "#readflag", cwd=str(place)))
        assert "the flag" in of_type(local, "TOOL_END")[0]["data"]["output"]
        # ... but a peer asking for that directory gets none.
        peer = Endpoints.elsewhere(hosts["listen"]["b"], hosts["keys"]["b"])

        async def as_peer() -> list[dict[str, Any]]:
            async with Client.connect(endpoints=peer) as client:
                started = await client.start("#readflag", cwd=str(place))
            return await follow(hosts["b"], started.session)

        events = asyncio.run(as_peer())
        end = of_type(events, "TOOL_END")[0]["data"]
        assert end["is_error"] and "the flag" not in end["output"], end
    finally:
        shutil.rmtree(place, ignore_errors=True)


def test_a_peer_key_can_do_no_more_than_its_role(hosts):
    peer = Endpoints.elsewhere(hosts["listen"]["b"], hosts["keys"]["b"])

    async def scenario() -> None:
        async with Client.connect(Path(hosts["b"])) as local, \
                Client.connect(endpoints=peer) as client:
            mine = await local.start("#slow wait")  # a session the peer did not start
            try:
                for what, call in [
                    ("list", client.sessions()),
                    ("inspect", client.inspect(mine.session)),
                    ("remove", client.remove([mine.session])),
                    ("prune", client.prune()),
                    ("follow-up", client.start("more", session=mine.session)),
                    ("say", client.say(mine.session, "hi")),
                    ("cancel", client.cancel(mine.session)),
                    ("cancel via api", client.cancel(mine.session, via="api")),
                    ("approve", client.approve(mine.session, all=True)),
                    ("renew", client.renew(mine.session, 5.0)),
                    # which machine's files the tools act on is the asked host's to say
                    ("choose a machine", client.start("#slow wait", machine="db1")),
                ]:
                    with pytest.raises(RemoteError) as refused:
                        await call
                    assert refused.value.code == "forbidden", (what, refused.value)
                # Its own run it may cancel.
                own = await client.start("#slow wait")
                assert await client.renew(own.session, 5.0)
                assert (await client.cancel(own.session)).state == "cancelled"
            finally:
                await local.cancel(mine.session)

    asyncio.run(scenario())


def test_a_peer_cannot_pass_fields_the_protocol_lacks(hosts):
    """A start carrying tools, hidden sets or permissions of its own is refused whole:
    the wire has no such fields, and a frame with unknown ones is a bad frame."""
    keys = ClientKeys.load(hosts["keys"]["b"])

    async def scenario() -> dict[str, Any]:
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        keys.apply(sock)
        sock.connect(Endpoints.elsewhere(hosts["listen"]["b"], hosts["keys"]["b"])
                     .address("api"))
        try:
            body = {"prompt": "#echo hi", "hidden": [], "permissions": [["shell", "allow"]],
                    "tools": [{"name": "evil"}]}
            await sock.send(msgpack.packb([1, "start_run", "x1", "", "", 0.0, body]))
            async with asyncio.timeout(30):
                reply = msgpack.unpackb(await sock.recv())
            return reply
        finally:
            sock.close()
            ctx.term()

    reply = asyncio.run(scenario())
    assert reply[1] == "error", reply
    assert reply[6]["code"] == "bad_frame" or "unknown field" in reply[6]["message"], reply


def test_a_bad_peer_config_stops_up_naming_the_key():
    home = make_home("askbad-")
    try:
        Path(home, "oploop.toml").write_text(
            '[peers.b]\nconnect = "tcp://127.0.0.2:7400"\nkeys = "/nonexistent/keys"\n')
        up = oploop(home, "up", "--detach")
        assert up.returncode != 0
        assert "peers.b.keys" in up.stderr + up.stdout, up.stderr + up.stdout
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            oploop(home, "down")
        remove_home(Path(home))
