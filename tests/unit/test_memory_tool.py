"""The memory tool's commands (actors/memoryfs.py), its input contract, its offer to
a model (native or ordinary) and the permission rules on its paths."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from actors import memoryfs, memorytool
from actors.config import Agent
from actors.core.catalogue import listing, resolve_tools
from actors.core.request import build_request
from actors.permissions import decide, parse_rules
from actors.tools import ToolContext, invoke
from actors.tools.memory import make_memory


def run(folder: Path, **command: object) -> tuple[bool, str]:
    return memoryfs.execute(str(folder), command)


def ok(folder: Path, **command: object) -> str:
    is_error, text = run(folder, **command)
    assert not is_error, text
    return text


def refused(folder: Path, **command: object) -> str:
    is_error, text = run(folder, **command)
    assert is_error, text
    return text


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    path = tmp_path / "memory" / "team"
    path.mkdir(parents=True)
    return path


def test_create_then_view_a_file_shows_numbered_lines(folder):
    assert ok(folder, command="create", path="/memories/notes.md",
              file_text="first\nsecond\n") == "File created successfully at: /memories/notes.md"
    assert (folder / "notes.md").read_text() == "first\nsecond\n"
    text = ok(folder, command="view", path="/memories/notes.md")
    assert text == ("Here's the content of /memories/notes.md with line numbers:\n"
                    "     1\tfirst\n     2\tsecond\n     3\t")
    part = ok(folder, command="view", path="/memories/notes.md", view_range=[2, -1])
    assert part.splitlines()[1:] == ["     2\tsecond", "     3\t"]


def test_view_a_directory_lists_two_levels_with_sizes_and_no_hidden_items(folder):
    ok(folder, command="create", path="/memories/a/b/c/deep.txt", file_text="x")
    ok(folder, command="create", path="/memories/top.txt", file_text="12345")
    (folder / ".hidden").write_text("no")
    text = ok(folder, command="view", path="/memories")
    lines = text.splitlines()
    assert lines[0] == ("Here're the files and directories up to 2 levels deep in /memories, "
                        "excluding hidden items:")
    names = [line.split("\t")[1] for line in lines[1:]]
    assert names == ["/memories", "/memories/a/", "/memories/a/b/", "/memories/top.txt"]
    assert lines[-1] == "5B\t/memories/top.txt"


def test_create_refuses_an_existing_file_and_makes_missing_directories(folder):
    ok(folder, command="create", path="/memories/x/y.txt", file_text="one")
    assert refused(folder, command="create", path="/memories/x/y.txt",
                   file_text="two") == "File /memories/x/y.txt already exists"
    assert (folder / "x" / "y.txt").read_text() == "one"


def test_str_replace_needs_exactly_one_match(folder):
    ok(folder, command="create", path="/memories/f", file_text="a\nb\na\nc\n")
    many = refused(folder, command="str_replace", path="/memories/f", old_str="a", new_str="z")
    assert many == ("No replacement was performed. Multiple occurrences of old_str `a` in "
                    "lines: 1, 3. Please ensure it is unique")
    none = refused(folder, command="str_replace", path="/memories/f", old_str="q", new_str="z")
    assert none == ("No replacement was performed, old_str `q` did not appear verbatim in "
                    "/memories/f.")
    text = ok(folder, command="str_replace", path="/memories/f", old_str="b", new_str="B")
    assert text.startswith("The memory file has been edited.")
    assert "     2\tB" in text
    assert (folder / "f").read_text() == "a\nB\na\nc\n"


def test_insert_at_a_line_within_range(folder):
    ok(folder, command="create", path="/memories/f", file_text="one\ntwo\n")
    assert ok(folder, command="insert", path="/memories/f", insert_line=0,
              insert_text="zero") == "The file /memories/f has been edited."
    ok(folder, command="insert", path="/memories/f", insert_line=3, insert_text="three\n")
    assert (folder / "f").read_text() == "zero\none\ntwo\nthree\n"
    assert refused(folder, command="insert", path="/memories/f", insert_line=9,
                   insert_text="x") == ("Invalid `insert_line` parameter: 9. It should be "
                                        "within the range [0, 4].")


def test_delete_and_rename(folder):
    ok(folder, command="create", path="/memories/d/f", file_text="x")
    assert ok(folder, command="rename", old_path="/memories/d/f",
              new_path="/memories/e/g") == "Successfully renamed /memories/d/f to /memories/e/g"
    assert (folder / "e" / "g").read_text() == "x"
    ok(folder, command="create", path="/memories/d/h", file_text="y")
    assert refused(folder, command="rename", old_path="/memories/d/h",
                   new_path="/memories/e/g") == "The destination /memories/e/g already exists"
    assert ok(folder, command="delete", path="/memories/e") == "Successfully deleted /memories/e"
    assert not (folder / "e").exists()
    assert refused(folder, command="delete", path="/memories") == \
        "Cannot delete the /memories directory itself"
    assert refused(folder, command="delete", path="/memories/nope") == \
        "The path /memories/nope does not exist"


@pytest.mark.parametrize("path", ["/memories/../outside", "/memories/a/../../outside",
                                  "/etc/passwd", "/memoriesX/f", "memories/f", "/tmp/x"])
def test_paths_out_of_the_folder_are_refused_and_nothing_outside_is_touched(folder, path):
    outside = folder.parent / "outside"
    text = refused(folder, command="create", path=path, file_text="pwned")
    assert "escape /memories" in text or "must start with /memories" in text
    assert not outside.exists()
    assert sorted(os.listdir(folder.parent)) == ["team"]


def test_a_symlink_planted_in_the_folder_is_refused(folder, tmp_path):
    secret_dir = tmp_path / "secret"
    secret_dir.mkdir()
    (secret_dir / "key").write_text("s3cret")
    (folder / "link").symlink_to(secret_dir)
    (folder / "filelink").symlink_to(secret_dir / "key")
    for command in ({"command": "view", "path": "/memories/link/key"},
                    {"command": "create", "path": "/memories/link/new", "file_text": "x"},
                    {"command": "view", "path": "/memories/filelink"},
                    {"command": "str_replace", "path": "/memories/filelink", "old_str": "s3",
                     "new_str": "xx"},
                    {"command": "delete", "path": "/memories/link"},
                    {"command": "rename", "old_path": "/memories/filelink",
                     "new_path": "/memories/stolen"}):
        is_error, text = memoryfs.execute(str(folder), command)
        assert is_error and "symbolic link" in text, (command, text)
    assert sorted(os.listdir(secret_dir)) == ["key"]
    assert (secret_dir / "key").read_text() == "s3cret"
    assert "link" not in ok(folder, command="view", path="/memories").split("excluding")[1]


def test_sizes_are_bounded(folder):
    huge = "x" * (memoryfs.FILE_MAX + 1)
    assert "nothing written" in refused(folder, command="create", path="/memories/big",
                                        file_text=huge)
    assert not (folder / "big").exists()
    (folder / "planted").write_bytes(b"y" * (memoryfs.FILE_MAX + 10))
    assert "not shown" in refused(folder, command="view", path="/memories/planted")
    # the folder in all: files just under the cap each, until the folder's cap
    chunk = "z" * memoryfs.FILE_MAX
    made = 0
    while True:
        is_error, text = run(folder, command="create", path=f"/memories/f{made}",
                             file_text=chunk)
        if is_error:
            break
        made += 1
    assert "MiB" in text and "nothing written" in text
    assert made < memoryfs.FOLDER_MAX // memoryfs.FILE_MAX


def test_the_tool_validates_its_input_and_needs_a_folder(folder):
    tool = make_memory()
    ctx = ToolContext(cwd=folder, memory=folder)

    def call(data: object, context: ToolContext = ctx) -> tuple[bool, str]:
        outcome = asyncio.run(invoke({"memory": tool}, "memory", data, context))
        return outcome.is_error, outcome.output

    assert call({"command": "create", "path": "/memories/a", "file_text": "hi"}) == \
        (False, "File created successfully at: /memories/a")
    assert call({"command": "launch"})[1].startswith("memory: 'command': expected one of")
    assert "valid integer" in call({"command": "insert", "path": "/memories/a",
                                    "insert_line": "1", "insert_text": "x"})[1]
    assert "unknown input key" in call({"command": "view", "path": "/memories", "x": 1})[1]
    is_error, text = call({"command": "view", "path": "/memories"},
                          ToolContext(cwd=folder))
    assert is_error and "no memory folder" in text


def test_native_form_for_claude_4_models_and_a_schema_otherwise():
    spec = make_memory().spec.to_wire()
    agent = Agent(memory="team")
    native = build_request(agent, [{"role": "user", "content": "hi"}], [spec],
                           session="s", cwd="/")
    assert native["tools"] == [{"type": "memory_20250818", "name": "memory"}]
    plain = build_request(Agent(memory="team", model="claude-3-5-haiku-20241022"),
                          [{"role": "user", "content": "hi"}], [spec], session="s", cwd="/")
    assert plain["tools"][0]["name"] == "memory"
    assert plain["tools"][0]["input_schema"] == memorytool.SCHEMA
    assert memorytool.native("claude-opus-4-1") and memorytool.native("claude-sonnet-4-20250514")
    assert not memorytool.native("claude-3-7-sonnet-latest") and not memorytool.native("gpt-4o")


def test_only_agents_with_a_memory_are_offered_it():
    specs = [make_memory().spec.to_wire(), {"name": "shell", "tags": ["exec"]}]
    assert [t["name"] for t in resolve_tools(specs, Agent(), 1)] == ["shell"]
    assert [t["name"] for t in resolve_tools(specs, Agent(memory="x"), 1)] == ["memory", "shell"]
    assert [t["name"] for t in listing(specs, Agent(), {}, {})] == ["shell"]
    assert [(t["name"], t["turn1"]) for t in listing(specs, Agent(memory="x"), {}, {})] == \
        [("memory", True), ("shell", True)]


def test_permission_rules_judge_the_memories_paths():
    rules = parse_rules({"memory(/memories/private/*)": "deny", "memory(/memories/*)": "ask",
                         "default": "allow"})
    assert decide(rules, "memory", {"command": "view", "path": "/memories/private/k"})[0] == "deny"
    assert decide(rules, "memory", {"command": "view",
                                    "path": "/memories/x/../private/k"})[0] == "deny"
    assert decide(rules, "memory", {"command": "rename", "old_path": "/memories/a",
                                    "new_path": "/memories/private/a"})[0] == "deny"
    assert decide(rules, "memory", {"command": "view", "path": "/memories/notes"})[0] == "ask"


def test_memory_names_are_checked():
    assert memorytool.folder_name_error("team-1") is None
    for bad in ("", "../x", "a/b", ".hidden", "x" * 65):
        assert memorytool.folder_name_error(bad) is not None


def test_the_offline_model_takes_either_form_and_refuses_a_malformed_one():
    from actors.offline_model.wire import InvalidRequest, validate_request

    base = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    spec = make_memory().spec.to_wire()
    for model in ("claude-sonnet-4-5", "claude-3-5-haiku-20241022"):
        tools = [memorytool.api_tool(spec, model)]
        assert validate_request({**base, "tools": tools})["tools"] == tools
    for bad, why in (({"type": "memory_20250818", "name": "notes"}, "named 'memory'"),
                     ({"type": "memory_20250818", "name": "memory", "input_schema": {}},
                      "Extra inputs"),
                     ({"type": "memory_20990101", "name": "memory"}, "unknown tool type"),
                     ({"name": "memory"}, "input_schema")):
        with pytest.raises(InvalidRequest, match=why):
            validate_request({**base, "tools": [bad]})


def test_text_that_is_not_utf8_is_refused(folder):
    assert "not valid UTF-8" in refused(folder, command="create", path="/memories/s",
                                        file_text="a\ud800b")
    assert not (folder / "s").exists()
