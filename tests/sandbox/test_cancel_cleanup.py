"""A call cancelled at any stage of its life leaves nothing behind while the executor runs:
no process, no call cgroup, no launcher, no file descriptor.

An executor's close sweeps whatever its calls left (test_kill_tree); these cases check
the calls themselves, one stage at a time: cancelled while the launcher is being
started, while the output is drained after a normal exit, and cancelled again while
the clean-up of a first cancel runs (an Abort after a timeout, or the supervisor's
jobs abandoned after an Abort). Each stage is reached by a real event (the launcher
forked, `run_command` killing the tree), never by a sleep.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from prockit import processes_with, run_bounded, token
from sbhelp import BOUND_S, TEST_POLICY, Host, need, wait_processes

from actors.sandbox import Sandbox, SandboxConfig, SandboxedChild
from actors.tools.process import ChildProcess, Spawner, run_command

HERE = Path(__file__).parent

@dataclass
class HookedChild:
    """A real sandboxed child that runs `on_kill` after `run_command` kills its tree:
    the moment the call moves from running to its clean-up."""

    inner: SandboxedChild
    on_kill: Callable[[], None]

    @property
    def process(self) -> ChildProcess:
        """The launcher."""
        return self.inner.process

    @property
    def stderr(self) -> asyncio.StreamReader | None:
        """The command's stderr pipe."""
        return self.inner.stderr

    def kill(self) -> None:
        """Kill the tree, then run the hook."""
        self.inner.kill()
        self.on_kill()

    async def aclose(self) -> str:
        """The sandbox's own clean-up."""
        return await self.inner.aclose()


def hooked(spawn: Spawner, on_kill: Callable[[], None]) -> Spawner:
    """`spawn`, its children wrapped in `HookedChild`."""

    async def wrapped(command: str, cwd: Path) -> HookedChild:
        child = await spawn(command, cwd)
        assert isinstance(child, SandboxedChild)
        return HookedChild(child, on_kill)

    return wrapped


def open_fds() -> set[int]:
    """This process's open file descriptors."""
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


def fork_server_children() -> list[psutil.Process]:
    """Launchers forked by this process's fork server and not yet reaped by it."""
    out = []
    for server in psutil.Process().children():
        if any("zygote" in part for part in server.cmdline()):
            out.extend(server.children())
    return out


def exec_launchers() -> list[psutil.Process]:
    """Launchers this process exec'd itself (the fallback without a fork server). The
    bubblewrap backend's launcher execs `bwrap` in its place once it has read its spec:
    the same process, under another command line (a test that looked twice saw it go)."""
    return [proc for proc in psutil.Process().children() if _is_launcher(proc)]


def _is_launcher(proc: psutil.Process) -> bool:
    try:
        argv = proc.cmdline()
    except psutil.Error:  # (gone meanwhile)
        return False
    return bool(argv) and (os.path.basename(argv[0]) == "bwrap"
                           or any("launcher.main" in part for part in argv))


async def turns_until(seen: Callable[[], object], task: asyncio.Task[object]) -> None:
    """Run the loop a turn at a time until `seen()` (bounded). A call's first step may
    await before it forks: its view is decided in a thread when the mount table changed
    since it was remembered (`viewcache.py`), as another test's workspace mount does;
    one turn then missed the fork, and the test failed only beside the others."""
    deadline = time.monotonic() + BOUND_S
    while not seen():
        assert not task.done(), task
        assert time.monotonic() < deadline, "the launcher never started"
        await asyncio.sleep(0)


async def warm_up(host: Host, sandbox: Sandbox | None = None) -> set[int]:
    """One whole call first (the fork server, the event loop's fds); the fds after it."""
    res = await run_command(
        "true", host.workspace, timeout_s=BOUND_S, cap=1024,
        spawn=(sandbox or host.sandbox).spawner("shell", host.policy),
    )
    assert res.returncode == 0, res
    assert not res.refused, res
    return open_fds()


def assert_nothing_left(sandbox: Sandbox, tok: str, fds: set[int]) -> None:
    """The invariants once a cancelled call has returned: checked at once, no waiting."""
    stats = sandbox.statistics()
    left = {
        "call cgroup dirs": stats.call_cgroups,
        "launchers not closed": stats.launchers,
        "tool processes": len(processes_with(tok)),
        "launchers unreaped": len(fork_server_children()) + len(exec_launchers()),
        "fds": sorted(open_fds() - fds),
    }
    assert not any(left.values()), f"the cancelled call left: {left}"


