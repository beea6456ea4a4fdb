"""Adversarial: the confined reads. `read_file` and `list_dir` see the system's ordinary
files, the session's cwd and workspace, and nothing secret; no read blocks.

Each case attacks as a hostile model would, asserts the attack fails, then that a
normal read still works. Reads always run in the launcher (never bubblewrap).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sbhelp import TEST_POLICY, Host, need

from actors.sandbox import Policy, Sandbox, SandboxConfig
from actors.sandbox.policy import reading
from actors.tools import (
    Catalogue,
    ToolContext,
    invoke,
    make_list_dir,
    make_read_file,
    make_shell,
    make_write_file,
    shown_name,
)
from actors.tools.builtin import LIST_CAP, READ_CAP

READ_POLICY = reading(TEST_POLICY)


@pytest.fixture(params=["thread", "process"])
def rhost(host: Host, request: pytest.FixtureRequest) -> Host:
    """The sandbox suite's host, once: reads run in the launcher whatever the backend.
    Each case runs with the reads served by reader threads (`readthreads.py`, the
    default) and by the reader processes themselves."""
    if host.backend != "launcher":
        pytest.skip("reads always run in the launcher: one backend is enough")
    host.sandbox.readers.threads = request.param == "thread"
    return host


def by_threads(host: Host) -> bool:
    """Whether this host's reads were served by reader threads (each has one by now)."""
    readers = host.sandbox.readers.readers()
    assert readers, "no reader: this case read nothing yet"
    return all(r.thread is not None for r in readers)


def tools(sandbox: Sandbox, policy: Policy = READ_POLICY) -> Catalogue:
    """read_file and list_dir confined by `sandbox` (as the executor builds them)."""
    return Catalogue([
        make_read_file(sandbox.file_reader(READ_CAP, policy=policy)),
        make_list_dir(sandbox.dir_lister(LIST_CAP, policy=policy)),
    ])


def call(host: Host, name: str, path: str, *, readable: tuple[str, ...] = (),
         policy: Policy = READ_POLICY, sandbox: Sandbox | None = None,
         workspace: Path | None = None) -> tuple[str, bool]:
    """One confined read_file/list_dir call of a session whose workspace is the host's."""
    ws = workspace or host.workspace
    ctx: ToolContext[None] = ToolContext(cwd=ws, workspace=ws, read_paths=readable)
    out = asyncio.run(invoke(tools(sandbox or host.sandbox, policy), name, {"path": path}, ctx))
    return out.output, out.is_error


def still_reads(host: Host) -> None:
    """A normal call works after an attack: a system file and the workspace."""
    out, is_error = call(host, "read_file", "/etc/passwd")
    assert not is_error and "root:" in out, out
    (host.workspace / "mine.txt").write_text("mine\n")
    out, is_error = call(host, "list_dir", ".")
    assert not is_error and "mine.txt" in out.splitlines(), out


def refused(host: Host, name: str, path: str, secret: str = "", **kw: object) -> str:
    """Assert `name` on `path` fails (and shows no `secret`); the error text."""
    out, is_error = call(host, name, path, **kw)  # type: ignore[arg-type]
    assert is_error, (name, path, out)
    assert not secret or secret not in out
    return out


@pytest.fixture
def canary_in_root() -> Iterator[tuple[str, str]]:
    """A secret file in /root and one in a user's home (removed after): (name token, secret)."""
    need("uid")
    token, secret = secrets.token_hex(8), secrets.token_hex(8)
    made = []
    for parent in (Path("/root"), Path("/home") / f"oploop-user-{token[:6]}"):
        parent.mkdir(exist_ok=True)
        target = parent / f".oploop-canary-{token}"
        target.write_text(secret)
        os.chmod(target, 0o644)  # readable by anyone who can reach it: only hiding stops it
        made.append(target)
    try:
        yield token, secret
    finally:
        for target in made:
            target.unlink()
        shutil.rmtree(made[1].parent, ignore_errors=True)


def test_shadow_root_and_user_homes(rhost: Host, canary_in_root: tuple[str, str]) -> None:
    need("namespaces", "landlock")
    token, secret = canary_in_root
    refused(rhost, "read_file", "/etc/shadow", "root:")
    refused(rhost, "read_file", "/etc/gshadow", "root:")
    refused(rhost, "read_file", f"/root/.oploop-canary-{token}", secret)
    out, is_error = call(rhost, "list_dir", "/root")
    assert is_error or token not in out, out
    home = f"/home/oploop-user-{token[:6]}"
    refused(rhost, "read_file", f"{home}/.oploop-canary-{token}", secret)
    out, is_error = call(rhost, "list_dir", "/home")
    assert is_error or f"oploop-user-{token[:6]}" not in out, out
    # Even named by the agent's configuration, a home itself is never readable.
    refused(rhost, "read_file", f"/root/.oploop-canary-{token}", secret, readable=("/root",))
    refused(rhost, "read_file", f"/root/.oploop-canary-{token}", secret, readable=("/",))
    out, is_error = call(rhost, "list_dir", "/home", readable=("/home", "/"))
    assert is_error or f"oploop-user-{token[:6]}" not in out, out
    # And the shell cannot reach them either.
    res = rhost.run(f"cat /root/.oploop-canary-{token} {home}/.oploop-canary-{token}")
    assert res.returncode != 0 and secret not in res.output
    still_reads(rhost)


