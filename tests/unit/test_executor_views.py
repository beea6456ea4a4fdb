"""The executor's views: decided off the loop, the calls of one turn in one hop, each
caller with its own answer, a hung directory never blocking the loop; a view
decided once is given again without a hop while the directory is unchanged."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from actors.executor.views import Views
from actors.sandbox import modes
from actors.sandbox.viewcache import MountWatch, ViewCache, all_local


def _view(cwd: str) -> modes.WorkView:
    return modes.WorkView(modes.READ_ONLY, cwd)


def test_views_asked_in_one_turn_are_decided_in_one_thread_each_with_its_answer() -> None:
    seen: list[tuple[str, int]] = []

    def decide(mode: str, cwd: str, workspace: str, **_: object) -> modes.WorkView:
        seen.append((cwd, threading.get_ident()))
        if cwd == "/a":  # busy a while: a hop per call would take the next in another thread
            time.sleep(0.05)
        if cwd == "/refused":
            raise modes.WorkdirRefused("working directory /refused is hidden from tools")
        return _view(cwd)

    async def main() -> list[modes.WorkView | BaseException]:
        views = Views(ViewCache(decide, watch=None))
        asked = [views.view(modes.READ_ONLY, cwd, f"/ws/s{i}")
                 for i, cwd in enumerate(["/a", "/refused", "/b", "/c"])]
        return await asyncio.gather(*asked, return_exceptions=True)

    answers = asyncio.run(main())
    assert answers[0] == _view("/a") and answers[2] == _view("/b") and answers[3] == _view("/c")
    assert isinstance(answers[1], modes.WorkdirRefused)
    assert [cwd for cwd, _ in seen] == ["/a", "/refused", "/b", "/c"]  # in the order asked
    threads = {ident for _, ident in seen}
    assert len(threads) == 1 and threading.get_ident() not in threads  # one hop, off the loop


def test_a_hung_directory_holds_up_its_callers_only_never_the_loop() -> None:
    release = threading.Event()

    def decide(mode: str, cwd: str, workspace: str, **_: object) -> modes.WorkView:
        if cwd == "/hung":
            release.wait(10)
        return _view(cwd)

    async def main() -> None:
        views = Views(ViewCache(decide, watch=None))
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        beat = asyncio.create_task(ticker())
        try:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await views.view(modes.READ_ONLY, "/hung", "/ws/s1")
            assert ticks > 5  # the loop went on meanwhile
            # A later call, in a turn of its own, is decided in another hop.
            assert await views.view(modes.READ_ONLY, "/ok", "/ws/s2") == _view("/ok")
        finally:
            release.set()
            beat.cancel()

    asyncio.run(main())


def test_a_remembered_view_is_given_without_a_hop(tmp_path) -> None:
    watch = MountWatch()
    try:
        if not all_local([str(tmp_path)], watch.table()):
            pytest.skip("the test's directory is not on a local file system: never remembered")
        # A mount or unmount anywhere on the host (another test's sandbox, in a parallel
        # worker) rightly forgets what was remembered: such an attempt is made again.
        for _ in range(5):
            watch.changed()  # (what came before is not this attempt's)
            answers, decided = _three_views(str(tmp_path))
            if not watch.changed():
                break
        else:
            pytest.skip("the host's mount table changed during every attempt")
    finally:
        watch.close()
    assert answers == [modes.view_for(modes.READ_ONLY, str(tmp_path), workspace="/ws/s1")] * 3
    assert len(decided) == 1 and decided[0] != threading.get_ident()  # one hop, then none


def _three_views(cwd: str) -> tuple[list[modes.WorkView], list[int]]:
    """The same view asked three times of a fresh cache; the threads that decided it."""
    decided: list[int] = []

    def decide(mode: str, cwd: str, workspace: str, **kwargs: object) -> modes.WorkView:
        decided.append(threading.get_ident())
        return modes.view_for(mode, cwd, workspace=workspace, **kwargs)  # type: ignore[arg-type]

    cache = ViewCache(decide)

    async def main() -> list[modes.WorkView]:
        views = Views(cache)
        return [await views.view(modes.READ_ONLY, cwd, "/ws/s1") for _ in range(3)]

    try:
        return asyncio.run(main()), decided
    finally:
        cache.close()
