"""`run_to_end`: clean-up that a cancellation must not cut short.

Apart from `process.py` so that the process starters below it (`piped.py`) can
use it too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def run_to_end(aw: Awaitable[T]) -> T:
    """Await `aw` to its end even if this task is cancelled (once or more) meanwhile,
    then let the cancellation go on: for clean-up a cancel must not skip.

    Only for bounded work, since the caller cannot be cancelled out of it. A
    failure of `aw` while a cancellation waits is chained to the cancellation.
    """
    task = asyncio.ensure_future(aw)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            # wait() never cancels what it waits for, unlike awaiting the task.
            await asyncio.wait((task,))
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is None:
        return task.result()
    if not task.cancelled() and (error := task.exception()) is not None:
        raise cancelled from error
    raise cancelled
