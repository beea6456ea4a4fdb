"""Reader threads: a persistent reader's lockdown, taken over by a thread of the executor.

A persistent reader process (`readers.py`) costs a hop per read: the request
over its socket, the wake-ups of another process, the reply back; on a busy
host 20-25% of the CPU of a turn whose tool is one read (issue 28). Here a
thread of the executor takes the very lockdown the reader process stands in,
then answers the reads itself. Once the process has answered its first read
(its mounts made, every layer held), the thread

- leaves the executor's file system context (`unshare(CLONE_FS)`), joins the
  process's mount namespace (`setns`) and root (`chroot` through
  /proc/PID/root), and goes to its working directory: the same mounts and
  hidden paths, made by the process (which is then retired; the namespace
  lives on with the thread);
- becomes the session's uid and gid with no groups, by raw system calls (glibc's
  `setresuid` changes every thread of the process, as POSIX says; the kernel's
  only the caller): its capabilities go with root;
- sets no_new_privs, Landlock (the spec's rules, looked up in that view) and the
  seccomp filter: each of them holds for the calling thread only, on Linux;
- blocks every signal (the main thread takes them).

What the thread does not have of the process: a pid namespace of its own (a
read starts no process), the process's CPU rlimit (a read is capped in bytes,
and the call's timeout retires the reader) and an address space of its own (it
runs `fileops` only, our code: the model chooses paths and caps, never code).
It reopens a checked file through the host's /proc (opened before the
lockdown), whose `thread-self` is itself: the view's /proc is the sandbox's.

Python's garbage collector may run in any thread that allocates, so an object of
the executor may be finalized in a reader thread, with its lockdown: a cleanup
there that needs more than closing an fd (killing a process, removing a file)
fails. Nothing of the executor's relies on a finalizer for either.

A read the kernel keeps waiting (a hung network file system) cannot be ended in
a thread: the call times out and retires the reader, and the thread leaves when
the read returns; while `MAX_STUCK` such threads wait, readers stay processes.
Threads are used only where the spec holds every layer (a mount namespace, a
uid, Landlock, seccomp) and the executor can take them (root, a known
architecture); anything failing on the way keeps the process reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import ctypes
import os
import queue
import signal
import threading
import time
from typing import Any

from actors import fileops

from . import lockdown
from .mounts import add_readable

CLONE_FS = 0x00000200
#: setgroups, setresuid, setresgid by machine (asm/unistd_64.h, asm-generic/unistd.h).
_SYSCALLS = {"x86_64": (116, 117, 119), "aarch64": (159, 147, 149)}
MAX_STUCK = 8
"""Retired reader threads still inside a read `STUCK_S` after; at this many, readers stay
processes."""
STUCK_S = 1.0
LAG_S = 0.1
"""A reader thread on one request this long is lagging (a slow or hung file system):
it takes no more callers, and the reads queued behind that one are given up (`abandon`:
their callers try a fresh reader). A read takes ~0.05-1 ms; on a busy machine a thread
may wait tens of milliseconds for a core, and each reader started costs ~3 ms."""
WAIT_S = 0.02
"""How long the loop waits for a reader thread's replies to a batch of reads before
awaiting them (`ask`); the longest the loop stalls for one batch. A read (at most
`READ_CAP`, 256 KB) takes ~0.05-1 ms, but on a busy machine the thread may wait
milliseconds for a core: at 2 ms, 100 sessions on 2 cores fell back to awaiting often
enough to cost 15% more CPU a turn (the GIL hand-offs of `ask`)."""
LIST_WAIT_S = 0.002
"""The same for a listing, which has no byte cap: a directory of 60,000 entries takes
~25 ms (8 of them at once held the loop 190 ms with 20 ms here)."""
START_S = 5.0
"""Bound on a thread's lockdown (a few syscalls and Landlock rules: ~1 ms)."""

_REQUIRED = frozenset({"namespaces", "uid", "landlock", "seccomp"})
_PROC_FS = "proc"
_stopped: list[tuple[threading.Thread, float]] = []  # retired threads and when, until gone


class ThreadRefused(Exception):
    """A reader thread cannot be made here (a layer missing, not root, the lockdown failed)."""


