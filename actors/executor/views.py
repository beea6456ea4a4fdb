"""Deciding the views of many calls in one thread hop.

A call's view (`Sandbox.view`) reads the session's directory: `realpath`, `stat`,
`access`. That directory may be on a file system that hangs, so it is read in a
thread, never on the executor's loop. A hop to the thread pool and back costs
~40-130 us of CPU (the pool's locks, a futex wake, the loop's self-pipe), more
than the view itself (~35 us); under load an executor starts many calls per turn
of its loop. So the views asked for in one turn of the loop are decided together,
in one hop: the same work, and a hung directory still holds up only the calls
asked in the same turn (each bounded by its own timeout), never the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from actors.sandbox import modes

Decide = Callable[..., modes.WorkView]
_Asked = tuple[tuple[Any, ...], dict[str, Any], "asyncio.Future[modes.WorkView]"]


class Views:
    """`await views.view(...)`: `decide(...)` in a thread, batched per turn of the loop."""

    def __init__(self, decide: Decide) -> None:
        self._decide = decide
        self._asked: list[_Asked] = []

    async def view(self, *args: Any, **kwargs: Any) -> modes.WorkView:
        """What `decide(*args, **kwargs)` returns (or raises), decided in a thread."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[modes.WorkView] = loop.create_future()
        if not self._asked:
            loop.call_soon(self._hop, loop)
        self._asked.append((args, kwargs, future))
        return await future

    def _hop(self, loop: asyncio.AbstractEventLoop) -> None:
        asked, self._asked = self._asked, []
        done = loop.run_in_executor(None, self._decide_all, [(a, k) for a, k, _ in asked])
        done.add_done_callback(lambda d: _answer([f for *_, f in asked], d))

    def _decide_all(self, asked: list[tuple[tuple[Any, ...], dict[str, Any]]]
                    ) -> list[tuple[modes.WorkView | None, BaseException | None]]:
        out: list[tuple[modes.WorkView | None, BaseException | None]] = []
        for args, kwargs in asked:
            try:
                out.append((self._decide(*args, **kwargs), None))
            except Exception as exc:  # each caller gets its own answer, an error included
                out.append((None, exc))
        return out


def _answer(futures: list[asyncio.Future[modes.WorkView]],
            done: asyncio.Future[list[tuple[modes.WorkView | None, BaseException | None]]]
            ) -> None:
    """Hand each caller its view or its error (a caller gone meanwhile: skipped)."""
    if done.cancelled() or done.exception() is not None:
        error = done.exception() if not done.cancelled() else asyncio.CancelledError()
        for future in futures:
            if not future.done():
                future.set_exception(error)  # type: ignore[arg-type]
        return
    for future, (view, exc) in zip(futures, done.result(), strict=True):
        if future.done():
            continue
        if exc is not None:
            future.set_exception(exc)
        else:
            assert view is not None
            future.set_result(view)
