"""Temporary oploop homes for tests, remembered so that the leak check (conftest)
knows which mounts are this run's: other runs on the machine make homes too."""

from __future__ import annotations

import tempfile
from pathlib import Path

#: Directories this test run made (with a trailing "/"): its homes, pytest's base.
OUR_DIRS: list[str] = []


def make_home(prefix: str = "oph-") -> str:
    """A new home under /tmp (short enough for unix socket paths), remembered."""
    home = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    OUR_DIRS.append(home + "/")
    return home


def remove_home(home: Path) -> None:
    """Delete a test's home, unmounting the workspace file systems it still has."""
    from actors.sandbox.workspaces import remove_home as remove

    remove(home)
