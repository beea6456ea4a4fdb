"""Adversarial: reader threads (`actors/sandbox/readthreads.py`).

A thread of the executor takes a reader process's lockdown and serves its
reads. These cases check that the lockdown is the thread's and only the
thread's (the executor keeps root and its capabilities: glibc's setresuid
would have changed every thread), that what the thread holds beyond a reader
process (the host's /proc, the executor's fds) is out of a path's reach, and
that a read the loop stops waiting for still gets its reply.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sbhelp import BOUND_S, Host, need
from test_escape_read import READ_POLICY, call, still_reads, tools

from actors import fileops
from actors.sandbox import readthreads
from actors.sandbox.reader import Reader
from actors.tools import ToolContext, invoke


@pytest.fixture
def thost(host: Host) -> Iterator[Host]:
    """The sandbox suite's host (the launcher backend: reads always run there), with
    its readers served by threads."""
    if host.backend != "launcher":
        pytest.skip("reads always run in the launcher: one backend is enough")
    need("namespaces", "landlock", "seccomp", "uid")
    host.sandbox.readers.threads = True
    yield host


def the_thread(host: Host) -> Reader:
    """The one reader of the host's session, served by a thread (a read made it)."""
    found = [r for r in host.sandbox.readers.readers() if r.paths[0] == str(host.workspace)]
    assert len(found) == 1, found
    assert found[0].thread is not None, "the reader stayed a process"
    return found[0]


def status(tid: int | str) -> dict[str, str]:
    """A thread's /proc status fields."""
    text = Path(f"/proc/self/task/{tid}/status").read_text()
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def test_the_lockdown_is_the_threads_alone(thost: Host) -> None:
    before, cwd = status(os.getpid()), os.getcwd()
    out, is_error = call(thost, "read_file", "/etc/hostname")
    assert not is_error, out
    reader = the_thread(thost)
    mine = status(reader.pid)
    uid = str(thost.workspace.stat().st_uid)
    assert mine["Uid"].split() == [uid] * 4, mine["Uid"]
    assert mine["Groups"].strip() == ""
    assert int(mine["CapEff"], 16) == int(mine["CapPrm"], 16) == 0
    assert mine["NoNewPrivs"].strip() == "1" and mine["Seccomp"].strip() == "2"
    assert (os.readlink(f"/proc/self/task/{reader.pid}/ns/mnt")
            != os.readlink("/proc/self/ns/mnt"))
    # The executor's own thread (and so every other) is as it was: root, its capabilities.
    after = status(os.getpid())
    for field in ("Uid", "Gid", "Groups", "CapEff", "CapPrm", "CapBnd", "NoNewPrivs",
                  "Seccomp"):
        assert after[field] == before[field], (field, before[field], after[field])
    assert os.getuid() == 0 and Path("/etc/shadow").read_bytes()
    assert os.readlink("/proc/thread-self/root") == "/" and os.getcwd() == cwd


def test_what_the_thread_holds_is_out_of_a_paths_reach(thost: Host) -> None:
    """The thread holds the host's /proc (to reopen what it checked) and shares the
    executor's fds: no path reaches either, nor the executor, nor the thread itself."""
    token = secrets.token_hex(8)
    secret = thost.outside / f"secret-{secrets.token_hex(4)}"  # (its name shows in errors)
    secret.write_text(token)
    os.chmod(secret, 0o644)
    held = os.open(secret, os.O_RDONLY)  # an fd of the executor on a file the view hides
    try:
        call(thost, "read_file", "/etc/hostname")
        tid = the_thread(thost).pid
        attacks = [f"/proc/self/fd/{n}" for n in range(0, 48)]
        attacks += [f"/dev/fd/{held}", f"/proc/thread-self/fd/{held}",
                    f"/proc/{os.getpid()}/fd/{held}", f"/proc/{tid}/fd/{held}",
                    f"/proc/{os.getpid()}/task/{tid}/fd/{held}", f"/proc/{tid}/root{secret}",
                    f"/proc/{os.getpid()}/environ", "/proc/self/environ",
                    "/proc/thread-self/environ", str(secret), f"../../..{secret}"]
        for path in attacks:
            for name in ("read_file", "list_dir"):
                out, _ = call(thost, name, path)
                assert token not in out, (name, path, out)
        out, is_error = call(thost, "list_dir", "/proc")
        assert is_error or not [n for n in out.splitlines() if n[:1].isdigit()], out
        assert the_thread(thost).pid == tid  # one thread served it all
    finally:
        os.close(held)
    still_reads(thost)


