"""Persistent readers: one locked-down reader process serves many reads of one session.

A confined `read_file` or `list_dir` used to start a launcher per call (a fork,
the namespaces, the mount view, Landlock, seccomp: ~3 ms), for a read of ~0.1 ms.
A `Reader` is the same launcher, locked down the same way (`Sandbox.launch` with
the op "serve": the session's uid, mount and pid namespaces, Landlock read-only
on what the agent may read, seccomp without sockets, no_new_privs), that then
answers requests on a socketpair (`fileops.run_server`) instead of exiting.

The pool keys each reader by everything its lockdown was made of: the tool and
its policy, the session's workspace (a session's own path: two sessions never
share one), what else it may read, its uid, and the identity (device, inode) of
each of those paths: a workspace mounted, removed or remade later gets a new
reader. A reader is retired (killed) when

- a call on it fails in any way (timeout, cancel, a bad or missing reply): the
  next call gets a fresh one;
- it has been idle `idle_s` (`crowded_idle_s` when `WARM` readers idle more recently
  than it), served `max_calls` calls (a process: its RLIMIT_CPU counts all its calls
  together), or lived `max_age_s`;
- its session's workspace is removed (`drop`) or changes under it (the sweep,
  every `sweep_s` while readers idle);
- the sandbox closes.

Readers with a cgroup of their own are never pooled (a cgroup needs an async
release): their policy's reads start a launcher per call as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import select
import socket
import time
from collections.abc import Awaitable, Callable

from actors import fileops
from actors.tools.process import ToolRefused, release

from .child import SandboxedChild
from .reader import Key, Reader, identity
from .readthreads import Handover, ReaderThread, ThreadRefused

log = logging.getLogger("oploop.sandbox")

IDLE_S = 2.0
"""An idle reader is retired after this long. Reuse pays where reads come quickly (a
turn's several reads, a fast model's turns: ~3 ms saved each); a model that thinks
for seconds between reads gets a fresh reader, as cheap as a one-off launcher, and
holds no process meanwhile."""
MAX_CALLS = 500
MAX_AGE_S = 120.0
MAX_IDLE_PER_KEY = 32
"""Parallel reads of one key each take a reader; this many wait idle afterwards. A key
is a whole lockdown, often shared: sessions of one agent in one directory read through
the same readers. With 2, a host serving 100 such sessions retired nearly every reader
it had just started (one read in three forked a launcher); `MAX_IDLE` bounds them all."""
MAX_IDLE = 32
"""All sessions together (per executor): the least recently used reader is retired
beyond this. As many as an executor runs calls at once (`executor.SLOTS`): with 8, a
host serving 100 sessions (their calls sent back to the same executor, `dispatch`)
started a launcher for nearly every read. Each holds ~2 MB of its own (PSS; ~9 MB RSS,
most shared with the fork server): under ~70 MB per busy executor, none once idle
(`IDLE_S`)."""
WARM = 4
"""Idle readers (the most recently used) kept the whole `IDLE_S`; the others retire after
`CROWDED_IDLE_S`. A burst of sessions left up to `MAX_IDLE` readers idle for 2 s, ~9 MB
RSS each (issue 28: 286 KB per idle session at 1,000 sessions); a session that goes on
reads again within a turn, well inside `CROWDED_IDLE_S`."""
CROWDED_IDLE_S = 0.5
SWEEP_S = 0.5
_GONE_S = 2.0  # bound on waiting for retired readers to exit, when the sandbox closes
#: The loop time (`loop.time()`) at which a bound around the whole call ends it (the
#: executor's job timeout, set in the job's own task), or None. A read whose own timeout
#: would end no sooner takes no timer of its own: that bound, started first, ends it
#: first, and cancelling it retires its reader just the same. One timer less per read.
BOUND_AT: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "oploop_reader_bound_at", default=None)
_UNBOUNDED = contextlib.nullcontext()
#: Asked of a fresh reader before its thread takes over: any reply says it serves (a
#: read of its working directory: "is a directory", after an open and an fstat).
_PROBE = fileops.request(b"R", ".", 0)
_PROBE_CAP = 3 * 4096  # the longest reply it may give: a path's hex and a head


class ReaderPool:
    """The idle readers of one sandbox, by key. A reader process in use is its caller's
    alone; a reader thread stays idle while in use, and queues the calls of every caller
    of its key (`_take`)."""

    def __init__(self) -> None:
        self.idle_s = IDLE_S
        self.crowded_idle_s = CROWDED_IDLE_S
        self.max_calls = MAX_CALLS
        self.max_age_s = MAX_AGE_S
        self.sweep_s = SWEEP_S
        self._idle: dict[Key, list[Reader]] = {}
        self._busy: set[Reader] = set()
        self._doomed: set[Reader] = set()  # busy readers to retire when given back
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None
        self._retired: list[int] = []  # pidfds of retired readers not yet seen gone
        #: Whether a fresh reader's calls go to a thread in its lockdown (`readthreads.py`).
        #: (As the policy's `reader` says; False: processes whatever it says.)
        self.threads = True
        self._threads: list[ReaderThread] = []  # every reader thread made, until it left
        self._handover = Handover()  # their reads of one loop turn go over together
        self._refused = ""  # why the last reader stayed a process
        #: Keys whose first reader is starting, done once its thread is made or the start
        #: is over: a burst of first reads (one reply's parallel calls) waits for that
        #: reader's thread instead of starting one each (`_started`).
        self._starting: dict[Key, asyncio.Future[None]] = {}

    # -- taking and giving back ------------------------------------------------------------

    async def read(self, key: Key, paths: tuple[str, ...],
                   launch: Callable[[int], Awaitable[SandboxedChild]],
                   request: bytes, cap: int, timeout_s: float, threads: bool = True) -> bytes:
        """One request on a reader of `key` (`launch(socket_fd)` starts a new one); its
        reply. The whole call, a reader's start included, is bounded by `timeout_s` (by
        its own timer, or by the enclosing bound `BOUND_AT` when that ends it no later).
        `threads`: a fresh reader's calls go to a thread in its lockdown (the policy's
        `reader`), where this executor can make one.

        Raises ToolRefused when a fresh reader was refused by a layer, OSError when
        it died without a reply, BadReply on nonsense.
        """

        async def start() -> Reader:
            ours, theirs = socket.socketpair()
            try:
                child = await launch(theirs.fileno())
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            ours.setblocking(False)
            return Reader(key, paths, child, ours)

        bound_at = BOUND_AT.get()
        scope = (_UNBOUNDED if bound_at is not None
                 and bound_at <= asyncio.get_running_loop().time() + timeout_s
                 else asyncio.timeout(timeout_s))
        async with scope:
            reply, failed = await self.call(key, start, request, cap, threads)
            if failed is None:
                return reply
            # A fresh reader that answered nothing: refused by a layer, or it died.
            failed.close_socket()
            failed.child.kill()
            refused = await release(failed.child)
        if refused:
            raise ToolRefused(f"refused by the sandbox: {refused}")
        raise OSError(0, f"the sandboxed reader exited with status "
                         f"{failed.child.process.returncode}")

    async def call(self, key: Key, start: Callable[[], Awaitable[Reader]],
                   request: bytes, cap: int, threads: bool = True
                   ) -> tuple[bytes, Reader | None]:
        """Run one request on an idle reader of `key`, or on a fresh one from `start`.

        (reply, None) when it was answered (the reader goes back to the pool);
        (b"", reader) when the reader gave no reply: the caller reads its refusal
        and releases it (it is retired). A reused reader that gives no reply (it
        died while idle) is retired and the request retried once on a fresh one.
        Any failure or cancellation meanwhile retires the reader.
        """
        reader = await self._started(key, threads)
        if reader is not None:
            reply = await self._ask(reader, request, cap)
            if reply:
                return reply, None
            self._retire(reader)
        starting = None
        if threads and self.threads and not self._refused:
            starting = self._starting[key] = asyncio.get_running_loop().create_future()
        try:
            return await self._call_fresh(await start(), request, cap, threads, starting)
        finally:
            if starting is not None:
                self._started_over(key, starting)

    def _started_over(self, key: Key, starting: asyncio.Future[None]) -> None:
        """The start `starting` announced is over (its thread made, or it failed): let
        its waiters go, and the next caller of `key` take what is idle or start anew."""
        if not starting.done():
            starting.set_result(None)
        if self._starting.get(key) is starting:
            del self._starting[key]

    async def _started(self, key: Key, threads: bool) -> Reader | None:
        """An idle reader of `key`, once the start of one under way has made its thread
        (threads only: one serves every caller of its key); None: start one. Only one
        start is waited for: after a failed one each caller starts its own, at once."""
        reader = self._take(key)
        if reader is not None or not (threads and self.threads):
            return reader
        starting = self._starting.get(key)
        # (A start over: never awaited again, which would not yield, a loop spinning.)
        if starting is None or starting.done() or starting.get_loop() is not \
                asyncio.get_running_loop():
            return None
        await asyncio.shield(starting)  # (its failure is the starter's to report)
        return self._take(key)

    async def _call_fresh(self, reader: Reader, request: bytes, cap: int, threads: bool,
                          starting: asyncio.Future[None] | None
                          ) -> tuple[bytes, Reader | None]:
        """`call` on a reader just started, made a thread's where it may be; the calls
        that wait for it (`starting`) are let go once its thread takes calls."""
        self._busy.add(reader)
        if threads and self.threads:
            # A first reply shows every layer held and the view made: the thread may take
            # it over, and answers every call, the first one included.
            try:
                ready = await reader.ask(_PROBE, _PROBE_CAP)
                reader.calls = 0  # (the calls it served: the probe is none)
                if ready:
                    await self._to_thread(reader)
            except BaseException:
                self._retire(reader)
                raise
            if not ready:
                return self._failed(reader)
            if reader.thread is not None and starting is not None:
                self._give(reader)  # (idle while in use, as a thread is: `_take`)
                self._started_over(reader.key, starting)
        reply = await self._ask(reader, request, cap)
        if reply:
            return reply, None
        if reader.thread is not None:  # (its thread left at once: not a refusal to read)
            self._retire(reader)
            raise OSError(0, "the reader thread left before its first reply")
        return self._failed(reader)

    def _failed(self, reader: Reader) -> tuple[bytes, Reader]:
        self._busy.discard(reader)
        self._doomed.discard(reader)
        return b"", reader

    async def _ask(self, reader: Reader, request: bytes, cap: int) -> bytes:
        try:
            reply = await reader.ask(request, cap)
        except BaseException:
            self._retire(reader)
            raise
        if reply:
            self._give(reader)
        return reply

    async def _to_thread(self, reader: Reader) -> None:
        """Hand a fresh reader's calls to a thread in its lockdown, and retire its process
        (`readthreads.py`); where that cannot be, its process goes on serving."""
        spec = reader.child.spec
        if spec is None:
            return
        proc = reader.child.process
        own = getattr(proc, "_pidfd", -1)  # (a served process's, held since its start)
        try:
            if own < 0:
                raise ThreadRefused("no pidfd held for the reader process")
            reader.thread = await ReaderThread.start(own, proc.pid, spec, self._handover)
        except ThreadRefused as exc:
            if str(exc) != self._refused:  # once per reason, not per reader
                self._refused = str(exc)
                log.info("persistent readers stay processes: %s", exc)
            return
        self._threads.append(reader.thread)
        self._refused = ""  # (a refusal that passed: bursts share a start again)
        pidfd = reader.retire_process()
        if pidfd >= 0:
            self._retired.append(pidfd)

    def _take(self, key: Key) -> Reader | None:
        # (The key holds the paths' identity as of now: a changed path finds no reader.)
        idle = self._idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        # A reader thread queues its calls: one serves every caller of its key at once
        # (`ReaderThread.ask` hands a loop turn's reads over together), and stays idle
        # meanwhile. The most recently used, unless it is stuck in a read; the rest
        # retire (`crowded_idle_s`).
        for reader in reversed(idle):
            if reader.thread is not None and not reader.thread.lagging():
                if not self._expired(reader, now):
                    return reader
                self._remove_idle(reader)  # (no timer ran: another event loop)
                self._retire(reader)
                return self._take(key)
        # A process, the least recently used: under steady load every idle reader is
        # then used again within a sweep, so none retires only to be started again at
        # the next peak (taking the most recent one left the rest idle past
        # `crowded_idle_s`: ~5% of a busy host's reads started a reader, ~0.3 ms of CPU
        # per turn).
        reader = next((r for r in idle if r.thread is None), None)
        if reader is None:
            return None  # (threads only, each stuck in a read: a fresh reader it is)
        self._remove_idle(reader)
        if self._expired(reader, now):  # no timer ran (another event loop)
            self._retire(reader)
            return None
        self._busy.add(reader)
        return reader

    def _expired(self, reader: Reader, now: float, idle_s: float | None = None) -> bool:
        idle_s = self.idle_s if idle_s is None else idle_s
        return now - reader.used >= idle_s or now - reader.born >= self.max_age_s

    def _give(self, reader: Reader) -> None:
        self._busy.discard(reader)
        if reader.gone:
            return  # retired while its call was under way (a shared thread's, say)
        now = time.monotonic()
        reader.used = now
        shared = reader.thread is not None and reader in self._idle.get(reader.key, ())
        # (`max_calls` bounds what a process's RLIMIT_CPU counts together; a thread has
        # none, and one serves a whole key: at 500, a busy host restarted it every 0.3 s.)
        spent = reader.thread is None and reader.calls >= self.max_calls
        if reader in self._doomed or spent or now - reader.born >= self.max_age_s:
            self._retire(reader)  # (a thread answers the calls queued on it first)
            return
        if shared:
            self._arm()  # (idle all along, `_take`; the sweep may be on another loop)
            return
        idle = self._idle.setdefault(reader.key, [])
        idle.append(reader)
        if len(idle) > MAX_IDLE_PER_KEY:
            self._retire(idle.pop(0))
        while self.idle_count() > MAX_IDLE:
            oldest = min((r for rs in self._idle.values() for r in rs), key=lambda r: r.used)
            self._remove_idle(oldest)
            self._retire(oldest)
        self._arm()

    # -- retiring --------------------------------------------------------------------------

    def _retire(self, reader: Reader) -> None:
        self._busy.discard(reader)
        if reader.thread is not None:  # (it may be idle and in use at once: `_take`)
            self._remove_idle(reader)
        self._doomed.discard(reader)
        pidfd = reader.retire()
        if pidfd >= 0:
            self._retired.append(pidfd)

    def _remove_idle(self, reader: Reader) -> None:
        idle = self._idle.get(reader.key, [])
        if reader in idle:
            idle.remove(reader)
        if not idle:
            self._idle.pop(reader.key, None)

    def drop(self, where: str) -> int:
        """Retire every reader whose key holds the path `where` (a session's workspace,
        being removed); a busy one when its call ends. How many."""
        count = 0
        for reader in [r for rs in self._idle.values() for r in rs]:
            if where in reader.paths:
                self._remove_idle(reader)
                self._retire(reader)
                count += 1
        for reader in self._busy:
            if where in reader.paths:
                self._doomed.add(reader)
                count += 1
        return count

    def sweep(self) -> int:
        """Retire idle readers past their time, or whose paths changed; how many."""
        now = time.monotonic()
        idle = sorted((r for rs in self._idle.values() for r in rs), key=lambda r: r.used,
                      reverse=True)
        gone = [r for i, r in enumerate(idle)
                if self._expired(r, now, self.idle_s if i < WARM else self.crowded_idle_s)
                or identity(r.paths) != r.key[-1]]
        for reader in gone:
            self._remove_idle(reader)
            self._retire(reader)
        self._retired = _still_running(self._retired, 0.0)
        self._threads = [t for t in self._threads if t.alive]
        return len(gone)

    def _arm(self) -> None:
        """Sweep again in `sweep_s` on the running loop while readers idle (a loop closed
        meanwhile, as in a test's `asyncio.run`, just drops the timer)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._timer is not None:
            if self._timer_loop is loop and not self._timer.cancelled():
                return  # armed already on this loop
            self._timer.cancel()
        self._timer = loop.call_later(self.sweep_s, self._tick)
        self._timer_loop = loop

    def _tick(self) -> None:
        self._timer = None
        self.sweep()
        if self._idle:
            self._arm()

    def close(self) -> None:
        """Retire every reader, and wait (bounded) until they have exited: their mount
        namespaces hold the workspaces' file systems until then."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for reader in [r for rs in self._idle.values() for r in rs] + list(self._busy):
            self._remove_idle(reader)
            self._retire(reader)
        left = _still_running(self._retired, _GONE_S)
        for fd in left:
            os.close(fd)
        self._retired = []
        # A thread holds its view's mount namespace (and so the workspace's file system)
        # as a process does: wait for them too, as long (one inside a hung read stays).
        deadline = time.monotonic() + _GONE_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads = []

    # -- looking -----------------------------------------------------------------------------

    def idle_count(self) -> int:
        """Idle readers, all keys together."""
        return sum(len(rs) for rs in self._idle.values())

    def readers(self) -> list[Reader]:
        """Every reader held now, idle or busy."""
        return [r for rs in self._idle.values() for r in rs] + list(self._busy)


def _still_running(pidfds: list[int], bound_s: float) -> list[int]:
    """The pidfds whose process has not exited within `bound_s` (the others closed).
    An exited process's namespaces are gone, even before its parent reaps it."""
    deadline = time.monotonic() + bound_s
    left = []
    for fd in pidfds:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if ready:
            os.close(fd)
        else:
            left.append(fd)
    return left