def test_proc_of_other_processes(rhost: Host) -> None:
    need("namespaces", "landlock")
    token = secrets.token_hex(8)
    victim = subprocess.Popen(["sleep", "60"], env={"OPLOOP_VICTIM_SECRET": token},
                              cwd="/root" if os.geteuid() == 0 else "/")
    try:
        # (Pid 1 in there is the reader itself: its own /proc is all it sees.)
        for pid in (victim.pid, os.getpid()):
            for leaf in ("environ", "cmdline", "mem", "maps"):
                out, is_error = call(rhost, "read_file", f"/proc/{pid}/{leaf}")
                assert is_error and token not in out, (pid, leaf, out)
            for leaf in ("root", "cwd", "fd", "root/root", "root/tmp"):
                out, is_error = call(rhost, "list_dir", f"/proc/{pid}/{leaf}")
                assert is_error, (pid, leaf, out)
        out, is_error = call(rhost, "list_dir", "/proc")
        assert not is_error and f"{victim.pid}/" not in out.splitlines(), out
        # The reader's own environment is empty, and no key of this process is in it.
        out, _ = call(rhost, "read_file", "/proc/self/environ")
        assert "ANTHROPIC" not in out and "OPLOOP_HOME" not in out, out
        res = rhost.run(f"cat /proc/{victim.pid}/environ")
        assert token not in res.output
    finally:
        victim.kill()
        victim.wait()
    still_reads(rhost)


def test_kallsyms_shows_no_addresses(rhost: Host) -> None:
    need("uid")
    out, is_error = call(rhost, "read_file", "/proc/kallsyms")
    if not is_error:
        addresses = {line.split(" ", 1)[0] for line in out.splitlines()[:200] if " " in line}
        assert addresses <= {"0" * 16, "0" * 8}, sorted(addresses)[:5]
    still_reads(rhost)


def test_other_workspace_home_and_keys(rhost: Host) -> None:
    need("namespaces", "landlock")
    token = secrets.token_hex(8)
    other = rhost.sandbox.workspace("s2")
    (other / "secret.txt").write_text(token)
    os.chmod(other / "secret.txt", 0o644)
    keys = rhost.home / "keys"
    keys.mkdir()
    (keys / "server.key_secret").write_text(token)
    for path in (f"{other}/secret.txt", "../s2/secret.txt", f"{keys}/server.key_secret",
                 f"{rhost.workspace}/../s2/secret.txt", str(rhost.home / "sandbox.toml")):
        refused(rhost, "read_file", path, token)
    out, is_error = call(rhost, "list_dir", "..")
    assert is_error or "s2/" not in out.splitlines(), out
    for path in (str(rhost.home), str(keys), str(other)):
        out, is_error = call(rhost, "list_dir", path)
        assert is_error or "server.key_secret" not in out and "secret.txt" not in out, out
    # Named as readable (an agent's read_paths, a session's cwd): still never the home.
    for readable in ((str(keys),), (str(rhost.home),), (str(other),)):
        refused(rhost, "read_file", f"{keys}/server.key_secret", token, readable=readable)
        refused(rhost, "read_file", f"{other}/secret.txt", token, readable=readable)
    still_reads(rhost)


