"""Adversarial: the persistent readers of read_file and list_dir (`actors/sandbox/readers.py`).

A reader serves many calls of one session. These cases check that it is never
used for another session, that it dies with its session (removed, idle, its
workspace changed, killed), and that a hostile sequence of reads is refused
alike by a fresh reader and by one that has served calls before.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import select
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sbhelp import BOUND_S, Host, need
from test_escape_read import READ_POLICY, call, still_reads, tools

from actors.sandbox import Sandbox
from actors.sandbox.reader import Reader
from actors.sandbox.readers import WARM, ReaderPool
from actors.sandbox.workspaces import Workspaces
from actors.tools import Catalogue, ToolContext, invoke


@pytest.fixture(params=["thread", "process"])
def rhost(host: Host, request: pytest.FixtureRequest) -> Iterator[Host]:
    """The sandbox suite's host, once: reads always run in the launcher. Each case runs
    with the readers' calls served by threads (`readthreads.py`, the default) and by
    the reader processes themselves."""
    if host.backend != "launcher":
        pytest.skip("reads always run in the launcher: one backend is enough")
    # Reuse is what these cases check: no reader may expire between calls on a slow
    # machine (the idle case sets its own).
    readers = host.sandbox.readers
    readers.close()  # (none of the other kind's left)
    readers.idle_s = readers.crowded_idle_s = readers.max_age_s = 3600.0
    readers.threads = request.param == "thread"
    yield host
    readers.threads = True


def threaded(host: Host) -> bool:
    """Whether this case's readers serve through threads."""
    return host.sandbox.readers.threads


def wait_left(reader: Reader) -> None:
    """Wait (bounded) until a retired reader has gone: its process exited, its thread left."""
    if reader.thread is not None:
        assert reader.thread.join(BOUND_S), f"reader thread {reader.pid} still there"
    else:
        wait_gone(reader.pid)


def readers_of(sandbox: Sandbox, workspace: Path) -> list[Reader]:
    """The readers the sandbox holds for the session whose workspace is `workspace`."""
    return [r for r in sandbox.readers.readers() if r.paths[0] == str(workspace)]


def only_reader(sandbox: Sandbox, workspace: Path) -> Reader:
    """The one reader of that session (a test that reads one call at a time has one)."""
    found = readers_of(sandbox, workspace)
    assert len(found) == 1, found
    return found[0]


def read_box(host: Host) -> tuple[Catalogue, ToolContext[None]]:
    """The read tools of the host's sandbox, and a context in its workspace."""
    ctx: ToolContext[None] = ToolContext(cwd=host.workspace, workspace=host.workspace)
    return tools(host.sandbox, READ_POLICY), ctx


async def reads(box: Catalogue, ctx: ToolContext[None], parallel: int) -> None:
    """`parallel` reads of /etc/hostname at once, each of which must succeed."""
    outs = await asyncio.gather(*(invoke(box, "read_file", {"path": "/etc/hostname"}, ctx)
                                  for _ in range(parallel)))
    assert not any(out.is_error for out in outs), outs


def proc_uid(pid: int) -> int:
    """The real uid of a process, from its /proc status."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie counts: its namespaces are released)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[-1].split()[0]
    except OSError:
        return True
    return state in (b"Z", b"X")


def wait_gone(pid: int) -> None:
    """Wait (bounded) until `pid` has exited: through a pidfd, no polling by sleep."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        ready, _, _ = select.select([fd], [], [], BOUND_S)
        assert ready, f"reader {pid} still running after {BOUND_S} s"
    finally:
        os.close(fd)


