"""Adversarial: what of the host a tool reaches. No host unix socket, no /run, little of
/sys and /proc/sys; and the kernel surface, setuid files, tmpfs, output floods and
daemons left behind, each bounded. Every case ends with a normal call that works.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sbhelp import PYTHON, TEST_POLICY, Host, need, need_python, processes_with, wait_processes

from actors.tools.process import release


def assert_still_works(host: Host) -> None:
    """After the attack: an ordinary call in the same workspace still runs."""
    res = host.run("echo ok && ls >/dev/null")
    assert (res.returncode, res.output) == (0, "ok\n"), res


@pytest.fixture
def host_sockets() -> Iterator[list[tuple[Path, socket.socket]]]:
    """Root-owned 0777 unix sockets listening under /run and under /srv (or /var/tmp)."""
    token = secrets.token_hex(4)
    paths = [Path(f"/run/oploop-test-{token}.sock")]
    for base in ("/srv", "/var/tmp"):
        if os.path.isdir(base) and os.access(base, os.W_OK):
            paths.append(Path(base) / f"oploop-test-{token}.sock")
            break
    servers = []
    try:
        for path in paths:
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(str(path))
            os.chmod(path, 0o777)
            srv.listen(4)
            srv.setblocking(False)
            servers.append(srv)
        yield list(zip(paths, servers, strict=True))
    finally:
        for srv in servers:
            srv.close()
        for path in paths:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


CONNECT = """
import socket, sys
for path in sys.argv[1:]:
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        print("CONNECTED", path)
    except OSError as exc:
        print("DENIED", exc.errno, path)