def test_key_folder_outside_the_home(rhost: Host) -> None:
    """A remote worker's OPLOOP_KEYS folder, somewhere the system paths cover (/opt)."""
    need("namespaces", "landlock")
    token = secrets.token_hex(8)
    keys = Path(tempfile.mkdtemp(prefix="oploop-keys-", dir="/opt"))
    try:
        (keys / "client.key_secret").write_text(token)
        os.chmod(keys, 0o755)
        os.chmod(keys / "client.key_secret", 0o644)  # even readable by anyone: hidden
        sandbox = Sandbox(SandboxConfig(TEST_POLICY), rhost.home / "workspaces",
                          hide=(rhost.home, keys))
        try:
            for readable in ((), (str(keys),), ("/opt",)):
                refused(rhost, "read_file", f"{keys}/client.key_secret", token,
                        readable=readable, sandbox=sandbox)
                out, is_error = call(rhost, "list_dir", str(keys), readable=readable,
                                     sandbox=sandbox)
                assert is_error or "client.key_secret" not in out, out
            out, is_error = call(rhost, "read_file", "/etc/passwd", sandbox=sandbox)
            assert not is_error and "root:" in out
        finally:
            sandbox.close()
        # Another oploop home's keys, unknown to this sandbox: 0700/0600 as oploop makes
        # them, so the tool uid cannot open them even where the system paths are readable.
        os.chmod(keys, 0o700)
        os.chmod(keys / "client.key_secret", 0o600)
        need("uid")
        refused(rhost, "read_file", f"{keys}/client.key_secret", token, readable=(str(keys),))
        refused(rhost, "list_dir", str(keys), "client.key_secret")
    finally:
        shutil.rmtree(keys)
    still_reads(rhost)


def test_symlinks_out_of_the_workspace(rhost: Host) -> None:
    need("namespaces", "landlock")
    token = secrets.token_hex(8)
    secret = rhost.outside / "secret"
    secret.write_text(token)
    os.chmod(secret, 0o644)
    other = rhost.sandbox.workspace("s3")
    (other / "s").write_text(token)
    for name, target in (("to-outside", secret), ("to-dir", rhost.outside),
                         ("to-other", other / "s"), ("to-slash-root", Path("/root")),
                         ("to-shadow", Path("/etc/shadow"))):
        (rhost.workspace / name).symlink_to(target)
        out, _ = call(rhost, "read_file", name)
        assert token not in out and "root:x:0" not in out and "root:$" not in out, (name, out)
        out, _ = call(rhost, "list_dir", name)
        assert "secret" not in out and "s\n" not in out, (name, out)
    out, is_error = call(rhost, "list_dir", ".")
    assert not is_error and "to-outside@" in out.splitlines(), out
    still_reads(rhost)


def test_special_files_never_block(rhost: Host) -> None:
    need("namespaces")
    fifo = rhost.workspace / "fifo"
    os.mkfifo(fifo)
    os.chmod(fifo, 0o666)
    sock_path = rhost.workspace / "sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    (rhost.workspace / "to-fifo").symlink_to(fifo)
    try:
        for path in ("fifo", "to-fifo", "sock", "/dev/tty", "/dev/null", "/dev/zero",
                     "/dev/console", "/proc/kmsg"):
            out = refused(rhost, "read_file", path)
            assert "timed out" not in out, (path, out)
    finally:
        server.close()
    out = refused(rhost, "read_file", "fifo")
    assert "not a regular file" in out, out
    out = refused(rhost, "list_dir", "fifo")
    assert "Not a directory" in out, out
    still_reads(rhost)


def test_kmsg_as_root_does_not_block(rhost: Host) -> None:
    """With the uid layer lowered (tools as root), /proc/kmsg is readable: it must not
    wait for the next kernel message."""
    need("namespaces", "landlock")
    policy = READ_POLICY.lowered(off=READ_POLICY.off | {"uid"}, timeout_s=20)
    out, _ = call(rhost, "read_file", "/proc/kmsg", policy=policy)
    assert "timed out" not in out, out
    still_reads(rhost)


def test_many_blocking_reads_leave_the_executor_free(rhost: Host) -> None:
    """20 reads that would block, at once: each ends, and a normal read runs meanwhile."""
    need("namespaces")
    os.mkfifo(rhost.workspace / "fifo")
    ws = rhost.workspace
    ctx: ToolContext[None] = ToolContext(cwd=ws, workspace=ws)
    catalogue = tools(rhost.sandbox)

    async def attack() -> list[tuple[str, bool]]:
        calls = [invoke(catalogue, "read_file", {"path": p}, ctx)
                 for p in ("/proc/kmsg", "fifo") * 10]
        normal = invoke(catalogue, "read_file", {"path": "/etc/passwd"}, ctx)
        outs = await asyncio.gather(normal, *calls)
        return [(o.output, o.is_error) for o in outs]

    outs = asyncio.run(attack())
    assert not outs[0][1] and "root:" in outs[0][0], outs[0]
    assert all(is_error for _, is_error in outs[1:]), outs
    still_reads(rhost)


def test_names_that_are_not_utf8_are_shown(rhost: Host) -> None:
    name = b"bad-\xff\xfe-name\nforged"
    (rhost.workspace / os.fsdecode(name)).write_text("x")
    out, is_error = call(rhost, "list_dir", ".")
    assert not is_error, out
    assert shown_name(os.fsdecode(name)) in out.splitlines(), out
    assert "forged" not in out.splitlines(), out
    assert "bad-\\xff\\xfe-name\\nforged" in out
    still_reads(rhost)


