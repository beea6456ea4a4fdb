"""Adversarial: the file system. A tool writes only its working directory (in read-only
mode nothing), reads only what its mode lets it, never the oploop home; in every mode
(`mhost`: scratch on both backends, workspace-write, read-only)."""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

import pytest
from sbhelp import TEST_POLICY, Host, need

from actors.sandbox import modes
from actors.tools import Catalogue, ToolContext, invoke, make_write_file


def write_file(host: Host, path: str, content: str = "pwned") -> tuple[str, bool]:
    tool = make_write_file(host.sandbox.file_writer("write_file", TEST_POLICY))
    with modes.using(host.view):
        out = asyncio.run(
            invoke(Catalogue([tool]), "write_file", {"path": path, "content": content},
                   ToolContext(cwd=host.workspace))
        )
    return out.output, out.is_error


def writable(host: Host) -> None:
    """Skip a case that needs a writable working directory in read-only mode."""
    if host.mode == modes.READ_ONLY:
        pytest.skip("read-only: the working directory is not writable (test_modes.py)")


def test_workspace_is_writable(mhost: Host) -> None:
    host = mhost
    writable(host)
    res = host.run("echo hello > f && cat f && mkdir -p a/b && mv f a/b/g && ls a/b")
    assert res.returncode == 0, res.output
    assert res.output == "hello\ng\n"
    assert (host.workspace / "a" / "b" / "g").read_text() == "hello\n"
    out, is_error = write_file(host, "notes/n.txt", "hi")
    assert not is_error, out
    assert (host.workspace / "notes" / "n.txt").read_text() == "hi"


def test_write_outside_workspace_etc_and_host_tmp(mhost: Host) -> None:
    host = mhost
    need("landlock")
    token = secrets.token_hex(4)
    for target in (host.outside / "x", Path(f"/etc/oploop-{token}")):
        res = host.run(f"echo pwned > {target}")
        assert res.returncode != 0, (target, res.output)
        out, is_error = write_file(host, str(target))
        assert is_error, (target, out)
        assert not target.exists(), f"{target} was written from the sandbox"
    host_tmp = Path(f"/tmp/oploop-{token}")
    out, is_error = write_file(host, str(host_tmp))
    assert is_error and f"sandbox mode {host.mode}" in out, out
    host.run(f"echo pwned > {host_tmp}")
    assert not host_tmp.exists(), "the sandbox wrote the host's /tmp"
    # /tmp inside is private: a write there never reaches the host's /tmp.
    res = host.run(f"echo private > /tmp/oploop-{token}-p && cat /tmp/oploop-{token}-p")
    assert res.returncode == 0 and res.output == "private\n", res.output
    assert not Path(f"/tmp/oploop-{token}-p").exists()


def test_read_root_ssh_and_host_init_environ(mhost: Host) -> None:
    host = mhost
    need("landlock")
    for command in ("ls /root", "cat /root/.ssh/authorized_keys", "ls /root/.ssh",
                    "cat /root/.bashrc", f"ls {host.outside}"):
        res = host.run(command)
        assert res.returncode != 0, (command, res.output)
    res = host.run("cat /proc/1/environ")
    # pid 1 in there is the sandbox's own init: unreadable (launcher), or empty (bwrap).
    assert res.returncode != 0 or res.output == ""
    try:
        host_env = Path("/proc/1/environ").read_bytes().split(b"\0")[0]
    except PermissionError:
        host_env = b""
    assert not host_env or host_env.decode(errors="replace") not in res.output


def test_symlink_escape_read_and_write(mhost: Host) -> None:
    host = mhost
    need("landlock")
    secret = host.outside / "secret"
    secret.write_text("top secret\n")
    (host.workspace / "link").symlink_to(secret)
    res = host.run("cat link")
    assert res.returncode != 0 and "top secret" not in res.output
    res = host.run("echo pwned > link")
    assert res.returncode != 0
    out, is_error = write_file(host, "link")
    assert is_error, out
    assert secret.read_text() == "top secret\n"


def test_symlink_swapped_in_for_a_directory(mhost: Host) -> None:
    host = mhost
    writable(host)
    need("landlock")
    (host.workspace / "dir").mkdir()
    os.chown(host.workspace / "dir", host.uid, host.uid)
    res = host.run("echo ok > dir/f")
    assert res.returncode == 0
    # Swap the directory for a link to a directory outside, as a racing attacker would.
    (host.workspace / "dir" / "f").unlink()
    (host.workspace / "dir").rmdir()
    (host.workspace / "dir").symlink_to(host.outside)
    assert host.run("echo pwned > dir/f").returncode != 0
    out, is_error = write_file(host, "dir/g")
    assert is_error, out
    assert not (host.outside / "f").exists() and not (host.outside / "g").exists()
    # From inside, also swap it itself: a link to /etc made by the tool.
    res = host.run("rm dir && ln -s /etc dir && echo pwned > dir/oploop-swap")
    assert res.returncode != 0
    assert not Path("/etc/oploop-swap").exists()


def test_hardlink_in_and_rename_out(mhost: Host) -> None:
    host = mhost
    need("landlock")
    res = host.run("ln /etc/passwd hl")
    assert res.returncode != 0
    assert not (host.workspace / "hl").exists()
    (host.workspace / "mine").write_text("mine\n")
    os.chown(host.workspace / "mine", host.uid, host.uid)
    for dest in ("/etc/oploop-moved", f"{host.outside}/moved", "/usr/oploop-moved"):
        res = host.run(f"mv mine {dest}")
        assert res.returncode != 0, (dest, res.output)
        assert (host.workspace / "mine").exists()
        assert not Path(dest).exists()


def test_tool_cannot_edit_its_own_policy(mhost: Host) -> None:
    host = mhost
    need("landlock")
    policy_file = host.home / "sandbox.toml"
    policy_file.write_text('[sandbox]\noff = []\n')
    res = host.run(f"echo 'off = [\"landlock\"]' >> {policy_file}; cat {policy_file}")
    # (Under bwrap the path does not exist inside: the shell may write a private copy.)
    assert "off = [\"landlock\"]" not in policy_file.read_text(), res.output
    out, is_error = write_file(host, str(policy_file), '[sandbox]\noff = ["seccomp"]\n')
    assert is_error, out
    assert policy_file.read_text() == '[sandbox]\noff = []\n'


def test_no_write_to_cgroupfs_or_proc_sys(mhost: Host) -> None:
    host = mhost
    need("landlock")
    for target in ("/sys/fs/cgroup/pids/pids.max", "/proc/sys/kernel/hostname",
                   "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger"):
        res = host.run(f"echo 1 > {target}")
        assert res.returncode != 0, (target, res.output)
