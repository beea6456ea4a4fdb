"""Fail closed: a missing required layer refuses the call, naming it; config lowers it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from sbhelp import BOUND_S, TEST_POLICY, Host

from actors.config import parse_config
from actors.executor.actor import Executor, sandboxed_catalogue
from actors.sandbox import (
    LAYERS,
    PolicyError,
    Sandbox,
    SandboxConfig,
    SandboxRefused,
    bwrap,
    layers_report,
    machine_layers,
)
from actors.tools import BUILTIN, Catalogue, ToolContext, ToolOutcome, invoke, make_shell
from bus.endpoints import Endpoints
from bus.messages import Envelope, ToolJob, ToolResult


def without(layer: str) -> dict[str, str]:
    """This machine's layers, pretending `layer` is missing."""
    return {**machine_layers(), layer: "pretend it is missing"}


def test_missing_required_layer_refuses_with_its_name(host: Host) -> None:
    sandbox = Sandbox(SandboxConfig(TEST_POLICY), host.home / "workspaces",
                      layers=without("landlock"))
    out = asyncio.run(invoke(sandboxed_catalogue(sandbox), "shell", {"command": "echo ran"},
                             ToolContext(cwd=host.workspace)))
    assert out.is_error
    assert "landlock" in out.output and "pretend it is missing" in out.output
    assert "ran" not in out.output
    out = asyncio.run(invoke(sandboxed_catalogue(sandbox), "write_file",
                             {"path": "f", "content": "x"}, ToolContext(cwd=host.workspace)))
    assert out.is_error and "landlock" in out.output
    assert not (host.workspace / "f").exists()
    with pytest.raises(SandboxRefused) as info:
        sandbox.check("shell", TEST_POLICY)
    assert info.value.layer == "landlock"


def test_lowered_policy_runs_without_the_layer(host: Host) -> None:
    sandbox = Sandbox(SandboxConfig(TEST_POLICY), host.home / "workspaces",
                      layers=without("landlock"))
    lowered = TEST_POLICY.lowered(optional=frozenset({"landlock"}))
    try:
        res = asyncio.run(_run(sandbox, host.workspace, "echo ran", lowered))
    finally:
        # Its fork server stops (and is reaped) now, not whenever the collector frees
        # this sandbox: on a busy machine that outlived the suite's leak check.
        sandbox.close()
    assert res.output == "ran\n" and res.returncode == 0


async def _run(sandbox: Sandbox, cwd: Path, command: str, policy):  # type: ignore[no-untyped-def]
    from actors.tools.process import run_command

    return await run_command(command, cwd, timeout_s=BOUND_S, cap=4096,
                             spawn=sandbox.spawner("shell", policy))


def test_config_file_lowers_and_rejects_typos(tmp_path: Path) -> None:
    (tmp_path / "sandbox.toml").write_text(
        '[sandbox]\noptional = ["landlock"]\nuid = 64123\n'
        '[tools.shell]\nnetwork = "host"\nmemory_mb = 128\npids = 32\n'
    )
    config = SandboxConfig.load(tmp_path)
    shell = config.policy("shell")
    assert shell.network == "host" and shell.limits.memory_bytes == 128 * 1024 * 1024
    assert shell.limits.pids == 32 and shell.uid == 64123
    assert shell.requires("seccomp") and not shell.requires("landlock")
    assert config.policy("write_file").network == "none"
    (tmp_path / "sandbox.toml").write_text('[sandbox]\nofff = ["seccomp"]\n')
    with pytest.raises(PolicyError, match="offf"):
        SandboxConfig.load(tmp_path)
    (tmp_path / "sandbox.toml").write_text('[sandbox]\noff = ["selinux"]\n')
    with pytest.raises(PolicyError, match="selinux"):
        SandboxConfig.load(tmp_path)


def test_the_reader_key_chooses_threads_or_processes(tmp_path: Path) -> None:
    (tmp_path / "sandbox.toml").write_text('[tools.read_file]\nreader = "process"\n')
    config = SandboxConfig.load(tmp_path)
    assert config.policy("read_file").reader == "process"
    assert config.policy("list_dir").reader == "thread"  # the default
    (tmp_path / "sandbox.toml").write_text('[sandbox]\nreader = "fiber"\n')
    with pytest.raises(PolicyError, match="reader must be 'thread' or 'process'"):
        SandboxConfig.load(tmp_path)


def test_layers_report_names_every_layer() -> None:
    report = layers_report()
    assert set(LAYERS) <= set(report)
    for layer, state in report.items():
        assert state.startswith(("active", "available", "missing: ")), (layer, state)


