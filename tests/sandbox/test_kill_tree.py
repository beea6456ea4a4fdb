"""Adversarial: a tree that tries to outlive its call. It dies on cancel, on timeout, on a
normal exit, when the executor is SIGKILLed, and a new executor sweeps what is left."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from prockit import child_env, processes_with, token
from sbhelp import BOUND_S, Host, need, wait_processes

from actors.sandbox import machine_layers
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
    """The dying-with-parent layers take the tree down with its executor: the launcher's
    parent-death signal, then the pid namespace's init (killing it kills the namespace)
    or, without a namespace, the init as subreaper killing what it adopted."""
    need("pdeathsig", "namespaces" if "namespaces" not in off else "cgroup")
    tok = token()
    # The holder in a cgroup of its own (as in test_new_executor_kills_leftovers): an
    # executor starting beside it (another xdist worker's `host`, another suite's
    # executor) sweeps the dead holder's cgroups, and would kill the tree whether or not
    # the layers under test did. Here nothing sweeps before the check.
    with _private_cgroup(tok) as cgroup:
        with _killed_holder(host, tok, off, cgroup):
            _wait_gone(tok)
        if "cgroup" not in off:
            # The next executor still finds the dead one's (now empty) cgroups, and
            # removes them.
            _next_executor(host, cgroup)


def test_new_executor_kills_leftovers(host: Host) -> None:
    """With the dying-with-parent layers lowered, only the next executor's sweep remains."""
    need("cgroup", "cgroup_kill")
    if host.backend == "bwrap":
        pytest.skip("bwrap always dies with its parent (--die-with-parent): nothing is left over")
    tok = token()
    off = frozenset({"pdeathsig", "namespaces"})
    # The holder and the next executor in a cgroup of their own: any executor starting
    # beside them in the same cgroup (another xdist worker's `host`) sweeps the dead
    # holder's leftovers too, as it should, and did between the kill and the check
    # below (0 survivors, under load). Here only the next executor can.
    with _private_cgroup(tok) as cgroup, _killed_holder(host, tok, off, cgroup):
        assert len(processes_with(tok)) >= 2, "expected the lowered tree to survive its executor"
        assert _next_executor(host, cgroup) >= 2
        _wait_gone(tok)


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


def _start_holder(host: Host, command: str, off: frozenset[str],
                  cgroup: tuple[Path, ...]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(HERE / "holder.py"), str(host.home), host.backend, command,
         *sorted(off)],
        env=_holder_env(cgroup), stdout=subprocess.DEVNULL,
    )


@contextlib.contextmanager
def _killed_holder(host: Host, tok: str, off: frozenset[str],
                   cgroup: tuple[Path, ...]) -> Iterator[None]:
    """A holder in `cgroup` running the escaper of `tok`, SIGKILLed once its tree is up;
    after the block, the holder and whatever carries `tok` are killed."""
    holder = _start_holder(host, escaper(tok), off, cgroup)
    try:
        asyncio.run(wait_processes(tok, 2))
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        yield
    finally:
        _stop(holder)
        for proc in processes_with(tok):
            proc.kill()


def _next_executor(host: Host, cgroup: tuple[Path, ...]) -> int:
    """Start and close an executor in `cgroup` (a process of its own); what its start killed."""
    res = subprocess.run(
        [sys.executable, str(HERE / "holder.py"), "--sweep", str(host.home)],
        env=_holder_env(cgroup), capture_output=True, text=True, timeout=BOUND_S, check=False,
    )
    assert res.returncode == 0, res.stderr
    return int(res.stdout)


def _holder_env(cgroup: tuple[Path, ...]) -> dict[str, str]:
    return {**child_env(HERE), "HOLDER_CGROUPS": os.pathsep.join(map(str, cgroup))}


@contextlib.contextmanager
def _private_cgroup(tok: str) -> Iterator[tuple[Path, ...]]:
    """A child of this process's cgroup in every hierarchy a Sandbox uses (as it finds
    them): a process joining it runs its executor's cgroups under it. Removed after,
    with whatever is left in it killed. Without the sandbox's cgroup layer here, none:
    no executor then sweeps another's leftovers."""
    if machine_layers().get("cgroup"):
        yield ()
        return
    hier = Hierarchies.discover()
    bases = dict.fromkeys(p for p in (hier.v2, *hier.v1.values()) if p is not None)
    dirs = tuple(base / f"kill-tree-{tok}" for base in bases)
    for d in dirs:
        d.mkdir()
    try:
        yield dirs
    finally:
        for d in dirs:
            _remove_cgroup(d)


def _remove_cgroup(top: Path) -> None:
    deadline = time.monotonic() + BOUND_S
    for sub, _, _ in sorted(os.walk(top), key=lambda w: -len(Path(w[0]).parts)):
        while True:
            with contextlib.suppress(OSError):
                for pid in Path(sub, "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
            try:
                os.rmdir(sub)
                break
            except FileNotFoundError:
                break
            except OSError:  # busy: a process still dying
                assert time.monotonic() < deadline, f"cgroup {sub} stays busy"
                time.sleep(0.01)


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
