"""Shared fixtures: every test must leave no child process behind."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import psutil
import pytest


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


@pytest.fixture(autouse=True)
def no_leaked_processes():
    """Fail a test that leaves a child process of the test runner alive."""
    before = _children()
    yield
    deadline = time.monotonic() + 5
    leaked = _children() - before
    while leaked and time.monotonic() < deadline:
        psutil.wait_procs([psutil.Process(p) for p in leaked if psutil.pid_exists(p)], timeout=0.2)
        leaked = {p for p in _children() - before if psutil.pid_exists(p)}
    for pid in leaked:
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass
    assert not leaked, f"test leaked processes: {sorted(leaked)}"


@pytest.fixture
def short_home():
    """An OPLOOP_HOME short enough for unix socket paths (pytest's tmp paths are not)."""
    home = tempfile.mkdtemp(prefix="oph-", dir="/tmp")
    yield home
    remove_home(Path(home))


def remove_home(home: Path) -> None:
    """Delete a test's home, unmounting the workspace file systems it still has."""
    from actors.sandbox.workspaces import release_all

    release_all(home)
    shutil.rmtree(home, ignore_errors=True)
