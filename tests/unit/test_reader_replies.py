"""A persistent reader's replies as the executor reads them (`readers.Reader.ask`): its
socket stays watched by the loop while it lives, a reply in pieces is put together,
and anything but the one framed reply asked for (too long, garbled, unasked, EOF)
ends the reader. The other end here is the test, speaking `fileops`' framing."""

from __future__ import annotations

import asyncio
import socket
import time
from types import SimpleNamespace

import pytest

from actors import fileops
from actors.sandbox import readers
from actors.sandbox.reader import Reader


def framed(body: bytes) -> bytes:
    return b"%0*d" % (fileops.REPLY_LEN_DIGITS, len(body)) + body


def reader_over(ours: socket.socket) -> Reader:
    ours.setblocking(False)
    # The child is only used to retire it (not here): ask() speaks to the socket alone.
    return Reader(("key",), ("/ws",), None, ours)  # type: ignore[arg-type]


@pytest.fixture
def pair():
    """(the executor's end, the reader's end) of a socket pair, closed after the test."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    yield ours, theirs
    ours.close()
    theirs.close()


def test_replies_in_pieces_and_one_registration_for_many_calls(pair) -> None:
    ours, theirs = pair

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reader = reader_over(ours)
        big = bytes(range(256)) * 1024  # several recv()s
        for body in (b"R0 1 2f\nhi", big, b"L0 2f\n"):
            asked = asyncio.ensure_future(reader.ask(fileops.request(b"R", "/x", 9), len(big)))
            request = await loop.sock_recv(theirs, 1024)
            assert request == fileops.request(b"R", "/x", 9)
            reply = framed(body)
            for at in range(0, len(reply), 7000):  # dribbled
                await loop.sock_sendall(theirs, reply[at:at + 7000])
                await asyncio.sleep(0)
            assert await asked == body
            assert ours.fileno() in loop._selector.get_map()  # type: ignore[attr-defined]
        assert reader.calls == 3 and not reader.gone
        reader.close_socket()
        assert ours.fileno() == -1

    asyncio.run(main())


@pytest.mark.parametrize("reply", [framed(b"x" * 100), b"0000000abc", framed(b"ok") + b"more"])
def test_a_reply_over_its_cap_or_garbled_ends_the_reader(pair, reply: bytes) -> None:
    ours, theirs = pair

    async def main() -> None:
        reader = reader_over(ours)
        theirs.sendall(reply)
        with pytest.raises(fileops.BadReply):
            await reader.ask(fileops.request(b"R", "/x", 9), 50)
        assert reader.gone

    asyncio.run(main())


def test_bytes_nobody_asked_for_end_the_reader(pair) -> None:
    ours, theirs = pair

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reader = reader_over(ours)
        asked = asyncio.ensure_future(reader.ask(fileops.request(b"R", "/x", 9), 100))
        await loop.sock_recv(theirs, 1024)
        await loop.sock_sendall(theirs, framed(b"one"))
        assert await asked == b"one"
        # While it idles, it speaks unasked: it serves no more calls.
        await loop.sock_sendall(theirs, b"surprise")
        async with asyncio.timeout(5):
            while not reader.gone:  # (seen when the loop reads it: no event to wait for)
                await asyncio.sleep(0.001)
        assert await reader.ask(fileops.request(b"R", "/x", 9), 100) == b""

    asyncio.run(main())


def test_a_reader_that_dies_before_it_answers_is_gone(pair) -> None:
    ours, theirs = pair

    async def dies() -> None:
        reader = reader_over(ours)
        asked = asyncio.ensure_future(reader.ask(fileops.request(b"R", "/x", 9), 100))
        await asyncio.sleep(0)
        theirs.close()  # it died before it answered
        assert await asked == b""
        assert reader.gone

    asyncio.run(dies())


class _Child:
    """What retiring a reader touches of its child (no process here)."""

    errfd = -1
    process = SimpleNamespace(pid=2**22 + 1, _pidfd=-1)  # (no such pid: no pidfd)

    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True


@pytest.mark.parametrize("bound_s", [None, 0.1, 60.0])
def test_a_read_bounded_sooner_from_outside_takes_no_timer_and_still_ends(
        monkeypatch: pytest.MonkeyPatch, bound_s: float | None) -> None:
    """A reader that never answers: the read ends at its own timeout (0.3 s), or at the
    enclosing bound (`BOUND_AT`, the executor's job timeout) when that is sooner, then
    without a timer of its own; either way the reader is retired."""
    ours, theirs = socket.socketpair()
    timeout = asyncio.timeout
    scopes: list[float | None] = []

    def counted(delay: float | None) -> asyncio.Timeout:
        scopes.append(delay)
        return timeout(delay)

    monkeypatch.setattr(readers.asyncio, "timeout", counted)

    async def main() -> None:
        pool = readers.ReaderPool()
        child = _Child()
        reader = Reader(("key",), ("/ws",), child, ours)  # type: ignore[arg-type]
        ours.setblocking(False)
        pool._give(reader)  # an idle reader of the key, as after a first call

        async def never_started(fd: int) -> object:
            raise AssertionError("the idle reader serves the call")

        async def read() -> bytes:
            return await pool.read(("key",), ("/ws",), never_started,  # type: ignore[arg-type]
                                   fileops.request(b"R", "/x", 9), 100, 0.3)

        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            if bound_s is None:
                await read()
            else:
                async with timeout(bound_s) as scope:
                    token = readers.BOUND_AT.set(scope.when())
                    try:
                        await read()
                    finally:
                        readers.BOUND_AT.reset(token)
        took = time.monotonic() - t0
        assert scopes == ([] if bound_s == 0.1 else [0.3])
        assert took < 0.25 if bound_s == 0.1 else took >= 0.3
        assert child.killed and ours.fileno() == -1  # retired

    try:
        asyncio.run(main())
    finally:
        ours.close()
        theirs.close()
