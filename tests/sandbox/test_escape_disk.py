"""Disk is bounded (issue 15 item 4, the workspace side): a per-session quota (an
ext4 image per session, loop-mounted), a host-wide cap, a free-space reserve.

Attacks: a shell writing until ENOSPC, a write_file over the quota. Each fails
with a clear error inside its own session's file system, another session's call
runs meanwhile, and a normal call works afterwards.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from homes import make_home
from sbhelp import BOUND_S, TEST_POLICY, need

from actors.sandbox import (
    PolicyError,
    Sandbox,
    SandboxConfig,
    WorkspaceQuota,
    WorkspaceRefused,
    release_all,
)
from actors.sandbox.workspaces import IMAGES_DIR
from actors.tools.process import CommandResult, run_command

QUOTA_MB = 8
FILL = "i=0; while dd if=/dev/zero of=f$i bs=1M count=4 2>&1; do i=$((i+1)); done; exit 1"


@pytest.fixture
def home() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("a loop-mounted workspace quota needs root")
    need("namespaces")
    path = Path(make_home("ophd-"))
    try:
        yield path
    finally:
        release_all(path)
        shutil.rmtree(path, ignore_errors=True)


def sandbox_of(home: Path, **quota: object) -> Sandbox:
    settings = {"size_mb": QUOTA_MB, "reserve_mb": 0, **quota}
    config = SandboxConfig(TEST_POLICY, workspaces=WorkspaceQuota(**settings))  # type: ignore[arg-type]
    return Sandbox(config, home / "workspaces", hide=(home,))


def run(sandbox: Sandbox, session: str, command: str) -> CommandResult:
    return asyncio.run(shell(sandbox, session, command))


async def shell(sandbox: Sandbox, session: str, command: str) -> CommandResult:
    cwd = await asyncio.to_thread(sandbox.workspace, session)
    return await run_command(command, cwd, timeout_s=BOUND_S, cap=64 * 1024,
                             spawn=sandbox.spawner("shell", TEST_POLICY))


def image_bytes(home: Path, session: str) -> int:
    return (home / "workspaces" / IMAGES_DIR / f"{session}.img").stat().st_blocks * 512


def test_a_shell_writing_until_enospc_fails_alone_and_the_next_call_works(home: Path) -> None:
    sandbox = sandbox_of(home)
    sandbox.start()
    try:
        async def both() -> tuple[CommandResult, CommandResult]:
            filler = asyncio.create_task(shell(sandbox, "attacker", FILL))
            other = await shell(sandbox, "other", "echo other session fine")
            return await filler, other

        filled, other = asyncio.run(both())
        assert filled.returncode != 0
        assert "No space left on device" in filled.output, filled.output
        assert other.returncode == 0 and other.output == "other session fine\n"
        # What the attacker wrote is on its own image, no more than its quota.
        assert image_bytes(home, "attacker") <= QUOTA_MB * 1024 * 1024
        assert os.path.ismount(home / "workspaces" / "attacker")
        again = run(sandbox, "attacker", "rm -f f*; echo fine > g && cat g")
        assert again.returncode == 0 and again.output == "fine\n", again.output
    finally:
        sandbox.close()


def test_write_file_over_the_quota_is_a_clear_error(home: Path) -> None:
    sandbox = sandbox_of(home)
    sandbox.start()
    try:
        cwd = sandbox.workspace("w")
        write = sandbox.file_writer("write_file", TEST_POLICY)
        with pytest.raises(OSError, match="No space left on device"):
            asyncio.run(write(cwd / "big", b"x" * (QUOTA_MB + 4) * 1024 * 1024, cwd))
        assert asyncio.run(write(cwd / "small", b"ok", cwd)).endswith("/small")
        assert (cwd / "small").read_bytes() == b"ok"
    finally:
        sandbox.close()


def test_a_launch_below_the_free_space_reserve_is_refused(home: Path) -> None:
    free_mb = shutil.disk_usage("/tmp").free // (1024 * 1024)
    sandbox = sandbox_of(home, reserve_mb=free_mb + 1024 * 1024)
    try:
        with pytest.raises(WorkspaceRefused, match="the disk is nearly full: .* below the reserve"):
            run(sandbox, "s", "echo must not run")
    finally:
        sandbox.close()
    fine = sandbox_of(home)  # the reserve met: the same session runs
    try:
        assert run(fine, "s", "echo ran").output == "ran\n"
    finally:
        fine.close()


def test_a_launch_over_the_host_wide_cap_is_refused(home: Path) -> None:
    first = sandbox_of(home, total_mb=2)
    try:
        out = run(first, "big", "dd if=/dev/zero of=f bs=1M count=3 2>&1 && sync")
        assert out.returncode == 0, out.output
    finally:
        first.close()
    capped = sandbox_of(home, total_mb=2)  # measures the images afresh
    try:
        with pytest.raises(WorkspaceRefused, match="hold .* MB, at their cap of 2 MB"):
            run(capped, "another", "echo must not run")
        capped.remove_workspace("big")  # old sessions removed: room again
        assert not (home / "workspaces" / "big").exists()
        assert not (home / "workspaces" / IMAGES_DIR / "big.img").exists()
    finally:
        capped.close()
    again = sandbox_of(home, total_mb=2)
    try:
        assert run(again, "another", "echo ran").output == "ran\n"
    finally:
        again.close()


def test_quota_off_gives_a_plain_directory(home: Path) -> None:
    sandbox = sandbox_of(home, quota="off")
    try:
        path = sandbox.workspace("plain")
        assert path.is_dir() and not os.path.ismount(path)
        assert not (home / "workspaces" / IMAGES_DIR).exists()
    finally:
        sandbox.close()


def test_a_workspace_from_before_quotas_moves_into_its_image(home: Path) -> None:
    legacy = home / "workspaces" / "old"
    (legacy / "src").mkdir(parents=True)
    (legacy / "src" / "notes.txt").write_text("kept")
    os.symlink("src/notes.txt", legacy / "link")
    os.chown(legacy / "src", 64000, 64000)
    sandbox = sandbox_of(home)
    try:
        path = sandbox.workspace("old")
        assert os.path.ismount(path)
        assert (path / "src" / "notes.txt").read_text() == "kept"
        assert os.readlink(path / "link") == "src/notes.txt"
        assert (path / "src").stat().st_uid == path.stat().st_uid  # the session's uid
        assert not list((home / "workspaces" / IMAGES_DIR).glob("*.aside"))
    finally:
        sandbox.close()


def test_a_workspace_from_before_quotas_too_big_for_it_is_refused_intact(home: Path) -> None:
    legacy = home / "workspaces" / "big"
    legacy.mkdir(parents=True)
    (legacy / "data").write_bytes(os.urandom((QUOTA_MB + 2) * 1024 * 1024))
    sandbox = sandbox_of(home)
    try:
        with pytest.raises(WorkspaceRefused, match=f"does not fit its quota of {QUOTA_MB} MB"):
            sandbox.workspace("big")
        assert (legacy / "data").stat().st_size == (QUOTA_MB + 2) * 1024 * 1024
        assert not os.path.ismount(legacy)
        assert not list((home / "workspaces" / IMAGES_DIR).glob("big*.img"))
    finally:
        sandbox.close()


def test_files_written_beside_an_unmounted_image_are_kept_aside(home: Path) -> None:
    sandbox = sandbox_of(home)
    try:
        (sandbox.workspace("s") / "inside").write_text("in the image")
        release_all(home / "workspaces")
        (home / "workspaces" / "s" / "stray").write_text("written meanwhile")
        path = sandbox.workspace("s")
        assert (path / "inside").read_text() == "in the image"
        (aside,) = (home / "workspaces" / IMAGES_DIR).glob("s.*.aside")
        assert (aside / "stray").read_text() == "written meanwhile"
    finally:
        sandbox.close()


def test_workspaces_are_released_and_mounted_again_with_their_files(home: Path) -> None:
    sandbox = sandbox_of(home)
    try:
        (sandbox.workspace("keep") / "f").write_text("still here")
        assert release_all(home / "workspaces") == 1
        assert not os.path.ismount(home / "workspaces" / "keep")
        assert (sandbox.workspace("keep") / "f").read_text() == "still here"
    finally:
        sandbox.close()


@pytest.mark.parametrize(("table", "error"), [
    ({"quota": "tmpfs"}, "quota must be one of loop, off"),
    ({"size_mb": 1}, "size_mb must be at least 8"),
    ({"sizes_mb": 8}, "unknown key"),
])
def test_bad_workspaces_settings_are_named(table: dict[str, object], error: str) -> None:
    with pytest.raises(PolicyError, match=rf"\[workspaces\]: .*{error}"):
        SandboxConfig.from_dict({"workspaces": table})


def test_workspaces_settings_are_read() -> None:
    config = SandboxConfig.from_dict({"workspaces": {"quota": "off", "size_mb": 64,
                                                     "total_mb": 0, "reserve_mb": 10}})
    assert config.workspaces == WorkspaceQuota("off", 64, 0, 10)
    assert SandboxConfig().workspaces.quota == "loop"  # fail closed by default


def test_the_executor_answers_a_refused_workspace_as_the_tool_s_error(home: Path) -> None:
    from actors.config import Agent, Config
    from actors.executor.actor import Executor
    from bus.endpoints import Endpoints
    from bus.messages import Envelope, ToolJob, ToolResult

    (home / "sandbox.toml").write_text("[workspaces]\nreserve_mb = 1000000000\n")
    # Scratch mode: the calls' working directory is the session's workspace image.
    scratch = Config(agents={"default": Agent(sandbox="scratch")})
    executor = Executor(Endpoints.for_home(home), config=scratch)
    executor.reactor.close()  # no supervisor here: only perform() is exercised
    try:
        for tool, data in (("shell", {"command": "echo ran"}),
                           ("write_file", {"path": "f", "content": "x"})):
            result = asyncio.run(executor.perform(Envelope(
                ToolJob(tool, data, "/", 10), sid="full", job="j")))
            assert isinstance(result, ToolResult) and result.is_error
            assert result.output.startswith(f"{tool}: refused: the disk is nearly full")
        assert not (home / "workspaces" / "full").exists()
    finally:
        executor.sandbox.close()


def test_the_orphan_sweep_spares_a_workspace_command(home: Path) -> None:
    """A session's first call makes its image (mkfs, a child of the executor) while
    another call of it ends and sweeps the executor's orphans: the sweep killed the mkfs
    (the demo's parallel read_file, list_dir and shell failed "cannot make a workspace
    image: exit -9"). Now it waits for the next round."""
    import threading
    import time

    import psutil

    from actors.sandbox import workspaces

    sandbox = sandbox_of(home)
    done: list[BaseException | None] = []

    def command() -> None:
        try:
            workspaces._run(["sleep", "1.5"], "a workspace command")
            done.append(None)
        except BaseException as exc:  # reported to the test below
            done.append(exc)

    worker = threading.Thread(target=command)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not [p for p in psutil.Process().children() if p.name() == "sleep"]:
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.01)
        assert sandbox.sweep_orphans() == 0
    finally:
        worker.join()
        sandbox.close()
    assert done == [None], done