a, b = socket.socketpair()  # what multiprocessing and friends use: still allowed
a.sendall(b"pair")
print("PAIR", b.recv(4).decode())
"""


@pytest.mark.parametrize("network", ["none", "host"])
def test_host_unix_sockets_unreachable(
    host: Host, host_sockets: list[tuple[Path, socket.socket]], network: str
) -> None:
    need("seccomp", "namespaces")
    need_python()
    policy = host.policy.lowered(network=network)
    (host.workspace / "connect.py").write_text(CONNECT)
    paths = [path for path, _ in host_sockets]
    res = host.run(f"{PYTHON} -I -S connect.py {' '.join(map(str, paths))}", policy)
    assert "PAIR pair" in res.output, res.output
    if network == "host":
        # The network lifts the socket() ban (a socket elsewhere is the host's to
        # reach, as its TCP ports are), not the private /run.
        assert f"DENIED 2 {paths[0]}" in res.output, res.output  # ENOENT: not there
        _never_connected(host_sockets[:1])
        return
    assert "CONNECTED" not in res.output, res.output
    assert res.output.count("DENIED 1 ") == len(paths), res.output  # EPERM: socket()
    for tool in ("nc -U", "socat - UNIX-CONNECT:"):
        name = tool.split()[0]
        if shutil.which(name) is None:
            continue
        for path in host_sockets:
            cmd = f"{tool}{path}" if tool.endswith(":") else f"{tool} {path}"
            res = host.run(f"echo hi | timeout 5 {cmd}; echo rc=$?", policy)
            assert "rc=0" not in res.output, (cmd, res.output)
    _never_connected(host_sockets)
    assert_still_works(host)


def _never_connected(servers: list[tuple[Path, socket.socket]]) -> None:
    for path, srv in servers:
        with pytest.raises(BlockingIOError):
            srv.accept()
            raise AssertionError(f"the sandbox connected to {path}")


def test_private_run(mhost: Host) -> None:
    host = mhost
    need("namespaces")
    token = secrets.token_hex(4)
    marker = Path(f"/run/oploop-marker-{token}")
    marker.write_text(f"content-{token}")
    try:
        assert os.listdir("/run")
        res = host.run(f"cat {marker} /var/run/{marker.name}")
        assert res.returncode != 0 and f"content-{token}" not in res.output, res.output
        res = host.run("ls -A /run/; ls -A /var/run/")  # empty, or not even listable
        assert not res.output.strip() or "Permission denied" in res.output, res.output
        assert host.run("ls /run/systemd || ls /run/dbus").returncode != 0
    finally:
        marker.unlink()
    assert_still_works(host)


def test_sys_and_proc_sys_hidden(mhost: Host) -> None:
    host = mhost
    need("namespaces")
    secret_paths = ["/sys/class/net", "/sys/fs/cgroup", "/proc/sys/kernel/hostname",
                    "/proc/sys/net", "/proc/sys/kernel/random/boot_id", "/sys/kernel",
                    "/sys/firmware"]
    assert all(os.path.exists(p) for p in secret_paths[:3])
    for path in secret_paths:
        res = host.run(f"ls {path} || cat {path}")
        assert res.returncode != 0, (path, res.output)
    res = host.run("ls /sys; ls /proc/sys")
    assert set(res.output.split()) <= {"devices", "kernel", "vm"}, res.output
    # Read-only: nothing can be planted there for the next tool either.
    assert host.run("touch /sys/x /proc/sys/x").returncode != 0
    assert_still_works(host)


def test_ordinary_tools_still_work(mhost: Host) -> None:
    host = mhost
    need("namespaces")
    need_python()
    res = host.run(
        f"nproc; {PYTHON} -c 'import os; print(os.cpu_count())'; ps -e >/dev/null && echo ps; "
        "df >/dev/null && echo df; df -h . >/dev/null && echo df.; free -m | grep -c '^Mem:'; "
        "id -u >/dev/null && echo id; uname -r >/dev/null && echo uname"
    )
    cores = str(len(os.sched_getaffinity(0)))
    assert res.returncode == 0, res.output
    assert res.output.split() == [cores, str(os.cpu_count()), "ps", "df", "df.", "1", "id",
                                  "uname"], res.output


# Machine code run from an executable mapping; RET never prints if the process is killed.
RAW_SYSCALL = """
import ctypes, mmap, sys
buf = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(bytes.fromhex(sys.argv[1]))
fn = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
print("RET", fn(), flush=True)
"""
INT80_GETPID = "b814000000cd80c3"  # mov eax, 20 (i386 getpid); int 0x80; ret
X32_GETPID = "b827000040" "0f05c3"  # mov eax, 0x40000027 (x32 getpid); syscall; ret
X32_UNSHARE = "b8100100400f05c3"  # mov eax, 0x40000110 (x32 unshare, rdi garbage); ...


@pytest.mark.parametrize("code", [INT80_GETPID, X32_GETPID, X32_UNSHARE],
                         ids=["int80", "x32-getpid", "x32-unshare"])
def test_foreign_syscall_abis(mhost: Host, code: str) -> None:
    """The i386 (`int 0x80`) and x32 ABIs bypass a filter written for x86-64 numbers:
    the filter kills them outright (on the host, the same code runs)."""
    host = mhost
    need("seccomp")
    need_python()
    if os.uname().machine != "x86_64":
        pytest.skip("x86-64 only: int 0x80 and x32 are its foreign ABIs")
    (host.workspace / "raw.py").write_text(RAW_SYSCALL)
    outside = subprocess.run([PYTHON, "-I", "-S", str(host.workspace / "raw.py"), code],
                             capture_output=True, text=True, timeout=20)
    res = host.run(f"{PYTHON} -I -S raw.py {code}; echo rc=$?")
    assert "RET" not in res.output, res.output
    assert "rc=159" in res.output, res.output  # 128 + SIGSYS: killed by the filter
    if code == INT80_GETPID:
        assert outside.stdout.startswith("RET "), outside  # the attack itself works outside
    assert_still_works(host)


def test_setuid_binaries_gain_nothing(mhost: Host) -> None:
    host = mhost
    need("uid", "no_new_privs")
    planted = host.workspace / "suid-id"
    shutil.copy("/usr/bin/id", planted)
    os.chown(planted, 0, 0)
    os.chmod(planted, 0o4755)
    res = host.run("./suid-id -u; ./suid-id -ru; mount -t tmpfs none /tmp && echo MOUNTED; "
                   "su -c id root </dev/null; passwd -S root </dev/null; true")
    lines = res.output.split()
    assert lines[:2] == [str(host.uid)] * 2, res.output  # euid too: no root gained
    assert "MOUNTED" not in res.output and "uid=0" not in res.output, res.output
    assert_still_works(host)


@pytest.mark.parametrize("where", ["/tmp", "/dev/shm", "/var/tmp"])
def test_tmpfs_fill_bounded(mhost: Host, where: str) -> None:
    host = mhost
    need("namespaces")
    token = secrets.token_hex(4)
    res = host.run(
        f"for i in $(seq 1 40); do dd if=/dev/zero of={where}/{token}.$i bs=1M count=8 "
        f"2>/dev/null || break; done; du -sm {where} | cut -f1"
    )
    used = int(res.output.split()[-1])
    assert used <= 65, res.output  # the 64 MB tmpfs, not 320 MB of RAM
    assert not list(Path(where).glob(f"{token}.*")), "the fill reached the host's tmpfs"
    # A new call gets an empty one again.
    assert host.run(f"ls {where} | grep -c {token}").output.strip() == "0"
    assert_still_works(host)


def test_100_mb_of_output(mhost: Host) -> None:
    host = mhost
    me = psutil.Process()
    before = me.memory_info().rss
    cap = 64 * 1024
    res = host.run("head -c 100000000 /dev/zero | tr '\\0' x; echo; echo end")
    assert len(res.output) <= cap + 1024, len(res.output)
    assert me.memory_info().rss - before < 32 * 1024 * 1024  # never held, only counted
    assert_still_works(host)


DAEMONS = (
    "nohup sleep 987.{t} >/dev/null 2>&1 & "
    "setsid sleep 987.{t} >/dev/null 2>&1 & "
    "( setsid sh -c 'trap \"\" HUP TERM; exec sleep 987.{t}' & ) ; "
    "{py} -c 'import os, time\nif os.fork(): os._exit(0)\nos.setsid()\n"
    "if os.fork(): os._exit(0)\nos.execv(\"/bin/sleep\", [\"sleep\", \"987.{t}\"])' ; "
    "systemd-run --user --scope sleep 987.{t} >/dev/null 2>&1 & "
    "systemd-run sleep 987.{t} >/dev/null 2>&1 & "
    "echo up; exec sleep 30"
)


def test_daemons_do_not_survive_cancel(mhost: Host) -> None:
    host = mhost
    need_python()
    token = str(secrets.randbelow(10**8)).zfill(8)  # part of a valid sleep interval

    async def attack() -> None:
        child = await host.sandbox.launch(
            "shell", host.policy, host.workspace,
            argv=["/bin/sh", "-c", DAEMONS.format(t=token, py=PYTHON)],
        )
        try:
            assert child.process.stdout is not None
            async with asyncio.timeout(20):
                assert await child.process.stdout.readline() == b"up\n"
            await wait_processes(token, 4)  # nohup, setsid, double fork, python daemon
        finally:
            child.kill()  # what a cancel does
            await release(child)

    asyncio.run(attack())
    assert processes_with(token) == [], "a daemon survived the cancel"
    assert_still_works(host)


def test_network_none_means_no_socket(mhost: Host) -> None:
    """No socket() at all offline, whatever the family; the policy lifts it with the network."""
    host = mhost
    need("seccomp")
    need_python()
    code = ("import socket\ntry:\n    socket.socket(socket.AF_UNIX)\n    print('OPEN')\n"
            "except OSError as exc:\n    print('DENIED', exc.errno)\n")
    assert host.py(code).output == "DENIED 1\n"
    assert host.py(code, TEST_POLICY.lowered(network="host")).output == "OPEN\n"
    assert_still_works(host)


FORKSERVER = """
import multiprocessing as mp, socket, sys
if __name__ == "__main__":
    with mp.get_context("forkserver").Pool(2) as pool:
        print("POOL", sum(pool.map(abs, [-1, -2])), flush=True)
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        print("INET")
    except OSError as exc:
        print("NOINET", exc.errno)
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
        print("CONNECTED")
    except OSError as exc:
        print("HOSTSOCK", exc.errno)
"""


def test_unix_sockets_policy_keeps_only_af_unix(
    host: Host, host_sockets: list[tuple[Path, socket.socket]]
) -> None:
    """`unix_sockets = true`: Python's forkserver (3.14's default) works offline; still no
    inet socket, and the host's /run sockets stay out of sight."""
    need("seccomp", "namespaces")
    need_python()
    policy = host.policy.lowered(unix_sockets=True)
    (host.workspace / "fs.py").write_text(FORKSERVER)
    run_socket = host_sockets[0][0]
    res = host.run(f"{PYTHON} -I fs.py {run_socket}", policy)
    assert res.output.split("\n")[:3] == ["POOL 3", "NOINET 1", "HOSTSOCK 2"], res.output
    _never_connected(host_sockets[:1])
    assert_still_works(host)

