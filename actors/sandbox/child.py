"""`SandboxedChild`: one launched call, and how its whole tree is killed and waited for.

Below `sandbox.py` and `readers.py`, which both hold children: a kill goes to the
call's cgroup (v2 `cgroup.kill` or v1 freeze-kill-thaw) and to the launcher, whose
pid namespace dies with it; `aclose` waits until the cgroup is empty.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.tools.piped import PipedProcess

from .cgroups import CallCgroup
from .forkserver import ServedProcess

log = logging.getLogger("oploop.sandbox")

_GONE_S = 2.0  # bound on waiting for a killed tree to leave its cgroup


@dataclass(slots=True)
class SandboxedChild:
    """A launched sandbox: the launcher process, its cgroup, and its error pipe."""

    process: PipedProcess | ServedProcess
    cgroup: CallCgroup | None
    errfd: int
    on_close: Callable[[SandboxedChild], None] | None = None
    killed: bool = field(default=False)
    #: The command's stderr apart from its stdout (a shell call), and its pipe's
    #: transport, closed with the child.
    stderr: asyncio.StreamReader | None = None
    stderr_pipe: asyncio.BaseTransport | None = None
    #: The spec it was launched from (`launchspec.build_spec`): a persistent reader's
    #: thread takes the same lockdown (`readthreads.py`).
    spec: dict[str, Any] | None = None

    def kill(self) -> None:
        """Kill the tree: its cgroup at once, and the launcher (the pid namespace follows)."""
        self.killed = True
        if self.cgroup is not None:
            self.cgroup.kill()
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()

    async def aclose(self) -> str:
        """Wait until the cgroup is empty, remove it; return the launcher's refusal ("" if none).

        Safe to call again after a cancellation cut it short: the cgroup steps
        are redone harmlessly, the error pipe is closed (and `on_close` run) once.
        """
        try:
            if self.cgroup is not None and not await remove_when_empty(self.cgroup):
                log.error("sandbox cgroup %s still populated after kill", self.cgroup.dirs[0])
            return _read_all(self.errfd) if self.errfd >= 0 else ""
        finally:
            if self.stderr_pipe is not None:
                self.stderr_pipe.close()
            if self.errfd >= 0:
                with contextlib.suppress(OSError):
                    os.close(self.errfd)
                self.errfd = -1  # never closed twice: the number may be another file's by then
                if self.on_close is not None:
                    self.on_close(self)


async def remove_when_empty(cgroup: CallCgroup) -> bool:
    """Kill what is left in `cgroup` until it is empty (bounded), then remove it;
    False if it stayed populated."""
    emptied = await cgroup.wait_empty(_GONE_S)
    cgroup.remove()
    return emptied


def _read_all(fd: int) -> str:
    os.set_blocking(fd, False)
    chunks = []
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")
