"""How `oploop` hands SIGINT and SIGTERM from its start-up to its loop
(`actors.cli.interrupts`): a real signal, sent to this process at the very moment
between the two (while `held`), reaches the command, which ends before it begins.

The signals are held (blocked) for each test and whatever is still pending is taken
back before they are released, so none ever reaches the test runner.
"""

from __future__ import annotations

import asyncio
import signal
import threading

import pytest
import uvloop

from actors.cli.app import parser
from actors.cli.errors import EXIT_CANCELLED, EXIT_TERMINATED
from actors.cli.interrupts import held, interruptible, take_over
from actors.cli.run import Interrupts, run
from actors.settings import Settings

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture
def held_here():
    """Start-up's side of the hand-over, in this process; afterwards, nothing pending
    and the handlers as they were (a command leaves its own, `Interrupts._exit_now`)."""
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    try:
        with held():
            yield
            left = signal.sigtimedwait(SIGNALS, 0)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert left is None, f"signal {left.si_signo} held and never handed over"


def _send(sig: int) -> None:
    """`sig` to this process's main thread. A terminal's Ctrl-C goes to the process,
    and an `oploop` command has only that thread while its signals are held (those
    it starts then inherit them blocked). This one has others (pytest-xdist's), and
    the kernel gives a process's signal to a thread that does not block it: one
    sent so would be handled at once, outside every hold, and stop the test run."""
    signal.pthread_kill(threading.main_thread().ident, sig)


def test_a_ctrl_c_in_the_hand_over_ends_a_command_before_it_begins(held_here, capsys):
    began: list[bool] = []

    async def command() -> int:
        began.append(True)
        return 0

    async def main() -> int:
        _send(signal.SIGINT)  # the loop runs, the command has not taken SIGINT over
        return await interruptible(command())

    assert uvloop.run(main()) == EXIT_CANCELLED
    assert began == []
    assert "never awaited" not in capsys.readouterr().err


def test_a_sigterm_in_the_hand_over_exits_143(held_here):
    async def main() -> int:
        _send(signal.SIGTERM)
        return await interruptible(asyncio.sleep(0, result=0))

    assert uvloop.run(main()) == EXIT_TERMINATED


def test_run_takes_a_held_ctrl_c_over_and_starts_nothing(held_here, tmp_path):
    # The real `oploop run`: had the signal been lost (or only cancelled the task), it
    # would go on to start an embedded host in this home, and write its log there.
    args = parser().parse_args(["run", "hello"])
    home = tmp_path / "home"
    home.mkdir()

    async def main() -> int:
        _send(signal.SIGINT)
        return await run(args, Settings(home=home))

    assert uvloop.run(main()) == EXIT_CANCELLED
    assert list(home.iterdir()) == []


def test_interrupts_records_the_held_signal_as_its_first(held_here):
    async def main() -> tuple[int | None, int, bool]:
        _send(signal.SIGTERM)
        with Interrupts() as stop:
            await asyncio.sleep(0)  # (a cancel of this task would raise here)
            return stop.signal, stop.status, stop.cancelled.is_set()

    assert uvloop.run(main()) == (signal.SIGTERM, EXIT_TERMINATED, False)


def test_a_signal_after_the_take_over_reaches_the_loop_handler(held_here):
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        seen: list[int] = []
        arrived = asyncio.Event()
        taken, came = take_over(loop, lambda sig: (seen.append(sig), arrived.set()))
        try:
            assert (taken, came) == ([signal.SIGINT, signal.SIGTERM], [])
            _send(signal.SIGINT)
            await asyncio.wait_for(arrived.wait(), 10)
        finally:
            for sig in taken:
                loop.remove_signal_handler(sig)
        return seen

    assert uvloop.run(main()) == [signal.SIGINT]


def test_an_ignored_sigint_stays_ignored_held_or_not(held_here):
    # A background job of a script: the terminal's Ctrl-C is for the foreground one.
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        async def main() -> tuple[list[int], list[int], list[int]]:
            loop = asyncio.get_running_loop()
            seen: list[int] = []
            arrived = asyncio.Event()
            _send(signal.SIGINT)  # held (a blocked signal is kept even when ignored)
            taken, came = take_over(loop, lambda sig: (seen.append(sig), arrived.set()))
            try:
                _send(signal.SIGINT)
                # Standard signals are delivered lowest number first: a SIGINT taken
                # would be seen before this SIGTERM.
                _send(signal.SIGTERM)
                await asyncio.wait_for(arrived.wait(), 10)
            finally:
                for sig in taken:
                    loop.remove_signal_handler(sig)
            return taken, came, seen

        assert uvloop.run(main()) == ([signal.SIGTERM], [], [signal.SIGTERM])
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)
