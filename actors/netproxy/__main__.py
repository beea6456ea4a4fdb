"""`python -m actors.netproxy`: the host's filtering network proxy (an actor)."""

from __future__ import annotations

import asyncio

from actors.allowlist import allowlists
from actors.netproxy.server import NetProxy
from actors.runtime import notify_ready, run_actor
from actors.settings import Settings
from bus.endpoints import Endpoints

#: Where the proxy's sockets are, under the host's runtime directory.
SOCKET_DIR = "net"


async def _main(settings: Settings) -> None:
    proxy = NetProxy(Endpoints.for_home(settings.home).run_dir / SOCKET_DIR,
                     allowlists(settings.config))
    await proxy.start()
    notify_ready()
    try:
        await asyncio.Event().wait()
    finally:
        await proxy.aclose()


def main() -> None:
    """Entry point of `python -m actors.netproxy`."""
    run_actor("netproxy", _main)


if __name__ == "__main__":
    main()
