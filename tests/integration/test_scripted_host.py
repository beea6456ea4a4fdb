"""A host on the in-process scripted model, two llm callers: long sessions travel as
history deltas and come out whole."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from actors.core.history import is_valid
from bus.client import Client

OPLOOP = [sys.executable, "-m", "actors.cli"]


@pytest.fixture
def scripted_host(short_home, tmp_path):
    target = tmp_path / "note.txt"
    target.write_text("scripted hello\n")
    os.chmod(tmp_path, 0o755)  # read_file reads as the tool uid: what others may read
    call = {"type": "tool_use", "name": "read_file", "input": {"path": str(target)}}
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"reply": [call]}] * 25 + [{"reply": "finished"}]))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANTHROPIC_")}
    env.update(OPLOOP_HOME=short_home, OPLOOP_LLM_BACKEND="scripted",
               OPLOOP_LLM_SCRIPT=str(script), OPLOOP_LLM_CALLERS="2", OPLOOP_EXECUTORS="2")
    up = subprocess.run([*OPLOOP, "up", "--detach"], env=env, capture_output=True, text=True,
                        timeout=60, check=False)
    assert up.returncode == 0, up.stderr
    state = json.loads((Path(short_home) / "run" / "host.json").read_text())
    yield short_home, state
    down = subprocess.run([*OPLOOP, "down"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    assert down.returncode == 0, down.stderr
    pids = [state["pid"], *(a["pid"] for a in state["actors"])]
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]


def test_long_sessions_on_two_callers_keep_their_whole_history(scripted_host, tmp_path):
    home, state = scripted_host
    cwd = str(tmp_path)  # the note's folder: the confined read_file sees the session's cwd
    names = sorted(a["name"] for a in state["actors"])
    assert names == ["broadcaster", "executor-1", "executor-2", "llm-1", "llm-2", "supervisor"]

    async def main() -> None:
        async with Client.connect(Path(home)) as client:
            runs = [await client.start("read it, many times", max_turns=30, cwd=cwd)
                    for _ in range(3)]
            for run in runs:
                events = [e async for e in client.events(run.session, run.from_seq,
                                                         stop_at="first")]
                assert events[-1]["type"] == "DONE", events[-1]
                done = events[-1]["data"]
                assert (done["text"], done["turns"], done["stop"]) == ("finished", 26, "end_turn")
                ends = [e for e in events if e["type"] == "TOOL_END"]
                assert len(ends) == 25
                assert all("scripted hello" in e["data"]["output"] for e in ends)
                info = await client.inspect(run.session)
                assert len(info.history) == 52 and is_valid(info.history)
            # a follow-up plays the scenario again on top of the kept history
            more = await client.start("once more", session=runs[0].session, max_turns=30,
                                      cwd=cwd)
            events = client.events(more.session, more.from_seq, stop_at="first")
            last = [e async for e in events][-1]
            assert last["data"]["turns"] == 26
            assert len((await client.inspect(more.session)).history) == 104

    asyncio.run(main())