def usable(spec: dict[str, Any]) -> str:
    """Why a reader of `spec` cannot become a thread ("" when it can)."""
    if os.uname().machine not in _SYSCALLS:
        return f"no raw uid syscalls known for {os.uname().machine}"
    if os.geteuid() != 0:
        return "the executor is not root (joining a mount namespace needs CAP_SYS_ADMIN)"
    if not int(spec.get("unshare", 0)) & lockdown.CLONE_NEWNS:
        return "no mount namespace"
    if int(spec.get("uid", -1)) < 0 or not spec.get("landlock") or not spec.get("seccomp"):
        return "not every layer (uid, Landlock, seccomp) is in the spec"
    # An optional layer that failed leaves its part of the spec but not of the lockdown
    # (a mount view without its own /proc, say): only required ones are known to hold.
    missing = sorted(_REQUIRED - set(spec.get("required", ())))
    if missing:
        return f"layer(s) {', '.join(missing)} not required by the policy"
    _stopped[:] = [(t, at) for t, at in _stopped if t.is_alive()]
    stuck = sum(1 for _, at in _stopped if time.monotonic() - at > STUCK_S)
    if stuck >= MAX_STUCK:
        return f"{stuck} retired reader threads are still inside a read"
    return ""


class ReaderThread:
    """One thread locked down as a reader process was; it answers the requests queued on
    it one after another (`ask`: a loop turn's reads go over together)."""

    def __init__(self, pidfd: int, pid: int, spec: dict[str, Any],
                 handover: Handover | None = None) -> None:
        spec = copy.deepcopy(spec)
        if spec.get("readable"):
            add_readable(spec)  # as the launcher did: the safe ones go to Landlock
        self._spec = spec
        self._inbox: queue.SimpleQueue[_Job | _Batch | None] = queue.SimpleQueue()
        self._batch: _Batch | None = None  # the reads asked this turn, not handed over yet
        self._handover = handover if handover is not None else Handover()
        self._started = 0.0  # when it began the request it is on (0: none)
        self._given: list[_Batch] = []  # batches given, until found finished
        self._listings: list[_Job] = []  # listings asked, until answered
        self._abandoned = False  # given up (`abandon`): it serves no new read
        self._stopping = False
        self._loop = asyncio.get_running_loop()  # the one that waits for its lockdown
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._fds = _view_fds(pidfd, pid)
        self._thread = threading.Thread(target=self._main, name=f"reader of {pid}",
                                        daemon=True)
        self.tid = 0

    @classmethod
    async def start(cls, pidfd: int, pid: int, spec: dict[str, Any],
                    handover: Handover | None = None) -> ReaderThread:
        """A thread in the lockdown of the reader process `pid` (`pidfd`, launched from
        `spec`), ready to serve; its reads go over with those of the other threads of
        `handover` (None: its own). Raises ThreadRefused (the process goes on serving)."""
        why = usable(spec)
        if why:
            raise ThreadRefused(why)
        try:
            made = cls(pidfd, pid, spec, handover)
        except OSError as exc:
            raise ThreadRefused(f"the reader's view: {exc}") from exc
        try:
            made._thread.start()
        except RuntimeError as exc:  # no thread to be had (the executor's pids limit)
            _close(*made._fds)
            raise ThreadRefused(f"no reader thread: {exc}") from exc
        try:
            async with asyncio.timeout(START_S):
                await asyncio.shield(made._ready)
        except TimeoutError as exc:
            made.stop()  # (it closes its fds when it gets through)
            raise ThreadRefused(f"the reader thread's lockdown took over {START_S} s") from exc
        except BaseException:
            made.stop()
            raise
        return made

    async def ask(self, request: bytes, cap: int) -> bytes:
        """One framed request (`fileops.request`); its reply, at most `cap` bytes (b"" if
        the thread has left). Raises BadReply on a request it cannot read or a reply over
        the cap.

        Reads are handed over in batches (`Handover`): every read asked of any reader
        thread in one turn of the loop goes over together, after the tasks ready now
        have run (a busy executor starts several calls a turn), and the loop waits for
        them itself, up to `WAIT_S`, holding no GIL. A listing, which has no byte cap,
        goes alone and is waited for `LIST_WAIT_S`. What is still going after that (a
        slow file system) is awaited: the loop goes on.
        """
        if self._abandoned or not self._thread.is_alive():
            return b""  # (it left: as a reader process that died, the call tries another)
        job = _Job(request[fileops.REPLY_LEN_DIGITS:])
        loop = asyncio.get_running_loop()  # (each call may come from another)
        if self._batch is not None and self._batch.loop is not loop:
            self._give_batch()  # (asked on a loop that closed before handing it over)
        if job.body[:1] == b"L":
            job.ready = threading.Lock()
            job.ready.acquire()
            self._listings = [j for j in self._listings if j.reply is None]
            self._listings.append(job)
            self._inbox.put(job)
            if not job.ready.acquire(timeout=LIST_WAIT_S):
                await self._awaited(job, loop)
        else:
            job.future = loop.create_future()
            if self._batch is None:
                self._batch = _Batch(loop)
                self._handover.add(self, self._batch, loop)
            self._batch.jobs.append(job)
            await job.future
        return _capped(job.reply, cap)

    def _give_batch(self) -> None:
        """Put the reads asked this turn (if any) in the thread's inbox."""
        batch, self._batch = self._batch, None
        if batch is not None:
            self._given = [b for b in self._given if not b.finished]
            self._given.append(batch)
            self._inbox.put(batch)

    def busy(self) -> bool:
        """Whether reads given to the thread are still unanswered."""
        return any(not b.finished for b in self._given)

    def abandon(self) -> None:
        """Give up the reads queued on the thread behind the one it is on (answered b""
        at once: their callers try a fresh reader); it serves no new read. For a thread
        that is `lagging`: what waits behind a hung read would wait out its timeout, and
        hold an executor slot all that while."""
        self._abandoned = True
        self._give_batch()
        for job in [j for b in self._given for j in b.jobs] + self._listings:
            with job.guard:
                if job.started or job.reply is not None:
                    continue
                job.reply = b""
            if job.future is not None:  # (a listing's: made once its wait ran out)
                with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                    _set(job.future, b"")

    @staticmethod
    async def _awaited(job: _Job, loop: asyncio.AbstractEventLoop) -> None:
        """Await the reply of `job`, whose wait on the loop ran out (if it is not in yet)."""
        with job.guard:
            if job.reply is None:
                job.future = loop.create_future()
                job.loop = loop
        if job.future is not None:
            await job.future

    def stop(self) -> None:
        """Let the thread leave after the requests asked of it (it answers those); it exits
        by itself."""
        self._give_batch()  # (asked this turn: answered first)
        self._inbox.put(None)
        if self._thread.is_alive() and not self._stopping:  # (counted once: `usable`)
            _stopped.append((self._thread, time.monotonic()))
        self._stopping = True

    def lagging(self) -> bool:
        """Whether it has been on one request over `LAG_S` (a slow or hung file system):
        no new read should queue behind it."""
        started = self._started
        return started > 0 and time.monotonic() - started > LAG_S

    def give_up_if_lagging(self) -> None:
        """`abandon` the reads queued on the thread if it is `lagging` (a timer's look)."""
        if self.lagging() and not self._abandoned:
            self.abandon()

    @property
    def alive(self) -> bool:
        """Whether the thread has not left yet."""
        return self._thread.is_alive()

    def join(self, timeout_s: float) -> bool:
        """Wait (bounded) until the thread has left; whether it has."""
        if self._thread.ident is not None:
            self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # -- in the thread -----------------------------------------------------------------------

    def _main(self) -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
        self.tid = threading.get_native_id()
        ns, root, proc = self._fds
        try:
            _lock_thread(self._spec, ns, root, proc)
        except BaseException as exc:  # noqa: BLE001 -- any failure: no serving
            _settle(self._loop, self._ready, ThreadRefused(f"reader thread lockdown: {exc}"))
            _close(ns, root, proc)
            return
        _close(ns, root)
        _settle(self._loop, self._ready, None)
        try:
            self._serve(proc)
        finally:
            os.close(proc)

    def _serve(self, proc: int) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                return
            if isinstance(item, _Batch):
                for job in item.jobs:
                    self._take_on(job, proc)
                item.finished = True
                item.done.release()
            else:
                self._take_on(item, proc)
                assert item.ready is not None
                item.ready.release()

    def _take_on(self, job: _Job, proc: int) -> None:
        """Answer `job` unless the loop gave it up meanwhile (`abandon`)."""
        with job.guard:
            given_up = job.reply is not None
            job.started = True
        if not given_up:
            self._answer(job, proc)

    def _answer(self, job: _Job, proc: int) -> None:
        """Answer `job`: its reply set, and its future settled if the loop awaits it."""
        self._started = time.monotonic()
        try:
            reply: bytes | BaseException = fileops.answer(job.body, proc) or (
                fileops.BadReply(f"reader thread: unreadable request {job.body[:40]!r}"))
        except Exception as exc:  # noqa: BLE001 -- the caller's error, not the thread's end
            reply = fileops.BadReply(f"reader thread: {exc!r}")
        self._started = 0.0
        with job.guard:
            job.reply = reply
            if job.loop is not None:
                assert job.future is not None
                _settle(job.loop, job.future, reply)


