"""Approvals with real processes: a call under an `ask` rule waits for `oploop approve`
or `deny` (or its timeout), every viewer sees the decision, the first one wins, and a
pending approval survives a supervisor killed with SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from homes import make_home, remove_home
from hostkit import WAIT_S, actor, assert_one_run, oploop, scripted_host, until

from bus.client import Client
from bus.errors import RemoteError

CONFIG = """
[agents.ops]
approval_timeout_s = 600

[agents.ops.permissions]
"shell(echo ok*)" = "allow"
shell = "ask"
write_file = "deny"

[agents.quick]
approval_timeout_s = 0.5

[agents.quick.permissions]
shell = "ask"
"""


def shell(command: str) -> dict[str, Any]:
    return {"type": "tool_use", "name": "shell", "input": {"command": command}}


FINISHED = {"reply": "finished", "stop_reason": "end_turn"}
SCRIPTS = {
    # An allowed call and an asked one in one reply: the allowed one runs meanwhile.
    "two": [{"reply": [shell("echo ok-allowed"), shell("echo asked-ran")]}, FINISHED],
    "one": [{"reply": [shell("echo asked-ran")]}, FINISHED],
    "write": [{"reply": [{"type": "tool_use", "name": "write_file",
                          "input": {"path": "x", "content": "no"}}]}, FINISHED],
}


def approvals_host(home: str, directory: Path):
    (Path(home) / "oploop.toml").write_text(CONFIG)
    return scripted_host(home, SCRIPTS, directory)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """One host for the tests that only run sessions on it (each its own session; the
    offline model plays a script per session)."""
    home = make_home("opap-")
    try:
        with approvals_host(home, tmp_path_factory.mktemp("approvals")) as running:
            yield running
    finally:
        remove_home(Path(home))


@pytest.fixture
def own_host(short_home, tmp_path):
    """A host of the test's own, which it kills or stops."""
    with approvals_host(short_home, tmp_path) as running:
        yield running


async def until_event(events: Any, kind: str, seen: list[dict[str, Any]]) -> dict[str, Any]:
    """Read `events` into `seen` until one of type `kind`; that one."""
    async for event in events:
        seen.append(event)
        if event["type"] == kind:
            return event
    raise AssertionError(f"no {kind}: {[e['type'] for e in seen]}")


def test_ask_then_approve_runs_it_and_both_viewers_see_the_first_decision(host):
    async def main() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with Client.connect(Path(host)) as a, Client.connect(Path(host)) as b:
            started = await a.start("#two go", agent="ops")
            mine, theirs = [], []
            ev_a = a.events(started.session, started.from_seq, stop_at="first")
            ev_b = b.events(started.session, started.from_seq, stop_at="first")
            asked = await until_event(ev_a, "APPROVAL_REQUESTED", mine)
            await until_event(ev_b, "APPROVAL_REQUESTED", theirs)
            data = asked["data"]
            assert (data["tool"], data["input"], data["rule"]) == \
                ("shell", {"command": "echo asked-ran"}, "shell")
            assert data["expires_at"] > asked["ts"] + 500
            # The allowed call of the same reply runs without waiting.
            end = await until_event(ev_a, "TOOL_END", mine)
            assert "ok-allowed" in end["data"]["output"]
            ack = await a.approve(started.session, [data["call_id"]])
            assert (ack.decided, ack.by) == ([data["call_id"]], "local")
            with pytest.raises(RemoteError, match="already decided by local"):
                await b.deny(started.session, [data["call_id"]])
            mine += [e async for e in ev_a]
            theirs += [e async for e in ev_b]
        return mine, theirs

    mine, theirs = asyncio.run(main())
    assert_one_run(mine, mine[0]["seq"])
    for events in (mine, theirs):
        decided = [e for e in events if e["type"] == "APPROVAL_DECIDED"]
        assert [(d["data"]["decision"], d["data"]["by"]) for d in decided] == \
            [("approve", "local")]
    outputs = [e["data"]["output"] for e in mine if e["type"] == "TOOL_END"]
    assert any("asked-ran" in o for o in outputs)
    assert mine[-1]["type"] == "DONE"


def test_deny_tells_the_model_and_the_run_goes_on(host):
    async def main() -> list[dict[str, Any]]:
        async with Client.connect(Path(host)) as client:
            started = await client.start("#one go", agent="ops")
            seen: list[dict[str, Any]] = []
            events = client.events(started.session, started.from_seq, stop_at="first")
            await until_event(events, "APPROVAL_REQUESTED", seen)
            await client.deny(started.session, all=True, reason="not on a Friday")
            seen += [e async for e in events]
            info = await client.inspect(started.session)
            result = info.history[2]["content"][0]
            assert result["is_error"] and "not on a Friday" in str(result["content"])
            return seen

    seen = asyncio.run(main())
    end = next(e for e in seen if e["type"] == "TOOL_END")
    assert end["data"]["is_error"] and "denied by local: not on a Friday" in end["data"]["output"]
    assert "asked-ran" not in end["data"]["output"]
    assert seen[-1]["type"] == "DONE" and seen[-1]["data"]["text"] == "finished"


