"""A real host's confined reads: no API key anywhere a tool can read, and an agent's
`read_paths` carried from oploop.toml to the executor's sandbox."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from pathlib import Path

import psutil
import pytest
from hostkit import actor, of_type, run, running_host

from actors.sandbox import machine_layers


def tool_ends(events: list[dict[str, object]]) -> list[dict[str, object]]:
    """The data of every TOOL_END event."""
    return [e["data"] for e in of_type(events, "TOOL_END")]  # type: ignore[misc]


def test_executors_hold_no_api_key(short_home: str) -> None:
    key = f"sk-ant-canary-{secrets.token_hex(8)}"
    env = {"OPLOOP_LLM_BACKEND": "scripted", "ANTHROPIC_API_KEY": key}
    with running_host(short_home, env):
        executor = actor(short_home, "executor-1")["pid"]
        caller = actor(short_home, "llm-1")["pid"]
        state = json.loads((Path(short_home) / "run" / "host.json").read_text())
        # The llm callers hold it (so this test can fail); the executors do not.
        assert psutil.Process(caller).environ().get("ANTHROPIC_API_KEY") == key
        assert "ANTHROPIC_API_KEY" not in psutil.Process(executor).environ()
        for path in ("/proc/self/environ", f"/proc/{executor}/environ",
                     f"/proc/{caller}/environ", f"/proc/{state['pid']}/environ",
                     f"/proc/{executor}/root/proc/{caller}/environ"):
            events = run(short_home, f"read {path}")
            ends = tool_ends(events)
            assert [e["name"] for e in ends] == ["read_file"], ends
            assert key not in json.dumps(events), path
        ends = tool_ends(run(short_home, "read /etc/passwd"))
        assert not ends[0]["is_error"] and "root:" in str(ends[0]["output"]), ends


def test_agent_read_paths_reach_the_sandbox(short_home: str) -> None:
    layers = machine_layers()
    if layers["landlock"] or layers["namespaces"]:
        pytest.skip(f"needs Landlock and namespaces: {layers['landlock'] or layers['namespaces']}")
    token = secrets.token_hex(8)
    project = Path(tempfile.mkdtemp(prefix="oploop-proj-", dir="/tmp"))
    try:
        os.chmod(project, 0o755)
        (project / "notes.txt").write_text(token)
        os.chmod(project / "notes.txt", 0o644)
        (Path(short_home) / "oploop.toml").write_text(
            f'[agents.reader]\nread_paths = ["{project}"]\n'
        )
        env = {"OPLOOP_LLM_BACKEND": "scripted"}
        with running_host(short_home, env):
            prompt = f"read {project}/notes.txt"
            # The session's cwd is "/": only the agent's read_paths make the project visible.
            plain = tool_ends(run(short_home, prompt, cwd="/"))
            assert plain[0]["is_error"] and token not in str(plain[0]["output"]), plain
            reader = tool_ends(run(short_home, prompt, cwd="/", agent="reader"))
            assert not reader[0]["is_error"] and reader[0]["output"] == token, reader
    finally:
        shutil.rmtree(project)