def test_a_read_the_loop_stops_waiting_for_is_awaited(thost: Host,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A read longer than `WAIT_S` (a slow file system) is awaited, the loop going on:
    here every read is (0 s), and each gets its own reply."""
    monkeypatch.setattr(readthreads, "WAIT_S", 0.0)
    monkeypatch.setattr(readthreads, "LIST_WAIT_S", 0.0)
    ws = thost.workspace
    for i in range(8):
        (ws / f"f{i}.txt").write_text(f"content {i}\n" * (i + 1))
    ctx: ToolContext[None] = ToolContext(cwd=ws, workspace=ws)
    box = tools(thost.sandbox, READ_POLICY)

    async def reads() -> list[str]:
        outs = await asyncio.gather(*(invoke(box, "read_file", {"path": f"f{i}.txt"}, ctx)
                                      for i in range(8)))
        return [o.output for o in outs if not o.is_error]

    got = asyncio.run(reads())
    assert len(got) == 8 and all(f"content {i}" in got[i] for i in range(8)), got
    assert all(r.thread is not None for r in thost.sandbox.readers.readers())


class HungFileSystem:
    """Reads of /etc/group in a reader thread block until `release` (or take `delay_s`
    each): a hung or slow file system, which no test can mount. (`fileops.answer` is
    what the thread runs for every request.)"""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, delay_s: float | None = None) -> None:
        self.gate = threading.Event()
        answer = fileops.answer

        def slow_answer(body: bytes, proc: int = -1) -> bytes | None:
            if b"/etc/group" in body:
                if delay_s is None:
                    self.gate.wait(BOUND_S)
                else:
                    time.sleep(delay_s)
            return answer(body, proc)

        monkeypatch.setattr(fileops, "answer", slow_answer)

    def release(self) -> None:
        """Let the hung reads return."""
        self.gate.set()


def test_reads_queued_behind_a_hung_read_go_to_a_fresh_reader(
        thost: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads and listings of one key queued on a thread whose read hangs are given up
    once it lags (`LAG_S`) and answered by a fresh reader, long before their own
    timeouts; the hung thread counts once toward `MAX_STUCK`, and the hung read still
    gets its reply."""
    ws = thost.workspace
    box = tools(thost.sandbox, READ_POLICY)
    ctx: ToolContext[None] = ToolContext(cwd=ws, workspace=ws)
    hung = HungFileSystem(monkeypatch)
    readthreads._stopped.clear()

    async def main() -> None:
        assert not (await invoke(box, "read_file", {"path": "/etc/hostname"}, ctx)).is_error
        stuck = the_thread(thost)
        assert stuck.thread is not None
        slow = asyncio.create_task(invoke(box, "read_file", {"path": "/etc/group"}, ctx))
        await asyncio.sleep(0)  # (its read is asked: the next ones queue behind it)
        outs = await asyncio.wait_for(asyncio.gather(
            *(invoke(box, "read_file", {"path": "/etc/hostname"}, ctx) for _ in range(5)),
            invoke(box, "list_dir", {"path": "/etc"}, ctx)), BOUND_S / 2)
        assert not hung.gate.is_set() and not slow.done()  # (answered past the hung read)
        assert not any(out.is_error for out in outs), outs
        assert sum(1 for t, _ in readthreads._stopped if t is stuck.thread._thread) <= 1
        assert readthreads.usable(stuck.child.spec) == ""
        hung.release()
        out = await slow
        assert not out.is_error and "root" in out.output, out

    asyncio.run(main())
    still_reads(thost)


def test_a_read_once_a_fresh_thread_lags_on_its_first_goes_elsewhere(
        thost: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first read of a session hangs on the reader thread just made for it (the
    start the others of a burst wait for); a read of the same key once that thread lags
    gets a fresh reader and its reply, the loop going on. (It used to spin, awaiting the
    start's announcement already done: the executor's loop frozen for good.)"""
    ws = thost.workspace
    box = tools(thost.sandbox, READ_POLICY)
    ctx: ToolContext[None] = ToolContext(cwd=ws, workspace=ws)
    hung = HungFileSystem(monkeypatch)

    async def main() -> None:
        first = asyncio.create_task(invoke(box, "read_file", {"path": "/etc/group"}, ctx))
        deadline = time.monotonic() + BOUND_S
        while not any(r.thread is not None and r.thread.lagging()
                      for r in thost.sandbox.readers.readers()):
            assert time.monotonic() < deadline and not first.done(), "no lagging thread"
            await asyncio.sleep(0.01)
        out = await asyncio.wait_for(
            invoke(box, "read_file", {"path": "/etc/hostname"}, ctx), BOUND_S / 2)
        assert not out.is_error, out
        assert not first.done()  # (answered past the hung first read)
        hung.release()
        out = await first
        assert not out.is_error and "root" in out.output, out

    asyncio.run(main())
    still_reads(thost)


def test_slow_reads_of_one_key_do_not_wait_for_each_other(
        thost: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """Parallel reads each slower than `LAG_S` are not answered one after another by one
    shared thread: the ones queued behind go to fresh readers."""
    ws = thost.workspace
    box = tools(thost.sandbox, READ_POLICY)
    ctx: ToolContext[None] = ToolContext(cwd=ws, workspace=ws)
    HungFileSystem(monkeypatch, delay_s=3 * readthreads.LAG_S)

    async def main() -> None:
        assert not (await invoke(box, "read_file", {"path": "/etc/hostname"}, ctx)).is_error
        outs = await asyncio.gather(*(invoke(box, "read_file", {"path": "/etc/group"}, ctx)
                                      for _ in range(6)))
        assert not any(out.is_error for out in outs), outs
        served = [r for r in thost.sandbox.readers.readers() if r.paths[0] == str(ws)]
        assert len(served) > 1, served  # (one thread alone would have served them all)

    asyncio.run(main())
    still_reads(thost)


def test_a_read_asked_on_a_loop_that_closed_is_not_lost(thost: Host) -> None:
    """A loop closed before it handed its turn's reads over (stopped, not run to its
    end) leaves no batch behind that a later loop's reads would wait in forever."""
    ws = thost.workspace
    box = tools(thost.sandbox, READ_POLICY)
    ctx: ToolContext[None] = ToolContext(cwd=ws, workspace=ws)
    assert not asyncio.run(invoke(box, "read_file", {"path": "/etc/hostname"}, ctx)).is_error
    thread = the_thread(thost).thread
    assert thread is not None
    loop = asyncio.new_event_loop()
    task = loop.create_task(invoke(box, "read_file", {"path": "/etc/hostname"}, ctx))
    deadline = time.monotonic() + BOUND_S
    while thread._batch is None:  # one turn at a time, until the read is asked ...
        assert time.monotonic() < deadline and not task.done(), "the read was never asked"
        loop.call_soon(loop.stop)
        loop.run_forever()
    task.cancel()  # ... and the loop closed before its hand-over ran
    loop.close()

    async def again() -> bool:
        out = await asyncio.wait_for(
            invoke(box, "read_file", {"path": "/etc/hostname"}, ctx), BOUND_S / 2)
        return out.is_error

    assert not asyncio.run(again())


def test_a_reader_thread_leaves_when_retired(thost: Host) -> None:
    call(thost, "read_file", "/etc/hostname")
    reader = the_thread(thost)
    assert reader.thread is not None
    thost.sandbox.readers.drop(str(thost.workspace))
    assert reader.thread.join(5.0), "the retired reader thread stayed"
    assert not thost.sandbox.readers.readers()
    still_reads(thost)


def test_a_policy_may_keep_reader_processes(thost: Host) -> None:
    """`reader = "process"` (sandbox.toml): its readers serve by themselves."""
    policy = READ_POLICY.lowered(reader="process")
    out, is_error = call(thost, "read_file", "/etc/hostname", policy=policy)
    assert not is_error, out
    (reader,) = thost.sandbox.readers.readers()
    assert reader.thread is None and not reader.gone


def test_an_optional_layer_keeps_reader_processes(thost: Host) -> None:
    """A layer the policy lets fail may have failed (a mount view without a /proc of its
    own would show the executor to a thread): only required layers make threads."""
    policy = READ_POLICY.lowered(optional=frozenset({"namespaces"}))
    out, is_error = call(thost, "read_file", "/etc/hostname", policy=policy)
    assert not is_error, out
    (reader,) = thost.sandbox.readers.readers()
    assert reader.thread is None and not reader.gone


@pytest.mark.parametrize("body", [b"", b"X10 /", b"R /etc", b"Rx /etc", b"L"])
def test_a_malformed_request_gets_no_answer(body: bytes) -> None:
    """What a reader thread or process is asked is made by the executor; anything else
    is not a request (the process then ends, the thread raises BadReply)."""
    assert fileops.answer(body) is None
    assert fileops.answer(b"R10 /nonexistent-" + secrets.token_hex(4).encode()) == (
        b"E2\tNo such file or directory")
