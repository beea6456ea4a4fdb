"""The shell tool: output, exit status, caps, and that no process outlives a call."""

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.tools import (
    BUILTIN,
    Catalogue,
    Child,
    ToolContext,
    ToolOutcome,
    invoke,
    make_shell,
    spawn_local,
)
from actors.tools import process as process_mod
from actors.tools.process import CappedOutput

BOUND_S = 5.0  # upper bound for anything we poll on; never a pass/fail timing


def is_alive(proc: psutil.Process) -> bool:
    """Running and not a zombie (an orphan's reaper may be slow; a zombie runs nothing)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(procs: list[psutil.Process]) -> None:
    deadline = time.monotonic() + BOUND_S
    while alive := [p.pid for p in procs if is_alive(p)]:
        assert time.monotonic() < deadline, f"processes survived the call: {alive}"
        time.sleep(0.01)  # polling an observable condition, bounded above


@pytest.fixture(autouse=True)
def no_leaked_children() -> Iterator[None]:
    """Fail a test that leaves a child process of ours running."""
    yield
    wait_gone(psutil.Process().children(recursive=True))


async def wait_pids(pid_file: Path, count: int) -> list[psutil.Process]:
    """Wait until the command has written `count` pids (one per line) and return them."""
    deadline = time.monotonic() + BOUND_S
    while True:
        text = pid_file.read_text() if pid_file.exists() else ""  # noqa: ASYNC240 - a tiny file
        if text.count("\n") >= count:
            procs = [psutil.Process(int(pid)) for pid in text.split()[:count]]
            assert all(is_alive(p) for p in procs)
            return procs
        assert time.monotonic() < deadline, f"only saw {text!r} in {pid_file}"
        await asyncio.sleep(0.01)


# A shell that starts a subshell that starts a sleep, each writing its pid:
# three levels of processes, all of which must die with the call.
TREE = (
    "echo $$ >> pids; "
    "(sleep 30 & echo $! >> pids; wait) & echo $! >> pids; "
    "echo started; wait"
)


def shell(tmp_path: Path, catalogue: Catalogue = BUILTIN, **data: object) -> ToolOutcome:
    return asyncio.run(invoke(catalogue, "shell", data, ToolContext(cwd=tmp_path)))


def test_output_stderr_and_cwd(tmp_path: Path) -> None:
    out = shell(tmp_path, command="echo out; echo err >&2; pwd")
    assert not out.is_error
    # stdout and stderr are two pipes: each stream's order holds, and the result has
    # both, as their chunks arrived (writes close together may swap between streams).
    lines = out.output.splitlines()
    assert sorted(lines) == sorted(["out", "err", str(tmp_path)])
    assert lines.index("out") < lines.index(str(tmp_path))


def test_stdin_is_empty(tmp_path: Path) -> None:
    assert shell(tmp_path, command="cat") == ToolOutcome("(no output)", False)


def test_nonzero_exit_is_error(tmp_path: Path) -> None:
    assert shell(tmp_path, command="echo oops; exit 3") == ToolOutcome(
        "oops\n[exit status 3]", True
    )


def test_killed_by_signal(tmp_path: Path) -> None:
    assert shell(tmp_path, command="kill -TERM $$") == ToolOutcome(
        "(no output)\n[killed by SIGTERM]", True
    )


def test_background_child_killed_after_normal_exit(tmp_path: Path) -> None:
    out = shell(tmp_path, command="sleep 30 & echo $!")
    assert not out.is_error
    # The sleep held our pipe open: returning at all shows it was dealt with.
    pid = int(out.output)
    with contextlib.suppress(psutil.NoSuchProcess):
        wait_gone([psutil.Process(pid)])


def test_timeout_kills_the_tree(tmp_path: Path) -> None:
    async def main() -> tuple[ToolOutcome, list[psutil.Process]]:
        ctx = ToolContext(cwd=tmp_path)
        task = asyncio.create_task(invoke(BUILTIN, "shell", {"command": TREE, "timeout_s": 1}, ctx))
        procs = await wait_pids(tmp_path / "pids", 3)
        return await task, procs

    out, procs = asyncio.run(main())
    assert out == ToolOutcome("started\n[timed out after 1 s]", True)
    wait_gone(procs)


def test_cancel_kills_the_tree(tmp_path: Path) -> None:
    async def main() -> list[psutil.Process]:
        ctx = ToolContext(cwd=tmp_path)
        task = asyncio.create_task(invoke(BUILTIN, "shell", {"command": TREE}, ctx))
        procs = await wait_pids(tmp_path / "pids", 3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return procs

    wait_gone(asyncio.run(main()))


def test_deadline_kills_the_tree(tmp_path: Path) -> None:
    async def main() -> tuple[ToolOutcome, list[psutil.Process]]:
        ctx = ToolContext(cwd=tmp_path, deadline=time.time() + 1)
        task = asyncio.create_task(invoke(BUILTIN, "shell", {"command": TREE}, ctx))
        procs = await wait_pids(tmp_path / "pids", 3)
        return await task, procs

    out, procs = asyncio.run(main())
    assert out == ToolOutcome("shell: deadline exceeded", True)
    wait_gone(procs)


def test_detached_process_holding_the_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # setsid leaves the process group, so the group kill cannot reach it; the call
    # must still return, saying why the output may be incomplete.
    monkeypatch.setattr(process_mod, "_DRAIN_S", 0.2)
    # The escapee writes its pid before the shell says "hi", so the file is there
    # by the time the call returns.
    out = shell(
        tmp_path,
        command="setsid sh -c 'echo $$ > pid.tmp; mv pid.tmp pid; exec sleep 30' & "
        "while [ ! -f pid ]; do :; done; echo hi",
    )
    escapee = psutil.Process(int((tmp_path / "pid").read_text()))
    try:
        assert not out.is_error
        assert out.output.startswith("hi\n")
        assert "[stopped reading: a detached process holds the output open]" in out.output
    finally:
        escapee.kill()
    wait_gone([escapee])


def test_output_cap_keeps_head_and_tail(tmp_path: Path) -> None:
    small = Catalogue([make_shell(cap=1000)])
    command = "printf 'START'; head -c 100000 /dev/zero | tr '\\0' a; printf 'END'"
    out = shell(tmp_path, small, command=command)
    assert not out.is_error
    assert out.output == (
        "START" + "a" * 495 + "\n[truncated: 99008 bytes omitted]\n" + "a" * 497 + "END"
    )


def test_default_output_cap(tmp_path: Path) -> None:
    out = shell(tmp_path, command="head -c 1000000 /dev/zero | tr '\\0' a")
    note = "\n[truncated: 934464 bytes omitted]\n"
    assert note in out.output
    assert out.output.replace(note, "") == "a" * (64 * 1024)


@pytest.mark.parametrize(
    ("timeout_s", "message"),
    [
        (601, "shell: 'timeout_s': input should be less than or equal to 600"),
        (0, "shell: 'timeout_s': input should be greater than 0"),
        ("soon", "shell: 'timeout_s': input should be a valid number"),
    ],
)
def test_timeout_validation(tmp_path: Path, timeout_s: object, message: str) -> None:
    out = shell(tmp_path, command="true", timeout_s=timeout_s)
    assert out.is_error
    assert out.output.startswith(message)


def test_missing_cwd_is_an_error_outcome(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    out = shell(gone, command="true")
    assert out == ToolOutcome(f"shell: cannot start in {gone}: No such file or directory", True)


def test_spawner_is_replaceable(tmp_path: Path) -> None:
    seen: list[tuple[str, Path]] = []

    async def recording_spawn(command: str, cwd: Path) -> Child:
        seen.append((command, cwd))
        return await spawn_local(f"echo wrapped; {command}", cwd)

    out = shell(tmp_path, Catalogue([make_shell(recording_spawn)]), command="echo inner")
    assert out == ToolOutcome("wrapped\ninner\n", False)
    assert seen == [("echo inner", tmp_path)]


@given(chunks=st.lists(st.binary(max_size=50), max_size=20), cap=st.integers(2, 120))
def test_capped_output_keeps_both_ends(chunks: list[bytes], cap: int) -> None:
    data = b"".join(chunks)
    # Printable ASCII, so bytes and characters line up one to one.
    chunks = [bytes(97 + b % 26 for b in c) for c in chunks]
    data = b"".join(chunks)
    out = CappedOutput(cap)
    for chunk in chunks:
        out.feed(chunk)
    half = cap // 2
    if len(data) <= 2 * half:
        assert out.text() == data.decode()
    else:
        omitted = len(data) - 2 * half
        expected = f"{data[:half].decode()}\n[truncated: {omitted} bytes omitted]\n"
        assert out.text() == expected + data[-half:].decode()