class Handover:
    """The reads asked of a set of reader threads (a pool's) in one turn of the loop,
    handed over together once the tasks ready then have run.

    A hand-off costs more CPU than a read: the thread's wake-up, the GIL passed over
    and back. Per read, it made a busy executor's turn ~25% dearer (issue 28). Here
    every thread asked this turn gets its batch at once, and the loop waits for all of
    them in one go, up to `WAIT_S` in all, holding no GIL: threads of sessions in
    different workspaces answer side by side. What is not in by then, each thread
    settles when it is (`_answer`)."""

    def __init__(self) -> None:
        self._batches: list[tuple[ReaderThread, _Batch]] = []  # asked this turn, in order
        self._on: asyncio.AbstractEventLoop | None = None  # where the hand-over waits

    def add(self, thread: ReaderThread, batch: _Batch, loop: asyncio.AbstractEventLoop
            ) -> None:
        """`thread` has reads this turn (`batch`): hand them over with the rest."""
        self._batches.append((thread, batch))
        if self._on is not loop:  # (first this turn; or a new loop, the old one gone)
            self._on = loop
            loop.call_soon(self._hand_over, loop)

    def _hand_over(self, loop: asyncio.AbstractEventLoop) -> None:
        batches, self._batches, self._on = self._batches, [], None
        # A thread still on reads given before (the wait for them ran out: it is slow or
        # hung) is not waited for again: that would stall the loop every turn.
        waits = [not thread.busy() for thread, _ in batches]
        for thread, batch in batches:
            if thread._batch is batch:  # (else given already: the thread was stopped)
                thread._give_batch()
        deadline = time.monotonic() + WAIT_S
        for (_, batch), wait in zip(batches, waits, strict=True):
            done = wait and batch.done.acquire(timeout=max(0.0, deadline - time.monotonic()))
            batch.settle(done, loop)
        for thread, batch in batches:
            if not batch.finished:  # (what it is on may be hung: look again at `LAG_S`)
                loop.call_later(LAG_S, thread.give_up_if_lagging)


