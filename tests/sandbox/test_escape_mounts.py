"""What Landlock leaves to the mounts, attacked as a hostile model would: moving a hidden
path's parent away between two calls, changing modes, times and extended attributes of
files outside the working directory (or, in read-only mode, inside it), and reading the
user's terminals.

Real executors on a real user's project (`test_modes`'s user and executors), real
sandboxed processes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_modes import Run, User, _executor
from test_modes import user as user  # noqa: F401 (the fixture, by its name)

from actors.sandbox import modes, release_all


def _run(user: User, mode: str = modes.WORKSPACE_WRITE, **agent: object) -> Run:
    executor, home = _executor(mode, user, **agent)
    return Run(executor, home, mode, user)


def _close(run: Run) -> None:
    run.executor.sandbox.close()
    release_all(run.home)
    shutil.rmtree(run.home, ignore_errors=True)


@pytest.fixture
def secrets_in_project(user: User) -> Iterator[Path]:
    """`config/secrets/prod.env` in the project, the agent's `deny_read`."""
    secrets = user.project / "config" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "prod.env").write_text("SECRET-PROD\n")
    for path in (user.project / "config", secrets, secrets / "prod.env"):
        os.chown(path, user.uid, user.gid)
    try:
        yield secrets
    finally:
        for name in ("config", "cfg"):
            shutil.rmtree(user.project / name, ignore_errors=True)


def test_a_hidden_paths_parent_cannot_be_moved_away(user: User, secrets_in_project: Path
                                                    ) -> None:
    run = _run(user, deny_read=[str(secrets_in_project)])
    try:
        # (`mv config/secrets cfg` copies what it can see when its rename fails: the
        # tmpfs, whose mode 0 keeps even that out: an empty `cfg` is left.)
        moved = run.sh("mv config cfg 2>&1; mv config/secrets cfg 2>&1; echo end")
        assert "Device or resource busy" in moved.output and "end" in moved.output, moved
        assert (user.project / "config" / "secrets" / "prod.env").exists()
        for how in ("cat cfg/secrets/prod.env config/secrets/prod.env 2>&1",
                    "cp -r config /tmp/c 2>&1; cat /tmp/c/secrets/prod.env 2>&1"):
            assert "SECRET-PROD" not in run.sh(how).output
        read = run.call("read_file", path="config/secrets/prod.env")
        assert read.is_error and "SECRET" not in read.output, read
        # The parent itself stays the tool's to write in.
        assert not run.sh("echo x > config/note && rm config/note").is_error
    finally:
        _close(run)
    assert (secrets_in_project / "prod.env").read_text() == "SECRET-PROD\n"


def test_a_credential_folders_parent_cannot_be_moved_away(user: User) -> None:
    """In the home itself (the working directory): `.config` holds `.config/gh`."""
    gh = user.home / ".config" / "gh"
    gh.mkdir(parents=True)
    (gh / "hosts.yml").write_text("oauth_token: SECRET-GH\n")
    for path in (user.home / ".config", gh, gh / "hosts.yml"):
        os.chown(path, user.uid, user.gid)
    run = _run(user)
    try:
        out = run.call("shell", cwd=user.home,
                       command="mv .config .c2 2>&1; cat .c2/gh/hosts.yml 2>&1")
        assert "SECRET-GH" not in out.output, out
        again = run.call("shell", cwd=user.home,
                         command="cat .c2/gh/hosts.yml .config/gh/hosts.yml 2>&1")
        assert "SECRET-GH" not in again.output, again
        assert (gh / "hosts.yml").exists() and not (user.home / ".c2").exists()
    finally:
        _close(run)
        shutil.rmtree(user.home / ".config", ignore_errors=True)
        shutil.rmtree(user.home / ".c2", ignore_errors=True)


_META = ("chmod 0777 {p} 2>&1; touch -d 2001-01-01 {p} 2>&1; "
         "python3 -c \"import os; os.setxattr('{p}', 'user.opl', b'x')\" 2>&1; echo end")


