"""Sessions longer than the model's context window (issue 29), through a real host whose
offline model enforces a 20k-token window and answers an oversized request as the API
does (400 "prompt is too long"), reached by the llm caller through the real SDK.

- an agent that does not know the window (today's code, or a model oploop has no
  window for) hits it: the 400 compacts and the call is tried again, the run finishes,
  and a follow-up works (on main the run ends ERROR and every follow-up fails alike);
- an agent with `context_window` compacts before it reaches the budget: no request
  over the window ever reaches the model, results are cleared, older turns summarised;
- a turn too large for the budget even compacted ends ERROR naming the sizes, and
  the session takes a follow-up after `oploop compact`;
- a supervisor killed with -9 after a compaction resumes from the log with that view.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import urllib.request
from pathlib import Path

import pytest
from homes import make_home
from hostkit import actor, assert_one_run, of_type, oploop, run, scripted_host, until

from actors.sandbox.workspaces import remove_home
from bus.client import Client

WINDOW = 20_000
#: One turn: some words of the model, and a shell call printing ~4 KB.
TEXT = "I am reading the next part of the numbers and taking notes on what they say. " * 20


def shell(command: str) -> dict:
    return {"type": "tool_use", "name": "shell", "input": {"command": command}}


def part(n: int) -> dict:
    return {"reply": [{"type": "text", "text": f"Part {n}. {TEXT}"},
                      shell(f"seq {1000 + n} {1800 + n}")]}


LONG = [part(n) for n in range(30)] + [{"reply": "all parts read", "stop_reason": "end_turn"}]
WIDE = [{"reply": [shell(f"head -c 30000 /dev/zero | tr '\\\\0' {c}") for c in "abc"]},
        {"reply": "done after all", "stop_reason": "end_turn"}]
SCRIPTS = {"long": LONG, "long2": LONG, "long3": LONG, "long4": LONG[:6], "wide": WIDE}

CONFIG = f"""
[agents.unaware]
max_turns = 60

[agents.small]
max_turns = 60
context_window = {WINDOW}
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    home = make_home("opc-")
    files = tmp_path_factory.mktemp("compact")
    (files / "oploop.toml").write_text(CONFIG)
    env = {"OPLOOP_CONFIG": str(files / "oploop.toml"), "OPLOOP_OFFLINE_CONTEXT": str(WINDOW)}
    try:
        with scripted_host(home, SCRIPTS, files, env) as running:
            yield running
    finally:
        remove_home(Path(home))


def offline_stats(home: str) -> dict:
    port = int((Path(home) / "run" / "offline.port").read_text())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/offline/stats") as answer:
        return json.loads(answer.read())


def follow_up(home: str, session: str, prompt: str) -> list[dict]:
    return run(home, prompt, session=session)


def test_a_session_past_the_window_recovers_from_the_400_and_finishes(host):
    refused = offline_stats(host)["too_long"]
    events = run(host, "#long read every part", agent="unaware")
    assert events[-1]["type"] == "DONE", events[-1]
    assert events[-1]["data"]["turns"] == 31
    compacted = [e["data"] for e in of_type(events, "COMPACTED")]
    assert compacted and all(c["by"] == "recovery" for c in compacted), compacted
    assert all(c["after_tokens"] < c["before_tokens"] for c in compacted), compacted
    # every refusal was followed by one compaction and one more try, never a loop
    assert offline_stats(host)["too_long"] - refused == len(compacted)
    again = follow_up(host, _sid(events), "and now sum them up")
    assert again[-1]["type"] == "DONE", again[-1]


def _sid(events: list[dict]) -> str:
    return events[0]["session"]


