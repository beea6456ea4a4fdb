"""Sandbox modes on a real project: one working directory for every tool, the owner's
files, and each mode's matrix (read, write inside, write outside, hidden paths).

Real executors (`Executor.perform`, no supervisor) running real sandboxed processes,
on a project directory owned by a user the module makes (useradd) with a home
holding credentials; the attack classes of the suite re-run in every mode.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from homes import make_home
from sbhelp import BOUND_S

from actors.config import parse_config
from actors.executor.actor import Executor
from actors.sandbox import modes, release_all
from bus.endpoints import Endpoints
from bus.messages import Envelope, ToolJob, ToolResult

MODES = modes.MODES


@dataclass
class User:
    """The project's owner: a real user with a home holding credentials."""

    name: str
    uid: int
    gid: int
    home: Path
    project: Path


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    if os.geteuid() != 0:
        pytest.skip("the modes' cases make a user: they need root")
    name = f"opl{secrets.token_hex(3)}"
    # In /home, as a user's would be (not under /tmp, which each call has its own of).
    home = Path(tempfile.mkdtemp(prefix="oplu-", dir="/home"))
    subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", name], check=True,
                   capture_output=True)
    try:
        entry = subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True)
        uid = int(entry.stdout)
        gid = int(subprocess.run(["id", "-g", name], check=True, capture_output=True,
                                 text=True).stdout)
        os.chown(home, uid, gid)
        os.chmod(home, 0o750)
        ssh = home / ".ssh"
        ssh.mkdir(mode=0o700)
        (ssh / "id_ed25519").write_text("PRIVATE-KEY-MATERIAL\n")
        (home / ".netrc").write_text("machine x login y password SECRET-NETRC\n")
        (home / "private").mkdir()
        (home / "private" / "diary").write_text("SECRET-DIARY\n")
        project = home / "proj"
        project.mkdir()
        (project / "README").write_text("project readme\n")
        (home / "elsewhere").mkdir()
        for path in (ssh, ssh / "id_ed25519", home / ".netrc", home / "private",
                     home / "private" / "diary", project, project / "README",
                     home / "elsewhere"):
            os.chown(path, uid, gid)
        yield User(name, uid, gid, home, project)
    finally:
        subprocess.run(["userdel", name], capture_output=True)
        shutil.rmtree(home, ignore_errors=True)


@dataclass
class Run:
    """An executor whose default agent is in one mode; `call` runs one tool."""

    executor: Executor
    home: Path
    mode: str
    user: User

    def call(self, name: str, cwd: Path | None = None, sid: str = "s1",
             **data: object) -> ToolResult:
        job = ToolJob(name, dict(data), str(cwd or self.user.project), 20)
        result = asyncio.run(self.executor.perform(Envelope(job, sid=sid, job="j")))
        assert isinstance(result, ToolResult), result
        return result

    def sh(self, command: str, **kw: object) -> ToolResult:
        return self.call("shell", command=command, **kw)


def _executor(mode: str, user: User, **agent: object) -> tuple[Executor, Path]:
    home = Path(make_home("ophm-"))
    os.chmod(home, 0o711)
    config = parse_config({"agents": {"default": {"sandbox": mode, **agent}}}, "oploop.toml")
    executor = Executor(Endpoints.for_home(home), config=config)
    executor.reactor.close()  # no supervisor here: only perform() is exercised
    (home / "keys").mkdir(exist_ok=True)
    (home / "keys" / "secret.key").write_text("KEY-MATERIAL\n")
    return executor, home


@pytest.fixture(params=MODES)
def run(request: pytest.FixtureRequest, user: User) -> Iterator[Run]:
    executor, home = _executor(request.param, user,
                               deny_read=[str(user.home / "private")])
    try:
        yield Run(executor, home, request.param, user)
    finally:
        executor.sandbox.close()
        release_all(home)
        shutil.rmtree(home, ignore_errors=True)