def test_a_reader_is_reused_and_never_shared_between_sessions(rhost: Host) -> None:
    sandbox = rhost.sandbox
    other = sandbox.workspace("s2")
    token = secrets.token_hex(8)
    (rhost.workspace / "mine.txt").write_text(token)
    os.chmod(rhost.workspace / "mine.txt", 0o644)  # only the sandbox keeps s2 out of it
    out, is_error = call(rhost, "read_file", "mine.txt")
    assert not is_error and token in out, out
    first = only_reader(sandbox, rhost.workspace)
    call(rhost, "list_dir", ".")
    assert only_reader(sandbox, rhost.workspace) is first and first.calls == 2  # reused
    # The other session gets a reader of its own, which never sees the first's files.
    out, is_error = call(rhost, "read_file", "/etc/hostname", workspace=other)
    theirs = only_reader(sandbox, other)
    assert theirs.pid != first.pid
    for _ in range(2):  # on its fresh reader, then on the same one reused
        out, is_error = call(rhost, "read_file", str(rhost.workspace / "mine.txt"),
                             workspace=other)
        assert is_error and token not in out, out
        out, is_error = call(rhost, "list_dir", str(rhost.workspace), workspace=other)
        assert is_error and "mine.txt" not in out, out
    assert only_reader(sandbox, other) is theirs and theirs.calls == 5
    if not sandbox.layers.get("uid"):
        assert proc_uid(first.pid) == rhost.workspace.stat().st_uid
        assert proc_uid(theirs.pid) == other.stat().st_uid != rhost.workspace.stat().st_uid
    still_reads(rhost)


def test_parallel_reads_of_one_key_leave_their_readers_idle_for_the_next_ones(
        rhost: Host) -> None:
    """Sessions of one agent in one directory share a key: their parallel reads each take
    a reader process, and all of them wait idle for the next round (issue 28: 2 per key
    did, so 100 such sessions forked a launcher for one read in three)."""
    if threaded(rhost):
        pytest.skip("a reader thread serves every caller of its key (the case below)")
    sandbox = rhost.sandbox
    ctx: ToolContext[None] = ToolContext(cwd=rhost.workspace, workspace=rhost.workspace)
    box = tools(sandbox, READ_POLICY)
    parallel = 6

    async def round_of_reads() -> None:
        outs = await asyncio.gather(*(invoke(box, "read_file", {"path": "/etc/hostname"}, ctx)
                                      for _ in range(parallel)))
        assert not any(out.is_error for out in outs), outs

    asyncio.run(round_of_reads())
    first = {r.pid for r in readers_of(sandbox, rhost.workspace)}
    assert len(first) > 2 and sandbox.readers.idle_count() == len(first)
    asyncio.run(round_of_reads())
    assert {r.pid for r in readers_of(sandbox, rhost.workspace)} == first  # none started


def test_a_reader_dies_with_its_session(rhost: Host) -> None:
    sandbox = rhost.sandbox
    # Removed by this executor: retired at once.
    other = sandbox.workspace("s2")
    call(rhost, "read_file", "/etc/hostname", workspace=other)
    reader = only_reader(sandbox, other)
    assert (reader.thread is not None) == threaded(rhost)
    sandbox.remove_workspace("s2")
    wait_left(reader)
    assert not readers_of(sandbox, other)
    # Removed by another process (the supervisor prunes a session): the sweep sees the
    # workspace gone and retires its reader.
    third = sandbox.workspace("s3")

    async def pruned() -> None:
        ctx: ToolContext[None] = ToolContext(cwd=third, workspace=third)
        out = await invoke(tools(sandbox), "read_file", {"path": "/etc/hostname"}, ctx)
        assert not out.is_error, out.output
        reader = only_reader(sandbox, third)
        Workspaces(sandbox.workspaces, sandbox.config.workspaces).remove("s3")
        deadline = time.monotonic() + BOUND_S
        while not gone(reader.pid):  # the pool's own timer sweeps every second
            assert time.monotonic() < deadline, "the reader outlived its workspace"
            await asyncio.sleep(0.05)
        assert not readers_of(sandbox, third)

    asyncio.run(pruned())
    still_reads(rhost)


def test_an_idle_reader_is_retired(rhost: Host) -> None:
    sandbox = rhost.sandbox
    sandbox.readers.idle_s = sandbox.readers.sweep_s = 0.05

    async def idle() -> None:
        ctx: ToolContext[None] = ToolContext(cwd=rhost.workspace, workspace=rhost.workspace)
        out = await invoke(tools(sandbox), "list_dir", {"path": "."}, ctx)
        assert not out.is_error, out.output
        pid = only_reader(sandbox, rhost.workspace).pid
        deadline = time.monotonic() + BOUND_S
        while not gone(pid):
            assert time.monotonic() < deadline, "the idle reader was never retired"
            await asyncio.sleep(0.05)
        assert not sandbox.readers.readers()

    asyncio.run(idle())
    still_reads(rhost)