def test_executor_runs_risky_tools_in_the_session_workspace(short_home: str) -> None:
    """In scratch mode, the working directory is the session's own workspace."""
    home = Path(short_home)
    scratch = parse_config({"agents": {"default": {"sandbox": "scratch"}}}, "oploop.toml")
    executor = Executor(Endpoints.for_home(home), config=scratch)
    executor.reactor.close()  # no supervisor here: only perform() is exercised
    try:
        result = asyncio.run(executor.perform(Envelope(
            ToolJob("shell", {"command": "pwd; echo hi > f"}, "/", 10), sid="sess1", job="j1"
        )))
        assert isinstance(result, ToolResult) and not result.is_error, result
        workspace = home / "workspaces" / "sess1"
        assert result.output.strip() == str(workspace)
        assert (workspace / "f").read_text() == "hi\n"
        result = asyncio.run(executor.perform(Envelope(
            ToolJob("write_file", {"path": "g", "content": "x"}, "/", 10), sid="sess2", job="j2"
        )))
        assert not result.is_error and (home / "workspaces" / "sess2" / "g").read_text() == "x"
    finally:
        executor.sandbox.close()


def test_executor_refuses_risky_tools_it_cannot_sandbox(short_home: str) -> None:
    executor = Executor(Endpoints.for_home(Path(short_home)), catalogue=BUILTIN)
    executor.reactor.close()
    result = asyncio.run(executor.perform(Envelope(
        ToolJob("shell", {"command": "echo ran"}, "/", 10), sid="s", job="j"
    )))
    assert isinstance(result, ToolResult) and result.is_error
    assert "refused" in result.output and "ran" not in result.output


def test_exec_launcher_without_the_fork_server(host: Host) -> None:
    """The launcher exec'd per call (the fallback when the fork server is gone) locks down too."""
    sandbox = Sandbox(SandboxConfig(TEST_POLICY), host.home / "workspaces", fork_server=False)
    try:
        res = asyncio.run(_run(sandbox, host.workspace,
                               "grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status; ls /root",
                               TEST_POLICY))
    finally:
        sandbox.close()
    assert "NoNewPrivs:\t1" in res.output and res.returncode != 0, res.output


def test_fork_server_restarts_after_dying(host: Host) -> None:
    sandbox = Sandbox(SandboxConfig(TEST_POLICY), host.home / "workspaces")
    try:
        first = asyncio.run(_run(sandbox, host.workspace, "echo one", TEST_POLICY))
        assert sandbox._fork is not None
        pid = sandbox._fork.running_pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)  # reap it as its parent would; the next launch notices
        second = asyncio.run(_run(sandbox, host.workspace, "echo two", TEST_POLICY))
    finally:
        sandbox.close()
    assert (first.output, second.output) == ("one\n", "two\n")


def test_running_as_root_is_the_launchers_only(host: Host) -> None:
    """uid lowered: the launcher runs the tool as root; bwrap refuses (host root inside)."""
    root = host.policy.lowered(off=frozenset({"uid"}))
    res = asyncio.run(invoke(
        Catalogue([make_shell(host.sandbox.spawner("shell", root))]), "shell",
        {"command": "echo ran"}, ToolContext(cwd=host.workspace)))
    if host.backend == "bwrap":
        assert res.is_error and "'uid'" in res.output and "ran" not in res.output
    else:
        assert res == ToolOutcome("ran\n", False)


def test_bwrap_refuses_an_unreachable_workspace(host: Host) -> None:
    if not bwrap.find()[0]:
        pytest.skip(f"bubblewrap backend absent on this machine: {bwrap.find()[1]}")
    os.chmod(host.home, 0o700)
    policy = host.policy.lowered(backend="bwrap")
    out = asyncio.run(invoke(
        Catalogue([make_shell(host.sandbox.spawner("shell", policy))]), "shell",
        {"command": "echo ran"}, ToolContext(cwd=host.workspace)))
    assert out.is_error and "'bubblewrap'" in out.output and "not traversable" in out.output


def test_executor_refuses_a_denied_call_whoever_sends_it(short_home: str) -> None:
    """A `deny` rule holds in the executor even when the supervisor is bypassed (a job
    sent straight to it): the executor reads the agent's rules from its own config."""
    config = parse_config({"agents": {"ops": {"sandbox": "scratch", "permissions": {
        "shell(echo ok*)": "allow", "shell": "deny"}}}}, "oploop.toml")
    executor = Executor(Endpoints.for_home(Path(short_home)), config=config)
    executor.reactor.close()
    try:
        result = asyncio.run(executor.perform(Envelope(
            ToolJob("shell", {"command": "echo ran > /dev/null; echo ran"}, "/", 10,
                    agent="ops"), sid="s", job="j")))
        assert isinstance(result, ToolResult) and result.is_error
        assert result.output == "shell: denied by the permission rule 'shell'"
        result = asyncio.run(executor.perform(Envelope(
            ToolJob("shell", {"command": "echo ok"}, "/", 10, agent="ops"), sid="s", job="k")))
        assert not result.is_error and result.output.strip() == "ok", result
    finally:
        executor.sandbox.close()
