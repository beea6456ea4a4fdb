"""Adversarial: a tree that tries to outlive its call. It dies on cancel, on timeout, on a
normal exit, when the executor is SIGKILLed, and a new executor sweeps what is left."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from prockit import child_env, processes_with, token
from sbhelp import BOUND_S, TEST_POLICY, Host, need, wait_processes

from actors.sandbox import Sandbox, SandboxConfig
from actors.sandbox.cgroups import CgroupTree, Hierarchies
from actors.tools.process import run_command

HERE = Path(__file__).parent


def escaper(token: str) -> str:
    """A double-forked, setsid'd grandchild that ignores SIGTERM, plus a plain child.

    `sleep` gets a unique fractional duration so the test can find it from the host.
    """
    return (
        f"( setsid sh -c 'trap \"\" TERM HUP; exec sleep 987.{token}' & ) ; "
        f"sleep 986.{token} & "
        "echo started; sleep 1000"
    )


def test_cancel_kills_the_escaping_tree(host: Host) -> None:
    need("cgroup_kill")
    tok = token()

    async def scenario() -> None:
        task = asyncio.create_task(
            run_command(escaper(tok), host.workspace, timeout_s=60, cap=4096,
                        spawn=host.sandbox.spawner("shell", host.policy))
        )
        await wait_processes(tok, 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # No waiting here: a finished cancel means the tree is already gone.
        assert processes_with(tok) == []

    asyncio.run(scenario())


def test_normal_exit_and_timeout_kill_the_tree(host: Host) -> None:
    need("cgroup_kill")
    tok = token()
    res = host.run(f"( setsid sh -c 'trap \"\" TERM; exec sleep 987.{tok}' & ); echo done")
    assert res.output == "done\n" and res.returncode == 0
    assert processes_with(tok) == []
    res = host.run(escaper(tok), timeout_s=0.5)
    assert res.timed_out
    assert processes_with(tok) == []


@pytest.mark.parametrize(
    "off",
    [frozenset(), frozenset({"cgroup"}), frozenset({"namespaces"})],
    ids=["all-layers", "no-cgroup", "no-pidns"],
)
def test_executor_sigkill_kills_the_tree(host: Host, off: frozenset[str]) -> None:
    """Each of pdeathsig+pid namespace and the cgroup alone is enough."""
    need("pdeathsig", "namespaces" if "namespaces" not in off else "cgroup")
    tok = token()
    holder = _start_holder(host, escaper(tok), off)
    try:
        asyncio.run(wait_processes(tok, 2))
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        _wait_gone(tok)
    finally:
        _stop(holder)
    if "cgroup" not in off:
        # The next executor still finds the dead one's (now empty) cgroups, and removes them.
        fresh = Sandbox(SandboxConfig(TEST_POLICY), host.home / "workspaces")
        fresh.start()
        fresh.close()


def test_new_executor_kills_leftovers(host: Host) -> None:
    """With the dying-with-parent layers lowered, only the next executor's sweep remains."""
    need("cgroup", "cgroup_kill")
    if host.backend == "bwrap":
        pytest.skip("bwrap always dies with its parent (--die-with-parent): nothing is left over")
    tok = token()
    off = frozenset({"pdeathsig", "namespaces"})
    holder = _start_holder(host, escaper(tok), off)
    try:
        asyncio.run(wait_processes(tok, 2))
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert len(processes_with(tok)) >= 2, "expected the lowered tree to survive its executor"
        fresh = Sandbox(SandboxConfig(TEST_POLICY), host.home / "workspaces")
        killed = fresh.start()
        fresh.close()
        assert killed >= 2
        _wait_gone(tok)
    finally:
        _stop(holder)
        for proc in processes_with(tok):
            proc.kill()


def test_close_leaves_no_call_cgroup_behind() -> None:
    """A call whose clean-up never ran (its task cancelled mid-way) leaves its cgroup
    directory, and a process in it: the executor's close removes both."""
    need("cgroup")
    tree = CgroupTree(Hierarchies.discover())
    tree.prepare()
    call = tree.new_call()
    for d in call.dirs:
        d.mkdir()
    sleeper = subprocess.Popen(["sleep", "1000"])
    try:
        for d in call.dirs:
            (d / "cgroup.procs").write_text(str(sleeper.pid))
        tree.close()
        assert sleeper.wait(timeout=BOUND_S) != 0
        assert not [d for d in call.dirs if d.parent.exists()]
    finally:
        _stop(sleeper)


def _start_holder(host: Host, command: str, off: frozenset[str]) -> subprocess.Popen[bytes]:
    env = child_env(HERE)
    return subprocess.Popen(
        [sys.executable, str(HERE / "holder.py"), str(host.home), host.backend, command,
         *sorted(off)],
        env=env, stdout=subprocess.DEVNULL,
    )


def _wait_gone(tok: str) -> None:
    # Orphans are reaped by whoever adopts them: poll the observable end, bounded.
    deadline = time.monotonic() + BOUND_S
    while left := processes_with(tok):
        assert time.monotonic() < deadline, f"survived their executor: {[p.pid for p in left]}"
        time.sleep(0.005)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for child in psutil.Process().children(recursive=True):
        if child.pid == proc.pid:
            child.kill()