def test_a_budgeted_session_compacts_before_the_window_and_never_exceeds_it(host):
    refused = offline_stats(host)["too_long"]
    events = run(host, "#long2 read every part", agent="small")
    assert events[-1]["type"] == "DONE", events[-1]
    compacted = [e["data"] for e in of_type(events, "COMPACTED")]
    assert compacted and all(c["by"] == "budget" for c in compacted)
    assert sum(c["cleared_results"] for c in compacted) > 0
    assert sum(c["summarised_turns"] for c in compacted) > 0, compacted
    summary = next(c["summary"] for c in compacted if c["summary"])
    assert "Requests: #long2 read every part" in summary  # the offline summariser's
    assert all(c["after_tokens"] < 0.8 * WINDOW for c in compacted)
    # prompt caching goes on: the call after a compaction writes the new prefix, the
    # one after it reads it
    turn_ends = {e["turn"]: e["data"]["usage"] for e in of_type(events, "TURN_END")}
    for c in of_type(events, "COMPACTED"):
        after = turn_ends.get(c["turn"] + 1)
        if after is not None:
            assert after["cache_read_input_tokens"] > 0, (c["turn"], after)
    stats = offline_stats(host)
    assert stats["too_long"] == refused, "a request over the window reached the model"
    assert 0.5 * WINDOW < stats["largest_prompt"] <= WINDOW  # (it came close)


def test_a_turn_too_large_ends_naming_sizes_and_takes_a_follow_up_after_compact(host):
    events = run(host, "#wide three big files", agent="small")
    end = events[-1]
    assert end["type"] == "ERROR" and end["data"]["error"] == "context_full", end
    assert "tokens after compaction" in end["data"]["message"]
    assert "oploop compact" in end["data"]["message"]
    sid = _sid(events)
    done = oploop(host, "compact", sid, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "compacted" in done.stdout
    again = follow_up(host, sid, "go on")
    assert again[-1]["type"] == "DONE", again[-1]
    assert again[-1]["data"]["text"] == "done after all"
    watch = oploop(host, "watch", sid, "--no-follow")
    assert "⇣ compacted (local)" in watch.stdout, watch.stdout


def test_compact_on_an_unknown_or_empty_session_says_why(host):
    unknown = oploop(host, "compact", "nosuchsession")
    assert unknown.returncode != 0 and "nosuchsession" in unknown.stderr


async def run_killing_at_compaction(home: str, prompt: str, agent: str) -> list[dict]:
    """Run `prompt`, SIGKILL the supervisor as the first `COMPACTED` is seen (the view
    journaled, the next model call not yet made), follow the run to its end."""
    async with Client.connect(Path(home)) as client:
        started = await client.start(prompt, agent=agent)
        events, killed = [], None
        async for event in client.events(started.session, started.from_seq, stop_at="first"):
            events.append(event)
            if killed is None and event["type"] == "COMPACTED":
                killed = actor(home, "supervisor")["pid"]
                os.kill(killed, signal.SIGKILL)
        await until(lambda: actor(home, "supervisor")["pid"] not in (None, killed)
                    and actor(home, "supervisor")["state"] == "running",
                    what="the supervisor restarted")
    return events


def test_a_supervisor_killed_at_a_compaction_resumes_from_the_compacted_view(host):
    events = asyncio.run(run_killing_at_compaction(host, "#long3 read every part", "small"))
    assert_one_run(events)
    assert of_type(events, "RESUMED") and events[-1]["type"] == "DONE", events[-1]
    first = of_type(events, "COMPACTED")[0]
    after = events[events.index(first) + 1:]
    # resumed from the journaled view: the next compaction starts from it (its view
    # reaches further), none is redone from the beginning
    later = of_type(after, "COMPACTED")
    assert all(c["data"]["cleared"] >= first["data"]["cleared"] for c in later), later
    again = follow_up(host, _sid(events), "one more")
    assert again[-1]["type"] == "DONE"


def test_compact_while_running_compacts_before_the_next_model_call(host):
    async def main() -> list[dict]:
        async with Client.connect(Path(host)) as client:
            started = await client.start("#long4 read some parts", agent="small")
            events, ack = [], None
            async for event in client.events(started.session, started.from_seq,
                                             stop_at="first"):
                events.append(event)
                if ack is None and event["type"] == "TURN_START" and event["turn"] == 2:
                    ack = await client.compact(started.session)
                    assert ack.state == "queued"
        return events

    events = asyncio.run(main())
    assert events[-1]["type"] == "DONE"
    (done,) = of_type(events, "COMPACTED")
    assert done["data"]["by"] == "local" and done["turn"] in (2, 3)
