"""Adversarial: resources and privileges. Bombs stay bounded, privileges stay dropped."""

from __future__ import annotations

import os

import pytest
from sbhelp import TEST_POLICY, Host, need

FORK_BOMB = """
import os, sys
r, w = os.pipe()
made = 0
for _ in range(300):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.close(w)
        os.read(r, 1)  # park until the call ends (the pipe closes when the tree dies)
        os._exit(0)
    made += 1
print(made, flush=True)
"""


@pytest.mark.parametrize("as_root", [False, True], ids=["tool-uid", "root"])
def test_bounded_fork_bomb(mhost: Host, as_root: bool) -> None:
    host = mhost
    if as_root and host.view is not None:
        pytest.skip("the modes on the user's files refuse a policy without the uid layer")
    need("cgroup")
    policy = TEST_POLICY.lowered(off=frozenset({"uid"})) if as_root else TEST_POLICY
    if not as_root:
        need("uid")
    elif host.backend == "bwrap":
        pytest.skip("the bubblewrap backend refuses to run a tool as root (see test_policy)")
    res = host.py(FORK_BOMB, policy)
    made = int(res.output.split()[0])
    # pids.max counts every process of the call (sh, python, the forks).
    assert made < TEST_POLICY.limits.pids, res.output


def test_memory_balloon(mhost: Host) -> None:
    host = mhost
    need("cgroup")
    res = host.py("b = bytearray(1536 * 1024 * 1024)\nprint('survived')")
    assert "survived" not in res.output
    assert res.returncode != 0


def test_cpu_spin_past_the_cpu_limit(mhost: Host) -> None:
    host = mhost
    need("rlimits")
    res = host.py("while True:\n    pass\n", TEST_POLICY.lowered(cpu_s=1))
    assert res.returncode != 0 and not res.timed_out, res


def test_huge_file_write(mhost: Host) -> None:
    host = mhost
    if host.mode == "read-only":
        pytest.skip("read-only: nothing to write in the working directory")
    need("rlimits")
    res = host.run("dd if=/dev/zero of=big bs=1M count=64")
    assert res.returncode != 0
    assert (host.workspace / "big").stat().st_size <= TEST_POLICY.file_bytes


def test_fd_exhaustion(mhost: Host) -> None:
    host = mhost
    need("rlimits")
    res = host.py("""
import os
fds = []
try:
    while True:
        fds.append(os.open("/dev/null", os.O_RDONLY))
except OSError as exc:
    print(len(fds), exc.errno)
""")
    count, err = map(int, res.output.split())
    assert count < TEST_POLICY.nofile and err == 24, res.output  # EMFILE


def test_host_pids_invisible(mhost: Host) -> None:
    host = mhost
    need("namespaces")
    res = host.run(f"ls /proc | grep -c '^[0-9]'; kill -0 {os.getpid()} && echo ALIVE; kill -0 1")
    lines = res.output.split("\n")
    assert int(lines[0]) < 10, res.output  # init, sh, ls, grep: not the host's hundreds
    assert "ALIVE" not in res.output


def test_privileges_dropped(mhost: Host) -> None:
    host = mhost
    need("uid", "no_new_privs")
    res = host.run("grep -E '^(NoNewPrivs|CapEff|Seccomp):' /proc/self/status")
    fields = dict(line.split(":\t") for line in res.output.splitlines())
    assert fields["NoNewPrivs"] == "1"
    assert int(fields["CapEff"], 16) == 0
    assert fields.get("Seccomp") == "2" or machine_missing("seccomp")


def machine_missing(layer: str) -> bool:
    from actors.sandbox import machine_layers

    return bool(machine_layers().get(layer))


@pytest.mark.parametrize(
    "command",
    [
        "unshare --user true",
        "unshare --user --map-root-user true",
        "unshare --mount true",
        "mount -t tmpfs none /mnt",
        "mknod null2 c 1 3",
        "chroot / true",
    ],
)
def test_nested_namespaces_mount_mknod_fail(mhost: Host, command: str) -> None:
    host = mhost
    need("uid", "seccomp")
    res = host.run(command)
    assert res.returncode != 0, res.output
    assert not (host.workspace / "null2").exists()


@pytest.mark.parametrize("as_root", [False, True], ids=["tool-uid", "root"])
def test_nested_user_namespace_fails_even_as_root(mhost: Host, as_root: bool) -> None:
    host = mhost
    if as_root and host.view is not None:
        pytest.skip("the modes on the user's files refuse a policy without the uid layer")
    need("seccomp")
    if as_root and host.backend == "bwrap":
        pytest.skip("the bubblewrap backend refuses to run a tool as root (see test_policy)")
    policy = TEST_POLICY.lowered(off=frozenset({"uid"})) if as_root else TEST_POLICY
    res = host.run("unshare --user --map-root-user id; unshare --mount --fork id", policy)
    assert "uid=0" not in res.output, res.output


def test_ptrace_and_process_vm_denied(mhost: Host) -> None:
    host = mhost
    need("seccomp")
    res = host.py("""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
print(libc.ptrace(0, 0, 0, 0), ctypes.get_errno())      # PTRACE_TRACEME
print(libc.syscall(310, 1, 0, 0, 0, 0, 0), ctypes.get_errno())  # process_vm_readv
print(libc.syscall(321, 0, 0, 0), ctypes.get_errno())   # bpf
print(libc.syscall(323, 0), ctypes.get_errno())         # userfaultfd
""")
    assert res.output.split() == ["-1", "1"] * 4, res.output


def test_tiocsti_terminal_injection(mhost: Host) -> None:
    host = mhost
    need("seccomp")
    res = host.py("""
import fcntl, os, termios
try:
    fcntl.ioctl(0, termios.TIOCSTI, b"x")
    print("INJECTED")
except OSError as exc:
    print("DENIED", exc.errno)
try:
    os.open("/dev/tty", os.O_RDWR)
    print("TTY")
except OSError as exc:
    print("NOTTY", exc.errno)
""")
    assert "DENIED 1" in res.output and "INJECTED" not in res.output, res.output  # EPERM
    assert "TTY\n" not in res.output


def test_timeout_enforced(mhost: Host) -> None:
    host = mhost
    res = host.run("sleep 30", timeout_s=0.3)
    assert res.timed_out