def test_an_unanswered_call_is_denied_when_its_time_is_up(host):
    async def main() -> list[dict[str, Any]]:
        async with Client.connect(Path(host)) as client:
            started = await client.start("#one go", agent="quick")
            return [e async for e in client.events(started.session, started.from_seq,
                                                   stop_at="first")]

    seen = asyncio.run(main())
    decided = next(e for e in seen if e["type"] == "APPROVAL_DECIDED")["data"]
    assert (decided["decision"], decided["by"], decided["reason"]) == \
        ("deny", "timeout", "approval timed out")
    assert seen[-1]["type"] == "DONE"


def test_a_deny_rule_is_refused_and_bad_decisions_change_nothing(host):
    async def main() -> tuple[str, list[dict[str, Any]]]:
        async with Client.connect(Path(host)) as client:
            started = await client.start("#write go", agent="ops")
            seen = [e async for e in client.events(started.session, started.from_seq,
                                                   stop_at="first")]
            return started.session, seen

    sid, seen = asyncio.run(main())
    end = next(e for e in seen if e["type"] == "TOOL_END")["data"]
    assert end["is_error"] and end["output"] == \
        "write_file: denied by the permission rule 'write_file'"
    for args, line in (
        (("approve", "nope", "c1"), "no session 'nope'"),
        (("approve", sid, "c1"), f"no call c1 waits for approval in session {sid}"),
        (("deny", sid, "--all"), "no call waits for approval"),
        (("approve", sid), "name the calls to approve"),
    ):
        done = oploop(host, *args)
        assert done.returncode == 1, (args, done.stdout)
        assert line in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_pending_approval_survives_a_supervisor_sigkill(own_host):
    host = own_host
    async def main() -> list[dict[str, Any]]:
        async with Client.connect(Path(host)) as client:
            started = await client.start("#one go", agent="ops")
            seen: list[dict[str, Any]] = []
            events = client.events(started.session, started.from_seq, stop_at="first")
            asked = await until_event(events, "APPROVAL_REQUESTED", seen)
            killed = actor(host, "supervisor")["pid"]
            os.kill(killed, signal.SIGKILL)
            await until_event(events, "RESUMED", seen)
            # Still pending after RESUMED: the CLI approves it.
            done = await asyncio.to_thread(oploop, host, "approve", started.session,
                                           asked["data"]["call_id"])
            assert done.returncode == 0, done.stderr
            assert f"approved {asked['data']['call_id']}" in done.stdout
            seen += [e async for e in events]
            await until(lambda: actor(host, "supervisor")["state"] == "running",
                        what="the supervisor back")
            return seen

    seen = asyncio.run(main())
    kinds = [e["type"] for e in seen]
    assert kinds.count("APPROVAL_REQUESTED") == 1 and "APPROVAL_DECIDED" in kinds
    assert kinds.index("RESUMED") < kinds.index("APPROVAL_DECIDED")
    assert any("asked-ran" in e["data"].get("output", "") for e in seen
               if e["type"] == "TOOL_END")
    assert seen[-1]["type"] == "DONE"


def test_control_keys_decide_by_name_viewers_and_workers_may_not(short_home, tmp_path):
    from test_security import REFUSED_WITHIN_S, free_ports, issue

    from bus.endpoints import Endpoints
    from bus.errors import AccessDenied

    listen = f"tcp://127.0.0.1:{free_ports()}"
    (Path(short_home) / "oploop.toml").write_text(
        f'[network]\nlisten = "{listen}"\n' + CONFIG)
    with scripted_host(short_home, SCRIPTS, tmp_path, {"OPLOOP_EXECUTORS": "1"}) as home:
        laptop, tv = issue(home, "laptop", "control"), issue(home, "tv", "viewer")
        worker = issue(home, "w", "worker")

        async def main() -> list[dict[str, Any]]:
            async with Client.connect(Path(home)) as local:
                started = await local.start("#one go", agent="ops")
                seen: list[dict[str, Any]] = []
                events = local.events(started.session, started.from_seq, stop_at="first")
                asked = await until_event(events, "APPROVAL_REQUESTED", seen)
                call_id = asked["data"]["call_id"]
                async with Client.connect(endpoints=Endpoints.elsewhere(listen, tv)) as eyes:
                    with pytest.raises(AccessDenied):  # refused at the handshake
                        await eyes.approve(started.session, [call_id],
                                           timeout=REFUSED_WITHIN_S)
                as_worker = Client.connect(endpoints=Endpoints.elsewhere(listen, worker))
                async with as_worker as w:
                    with pytest.raises(RemoteError, match="a worker key may not approve"):
                        await w.approve(started.session, [call_id])
                async with Client.connect(endpoints=Endpoints.elsewhere(listen, laptop)) as c:
                    ack = await c.approve(started.session, [call_id])
                assert ack.by == "laptop"
                seen += [e async for e in events]
                return seen

        seen = asyncio.run(main())
    decided = [e["data"] for e in seen if e["type"] == "APPROVAL_DECIDED"]
    assert [(d["decision"], d["by"]) for d in decided] == [("approve", "laptop")]
    assert seen[-1]["type"] == "DONE"


