"""Adversarial: sessions against each other, and against the executor's own caps.

Each session runs as its own uid, so one session holding processes (RLIMIT_NPROC
is per uid) cannot make another's `shell` fail with "Cannot fork", nor signal or
ptrace it; the executor's cgroup caps every call together.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sbhelp import BOUND_S, PYTHON, TEST_POLICY, Host, need, need_python

from actors.sandbox import Limits, Policy, Sandbox, SandboxConfig, SandboxedChild
from actors.sandbox.cgroups import CgroupTree
from actors.sandbox.uids import CLAIMS, UidsExhausted, assign, preferred
from actors.tools.process import ToolRefused, release, run_command

HOARD = """
import os, sys, time
r, w = os.pipe()
made = 0
for _ in range({count}):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)  # parked while the parent (holding w) lives
        os._exit(0)
    made += 1
print(made, flush=True)
time.sleep(3600)
"""

FORKS = "for i in 1 2 3 4 5 6 7 8; do /bin/true & done; wait && echo forked"


async def start(sandbox: Sandbox, policy: Policy, cwd: Path, code: str) -> SandboxedChild:
    """Launch Python `code` in `cwd` and keep it running (the caller kills it)."""
    (cwd / "case.py").write_text(code)
    os.chmod(cwd / "case.py", 0o644)
    return await sandbox.launch("shell", policy, cwd, argv=[PYTHON, "-I", "-S", "case.py"])


async def first_line(child: SandboxedChild) -> str:
    """The first line the child prints (bounded: the sandbox's own timeout is longer)."""
    assert child.process.stdout is not None
    async with asyncio.timeout(30):
        return (await child.process.stdout.readline()).decode()


async def shell(sandbox: Sandbox, policy: Policy, cwd: Path, command: str) -> str:
    """Run `command` to completion; its output."""
    res = await run_command(command, cwd, timeout_s=BOUND_S, cap=64 * 1024,
                            spawn=sandbox.spawner("shell", policy))
    return res.output


def test_process_hoard_does_not_starve_another_session(host: Host) -> None:
    """5 calls of one session each try to hold 250 processes; another session still forks."""
    need("uid", "cgroup")
    need_python()
    policy = dataclasses.replace(
        host.policy, limits=Limits(memory_bytes=512 * 1024 * 1024, pids=300, cpu=1.0)
    )
    other = host.sandbox.workspace("s2")
    assert other.stat().st_uid != host.uid

    async def attack() -> tuple[list[int], str, str]:
        children = []
        try:
            for n in range(5):
                ws = host.workspace / f"c{n}"
                ws.mkdir()
                os.chown(ws, host.uid, host.uid)
                children.append(await start(host.sandbox, policy, ws, HOARD.format(count=250)))
            made = [int(await first_line(child)) for child in children]
            victim = await shell(host.sandbox, policy, other, FORKS)
            # The hoarding session itself is the one that cannot fork any more.
            try:
                own = await shell(host.sandbox, policy, host.workspace, FORKS)
            except ToolRefused as exc:  # its shell cannot even start: exec fails on NPROC
                own = str(exc)
            return made, victim, own
        finally:
            for child in children:
                child.kill()
                await release(child)

    made, victim, own = asyncio.run(attack())
    # RLIMIT_NPROC (4 x pids per uid) stopped the hoard short of 5 x 250 ...
    assert sum(made) < 5 * 250 and max(made) == 250, made
    # ... and only for its own uid: the other session forks as usual.
    assert victim == "forked\n", victim
    assert "forked" not in own
    assert host.run("echo ok").output == "ok\n"  # the hoarding session recovers after


def test_sessions_cannot_signal_or_ptrace_each_other(host: Host) -> None:
    """Different uids: with the pid namespace, Landlock and seccomp lowered on the attacker
    (so only the uid stands in the way), it still cannot signal or trace the victim."""
    need("uid", "namespaces", "landlock", "seccomp")
    need_python()
    if host.backend == "bwrap":
        pytest.skip("lowering the namespaces is the launcher backend's only")
    bare = host.policy.lowered(off=frozenset({"namespaces", "landlock", "seccomp"}))
    other = host.sandbox.workspace("s2")
    probe = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
try:
    os.kill(pid, 0)
    print("SIGNAL ok")
except OSError as exc:
    print("SIGNAL", exc.errno)
print("PTRACE", libc.ptrace(16, pid, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
"""

    async def attack() -> tuple[str, str, str]:
        victim = await start(host.sandbox, host.policy, host.workspace,
                             "import os, time\nprint(os.getuid(), os.getpid(), flush=True)\n"
                             "time.sleep(3600)\n")
        try:
            uid_a, _ = (await first_line(victim)).split()
            # Its host pid: the launcher's grandchild, inside a pid namespace.
            pid = _descendant_running(victim.process.pid, "case.py")
            for ws in (other, host.workspace):
                (ws / "probe.py").write_text(probe)
                os.chmod(ws / "probe.py", 0o644)
            across = await shell(host.sandbox, bare, other,
                                 f"id -u; {PYTHON} -I -S probe.py {pid}")
            same = await shell(host.sandbox, bare, host.workspace,
                               f"{PYTHON} -I -S probe.py {pid}")
            return uid_a, across, same
        finally:
            victim.kill()
            await release(victim)

    uid_a, across, same = asyncio.run(attack())
    uid_b = across.split()[0]
    assert uid_a != uid_b and int(uid_b) == other.stat().st_uid, (uid_a, across)
    assert "SIGNAL 1" in across and "PTRACE -1 1" in across, across  # EPERM, both
    # The same session's uid could: the uid is what stopped the other one.
    assert "SIGNAL ok" in same, same
    assert host.run("echo ok").output == "ok\n"


def _descendant_running(pid: int, arg: str) -> int:
    import psutil

    for proc in psutil.Process(pid).children(recursive=True):
        if any(arg in part for part in proc.cmdline()):
            return proc.pid
    raise AssertionError(f"no descendant of {pid} runs {arg}")


@pytest.fixture
def workspaces() -> Iterator[Path]:
    """An empty workspaces directory."""
    path = Path(tempfile.mkdtemp(prefix="ophs-uids-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_uid_assignment_is_deterministic_and_collision_safe(workspaces: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("assigning uids chowns workspaces: needs root")
    first, last = 70000, 70007
    names = [f"s{i}" for i in range(40)]
    clash = next((a, b) for a in names for b in names
                 if a < b and preferred(workspaces, a, first, last)
                 == preferred(workspaces, b, first, last))
    got = [assign(workspaces, name, first, last)[1] for name in clash]
    assert got[0] == preferred(workspaces, clash[0], first, last)
    assert got[0] != got[1], "two live sessions hashing alike share a uid"
    # Stable: the workspace's owner is the record.
    assert assign(workspaces, clash[1], first, last)[1] == got[1]
    def held() -> set[int]:
        return {p.stat().st_uid for p in workspaces.iterdir() if p.name != CLAIMS}

    for name in names:
        if len(held()) == last - first + 1:
            break
        assign(workspaces, name, first, last)
    # The claims index lost: rebuilt from the workspaces' owners, nothing handed out twice.
    shutil.rmtree(workspaces / CLAIMS)
    with pytest.raises(UidsExhausted, match="uid_range"):
        assign(workspaces, "one-too-many", first, last)
    # A workspace from before (owned by another uid) is given one of the range, all of it.
    old = workspaces / "old"
    (old / "sub").mkdir(parents=True)
    (old / "sub" / "f").write_text("x")
    shutil.rmtree(workspaces / clash[0])
    _, uid = assign(workspaces, "old", first, last)
    assert uid == got[0]
    assert {p.stat().st_uid for p in (old, old / "sub", old / "sub" / "f")} == {uid}
    # One uid configured: every session shares it (the operator's choice).
    assert assign(workspaces, "shared", 64000, 64000)[1] == 64000


def test_claim_survives_an_unmounted_workspace(workspaces: Path) -> None:
    """A workspace seen root-owned for a while (its quota image not mounted yet) keeps
    its uid: a newcomer gets another; once the workspace is gone the uid is free."""
    if os.geteuid() != 0:
        pytest.skip("assigning uids chowns workspaces: needs root")
    _, held = assign(workspaces, "a", 70000, 70001)
    os.chown(workspaces / "a", 0, 0)
    _, other = assign(workspaces, "b", 70000, 70001)
    assert other != held
    with pytest.raises(UidsExhausted):
        assign(workspaces, "c", 70000, 70001)
    (workspaces / "a").rmdir()
    assert assign(workspaces, "c", 70000, 70001)[1] == held


def _assign_many(workspaces: Path, prefix: str, count: int) -> list[int]:
    return [assign(workspaces, f"{prefix}{i}", 70000, 70047)[1] for i in range(count)]


def test_concurrent_executors_never_share_a_uid(workspaces: Path) -> None:
    """Two executors (processes) creating sessions at once, 40 for 48 uids: all distinct."""
    if os.geteuid() != 0:
        pytest.skip("assigning uids chowns workspaces: needs root")
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(2) as pool:
        parts = list(pool.map(_assign_many, [workspaces] * 2, ["a", "b"], [20, 20]))
    uids = parts[0] + parts[1]
    assert len(set(uids)) == 40, sorted(uids)
    owners = [p.stat().st_uid for p in workspaces.iterdir() if p.name != CLAIMS]
    assert sorted(owners) == sorted(uids)


def test_executor_cgroup_caps_every_call_together(host: Host) -> None:
    """Per-call limits above the executor's: the executor's pids and memory still hold."""
    need("cgroup")
    need_python()
    caps = Limits(memory_bytes=192 * 1024 * 1024, pids=100, cpu=1.0)
    sandbox = Sandbox(SandboxConfig(host.policy, executor=caps), host.home / "ws-capped",
                      hide=(host.home,))
    sandbox.start()
    try:
        tree = sandbox._cgroups
        assert isinstance(tree, CgroupTree)
        for path, value in tree.limit_files(caps):
            assert Path(path).read_text().split()[0] == value.split()[0], path
        generous = dataclasses.replace(
            host.policy, limits=Limits(memory_bytes=1024 * 1024 * 1024, pids=400, cpu=2.0)
        )
        ws = sandbox.workspace("s1")

        async def attack() -> tuple[int, str, str]:
            bomb = await start(sandbox, generous, ws, HOARD.format(count=300))
            try:
                made = int(await first_line(bomb))
            finally:
                bomb.kill()
                await release(bomb)
            balloon = await shell(sandbox, generous, ws,
                                  f"{PYTHON} -c 'b = bytearray(400 << 20); print(\"survived\")'")
            after = await shell(sandbox, generous, ws, "echo ok")
            return made, balloon, after

        made, balloon, after = asyncio.run(attack())
    finally:
        sandbox.close()
    assert made < caps.pids, made
    assert "survived" not in balloon, balloon
    assert after == "ok\n"


def test_executor_caps_default_from_the_machine_and_config(tmp_path: Path) -> None:
    from actors.sandbox.cgroups import executor_limits

    default = executor_limits()
    assert TEST_POLICY.limits.memory_bytes < default.memory_bytes
    assert 0 < default.pids <= 4096 and default.cpu >= 1.0
    (tmp_path / "sandbox.toml").write_text(
        "[sandbox]\nuid_range = [200000, 200999]\nexecutor_pids = 900\n"
    )
    config = SandboxConfig.load(tmp_path)
    assert config.policy("shell").uid_range == (200000, 200999)
    assert config.executor == Limits(default.memory_bytes, 900, default.cpu)
    from actors.sandbox import PolicyError

    for bad in ("uid_range = [0, 10]", "uid_range = [5, 4]", "uid = 7\nuid_range = [7, 8]",
                "executor_memory_mb = -1", 'unix_sockets = "yes"'):
        (tmp_path / "sandbox.toml").write_text(f"[sandbox]\n{bad}\n")
        with pytest.raises(PolicyError):
            SandboxConfig.load(tmp_path)


def test_sessions_of_one_user_cannot_signal_or_ptrace_each_other(mhost: Host) -> None:
    """In the modes on the user's files two sessions run as the same uid: the pid
    namespace (no pid of the other is nameable) and Landlock's signal scope stop it."""
    need("namespaces", "landlock", "seccomp")
    need_python()
    host = mhost
    if host.view is None:
        pytest.skip("scratch: sessions have different uids (the case above)")
    probe = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
try:
    os.kill(pid, 9)
    print("SIGNAL ok", flush=True)
except OSError as exc:
    print("SIGNAL", exc.errno, flush=True)
print("PTRACE", libc.ptrace(16, pid, 0, 0), ctypes.get_errno(), flush=True)
try:
    os.kill(-1, 9)
except OSError as exc:
    print("KILLALL", exc.errno)
"""

    async def attack() -> tuple[str, str, bool]:
        from actors.sandbox import modes

        with modes.using(host.view):
            victim = await start(host.sandbox, host.policy, host.workspace,
                                 "import os, time\nprint(os.getuid(), flush=True)\n"
                                 "time.sleep(3600)\n")
            try:
                uid_a = (await first_line(victim)).strip()
                pid = _descendant_running(victim.process.pid, "case.py")
                (host.workspace / "probe.py").write_text(probe)
                os.chmod(host.workspace / "probe.py", 0o644)
                across = await shell(host.sandbox, host.policy, host.workspace,
                                     f"id -u; {PYTHON} -I -S probe.py {pid}")
                alive = victim.process.returncode is None and _descendant_running(
                    victim.process.pid, "case.py") == pid
                return uid_a, across, alive
            finally:
                victim.kill()
                await release(victim)

    uid_a, across, alive = asyncio.run(attack())
    assert across.split()[0] == uid_a, (uid_a, across)  # the same user ...
    assert "SIGNAL ok" not in across and "PTRACE -1" in across, across
    assert alive, across  # ... and the victim still runs
