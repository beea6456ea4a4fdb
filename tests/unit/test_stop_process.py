"""`oploop down`'s stop of a process: returns as the process exits, whether or not
its parent has reaped it; says so when it does not exit in time."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from actors.cli.hostcmds import _stop_by_pid, stop_process

#: A child that says it is ready, then sleeps (ignoring SIGTERM if told to).
CHILD = ("import signal, sys, time\n"
         "if sys.argv[1] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "print('ready', flush=True)\n"
         "time.sleep(60)\n")


@pytest.fixture
def child(request) -> Iterator[subprocess.Popen[str]]:
    """A sleeping child of this process (so nobody else reaps it), ready."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, request.param],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()


@pytest.mark.parametrize("stop", [stop_process, _stop_by_pid], ids=["pidfd", "pid"])
@pytest.mark.parametrize("child", ["plain"], indirect=True)
def test_a_stopped_process_counts_as_gone_before_it_is_reaped(child, stop):
    assert stop(child.pid, 10.0)
    assert psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE  # (ours to reap)


@pytest.mark.parametrize("stop", [stop_process, _stop_by_pid], ids=["pidfd", "pid"])
@pytest.mark.parametrize("child", ["stubborn"], indirect=True)
def test_a_process_that_keeps_running_is_reported(child, stop):
    assert not stop(child.pid, 0.2)
    assert child.poll() is None


@pytest.mark.parametrize("stop", [stop_process, _stop_by_pid], ids=["pidfd", "pid"])
@pytest.mark.parametrize("child", ["plain"], indirect=True)
def test_a_process_already_gone_is_stopped(child, stop):
    child.kill()
    child.wait(timeout=10)  # reaped: its pid names nobody now
    assert stop(child.pid, 1.0)
