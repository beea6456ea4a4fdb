"""The launcher's Landlock rules (`actors/sandbox/lockdown.py`) on writable paths: one
with a symbolic link on the way gets no rule (the view resolved it link-free, so a
link there was made since, and its target must not become writable), but for the
working directory, which may be reached through a link as it was given.

Each case locks down a fresh process of its own (Landlock cannot be undone).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from actors.sandbox import lockdown

REPO = Path(__file__).resolve().parents[2]

#: Lock down (all readable, `rw` writable, in `cwd`), then try to create each file.
_ATTEMPT = """\
import json, os, sys
from actors.sandbox import lockdown

cwd, rw, files = json.loads(sys.argv[1])
os.chdir(cwd)
lockdown._prctl(lockdown.PR_SET_NO_NEW_PRIVS, 1)
lockdown.apply_landlock(["/"], rw, False, False)
for name in files:
    try:
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))
        print(name, "written")
    except OSError as exc:
        print(name, exc.strerror)
"""


def attempt(cwd: Path, rw: list[Path], files: list[str]) -> dict[str, str]:
    """What a process locked down with `rw` writable, in `cwd`, got creating `files`."""
    args = json.dumps([str(cwd), [str(p) for p in rw], files])
    done = subprocess.run([sys.executable, "-c", _ATTEMPT, args], cwd=REPO, check=True,
                          capture_output=True, text=True, timeout=30)
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    if lockdown.landlock_abi() < 1:
        pytest.skip("no Landlock in this kernel")
    for name in ("real", "target", "parent/sub"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "target")
    (tmp_path / "parentlink").symlink_to(tmp_path / "parent")
    return tmp_path


def test_a_writable_path_that_is_now_a_link_gets_no_rule(tree: Path) -> None:
    got = attempt(Path("/"), [tree / "real", tree / "link"],
                  [str(tree / "real" / "a"), str(tree / "target" / "b")])
    assert got == {str(tree / "real" / "a"): "written",
                   str(tree / "target" / "b"): "Permission denied"}


def test_a_link_anywhere_on_the_way_is_refused(tree: Path) -> None:
    got = attempt(Path("/"), [tree / "parentlink" / "sub"], [str(tree / "parent/sub/c")])
    assert got == {str(tree / "parent/sub/c"): "Permission denied"}


def test_the_working_directory_may_be_reached_through_a_link(tree: Path) -> None:
    got = attempt(tree / "link", [tree / "link"], ["d", str(tree / "real" / "e")])
    assert got == {"d": "written", str(tree / "real" / "e"): "Permission denied"}
    assert (tree / "target" / "d").exists()


def test_no_descriptor_is_left_open(tree: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):
        lockdown.open_without_links(str(tree / "link" / "x"))
    fd = lockdown.open_without_links(str(tree / "real"))
    os.close(fd)
    assert lockdown._open_writable(str(tree / "nothing" / "here")) is None
    assert len(os.listdir("/proc/self/fd")) == before
