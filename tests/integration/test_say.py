"""Messages into a session (`oploop say`, `Client.say`), end to end with real processes:
a message said during a tool call reaches the very next model request (the offline
model acts on it), several queued arrive together in order, an idle session starts a
run on one, bad input is refused naming the problem with nothing changed, a viewer key
cannot say anything, and a message accepted survives a supervisor SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from homes import make_home
from hostkit import (
    WAIT_S,
    actor,
    assert_one_run,
    of_type,
    processes_with,
    running_host,
    unique_mark,
    until,
    workspace,
)
from hostkit import oploop as kit_oploop
from test_security import free_ports, issue, remote

from actors.sandbox.workspaces import remove_home
from actors.supervisor.runs import MAX_SAID
from bus.client import Client
from bus.errors import AccessDenied, RemoteError

MARK = unique_mark()
LIMIT = 2000  # limits.max_prompt_chars of this module's host


def shell(command: str) -> dict:
    return {"type": "tool_use", "name": "shell", "input": {"command": command}}


SCRIPTS = {
    # A tool that waits for the test's "go"; then the rules answer (and heed what was said).
    "wait": [{"reply": [shell("touch started; until [ -e go ]; do sleep 0.01; done; "
                              "echo finished")]}, "rules", "rules"],
    # A tool that runs until killed; then the rules.
    "hang": [{"reply": [shell(f"touch started; exec sleep {MARK}0")]}, "rules", "rules"],
}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """One host for the module: TCP with CURVE (for the key tests), the scripts, and a
    small prompt limit."""
    home = make_home("ops-")
    files = tmp_path_factory.mktemp("say")
    (files / "scenario.json").write_text(json.dumps({"scripts": SCRIPTS}))
    listen = f"tcp://127.0.0.1:{free_ports()}"
    Path(home, "oploop.toml").write_text(
        f'[network]\nlisten = "{listen}"\n\n[limits]\nmax_prompt_chars = {LIMIT}\n')
    try:
        with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(files / "scenario.json"),
                                 "OPLOOP_EXECUTORS": "1"}) as h:
            yield h, listen
    finally:
        remove_home(Path(home))


def oploop(home: str, *args: str, input_text: str | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI against `home`, with `input_text` on its standard input (none: empty)."""
    return kit_oploop(home, *args, env=env, input_text=input_text or "")


async def until_started(home: str, session: str) -> None:
    work = workspace(home, session)
    await until(lambda: (work / "started").exists(), what="the tool to start")


async def collect(client: Client, session: str, from_seq: int) -> list[dict]:
    return [e async for e in client.events(session, from_seq, stop_at="first")]


def test_messages_said_during_a_tool_call_reach_the_next_model_call_together(host, tmp_path):
    home, _ = host

    async def scenario():
        async with Client.connect(Path(home)) as client:
            started = await client.start("#wait go", cwd=str(tmp_path))
            await until_started(home, started.session)
            first = await client.say(started.session, "run `echo heard-one`")
            second = await client.say(started.session, "and a second note")
            assert (first.state, second.state) == ("queued", "queued")
            assert first.run == 1
            (workspace(home, started.session) / "go").touch()
            events = await collect(client, started.session, started.from_seq)
            return events, await client.inspect(started.session)

    events, info = asyncio.run(scenario())
    assert_one_run(events)
    kinds = [e["type"] for e in events]
    said = of_type(events, "USER_MESSAGE")
    assert [e["data"] for e in said] == [{"text": "run `echo heard-one`", "by": "local"},
                                         {"text": "and a second note", "by": "local"}]
    # Together, after the tool's result, before the next model call.
    at = kinds.index("USER_MESSAGE")
    assert kinds[at - 2:at + 3] == ["TOOL_END", "TURN_END", "USER_MESSAGE", "USER_MESSAGE",
                                    "TURN_START"]
    assert said[0]["turn"] == said[1]["turn"] == 2
    # The model's next request held it: the offline model ran what was said, at turn 2.
    (heard,) = [e for e in of_type(events, "TOOL_START") if e["turn"] == 2]
    assert heard["data"]["input"] == {"command": "echo heard-one"}
    assert events[-1]["type"] == "DONE"
    # One user turn: the result, then the texts (a history the API accepts).
    turn = info.history[2]
    assert turn["role"] == "user"
    assert [b["type"] for b in turn["content"]] == ["tool_result", "text", "text"]


def test_say_to_an_idle_session_starts_a_run_on_it(host, tmp_path):
    home, _ = host

    async def first_run():
        async with Client.connect(Path(home)) as client:
            started = await client.start("run `echo one`", cwd=str(tmp_path))
            await collect(client, started.session, started.from_seq)
            return started.session

    sid = asyncio.run(first_run())
    out = oploop(home, "say", sid, "-", input_text="run `echo two`")
    assert out.returncode == 0, out.stderr
    assert f"session {sid} was idle: run 2 started" in out.stdout

    async def second_run():
        async with Client.connect(Path(home)) as client:
            return [e async for e in client.events(sid, 1, stop_at="last")]

    events = asyncio.run(second_run())
    starts = of_type(events, "SESSION_START")
    assert [s["data"]["prompt"] for s in starts] == ["run `echo one`", "run `echo two`"]
    assert events[-1]["type"] == "DONE"
    assert of_type(events, "TOOL_START")[-1]["data"]["input"] == {"command": "echo two"}