def test_an_idle_reader_is_taken_least_recently_used_first(rhost: Host) -> None:
    """Under steady load every idle reader process of a key serves again before the
    crowd's `crowded_idle_s`: taking the most recent one each time left the others idle
    until they retired, and the next peak started them again (~5% of a busy host's
    reads)."""
    if threaded(rhost):
        pytest.skip("a reader thread serves every caller of its key at once (below)")
    sandbox = rhost.sandbox
    box, ctx = read_box(rhost)

    async def main() -> None:
        await reads(box, ctx, 3)
        idle = sorted(readers_of(sandbox, rhost.workspace), key=lambda r: r.used)
        assert len(idle) == 3, idle
        for expected in idle:  # one read at a time: each takes the one idle longest
            calls = expected.calls
            await reads(box, ctx, 1)
            assert expected.calls == calls + 1, (expected, idle)

    asyncio.run(main())


def test_a_reader_thread_serves_parallel_reads_together(rhost: Host) -> None:
    """Parallel reads of one key queue on one idle reader thread, handed over together
    (`ReaderThread.ask`): no reader is started for them, and each gets its own reply."""
    if not threaded(rhost):
        pytest.skip("a reader process serves one call at a time")
    sandbox = rhost.sandbox
    box, ctx = read_box(rhost)
    hostname, passwd = Path("/etc/hostname").read_text(), Path("/etc/passwd").read_text()

    async def main() -> None:
        await reads(box, ctx, 1)
        (reader,) = readers_of(sandbox, rhost.workspace)
        calls = reader.calls
        outs = await asyncio.gather(*(
            invoke(box, "read_file", {"path": path}, ctx)
            for path in ["/etc/hostname", "/etc/passwd"] * 6))
        assert readers_of(sandbox, rhost.workspace) == [reader]
        assert reader.calls == calls + 12
        for i, out in enumerate(outs):
            assert not out.is_error, out
            expected = hostname if i % 2 == 0 else passwd
            assert expected.splitlines()[0] in out.output, (i, out.output[:200])

    asyncio.run(main())


def test_a_burst_of_first_reads_starts_one_reader_thread(rhost: Host) -> None:
    """One reply's parallel reads in a session with no reader yet: the first starts one,
    the others wait for its thread and queue on it (a start each was ~3 ms of CPU and
    a process apiece); each still gets its own reply, and the next round starts none."""
    if not threaded(rhost):
        pytest.skip("a reader process serves one call at a time")
    sandbox = rhost.sandbox
    box, ctx = read_box(rhost)
    hostname, passwd = Path("/etc/hostname").read_text(), Path("/etc/passwd").read_text()
    paths = ["/etc/hostname", "/etc/passwd"] * 4

    async def burst() -> None:
        outs = await asyncio.gather(*(invoke(box, "read_file", {"path": path}, ctx)
                                      for path in paths))
        for path, out in zip(paths, outs, strict=True):
            assert not out.is_error, out
            expected = hostname if path == "/etc/hostname" else passwd
            assert expected.splitlines()[0] in out.output, (path, out.output[:200])

    assert readers_of(sandbox, rhost.workspace) == []
    asyncio.run(burst())
    (reader,) = readers_of(sandbox, rhost.workspace)
    assert reader.thread is not None and reader.calls == len(paths)
    asyncio.run(burst())
    assert readers_of(sandbox, rhost.workspace) == [reader]
    assert reader.calls == 2 * len(paths)


def _failing_start(started: list[int], gate: asyncio.Event):
    """A reader start (`ReaderPool.call`'s `start`) that fails once `gate` is set, as a
    launch refused or a launcher dead before its socket answers does."""
    async def start() -> Reader:
        started.append(1)
        await gate.wait()
        raise OSError(0, "the launcher died")
    return start


