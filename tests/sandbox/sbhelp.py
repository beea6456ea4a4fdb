"""Helpers and fixtures of the adversarial sandbox suite: a real Sandbox, a throwaway home.

A case skips only when the mechanism it attacks is absent on this machine,
with the layer and the reason in the skip message (`pytest -ra` prints it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from prockit import processes_with

from actors.sandbox import (
    Limits,
    Policy,
    Sandbox,
    SandboxConfig,
    bwrap,
    machine_layers,
    modes,
    release_all,
)
from actors.sandbox.network import NetAccess
from actors.tools.process import CommandResult, run_command

PYTHON = "/usr/bin/python3"
"""A system Python the sandbox can run (the venv's lives under /root, which it cannot read)."""

# Upper bound on polling an observable condition; never a pass/fail timing (generous:
# with every core busy, a sandboxed tree can take many seconds to come up).
BOUND_S = 60.0

TEST_POLICY = Policy(
    limits=Limits(memory_bytes=256 * 1024 * 1024, pids=64, cpu=1.0),
    cpu_s=2,
    file_bytes=16 * 1024 * 1024,
    nofile=128,
    timeout_s=30,
)


def need(*layers: str) -> None:
    """Skip the calling test if a layer it attacks is missing here, saying why."""
    have = machine_layers()
    for layer in layers:
        if have.get(layer):
            pytest.skip(f"sandbox layer {layer!r} absent on this machine: {have[layer]}")


def need_python() -> None:
    """Skip when there is no system Python to attack from inside the sandbox."""
    if not os.access(PYTHON, os.X_OK):
        pytest.skip(f"{PYTHON} not installed: the case needs a Python inside the sandbox")


@dataclass
class Host:
    """The oploop home the sandbox hides, a workspace in it, and a dir outside it."""

    home: Path
    sandbox: Sandbox
    workspace: Path
    outside: Path
    backend: str
    #: The session's view (`modes.WorkView`): None runs as the suite always did (scratch).
    view: modes.WorkView | None = None

    @property
    def mode(self) -> str:
        """The sandbox mode the calls run in."""
        return self.view.mode if self.view is not None else modes.SCRATCH

    @property
    def uid(self) -> int:
        """The session's tool uid: the owner of its workspace."""
        return self.workspace.stat().st_uid

    @property
    def policy(self) -> Policy:
        """The test policy on this host's backend."""
        return dataclasses.replace(TEST_POLICY, backend=self.backend)

    def run(
        self, command: str, policy: Policy = TEST_POLICY, timeout_s: float = 20.0,
        net: NetAccess = "none",
    ) -> CommandResult:
        """Run `command` in the workspace under `policy` (on this host's backend), to
        completion; `net`: its network ("none", "all", or through a proxy)."""
        policy = dataclasses.replace(policy, backend=self.backend)
        with modes.using(self.view):
            return asyncio.run(
                run_command(
                    command, self.workspace, timeout_s=timeout_s, cap=64 * 1024,
                    spawn=self.sandbox.spawner("shell", policy, net=net),
                )
            )

    def py(self, code: str, policy: Policy = TEST_POLICY, net: NetAccess = "none"
           ) -> CommandResult:
        """Run Python `code` inside the sandbox."""
        need_python()
        script = self.workspace / "case.py"
        script.write_text(code)
        os.chmod(script, 0o644)
        return self.run(f"{PYTHON} -I -S case.py", policy, net=net)


@pytest.fixture(params=["launcher", "bwrap"])
def host(request: pytest.FixtureRequest) -> Iterator[Host]:
    """A fresh home (under /tmp, short enough for unix sockets) and its sandbox.

    Every case runs on both backends: the launcher's own layers, and bubblewrap.
    """
    backend = request.param
    if backend == "bwrap" and bwrap.find()[1]:
        pytest.skip(f"bubblewrap backend absent on this machine: {bwrap.find()[1]}")
    from homes import make_home  # (here: holder.py imports this module without tests/)

    home = Path(make_home("ophs-"))
    # Traversable (not listable) by the tool uid, for the cases that lower the mount
    # namespace, which otherwise hides the home and binds only the workspace back.
    os.chmod(home, 0o711)
    outside = home / "outside"
    outside.mkdir()
    sandbox = Sandbox(SandboxConfig(TEST_POLICY), home / "workspaces", hide=(home,))
    sandbox.start()
    try:
        yield Host(home, sandbox, sandbox.workspace("s1"), outside, backend)
    finally:
        sandbox.close()
        release_all(home)
        shutil.rmtree(home, ignore_errors=True)


PROJECT_UID = 4242
"""The owner of the project directory of `mhost` (a uid no user has: the view names it)."""


@pytest.fixture(params=[("launcher", modes.SCRATCH), ("bwrap", modes.SCRATCH),
                        ("launcher", modes.WORKSPACE_WRITE), ("launcher", modes.READ_ONLY)],
                ids=lambda p: "-".join(p))
def mhost(request: pytest.FixtureRequest) -> Iterator[Host]:
    """`host` in every sandbox mode: in workspace-write and read-only the calls run in a
    project directory under /home owned by `PROJECT_UID` (as that uid), not in the
    session's workspace."""
    backend, mode = request.param
    if backend == "bwrap" and bwrap.find()[1]:
        pytest.skip(f"bubblewrap backend absent on this machine: {bwrap.find()[1]}")
    from homes import make_home

    home = Path(make_home("ophs-"))
    os.chmod(home, 0o711)
    outside = home / "outside"
    outside.mkdir()
    sandbox = Sandbox(SandboxConfig(TEST_POLICY), home / "workspaces", hide=(home,))
    sandbox.start()
    project = None
    try:
        if mode == modes.SCRATCH:
            yield Host(home, sandbox, sandbox.workspace("s1"), outside, backend)
        else:
            import tempfile

            project = Path(tempfile.mkdtemp(prefix="ophp-", dir="/home"))
            os.chown(project, PROJECT_UID, PROJECT_UID)
            view = sandbox.view(mode, str(project), "s1")
            yield Host(home, sandbox, project, outside, backend, view)
    finally:
        sandbox.close()
        release_all(home)
        shutil.rmtree(home, ignore_errors=True)
        if project is not None:
            shutil.rmtree(project, ignore_errors=True)


async def wait_processes(token: str, count: int, name: str = "sleep") -> list[psutil.Process]:
    """Wait until `count` processes called `name` carry `token` (the tree is up), bounded.

    By name: bwrap's own processes carry the whole command line (token included)
    before the tool even starts.
    """
    deadline = time.monotonic() + BOUND_S

    def named() -> list[psutil.Process]:
        out = []
        for proc in processes_with(token):
            with contextlib.suppress(psutil.Error):
                if proc.name() == name:
                    out.append(proc)
        return out

    while len(found := named()) < count:
        assert time.monotonic() < deadline, f"only {len(found)} of {count} '{token}' processes"
        await asyncio.sleep(0.01)
    return found
