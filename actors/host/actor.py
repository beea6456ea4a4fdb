"""The host process: one `Host` owns the runtime dir and every child actor."""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from actors.config import ConfigError, HttpConfig
from actors.gateway import listen
from actors.gateway.listen import ListenError
from actors.gateway.urls import load_token
from actors.host import lease
from actors.host.children import (
    READY_TIMEOUT_S,
    Child,
    StartFailed,
    keep_alive,
    spawn,
    start_all,
    stop_all,
)
from actors.procstart import start_ticks
from actors.runtime import notify_ready, run_actor
from actors.settings import (
    EMBEDDED_ENV,
    MACHINE_ENV,
    PARENT_PID_ENV,
    Settings,
    load_settings,
    model_choice,
)
from actors.storage import make_room_to_start
from bus.endpoints import NETWORK_FILE, REMOTE_ENV, Endpoints, Network, oploop_home, write_network
from bus.security import CredentialError, Keyring

log = logging.getLogger("oploop.host")

STATE_FILE = "host.json"
LOCK_FILE = "host.lock"
OFFLINE_PORT_FILE = "offline.port"
#: The gateway's URL (`http://HOST:PORT/`), written by the host once it listens.
WEB_URL_FILE = "web.url"


class HostError(Exception):
    """The host cannot start (another host runs here, a child never came up, ...)."""


#: The model's settings in the environment (the SDK's variables): the llm callers' only.
MODEL_ENV_PREFIX = "ANTHROPIC_"


def model_settings(llm_backend: str, env: dict[str, str]) -> dict[str, str] | None:
    """The model endpoint the user configured, or None: start the offline model.

    `llm_backend` `scripted` runs the model inside the llm callers
    (`actors.llm_caller.scripted`): no endpoint, and no offline model process.
    """
    choice = model_choice(llm_backend, env)
    return None if choice.kind == "offline" else dict(choice.endpoint)


