"""A worker machine (`oploop worker`): this machine's workers, serving a host elsewhere.

    oploop worker --connect tcp://HOST:PORT --keys DIR --machine NAME
                  [--executors N] [--llm-callers N]

starts N executors (and llm callers) that connect to the host's `work` and
`control` sockets over TCP + CURVE with the worker key in DIR (`oploop keys add
NAME --role worker` on the host), each saying `Ready` with machine NAME. It keeps
them alive with the host's own restart policy (`children.keep_alive`); when the
link goes and comes back, libzmq connects again and each worker announces itself
anew (its jobs of before are abandoned on both sides: a tool never runs twice).
A key the host refuses is no death to restart from: the workers exit with
`EXIT_REFUSED` (or `EXIT_MACHINE_REFUSED`: a worker key of another machine) and
the command stops, saying why in one line, status 1. Each worker says it is ready
only once the host accepted it (or after `worker.ACCEPT_WAIT_S` with no answer:
a host down), so a refused machine never prints "serving".

The workers' own logs go to `$OPLOOP_HOME/worker.log` (this machine's home, which
also holds the sandbox's workspaces and `sandbox.toml`).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from actors.host.children import Child, StartFailed, keep_alive, spawn, start_all, stop_all
from actors.machines import EXIT_MACHINE_REFUSED, EXIT_REFUSED, LOCAL, machine_name_error
from actors.settings import MACHINE_ENV, PARENT_PID_ENV
from bus.endpoints import EndpointError, Endpoints
from bus.security import ClientKeys, CredentialError

log = logging.getLogger("oploop.worker")

LOCK_FILE = "worker.lock"
LOG_FILE = "worker.log"
#: The model's settings (the SDK's variables): the llm callers' only, as on a host.
MODEL_ENV_PREFIX = "ANTHROPIC_"


class WorkerMachineError(Exception):
    """The worker machine cannot serve: bad arguments, keys, or the host refused its key."""


@dataclass(frozen=True, slots=True)
class WorkerMachineSpec:
    """What `oploop worker` was asked for, checked (`check`)."""

    connect: str
    keys: Path
    machine: str
    executors: int = 1
    llm_callers: int = 0

    def check(self) -> None:
        """Raise `WorkerMachineError` naming the first thing wrong."""
        problem = machine_name_error(self.machine)
        if problem is None and self.machine == LOCAL:
            problem = f"{LOCAL!r} is a host's own machine: name this one otherwise"
        if problem is not None:
            raise WorkerMachineError(f"--machine: {problem}")
        if self.executors < 0 or self.llm_callers < 0 or not self.executors + self.llm_callers:
            raise WorkerMachineError("--executors and --llm-callers: at least one worker")
        try:
            Endpoints.elsewhere(self.connect, self.keys)
            ClientKeys.load(self.keys)
        except (EndpointError, CredentialError) as exc:
            raise WorkerMachineError(str(exc)) from None


class WorkerMachine:
    """Starts, restarts and stops the workers of one worker machine."""

    def __init__(self, spec: WorkerMachineSpec, home: Path) -> None:
        self.spec = spec
        self.home = home
        self.children: list[Child] = []
        #: Set (with why) when the host refused the key: the machine stops.
        self.refused = asyncio.Event()
        self.refused_status = EXIT_REFUSED
        self._stopping = False
        self._log: IO[bytes] | None = None
        self._lock_fd: int | None = None

    def workers(self) -> list[Child]:
        """The processes this machine keeps: its executors and llm callers, and the
        network proxy when its configuration has an allowlist (its executors' calls
        reach the network through this machine's proxy, as on a host)."""
        children = (
            [Child(f"executor-{i + 1}", "actors.executor") for i in range(self.spec.executors)]
            + [Child(f"llm-{i + 1}", "actors.llm_caller", model_env=True)
               for i in range(self.spec.llm_callers)])
        proxy = Child("netproxy", "actors.netproxy")
        if self.spec.executors and _has_allowlist(self._env(proxy)):
            children.append(proxy)
        return children

    def _env(self, child: Child) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if child.model_env or not k.startswith(MODEL_ENV_PREFIX)}
        env.update(OPLOOP_HOME=str(self.home), OPLOOP_CONNECT=self.spec.connect,
                   OPLOOP_KEYS=str(self.spec.keys.absolute()))
        env[MACHINE_ENV] = self.spec.machine
        env[PARENT_PID_ENV] = str(os.getpid())  # they die with this process
        return env

    async def _start(self, child: Child) -> None:
        await spawn(child, self._env(child), stderr=self._log)

    def _final(self, status: int) -> bool:
        if status in (EXIT_REFUSED, EXIT_MACHINE_REFUSED):
            self.refused_status = status
            self.refused.set()
            return True
        return False

    def _refusal(self, status: int) -> WorkerMachineError:
        """What the command says when the host refused a worker with `status`."""
        if status == EXIT_MACHINE_REFUSED:
            return WorkerMachineError(
                f"the host at {self.spec.connect} refused machine {self.spec.machine}: the "
                f"key in {self.spec.keys} is not the worker key of {self.spec.machine} (a "
                f"worker key serves only its own machine: oploop keys add "
                f"{self.spec.machine} --role worker, on the host)")
        return WorkerMachineError(
            f"the host at {self.spec.connect} refused the key in {self.spec.keys} "
            f"(machine {self.spec.machine}): is it a worker key (oploop keys add NAME "
            "--role worker) of that host, and not revoked?")

    async def serve(self) -> None:
        """Start every worker, keep them alive until cancelled (or refused), then stop
        them; raises `WorkerMachineError` if the host refused the key."""
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._take_lock()
        self._log = await asyncio.to_thread(open, self.home / LOG_FILE, "ab")
        try:
            self.children = self.workers()
            try:
                await start_all([self._start(c) for c in self.children])
            except StartFailed as exc:
                # A worker refused before it said ready: the host's word, not a crash.
                for child in self.children:
                    code = child.proc.returncode if child.proc is not None else None
                    if code in (EXIT_REFUSED, EXIT_MACHINE_REFUSED):
                        raise self._refusal(code) from None
                raise WorkerMachineError(f"{exc} (see {self.home / LOG_FILE})") from None
            print(f"oploop worker: machine {self.spec.machine}: {self.spec.executors} "
                  f"executor(s), {self.spec.llm_callers} llm caller(s) serving "
                  f"{self.spec.connect}", file=sys.stderr, flush=True)
            # Owned here: cancelled and awaited on the way out, whatever ends the wait.
            keepers = [asyncio.create_task(keep_alive(
                child, self._start, changed=lambda: None, stopping=lambda: self._stopping,
                final=self._final), name=f"keep-{child.name}") for child in self.children]
            try:
                await self.refused.wait()
            finally:
                self._stopping = True
                for keeper in keepers:
                    keeper.cancel()
                await asyncio.gather(*keepers, return_exceptions=True)
            raise self._refusal(self.refused_status)
        finally:
            self._stopping = True
            await stop_all(self.children)
            self._log.close()
            if self._lock_fd is not None:
                os.close(self._lock_fd)

    def _take_lock(self) -> None:
        """One worker machine per home: two would share (and sweep) one sandbox."""
        fd = os.open(self.home / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise WorkerMachineError(f"a worker machine already runs in {self.home}") from None
        self._lock_fd = fd


def _has_allowlist(env: dict[str, str]) -> bool:
    """Whether the configuration the workers started with `env` read has a network
    allowlist (a configuration they cannot read: they say so themselves)."""
    from actors.allowlist import allowlists
    from actors.config import ConfigError
    from actors.settings import load_settings

    try:
        return bool(allowlists(load_settings(env).config))
    except ConfigError:
        return False


def run_worker_machine(spec: WorkerMachineSpec, home: Path) -> int:
    """Run a worker machine in the foreground until SIGTERM/SIGINT (status 0) or a
    refused key (`WorkerMachineError`)."""
    import signal

    spec.check()
    machine = WorkerMachine(spec, home)

    async def main() -> None:
        task = asyncio.ensure_future(machine.serve())
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    return 0