async def cancelled(task: asyncio.Task[object]) -> None:
    """Await `task`, which must end cancelled."""
    with pytest.raises(asyncio.CancelledError):
        await task


def test_cancel_while_draining_after_exit(host: Host) -> None:
    """The tool exited; its tree is killed and its output drained when the cancel lands."""
    need("cgroup")
    tok = token()

    async def scenario() -> None:
        fds = await warm_up(host)
        task: asyncio.Task[object] | None = None

        def cancel() -> None:
            assert task is not None
            task.cancel()

        spawn = hooked(host.sandbox.spawner("shell", host.policy), cancel)
        task = asyncio.create_task(
            run_command(f"echo {tok}", host.workspace, timeout_s=BOUND_S, cap=1024,
                        spawn=spawn)
        )
        await cancelled(task)
        assert_nothing_left(host.sandbox, tok, fds)

    asyncio.run(scenario())


def test_second_cancel_during_clean_up(host: Host) -> None:
    """Cancelled while running, and again while that cancel kills and reaps the tree."""
    need("cgroup", "cgroup_kill")
    tok = token()

    async def scenario() -> None:
        fds = await warm_up(host)
        task: asyncio.Task[object] | None = None

        def cancel_again() -> None:
            assert task is not None
            task.cancel()

        spawn = hooked(host.sandbox.spawner("shell", host.policy), cancel_again)
        task = asyncio.create_task(
            run_command(f"exec sleep 1000.{tok}", host.workspace, timeout_s=60, cap=1024,
                        spawn=spawn)
        )
        await wait_processes(tok, 1)
        task.cancel()
        await cancelled(task)
        assert_nothing_left(host.sandbox, tok, fds)

    asyncio.run(scenario())


@pytest.mark.parametrize("abort", [False, True], ids=["timeout", "timeout-then-abort"])
def test_job_timeout(host: Host, abort: bool) -> None:
    """The executor's job timeout (a scope around the tool) fires while the tool runs,
    alone or followed by an Abort during the clean-up: still a TimeoutError when alone
    (the executor answers "timed out"), a cancellation with the Abort."""
    need("cgroup", "cgroup_kill")
    tok = token()

    async def scenario() -> None:
        fds = await warm_up(host)
        task: asyncio.Task[object] | None = None

        def maybe_abort() -> None:
            if abort:
                assert task is not None
                task.cancel()

        spawn = hooked(host.sandbox.spawner("shell", host.policy), maybe_abort)
        scopes: list[asyncio.Timeout] = []

        async def job() -> object:
            # As Executor.perform: the job's timeout is a scope around the tool.
            async with asyncio.timeout(None) as scope:
                scopes.append(scope)
                return await run_command(f"exec sleep 1000.{tok}", host.workspace,
                                         timeout_s=60, cap=1024, spawn=spawn)

        task = asyncio.create_task(job())
        await wait_processes(tok, 1)
        scopes[0].reschedule(asyncio.get_running_loop().time())  # expires now
        if abort:
            await cancelled(task)
        else:
            with pytest.raises(TimeoutError):
                await task
        assert_nothing_left(host.sandbox, tok, fds)

    asyncio.run(scenario())


@pytest.mark.parametrize("tool", ["shell", "write_file"])
def test_cancel_during_launch(host: Host, tool: str) -> None:
    """Cancelled after the fork server forked the launcher, before the launch returned."""
    need("cgroup", "cgroup_kill")
    tok = token()

    async def scenario() -> None:
        fds = await warm_up(host)
        if tool == "shell":
            call = run_command(f"exec sleep 1000.{tok}", host.workspace, timeout_s=60,
                               cap=1024, spawn=host.sandbox.spawner("shell", host.policy))
        else:
            call = host.sandbox.write_file(
                "write_file", host.policy, host.workspace / f"f{tok}", b"x", host.workspace
            )
        task = asyncio.create_task(call)
        # The fork (a blocking round trip to the fork server) comes a step before
        # connecting the output pipe: seen between two loop turns. A write is done by
        # the launcher's init itself and may be over (the launcher reaped) already.
        await turns_until(lambda: fork_server_children() or tool == "write_file", task)
        forked = len(fork_server_children())
        assert forked == 1 or tool == "write_file" and forked == 0, "the launcher never forked"
        task.cancel()
        await cancelled(task)
        assert_nothing_left(host.sandbox, tok, fds)

    asyncio.run(scenario())