def _gone(run: Run, path: Path) -> None:
    if path.exists():
        path.unlink()


# -- one working directory -----------------------------------------------------------


def test_the_tools_agree_on_relative_paths(run: Run) -> None:
    if run.mode == modes.READ_ONLY:
        pytest.skip("read-only: nothing to write (the matrix below)")
    where = run.user.project if run.mode == modes.WORKSPACE_WRITE \
        else run.home / "workspaces" / "s1"
    try:
        wrote = run.call("write_file", path="notes.txt", content="HELLO\n")
        assert not wrote.is_error, wrote
        assert run.call("read_file", path="notes.txt").output == "HELLO\n"
        assert "notes.txt" in run.call("list_dir", path=".").output.splitlines()
        out = run.sh("pwd; cat notes.txt; echo more >> notes.txt; mkdir -p sub; "
                     "echo deep > sub/d.txt")
        assert not out.is_error and out.output.split() == [str(where), "HELLO"], out
        assert run.call("read_file", path="notes.txt").output == "HELLO\nmore\n"
        assert run.call("read_file", path="sub/d.txt").output == "deep\n"
        if run.mode == modes.WORKSPACE_WRITE:
            # Created by the tools, owned by the project's owner: theirs to edit and delete.
            for made in ("notes.txt", "sub", "sub/d.txt"):
                st = os.stat(where / made)
                assert (st.st_uid, st.st_gid) == (run.user.uid, run.user.gid), made
            listed = run.sh("ls").output.split()
            assert {"README", "notes.txt", "sub"} <= set(listed)
    finally:
        shutil.rmtree(where / "sub", ignore_errors=True)
        _gone(run, where / "notes.txt")


def test_the_tool_user_has_a_name_and_a_home(run: Run) -> None:
    out = run.sh('whoami; id -un; echo "$USER"; echo "$HOME"; cd && pwd')
    assert not out.is_error, out
    who, idun, env_user, env_home, cd_home = out.output.split()
    assert who == idun == env_user
    assert env_home == cd_home
    if run.mode == modes.SCRATCH:
        assert who == "sandbox" and env_home == str(run.home / "workspaces" / "s1")
    else:
        assert who == run.user.name and env_home == str(run.user.home)


# -- each mode's matrix ----------------------------------------------------------------


def test_reads(run: Run) -> None:
    readme = run.user.project / "README"
    assert run.call("read_file", path=str(readme)).output == "project readme\n"
    assert "bin/" in run.call("list_dir", path="/usr").output.splitlines()
    listed = run.call("list_dir", path="/tmp")  # the README's first example
    assert not listed.is_error, listed
    shell = run.sh(f"cat {readme}")
    if run.mode == modes.SCRATCH:
        # The session's workspace only (and the system's paths) in its shell.
        assert shell.is_error
    else:
        assert shell.output == "project readme\n", shell
        assert "README" in run.sh("ls ..").output + run.sh("ls").output


@pytest.mark.parametrize("how", ["write_file", "shell"])
def test_writes_inside_the_working_directory(run: Run, how: str) -> None:
    target = run.user.project / f"in-{how}.txt"
    try:
        if how == "write_file":
            out = run.call("write_file", path=target.name, content="x")
        else:
            out = run.sh(f"echo x > {target.name}")
        if run.mode == modes.WORKSPACE_WRITE:
            assert not out.is_error and target.read_text().strip() == "x", out
        elif run.mode == modes.READ_ONLY:
            assert out.is_error and not target.exists()
            assert "sandbox mode read-only" in out.output, out
        else:  # scratch: the relative path is the workspace's, the project untouched
            assert not out.is_error and not target.exists(), out
    finally:
        _gone(run, target)


