"""The examples under examples/ run as written, offline, from a clone (issue 16)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _env(home: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "OPLOOP_")) or k == "OPLOOP_SANDBOX"}
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


def test_the_readme_python_examples_run_as_written(short_home, tmp_path):
    readme = (EXAMPLES.parent / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.DOTALL)
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        script = tmp_path / f"readme_{i}.py"
        script.write_text(block)
        done = subprocess.run([sys.executable, str(script)], env=_env(short_home),
                              capture_output=True, text=True, timeout=120,
                              cwd=EXAMPLES.parent)
        assert done.returncode == 0, f"README block {i}:\n{block}\n{done.stderr}"
        assert "Traceback" not in done.stderr