class Host:
    """Starts, watches, restarts and stops the actors of one `$OPLOOP_HOME`."""

    def __init__(self, home: Path | None = None, *, llm_callers: int = 1, executors: int = 1,
                 scenario: str = "", network: Network | None = None,
                 llm_backend: str = "anthropic", embedded: bool = False,
                 gateway: bool = False, http: HttpConfig | None = None,
                 netproxy: bool = False,
                 mcp_start_s: float = 0.0, shared_store: bool = False) -> None:
        self.home = (home or oploop_home()).absolute()
        #: The longest an executor's MCP server may take to start (`start_timeout_s`): an
        #: executor says it is ready once each has listed its tools or failed once.
        self.mcp_start_s = mcp_start_s
        self.network = network
        self.endpoints = Endpoints.for_home(self.home)
        self.run_dir = self.endpoints.run_dir
        self.llm_callers = llm_callers
        self.executors = executors
        self.scenario = scenario
        self.llm_backend = llm_backend
        #: Started by `oploop run` for its users (`actors.host.lease`): stops when the
        #: last one is gone, and its runs end with it rather than wait for a resume.
        self.embedded = embedded
        #: Whether the session log is a store shared with other hosts (said in the state
        #: file, never its url: `oploop down` tells where the running sessions go on).
        self.shared_store = shared_store
        #: Whether to run the gateway (web view, HTTP API, metrics): `oploop up` does
        #: unless `[http] enabled = false`; an embedded host does not. It starts at the
        #: first connection to `http` (`[http]`), which the host binds at start.
        self.gateway = gateway
        self.http = http or HttpConfig()
        #: Whether to run the filtering network proxy (`actors.netproxy`): some agent
        #: or MCP server has a `network` allowlist.
        self.netproxy = netproxy
        self.children: list[Child] = []
        self.offline = False
        self._lock_fd: int | None = None
        self._offline_sock: socket.socket | None = None
        #: The gateway's listening socket (`actors.gateway.listen`), bound at start.
        self._http_sock: socket.socket | None = None
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = False
        self._stopped = False

    # -- start -------------------------------------------------------------------------

    async def start(self) -> None:
        """Take the runtime dir, start every actor, and return once all are ready."""
        self._stopped = False
        make_room_to_start(self.home)  # a full disk must not stop `oploop up`
        self.endpoints.prepare()
        self._take_lock()
        for stale in self.endpoints.remove_stale():
            log.info("removed stale socket %s", stale)
        try:
            # Keys are made at the first start that serves CURVE (or by the first
            # `oploop keys add`); a host on ipc alone never loads pyzmq's key code. On a
            # shared store too: the other hosts admit its local key (`actors.peerhosts`).
            if (self.network is not None and self.network.curve) or self.shared_store:
                Keyring.for_home(self.home).ensure()
            write_network(self.run_dir, self.network)
            base = {"OPLOOP_HOME": str(self.home), PARENT_PID_ENV: str(os.getpid())}
            if self.embedded:
                base[EMBEDDED_ENV] = "1"
            model = model_settings(self.llm_backend, dict(os.environ))
            # Every actor starts at once: zmq queues what a DEALER/PUSH sends before the
            # peer binds, so no actor needs another up first, and on 2 cores the imports
            # overlap. Only the llm callers wait, for the offline model's port.
            others = [Child("broadcaster", "actors.broadcaster", env=base),
                      Child("supervisor", "actors.supervisor", env=base)]
            others += [Child(f"executor-{i + 1}", "actors.executor", env=base,
                             ready_timeout_s=READY_TIMEOUT_S + self.mcp_start_s)
                       for i in range(self.executors)]
            gateway = self._bind_gateway(base) if self.gateway else None
            if self.netproxy:
                # Kept alive like every actor: while it restarts, a sandboxed call's
                # forwarder answers 503 (no socket to reach), never anything else.
                others.append(Child("netproxy", "actors.netproxy", env=base))
            self.children += others
            await start_all(
                [*(self._spawn(c) for c in others), self._start_llm_callers(base, model)]
            )
            for child in self.children:
                self._watchers.append(asyncio.create_task(self._watch(child)))
            if gateway is not None:  # after the others: it has no process to watch yet
                self.children.append(gateway)
                self._watchers.append(asyncio.create_task(self._gateway_on_demand(gateway)))
            self._write_state("ready")
        except (CredentialError, ListenError) as exc:
            await self.stop()
            raise HostError(str(exc)) from exc
        except BaseException:
            await self.stop()
            raise

    async def _start_llm_callers(self, base: dict[str, str], model: dict[str, str] | None) -> None:
        if model is None:
            model = await self._start_offline_model(base)
        callers = [Child(f"llm-{i + 1}", "actors.llm_caller", env={**base, **model},
                         model_env=True) for i in range(self.llm_callers)]
        self.children += callers
        await start_all([self._spawn(c) for c in callers])

    async def _start_offline_model(self, base: dict[str, str]) -> dict[str, str]:
        port_file = self.run_dir / OFFLINE_PORT_FILE
        port_file.unlink(missing_ok=True)
        # The host binds the port and keeps the listening socket; each incarnation of
        # the offline model serves it. A restarted one on a port of its own would leave
        # every llm caller calling the dead one's address (their environment is fixed
        # at spawn), and while none runs, connections wait in the backlog.
        sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._offline_sock = sock
        args = ["--port-file", str(port_file), "--fd", str(sock.fileno())]
        if self.scenario:
            args += ["--scenario", self.scenario]
        child = Child("offline-model", "actors.offline_model", args=args, env=base,
                      fds=(sock.fileno(),))
        self.children.append(child)
        await self._spawn(child)
        self.offline = True
        port = sock.getsockname()[1]
        print(f"oploop: no ANTHROPIC_API_KEY or ANTHROPIC_BASE_URL set: using the offline "
              f"model on 127.0.0.1:{port}", file=sys.stderr)
        # The offline model's address is given as the SDK's own variables, so the llm
        # caller takes exactly the code path it takes for the real API.
        return {"ANTHROPIC_BASE_URL": f"http://127.0.0.1:{port}", "ANTHROPIC_API_KEY": "offline"}

    def _bind_gateway(self, base: dict[str, str]) -> Child:
        """Bind `[http] listen` and publish its URL (`run/web.url`); the gateway that
        will serve it (`_gateway_on_demand`). Raises `ListenError`."""
        assert self.http is not None
        listen.check_tls(self.http)  # a bad cert/key fails `oploop up`, not a request
        sock = listen.bind(self.http)
        self._http_sock = sock
        load_token(self.home)  # `oploop web` prints the page's address with it
        listen.write_url(self.run_dir, listen.url_of(sock, self.http.tls))
        child = Child("gateway", "actors.gateway", args=["--fd", str(sock.fileno())],
                      env=base, fds=(sock.fileno(),))
        child.state = "waiting"
        return child

    async def _gateway_on_demand(self, child: Child) -> None:
        """Start the gateway at the first connection to its socket (it waits in the
        backlog meanwhile), then keep it alive like every actor. Until then no
        gateway process runs: an idle host without a web client saves its memory."""
        assert self._http_sock is not None
        loop = asyncio.get_running_loop()
        connected = loop.create_future()
        fd = self._http_sock.fileno()
        loop.add_reader(fd, lambda: connected.done() or connected.set_result(None))
        try:
            await connected
        finally:
            loop.remove_reader(fd)
        log.info("a first connection to the web view: starting the gateway")
        try:
            await spawn(child, self._env(child))
        except StartFailed as exc:  # restarted as if it had died
            log.error("the gateway did not start: %s", exc)
            if child.proc is not None and child.proc.returncode is None:
                child.proc.kill()
        if child.proc is None:
            child.state = "failed"
        else:
            self._write_state("ready")
            await self._watch(child)
        if child.state == "failed" and self._http_sock is not None:
            # Given up on: refused at once, rather than left waiting in the backlog.
            self._http_sock.close()
            self._http_sock = None
            (self.run_dir / WEB_URL_FILE).unlink(missing_ok=True)
        self._write_state("ready")

    @staticmethod
    def _env(child: Child) -> dict[str, str]:
        """The environment `child` starts with (before its own additions)."""
        # A host's own actors always serve it: never the host OPLOOP_CONNECT names
        # (set in the user's shell for the CLI, it must not carry over to them), nor as
        # a worker machine's.
        return {k: v for k, v in os.environ.items() if k not in REMOTE_ENV
                and k != MACHINE_ENV
                and (child.model_env or not k.startswith(MODEL_ENV_PREFIX))}

    async def _spawn(self, child: Child) -> None:
        """Start `child` and wait until it says ready (or dies, or times out)."""
        try:
            await spawn(child, self._env(child))
        except StartFailed as exc:
            raise HostError(str(exc)) from None
    def _take_lock(self) -> None:
        fd = os.open(self.run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise HostError(f"a host is already running in {self.home}") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    # -- watch -------------------------------------------------------------------------

    async def _watch(self, child: Child) -> None:
        """Restart `child` whenever it dies, until the policy says it has failed."""
        await keep_alive(child, lambda c: spawn(c, self._env(c)),
                         changed=lambda: self._write_state("ready"),
                         stopping=lambda: self._stopping)
    def _write_state(self, state: str) -> None:
        if state == "ready" and any(c.state == "failed" for c in self.children):
            state = "degraded"  # until the host stops: a failed actor stays failed
        data = {"pid": os.getpid(), "started": start_ticks("self"), "state": state,
                "home": str(self.home),
                "offline": self.offline, "embedded": self.embedded,
                "shared_store": self.shared_store,
                "actors": [c.describe() for c in self.children],
                "listen": self.network.listen if self.network else None,
                "curve": bool(self.network and self.network.curve)}
        tmp = self.run_dir / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.run_dir / STATE_FILE)

    # -- stop --------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop every child (SIGTERM, bounded wait, SIGKILL of what is left, tree and
        all), then remove sockets, state and lock. Once: a second call returns at once
        (the files are by then maybe a newer host's)."""
        if self._stopped:
            return
        self._stopped = True
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        # The supervisor, the one writer of the session log, stops first, the workers
        # still there: what it hears as it stops must not be news of the stop itself
        # (an executor's goodbye would end its calls "executor left", where the next
        # start's resume answers them "interrupted").
        await stop_all(self.children, first=("supervisor",))
        self.endpoints.remove_stale()
        for name in (STATE_FILE, OFFLINE_PORT_FILE, WEB_URL_FILE, NETWORK_FILE, LOCK_FILE):
            (self.run_dir / name).unlink(missing_ok=True)
        for sock in (self._offline_sock, self._http_sock):
            if sock is not None:
                sock.close()
        self._offline_sock = self._http_sock = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    async def serve(self) -> None:
        """Start, then run until cancelled; always stop."""
        try:
            await self.start()
            print(f"oploop: host {os.getpid()} ready in {self.home}"
                  + (" (embedded)" if self.embedded else ""), file=sys.stderr, flush=True)
            notify_ready()
            if not self.embedded:
                await asyncio.Event().wait()
            held = await lease.until_unused(self.run_dir)
            log.info("embedded host: no user left, stopping")
            try:
                await asyncio.shield(self.stop())
            finally:
                os.close(held)
        finally:
            await asyncio.shield(self.stop())


def read_state(home: Path | None = None) -> dict[str, Any] | None:
    """The running host's state file, or None when no live host owns `home`.

    A host killed outright leaves its file behind, and its pid may since be another
    process's (pids wrap at 32,768 on many machines): the process must have started
    when the host that wrote the file did (`started`), or the file is stale (else
    `oploop down` would stop whatever got the pid)."""
    run_dir = Endpoints.for_home(home).run_dir
    try:
        data: dict[str, Any] = json.loads((run_dir / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    import psutil  # (the CLI's, which has it loaded: the host process itself never asks)

    try:
        pid = int(data.get("pid", 0))
        if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:  # killed, not reaped
            return None
    except (psutil.Error, ValueError, TypeError):
        return None
    started = data.get("started")  # (absent from a file of a host before this field)
    if started is not None and start_ticks(pid) != started:
        return None
    return data


def host_for(settings: Settings, *, gateway: bool = False) -> Host:
    """The host `settings` describe: its home, its workers (`OPLOOP_LLM_CALLERS`,
    `OPLOOP_EXECUTORS`), its model, its network; with `gateway`, its HTTP gateway
    when `[http]` enables it."""
    return Host(settings.home, llm_callers=settings.llm_callers, executors=settings.executors,
                scenario=settings.offline_scenario, network=settings.config.network,
                llm_backend=settings.llm_backend, embedded=settings.embedded,
                gateway=gateway and settings.config.http.enabled and not settings.embedded,
                http=settings.config.http,
                netproxy=_wants_netproxy(settings),
                mcp_start_s=2 * max((s.start_timeout_s for s in settings.config.mcp.values()),
                                    default=0.0),
                shared_store=bool(settings.config.store.url))


def _wants_netproxy(settings: Settings) -> bool:
    """Whether some agent or MCP server of the configuration has a network allowlist."""
    from actors.allowlist import allowlists

    return bool(allowlists(settings.config))


def main() -> None:
    """Entry point of `python -m actors.host`."""
    try:
        settings = load_settings()
        host = host_for(settings, gateway=True)
        # asyncio's own loop: the host only starts its actors and waits on them.
        run_actor("host", lambda _settings: host.serve(), with_parent=False, settings=settings,
                  fast_loop=False)
    except (HostError, ConfigError) as exc:
        print(f"oploop: {exc}", file=sys.stderr)
        sys.exit(1)
