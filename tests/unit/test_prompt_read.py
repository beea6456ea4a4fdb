"""Reading `oploop run`'s prompt (`actors.cli.run.read_prompt`): all of it, from a file,
a FIFO or standard input, and never past a Ctrl-C.

The Ctrl-C case is the one CI met under load: the signal landed just before the
blocking read began, its Python handler never ran, and the command waited for a
writer that never came. Here the same state is made on purpose: the signal goes to
another thread of the reader (the kernel's choice when the main thread blocks it),
so its C handler runs and the main thread's read is not interrupted.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prockit import child_env

from actors.cli.errors import CliError
from actors.cli.run import read_prompt, read_woken

BOUND_S = 30.0

#: A reader of `argv[1]` whose Ctrl-C handler exits 130; its main thread blocks SIGINT,
#: so the kernel gives it to the other thread: flagged, and nothing interrupted.
_READER = """
import os, signal, sys, threading
from actors.cli.run import read_prompt
signal.signal(signal.SIGINT, lambda *_: os._exit(130))
threading.Thread(target=threading.Event().wait, daemon=True).start()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
print(len(read_prompt(sys.argv[1])), flush=True)
"""


def _writer(fifo: Path) -> int | None:
    """The write end of `fifo` once a reader has it open (none before: ENXIO)."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return None


def test_a_ctrl_c_that_interrupts_no_read_still_ends_it(tmp_path):
    fifo = tmp_path / "prompt"
    os.mkfifo(fifo)
    proc = subprocess.Popen([sys.executable, "-c", _READER, f"@{fifo}"], env=child_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer = None
    try:
        end = time.monotonic() + BOUND_S
        while (writer := _writer(fifo)) is None:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < end, "the reader never opened the prompt"
            time.sleep(0.01)
        os.write(writer, b"half a prompt, and the writer stays")  # (select has woken once)
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=BOUND_S)
        except subprocess.TimeoutExpired:
            pytest.fail("the Ctrl-C was lost: the read waited for the writer")
    finally:
        if writer is not None:
            os.close(writer)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, (out, err)


def test_a_fifo_is_read_to_its_end_whatever_the_pieces(tmp_path):
    fifo = tmp_path / "prompt"
    os.mkfifo(fifo)
    text = "run `echo big` " + "é" * 600_000  # 1.2 MB, written in uneven pieces
    data = text.encode()

    def write() -> None:
        with open(fifo, "wb", buffering=0) as out:  # (waits for the reader's open)
            for start in range(0, len(data), 70_001):
                out.write(data[start:start + 70_001])

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert read_prompt(f"@{fifo}") == text
    finally:
        writer.join(BOUND_S)
    assert not writer.is_alive()


def test_standard_input_and_files_whole(tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("from a file\n" * 100_000)
    assert read_prompt(f"@{prompt}") == "from a file\n" * 100_000
    read_end, write_end = os.pipe()
    os.write(write_end, b"from a pipe")
    os.close(write_end)
    try:
        assert read_woken(read_end) == b"from a pipe"
    finally:
        os.close(read_end)
    assert read_prompt("just words") == "just words"


def test_what_cannot_be_read_is_one_clear_error(tmp_path):
    with pytest.raises(CliError, match="cannot read the prompt file .*: Is a directory"):
        read_prompt(f"@{tmp_path}")
    with pytest.raises(CliError, match="cannot read the prompt file .*No such file"):
        read_prompt(f"@{tmp_path / 'missing'}")
    bad = tmp_path / "latin1"
    bad.write_bytes(b"caf\xe9")
    with pytest.raises(CliError, match="not valid UTF-8 \\(byte 3\\)"):
        read_prompt(f"@{bad}")


def test_the_wakeup_fd_is_given_back(tmp_path):
    prompt = tmp_path / "p"
    prompt.write_text("x")
    before = signal.set_wakeup_fd(-1)
    signal.set_wakeup_fd(before)
    read_prompt(f"@{prompt}")
    assert signal.set_wakeup_fd(before) == before


def test_a_high_numbered_fd_is_read(tmp_path):
    # (select() refuses an fd past 1024; a process with many files open has them.)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard <= 1500:
        pytest.skip(f"this process may not open fd 1500 (hard limit {hard})")
    prompt = tmp_path / "p"
    prompt.write_text("from fd 1500")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    low = os.open(prompt, os.O_RDONLY)
    try:
        high = os.dup2(low, 1500)
        try:
            assert read_woken(high) == b"from fd 1500"
        finally:
            os.close(high)
    finally:
        os.close(low)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
