"""One working directory, full stack: `oploop run` in a user's project directory, on a
host in the default mode (workspace-write), with the offline model's rules.

The project belongs to a user the test makes; the tools agree on relative paths
across calls and runs, what they create is that user's, and a directory that
cannot be a working directory is refused before the start, in one line.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostkit import oploop, running_host

from actors.sandbox import machine_layers

ENV = {"OPLOOP_LLM_BACKEND": "scripted", "OPLOOP_SANDBOX": "workspace-write"}


@pytest.fixture
def project() -> Iterator[tuple[Path, int]]:
    if os.geteuid() != 0:
        pytest.skip("makes a user: needs root")
    layers = machine_layers()
    for layer in ("landlock", "namespaces"):
        if layers[layer]:
            pytest.skip(f"needs {layer}: {layers[layer]}")
    name = f"oplw{secrets.token_hex(3)}"
    home = Path(tempfile.mkdtemp(prefix="oplw-", dir="/home"))
    subprocess.run(["useradd", "-M", "-d", str(home), name], check=True, capture_output=True)
    try:
        uid = int(subprocess.run(["id", "-u", name], check=True, capture_output=True,
                                 text=True).stdout)
        proj = home / "proj"
        proj.mkdir()
        (proj / "README.md").write_text("the project\n")
        for path in (home, proj, proj / "README.md"):
            os.chown(path, uid, uid)
        yield proj, uid
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


def _tools(out: str) -> list[dict[str, object]]:
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [e["data"] for e in events if e["type"] == "TOOL_END"]


def test_the_tools_work_in_the_directory_the_run_started_in(
        short_home: str, project: tuple[Path, int]) -> None:
    proj, uid = project
    with running_host(short_home, ENV):
        first = oploop(short_home, "run", "--json",
                       "write HELLO to notes.txt and run `pwd; ls`", env=ENV, cwd=proj)
        assert first.returncode == 0, first.stderr
        ends = _tools(first.stdout)
        assert all(not e["is_error"] for e in ends), ends
        shell = next(str(e["output"]) for e in ends if e["name"] == "shell")
        assert shell.splitlines()[0] == str(proj) and "README.md" in shell
        assert (proj / "notes.txt").read_text() == "HELLO"
        assert (proj / "notes.txt").stat().st_uid == uid  # the project owner's file
        session = json.loads(first.stdout.splitlines()[0])["session"]
        # A later run of the session, started elsewhere: the same files.
        second = oploop(short_home, "run", "--json", "--session", session,
                        "read notes.txt and run `cat notes.txt`", env=ENV, cwd="/")
        ends = _tools(second.stdout)
        assert [str(e["output"]).strip() for e in ends] == ["HELLO", "HELLO"], ends
        # --cwd chooses the directory; `/` or a system directory is refused, in one line.
        third = oploop(short_home, "run", "--json", "--cwd", str(proj), "list .", env=ENV)
        assert "notes.txt" in str(_tools(third.stdout)[0]["output"]).splitlines()
        for bad in ("/", "/etc", "/nonexistent", short_home):
            refused = oploop(short_home, "run", "--cwd", bad, "list .", env=ENV)
            assert refused.returncode != 0, refused
            assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
            assert "working directory" in refused.stderr
        status = oploop(short_home, "status", "--json", env=ENV)
        assert json.loads(status.stdout)["agents"]["default"]["sandbox"] == "workspace-write"


def test_a_remote_control_key_never_chooses_the_working_directory(
        short_home: str, project: tuple[Path, int]) -> None:
    """A path sent over TCP names a directory of the client's machine, where the tools
    would act as its owner: the run works in its scratch workspace instead, while the
    local user's start in the same directory works there."""
    import asyncio

    from ports import free_ports

    from bus.client import Client
    from bus.endpoints import Endpoints

    proj, _ = project
    listen = f"tcp://127.0.0.1:{free_ports()}"
    Path(short_home, "oploop.toml").write_text(f'[network]\nlisten = "{listen}"\n')
    with running_host(short_home, ENV):
        added = oploop(short_home, "keys", "add", "laptop", "--role", "control")
        assert added.returncode == 0, added.stderr
        laptop = Path(short_home) / "keys" / "issued" / "laptop"

        async def pwd(client: Client) -> str:
            started = await client.start("run `pwd`", cwd=str(proj))
            events = [e async for e in client.events(started.session, stop_at="first")]
            assert events[-1]["type"] == "DONE", events[-1]
            (end,) = [e["data"] for e in events if e["type"] == "TOOL_END"]
            assert not end["is_error"], end
            return str(end["output"]).strip()

        async def scenario() -> tuple[str, str]:
            async with Client.connect(endpoints=Endpoints.elsewhere(listen, laptop)) as far:
                remote = await pwd(far)
            async with Client.connect(Path(short_home)) as near:
                local = await pwd(near)
            return remote, local

        remote, local = asyncio.run(scenario())
        assert local == str(proj)
        assert remote != str(proj) and not remote.startswith(str(proj.parent)), remote
