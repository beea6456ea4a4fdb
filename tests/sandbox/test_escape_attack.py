"""Adversarial: a second attack on every tool entry point (after issue 15).

Each case attacks as a hostile model would, asserts the attack fails, then that a
normal call still works. The holes this attack found are the first cases; the
strongest of the attacks the sandbox already held follow.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

from sbhelp import TEST_POLICY, Host, need
from test_escape_read import by_threads, call, rhost, still_reads

from actors.tools import Catalogue, ToolContext, invoke, make_write_file

__all__ = ["rhost"]  # the fixture, imported for the cases below


def write_file(host: Host, path: str, content: str = "hi") -> tuple[str, bool]:
    """One sandboxed write_file call of the host's session."""
    tool = make_write_file(host.sandbox.file_writer("write_file", TEST_POLICY))
    out = asyncio.run(invoke(Catalogue([tool]), "write_file", {"path": path, "content": content},
                             ToolContext(cwd=host.workspace)))
    return out.output, out.is_error


def assert_encodable(text: str) -> None:
    """A tool's output must reach the model and the viewers: strict UTF-8."""
    text.encode("utf-8")


# --- holes found, fixed ----------------------------------------------------------------


def test_mount_table_names_no_other_session(rhost: Host) -> None:
    """/proc/self/mountinfo listed every session's workspace mount of every home on the
    machine (its session id, its home's path): from the shell and from read_file."""
    need("namespaces")
    other = rhost.sandbox.workspace(f"x{secrets.token_hex(5)}")
    assert os.path.ismount(other)
    shell = rhost.run("cat /proc/self/mountinfo /proc/self/mounts")
    assert shell.returncode == 0, shell.output
    assert other.name not in shell.output
    for path in ("/proc/self/mountinfo", "/proc/self/mounts", "/proc/1/mountinfo"):
        out, is_error = call(rhost, "read_file", path)
        assert other.name not in out, (path, out)
        # A reader process reads its own; a reader thread is no process of the view's pid
        # namespace, whose /proc then shows no mount table of its own. (The view's pid 1
        # is the reader process the thread took over, killed as it did: until that one is
        # gone, a busy machine's some milliseconds, /proc/1 is its table, without the
        # other session too.)
        if path.startswith("/proc/self") or not by_threads(rhost):
            assert is_error == by_threads(rhost), (path, out)
    # The session's own workspace is still there, mounted, writable.
    res = rhost.run(f"echo ok > f && cat f && grep -c ' {rhost.workspace} ' /proc/self/mountinfo")
    assert res.returncode == 0 and res.output.startswith("ok\n"), res.output
    still_reads(rhost)


def test_odd_names_round_trip_through_write_file(rhost: Host) -> None:
    """A name that is not UTF-8 (a surrogate escape from the model's JSON): the write
    happened, but its reply could not be encoded, so the tool said it failed."""
    need("namespaces")
    out, is_error = write_file(rhost, "\udcff" * 8, "odd")
    assert not is_error, out
    assert_encodable(out)
    assert "\\xff" in out
    assert (rhost.workspace / os.fsdecode(b"\xff" * 8)).read_bytes() == b"odd"
    out, is_error = write_file(rhost, "plain.txt", "plain")
    assert not is_error and (rhost.workspace / "plain.txt").read_text() == "plain", out


def test_errors_about_odd_names_are_encodable(rhost: Host) -> None:
    """An error naming a non-UTF-8 path must not make the tool's output unencodable."""
    need("namespaces")
    (rhost.workspace / os.fsdecode(b"f\xfe")).write_text("x")
    for name, path in (("list_dir", "f\udcfe"), ("read_file", "nope\udcfe"),
                       ("list_dir", "nope\udcfe")):
        out, is_error = call(rhost, name, path)
        assert is_error, out
        assert_encodable(out)
        assert "\\xfe" in out, out
    out, is_error = write_file(rhost, "missing\udcfe/../../..", "x")
    assert is_error
    assert_encodable(out)
    still_reads(rhost)


