"""An executor's cgroup directory names its owner (`ex-<pid>-<start>`), read from /proc
without psutil: the same start psutil gives (directories of executors started before
stay comparable), and a sweep tells a live owner from a dead one or a reused pid."""

from __future__ import annotations

import os
import shutil
import subprocess

import psutil

from actors.sandbox.cgroups import (
    CgroupTree,
    Hierarchies,
    _owner_alive,
    _start_time,
    executor_limits,
)


def test_the_start_is_psutils():
    for proc in [psutil.Process(), psutil.Process(1), psutil.Process(os.getppid())]:
        assert _start_time(proc.pid) == int(proc.create_time() * 100)


def test_a_command_name_with_spaces_and_parentheses_is_read_past(tmp_path):
    # /proc/PID/stat's second field is the command name in parentheses, as it is: the
    # name of the file executed (a link's own name)
    odd = tmp_path / "a) 1 2 (c"
    odd.symlink_to(shutil.which("sleep") or "/bin/sleep")
    sleeper = subprocess.Popen([str(odd), "30"])
    try:
        proc = psutil.Process(sleeper.pid)
        assert proc.name() == "a) 1 2 (c"
        assert _start_time(sleeper.pid) == int(proc.create_time() * 100)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_an_owner_is_alive_while_its_process_runs_with_the_start_it_named():
    sleeper = subprocess.Popen(["sleep", "30"])
    owner = f"ex-{sleeper.pid}-{_start_time(sleeper.pid)}"
    try:
        assert _owner_alive(owner)
        assert not _owner_alive(f"ex-{sleeper.pid}-{_start_time(sleeper.pid) - 1}")  # reused
    finally:
        sleeper.kill()
        sleeper.wait()
    assert _start_time(sleeper.pid) == 0
    assert not _owner_alive(owner)
    assert not _owner_alive("ex-notapid-1") and not _owner_alive("elsewhere")


def test_a_tree_names_this_process():
    tree = CgroupTree(Hierarchies(v2=None, v2_controllers=frozenset()))
    assert tree.owner == f"ex-{os.getpid()}-{int(psutil.Process().create_time() * 100)}"


def test_the_executors_memory_cap_is_a_share_of_the_ram_psutil_reports():
    expected = int(psutil.virtual_memory().total * 0.4)
    assert executor_limits().memory_bytes == expected