@pytest.mark.parametrize("how", ["write_file", "shell"])
def test_writes_outside_are_refused_naming_the_mode(run: Run, how: str) -> None:
    for target in (run.user.home / "elsewhere" / "out.txt", Path("/etc/oploop-test"),
                   run.user.home / "out.txt"):
        if how == "write_file":
            out = run.call("write_file", path=str(target), content="x")
        else:
            out = run.sh(f"echo x > {target}")
        assert out.is_error and not target.exists(), (target, out)
        if target.parent.exists() and not str(target).startswith(str(run.user.home)) \
                or run.mode != modes.SCRATCH:
            assert f"sandbox mode {run.mode}" in out.output, (target, out)


def test_hidden_paths_answer_hidden(run: Run) -> None:
    u = run.user
    hidden = [u.home / ".ssh" / "id_ed25519", u.home / ".netrc", u.home / "private" / "diary",
              run.home / "keys" / "secret.key", run.home / "sandbox.toml",
              Path("/root/.ssh/authorized_keys"), Path("/etc/shadow")]
    (run.home / "sandbox.toml").touch()
    for path in hidden:
        out = run.call("read_file", path=str(path))
        assert out.is_error and "SECRET" not in out.output and "KEY-MATERIAL" not in out.output
        if path != Path("/etc/shadow") or run.mode != modes.SCRATCH:
            assert f"hidden by the sandbox: {path} (mode {run.mode})" in out.output, out
        shell = run.sh(f"cat {path}")
        assert shell.is_error or not shell.output.strip(), (path, shell)
        assert "SECRET" not in shell.output and "KEY-MATERIAL" not in shell.output
    listed = run.call("list_dir", path=str(u.home / ".ssh"))
    assert listed.is_error and "hidden by the sandbox" in listed.output
    wrote = run.call("write_file", path=str(u.home / ".ssh" / "authorized_keys"), content="x")
    assert wrote.is_error and "hidden by the sandbox" in wrote.output
    assert not (u.home / ".ssh" / "authorized_keys").exists()
    # Nor through a link in the working directory.
    if run.mode == modes.WORKSPACE_WRITE:
        link = u.project / "keys"
        link.symlink_to(u.home / ".ssh")
        try:
            out = run.call("read_file", path="keys/id_ed25519")
            assert out.is_error and "hidden by the sandbox" in out.output, out
            assert "PRIVATE" not in run.sh("cat keys/id_ed25519").output
        finally:
            link.unlink()


def test_links_never_extend_what_is_writable(user: User) -> None:
    executor, home = _executor(modes.WORKSPACE_WRITE, user,
                               write_paths=[str(user.home / "elsewhere")])
    run = Run(executor, home, modes.WORKSPACE_WRITE, user)
    link = user.project / "out"
    link.symlink_to(user.home)
    try:
        extra = user.home / "elsewhere" / "ok.txt"
        assert not run.call("write_file", path=str(extra), content="x").is_error
        assert extra.stat().st_uid == user.uid
        extra.unlink()
        for how in ("write_file", "shell"):
            out = (run.call("write_file", path="out/escaped", content="x") if how == "write_file"
                   else run.sh("echo x > out/escaped; ln -s / root; echo y > root/etc/z"))
            assert out.is_error and not (user.home / "escaped").exists(), out
            assert not Path("/etc/z").exists()
    finally:
        link.unlink()
        _gone(run, user.project / "root")
        executor.sandbox.close()
        release_all(home)
        shutil.rmtree(home, ignore_errors=True)