def _meta(path: Path) -> tuple[int, float, list[str]]:
    st = path.stat()
    return stat.S_IMODE(st.st_mode), st.st_mtime, os.listxattr(path)


@pytest.mark.parametrize("mode", [modes.WORKSPACE_WRITE, modes.READ_ONLY])
def test_modes_times_and_xattrs_outside_what_is_writable_stay(user: User, mode: str) -> None:
    run = _run(user, mode)
    outside = [user.home, user.home / "elsewhere"]
    inside = [user.project / "README"]
    targets = outside + (inside if mode == modes.READ_ONLY else [])
    before = {p: _meta(p) for p in targets}
    try:
        for path in targets:
            out = run.sh(_META.format(p=path))
            assert "end" in out.output and _meta(path) == before[path], (path, out)
            assert "Read-only file system" in out.output, out
        if mode == modes.WORKSPACE_WRITE:  # inside, as ever
            script = user.project / "script.sh"
            out = run.sh("echo 'echo ran' > script.sh; chmod +x script.sh; ./script.sh")
            assert out.output.strip() == "ran" and script.stat().st_mode & 0o100, out
            script.unlink()
    finally:
        _close(run)
        for path, (mode_bits, _, _) in before.items():
            os.chmod(path, mode_bits)


def test_a_root_owned_project_cannot_chmod_the_systems_files(user: User) -> None:
    """The tool is uid 0 (no capabilities) there: every root-owned file is its own."""
    base = Path(tempfile.mkdtemp(prefix="oplr-", dir="/home"))
    project = base / "proj"
    project.mkdir()
    victim = base / "victim.conf"
    victim.write_text("root's\n")
    os.chmod(victim, 0o644)
    run = _run(user)
    try:
        # (A file of its own, not /etc/passwd: a failure must not open up the machine.)
        out = run.call("shell", cwd=project,
                       command=_META.format(p=victim) + "; echo x > made; chmod 600 made")
        assert stat.S_IMODE(victim.stat().st_mode) == 0o644, out
        assert "Read-only file system" in out.output, out
        assert stat.S_IMODE((project / "made").stat().st_mode) == 0o600, out
    finally:
        _close(run)
        shutil.rmtree(base, ignore_errors=True)


def test_the_users_terminals_cannot_be_read(user: User) -> None:
    """A terminal of the user's (their pty: owner read-write) with a line typed in,
    waiting for its reader: no tool reads it."""
    master, slave = os.openpty()
    name = os.ttyname(slave)
    os.chown(name, user.uid, -1)
    os.chmod(name, 0o620)
    os.write(master, b"typed-password\n")
    run = _run(user)
    try:
        out = run.sh(f"timeout 5 head -c 14 {name} 2>&1; ls /dev/pts 2>&1; echo end")
        assert "typed-password" not in out.output and "end" in out.output, out
    finally:
        _close(run)
        os.close(master)
        os.close(slave)


def test_a_uid_given_to_a_new_user_has_the_new_users_credentials_hidden(user: User) -> None:
    """An executor runs for days: a user removed and another made with the same uid
    (and another home) has that home's credential folders hidden at once."""
    name = f"oplx{os.urandom(3).hex()}"
    uid = user.uid + 500
    homes = [Path(tempfile.mkdtemp(prefix="oplh-", dir="/home")) for _ in range(2)]
    try:
        for home in homes:
            subprocess.run(["useradd", "-M", "-u", str(uid), "-d", str(home), name],
                           check=True, capture_output=True)
            assert str(home) in modes.homes_of(uid)
            subprocess.run(["userdel", name], check=True, capture_output=True)
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        for home in homes:
            shutil.rmtree(home, ignore_errors=True)


