"""read_file, list_dir, write_file: happy paths and error paths in a tmp_path."""

import asyncio
import os
import stat
from pathlib import Path

import pytest

from actors.tools import BUILTIN, ToolContext, ToolOutcome, builtin, invoke

IS_ROOT = os.geteuid() == 0


def call(tmp_path: Path, name: str, **data: object) -> ToolOutcome:
    return asyncio.run(invoke(BUILTIN, name, data, ToolContext(cwd=tmp_path)))


def test_builtin_catalogue_matches_design() -> None:
    specs = {s.name: s for s in BUILTIN.specs()}
    assert list(specs) == ["read_file", "list_dir", "write_file", "shell"]
    expected = {
        "read_file": (("fs", "core"), False, True, ["path"], ["path"]),
        "list_dir": (("fs", "core"), False, True, ["path"], ["path"]),
        "write_file": (("fs",), True, False, ["path", "content"], ["path", "content"]),
        "shell": (("exec",), True, False, ["command", "timeout_s"], ["command"]),
    }
    for name, (tags, risky, core, props, required) in expected.items():
        spec = specs[name]
        assert (spec.tags, spec.risky, spec.core) == (tags, risky, core), name
        assert list(spec.input_schema["properties"]) == props, name
        assert spec.input_schema["required"] == required, name


# --- read_file -------------------------------------------------------------------