def test_readable_paths_and_session_cwd(rhost: Host) -> None:
    """What an agent configures (and the session's cwd) is readable, nothing beside it."""
    need("namespaces", "landlock")
    token = secrets.token_hex(8)
    top = Path(tempfile.mkdtemp(prefix="oploop-proj-", dir="/tmp"))  # outside the home
    try:
        project = top / "project"
        project.mkdir()
        (project / "README").write_text(token)
        (top / "beside").write_text("beside")
        for path, mode in ((top, 0o755), (project, 0o755), (project / "README", 0o644),
                           (top / "beside", 0o644)):
            os.chmod(path, mode)
        refused(rhost, "read_file", f"{project}/README", token)
        out, is_error = call(rhost, "read_file", f"{project}/README", readable=(str(project),))
        assert not is_error and out == token, out
        out, is_error = call(rhost, "list_dir", str(project), readable=(str(project),))
        assert not is_error and out == "README", out
        refused(rhost, "read_file", f"{top}/beside", readable=(str(project),))
        refused(rhost, "read_file", f"{project}/../beside", readable=(str(project),))
    finally:
        shutil.rmtree(top)
    still_reads(rhost)


@pytest.fixture
def root_home() -> Iterator[Path]:
    """An oploop home under a 0700 directory, as ~/.oploop is for root."""
    need("uid", "namespaces")
    parent = Path(tempfile.mkdtemp(prefix="oploop-root-", dir="/root"))
    os.chmod(parent, 0o700)
    try:
        yield parent / ".oploop"
    finally:
        shutil.rmtree(parent)


def test_default_home_under_a_0700_directory(root_home: Path) -> None:
    """Item 8: the tool uid reaches the workspace through a traversable tmpfs, without
    the home (or its 0700 parent) being opened up."""
    sandbox = Sandbox(SandboxConfig(TEST_POLICY), root_home / "workspaces", hide=(root_home,))
    sandbox.start()
    try:
        ws = sandbox.workspace("s1")

        async def session() -> list[tuple[str, bool]]:
            catalogue = Catalogue([
                make_shell(sandbox.spawner("shell", TEST_POLICY)),
                make_write_file(sandbox.file_writer("write_file", TEST_POLICY)),
                tools(sandbox)["read_file"], tools(sandbox)["list_dir"],
            ])
            ctx: ToolContext[None] = ToolContext(cwd=ws, workspace=ws)
            outs = []
            for name, args in (
                ("shell", {"command": "echo hi > f && cat f && id -u"}),
                ("write_file", {"path": "g.txt", "content": "written"}),
                ("read_file", {"path": "g.txt"}),
                ("list_dir", {"path": "."}),
                ("shell", {"command": f"ls {root_home.parent}"}),
            ):
                out = await invoke(catalogue, name, args, ctx)
                outs.append((out.output, out.is_error))
            return outs

        (sh, sh_err), (wr, wr_err), (rd, rd_err), (ls, ls_err), (peek, peek_err) = (
            asyncio.run(session()))
        assert not sh_err and sh.startswith("hi\n"), sh
        assert sh.split()[-1] == str(os.stat(ws).st_uid), sh  # the session's uid
        assert not wr_err, wr
        assert not rd_err and rd == "written", rd
        assert not ls_err and {"f", "g.txt"} <= set(ls.splitlines()), ls
        assert peek_err and ".oploop" not in peek, peek  # the 0700 parent stays closed
        assert os.stat(root_home.parent).st_mode & 0o777 == 0o700
    finally:
        sandbox.remove_workspace("s1")  # unmounted, or the home cannot be removed
        sandbox.close()


def test_a_read_leaves_no_pid_namespace_behind(rhost: Host) -> None:
    """The fork server forks a read as pid 1 of a new pid namespace, then goes back to
    its own: a later launch (namespaces lowered) runs in the host's, not the read's."""
    need("namespaces")
    for _ in range(2):
        out, is_error = call(rhost, "list_dir", "/proc")
        # A reader process is pid 1 of its namespace; a thread took over from one that
        # was killed then (it may not have exited yet), and sees that namespace's /proc.
        pids = [n for n in out.splitlines() if n[:1].isdigit()]
        assert not is_error and (pids in ([], ["1/"]) if by_threads(rhost)
                                 else pids == ["1/"]), out
        policy = TEST_POLICY.lowered(off=frozenset({"namespaces", "landlock", "seccomp"}))
        res = rhost.run("grep NSpid /proc/self/status", policy)
        assert res.returncode == 0 and len(res.output.split()) == 2, res.output  # one level
    still_reads(rhost)
