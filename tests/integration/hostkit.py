"""Helpers of the integration tests: start a real host, drive it through the client."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from bus.client import Client
from bus.endpoints import Endpoints
from bus.vocab import TERMINAL

OPLOOP = [sys.executable, "-m", "actors.cli"]
#: How long a test waits on another process's observable state by default: a bound for
#: a wait that went wrong, never a pause. Generous: with every core of the machine busy
#: (other tests beside it, `./scripts/test -n`), a host or an actor may take tens of
#: seconds to start.
WAIT_S = 90.0


def cli_env(home: str, env: dict[str, str] | None = None,
            drop: tuple[str, ...] = ("ANTHROPIC_",)) -> dict[str, str]:
    """This process's environment for a CLI against `home`: the variables starting with
    `drop` left out (the model's, by default), `env` added."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    # The suite's hosts work in scratch mode (tests/conftest.py) unless a test names a
    # mode: a host started from here in the default mode would make the checkout the
    # tools' writable working directory.
    if "OPLOOP_SANDBOX" in os.environ:
        full_env.setdefault("OPLOOP_SANDBOX", os.environ["OPLOOP_SANDBOX"])
    full_env.update(env or {}, OPLOOP_HOME=home)
    return full_env


def oploop(home: str, *args: str, env: dict[str, str] | None = None, timeout: float = WAIT_S,
           cwd: str | os.PathLike[str] | None = None, input_text: str | None = None,
           drop: tuple[str, ...] = ("ANTHROPIC_",),
           prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run the CLI against `home` (after `prefix`, e.g. an `nsenter`; `input_text` on its
    standard input); returns the CompletedProcess."""
    return subprocess.run([*prefix, *OPLOOP, *args], env=cli_env(home, env, drop),
                          capture_output=True, text=True, timeout=timeout, check=False,
                          cwd=cwd, input=input_text)


def host_pids(home: str) -> list[int]:
    """The pids of the host and of every actor it started."""
    state = json.loads((Path(home) / "run" / "host.json").read_text())
    return [state["pid"], *(a["pid"] for a in state["actors"] if a["pid"])]


def print_log_tail(home: str, lines: int = 80) -> None:
    """Print the last `lines` lines of the home's host.log (pytest shows them with a failure)."""
    try:
        tail = (Path(home) / "host.log").read_text(errors="replace").splitlines()[-lines:]
    except OSError as exc:
        print(f"--- no host.log in {home}: {exc}")
        return
    print(f"--- last {len(tail)} lines of {home}/host.log", *tail, "---", sep="\n")


@contextlib.contextmanager
def running_host(home: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`oploop up --detach` in `home`; `oploop down` after, checking nothing is left."""
    # (`up` waits for the MCP servers to list their tools: seconds on a busy machine)
    up = oploop(home, "up", "--detach", env=env, timeout=180)
    assert up.returncode == 0, up.stderr + up.stdout
    pids = host_pids(home)
    try:
        yield home
    except BaseException:
        # The home is deleted after the test: a failure carries the host's own account
        # (an actor's errors, "events ... are lost") or it is gone for good.
        print_log_tail(home)
        raise
    finally:
        down = oploop(home, "down")
        assert down.returncode == 0, down.stderr
        alive = [p for p in pids if psutil.pid_exists(p)
                 and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"processes left after down: {alive}"
        assert not Endpoints.for_home(Path(home)).socket_files()


@contextlib.contextmanager
def scripted_host(home: str, scripts: dict[str, Any], directory: Path,
                  env: dict[str, str] | None = None) -> Iterator[str]:
    """`running_host` whose offline model plays `scripts` (a scenario file written in
    `directory`; the format is in `actors/offline_model/__init__.py`)."""
    scenario = directory / "scenario.json"
    scenario.write_text(json.dumps({"scripts": scripts}))
    with running_host(home, {"OPLOOP_OFFLINE_SCENARIO": str(scenario), **(env or {})}) as h:
        yield h


def events_of(stdout: str) -> list[dict[str, Any]]:
    """The events of `oploop run --json` output."""
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def assert_one_run(events: list[dict[str, Any]], first_seq: int = 1) -> None:
    """Contiguous seqs from `first_seq`, exactly one terminal event, the last, and a
    `TOOL_END` for every `TOOL_START` (cancelled tools included)."""
    assert [e["seq"] for e in events] == list(range(first_seq, first_seq + len(events)))
    terminal = [e for e in events if e["type"] in TERMINAL]
    assert len(terminal) == 1 and events[-1] is terminal[0], [e["type"] for e in events]
    started = [e["data"]["tool_use_id"] for e in events if e["type"] == "TOOL_START"]
    ended = [e["data"]["tool_use_id"] for e in events if e["type"] == "TOOL_END"]
    assert sorted(started) == sorted(ended), (started, ended)


async def run_events(home: str, prompt: str, **start: Any) -> list[dict[str, Any]]:
    """Start a run through the Python client and collect its events to the terminal one."""
    async with Client.connect(Path(home)) as client:
        started = await client.start(prompt, **start)
        events = [e async for e in client.events(started.session, started.from_seq,
                                                 stop_at="first")]
    assert_one_run(events, started.from_seq)
    return events


def run(home: str, prompt: str, **start: Any) -> list[dict[str, Any]]:
    """`run_events`, synchronously."""
    return asyncio.run(run_events(home, prompt, **start))


def of_type(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The events of one type."""
    return [e for e in events if e["type"] == kind]


def workspace(home: str, session: str) -> Path:
    """Where the risky tools of `session` run (the sandbox's per-session directory)."""
    return Path(home) / "workspaces" / session


def ready_workspace(home: str, session: str) -> Path:
    """The workspace of `session` once its executor has made it ready (mounted on its
    quota image, then given the session's uid): a file put there earlier would be
    hidden under the mount, or the tool might not be there to see it."""
    path = workspace(home, session)

    def ready() -> bool:
        try:
            return path.stat().st_uid != 0
        except FileNotFoundError:
            return False

    try:
        wait_until(ready, f"the workspace {path} to be ready")
    except AssertionError:
        print_log_tail(home)
        raise
    return path


def actors(home: str) -> list[dict[str, Any]]:
    """The host's record of its actors (host.json)."""
    state: dict[str, Any] = json.loads((Path(home) / "run" / "host.json").read_text())
    return list(state["actors"])


def actor(home: str, name: str) -> dict[str, Any]:
    """The host's record of actor `name`."""
    return next(a for a in actors(home) if a["name"] == name)


def unique_mark(prefix: str = "") -> str:
    """A mark for a test's own command lines (`processes_with`), after `prefix`: 12
    random digits (it may be a `sleep`'s argument), so that no pid, port or argument of
    another process holds it, nor the mark of a test beside it (another worker, another
    checkout's suite on the same machine). A fixed "4242" was found in a zygote's
    command line (its executor's pid) and in other tests' marks."""
    return f"{prefix}{secrets.randbelow(9 * 10**11) + 10**11}"


def processes_with(mark: str) -> list[int]:
    """The pids of processes whose command line holds `mark` (a test's own tool)."""
    return [p.pid for p in psutil.process_iter(["cmdline"])
            if any(mark in part for part in p.info["cmdline"] or ())]


def processes_of_home(home: str) -> list[int]:
    """The pids of every live process of a host of `home`: the host, its actors, the ones
    it restarted (which its state file listed at no time a test read it), and what they
    started with their environment: those whose `OPLOOP_HOME` is `home`. (Not this
    process: its environment names no home.)"""
    pids = []
    for p in psutil.process_iter(["environ", "status"]):
        if p.pid != os.getpid() and p.info["status"] != psutil.STATUS_ZOMBIE and (
                p.info["environ"] or {}).get("OPLOOP_HOME") == home:
            pids.append(p.pid)
    return pids


def wait_until(predicate: Any, what: str = "condition", timeout: float = WAIT_S) -> None:
    """Poll an observable state (a process table, a state file) until `predicate()` holds."""
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


async def until(predicate: Any, what: str = "condition", timeout: float = WAIT_S) -> None:
    """`wait_until` for async code; `predicate()` may also return an awaitable."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not await _value(predicate()):
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _value(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result