class _Job:
    """One request to a reader thread, and where its reply goes: `reply`, and `future`
    (awaited by the caller). The thread settles the future itself only once `loop` is
    set: the loop stopped waiting for it."""

    __slots__ = ("body", "reply", "ready", "guard", "future", "loop", "started")

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.started = False  # the thread is on it (`abandon` gives up only the others)
        self.reply: bytes | BaseException | None = None
        self.ready: threading.Lock | None = None  # a listing's, released with its reply
        self.guard = threading.Lock()  # the reply and the loop, set by either side
        self.future: asyncio.Future[Any] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None


class _Batch:
    """The reads asked of a reader thread in one turn of the loop: `done` is released
    when all of them have their reply."""

    __slots__ = ("jobs", "done", "loop", "finished")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.jobs: list[_Job] = []
        self.done = threading.Lock()
        self.done.acquire()
        self.loop = loop  # where its callers wait
        self.finished = False  # every job answered or given up (set with `done`)

    def settle(self, done: bool, loop: asyncio.AbstractEventLoop) -> None:
        """Give each caller its reply (all are in if `done`); one still out, its thread
        settles on `loop` when it is in."""
        for job in self.jobs:
            if not done:
                with job.guard:
                    if job.reply is None:
                        job.loop = loop
                        continue
            assert job.future is not None and job.reply is not None
            with contextlib.suppress(RuntimeError):  # its loop closed: nobody waits
                _set(job.future, job.reply)


def _capped(reply: bytes | BaseException | None, cap: int) -> bytes:
    """A reply as the caller gets it: raised if an error, refused over `cap` bytes."""
    if isinstance(reply, BaseException):
        raise reply
    assert reply is not None
    if len(reply) > cap:
        raise fileops.BadReply(f"reader thread: a {len(reply)}-byte reply (cap {cap})")
    return reply


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any],
            outcome: object) -> None:
    """Set `future` to `outcome` (a result, or an exception to raise) on its loop."""
    with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
        loop.call_soon_threadsafe(_set, future, outcome)


