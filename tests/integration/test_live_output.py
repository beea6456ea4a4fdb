"""Live tool output end to end: `TOOL_OUTPUT {call_id, stream, text}` events while a
shell command runs (executor -> supervisor -> broadcaster -> viewers), its bound,
its streams, a cancel in the middle of it, and how `oploop run` shows it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from homes import make_home
from hostkit import assert_one_run, of_type, oploop, running_host, until, workspace

from actors.sandbox.workspaces import remove_home
from actors.tools.live import MAX_BATCHES, MAX_CHARS
from bus.client import Client


def shell(command: str) -> dict:
    return {"type": "tool_use", "name": "shell", "input": {"command": command}}


OK = {"reply": "seen", "stop_reason": "end_turn"}
SCRIPTS = {
    # Prints a line, then waits for a file the test makes only once it has seen that
    # line's event: the command cannot end before its output has reached a viewer.
    "live": [{"reply": [shell("echo first-line; until [ -e go ]; do sleep 0.01; done; "
                              "echo to-stderr >&2; echo last-line")]}, OK],
    # 400 KB at once, far over the live bound (and over the result's 64 KiB cap).
    "flood": [{"reply": [shell("yes 0123456789abcdef | head -c 400000")]}, OK],
    # Prints until cancelled.
    "ticker": [{"reply": [shell("while :; do echo tick; sleep 0.02; done")]}, OK],
    "both": [{"reply": [shell("echo out-line; echo err-line >&2")]}, OK],
}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    home = make_home("oplive-")
    files = tmp_path_factory.mktemp("live")
    (files / "scenario.json").write_text(json.dumps({"scripts": SCRIPTS}))
    try:
        with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(files / "scenario.json")}) as h:
            yield h
    finally:
        remove_home(Path(home))


async def collect(client, started, on_event=None):
    events = []
    async for event in client.events(started.session, started.from_seq, stop_at="first"):
        events.append(event)
        if on_event is not None:
            await on_event(event)
    return events


def outputs(events):
    return of_type(events, "TOOL_OUTPUT")


def test_output_reaches_a_viewer_before_the_tool_ends(host, tmp_path):
    async def scenario():
        async with Client.connect(Path(host)) as client:
            started = await client.start("#live go", cwd=str(tmp_path))

            async def on_event(event):
                if event["type"] == "TOOL_OUTPUT" and "first-line" in event["data"]["text"]:
                    (workspace(host, started.session) / "go").touch()

            return await collect(client, started, on_event)

    events = asyncio.run(scenario())
    assert_one_run(events)
    (start,) = of_type(events, "TOOL_START")
    (end,) = of_type(events, "TOOL_END")
    assert not end["data"]["is_error"], end["data"]["output"]
    live = outputs(events)
    call = start["data"]["tool_use_id"]
    assert all(e["data"]["call_id"] == call and "cut" not in e["data"] for e in live)
    # Between the call's start and its end, in order; the streams told apart.
    assert all(start["seq"] < e["seq"] < end["seq"] for e in live)
    text = {stream: "".join(e["data"]["text"] for e in live if e["data"]["stream"] == stream)
            for stream in ("stdout", "stderr")}
    assert text == {"stdout": "first-line\nlast-line\n", "stderr": "to-stderr\n"}
    # The result is the command's output as ever: both streams, the whole of it.
    assert sorted(end["data"]["output"].splitlines()) == ["first-line", "last-line",
                                                          "to-stderr"]


def test_live_output_is_bounded_per_call_and_the_result_unchanged(host, tmp_path):
    async def scenario():
        async with Client.connect(Path(host)) as client:
            started = await client.start("#flood go", cwd=str(tmp_path))
            return await collect(client, started)

    events = asyncio.run(scenario())
    assert_one_run(events)
    live = outputs(events)
    (end,) = of_type(events, "TOOL_END")
    # Exactly one marker, the last of the call's output, before its end.
    cut = [e for e in live if e["data"].get("cut")]
    assert cut == [live[-1]] and live[-1]["seq"] < end["seq"]
    assert "live output stops here" in cut[0]["data"]["text"]
    shown = "".join(e["data"]["text"] for e in live[:-1])
    assert len(shown) == MAX_CHARS and len(live) <= MAX_BATCHES + 1
    assert shown == ("0123456789abcdef\n" * (MAX_CHARS // 17 + 1))[:MAX_CHARS]
    # The result keeps its own bound: start and end, the middle counted.
    result = end["data"]["output"]
    assert result.startswith("0123456789abcdef\n") and "[truncated: " in result
    assert not end["data"]["is_error"]


def test_a_cancel_in_the_middle_of_the_output_stops_it(host, tmp_path):
    async def scenario():
        async with Client.connect(Path(host)) as client:
            started = await client.start("#ticker go", cwd=str(tmp_path))
            cancelled = False

            async def on_event(event):
                nonlocal cancelled
                if event["type"] == "TOOL_OUTPUT" and not cancelled:
                    cancelled = True
                    ack = await client.cancel(started.session)
                    assert ack.state == "cancelled"

            events = await collect(client, started, on_event)

            async def released():
                stats = await client.stats()
                return stats["jobs_inflight"] == 0 and stats["jobs_aborting"] == 0

            await until(released, what="the executor's acknowledgement")
            # Nothing of the cancelled call reached the log after its run ended.
            replay = [e async for e in client.events(started.session, 1, stop_at="first")]
            return events, replay

    events, replay = asyncio.run(scenario())
    assert_one_run(events)
    assert events[-1]["type"] == "CANCELLED"
    (end,) = of_type(events, "TOOL_END")
    assert end["data"]["output"] == "cancelled by the user"
    assert outputs(events) and all(e["seq"] < end["seq"] for e in outputs(events))
    assert replay == events


def test_run_shows_the_output_and_quiet_tools_hides_it(host, tmp_path):
    shown = oploop(host, "run", "#both go", cwd=tmp_path, env={"NO_COLOR": "1"})
    assert shown.returncode == 0, shown.stderr
    assert "  │ out-line\n" in shown.stdout and "  ! err-line\n" in shown.stdout
    hidden = oploop(host, "run", "--quiet-tools", "#both go", cwd=tmp_path)
    assert hidden.returncode == 0, hidden.stderr
    assert "│ out-line" not in hidden.stdout and "! err-line" not in hidden.stdout
    assert "✓ shell" in hidden.stdout
    as_json = oploop(host, "run", "--json", "--quiet-tools", "#both go", cwd=tmp_path)
    assert '"TOOL_OUTPUT"' not in as_json.stdout and '"TOOL_END"' in as_json.stdout