def test_a_burst_whose_first_start_fails_fails_alike() -> None:
    """The reads that waited for a fresh reader whose start failed are not stranded:
    each tries its own at once (no second wait: the k-th would wait k starts), and
    each gets the failure."""
    pool = ReaderPool()

    async def main() -> list[BaseException]:
        started: list[int] = []
        gate = asyncio.Event()
        calls = [asyncio.ensure_future(pool.call(("k",), _failing_start(started, gate),
                                                 b"req", 100)) for _ in range(5)]
        await asyncio.sleep(0)
        assert started == [1]  # one start; four wait for it
        gate.set()
        outs = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True),
                                      BOUND_S)
        assert len(started) == 5
        return outs

    outs = asyncio.run(main())
    assert all(isinstance(out, OSError) for out in outs), outs
    assert pool.readers() == [] and not pool._starting


def test_a_burst_whose_starter_is_cancelled_goes_on() -> None:
    pool = ReaderPool()

    async def main() -> None:
        started: list[int] = []
        gate = asyncio.Event()
        first = asyncio.ensure_future(pool.call(("k",), _failing_start(started, gate),
                                                b"req", 100))
        await asyncio.sleep(0)
        waiter = asyncio.ensure_future(pool.call(("k",), _failing_start(started, gate),
                                                 b"req", 100))
        await asyncio.sleep(0)
        assert len(started) == 1
        first.cancel()
        for _ in range(20):  # (a few turns of the loop: the cancel, then the wake-up)
            if len(started) == 2:
                break
            await asyncio.sleep(0)
        assert len(started) == 2  # the waiter started its own, the gate still shut
        with pytest.raises(asyncio.CancelledError):
            await first
        gate.set()
        with pytest.raises(OSError):
            await asyncio.wait_for(waiter, BOUND_S)

    asyncio.run(main())
    assert not pool._starting


def test_a_read_does_not_queue_behind_a_stuck_reader_thread(rhost: Host) -> None:
    """A reader thread on one request for over `LAG_S` (a hung file system) takes no
    more callers: the next read gets a fresh reader at once."""
    if not threaded(rhost):
        pytest.skip("a reader process serves one call at a time")
    sandbox = rhost.sandbox
    box, ctx = read_box(rhost)

    async def main() -> None:
        await reads(box, ctx, 1)
        (stuck,) = readers_of(sandbox, rhost.workspace)
        assert stuck.thread is not None
        # (White-box: no read can be made to hang here; this is what a hung one shows.)
        stuck.thread._started = time.monotonic() - 1.0
        try:
            await reads(box, ctx, 1)
            fresh = [r for r in readers_of(sandbox, rhost.workspace) if r is not stuck]
            assert len(fresh) == 1 and fresh[0].calls == 1, fresh
        finally:
            stuck.thread._started = 0.0

    asyncio.run(main())


def test_reads_of_several_sessions_in_one_turn_each_get_their_own_reply(rhost: Host) -> None:
    """Sessions in different workspaces read at once: their reader threads get the
    turn's reads together (`Handover`), and every caller gets its own session's reply,
    never another's (each file is readable by its own session's uid alone)."""
    sandbox = rhost.sandbox
    spaces = [sandbox.workspace(f"h{i}") for i in range(4)]
    tokens = [secrets.token_hex(8) for _ in spaces]
    for space, token in zip(spaces, tokens, strict=True):
        (space / "mine.txt").write_text(token)
        os.chown(space / "mine.txt", space.stat().st_uid, space.stat().st_gid)
        os.chmod(space / "mine.txt", 0o600)
    box = tools(sandbox, READ_POLICY)

    async def one_turn() -> list[tuple[int, str, bool]]:
        asks = [(i, j) for i in range(len(spaces)) for j in range(len(spaces))]
        outs = await asyncio.gather(*(
            invoke(box, "read_file", {"path": str(spaces[j] / "mine.txt")},
                   ToolContext(cwd=spaces[i], workspace=spaces[i]))
            for i, j in asks))
        return [(i * len(spaces) + j, out.output, out.is_error)
                for (i, j), out in zip(asks, outs, strict=True)]

    try:
        for _ in range(2):  # fresh readers, then the same ones reused
            for at, output, is_error in asyncio.run(one_turn()):
                i, j = divmod(at, len(spaces))
                if i == j:
                    assert not is_error and tokens[j] in output, (i, output)
                else:
                    assert is_error and tokens[j] not in output, (i, j, output)
    finally:
        for i in range(len(spaces)):
            sandbox.remove_workspace(f"h{i}")
    still_reads(rhost)


