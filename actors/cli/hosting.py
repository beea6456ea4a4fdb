"""Which host a command talks to, and noticing at once when it dies.

`oploop run` and `oploop tools` use the running host of `$OPLOOP_HOME`, or start
an embedded one: the same `python -m actors.host`, in the background and in a
session of its own (a terminal's Ctrl-C reaches only the CLI), shared by every
CLI of this home that needs one and stopped by itself when the last is gone
(`actors.host.lease`). Its log is `$OPLOOP_HOME/host.log`, as for `up --detach`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from actors.cli.errors import CliError, HostGone
from actors.host import lease
from actors.host.actor import read_state
from actors.runtime import read_ready_line
from actors.settings import EMBEDDED_ENV, READY_FD_ENV, Settings
from bus.client import Client
from bus.endpoints import Endpoints

#: How often the CLI checks that the host it waits on is alive.
HOST_POLL_S = 0.1
#: How long the last user of an embedded host waits for it to stop.
STOP_WAIT_S = 10.0


@dataclass
class Started:
    """A host process started in the background, ready."""

    pid: int
    state: dict[str, Any]


def offline_notice(state: dict[str, Any] | None) -> None:
    """Say so when the host plays the offline model (no key, no base URL)."""
    if state and state.get("offline"):
        print("oploop: no ANTHROPIC_API_KEY or ANTHROPIC_BASE_URL set: using the offline "
              "model (canned answers, no network)", file=sys.stderr)


async def spawn_host(home: Path, *, embedded: bool) -> Started:
    """Start `python -m actors.host` in the background (its own session, output to
    `home/host.log`) and wait until it says ready; cancellable (the host is then
    stopped). Raises `CliError` naming the log when it does not start."""
    rfd, wfd = os.pipe()
    env = {**os.environ, "OPLOOP_HOME": str(home), READY_FD_ENV: str(wfd)}
    if embedded:
        env[EMBEDDED_ENV] = "1"
    log = home / "host.log"
    # The log may quote prompts and tool output: this user's eyes only.
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.fchmod(log_fd, 0o600)
        proc = subprocess.Popen(  # noqa: ASYNC220 - Popen returns at once
            [sys.executable, "-m", "actors.host"], stdin=subprocess.DEVNULL, stdout=log_fd,
            stderr=log_fd, start_new_session=True, pass_fds=(wfd,), env=env,
        )
    finally:
        os.close(wfd)
        os.close(log_fd)
    loop = asyncio.get_running_loop()
    # Read in a thread: if we are cancelled, the host is stopped, its end of the
    # pipe closes and the read returns, so the thread never outlives us.
    reading = loop.run_in_executor(None, read_ready_line, rfd)
    try:
        line = await asyncio.shield(reading)
    except BaseException:
        _stop_starting(proc)
        await asyncio.wait([reading])
        raise
    finally:
        if reading.done():
            os.close(rfd)
    if line != b"ready\n":
        code = await loop.run_in_executor(None, proc.wait)
        raise CliError(f"the host did not start (exit {code}): {_last_line(log)}; "
                       f"see {log}")
    state = read_state(home) or {"pid": proc.pid}
    return Started(proc.pid, state)


def _stop_starting(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()


def _last_line(log: Path) -> str:
    """The last line of the host's log (where it says why it stopped)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return lines[-1].strip() if lines else "nothing logged"


@dataclass
class Attached:
    """A client of a host, and the pid to watch (None: a host elsewhere)."""

    client: Client
    host_pid: int | None
    embedded: bool


