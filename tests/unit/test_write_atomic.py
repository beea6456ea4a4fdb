"""`fileops.write_atomic`, the sandboxed writer's replace, against a call running beside
it that swaps its temporary file for a link the moment before it sets the file's mode."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from actors.fileops import write_atomic

#: The swap to make at the writer's next chmod of a path (see the audit hook below).
_SWAP: dict[str, Path] = {}


def _swap_at_chmod(event: str, args: tuple[object, ...]) -> None:
    # Audit hooks cannot be removed: this one does nothing once `_SWAP` is empty.
    if event != "os.chmod" or not _SWAP:
        return
    path = args[0]
    if isinstance(path, str) and os.path.basename(path).startswith(".target."):
        os.replace(path, path + ".moved")  # the attacker's rename ...
        os.symlink(_SWAP.pop("victim"), path)  # ... and its link in the same place


sys.addaudithook(_swap_at_chmod)


def test_the_mode_is_set_on_the_written_file_not_on_what_its_name_leads_to(tmp_path):
    target, victim = tmp_path / "target", tmp_path / "victim"
    target.write_bytes(b"old")
    os.chmod(target, 0o777)
    victim.write_bytes(b"secret")
    os.chmod(victim, 0o600)
    _SWAP["victim"] = victim
    try:
        write_atomic(str(target), b"new")
    finally:
        _SWAP.clear()
    assert stat.S_IMODE(victim.stat().st_mode) == 0o600
    assert target.read_bytes() == b"new" and stat.S_IMODE(target.stat().st_mode) == 0o777


def test_a_new_file_is_written_and_an_existing_ones_mode_kept(tmp_path):
    script = tmp_path / "run.sh"
    script.write_bytes(b"echo old\n")
    os.chmod(script, 0o750)
    assert write_atomic(str(script), b"echo new\n") == str(script)
    assert script.read_bytes() == b"echo new\n" and stat.S_IMODE(script.stat().st_mode) == 0o750
    fresh = tmp_path / "sub" / "new.txt"
    assert write_atomic(str(fresh), b"x") == str(fresh) and fresh.read_bytes() == b"x"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
