"""ask_machine over a link that is cut: host B lives in a network namespace of its own,
joined to A's by a veth pair the test takes down. A's call ends with "machine b lost",
A's session goes on, B's run ends when its lease runs out, and once the link is back
B is asked again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from homes import make_home
from hostkit import TERMINAL, assert_one_run, of_type
from peerkit import (
    Namespace,
    ask,
    free_ports,
    host_in,
    issue_peer_key,
    namespaces_usable,
    network_config,
    peer_config,
    running_host,
    tool_use,
    write_home,
)

from actors.sandbox.workspaces import remove_home
from bus.client import Client

REMOTE = {
    "slow": [{"reply": [tool_use("shell", command="sleep 120")]}, {"reply": "never"}],
    "echo": [{"reply": "b is back"}],
}
CALLER = {
    "cut": [{"reply": [ask("b", "#slow wait")]}, {"reply": "A carried on"}],
    "again": [{"reply": [ask("b", "#echo hi")]}, {"reply": "A is done"}],
}

WHY = namespaces_usable()


@pytest.mark.skipif(bool(WHY), reason=WHY or "namespaces usable")
@pytest.mark.timeout(300)  # a guard only: ~20 s here, the lease's 10 s included
def test_a_cut_link_ends_the_call_and_the_lease_ends_the_remote_run():
    homes = {name: make_home(f"askl{name}-") for name in "ab"}
    try:
        with Namespace() as ns:
            listen = f"tcp://{ns.inner}:{free_ports('127.0.0.1')}"
            env_b = write_home(homes["b"], REMOTE, network_config(listen))
            keys = issue_peer_key(homes["b"], "host-a")
            env_a = write_home(homes["a"], CALLER, peer_config("b", listen, keys))
            with host_in(ns, homes["b"], env_b), running_host(homes["a"], env_a):
                asyncio.run(_scenario(ns, homes))
    finally:
        for home in homes.values():
            remove_home(Path(home))


def listen_port(homes: dict[str, str]) -> str:
    """The first port of B's [network] listen, from A's peer entry."""
    text = Path(homes["a"], "oploop.toml").read_text()
    return text.split('connect = "', 1)[1].split('"', 1)[0].rsplit(":", 1)[1]


async def until_reachable(host: str, port: int) -> None:
    """Until a TCP connection to host:port is accepted (the link works again)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + 60
    while True:
        try:
            async with asyncio.timeout(1.0):
                _, writer = await asyncio.open_connection(host, port)
            writer.close()
            await writer.wait_closed()
            return
        except (OSError, TimeoutError):
            assert loop.time() < end, f"{host}:{port} not reachable again"
            await asyncio.sleep(0.1)


async def _scenario(ns: Namespace, homes: dict[str, str]) -> None:
    async with Client.connect(Path(homes["a"])) as a, Client.connect(Path(homes["b"])) as b:
        remote = await _ask_and_cut(a, ns)
        # With the link still down, B's run ends when its lease runs out (B's own
        # viewer, over ipc, sees it).
        b_events = [e async for e in b.events(remote, stop_at="first")]
        assert b_events[-1]["type"] == "CANCELLED", [(e["type"], e["data"]) for e in b_events][-3:]
        assert "lease" in b_events[-1]["data"]["reason"], b_events[-1]
        assert of_type(b_events, "TOOL_END")[-1]["data"]["is_error"]
        # The link back (B's port answers again), B is asked again.
        ns.mend()
        await until_reachable(ns.inner, int(listen_port(homes)))
        again = await a.start("#again")
        events = [e async for e in a.events(again.session, stop_at="first")]
        assert events[-1]["type"] in TERMINAL
        (end,) = [e for e in of_type(events, "TOOL_END") if e["data"]["name"] == "ask_machine"]
        assert (end["data"]["is_error"], end["data"]["output"]) == (False, "b is back"), end
        # Cut again, and back as soon as A has noticed: B's run is cancelled (by A's
        # cancel, sent again until the link carries it, or else by its lease).
        remote = await _ask_and_cut(a, ns)
        ns.mend()
        b_events = [e async for e in b.events(remote, stop_at="first")]
        assert b_events[-1]["type"] == "CANCELLED", b_events[-1]
        reason = b_events[-1]["data"]["reason"]
        assert "asking host cancelled" in reason or "lease" in reason, reason


async def _ask_and_cut(a: Client, ns: Namespace) -> str:
    """A asks B to run a long tool; once it runs, the link is cut. Returns B's session
    after checking A's call ended "machine b lost" and A's run went on to DONE."""
    started = await a.start("#cut")
    remote = ""
    events: list[dict[str, Any]] = []
    async for ev in a.events(started.session, stop_at="first"):
        events.append(ev)
        data = ev["data"]
        if (not remote and ev["type"] == "MACHINE_EVENT"
                and data["event"]["type"] == "TOOL_START"):
            remote = data["session"]
            ns.cut()  # B's tool runs: now the link goes silent
    assert remote, [e["type"] for e in events]
    assert_one_run(events)
    (end,) = [e for e in of_type(events, "TOOL_END") if e["data"]["name"] == "ask_machine"]
    assert end["data"]["is_error"]
    assert "machine b lost" in end["data"]["output"], end
    assert events[-1]["type"] == "DONE"  # A's session went on without B's answer
    return remote
