"""Deciding the views of many calls: remembered, else in one thread hop per loop turn.

A call's view (`Sandbox.view`) reads the session's directory: `realpath`, `stat`,
`access`. That directory may be on a file system that hangs, so it is read in a
thread, never on the executor's loop. A hop to the thread pool and back costs
~90 us of CPU (the pool's locks, a futex wake, the loop's self-pipe), more than
the view itself (~35 us). So a view decided once is remembered
(`sandbox/viewcache.py`) and given again, without a hop, while a few `lstat`s
on local file systems say that the directory is still what it was; the views
that are not (a first call, a directory changed, a file system that could
hang) are decided together, in one hop per turn of the loop: a hung directory
still holds up only the calls asked in the same turn (each bounded by its own
timeout), never the loop.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from actors.sandbox import modes
from actors.sandbox.viewcache import Key, Remembered, ViewCache

_Decided = tuple[modes.WorkView | None, BaseException | None, Remembered | None]


class Views:
    """`await views.view(...)`: the remembered view, or one decided in a thread (the
    views asked in one turn of the loop in one hop)."""

    def __init__(self, cache: ViewCache) -> None:
        self._cache = cache
        self._asked: list[tuple[Key, asyncio.Future[modes.WorkView]]] = []

    async def view(self, mode: str, cwd: str, workspace: str, *,
                   write_paths: tuple[str, ...] = (),
                   deny_read: tuple[str, ...] = ()) -> modes.WorkView:
        """The view of a session in `mode` in `cwd` whose scratch workspace is
        `workspace` (`modes.view_for`); raises WorkdirRefused."""
        key = ViewCache.key(mode, cwd, workspace, write_paths, deny_read)
        found = self._cache.lookup(key)
        if found is not None:
            return found
        loop = asyncio.get_running_loop()
        future: asyncio.Future[modes.WorkView] = loop.create_future()
        if not self._asked:
            loop.call_soon(self._hop, loop)
        self._asked.append((key, future))
        return await future

    def _hop(self, loop: asyncio.AbstractEventLoop) -> None:
        asked, self._asked = self._asked, []
        done = loop.run_in_executor(None, self._decide_all, [key for key, _ in asked])
        done.add_done_callback(lambda d: self._answer([f for _, f in asked], d))

    def _decide_all(self, keys: list[Key]) -> list[_Decided]:
        out: list[_Decided] = []
        for key in keys:
            try:
                view, remembered = self._cache.decide(key)
            except Exception as exc:  # each caller gets its own answer, an error included
                out.append((None, exc, None))
            else:
                out.append((view, None, remembered))
        return out

    def _answer(self, futures: list[asyncio.Future[modes.WorkView]],
                done: asyncio.Future[list[_Decided]]) -> None:
        """Remember what may be; hand each caller its view or its error (a caller gone
        meanwhile: skipped)."""
        if done.cancelled() or done.exception() is not None:
            error = done.exception() if not done.cancelled() else asyncio.CancelledError()
            for future in futures:
                if not future.done():
                    future.set_exception(error)  # type: ignore[arg-type]
            return
        for future, (view, exc, remembered) in zip(futures, done.result(), strict=True):
            if remembered is not None:
                self._cache.keep(remembered)
            if future.done():
                continue
            if exc is not None:
                future.set_exception(exc)
            else:
                assert view is not None
                future.set_result(view)


class FirstResolutions:
    """Where each session's working directory resolved at its first call here, and the
    refusal of a call where it resolves elsewhere now.

    A session's directory is resolved afresh each call (`modes.view_for`), and the
    tools run as whoever owns what it resolves to. A call may rename a parent it
    can write and put a link where the directory was (`mv sub sub-old; mkdir sub;
    ln -s /some/root-owned/dir sub/pkg`): the session's next call would run there,
    as that directory's owner. Kept for the executor's life (`MAX_SESSIONS`, the
    oldest forgotten first): a directory re-pointed on purpose needs a new session.
    """

    #: Sessions remembered at most (a few hundred bytes each).
    MAX_SESSIONS = 10_000

    def __init__(self) -> None:
        self._first: OrderedDict[tuple[str, str], str] = OrderedDict()

    def refusal(self, sid: str, given: str, real: str) -> str | None:
        """Why a call of `sid` in `given` (resolving to `real` now) is refused; None
        when `given` resolves where it did at the session's first call here."""
        key = (sid, given)
        first = self._first.setdefault(key, real)
        self._first.move_to_end(key)
        if len(self._first) > self.MAX_SESSIONS:
            self._first.popitem(last=False)
        if first == real:
            return None
        return (f"refused: the working directory {given} resolves to {real} now, not to "
                f"{first} as at the session's first call (a link on its way changed "
                "since): start a new session to work there")
