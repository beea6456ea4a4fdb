"""The examples under examples/ run as written, offline, from a clone (issue 16)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _env(home: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPLOOP_"))}
    env.update(OPLOOP_HOME=home, **extra)
    return env


def test_client_example_runs_with_an_embedded_host(short_home):
    done = subprocess.run([sys.executable, str(EXAMPLES / "client.py"), "run `echo example`"],
                          env=_env(short_home), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "DONE" in done.stdout and "example" in done.stdout
    assert "Traceback" not in done.stderr
    assert not (Path(short_home) / "run" / "host.json").exists()  # stopped with it


def test_typed_runner_example_runs_offline(short_home):
    for extra in ({}, {"OPLOOP_LLM_BACKEND": "scripted"}):
        done = subprocess.run([sys.executable, str(EXAMPLES / "typed_runner.py")],
                              env=_env(short_home, **extra), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        assert "Answer(" in done.stdout and "disk free" in done.stdout
        assert ("offline model" in done.stderr) == (not extra), done.stderr