def test_bad_says_are_refused_naming_the_problem_and_change_nothing(host, tmp_path):
    home, _ = host

    async def idle_session():
        async with Client.connect(Path(home)) as client:
            started = await client.start("run `echo x`", cwd=str(tmp_path))
            await collect(client, started.session, started.from_seq)
            return started.session, await client.last_seq(started.session)

    sid, last = asyncio.run(idle_session())
    cases = [
        (("say", "0" * 12, "hello"), None, "0" * 12),
        (("say", sid, "   "), None, "empty"),
        (("say", sid, "-"), "x" * (LIMIT + 1), f"limit of {LIMIT} (limits.max_prompt_chars)"),
    ]
    for args, stdin, expect in cases:
        out = oploop(home, *args, input_text=stdin)
        assert out.returncode != 0, out
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and expect in lines[0], out.stderr
    assert asyncio.run(_last_seq(home, sid)) == last  # nothing happened to the session


async def _last_seq(home: str, sid: str) -> int | None:
    async with Client.connect(Path(home)) as client:
        info = await client.inspect(sid)
        return int(info.summary["last_seq"])


def test_messages_waiting_for_one_boundary_are_bounded(host, tmp_path):
    home, _ = host

    async def scenario():
        async with Client.connect(Path(home)) as client:
            started = await client.start("#wait go", cwd=str(tmp_path))
            await until_started(home, started.session)
            queued = [f"n{i}" for i in range(MAX_SAID - 2)]
            for text in queued:
                await client.say(started.session, text)
            room = LIMIT - sum(map(len, queued))
            with pytest.raises(RemoteError, match=f"{LIMIT} chars in all"):
                await client.say(started.session, "y" * (room + 1))  # the queue's total
            for text in ("last", "y" * (room - 4)):  # exactly full
                await client.say(started.session, text)
                queued.append(text)
            with pytest.raises(RemoteError, match=f"at most {MAX_SAID}"):
                await client.say(started.session, "one too many")
            (workspace(home, started.session) / "go").touch()
            return queued, await collect(client, started.session, started.from_seq)

    queued, events = asyncio.run(scenario())
    said = [e["data"]["text"] for e in of_type(events, "USER_MESSAGE")]
    assert said == queued
    assert events[-1]["type"] == "DONE"


def test_keys_say_by_name_a_viewer_is_refused(host, tmp_path):
    home, listen = host
    laptop = issue(home, "saylaptop", "control")
    tv = issue(home, "saytv", "viewer")
    worker = issue(home, "sayw", "worker")

    async def scenario():
        async with Client.connect(Path(home)) as local:
            started = await local.start("#wait go", cwd=str(tmp_path))
            await until_started(home, started.session)
            async with Client.connect(endpoints=remote(listen, tv)) as viewer:
                with pytest.raises(AccessDenied):
                    await viewer.say(started.session, "let me in", timeout=WAIT_S)
            async with Client.connect(endpoints=remote(listen, worker)) as as_worker:
                with pytest.raises(RemoteError, match="only a control key"):
                    await as_worker.say(started.session, "me neither", timeout=WAIT_S)
            async with Client.connect(endpoints=remote(listen, laptop)) as control:
                ack = await control.say(started.session, "from the laptop", timeout=WAIT_S)
                assert ack.state == "queued"
            (workspace(home, started.session) / "go").touch()
            return await collect(local, started.session, started.from_seq)

    events = asyncio.run(scenario())
    assert [e["data"] for e in of_type(events, "USER_MESSAGE")] == [
        {"text": "from the laptop", "by": "saylaptop"}]  # the key's name, as approvals say
    # The CLI with a viewer's key: one line saying why, non-zero, nothing said.
    env = {"OPLOOP_CONNECT": listen, "OPLOOP_KEYS": str(tv)}
    out = oploop(str(Path(home) / "elsewhere"), "say", events[0]["session"], "hello",
                 env=env)
    assert out.returncode == 1, out
    (line,) = out.stderr.strip().splitlines()
    assert "refused this key" in line and "needs a control key" in line, line


def test_a_message_accepted_survives_a_supervisor_sigkill(host, tmp_path):
    home, _ = host

    async def scenario():
        async with Client.connect(Path(home)) as client:
            started = await client.start("#hang go", cwd=str(tmp_path))
            await until_started(home, started.session)
            ack = await client.say(started.session, "run `echo after-restart`")
            assert ack.state == "queued"  # acknowledged: journaled
            killed = actor(home, "supervisor")["pid"]
            os.kill(killed, signal.SIGKILL)
            await until(lambda: actor(home, "supervisor")["pid"] not in (None, killed)
                        and actor(home, "supervisor")["state"] == "running",
                        what="the supervisor restarted")
            # End the hung tool now (its executor reports how it ended to the resumed
            # run), rather than wait out the tool's timeout: the message goes in next.
            for pid in processes_with(MARK):
                os.kill(pid, signal.SIGKILL)
            return await collect(client, started.session, started.from_seq)

    events = asyncio.run(scenario())
    assert_one_run(events)
    kinds = [e["type"] for e in events]
    assert "RESUMED" in kinds and kinds.count("USER_MESSAGE") == 1
    assert kinds.index("RESUMED") < kinds.index("USER_MESSAGE")
    assert of_type(events, "USER_MESSAGE")[0]["data"]["text"] == "run `echo after-restart`"
    (heard,) = [e for e in of_type(events, "TOOL_START") if e["turn"] == 2]
    assert heard["data"]["input"] == {"command": "echo after-restart"}
    assert events[-1]["type"] == "DONE"
    asyncio.run(until(lambda: not processes_with(MARK), what="the abandoned tool to die"))