def _set(future: asyncio.Future[Any], outcome: object) -> None:
    if future.done():  # cancelled meanwhile (the reader is retired)
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _view_fds(pidfd: int, pid: int) -> tuple[int, int, int]:
    """(its mount namespace, its root, the host's /proc) of the reader process `pid`,
    opened in the executor, checked to be that process's still through `pidfd` (taken
    when it was started: while it lives, or waits to be reaped, no other gets its pid)."""
    pidfd = os.dup(pidfd)
    fds: list[int] = []
    try:
        fds.append(os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC))
        fds.append(os.open(f"/proc/{pid}/root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        fds.append(os.open("/proc", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
        if os.stat(fds[0]).st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            raise OSError(0, "the reader shares the executor's mount namespace")
        signal.pidfd_send_signal(pidfd, 0)  # raises ProcessLookupError once it has exited
    except BaseException:
        _close(*fds)
        raise
    finally:
        os.close(pidfd)
    return fds[0], fds[1], fds[2]


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def _lock_thread(spec: dict[str, Any], ns: int, root: int, proc: int) -> None:
    """The calling thread's lockdown, as the reader process's (`launcher._tool`)."""
    libc = lockdown._libc
    lockdown._check(libc.unshare(CLONE_FS), "unshare(CLONE_FS)")
    lockdown._check(libc.setns(ns, lockdown.CLONE_NEWNS), "setns")
    os.fchdir(root)
    os.chroot(".")
    os.chdir(spec["cwd"])
    _check_view(proc)
    _drop_uid(spec["uid"], spec["gid"])
    lockdown._prctl(lockdown.PR_SET_NO_NEW_PRIVS, 1)
    ll = spec["landlock"]
    lockdown.apply_landlock(ll["ro"], ll["rw"], ll["deny_tcp"], True,
                            ll.get("tcp_connect", ()), ll.get("ls", ()))
    lockdown.apply_seccomp(spec["seccomp"])


def _check_view(proc: int) -> None:
    """Refuse a view with a /proc that shows the executor: the process's own /proc is of
    its pid namespace, where this thread is nobody; any other (the host's, a container's
    /proc bound in a kept path) would give a path the executor's `/proc/self/root` (its
    whole file system, beneath the view's hidden paths), `environ` and fds, which the
    kernel lets any thread of a process read. So: no /proc/self here, and no procfs
    mounted anywhere but at /proc (the view's mount table, read through the host's /proc:
    this thread's `thread-self/mountinfo`)."""
    try:
        os.stat("/proc/self")
    except OSError:
        pass
    else:
        raise OSError(0, "the view's /proc shows the executor's processes")
    fd = os.open("thread-self/mountinfo", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    for line in b"".join(chunks).decode("utf-8", "surrogateescape").splitlines():
        fields, _, rest = line.partition(" - ")
        where = fields.split(" ")[4] if len(fields.split(" ")) > 4 else ""
        if rest.split(" ", 1)[0] == _PROC_FS and where != "/proc":
            raise OSError(0, f"a procfs is mounted in the view at {where}")


def _drop_uid(uid: int, gid: int) -> None:
    """`lockdown.drop_uid` for the calling thread alone: the same steps, with the
    kernel's own setgroups/setresgid/setresuid instead of glibc's process-wide ones."""
    setgroups, setresuid, setresgid = _SYSCALLS[os.uname().machine]
    libc = lockdown._libc
    if uid == 0:
        lockdown._prctl(lockdown.PR_SET_SECUREBITS, lockdown._SECBITS_LOCKED_NOROOT)
        lockdown._prctl(lockdown.PR_CAP_AMBIENT, lockdown.PR_CAP_AMBIENT_CLEAR_ALL)
        for cap in range(64):
            if libc.prctl(lockdown.PR_CAPBSET_DROP, ctypes.c_ulong(cap), 0, 0, 0) < 0:
                break
    lockdown._check(libc.syscall(setgroups, 0, None), "setgroups")
    lockdown._check(libc.syscall(setresgid, gid, gid, gid), "setresgid")
    lockdown._check(libc.syscall(setresuid, uid, uid, uid), "setresuid")
    if uid == 0:
        lockdown._capset_none()
