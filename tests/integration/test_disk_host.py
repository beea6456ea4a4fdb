"""A full workspace ends the offending call, never the host (issue 15 item 4): a real
host whose sessions have a 16 MB workspace quota; a model's shell writes until
ENOSPC while another session works; the workspace outlives the host."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import psutil
import pytest
from hostkit import host_pids, of_type, oploop, run, run_events, scripted_host, workspace

from actors.sandbox.workspaces import IMAGES_DIR, release_all

FILL = "i=0; while dd if=/dev/zero of=f$i bs=1M count=4 2>&1; do i=$((i+1)); done; exit 1"
OK = {"reply": "carried on", "stop_reason": "end_turn"}


def shell(command: str) -> dict[str, object]:
    return {"reply": [{"type": "tool_use", "name": "shell", "input": {"command": command}}]}


SCRIPTS = {
    "fill": [shell(FILL), OK, shell("rm -f f*; echo fine > g && cat g"), OK],
    "other": [shell("echo other session fine"), OK],
}


def test_a_shell_filling_its_workspace_fails_alone_and_the_host_goes_on(
        short_home, tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a loop-mounted workspace quota needs root")
    Path(short_home, "sandbox.toml").write_text("[workspaces]\nsize_mb = 16\n")
    with scripted_host(short_home, SCRIPTS, tmp_path) as home:
        async def both() -> tuple[list[dict[str, object]], list[dict[str, object]]]:
            return await asyncio.gather(run_events(home, "#fill the disk"),
                                        run_events(home, "#other work"))

        filled, other = asyncio.run(both())
        end = of_type(filled, "TOOL_END")[0]["data"]
        assert end["is_error"] and "No space left on device" in end["output"], end
        assert filled[-1]["type"] == "DONE"  # the model was told; the run went on
        assert of_type(other, "TOOL_END")[0]["data"]["output"] == "other session fine\n"

        sid = filled[0]["session"]
        assert os.path.ismount(workspace(home, sid))
        image = Path(home) / "workspaces" / IMAGES_DIR / f"{sid}.img"
        assert image.stat().st_blocks * 512 <= 16 * 1024 * 1024

        again = asyncio.run(run_events(home, "now tidy up", session=sid))
        assert of_type(again, "TOOL_END")[0]["data"]["output"] == "fine\n"
        assert again[-1]["type"] == "DONE"
    # The session's files outlive the host, where they were.
    assert (workspace(short_home, sid) / "g").read_text() == "fine\n"
    assert release_all(Path(short_home)) == 2  # (what removing the home does)
    assert image.exists() and not os.path.ismount(workspace(short_home, sid))



def test_down_unmount_lets_the_home_go_and_the_next_call_mounts_again(
        short_home, tmp_path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a loop-mounted workspace quota needs root")
    scripts = {"keep": [shell("echo kept > k"), OK]}
    with scripted_host(short_home, scripts, tmp_path) as home:
        sid = run(home, "#keep a file")[0]["session"]
        assert os.path.ismount(workspace(home, sid))
    down = oploop(short_home, "down", "--unmount")  # no host left: what is mounted goes
    assert down.returncode == 0 and "1 workspace(s) unmounted" in down.stdout, down
    assert not os.path.ismount(workspace(short_home, sid))

    # Up again: the session's next call mounts its image again, with its file. (A new
    # offline model plays the session's script from its first turn: a new script.)
    scenario = tmp_path / "again.json"
    scenario.write_text(json.dumps({"scripts": {"keep": [shell("cat k"), OK]}}))
    env = {"OPLOOP_OFFLINE_SCENARIO": str(scenario)}
    up = oploop(short_home, "up", "--detach", env=env)
    assert up.returncode == 0, up.stderr
    pids = host_pids(short_home)
    try:
        again = run(short_home, "show it", session=sid)
        assert of_type(again, "TOOL_END")[0]["data"]["output"] == "kept\n"
    finally:
        down = oploop(short_home, "down", "--unmount")  # a running host: stopped, then this
    assert down.returncode == 0 and "host stopped" in down.stdout, down
    assert "1 workspace(s) unmounted" in down.stdout, down
    assert not [p for p in pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not os.path.ismount(workspace(short_home, sid))
    shutil.rmtree(short_home)  # what `rm -r $OPLOOP_HOME` does: nothing is busy
    assert not Path(short_home).exists()