def test_read_file_relative_to_cwd(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("héllo\n", encoding="utf-8")
    assert call(tmp_path, "read_file", path="sub/a.txt") == ToolOutcome("héllo\n", False)


def test_read_file_absolute_path(tmp_path: Path) -> None:
    target = tmp_path / "a.txt"
    target.write_text("abs")
    assert call(Path("/"), "read_file", path=str(target)) == ToolOutcome("abs", False)


def test_read_file_replaces_bad_utf8(tmp_path: Path) -> None:
    (tmp_path / "b.bin").write_bytes(b"ok\xff\xfeend")
    assert call(tmp_path, "read_file", path="b.bin").output == "ok\ufffd\ufffdend"


def test_read_file_empty(tmp_path: Path) -> None:
    (tmp_path / "e").write_bytes(b"")
    assert call(tmp_path, "read_file", path="e") == ToolOutcome("(empty file)", False)


def test_read_file_truncates(tmp_path: Path) -> None:
    size = builtin.READ_CAP + 1234
    (tmp_path / "big").write_bytes(b"x" * size)
    out = call(tmp_path, "read_file", path="big")
    assert not out.is_error
    assert out.output == "x" * builtin.READ_CAP + "\n[truncated: 1234 bytes more]"


def test_read_file_exactly_cap_is_not_truncated(tmp_path: Path) -> None:
    (tmp_path / "cap").write_bytes(b"y" * builtin.READ_CAP)
    assert call(tmp_path, "read_file", path="cap").output == "y" * builtin.READ_CAP


def test_read_file_missing(tmp_path: Path) -> None:
    out = call(tmp_path, "read_file", path="nope.txt")
    assert out == ToolOutcome(f"read_file: {tmp_path}/nope.txt: No such file or directory", True)


def test_read_file_directory(tmp_path: Path) -> None:
    out = call(tmp_path, "read_file", path=".")
    assert out.is_error
    assert out.output == f"read_file: {tmp_path}: Is a directory (use list_dir)"


def test_read_file_fifo_does_not_block(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    out = call(tmp_path, "read_file", path="pipe")
    assert out == ToolOutcome(f"read_file: {tmp_path}/pipe: not a regular file", True)


def test_read_file_nul_in_path(tmp_path: Path) -> None:
    out = call(tmp_path, "read_file", path="a\0b")
    assert out.is_error
    assert "embedded null byte" in out.output


@pytest.mark.skipif(IS_ROOT, reason="root reads files whatever their mode")
def test_read_file_permission_denied(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_text("s")
    target.chmod(0)
    out = call(tmp_path, "read_file", path="secret")
    assert out == ToolOutcome(f"read_file: {target}: Permission denied", True)


def test_read_file_missing_path_key(tmp_path: Path) -> None:
    out = call(tmp_path, "read_file")
    assert out == ToolOutcome("read_file: 'path': field required", True)


# --- list_dir --------------------------------------------------------------------


def test_list_dir_marks_and_sorts(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("")
    (tmp_path / "a_dir").mkdir()
    (tmp_path / "c_link").symlink_to(tmp_path / "b.txt")
    (tmp_path / "d_dirlink").symlink_to(tmp_path / "a_dir")
    (tmp_path / ".hidden").write_text("")
    out = call(tmp_path, "list_dir", path=".")
    assert out == ToolOutcome(".hidden\na_dir/\nb.txt\nc_link@\nd_dirlink@", False)


def test_list_dir_shows_undecodable_and_control_names_readably(tmp_path: Path) -> None:
    # A name that is not UTF-8 (any cloned repository can hold one) and one with a
    # newline: the listing stays encodable, and one line per entry.
    os.mkdir(os.path.join(os.fsencode(tmp_path), b"caf\xe9"))
    (tmp_path / "two\nlines").write_text("")
    (tmp_path / "ok.txt").write_text("")
    out = call(tmp_path, "list_dir", path=".")
    assert out == ToolOutcome("caf\\xe9/\nok.txt\ntwo\\nlines", False)
    out.output.encode("utf-8")  # strict: no surrogate left in it


@pytest.mark.parametrize(("raw", "shown"), [
    (b"a\xffb", "a\\xffb"),
    ("a\udcffb", "a\\xffb"),  # the same name as os.listdir gives it (surrogate escape)
    ("caf\u00e9", "caf\u00e9"),
    ("tab\there", "tab\\there"),
    ("esc\x1b[31m", "esc\\x1b[31m"),
    ("zero\u200bwidth", "zero\\u200bwidth"),
    ("\ud800", "\\xed\\xa0\\x80"),  # a lone surrogate no file system gives: its bytes
])
def test_shown_name(raw: str | bytes, shown: str) -> None:
    assert builtin.shown_name(raw) == shown


def test_list_dir_empty(tmp_path: Path) -> None:
    assert call(tmp_path, "list_dir", path=".") == ToolOutcome("(empty directory)", False)


def test_list_dir_caps_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builtin, "LIST_CAP", 3)
    for i in range(5):
        (tmp_path / f"f{i}").write_text("")
    out = call(tmp_path, "list_dir", path=str(tmp_path))
    assert out == ToolOutcome("f0\nf1\nf2\n[truncated: 2 more entries]", False)


def test_list_dir_missing(tmp_path: Path) -> None:
    out = call(tmp_path, "list_dir", path="gone")
    assert out == ToolOutcome(f"list_dir: {tmp_path}/gone: No such file or directory", True)


def test_list_dir_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    out = call(tmp_path, "list_dir", path="f")
    assert out == ToolOutcome(f"list_dir: {tmp_path}/f: Not a directory", True)


@pytest.mark.skipif(IS_ROOT, reason="root lists directories whatever their mode")
def test_list_dir_permission_denied(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        out = call(tmp_path, "list_dir", path="locked")
    finally:
        locked.chmod(0o700)
    assert out == ToolOutcome(f"list_dir: {locked}: Permission denied", True)


# --- write_file ------------------------------------------------------------------


def leftovers(directory: Path) -> list[str]:
    return [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


def test_write_file_creates_parents(tmp_path: Path) -> None:
    out = call(tmp_path, "write_file", path="x/y/z.txt", content="héllo")
    target = tmp_path / "x" / "y" / "z.txt"
    assert out == ToolOutcome(f"wrote 6 bytes to {target}", False)
    assert target.read_text(encoding="utf-8") == "héllo"
    assert leftovers(target.parent) == []


def test_write_file_default_mode_follows_umask(tmp_path: Path) -> None:
    call(tmp_path, "write_file", path="new", content="")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o666 & ~umask


def test_write_file_replaces_and_keeps_mode(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("old, longer content")
    script.chmod(0o751)
    assert not call(tmp_path, "write_file", path="run.sh", content="new").is_error
    assert script.read_text() == "new"
    assert stat.S_IMODE(script.stat().st_mode) == 0o751
    assert leftovers(tmp_path) == []


def test_write_file_through_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    (tmp_path / "link").symlink_to(real)
    call(tmp_path, "write_file", path="link", content="new")
    assert (tmp_path / "link").is_symlink()
    assert real.read_text() == "new"


def test_write_file_onto_directory_fails_cleanly(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    out = call(tmp_path, "write_file", path="d", content="x")
    assert out == ToolOutcome(f"write_file: {tmp_path}/d: Is a directory", True)
    assert leftovers(tmp_path) == []


def test_write_file_parent_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    out = call(tmp_path, "write_file", path="f/child", content="x")
    assert out.is_error
    assert out.output.startswith("write_file: ")


def test_write_file_missing_content(tmp_path: Path) -> None:
    out = call(tmp_path, "write_file", path="a")
    assert out == ToolOutcome("write_file: 'content': field required", True)
    assert not (tmp_path / "a").exists()


def test_private_directories_are_refused_however_they_are_reached(tmp_path: Path) -> None:
    home = tmp_path / "home"
    keys = home / "keys"
    keys.mkdir(parents=True)
    (keys / "client.key_secret").write_text("secret-key = 'x'\n")
    (home / "notes.txt").write_text("not private\n")
    work = tmp_path / "work"
    work.mkdir()
    (work / "link").symlink_to(keys / "client.key_secret")
    (work / "dirlink").symlink_to(keys)
    ctx = ToolContext(cwd=work, private=(keys.resolve(),))

    def run(name: str, path: str) -> ToolOutcome:
        return asyncio.run(invoke(BUILTIN, name, {"path": path}, ctx))

    for name, path in [("read_file", str(keys / "client.key_secret")),
                       ("read_file", "link"),
                       ("read_file", "../home/keys/client.key_secret"),
                       ("list_dir", str(keys)), ("list_dir", "dirlink")]:
        out = run(name, path)
        assert out.is_error and "oploop's own files" in out.output, (name, path, out)
        assert "secret-key" not in out.output
    assert run("read_file", str(home / "notes.txt")).output == "not private\n"
    assert "keys/" in run("list_dir", str(home)).output  # its name is no secret


def test_a_path_resolves_as_pathlib_says_kept_or_not(tmp_path, monkeypatch):
    ctx = ToolContext(cwd=tmp_path)
    for path in ("a/./b//c/", "/etc/../x", "rel", "/abs/p", ".", "a\x00b"):
        want = Path(path) if Path(path).is_absolute() else tmp_path / Path(path)
        assert builtin.resolve_path(ctx, path) == want
        assert builtin.resolve_path(ctx, path) == want  # (the second time from the cache)
    monkeypatch.setenv("HOME", str(tmp_path / "h1"))
    assert builtin.resolve_path(ctx, "~/f") == tmp_path / "h1" / "f"
    monkeypatch.setenv("HOME", str(tmp_path / "h2"))
    assert builtin.resolve_path(ctx, "~/f") == tmp_path / "h2" / "f"  # (never kept: $HOME moves)
