"""`python -m bench.pgdrivers [N]`: psycopg 3 vs asyncpg for the session log's append.

Not a section (no `run`/`table`): the measurement behind choosing the PostgreSQL
driver (docs/sessions.md). One append is what the PostgreSQL store does per
commit: a transaction checking the session's lease epoch and inserting one
record. Measured against a throwaway local cluster (`bench.pgcluster`), N
appends each, in three ways:

- psycopg 3, synchronous: what `Journal.commit` does today (the supervisor's
  loop iteration ends with a synchronous commit);
- asyncpg awaited in its own event loop (its best case; the journal would have to
  become async, and every caller of it);
- asyncpg driven synchronously through a loop in another thread (what keeping the
  journal synchronous would cost with asyncpg).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import threading
import time

import asyncpg
import psycopg

from bench.pgcluster import PgCluster

SETUP = ("CREATE TABLE IF NOT EXISTS leases (sid text PRIMARY KEY, epoch bigint NOT NULL)",
         "CREATE TABLE IF NOT EXISTS records (sid text, seq bigint, epoch bigint, frame bytea, "
         "PRIMARY KEY (sid, seq))",
         "INSERT INTO leases VALUES ('a', 1), ('b', 1), ('c', 1) ON CONFLICT DO NOTHING")
CHECK = "SELECT epoch FROM leases WHERE sid = $1 FOR SHARE"
INSERT = "INSERT INTO records VALUES ($1, $2, $3, $4)"
FRAME = b"x" * 200


def quantiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds."""
    cuts = statistics.quantiles(samples, n=100)
    return cuts[49] * 1000, cuts[98] * 1000


def psycopg_sync(url: str, n: int) -> list[float]:
    """Synchronous psycopg 3: one transaction per append, server-side prepared."""
    out = []
    with psycopg.connect(url, autocommit=True, prepare_threshold=0) as conn:
        for i in range(n):
            t = time.perf_counter()
            with conn.transaction():
                conn.execute(CHECK.replace("$1", "%s"), ("a",))
                conn.execute(INSERT.replace("$1", "%s").replace("$2", "%s")
                             .replace("$3", "%s").replace("$4", "%s"), ("a", i, 1, FRAME))
            out.append(time.perf_counter() - t)
    return out


async def _asyncpg(url: str, n: int, sid: str, run: object = None) -> list[float]:
    conn = await asyncpg.connect(url)
    out = []
    try:
        for i in range(n):
            t = time.perf_counter()
            async with conn.transaction():
                await conn.fetchval(CHECK, sid)
                await conn.execute(INSERT, sid, i, 1, FRAME)
            out.append(time.perf_counter() - t)
    finally:
        await conn.close()
    return out


def asyncpg_awaited(url: str, n: int) -> list[float]:
    """asyncpg in its own loop (the best case)."""
    return asyncio.run(_asyncpg(url, n, "b"))


def asyncpg_from_sync(url: str, n: int) -> list[float]:
    """asyncpg behind a synchronous call: each append a coroutine run on a loop in a
    thread, the caller blocked on its future."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    conn = asyncio.run_coroutine_threadsafe(asyncpg.connect(url), loop).result()

    async def one(i: int) -> None:
        async with conn.transaction():
            await conn.fetchval(CHECK, "c")
            await conn.execute(INSERT, "c", i, 1, FRAME)

    out = []
    for i in range(n):
        t = time.perf_counter()
        asyncio.run_coroutine_threadsafe(one(i), loop).result()
        out.append(time.perf_counter() - t)
    asyncio.run_coroutine_threadsafe(conn.close(), loop).result()
    loop.call_soon_threadsafe(loop.stop)
    thread.join()
    return out


def truncate(url: str) -> None:
    """Empty the records (each run appends seqs from 0)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE records")


def main() -> None:
    """Print p50/p99 per driver."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    cluster = PgCluster.start()
    try:
        with psycopg.connect(cluster.url, autocommit=True) as conn:
            for sql in SETUP:
                conn.execute(sql)
        for name, fn in (("psycopg 3 (sync)", psycopg_sync),
                         ("asyncpg (awaited)", asyncpg_awaited),
                         ("asyncpg (sync via thread)", asyncpg_from_sync)):
            fn(cluster.url, 200)  # warm up
            truncate(cluster.url)
            p50, p99 = quantiles(fn(cluster.url, n))
            print(f"{name:28} p50 {p50:6.3f} ms   p99 {p99:6.3f} ms")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