def test_a_write_path_swapped_for_a_link_makes_nothing_writable(user: User) -> None:
    """A call replaces a write path by a link to another directory: the next calls may
    not write there, and a refused write says why (the path resolves through a link).
    (The write path itself is a mount point in a call's view, which no call removes:
    the swap goes through its parent, which a call may move away.)"""
    gen = user.project / "gen"
    out_dir, elsewhere = gen / "out", user.home / "elsewhere"
    out_dir.mkdir(parents=True)
    os.chown(gen, user.uid, user.gid)
    os.chown(out_dir, user.uid, user.gid)
    executor, home = _executor(modes.WORKSPACE_WRITE, user, write_paths=[str(out_dir)])
    run = Run(executor, home, modes.WORKSPACE_WRITE, user)
    try:
        assert not run.call("write_file", path="gen/out/ok.txt", content="x").is_error
        swapped = run.sh(f"mv gen gen.old && mkdir gen && ln -s {elsewhere} gen/out "
                         "&& echo swapped")
        assert swapped.output.strip() == "swapped" and out_dir.is_symlink(), swapped
        shell = run.sh(f"echo PWNED > {elsewhere}/notes")
        wrote = run.call("write_file", path=str(elsewhere / "new"), content="x")
        through = run.call("write_file", path="gen/out/new", content="x")
        for out in (shell, wrote, through):
            assert out.is_error, out
            assert (f"write_paths entry {out_dir} resolves through a link to {elsewhere}"
                    in out.output), out
        assert not (elsewhere / "notes").exists() and not (elsewhere / "new").exists()
    finally:
        for made in (elsewhere / "notes", elsewhere / "new"):
            _gone(run, made)
        for made in (gen, user.project / "gen.old"):
            shutil.rmtree(made, ignore_errors=True)
        executor.sandbox.close()
        release_all(home)
        shutil.rmtree(home, ignore_errors=True)


def test_a_write_path_through_a_link_no_tool_could_make_stays_writable(user: User) -> None:
    """A link outside what tools may write (`/home` -> `/var/home` on some systems; here
    one in the home, the working directory being the project) is the machine's own:
    the write path it leads to is writable, as it was before links were refused."""
    link = user.home / "data"
    link.symlink_to(user.home / "elsewhere")
    executor, home = _executor(modes.WORKSPACE_WRITE, user, write_paths=[str(link)])
    run = Run(executor, home, modes.WORKSPACE_WRITE, user)
    made = user.home / "elsewhere" / "made.txt"
    try:
        assert not run.call("write_file", path=str(link / "made.txt"), content="x").is_error
        assert not run.sh(f"echo y >> {made}").is_error
        assert made.read_text() == "xy\n"
    finally:
        _gone(run, made)
        link.unlink()
        executor.sandbox.close()
        release_all(home)
        shutil.rmtree(home, ignore_errors=True)


# -- the attack classes, in every mode ----------------------------------------------


def test_no_sockets_no_signals_no_disk_or_process_hoard(run: Run) -> None:
    out = run.sh("python3 -I -c 'import socket; socket.socket()' 2>&1; echo rc=$?")
    assert "rc=1" in out.output and "PermissionError" in out.output, out
    # Another session of the same user: not visible, not signalable.
    other = run.sh("sleep 30 & echo $!", sid="s2")
    assert not other.is_error
    out = run.sh("ps -e -o pid= | wc -l; kill -0 1 2>&1; cat /proc/1/environ 2>&1 | head -c 80")
    assert "sleep" not in out.output and "OPLOOP" not in out.output
    # A fork bomb stops at the call's pids limit (the cgroup), and the next call runs.
    out = run.sh("for i in $(seq 400); do sleep 5 & done 2>&1 | tail -1; echo done",
                 timeout_s=BOUND_S)
    assert "done" in out.output
    assert run.sh("echo alive").output.strip() == "alive"
    # /tmp is the call's own, bounded.
    out = run.sh("head -c 100M /dev/zero > /tmp/fill 2>&1; ls -l /tmp/fill | cut -d' ' -f5")
    assert int(out.output.split()[-1]) <= 64 * 1024 * 1024
    assert "fill" not in run.sh("ls /tmp").output


