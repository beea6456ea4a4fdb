"""Actor processes kept alive: start one and wait for its "ready", restart it when it
dies (backoff and storm cap: `actors.restarts.RestartPolicy`), stop a set of them.

The host (`actor.Host`) keeps its actors with it, and a worker machine
(`actors.host.workers`, `oploop worker`) its workers: one restart policy for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from actors.restarts import RestartPolicy
from actors.runtime import read_ready_line
from actors.settings import READY_FD_ENV, RESTARTED_ENV

if TYPE_CHECKING:
    import psutil

log = logging.getLogger("oploop.host")

#: How long a child may take to say it is ready.
READY_TIMEOUT_S = 30.0
#: How long a child gets between SIGTERM and SIGKILL.
STOP_GRACE_S = 3.0


class StartFailed(Exception):
    """A child did not become ready: it exited first, or took too long."""


@dataclass
class Child:
    """One actor process kept alive."""

    name: str
    module: str
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    #: File descriptors of the parent's that every incarnation inherits (as numbered).
    fds: tuple[int, ...] = ()
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    restarts: int = 0
    state: str = "new"
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    #: Whether it inherits the model's settings (`ANTHROPIC_*`): only the llm callers
    #: call the model; an executor must not hold the key a tool could read.
    model_env: bool = False
    #: How long it may take to say it is ready (an executor waits for its MCP servers).
    ready_timeout_s: float = READY_TIMEOUT_S

    def describe(self) -> dict[str, Any]:
        """The child as written to a state file (no pid while it is not alive: a
        dead one's pid may already be another process's)."""
        alive = self.proc is not None and self.proc.returncode is None
        return {
            "name": self.name,
            "pid": self.proc.pid if alive and self.proc else None,
            "restarts": self.restarts,
            "state": self.state,
            "started": self.started,
        }


async def spawn(child: Child, env: Mapping[str, str], stderr: IO[bytes] | None = None) -> None:
    """Start `child` with `env` (plus its own) and wait until it says ready; raises
    `StartFailed` if it dies or times out first. `stderr`: where its output goes
    (default: ours)."""
    rfd, wfd = os.pipe()
    full = {**env, **child.env, READY_FD_ENV: str(wfd)}
    try:
        # A session of its own: a terminal's Ctrl-C (sent to its foreground process
        # group) reaches the parent alone, which stops its children in order, instead
        # of every one at once, each printing its own KeyboardInterrupt.
        child.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", child.module, *child.args,
            env=full, pass_fds=(wfd, *child.fds), stdin=asyncio.subprocess.DEVNULL,
            stderr=stderr, start_new_session=True,
        )
    finally:
        os.close(wfd)
    child.started = time.monotonic()
    child.state = "starting"
    try:
        line = await asyncio.wait_for(asyncio.to_thread(read_ready_line, rfd),
                                      child.ready_timeout_s)
    except TimeoutError:
        raise StartFailed(f"{child.name} did not become ready in "
                          f"{child.ready_timeout_s:g} s") from None
    finally:
        os.close(rfd)
    if line != b"ready\n":
        code = await child.proc.wait()
        raise StartFailed(f"{child.name} exited with status {code} before it was ready")
    child.state = "running"


async def start_all(starts: list[Coroutine[Any, Any, None]]) -> None:
    """Await every start; when one fails, cancel the rest before raising, so that
    every process started so far is known (`child.proc`) to the `stop()` that follows."""
    tasks = [asyncio.ensure_future(s) for s in starts]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def keep_alive(child: Child, start: Callable[[Child], Awaitable[None]], *,
                     changed: Callable[[], None], stopping: Callable[[], bool],
                     final: Callable[[int], bool] = lambda code: False) -> None:
    """Restart `child` (through `start`) whenever it dies, until its policy says it
    has failed, `final(status)` says that exit must not be restarted (the child
    stays "exited"), or `stopping()`. `changed()` is told of every state change."""
    while not stopping():
        assert child.proc is not None
        code = await child.proc.wait()
        if stopping():
            return
        ran = time.monotonic() - child.started
        if final(code):
            child.state = "exited"
            changed()
            return
        delay = child.policy.on_death(time.monotonic(), ran)
        log.warning("%s (pid %d) exited with %s after %.1fs", child.name, child.proc.pid, code, ran)
        if delay is None:
            child.state = "failed"
            log.error("%s restarted too often: marked failed", child.name)
            changed()
            return
        child.state = "restarting"
        changed()
        await asyncio.sleep(delay)
        child.env = {**child.env, RESTARTED_ENV: "1"}
        try:
            await start(child)
        except StartFailed as exc:
            log.error("restart of %s failed: %s", child.name, exc)
            continue
        child.restarts += 1
        changed()


async def stop_all(children: list[Child], first: tuple[str, ...] = ()) -> None:
    """Stop every live child: SIGTERM, a bounded wait, then SIGKILL of what is left,
    its descendants included; each child's state becomes "stopped". Those named in
    `first` are stopped so, and gone, before the others are told."""
    ahead = [c for c in children if c.name in first]
    if ahead:
        await _stop_wave(ahead)
    await _stop_wave([c for c in children if c.name not in first])


async def _stop_wave(children: list[Child]) -> None:
    """`stop_all` of `children` at once."""
    # psutil (~2.5 MiB resident) is imported at the stop only: the host waits on its
    # children through asyncio and needs it for nothing else.
    import psutil

    procs = [c.proc for c in children if c.proc and c.proc.returncode is None]
    # Descendants are waited on with psutil; direct children only through asyncio,
    # whose child watcher must be the one to reap them.
    descendants = _descendants([p.pid for p in procs])
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    waits = asyncio.gather(*(proc.wait() for proc in procs))
    try:
        await asyncio.wait_for(asyncio.shield(waits), STOP_GRACE_S)
    except TimeoutError:
        for proc in procs:
            if proc.returncode is None:
                log.warning("pid %d ignored SIGTERM: killing it", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        await waits
    _, alive = await asyncio.to_thread(psutil.wait_procs, descendants, 0.5)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    for c in children:
        c.state = "stopped"


def _descendants(pids: list[int]) -> list[psutil.Process]:
    """All descendants of the processes `pids` (not the processes themselves)."""
    import psutil

    out: list[psutil.Process] = []
    for pid in pids:
        try:
            out += psutil.Process(pid).children(recursive=True)
        except psutil.Error:
            continue
    return out
