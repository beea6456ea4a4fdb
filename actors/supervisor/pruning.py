"""The supervisor's side of retention: when to prune, and carrying a decision out.

`Pruner.prune` asks the store for its overview (in a thread: it reads the whole
store), lets `select_prunable` decide, and removes what was chosen: first from
the supervisor's memory and the broadcaster (the `forget` callback), then from
the store, then it leaves a tombstone. It runs at start, every
`[retention] every`, and on `oploop sessions prune`; `oploop rm` comes through
`remove`. A session running by the time the decision is carried out is spared.

The removed sessions' workspaces are deleted by a short-lived child process
(`python -m actors.supervisor.pruning HOME`, the ids on its stdin): the sandbox
code it needs, its threads and what it allocates never land in the supervisor,
which lives for months (in process, a host pruning a busy store grew ~9 MB over
10,000 sessions).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

from actors.config import Retention
from actors.supervisor.pruned import Tombstones
from actors.supervisor.retention import PrunePolicy, SessionStore, select_prunable

log = logging.getLogger("oploop.retention")


class Pruner:
    """Applies `[retention]` to one store, and remembers what it deleted."""

    def __init__(self, retention: Retention, store: SessionStore, tombstones: Tombstones,
                 running: Callable[[], Collection[str]],
                 forget: Callable[[list[str]], None],
                 drop_files: Callable[[list[str]], Awaitable[None]] | None = None) -> None:
        self.retention = retention
        self.store = store
        self.tombstones = tombstones
        #: The ids of the sessions running now (never pruned).
        self._running = running
        #: Drops sessions from memory and from the broadcaster, before the store deletes them.
        self._forget = forget
        #: Deletes the sessions' files beyond the log (their workspaces): slow (an
        #: unmount each), so it runs as a task of its own; the tasks are owned here.
        self._drop_files = drop_files
        self._dropping: set[asyncio.Future[None]] = set()
        self._lock = asyncio.Lock()
        self.removed = 0

    async def prune(self, older_than_s: float | None = None,
                    keep: int | None = None) -> list[str]:
        """Delete what the policy (with these overrides) selects now; returns the ids."""
        policy = PrunePolicy.configured(self.retention, older_than_s=older_than_s, keep=keep)
        async with self._lock:
            overview = await asyncio.to_thread(self.store.sessions_overview)
            running = set(self._running())
            overview = [dataclasses.replace(s, running=s.running or s.sid in running)
                        for s in overview]
            chosen = select_prunable(overview, policy, time.time())
            # The overview was read in a thread: a follow-up may have started since.
            still_running = set(self._running())
            doomed = [sid for sid in chosen if sid not in still_running]
            self.remove(doomed)
        if doomed:
            log.info("retention: deleted %d session(s)", len(doomed))
        return doomed

    def remove(self, sids: list[str]) -> None:
        """Delete `sids` (which the caller has checked are not running) everywhere."""
        if not sids:
            return
        self._forget(sids)
        self.store.remove(sids)
        self.tombstones.add(sids)
        self.removed += len(sids)
        if self._drop_files is not None:
            dropping = asyncio.ensure_future(self._drop_files(list(sids)))
            self._dropping.add(dropping)
            dropping.add_done_callback(self._dropped)

    def _dropped(self, dropping: asyncio.Future[None]) -> None:
        self._dropping.discard(dropping)
        if not dropping.cancelled() and (exc := dropping.exception()) is not None:
            log.error("retention: a removed session's workspace was not deleted: %s", exc)

    def pruned(self, sid: str) -> bool:
        """Whether `sid` names a session that was deleted."""
        return bool(sid) and sid in self.tombstones

    async def run(self) -> None:
        """Prune now, then every `retention.every_s`, until cancelled."""
        while True:
            try:
                await self.prune()
            except Exception:  # a store error must not stop the supervisor: next round
                log.exception("retention: pruning failed")
            await asyncio.sleep(self.retention.every_s)

    def close(self) -> None:
        """Close the tombstones' database."""
        self.tombstones.close()


#: Bytes of a workspace-removing child's error output kept for the log.
CHILD_ERROR_BYTES = 4096


async def remove_workspaces_apart(home: Path, sids: list[str]) -> None:
    """`remove_workspaces` in a child process; raise RuntimeError if it fails."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", __name__, str(home), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await child.communicate("\n".join(sids).encode())
    if child.returncode != 0:
        reason = err[-CHILD_ERROR_BYTES:].decode(errors="replace").strip()
        raise RuntimeError(f"exit status {child.returncode}: {reason}")


def remove_workspaces(home: Path, sids: list[str]) -> None:
    """Unmount and delete the workspaces (and their quota images) of removed sessions.

    The sandbox's own code does it (`Workspaces.remove`), with the home's
    `[workspaces]` settings: in the child `remove_workspaces_apart` starts.
    """
    from actors.sandbox.policy import SandboxConfig
    from actors.sandbox.workspaces import Workspaces

    spaces = Workspaces(home / "workspaces", SandboxConfig.load(home).workspaces)
    for sid in sids:
        spaces.remove(sid)


def main() -> None:
    """`python -m actors.supervisor.pruning HOME`: remove the workspaces of the session
    ids read from stdin, one a line."""
    sids = [line for line in sys.stdin.read().split() if line]
    remove_workspaces(Path(sys.argv[1]), sids)


if __name__ == "__main__":
    main()
