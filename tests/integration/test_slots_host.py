"""No job loses its slot, on a real host (issue 15 item 2): one executor (32 slots),
every slot filled with each failure kind a model can cause, then a normal call runs.

The kinds: `list_dir` of a directory whose names are not UTF-8 (once unencodable:
the reply was dropped, the slot never freed), a `write_file` over the frame limit
(the llm caller cannot send the model's reply), one under it but too large for the
session's next request, and one that fits.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from hostkit import of_type, run_events, scripted_host

from actors.executor.actor import SLOTS  # one executor's capacity
from actors.llm_caller.actor import MAX_MODEL_REPLY_BYTES
from bus.client import Client
from bus.codec import MAX_FRAME_BYTES

OK = {"reply": "carried on", "stop_reason": "end_turn"}


def list_dirs(path: str, count: int) -> dict[str, Any]:
    return {"reply": [{"type": "tool_use", "name": "list_dir", "input": {"path": path}}
                      for _ in range(count)]}


def write(size: int) -> dict[str, Any]:
    return {"reply": [{"type": "tool_use", "name": "write_file",
                       "input": {"path": "big.txt", "content": "x" * size}}]}


@pytest.fixture
def odd_dir(tmp_path: Path) -> Path:
    os.chmod(tmp_path, 0o755)  # list_dir lists as the tool uid: what others may read
    odd = tmp_path / "odd"
    odd.mkdir()
    for raw in (b"caf\xe9", b"\xff\xfe", b"new\nline"):
        (odd / os.fsdecode(raw)).write_text("")
    return odd


async def counters(home: str) -> dict[str, Any]:
    async with Client.connect(Path(home)) as client:
        return await client.stats()


def assert_no_job_held(home: str) -> None:
    stats = asyncio.run(counters(home))
    assert stats["jobs_inflight"] == 0 and stats["jobs_aborting"] == 0, stats
    assert sum(stats["jobs_waiting"].values()) == 0, stats


def test_every_slot_filled_with_each_failure_kind_then_a_normal_call_runs(
        short_home, tmp_path, odd_dir) -> None:
    scripts = {
        "names": [list_dirs(str(odd_dir), SLOTS + 4), OK],
        "over": [write(MAX_FRAME_BYTES + 1024), OK],
        "under": [write(MAX_FRAME_BYTES - 4096), OK],
        "big": [write(MAX_MODEL_REPLY_BYTES - 4096), OK],
    }
    # The frame's bounds, not the context window's: a model (and an agent) with a window
    # that holds an 8 MB tool input (the window's own handling: test_compaction.py).
    Path(short_home, "oploop.toml").write_text("[agents.default]\ncontext_window = 20000000\n")
    with scripted_host(short_home, scripts, tmp_path, {
            "OPLOOP_EXECUTORS": "1", "OPLOOP_OFFLINE_CONTEXT": "20000000"}) as home:
        events = asyncio.run(run_events(home, "#names list it", cwd=str(tmp_path)))
        results = of_type(events, "TOOL_END")
        assert len(results) == SLOTS + 4, sorted({e["type"] for e in events})
        for result in results:
            assert result["data"]["output"] == "caf\\xe9\nnew\\nline\n\\xff\\xfe", result
        assert events[-1]["type"] == "DONE"
        assert_no_job_held(home)

        # Over the limit: the llm caller cannot send the model's reply; it says so in
        # its place, the run ends with that error, and the session goes on.
        events = asyncio.run(run_events(home, "#over write it", cwd=str(tmp_path)))
        assert events[-1]["type"] == "ERROR", events[-1]
        assert events[-1]["data"]["error"] == "oversize"
        assert "llm_result reply cannot be sent" in events[-1]["data"]["message"]
        assert_no_job_held(home)
        again = asyncio.run(run_events(home, "go on", session=events[0]["session"]))
        assert again[-1]["type"] == "DONE" and again[-1]["data"]["text"] == "carried on"

        # Under the frame limit but over half of it: the reply would fit, but with what
        # follows it not the session's next request: refused the same way, before it
        # enters the history, and the session goes on.
        events = asyncio.run(run_events(home, "#under write it", cwd=str(tmp_path)))
        assert events[-1]["type"] == "ERROR", events[-1]
        assert events[-1]["data"]["error"] == "oversize"
        assert f"> {MAX_MODEL_REPLY_BYTES}" in events[-1]["data"]["message"]
        assert_no_job_held(home)
        again = asyncio.run(run_events(home, "go on", session=events[0]["session"]))
        assert again[-1]["type"] == "DONE" and again[-1]["data"]["text"] == "carried on"

        # Below that: written, and the session's next model call fits.
        events = asyncio.run(run_events(home, "#big write it", cwd=str(tmp_path)))
        assert events[-1]["type"] == "DONE", events[-1]
        assert of_type(events, "TOOL_END")[0]["data"]["output"].startswith(
            f"wrote {MAX_MODEL_REPLY_BYTES - 4096} bytes")
        assert_no_job_held(home)

        events = asyncio.run(run_events(home, "run `echo still serving`"))
        assert events[-1]["type"] == "DONE"
        assert "still serving" in of_type(events, "TOOL_END")[0]["data"]["output"]
