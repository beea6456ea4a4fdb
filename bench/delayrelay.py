"""A TCP relay that adds latency, for kernels without `sch_netem` (`tc netem`).

`python -m bench.delayrelay LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT COUNT
ONE_WAY_MS`: for each of COUNT consecutive ports (a host's public sockets are five
consecutive ports), accept on LISTEN_HOST:LISTEN_PORT+i and relay to
TARGET_HOST:TARGET_PORT+i, holding every chunk ONE_WAY_MS in each direction (so a
round trip takes 2 × ONE_WAY_MS more). Order and throughput are kept: each direction
is a queue of (due time, bytes) drained by one writer. Prints "ready" once listening.

Not netem: the delay is per chunk read, not per packet, and the relay's own
scheduling adds a little (~0.1 ms); for a link's round-trip latency that is what
matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

CHUNK = 64 * 1024


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                delay_s: float) -> None:
    """Copy `reader` to `writer`, each chunk `delay_s` after it was read."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def write() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    writing = asyncio.create_task(write())
    try:
        while data := await reader.read(CHUNK):
            queue.put_nowait((loop.time() + delay_s, data))
    except ConnectionError:
        pass
    finally:
        queue.put_nowait((0.0, b""))
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            await writing
        writer.close()


async def _server(listen: tuple[str, int], target: tuple[str, int],
                  delay_s: float) -> asyncio.Server:
    """Listening on `listen`; each connection relayed to `target`, delayed."""
    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pump(reader, up_writer, delay_s),
                             _pump(up_reader, writer, delay_s))

    return await asyncio.start_server(relay, *listen)


async def main(argv: list[str]) -> None:
    """Relay COUNT ports with ONE_WAY_MS added each way (see the module's docstring)."""
    listen_host, listen_port, target_host, target_port, count, one_way_ms = argv
    delay_s = float(one_way_ms) / 1000
    servers = [await _server((listen_host, int(listen_port) + i),
                             (target_host, int(target_port) + i), delay_s)
               for i in range(int(count))]
    print("ready", flush=True)  # every port is bound
    await asyncio.gather(*(s.serve_forever() for s in servers))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