def test_a_server_started_from_a_call_on_the_users_files_keeps_its_own_write_paths(
        user: User) -> None:
    """An MCP server (re)started while a call of a session in workspace-write runs is
    launched in that call's task: none of the call's view is the server's (it is
    confined as in scratch mode), and its own write paths stay writable."""
    from actors.sandbox.launchspec import Extra
    from actors.tools.process import release

    run = _run(user)
    data = Path(tempfile.mkdtemp(prefix="oplm-", dir="/home"))
    os.chmod(data, 0o777)  # (the server's uid is its own)
    sandbox = run.executor.sandbox
    view = modes.view_for(modes.WORKSPACE_WRITE, str(user.project),
                          workspace=str(run.home / "workspaces" / "s1"))

    async def launch() -> int | None:
        cwd = await asyncio.to_thread(sandbox.workspace, "mcp-x")
        with modes.using(view):
            child = await sandbox.launch(
                "mcp.x", sandbox.config.policy("shell"), cwd,
                argv=["/bin/sh", "-c", f"id -u > {data}/made"], extra=Extra(rw=(str(data),)))
        await child.process.wait()
        child.kill()
        await release(child)
        return child.process.returncode

    try:
        assert asyncio.run(launch()) == 0
        made = (data / "made").read_text().strip()
        assert made != str(user.uid), made  # not the project's owner: the scratch uid
    finally:
        _close(run)
        shutil.rmtree(data, ignore_errors=True)


def test_deny_read_holds_in_a_working_directory_under_tmp(user: User) -> None:
    """Under /tmp (each call's own tmpfs) the working directory is bound back into the
    call's /tmp: what `deny_read` names inside it is hidden there too, its parents
    pinned."""
    base = Path(tempfile.mkdtemp(prefix="oplt-", dir="/tmp"))
    project = base / "proj"
    secrets = project / "config" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "prod.env").write_text("SECRET-TMP\n")
    for path in (base, project, project / "config", secrets, secrets / "prod.env"):
        os.chown(path, user.uid, user.gid)
    run = _run(user, deny_read=[str(secrets)])
    try:
        out = run.call("shell", cwd=project, command="cat config/secrets/prod.env 2>&1; "
                       "mv config cfg 2>&1; cat cfg/secrets/prod.env 2>&1; echo end")
        assert "SECRET-TMP" not in out.output and "end" in out.output, out
        assert "Device or resource busy" in out.output, out
        read = run.call("read_file", cwd=project, path="config/secrets/prod.env")
        assert read.is_error and "SECRET" not in read.output, read
        assert (secrets / "prod.env").exists() and not (project / "cfg").exists()
    finally:
        _close(run)
        shutil.rmtree(base, ignore_errors=True)


def test_a_link_swapped_into_the_working_directorys_path_moves_no_session(
        user: User) -> None:
    """A call renames a parent of its session's directory (a write path holds it) and
    puts a link to a root-owned directory where the directory was: the next call is
    refused, not run there as root."""
    mono = user.home / "mono"
    pkg = mono / "sub" / "pkg"
    pkg.mkdir(parents=True)
    for path in (mono, mono / "sub", pkg):
        os.chown(path, user.uid, user.gid)
    victim = Path(tempfile.mkdtemp(prefix="oplv-", dir="/home"))
    os.chmod(victim, 0o755)
    os.chmod(user.home, 0o755)  # (as many homes are: root, no capabilities, may pass)
    run = _run(user, write_paths=[str(mono)])
    try:
        assert run.call("shell", cwd=pkg, command="id -un").output.strip() == user.name
        swap = run.call("shell", cwd=pkg, command=f"cd {mono} && mv sub sub-old && mkdir sub"
                        f" && ln -s {victim} sub/pkg && echo swapped")
        assert swap.output.strip() == "swapped", swap
        after = run.call("shell", cwd=pkg, command="id -un; echo x > dropped")
        assert after.is_error and f"resolves to {victim} now" in after.output, after
        assert "root" not in after.output.split() and not (victim / "dropped").exists()
        wrote = run.call("write_file", cwd=pkg, path="dropped", content="x")
        assert wrote.is_error and not (victim / "dropped").exists(), wrote
    finally:
        _close(run)
        os.chmod(user.home, 0o750)
        shutil.rmtree(mono, ignore_errors=True)
        shutil.rmtree(victim, ignore_errors=True)