def test_run_on_a_terminal_asks_and_always_adds_a_session_rule(host):
    from test_cli_edges import Terminal

    term = Terminal(host, "run", "--agent", "ops", "#two go")
    term.expect("approve? [y/N/a(lways for this session)]")
    assert "shell" in term.text() and "echo asked-ran" in term.text()
    os.write(term.master, b"a\n")
    term.expect("approved by local, always for shell in this session")
    assert term.finish() == 0, term.text()
    assert "finished" in term.text()
    sid = term.text().split("session ", 1)[1].split()[0]
    shown = oploop(host, "inspect", sid)
    assert "always_allow" in shown.stdout and "shell" in shown.stdout, shown.stdout


def test_without_a_terminal_nothing_is_asked_and_yes_approves_everything(host):
    import subprocess

    from hostkit import OPLOOP, events_of

    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env["OPLOOP_HOME"] = host
    yes = oploop(host, "run", "--json", "--yes", "--agent", "ops", "#one go")
    events = events_of(yes.stdout)
    assert yes.returncode == 0 and events[-1]["type"] == "DONE", yes.stderr
    decided = [e["data"] for e in events if e["type"] == "APPROVAL_DECIDED"]
    assert [(d["decision"], d["by"]) for d in decided] == [("approve", "local")]
    # --json and no terminal: the run waits for a decision from elsewhere.
    proc = subprocess.Popen([*OPLOOP, "run", "--json", "--agent", "ops", "#one go"], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            event = json.loads(line)
            if event["type"] == "APPROVAL_REQUESTED":
                break
        done = oploop(host, "deny", event["session"], "--all", "--reason", "by script")
        assert done.returncode == 0, done.stderr
        rest = [json.loads(line) for line in proc.stdout]
    finally:
        proc.wait(timeout=WAIT_S)
    assert proc.returncode == 0 and rest[-1]["type"] == "DONE"
    assert any(e["type"] == "APPROVAL_DECIDED" and e["data"]["reason"] == "by script"
               for e in rest)


def test_a_pending_approval_survives_a_host_down_and_up(own_host, tmp_path):
    host = own_host
    scenario = tmp_path / "scenario.json"
    env = {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}

    async def ask() -> tuple[str, str]:
        async with Client.connect(Path(host)) as client:
            started = await client.start("#one go", agent="ops")
            asked = await until_event(client.events(started.session, started.from_seq),
                                      "APPROVAL_REQUESTED", [])
            return started.session, asked["data"]["call_id"]

    sid, call_id = asyncio.run(ask())
    assert oploop(host, "down").returncode == 0
    # The next offline model starts its scripts afresh: after the tool, it answers.
    scenario.write_text(json.dumps({"scripts": {"one": [FINISHED]}}))
    up = oploop(host, "up", "--detach", env=env)
    assert up.returncode == 0, up.stderr

    async def approve() -> list[dict[str, Any]]:
        async with Client.connect(Path(host)) as client:
            info = await client.inspect(sid)
            assert info.summary["waiting_approval"] == [call_id]
            seen: list[dict[str, Any]] = []
            events = client.events(sid, 1, stop_at="first")
            await until_event(events, "RESUMED", seen)  # the run is this host's again
            ack = await client.approve(sid, all=True)
            assert ack.decided == [call_id]
            return seen + [e async for e in events]

    seen = asyncio.run(approve())
    kinds = [e["type"] for e in seen]
    assert kinds.index("RESUMED") < kinds.index("APPROVAL_DECIDED")
    assert any("asked-ran" in e["data"].get("output", "") for e in seen
               if e["type"] == "TOOL_END")
    assert seen[-1]["type"] == "DONE"


def test_watch_on_a_terminal_asks_about_a_call_still_waiting(host):
    from test_cli_edges import Terminal

    async def ask() -> str:
        async with Client.connect(Path(host)) as client:
            started = await client.start("#one go", agent="ops")
            await until_event(client.events(started.session, started.from_seq),
                              "APPROVAL_REQUESTED", [])
            return started.session

    sid = asyncio.run(ask())
    term = Terminal(host, "watch", "--until-idle", sid)
    term.expect("approve? [y/N/a(lways for this session)]")
    os.write(term.master, b"y\n")
    term.expect("approved by local")
    assert term.finish() == 0, term.text()
    assert "finished" in term.text()
