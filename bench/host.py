"""A host for the benchmark: started as a user starts one (`oploop up --detach`),
in a temporary `$OPLOOP_HOME`, with the in-process scripted model, and stopped
with `oploop down`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from actors.sandbox.workspaces import remove_home
from bus.endpoints import Endpoints

#: One trivial tool call per turn, for up to this many turns (runs are cut by max_turns).
SCRIPT_TURNS = 1000


def target_text(size: int) -> str:
    """`size` bytes of plain lines (0: the one short line of the turn benchmarks)."""
    if size <= 0:
        return "hello from the benchmark\n"
    line = "the quick brown fox jumps over the lazy dog, line after line of a file\n"
    return (line * (size // len(line) + 1))[:size]


def write_workload(directory: Path, target_bytes: int = 0) -> tuple[Path, Path]:
    """The file every turn reads, and the scenario that reads it every turn."""
    target = directory / "target.txt"
    target.write_text(target_text(target_bytes))
    call = {"type": "tool_use", "name": "read_file", "input": {"path": str(target)}}
    turns = [{"reply": [call]} for _ in range(SCRIPT_TURNS)]
    script = directory / "script.json"
    script.write_text(json.dumps({"description": "one read_file per turn", "turns": turns}))
    return target, script


class BenchHost:
    """One detached host with `llm_callers` and `executors`, the scripted model on.

    `backend="http"` points the llm callers at `base_url` (a Messages-API server, through
    the SDK); any other value than "scripted" leaves the model set-up to the host (the
    offline model). `target_bytes` sizes the file every turn reads.
    """

    def __init__(self, *, llm_callers: int = 1, executors: int | None = None,
                 backend: str = "scripted", listen: str = "", base_url: str = "",
                 target_bytes: int = 0, config: str = "") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="oploop-bench-"))
        self.home = self.dir / "home"
        if listen:  # TCP with CURVE: every public socket of the host speaks CURVE
            config += f'[network]\nlisten = "{listen}"\n'
        if config:  # `config`: more of oploop.toml
            self.home.mkdir()
            (self.home / "oploop.toml").write_text(config)
        self.target, self.script = write_workload(self.dir, target_bytes)
        self.env = {
            **os.environ,
            "OPLOOP_HOME": str(self.home),
            "OPLOOP_LLM_CALLERS": str(llm_callers),
        }
        if executors is not None:  # (None: the host's default)
            self.env["OPLOOP_EXECUTORS"] = str(executors)
        else:
            self.env.pop("OPLOOP_EXECUTORS", None)
        if backend == "scripted":
            self.env["OPLOOP_LLM_BACKEND"] = "scripted"
            self.env["OPLOOP_LLM_SCRIPT"] = str(self.script)
        else:
            for name in ("OPLOOP_LLM_BACKEND", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"):
                self.env.pop(name, None)
            if backend == "http":
                self.env.update(ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY="offline")
        self.up_s = 0.0

    def oploop(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run `oploop ARGS` against this host."""
        return subprocess.run(
            [sys.executable, "-m", "actors.cli", *args], env=self.env, capture_output=True,
            text=True, timeout=120, check=False,
        )

    def start(self) -> float:
        """`oploop up --detach`; the seconds from running it to its exit (host ready)."""
        started = time.perf_counter()
        done = self.oploop("up", "--detach")
        self.up_s = time.perf_counter() - started
        if done.returncode != 0:
            log = (self.home / "host.log")
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"oploop up failed: {done.stderr.strip()}\n{tail}")
        return self.up_s

    def stop(self) -> None:
        """`oploop down`, then remove the temporary directory."""
        try:
            if self.state() is not None:
                self.oploop("down")
        finally:
            remove_home(Path(self.dir))

    def state(self) -> dict[str, Any] | None:
        """The host's state file."""
        try:
            path = Endpoints.for_home(self.home).run_dir / "host.json"
            data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return data

    def processes(self) -> list[psutil.Process]:
        """The host process and every process under it."""
        state = self.state()
        if state is None:
            return []
        host = psutil.Process(int(state["pid"]))
        return [host, *host.children(recursive=True)]

    def process_names(self) -> dict[int, str]:
        """A name for each host process: the actors by their host names (executor-1,
        llm-1, ...), the host "host", an executor's sandbox fork server "NAME fork
        server", and what the sandbox forks per session or call (persistent readers,
        running tools) "sandbox: pid N" — those come and go."""
        state = self.state() or {}
        names = {a["pid"]: a["name"] for a in state.get("actors", [])}
        names[state.get("pid")] = "host"
        out: dict[int, str] = {}
        for proc in self.processes():
            try:
                parent = proc.ppid()
            except psutil.Error:
                continue
            if proc.pid in names:
                out[proc.pid] = names[proc.pid]
            elif parent in names:
                out[proc.pid] = f"{names[parent]} fork server"
            else:
                out[proc.pid] = f"sandbox: pid {proc.pid}"
        return out

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds used so far by each host process (keyed by pid): on a shared
        machine, robust where wall time is not."""
        out = {}
        for proc in self.processes():
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            out[str(proc.pid)] = float(t.user + t.system)
        return out

    def __enter__(self) -> BenchHost:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