def test_write_file_content_with_a_lone_surrogate_is_a_clear_error(rhost: Host) -> None:
    """JSON may carry "\\ud800": the content cannot be UTF-8; a clear error, no traceback."""
    out, is_error = write_file(rhost, "s.txt", "abc\ud800def")
    assert is_error and "UTF-8" in out, out
    assert_encodable(out)
    assert not (rhost.workspace / "s.txt").exists()
    out, is_error = write_file(rhost, "s.txt", "abc")
    assert not is_error and (rhost.workspace / "s.txt").read_text() == "abc", out


def test_session_ids_never_share_or_escape_a_workspace(tmp_path: Path) -> None:
    """Odd session ids (oploop mints hex ones; a peer or a future API may not): none
    leaves the workspaces directory, two never share one, a long one still works."""
    from actors.sandbox.workspaces import NAME_MAX, safe_name

    ids = ["ab", "a.b", "a/b", "../ab", "", ".", "..", "default", "\udcff", "x\x00y", "xy",
           "é", "e", "a" * 300, "a" * 301, "a" * NAME_MAX, "ab.0123456789abcdef"]
    names = [safe_name(sid) for sid in ids]
    assert len(set(names)) == len(ids), sorted(zip(names, ids, strict=True))
    for sid, name in zip(ids, names, strict=True):
        assert "/" not in name and "\0" not in name and name not in ("", ".", ".."), sid
        assert len(name.encode()) <= NAME_MAX + 17, sid
        assert (tmp_path / name).parent == tmp_path
    assert safe_name("9f86d081884c") == "9f86d081884c"  # oploop's own ids: unchanged
    assert safe_name("default") == "default"


def test_a_long_or_odd_session_id_gets_its_own_workspace(rhost: Host) -> None:
    need("namespaces")
    long_ws = rhost.sandbox.workspace("s" * 300)
    dotted = rhost.sandbox.workspace("s.1")
    assert long_ws.parent == dotted.parent == rhost.workspace.parent
    assert len({long_ws, dotted, rhost.workspace}) == 3
    assert os.path.ismount(long_ws) and os.path.ismount(dotted)
    (rhost.workspace / "mine").write_text("x")
    assert not (dotted / "mine").exists()
    still_reads(rhost)


# --- attacks the sandbox held ----------------------------------------------------------


def test_write_file_to_the_mount_point_and_through_links_out(rhost: Host) -> None:
    """The workspace's own mount point (replacing it would unmount nothing but hide the
    image), its parent through `..` and through a link the shell planted: all refused."""
    need("landlock")
    planted = rhost.run("ln -s .. up && ln -s / rt && ln -s /proc/self/fd/1 out && echo ok")
    assert planted.output == "ok\n", planted.output
    ws = str(rhost.workspace)
    for path in (".", ws, ws + "/", "..", "../s2", "up/x", "rt/tmp/x", "out", "/dev/null"):
        out, is_error = write_file(rhost, path, "pwned")
        assert is_error, (path, out)
        assert_encodable(out)
    assert os.path.ismount(rhost.workspace)
    assert sorted(p.name for p in rhost.workspace.iterdir()) == ["out", "rt", "up"]
    out, is_error = write_file(rhost, "fine.txt", "fine")
    assert not is_error and (rhost.workspace / "fine.txt").read_text() == "fine", out


def test_a_directory_of_60k_entries_lists_bounded(rhost: Host) -> None:
    """A huge directory (60,000 names: a 1 GiB image has 65,536 inodes, a bound of its
    own) with a 255-byte name of 0xff answers at once with the first LIST_CAP names
    and a count; memory stays bounded by the cap in the reader."""
    from actors.tools.builtin import LIST_CAP

    big = rhost.workspace / "big"
    big.mkdir()
    ENTRIES = 60_000  # noqa: N806
    fd = os.open(big, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(ENTRIES):
            os.close(os.open(f"n{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
        os.close(os.open(b"\xff" * 255, os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)
    os.chown(big, rhost.uid, rhost.uid)
    out, is_error = call(rhost, "list_dir", "big")
    assert not is_error, out[:200]
    lines = out.splitlines()
    assert len(lines) == LIST_CAP + 1 and lines[0] == "n000000", lines[:2]
    assert lines[-1] == f"[truncated: {ENTRIES + 1 - LIST_CAP} more entries]", lines[-1]
    out, is_error = call(rhost, "read_file", "big/" + "\udcff" * 255)
    assert not is_error and out == "(empty file)", out
    still_reads(rhost)
