"""TCP endpoints with CURVE: keys admitted by role, everything else refused, and a
worker on "another machine" (another home, reached only over TCP) serving jobs."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq.auth
from hostkit import assert_one_run, oploop, run, running_host, workspace
from ports import free_ports

from actors.sandbox.workspaces import release_all
from bus.client import Client
from bus.endpoints import Endpoints
from bus.errors import AccessDenied, RemoteError
from bus.security import ClientKeys

# A refusal is told at once; this only bounds a wait that went wrong, generously: on a
# machine with every core busy, starting an executor alone can take tens of seconds.
REFUSED_WITHIN_S = 90


@pytest.fixture
def tcp_host(short_home):
    listen = f"tcp://127.0.0.1:{free_ports()}"
    # "far" may serve unnamed, as the host's own executors do; no other worker key may.
    Path(short_home, "oploop.toml").write_text(
        f'[network]\nlisten = "{listen}"\nlocal_worker_keys = ["far"]\n')
    with running_host(short_home, {"OPLOOP_EXECUTORS": "1"}) as home:
        yield home, listen


def issue(home: str, name: str, role: str) -> Path:
    out = oploop(home, "keys", "add", name, "--role", role)
    assert out.returncode == 0, out.stderr
    return Path(home) / "keys" / "issued" / name


def remote(listen: str, keys: Path | None) -> Endpoints:
    return Endpoints.elsewhere(listen, keys)


async def auth_counts(home: str) -> dict[str, int]:
    async with Client.connect(Path(home)) as local:
        return (await local.stats())["auth"]


async def refused(endpoints: Endpoints, what: str, error: type[Exception] = AccessDenied) -> None:
    """A request of `what` kind through `endpoints` is refused at the handshake."""
    async with Client.connect(endpoints=endpoints) as client:
        with pytest.raises(error):
            if what == "start":
                await client.start("run `echo never`", timeout=REFUSED_WITHIN_S)
            elif what == "cancel":
                await client.cancel("0" * 12, timeout=REFUSED_WITHIN_S)
            else:
                await client.last_seq("0" * 12, timeout=REFUSED_WITHIN_S)


def test_keys_admit_by_role_over_tcp(tcp_host):
    home, listen = tcp_host
    run(home, "run `echo local`")  # the local CLI and actors: the local key over ipc
    laptop = issue(home, "laptop", "control")
    tv = issue(home, "tv", "viewer")
    worker = issue(home, "w", "worker")

    async def scenario():
        async with Client.connect(endpoints=remote(listen, laptop)) as client:
            started = await client.start("run `echo over tcp`")
            events = [e async for e in client.events(started.session, stop_at="first")]
        assert_one_run(events)
        assert "over tcp" in events[-1]["data"]["text"]

        async with Client.connect(endpoints=remote(listen, tv)) as viewer:
            replayed = [e async for e in viewer.events(started.session, follow=False)]
        assert replayed == events  # a viewer watches ...
        await refused(remote(listen, tv), "start")  # ... and can neither start
        await refused(remote(listen, tv), "cancel")  # ... nor cancel

        # A worker's key reaches the control socket (for aborts), yet cannot cancel.
        async with Client.connect(endpoints=remote(listen, worker)) as as_worker:
            with pytest.raises(RemoteError, match="forbidden"):
                await as_worker.cancel(started.session)
            await refused(remote(listen, worker), "start")

        stranger = Path(home) / "stranger"
        stranger.mkdir()
        zmq.auth.create_certificates(stranger, "client")
        (stranger / "client.key_secret").chmod(0o600)
        (stranger / "server.key").write_bytes((laptop / "server.key").read_bytes())
        for what in ("start", "cancel", "watch"):
            await refused(remote(listen, stranger), what)
        await refused(remote(listen, None), "start")  # plain TCP: no CURVE, no handshake

        copy = Path(home) / "laptop-copy"  # the folder as copied to the other machine
        copy.mkdir()
        for f in laptop.iterdir():
            (copy / f.name).write_bytes(f.read_bytes())
            (copy / f.name).chmod(0o600)
        assert oploop(home, "keys", "revoke", "laptop").returncode == 0
        await refused(remote(listen, copy), "start")

        counts = await auth_counts(home)
        assert counts["api.denied"] >= 3 and counts["control.denied"] >= 2
        async with Client.connect(Path(home)) as local:
            assert len(await local.sessions()) == 2  # nothing refused ever started

    asyncio.run(scenario())


def test_a_worker_elsewhere_serves_jobs_with_a_worker_key_only(tcp_host, tmp_path):
    home, listen = tcp_host
    worker_keys = issue(home, "far", "worker")
    viewer_keys = issue(home, "eyes", "viewer")
    stray_keys = issue(home, "stray", "worker")  # a worker key not listed as local
    with remote_executor(tmp_path / "far", listen, worker_keys) as (far, _), \
            remote_executor(tmp_path / "eyes", listen, viewer_keys) as (eyes, proc), \
            remote_executor(tmp_path / "stray", listen, stray_keys) as (stray, stray_proc):
        assert proc.wait(timeout=REFUSED_WITHIN_S) != 0  # refused: it says why and stops
        assert "refused this worker's key" in (eyes / "executor.log").read_text()
        assert stray_proc.wait(timeout=REFUSED_WITHIN_S) == 78  # EXIT_MACHINE_REFUSED
        assert "serves machine 'stray' only" in (stray / "executor.log").read_text()

        async def registered():
            async with Client.connect(Path(home)) as local:
                while True:
                    stats = await local.stats()
                    if stats["workers"]["tool"] == 2 and stats["auth"].get("work.denied"):
                        return stats
                    await asyncio.sleep(0.05)

        stats = asyncio.run(asyncio.wait_for(registered(), REFUSED_WITHIN_S))
        assert stats["workers"]["tool"] == 2  # the local executor and "far", not the others
        # Two tool calls in one reply go to the two idle executors, one each.
        events = run(home, "write near to a.txt and write far to b.txt")
        assert events[-1]["type"] == "DONE"
        session = events[0]["session"]
        here, there = workspace(home, session), workspace(str(far), session)
        written = sorted(p.name for w in (here, there) if w.exists() for p in w.iterdir())
        assert written == ["a.txt", "b.txt"]
        assert there.exists() and len(list(there.iterdir())) == 1


@contextlib.contextmanager
def remote_executor(home: Path, listen: str, keys: Path):
    """An executor with its own home that reaches the host only over TCP."""
    home.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPLOOP_")}
    env.update(OPLOOP_HOME=str(home), OPLOOP_CONNECT=listen, OPLOOP_KEYS=str(keys))
    log = open(home / "executor.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "actors.executor"], env=env,
                            stdin=subprocess.DEVNULL, stderr=log)
    try:
        yield home, proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        release_all(home)  # its workspaces stay mounted (as a host's do) until released


def test_status_shows_the_listening_address(tcp_host):
    home, listen = tcp_host
    status = oploop(home, "status")
    assert f"listening on {listen}" in status.stdout and "CURVE" in status.stdout
    data = json.loads(oploop(home, "status", "--json").stdout)
    assert data["actors"] and (Path(home) / "run" / "network.json").exists()


def test_plain_tcp_off_loopback_is_refused_at_up(short_home):
    Path(short_home, "oploop.toml").write_text(
        '[network]\nlisten = "tcp://0.0.0.0:7400"\ncurve = false\n')
    up = oploop(short_home, "up", "--detach")
    assert up.returncode == 1
    assert "network.curve" in up.stderr and "plain TCP" in up.stderr
    assert not (Path(short_home) / "run" / "host.json").exists()


def test_a_client_elsewhere_needs_the_host_key_it_was_issued(tcp_host):
    home, listen = tcp_host
    keys = issue(home, "copy", "control")
    ClientKeys.load(keys)  # what OPLOOP_KEYS must hold: server.key and client.key_secret
    env = {"OPLOOP_CONNECT": listen, "OPLOOP_KEYS": str(keys)}
    out = oploop(str(Path(home) / "elsewhere"), "run", "run `echo via env`", env=env)
    assert out.returncode == 0, out.stderr
    assert "via env" in out.stdout
    assert not (Path(home) / "elsewhere" / "run").exists()  # no embedded host was started
    env["OPLOOP_KEYS"] = str(issue(home, "onlooker", "viewer"))
    out = oploop(str(Path(home) / "elsewhere"), "run", "run `echo no`", env=env)
    assert out.returncode == 1 and "refused this key" in out.stderr, out.stderr


def test_what_a_host_keeps_is_private(tcp_host):
    home, _ = tcp_host
    run(home, "run `echo private`")
    root = Path(home)
    modes = {p.relative_to(root).as_posix(): stat.S_IMODE(p.stat().st_mode)
             for p in [root / "run", *(root / "run").iterdir(), root / "keys",
                       *root.glob("*.db*"), root / "host.log",
                       *(root / "keys").glob("*.key_secret")]}
    assert modes.pop("run") == modes.pop("keys") == 0o700
    assert modes.pop("run/offline.port") == 0o644  # a port number, read by the llm callers
    assert {"sessions.db", "run/api.sock", "run/network.json",
            "keys/server.key_secret", "host.log"} <= set(modes)
    assert {name: mode for name, mode in modes.items() if mode != 0o600} == {}


def test_tools_cannot_read_the_keys_or_the_journal(tcp_host):
    home, _ = tcp_host
    for path in (f"{home}/keys/client.key_secret", f"{home}/sessions.db"):
        events = run(home, f"read {path}")
        (end,) = [e for e in events if e["type"] == "TOOL_END"]
        # The sandbox hides the home (the `private` check behind it names oploop's files).
        assert end["data"]["is_error"], end
        assert "secret-key" not in json.dumps(events)


def test_a_host_up_from_a_shell_pointed_elsewhere_still_serves_itself(short_home, tmp_path):
    elsewhere = {"OPLOOP_CONNECT": "tcp://127.0.0.1:1", "OPLOOP_KEYS": str(tmp_path)}
    with running_host(short_home, elsewhere):  # its workers must not follow OPLOOP_CONNECT
        assert run(short_home, "run `echo served here`")[-1]["type"] == "DONE"
        status = oploop(short_home, "status", "--json", env=elsewhere)
        assert status.returncode == 0, status.stderr  # status is about this home's host
        assert json.loads(status.stdout)["sessions"]