def test_cancel_during_exec_launch(host: Host) -> None:
    """Without a fork server: cancelled once the launcher is exec'd, before it is connected.

    The start kills and reaps the launcher it exec'd; the call's cgroup, if the
    launcher made it by then, goes too."""
    need("cgroup", "cgroup_kill")
    tok = token()
    sandbox = Sandbox(
        SandboxConfig(TEST_POLICY), host.home / "workspaces", hide=(host.home,),
        fork_server=False,
    )
    sandbox.start()

    async def scenario() -> None:
        fds = await warm_up(host, sandbox)
        task = asyncio.create_task(
            run_command(f"exec sleep 1000.{tok}", host.workspace, timeout_s=60, cap=1024,
                        spawn=sandbox.spawner("shell", host.policy))
        )
        # The fork and the exec are one blocking step (Popen): the launcher is seen
        # between two turns, before the steps that connect its pipes. (Waiting for any
        # new child instead was fooled by another's: a workspace's cleanup may run
        # `umount`. The loop was then held while the call had not even forked.)
        await turns_until(exec_launchers, task)
        assert len(exec_launchers()) == 1, "expected one launcher started by now"
        task.cancel()
        await cancelled(task)
        assert_nothing_left(sandbox, tok, fds)

    try:
        asyncio.run(scenario())
    finally:
        sandbox.close()


# A stand-in executor without a fork server: its main coroutine starts a shell call,
# waits (a loop turn at a time) until the launcher is exec'd, then fails, so that
# asyncio.run cancels every task left at once, the start's own and, with asyncio's
# transport, the task connecting the launcher's pipes. That hung for good (CPython
# 3.11): an executor stopping then was SIGKILLed by its host after its grace.
ENDED_DURING_EXEC_LAUNCH = """
import asyncio, contextlib, dataclasses, os, sys
from pathlib import Path
import psutil
from sbhelp import TEST_POLICY
from actors.sandbox import Sandbox, SandboxConfig
from actors.tools.process import run_command

class Ended(Exception):
    pass

def launchers():
    # (the bubblewrap backend's launcher execs bwrap in its place once it read its spec)
    found = []
    for proc in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            argv = proc.cmdline()
            if argv and (os.path.basename(argv[0]) == "bwrap"
                         or any("launcher.main" in part for part in argv)):
                found.append(proc)
    return found

async def main(sandbox, workspace, backend, tok):
    policy = dataclasses.replace(TEST_POLICY, backend=backend)
    task = asyncio.create_task(run_command(
        f"exec sleep 1000.{tok}", workspace, timeout_s=60, cap=1024,
        spawn=sandbox.spawner("shell", policy)))
    while not launchers():
        assert not task.done(), task
        await asyncio.sleep(0)
    raise Ended

home, workspace, backend, tok = sys.argv[1:]
sandbox = Sandbox(SandboxConfig(TEST_POLICY), Path(home) / "workspaces", hide=(Path(home),),
                  fork_server=False)
sandbox.start()
try:
    asyncio.run(main(sandbox, Path(workspace), backend, tok))
except Ended:
    print("ended; children left:", len(psutil.Process().children()),
          "launchers:", sandbox.statistics().launchers)
finally:
    sandbox.close()
"""


def test_run_ended_during_exec_launch(host: Host) -> None:
    """Without a fork server: the event loop's end (every task cancelled at once) lands
    once the launcher is exec'd, before its pipes are connected. The run ends at once,
    the launcher killed and reaped, nothing of the call left; it hung on asyncio's
    subprocess transport. In a child interpreter, bounded: a hang fails the case."""
    need("cgroup", "cgroup_kill")
    tok = token()
    done = run_bounded(ENDED_DURING_EXEC_LAUNCH, str(host.home), str(host.workspace),
                       host.backend, tok, tok=tok, bound_s=BOUND_S, paths=(HERE,),
                       hung="asyncio.run hung: the cancelled exec launch never returned")
    assert done.stdout == "ended; children left: 0 launchers: 0\n", done.stderr
    assert processes_with(tok) == []