@contextlib.asynccontextmanager
async def attach(settings: Settings, *, start: bool) -> AsyncIterator[Attached]:
    """A client of the host of `settings`: elsewhere (`OPLOOP_CONNECT`), the running
    one of the home, or (with `start`) an embedded one, joined or started. Without
    `start` and no host: `CliError` at once, not a wait."""
    if settings.connect:
        async with Client.connect(endpoints=settings.endpoints()) as client:
            yield Attached(client, None, False)
        return
    home = settings.home
    if not start:
        state = read_state(home)
        # No state file: no host, unless something serves the sockets all the same (a
        # program running the actors itself); a socket file nobody listens on is stale.
        if state is None and not listening(Endpoints.for_home(home).path("api")):
            raise CliError(f"no host is running in {home} (start one with "
                           "`oploop up --detach`; `oploop run` starts one for its run)")
        pid = int(state["pid"]) if state is not None else None
        async with Client.connect(home) as client:
            yield Attached(client, pid, bool(state and state.get("embedded")))
        return
    users, state = await _join_or_start(home)
    pid, embedded = int(state["pid"]), bool(state.get("embedded"))
    try:
        async with Client.connect(home) as client:
            yield Attached(client, pid, embedded)
    finally:
        os.close(users)
        if embedded:
            await _stop_if_last(home, pid)


@contextlib.asynccontextmanager
async def host_client(settings: Settings | None = None) -> AsyncIterator[Client]:
    """A `Client` of the running host (`OPLOOP_CONNECT`, else `$OPLOOP_HOME`'s), or of an
    embedded one started for this program (shared with `oploop run`s of the same home,
    stopped when the last user ends): what a program uses to need no `oploop up`."""
    if settings is None:
        from actors.settings import load_settings

        settings = load_settings()
    async with attach(settings, start=True) as host:
        yield host.client


async def _stop_if_last(home: Path, pid: int) -> None:
    """The last user of an embedded host stops it and waits until it is gone, so that
    nothing of it outlives the command (it would stop by itself within a moment: this
    makes that moment part of the command)."""
    run_dir = Endpoints.for_home(home).run_dir
    held = await lease.mutex(run_dir)  # (held by the host while it stops by itself)
    try:
        state = read_state(home)
        if state is None or int(state["pid"]) != pid:
            return
        users = lease.unused(run_dir)
        if users is None:
            return  # others use it: the last of them stops it
        os.close(users)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        while alive(pid) and time.monotonic() < deadline:  # noqa: ASYNC110 - a pid has no event to await
            await asyncio.sleep(0.02)
    finally:
        os.close(held)


async def _join_or_start(home: Path) -> tuple[int, dict[str, Any]]:
    """Join the running host as a user, or start an embedded one; (users fd, state)."""
    run_dir = Endpoints.for_home(home).run_dir
    Endpoints.for_home(home).prepare()
    while True:
        held = await lease.mutex(run_dir)
        try:
            state = read_state(home)
            users = lease.join(run_dir)
            if users is not None and state is not None:
                return users, state
            if users is not None:  # (None: a host stopping; not seen with the mutex held)
                try:
                    started = await spawn_host(home, embedded=True)
                except BaseException:
                    os.close(users)
                    raise
                offline_notice(started.state)
                return users, started.state
        finally:
            os.close(held)
        await asyncio.sleep(lease.POLL_S)


def listening(path: Path) -> bool:
    """Whether a process accepts connections on the unix socket `path` (at once: a
    stale socket file refuses)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


@contextlib.asynccontextmanager
async def host_watch(pid: int | None, home: Path) -> AsyncIterator[None]:
    """Raise `HostGone` in the body within `HOST_POLL_S` of the host's death, rather
    than after the client's request timeouts (30 s for a viewer)."""
    if pid is None:
        yield
        return
    main = asyncio.current_task()
    assert main is not None
    died = False

    async def poll() -> None:
        nonlocal died
        while alive(pid):  # noqa: ASYNC110 - a pid has no event to await
            await asyncio.sleep(HOST_POLL_S)
        died = True
        main.cancel()

    watcher = asyncio.create_task(poll())
    try:
        yield
    except asyncio.CancelledError:
        if died and main.uncancel() == 0:
            if read_state(home) is None and not (Endpoints.for_home(home).run_dir
                                                 / "host.json").exists():
                raise HostGone(f"the host (pid {pid}) stopped (`oploop down`?)") from None
            raise HostGone(f"the host (pid {pid}) died; see {home / 'host.log'}, then "
                           "`oploop up` to resume its runs") from None
        raise
    finally:
        watcher.cancel()
