"""The memory bounds every actor shares (issue 13 item 3): SQLite's page cache per
connection, and freed heap handed back to the OS."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

from actors.runtime import HEAP_TRIM_S, heap_trimmer, trim_heap
from actors.sessionlog import SessionLog
from actors.storage import PAGE_CACHE_KIB, bounded_cache, open_private_db


def test_every_connection_oploop_opens_has_a_bounded_page_cache(tmp_path):
    db = open_private_db(tmp_path / "x.db", "CREATE TABLE IF NOT EXISTS t (a);")
    with contextlib.closing(db):
        assert db.execute("PRAGMA cache_size").fetchone() == (-PAGE_CACHE_KIB,)
    assert PAGE_CACHE_KIB < 2000  # below SQLite's default


def test_the_read_only_overview_connection_is_bounded_too(tmp_path):
    log = SessionLog(tmp_path / "sessions.db")  # (the overview opens its own, like this)
    try:
        assert log.sessions_overview() == []
        with contextlib.closing(sqlite3.connect(f"file:{log.path}?mode=ro", uri=True)) as db:
            assert bounded_cache(db) is db
            assert db.execute("PRAGMA cache_size").fetchone() == (-PAGE_CACHE_KIB,)
    finally:
        log.close()


def test_the_heap_trim_runs_on_glibc_and_is_cheap():
    trim = heap_trimmer()
    assert trim is not None  # this machine has glibc; elsewhere the trim is skipped
    assert trim() in (0, 1)
    assert HEAP_TRIM_S > 0


def test_the_trim_task_ends_when_cancelled():
    async def main() -> None:
        task = asyncio.create_task(trim_heap(0.001))
        await asyncio.sleep(0.01)  # a few rounds
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()

    asyncio.run(main())