def test_a_cancelled_read_leaves_the_others_of_its_batch_answered(rhost: Host) -> None:
    """A read cancelled while it waits in a batch on a shared reader thread retires the
    reader; the thread still answers every read asked of it before it leaves."""
    box, ctx = read_box(rhost)

    async def main() -> None:
        await reads(box, ctx, 1)
        calls = [asyncio.create_task(invoke(box, "read_file", {"path": "/etc/hostname"}, ctx))
                 for _ in range(6)]
        await asyncio.sleep(0)  # (each has asked its reader)
        calls[2].cancel()
        outs = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(outs[2], asyncio.CancelledError), outs[2]
        for out in outs[:2] + outs[3:]:
            assert not isinstance(out, BaseException) and not out.is_error, out

    asyncio.run(main())
    still_reads(rhost)


def test_idle_readers_past_the_warm_few_retire_sooner(rhost: Host) -> None:
    """A burst leaves many readers idle: the `WARM` most recently used keep `idle_s`, the
    others retire after `crowded_idle_s` (issue 28: ~9 MB RSS each, for 2 s)."""
    if threaded(rhost):
        pytest.skip("a burst starts one reader thread (test_a_burst_of_first_reads_...)")
    sandbox = rhost.sandbox
    sandbox.readers.crowded_idle_s = sandbox.readers.sweep_s = 0.05
    ctx: ToolContext[None] = ToolContext(cwd=rhost.workspace, workspace=rhost.workspace)
    box = tools(sandbox, READ_POLICY)

    async def burst() -> None:
        outs = await asyncio.gather(*(invoke(box, "read_file", {"path": "/etc/hostname"}, ctx)
                                      for _ in range(WARM + 3)))
        assert not any(out.is_error for out in outs), outs
        started = readers_of(sandbox, rhost.workspace)
        assert len(started) > WARM, started  # (parallel reads each took a reader)
        warm = sorted(started, key=lambda r: r.used)[-WARM:]
        deadline = time.monotonic() + BOUND_S
        while len(readers_of(sandbox, rhost.workspace)) > WARM:
            assert time.monotonic() < deadline, "the crowd of idle readers stayed"
            await asyncio.sleep(0.05)
        assert {r.pid for r in readers_of(sandbox, rhost.workspace)} == {r.pid for r in warm}

    asyncio.run(burst())
    still_reads(rhost)


def test_a_killed_reader_is_replaced(rhost: Host) -> None:
    """A reader process killed, or a reader thread that left (it cannot be killed apart
    from its executor): the session's next read gets a fresh one."""
    sandbox = rhost.sandbox
    call(rhost, "read_file", "/etc/hostname")
    dead = only_reader(sandbox, rhost.workspace)
    if dead.thread is not None:
        dead.thread.stop()
    else:
        os.kill(dead.pid, 9)
    wait_left(dead)
    out, is_error = call(rhost, "read_file", "/etc/passwd")
    assert not is_error and "root:" in out, out
    assert only_reader(sandbox, rhost.workspace) is not dead


