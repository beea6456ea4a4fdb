"""Processes a test starts and must find again: a unique token in their command lines,
and a child interpreter run under a bound (a case that once hung fails instead)."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

#: The tests' root: on a child interpreter's path, for the kits (`sbhelp`, this one).
TESTS = Path(__file__).resolve().parent


def token() -> str:
    """A unique fractional `sleep` duration, to find a test's own processes."""
    return str(secrets.randbelow(10**8)).zfill(8)


def processes_with(tok: str) -> list[psutil.Process]:
    """Live (non-zombie) processes whose command line contains `tok`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["status"] != psutil.STATUS_ZOMBIE and any(tok in a for a in cmdline):
            found.append(proc)
    return found


def child_env(*paths: Path) -> dict[str, str]:
    """This environment, with the tests' root and `paths` first on PYTHONPATH."""
    path = os.pathsep.join([str(TESTS), *map(str, paths), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def run_bounded(script: str, *args: str, tok: str, bound_s: float, hung: str,
                paths: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run `python -c script args` (the kits and `paths` importable); fail the test
    saying `hung` if it outlives `bound_s`. Whatever carries `tok` is killed after it."""
    try:
        return subprocess.run(
            [sys.executable, "-c", script, *args], capture_output=True, text=True,
            env=child_env(*paths), timeout=bound_s, check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(hung)
    finally:
        for proc in processes_with(tok):
            proc.kill()