def test_the_mount_table_names_no_other_session(run: Run, user: User) -> None:
    other, other_home = _executor(modes.SCRATCH, user)
    try:
        job = ToolJob("shell", {"command": "true"}, "/", 20)
        assert not asyncio.run(other.perform(Envelope(job, sid="other", job="j"))).is_error
        out = run.sh("cat /proc/self/mountinfo")
        assert str(other_home) not in out.output and "other" not in out.output.split()
        assert str(run.home) + "/workspaces" not in out.output.replace(
            str(run.home / "workspaces" / "s1"), "")
    finally:
        other.sandbox.close()
        release_all(other_home)
        shutil.rmtree(other_home, ignore_errors=True)


# -- bad working directories -------------------------------------------------------


@pytest.mark.parametrize(("cwd", "why"), [
    ("/nonexistent/dir", "does not exist"),
    ("/", "tools would be allowed to write anywhere"),
    ("/etc/", "system directory"),
    ("/etc", "system directory"),
    ("/usr/lib", "system directory"),
    ("/tmp", "private, empty one"),
    ("/var", "system directory"),
    ("relative", "absolute path"),
])
def test_bad_working_directories_are_refused(cwd: str, why: str) -> None:
    with pytest.raises(modes.WorkdirRefused, match=why) as caught:
        modes.check_workdir(cwd, modes.WORKSPACE_WRITE)
    assert "\n" not in str(caught.value)


def test_the_home_keys_and_credentials_are_never_a_working_directory(run: Run) -> None:
    for cwd in (run.home, run.home / "keys", run.user.home / ".ssh"):
        out = run.call("shell", cwd=cwd, command="echo ran")
        if run.mode == modes.SCRATCH:
            continue  # the session's workspace is its directory, wherever it started
        assert out.is_error and "refused: working directory" in out.output, (cwd, out)
        assert "hidden from tools" in out.output and "ran" not in out.output.split()
    assert modes.check_workdir("/", modes.READ_ONLY) == "/"  # read-only: anything readable


def test_read_only_under_tmp_stays_read_only(user: User) -> None:
    """A working directory under /tmp is bound back inside the call's private /tmp: the
    rule that makes that /tmp writable must not make it writable too."""
    project = Path(tempfile.mkdtemp(prefix="oplp-", dir="/tmp"))
    os.chown(project, user.uid, user.gid)
    executor, home = _executor(modes.READ_ONLY, user)
    run = Run(executor, home, modes.READ_ONLY, user)
    try:
        out = run.call("shell", cwd=project, command="echo y > $TMPDIR/t && cat $TMPDIR/t; "
                       "echo x > f")
        assert not (project / "f").exists(), out
        assert out.output.startswith("y\n"), out  # its scratch directory: not that /tmp
        assert out.is_error and "sandbox mode read-only" in out.output
        assert run.call("write_file", cwd=project, path="g", content="x").is_error
        assert not (project / "g").exists()
    finally:
        executor.sandbox.close()
        release_all(home)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(project, ignore_errors=True)


def test_a_root_owned_directory_runs_the_tools_as_root_without_capabilities(
        user: User) -> None:
    project = Path(tempfile.mkdtemp(prefix="oplr-", dir="/home"))
    executor, home = _executor(modes.WORKSPACE_WRITE, user)
    run = Run(executor, home, modes.WORKSPACE_WRITE, user)
    try:
        out = run.call("shell", cwd=project, command="id -un; grep ^Cap /proc/self/status; "
                       "echo x > made; echo y > /etc/oploop-root-test; cat /etc/shadow; "
                       "cat /proc/1/environ; chown 1 made; mount -t tmpfs t /mnt")
        lines = out.output.splitlines()
        assert lines[0] == "root", out
        assert all(line.split()[1] == "0000000000000000" for line in lines[1:6]), out
        assert (project / "made").stat().st_uid == 0
        assert not Path("/etc/oploop-root-test").exists()
        assert "root:" not in out.output.split("Cap")[-1], out  # no shadow entries
        assert out.is_error and "workspace-write" in out.output
        hidden = run.call("read_file", cwd=project, path="/root/.ssh/id_rsa")
        assert "hidden by the sandbox" in hidden.output
    finally:
        executor.sandbox.close()
        release_all(home)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(project, ignore_errors=True)


