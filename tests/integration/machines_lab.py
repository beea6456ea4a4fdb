"""A host and worker machines in network namespaces (`bench.netlink`), for the tests
of issue 20: the host in the hub namespace listening on TCP + CURVE, each worker
machine an `oploop worker` process group in a namespace of its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from actors.sandbox.workspaces import release_all
from bench.netlink import Lab
from bus.client import Client

OPLOOP = [sys.executable, "-m", "actors.cli"]
#: The host's first TCP port (its five are free: the hub namespace is the lab's own).
PORT = 7600


def _env(home: str | Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ANTHROPIC_", "OPLOOP_"))
           or k in ("OPLOOP_HTTP_LISTEN", "OPLOOP_SANDBOX")}  # (scratch: tests/conftest.py)
    env.update(extra or {}, OPLOOP_HOME=str(home))
    return env


def oploop_in(lab: Lab, ns: str, home: str | Path, *args: str,
              env: dict[str, str] | None = None, timeout: float = 60
              ) -> subprocess.CompletedProcess[str]:
    """Run the CLI inside namespace `ns` against `home`."""
    return subprocess.run([*lab.in_ns(ns), *OPLOOP, *args], env=_env(home, env),
                          capture_output=True, text=True, timeout=timeout, check=False)


@contextlib.contextmanager
def hub_host(lab: Lab, home: str) -> Iterator[str]:
    """A host in the lab's hub, on TCP (all its addresses) with CURVE; `oploop down`
    after, checking that nothing of it is left."""
    Path(home, "oploop.toml").write_text(f'[network]\nlisten = "tcp://0.0.0.0:{PORT}"\n')
    up = oploop_in(lab, lab.hub, home, "up", "--detach")
    assert up.returncode == 0, up.stderr + up.stdout
    state = json.loads((Path(home) / "run" / "host.json").read_text())
    pids = [state["pid"], *(a["pid"] for a in state["actors"] if a["pid"])]
    try:
        yield home
    finally:
        down = subprocess.run([*OPLOOP, "down"], env=_env(home), capture_output=True,
                              text=True, timeout=60, check=False)
        assert down.returncode == 0, down.stderr
        left = [p for p in pids if psutil.pid_exists(p)
                and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        assert not left, f"processes left after down: {left}"


def issue_key(home: str, name: str, role: str) -> Path:
    """`oploop keys add NAME --role ROLE` on the host; the folder to hand over."""
    out = subprocess.run([*OPLOOP, "keys", "add", name, "--role", role], env=_env(home),
                         capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    return Path(home) / "keys" / "issued" / name


class WorkerMachineProc:
    """An `oploop worker` process group in machine `name`'s namespace, started apart
    (not a child of the test: like a host, its processes come and go on their own,
    e.g. an executor's fork server, and are stopped by `stop`)."""

    def __init__(self, lab: Lab, name: str, home: Path, keys: Path, *extra: str) -> None:
        self.lab, self.name, self.home = lab, name, home
        machine = lab.machines[name]
        home.mkdir(parents=True, exist_ok=True)
        # The shell may use the machine's network: its output can show where it ran.
        (home / "sandbox.toml").write_text('[tools.shell]\nnetwork = "host"\n')
        self.log = home / "command.log"
        command = [*lab.in_ns(machine.ns), *OPLOOP, "worker", "--connect",
                   f"tcp://{machine.hub_address}:{PORT}", "--keys", str(keys),
                   "--machine", name, *extra]
        started = subprocess.run(
            ["sh", "-c", 'setsid "$@" >>"$OPLOOP_TEST_LOG" 2>&1 </dev/null & echo $!', "sh",
             *command], env={**_env(home), "OPLOOP_TEST_LOG": str(self.log)},
            capture_output=True, text=True, timeout=30, check=True)
        self.proc = psutil.Process(int(started.stdout.split()[0]))

    def alive(self) -> bool:
        """Whether the `oploop worker` process still runs."""
        return self.proc.is_running() and self.proc.status() != psutil.STATUS_ZOMBIE

    def stop(self) -> None:
        """SIGTERM, wait until it and its workers are gone; workspaces released."""
        group = [self.proc, *self.workers()]
        with contextlib.suppress(psutil.Error):
            self.proc.send_signal(signal.SIGTERM)
        _, alive = psutil.wait_procs(group, timeout=20)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        release_all(self.home)

    def workers(self) -> list[psutil.Process]:
        """Its worker processes now."""
        try:
            return self.proc.children()
        except psutil.Error:
            return []


async def machines(home: str) -> dict[str, dict[str, Any]]:
    """The host's machines by name, as `oploop status --json` lists them."""
    async with Client.connect(Path(home)) as client:
        return {m["name"]: m for m in (await client.stats())["machines"]}


async def wait_machine(home: str, name: str, state: str, tools: int | None = None,
                       within_s: float = 60) -> dict[str, Any]:
    """Wait until machine `name` is in `state` (with `tools` executors, if given)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while True:
        found = (await machines(home)).get(name)
        if found and found["state"] == state and (
                tools is None or found["workers"].get("tool", 0) == tools):
            return found
        assert loop.time() < end, f"machine {name} never {state}: {found}"
        await asyncio.sleep(0.05)