def test_a_hostile_sequence_fails_on_a_fresh_and_on_a_reused_reader(rhost: Host) -> None:
    need("namespaces", "landlock")
    sandbox = rhost.sandbox
    token = secrets.token_hex(8)
    os.environ["OPLOOP_READER_CANARY"] = token  # in the executor's environment only
    try:
        # Another session's reader, whose /proc entries the attack aims at.
        other = sandbox.workspace("s2")
        call(rhost, "read_file", "/etc/hostname", workspace=other)
        victim = only_reader(sandbox, other).pid
        fifo = rhost.workspace / "fifo"
        os.mkfifo(fifo)
        os.chmod(fifo, 0o666)
        attacks = [
            ("read_file", "/proc/self/environ"),
            ("read_file", "/proc/1/environ"),
            ("read_file", "/proc/self/mem"),
            ("read_file", "/proc/1/mem"),
            ("read_file", f"/proc/{victim}/environ"),
            ("list_dir", f"/proc/{victim}/root"),
            ("list_dir", f"/proc/{victim}/root/proc/1/root"),
            ("read_file", f"/proc/{victim}/root{other}/x"),
            ("read_file", f"/proc/{os.getpid()}/environ"),
            ("read_file", "fifo"),
            ("list_dir", "fifo"),
            ("read_file", "/proc/kmsg"),
            ("read_file", "\x00"),
            ("read_file", "a" * 5000),
            ("list_dir", "a/" * 40000),
        ]
        sandbox.readers.drop(str(rhost.workspace))  # a fresh reader for the first round
        pid = None
        for round_ in ("fresh", "reused"):
            for name, path in attacks:
                out, is_error = call(rhost, name, path)
                assert token not in out, (round_, name, path, out)
                assert "timed out" not in out, (round_, name, path, out)
                if path not in ("/proc/self/environ", "/proc/1/environ"):  # its own: empty
                    assert is_error, (round_, name, path, out)
                reader = only_reader(sandbox, rhost.workspace)
                pid = pid or reader.pid
                assert reader.pid == pid, (round_, name, path, "the reader was replaced")
        assert not gone(victim)
        still_reads(rhost)
        assert only_reader(sandbox, rhost.workspace).pid == pid
    finally:
        del os.environ["OPLOOP_READER_CANARY"]


@pytest.mark.parametrize("policy", [READ_POLICY.lowered(off=READ_POLICY.off | {"uid"})])
def test_another_policy_gets_another_reader(rhost: Host, policy: object) -> None:
    """A reader is made for one policy: a changed policy never reuses it."""
    call(rhost, "read_file", "/etc/hostname")
    first = only_reader(rhost.sandbox, rhost.workspace)
    call(rhost, "read_file", "/etc/hostname", policy=policy)  # type: ignore[arg-type]
    pids = {r.pid for r in readers_of(rhost.sandbox, rhost.workspace)}
    assert len(pids) == 2 and first.pid in pids


def test_a_call_cut_short_kills_its_reader(rhost: Host) -> None:
    """A call that times out (here at once: wherever it is, launching or reading) or is
    cancelled leaves no reader behind, busy or idle, and no fd; the next call works."""
    sandbox = rhost.sandbox
    ws = rhost.workspace
    ctx: ToolContext[None] = ToolContext(cwd=ws, workspace=ws)
    hasty = tools(sandbox, READ_POLICY.lowered(timeout_s=1e-6))
    call(rhost, "read_file", "/etc/hostname")  # the fork server is up: its socket is not a leak
    sandbox.readers.close()
    fds = set(os.listdir("/proc/self/fd"))

    async def cut_short() -> None:
        for _ in range(3):
            out = await invoke(hasty, "read_file", {"path": "/etc/passwd"}, ctx)
            assert out.is_error, out.output
        task = asyncio.create_task(invoke(tools(sandbox), "list_dir", {"path": "/"}, ctx))
        await asyncio.sleep(0)  # it has started its reader's launch
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cut_short())
    assert not sandbox.readers.readers(), sandbox.readers.readers()
    sandbox.readers.close()  # (waits until the killed readers are gone)
    assert set(os.listdir("/proc/self/fd")) <= fds
    still_reads(rhost)


@pytest.mark.parametrize("garbage", [b"9999999999", b"not-digits", b"0000000004X1 /"])
def test_a_malformed_request_ends_the_reader(rhost: Host, garbage: bytes) -> None:
    """A reader never guesses: anything but a well-formed request ends it, and the
    session's next call gets a fresh one."""
    if threaded(rhost):
        pytest.skip("a reader thread's requests are made in the executor (no socket): "
                    "fileops.answer's own test covers them")
    call(rhost, "read_file", "/etc/hostname")
    reader = only_reader(rhost.sandbox, rhost.workspace)
    reader.sock.sendall(garbage)
    wait_gone(reader.pid)
    out, is_error = call(rhost, "read_file", "/etc/passwd")
    assert not is_error and "root:" in out, out
    assert only_reader(rhost.sandbox, rhost.workspace).pid != reader.pid