def test_no_setuid_or_setgid_file_is_left_behind(run: Run) -> None:
    """The tool runs as the directory's owner: a setuid copy of a shell left there would
    hand that owner (root, for a root-owned one) to whoever runs it later."""
    if run.mode == modes.READ_ONLY:
        pytest.skip("read-only: nothing to write")
    # openat2 carries its mode in a struct the filter cannot read: it answers ENOSYS.
    openat2 = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
               "how = (ctypes.c_uint64 * 3)(os.O_CREAT | os.O_WRONLY, 0o4755, 0); "
               "fd = libc.syscall(437, -100, b's4', how, 24); "
               "print('openat2', fd, os.strerror(ctypes.get_errno()))")
    out = run.sh("cp /bin/sh s1; chmod u+s s1; chmod g+s s1; chmod 4755 s1; "
                 "python3 -c \"import os; os.close(os.open('s2', os.O_CREAT | os.O_WRONLY, "
                 "0o4755)); os.close(os.open('s3', os.O_CREAT | os.O_WRONLY, 0o2755))\"; "
                 f"python3 -c \"{openat2}\"; ls -l s1 s2 s3 s4")
    where = run.user.project if run.mode == modes.WORKSPACE_WRITE \
        else run.home / "workspaces" / "s1"
    # mknod makes regular files too, and an O_TMPFILE open (no O_CREAT) takes a mode
    # as well: its file, once linkat names it, is left behind like any other.
    made = run.sh(f"python3 - <<'EOF'\n{_SPECIAL_CREATES}EOF")
    names = ("s1", "s2", "s3", "s4", *_SPECIAL_NAMES)
    try:
        assert (where / "s1").exists(), out
        for name in names:
            if (where / name).exists():
                assert not (where / name).stat().st_mode & 0o6000, (name, out.output, made)
        assert "Operation not permitted" in out.output, out
        assert "openat2 -1 Function not implemented" in out.output, out
        for name in _SPECIAL_NAMES:
            assert f"{name} Operation not permitted" in made.output, made
    finally:
        for name in names:
            _gone(run, where / name)


_SPECIAL_NAMES = ("s5", "s6", "s7", "s8", "s9")
_SPECIAL_CREATES = """\
import ctypes, os, platform, stat

def attempt(name, make):
    try:
        print(name, "made", oct(make() or os.stat(name).st_mode))
    except OSError as exc:
        print(name, exc.strerror)

def mknod_syscall(name, mode):  # glibc's mknod() calls mknodat: the old syscall by hand
    if platform.machine() != "x86_64":
        raise PermissionError(1, "Operation not permitted")  # (no mknod syscall there)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(133, name.encode(), stat.S_IFREG | mode, 0) < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))

def tmpfile(name, mode):  # (Landlock may refuse the link: the open is what counts)
    fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, mode)
    try:
        os.link(f"/proc/self/fd/{fd}", name)
    except OSError:
        pass
    return os.fstat(fd).st_mode

attempt("s5", lambda: os.mknod("s5", stat.S_IFREG | 0o4755))
attempt("s6", lambda: os.mknod("s6", stat.S_IFREG | 0o2755, dir_fd=os.open(".", os.O_PATH)))
attempt("s7", lambda: mknod_syscall("s7", 0o4755))
attempt("s8", lambda: tmpfile("s8", 0o4755))
attempt("s9", lambda: tmpfile("s9", 0o2755))
"""


@pytest.mark.parametrize("path", ["/", "/etc", "/usr/lib", "/tmp"])
def test_write_paths_never_name_a_system_directory(path: str) -> None:
    from actors.config import ConfigError

    with pytest.raises(ConfigError, match=r"agents\.ops\.write_paths\[0\]: .*"):
        parse_config({"agents": {"ops": {"write_paths": [path]}}}, "oploop.toml")
