"""Memory across sessions through a real host (issue 29 item 4): a session of one agent
writes a memory, a session of another agent with the same `memory` name reads it, the
model being the offline one over HTTP through the SDK, the commands run in the
sandbox; hostile paths, a planted symlink and a huge file are refused there."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from homes import make_home, remove_home
from hostkit import of_type, oploop, run, scripted_host
from mcpkit import DONE

from actors import memoryfs


def memory(call_id: str = "", **command: Any) -> dict[str, Any]:
    block = {"type": "tool_use", "name": "memory", "input": command}
    return {**block, "id": f"toolu_{call_id}"} if call_id else block


NOTE = "The deploy key lives in vault path ops/deploy; rotate it on Mondays."
HUGE = "x" * (memoryfs.FILE_MAX + 1000)
SCRIPTS = {
    "write": [{"reply": [memory(command="create", path="/memories/ops/notes.md",
                                file_text=NOTE + "\n")]},
              {"reply": [memory(command="str_replace", path="/memories/ops/notes.md",
                                old_str="Mondays", new_str="the first Monday")]},
              DONE],
    "read": [{"reply": [memory(command="view", path="/memories")]},
             {"reply": [memory(command="view", path="/memories/ops/notes.md")]},
             DONE],
    "hostile": [{"reply": [
        memory("up", command="create", path="/memories/../escaped.txt", file_text="pwned"),
        memory("upup", command="create", path="/memories/ops/../../../escaped.txt",
               file_text="pwned"),
        memory("etc", command="view", path="/etc/passwd"),
        memory("tmp", command="create", path="/tmp/escaped.txt", file_text="pwned"),
        memory("link", command="create", path="/memories/planted/escaped.txt",
               file_text="pwned"),
        memory("linkview", command="view", path="/memories/planted"),
        memory("huge", command="create", path="/memories/huge.txt", file_text=HUGE),
    ]}, DONE],
    "nomemory": [{"reply": [memory(command="view", path="/memories")]}, DONE],
}
CONFIG = """
[agents.writer]
memory = "team"

[agents.reader]
memory = "team"
# not a Claude 4 model: offered `memory` as an ordinary tool with a JSON schema
model = "claude-3-5-haiku-20241022"

[agents.plain]
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    home = make_home("opm-")
    (Path(home) / "oploop.toml").write_text(CONFIG)
    files = tmp_path_factory.mktemp("memory")
    try:
        with scripted_host(home, SCRIPTS, files) as running:
            yield running
    finally:
        remove_home(Path(home))


def results(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["data"] for e in of_type(events, "TOOL_END")]


def test_one_agent_writes_a_memory_that_another_agents_session_reads(host):
    wrote = run(host, "#write remember the deploy key", agent="writer")
    assert [r["is_error"] for r in results(wrote)] == [False, False], results(wrote)
    assert wrote[-1]["type"] == "DONE"
    folder = Path(host) / "memory" / "team"
    assert (folder / "ops" / "notes.md").read_text() == NOTE.replace(
        "Mondays", "the first Monday") + "\n"

    read = run(host, "#read what do you remember?", agent="reader")
    assert read[-1]["type"] == "DONE"
    assert read[0]["session"] != wrote[0]["session"]
    listing, content = (r["output"] for r in results(read))
    assert "/memories/ops/notes.md" in listing
    assert content.startswith("Here's the content of /memories/ops/notes.md with line numbers:")
    assert "     1\tThe deploy key lives in vault path ops/deploy; rotate it on the first " \
           "Monday." in content

    shown = oploop(host, "memory", "team", "ops/notes.md")
    assert shown.returncode == 0 and shown.stdout.startswith("The deploy key"), shown.stderr
    names = oploop(host, "memory")
    assert names.returncode == 0 and names.stdout.startswith("team\t"), names.stdout
    tree = oploop(host, "memory", "team")
    assert "/memories/ops/notes.md" in tree.stdout
    missing = oploop(host, "memory", "nosuch")
    assert missing.returncode == 1 and "no memory 'nosuch'" in missing.stderr


def test_hostile_paths_a_planted_link_and_a_huge_file_are_refused(host, tmp_path):
    folder = Path(host) / "memory" / "team"
    folder.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chmod(tmp_path, 0o755)
    os.chmod(outside, 0o777)  # writable by anyone: only the refusal keeps it clean
    (folder / "planted").symlink_to(outside)
    before = sorted(os.listdir(Path(host) / "memory"))

    events = run(host, "#hostile try to get out", agent="writer")
    outcomes = {r["tool_use_id"].removeprefix("toolu_"): r for r in results(events)}
    assert len(outcomes) == 7 and all(r["is_error"] for r in outcomes.values()), outcomes
    texts = {key: r["output"] for key, r in outcomes.items()}
    assert "would escape /memories" in texts["up"] and "would escape /memories" in texts["upup"]
    assert "must start with /memories" in texts["etc"]
    assert "must start with /memories" in texts["tmp"]
    assert "symbolic link" in texts["link"] and "symbolic link" in texts["linkview"]
    assert "nothing written" in texts["huge"]
    assert os.listdir(outside) == []
    assert sorted(os.listdir(Path(host) / "memory")) == before
    assert not (Path(host) / "escaped.txt").exists() and not Path("/tmp/escaped.txt").exists()
    assert not (folder / "huge.txt").exists()
    shown = oploop(host, "memory", "team", "planted")
    assert shown.returncode == 1 and "symbolic link" in shown.stderr
    (folder / "planted").unlink()


def test_an_agent_without_memory_is_not_offered_the_tool(host):
    events = run(host, "#nomemory look", agent="plain")
    (outcome,) = results(events)
    assert outcome["is_error"] and outcome["output"] == "tool memory is not available"
